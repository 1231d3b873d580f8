"""The planner: search spaces, the search, capacity and what-if sweeps, diagnosis and outputs, and the `plan`
command (planner/cli.py, the one module that wires planner and executor together)."""
