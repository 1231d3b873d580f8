"""Wall time of the capacity acceptance run, as a command (interpreter start-up, imports, plot included).

    python tests/benchmarks/bench_capacity.py [--repeat N]

Runs, pinned to two cores (``taskset -c 0,1`` where available) with two BLAS threads,

    plan capacity --model 70b --tokens 15T --cluster h100x512.yaml --min-gpus 256 --max-gpus 4096 \
        --deadline 30d --plot OUT.png

(70B on 15T tokens on H100 clusters of 256 to 4,096 GPUs: five exhaustive re-plans, goodput, cost, the
table, the unmet deadline with its closest option, and the six-panel figure) and the same sweep as
``plan whatif --vary gpus=256,512,1024,2048,4096 --json``; prints the wall time of each. The target is
60 s on 2 cores. Not collected by pytest (the file name does not start with ``test_``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "plan capacity 70b 15T 256-4096 H100 --deadline 30d --plot":
        ["capacity", "--model", "70b", "--tokens", "15T", "--cluster", "h100x512.yaml", "--min-gpus", "256",
         "--max-gpus", "4096", "--deadline", "30d", "--plot", "{png}"],
    "plan whatif 70b 15T --vary gpus=256..4096 --json":
        ["whatif", "--model", "70b", "--tokens", "15T", "--cluster", "h100x512.yaml", "--vary",
         "gpus=256,512,1024,2048,4096", "--json"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", MKL_NUM_THREADS="2", COLUMNS="200")
    pin = ["taskset", "-c", "0,1"] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() >= 2 else []
    print(f"cores: {'2 (taskset -c 0,1)' if pin else f'{os.cpu_count()} (taskset not available)'}")
    with tempfile.TemporaryDirectory() as tmp:
        png = str(Path(tmp) / "capacity.png")
        for name, argv in COMMANDS.items():
            cmd = pin + [sys.executable, "-m", "planner.cli"] + [a.format(png=png) for a in argv]
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                if proc.returncode not in (0, 1):
                    print(proc.stderr, file=sys.stderr)
                    return 1
            print(f"{name}: median {statistics.median(times):.1f} s, max {max(times):.1f} s over {args.repeat} runs "
                  f"(exit {proc.returncode}; target <= 60 s)")
        print(f"figure: {Path(png).stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
