"""The heterogeneous search and the routing search: wall time, layouts split, and the plans they find.

    python tests/benchmarks/bench_hetero.py [--repeats N]

For 13b, 70b and mixtral-8x7b on hardware_profiles/clusters/a100-v100-mixed.yaml (default global batch):
``hetero_search`` wall time (median of N after a warm-up), mixed layouts valid / split exactly, and the best
plan against each group alone and the uniform split. Then ``routed_search`` for qwen3-30b-a3b on h100x512
with 40% of the routed tokens on 4 of 128 experts. One core. Not collected by pytest.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from costmodel.catalog import get_model  # noqa: E402
from costmodel.profiles import load_cluster  # noqa: E402
from planner.hetero import describe, hetero_search  # noqa: E402
from planner.routing import Routing, routed_search  # noqa: E402
from costmodel.plan import default_global_batch  # noqa: E402
from costmodel.routing import expert_fractions  # noqa: E402


def timed(fn, repeats: int):
    fn()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return out, statistics.median(walls)


def bench_hetero(repeats: int) -> None:
    cluster = load_cluster("a100-v100-mixed")
    for name in ("13b", "70b", "mixtral-8x7b"):
        model = get_model(name)
        gbs = default_global_batch(model.seq_len, cluster.num_gpus)
        res, wall = timed(lambda: hetero_search(model, cluster, gbs), repeats)
        best, launch = res.ranked[0], res.best_launchable()
        alone = ", ".join(f"{g} {s.est.step_time_s:.2f} s" if s else f"{g} no fit" for g, s in res.alone.items())
        print(f"{name} on a100-v100-mixed, global batch {gbs}: {wall:.2f} s wall; {res.counts['valid']} mixed layouts, "
              f"{res.counts['split']} split exactly")
        print(f"  best {best.est.step_time_s:.2f} s {describe(best.plan)} {list(best.plan.layers_per_stage)}"
              f"{'' if best.plan.launch_issue is None else ' (not one Megatron job)'}")
        if launch is not None:
            print(f"  best launchable {launch.est.step_time_s:.2f} s {describe(launch.plan)} "
                  f"{list(launch.plan.layers_per_stage)}")
        uni = f"{res.uniform.est.step_time_s:.2f} s" if res.uniform else "no fit"
        print(f"  alone: {alone}; uniform split {uni}")


def bench_routing(repeats: int) -> None:
    model, cluster = get_model("qwen3-30b-a3b"), load_cluster("h100x512")
    f = np.full(model.num_experts, 0.6 / (model.num_experts - 4))
    f[:4] = 0.1
    routing = Routing("40% on 4 experts", expert_fractions(np.tile(f, (model.moe_layers, 1))))
    rs, wall = timed(lambda: routed_search(model, cluster, 1024, routing), repeats)
    res = rs.result
    p, i, j = res.plan(0), int(res.order[0]), rs.balanced_best
    print(f"qwen3-30b-a3b on h100x512, global batch 1024, 40% of tokens on 4 of 128 experts: {wall:.2f} s wall, "
          f"{res.evaluated} layouts (with etp)")
    print(f"  chosen ep{p.ep} etp{p.etp} {rs.load_of(i).placement}: {res.scores['step_time_s'][i]:.3f} s; "
          f"balanced routing's choice ep{int(res.plans.ep[j])}: {res.scores['step_time_s'][j]:.3f} s under the skew")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bench_hetero(args.repeats)
    bench_routing(args.repeats)


if __name__ == "__main__":
    main()
