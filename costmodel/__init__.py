"""The cost model: specs in, estimates out. Pure (numpy, scipy, pydantic); imports no other package of the
project, never torch or megatron, and keeps no module-level state."""
