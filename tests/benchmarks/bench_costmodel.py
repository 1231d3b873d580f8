"""Throughput of the vectorised cost model: candidate plans scored per second on one core.

    python tests/benchmarks/bench_costmodel.py [--plans N] [--repeats R]

Scores N candidate plans of Llama 3 70B on h100x512 (step time and memory together, one
``estimate_arrays`` call, then their P10/P90 step times and support, ``costmodel.trust.with_intervals``), R times, and prints plans/s (best and median) against the 200,000 plans/s
target; then times ``plan validate`` on data/validation/published_runs.csv (in-process, and as a
command including interpreter start-up). Not collected by pytest (the file name does not start with
``test_``).
"""

from __future__ import annotations

import os

# One core: BLAS / OpenMP pools must be pinned before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from costmodel.catalog import get_model  # noqa: E402
from costmodel.estimate import estimate_arrays  # noqa: E402
from costmodel.plan import PlanArrays, default_global_batch
from costmodel.profiles import load_cluster, load_profile  # noqa: E402
from costmodel.trust import with_intervals  # noqa: E402
from planner.space import valid_plans  # noqa: E402

TARGET_PLANS_PER_S = 200_000
PUBLISHED = ROOT / "data" / "validation" / "published_runs.csv"


def candidate_plans(n: int) -> tuple[object, object, object, PlanArrays, int]:
    """n candidates for 70B on h100x512: the valid layouts (every knob combination the planner
    enumerates), repeated until there are n."""
    model = get_model("70b")
    cluster = load_cluster("h100x512")
    prof = load_profile(cluster.gpu)
    base = valid_plans(model, cluster, default_global_batch(model.seq_len, cluster.num_gpus))
    idx = np.arange(n) % len(base)
    cols = {f.name: getattr(base, f.name)[idx] for f in fields(PlanArrays) if f.name != "stage_layers"}
    return model, cluster, prof, PlanArrays(**cols), len(base)


def bench_estimate(n: int, repeats: int) -> list[float]:
    model, cluster, prof, plans, distinct = candidate_plans(n)
    with_intervals(model, cluster, plans, estimate_arrays(model, cluster, plans, profile=prof))  # warm-up
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = with_intervals(model, cluster, plans, estimate_arrays(model, cluster, plans, profile=prof))
        dt = time.perf_counter() - t0
        assert len(out["step_time_s"]) == n and len(out["fits"]) == n and len(out["step_time_p90_s"]) == n
        rates.append(n / dt)
    print(f"cost model with P10-P90 intervals and support: {n:,} candidate plans (70b on {cluster.name}, "
          f"{distinct:,} distinct valid layouts repeated), {repeats} runs, 1 core")
    return rates


def bench_validate() -> tuple[float, float]:
    from planner.cli import main

    sink = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        rc = main(["validate", str(PUBLISHED)])
    in_process = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"plan validate failed (exit {rc}):\n{sink.getvalue()}")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner.cli", "validate", str(PUBLISHED)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    command = time.perf_counter() - t0
    return in_process, command


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=200_000, help="candidate plans per run (default 200,000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs (default 5)")
    ap.add_argument("--no-validate", action="store_true", help="skip timing plan validate")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    rates = bench_estimate(args.plans, args.repeats)
    best, median = max(rates), statistics.median(rates)
    print(f"  plans/s  best {best:,.0f}   median {median:,.0f}   "
          f"(runs: {', '.join(f'{r:,.0f}' for r in rates)})")
    print(f"  target {TARGET_PLANS_PER_S:,} plans/s: best x{best / TARGET_PLANS_PER_S:.2f}, "
          f"median x{median / TARGET_PLANS_PER_S:.2f}")
    if not args.no_validate:
        in_process, command = bench_validate()
        print(f"plan validate {PUBLISHED.relative_to(ROOT)}: {in_process:.2f} s in-process, "
              f"{command:.2f} s as a command (interpreter start-up and imports included)")


if __name__ == "__main__":
    main()
