"""Optuna search against the exhaustive search: evaluations, best predicted step time, gap and wall time.

    python tests/benchmarks/bench_search.py [--seeds N] [--sampler tpe|cmaes|nsga2] [--no-command]

For 70b on h100x512 and 405b on h100x16384 (default global batch): the exhaustive search (every valid
layout scored in one vectorised call) and ``optuna_search`` with its default budget (10% of the valid
layouts, at least 50 trials) for N seeds; prints evaluations, best step time, the ratio of evaluations, the
relative gap of the best plan found and the wall times. Then times ``plan --model 70b --cluster
h100x512.yaml`` end to end as a command (interpreter start-up and imports included). One core. Not collected
by pytest (the file name does not start with ``test_``).
"""

from __future__ import annotations

import os

# One core: BLAS / OpenMP pools must be pinned before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from costmodel.catalog import get_model  # noqa: E402
from costmodel.profiles import load_cluster  # noqa: E402
from planner.search import exhaustive, optuna_search  # noqa: E402
from costmodel.plan import default_global_batch  # noqa: E402

CASES = (("70b", "h100x512"), ("405b", "h100x16384"))


def _best(res) -> tuple[float, bool]:
    i = int(res.order[0])
    return float(res.scores["step_time_s"][i]), bool(res.scores["fits"][i])


def bench_case(model_name: str, cluster_name: str, seeds: int, sampler: str) -> None:
    model, cluster = get_model(model_name), load_cluster(cluster_name)
    gbs = default_global_batch(model.seq_len, cluster.num_gpus)
    exhaustive(model, cluster, gbs)  # warm-up (profile cache, uneven-split solves, imports)
    t0 = time.perf_counter()
    ex = exhaustive(model, cluster, gbs)
    t_ex = time.perf_counter() - t0
    best, fits = _best(ex)
    print(f"{model_name} on {cluster_name} ({cluster.num_gpus} GPUs), global batch {gbs}")
    print(f"  exhaustive: {ex.evaluated:5d} evaluations  best {best:.4f} s{'' if fits else ' (no fit)'}  "
          f"{t_ex:.3f} s wall")
    gaps, ratios, walls = [], [], []
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = optuna_search(model, cluster, gbs, sampler=sampler, seed=seed)
        wall = time.perf_counter() - t0
        found, f_fits = _best(res)
        gap = found / best - 1.0
        ratio = res.evaluations / ex.evaluated
        gaps.append(gap)
        ratios.append(ratio)
        walls.append(wall)
        print(f"  optuna {res.sampler:5s} seed {seed}: {res.evaluations:4d} evaluations in {res.n_trials} trials  "
              f"best {found:.4f} s{'' if f_fits else ' (no fit)'}  evaluations x{ratio:.3f} of exhaustive  "
              f"gap {gap * 100:+.2f}%  {wall:.2f} s wall")
    print(f"  summary: gap median {statistics.median(gaps) * 100:+.2f}% worst {max(gaps) * 100:+.2f}%, "
          f"within 1%: {sum(g <= 0.01 for g in gaps)}/{seeds}; evaluations x{max(ratios):.3f} of exhaustive; "
          f"wall median {statistics.median(walls):.2f} s (exhaustive {t_ex:.3f} s)")


def bench_command() -> None:
    plan = shutil.which("plan")
    cmd = [plan] if plan else [sys.executable, "-m", "planner.cli"]
    argv = [*cmd, "--model", "70b", "--cluster", "h100x512.yaml"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr}")
    shown = " ".join(["plan" if plan else "python -m planner.cli", *argv[len(cmd):]])
    print(f"{shown}: {min(times):.2f} s best, {statistics.median(times):.2f} s median of 3 "
          f"(interpreter start-up and imports included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="Optuna runs per case, seeds 0..N-1 (default 3)")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "cmaes", "nsga2"))
    ap.add_argument("--no-command", action="store_true", help="skip timing the plan command")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    for model_name, cluster_name in CASES:
        bench_case(model_name, cluster_name, args.seeds, args.sampler)
    if not args.no_command:
        bench_command()


if __name__ == "__main__":
    main()
