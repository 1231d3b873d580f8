"""Closed loop on this machine: profile it, run every valid layout of a small GPT at world size 2 and 4 with
megatron-core, calibrate on half of the runs, and score the cost model on the other half.

    python tests/benchmarks/bench_closed_loop.py [--out runs/closed_loop] [--model small-gpt] [--steps 5]

Prints a table of measured, predicted (profile only) and predicted (calibrated) step times, the held-out
MAPE (target <= 20%), whether the plan the calibrated planner ranks first is within 15% of the fastest
measured, and writes scatter.png (predicted against measured) and results.json into --out.
It takes a while: about 20-40 s per layout on 2 cores, plus the two profiles.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from costmodel.catalog import get_model  # noqa: E402
from costmodel.estimate import estimate  # noqa: E402
from costmodel.fit import Measurement  # noqa: E402
from costmodel.profiles import InputError, load_cluster, load_profile  # noqa: E402
from executor.autotune import write_plan_json  # noqa: E402
from costmodel.plan import plan_label  # noqa: E402
from executor.calibrate import calibrate  # noqa: E402
from executor.launch import launch, preflight  # noqa: E402
from executor.report import scatter_png  # noqa: E402
from planner.search import to_plan  # noqa: E402
from planner.space import valid_plans  # noqa: E402


def profile(out: Path, world: int, quick: bool) -> tuple[Path, Path]:
    prof, clus = out / f"cpu_w{world}.yaml", out / f"cpu_w{world}-cluster.yaml"
    if not (prof.exists() and clus.exists()):
        cmd = [sys.executable, "-m", "planner.cli", "profile", "--out", str(prof), "--cluster-out", str(clus),
               "--world-size", str(world)] + (["--quick"] if quick else [])
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT)
        print(f"profiled world size {world} in {time.perf_counter() - t0:.0f} s")
    return prof, clus


def layouts(model, cluster, global_batch: int, micro_batch: int) -> list:
    """Every valid tp/pp/vpp/dp layout at one micro-batch size, no recompute, runnable here."""
    a = valid_plans(model, cluster, global_batch)
    seen, out = set(), []
    for i in range(len(a)):
        plan = to_plan(a, i)
        if plan.micro_batch != micro_batch or plan.recompute != "none" or plan.world_size != cluster.num_gpus:
            continue
        key = (plan.tp, plan.pp, plan.vpp, plan.dp, plan.sequence_parallel)
        if key in seen:
            continue
        try:
            preflight(model, plan)
        except InputError:
            continue
        seen.add(key)
        out.append(plan)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/closed_loop")
    ap.add_argument("--model", default="small-gpt")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--quick-profile", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = get_model(args.model)
    rows = []
    for world in (2, 4):
        prof_path, clus_path = profile(out, world, args.quick_profile)
        cluster, prof = load_cluster(clus_path), load_profile(str(prof_path))
        plans = layouts(model, cluster, args.global_batch, args.micro_batch)
        print(f"world size {world}: {len(plans)} layouts")
        for j, plan in enumerate(plans):
            run = out / f"w{world}_{j}"
            summary_path = run / "summary.json"
            if summary_path.exists() and json.loads(summary_path.read_text())["steps"] >= args.steps:
                summary = json.loads(summary_path.read_text())
            else:
                plan_path = write_plan_json(run / "plan.json", model, cluster, plan, prof)
                summary = launch(plan_path, run, steps=args.steps).summary
            rows.append({"world": world, "plan": plan, "label": f"w{world} " + plan_label(plan),
                         "measured_s": summary["step_time_s"], "cluster": cluster, "profile": prof,
                         "profile_path": prof_path})
            print(f"  {rows[-1]['label']}: {summary['step_time_s'] * 1e3:.1f} ms/step")
    # Calibrate each profile on every other run of its world size (sorted by measured time, so both halves
    # span the range), score the held-out runs.
    fitted_mask = np.zeros(len(rows), bool)
    predicted_before, predicted_after = np.zeros(len(rows)), np.zeros(len(rows))
    reports = {}
    for world in (2, 4):
        idx = sorted((i for i, r in enumerate(rows) if r["world"] == world), key=lambda i: rows[i]["measured_s"])
        fit_idx = idx[::2]
        fitted_mask[fit_idx] = True
        prof = rows[idx[0]]["profile"]
        ms = [Measurement(model=model, cluster=rows[i]["cluster"], plan=rows[i]["plan"],
                          step_time_s=rows[i]["measured_s"]) for i in fit_idx]
        names = ["gemm_efficiency", "layer_overhead_s", "comm_exposed", "memory_bound_efficiency"][:len(ms)]
        fitted, rep = calibrate(ms, prof, factors=names, fitted_by=f"bench_closed_loop, world {world}")
        reports[world] = rep
        for i in idx:
            r = rows[i]
            predicted_before[i] = estimate(model, r["cluster"], r["plan"], profile=prof).step_time_s
            predicted_after[i] = estimate(model, r["cluster"], r["plan"], profile=fitted).step_time_s
            r["fitted_profile"] = fitted
    measured = np.array([r["measured_s"] for r in rows])
    held = ~fitted_mask
    ape = np.abs(predicted_after - measured) / measured * 100
    print(f"\n{'layout':34s} {'measured':>9s} {'profile':>9s} {'calibr.':>9s} {'err%':>6s}  set")
    for i, r in enumerate(rows):
        print(f"{r['label']:34s} {measured[i] * 1e3:9.1f} {predicted_before[i] * 1e3:9.1f} "
              f"{predicted_after[i] * 1e3:9.1f} {ape[i]:6.1f}  {'fit' if fitted_mask[i] else 'held-out'}")
    mape_held = float(ape[held].mean())
    mape_before = float((np.abs(predicted_before - measured) / measured * 100)[held].mean())
    print(f"\nheld-out MAPE: {mape_before:.1f}% with the measured profile alone, {mape_held:.1f}% after calibration "
          f"(target <= 20%) over {int(held.sum())} runs; calibration on {int(fitted_mask.sum())}")
    ranking = {}
    for world in (2, 4):
        idx = [i for i, r in enumerate(rows) if r["world"] == world]
        first = min(idx, key=lambda i: predicted_after[i])
        fastest = min(idx, key=lambda i: measured[i])
        ratio = measured[first] / measured[fastest]
        ranking[world] = {"ranked_first": rows[first]["label"], "fastest": rows[fastest]["label"], "ratio": ratio}
        print(f"world {world}: ranked first {rows[first]['label']} measures {ratio:.3f}x the fastest "
              f"({rows[fastest]['label']}); target <= 1.15")
    scatter_png(str(out / "scatter.png"), measured, predicted_after, [r["label"] for r in rows], fitted_mask=fitted_mask,
                title=f"{model.name} on this CPU, {model.precision}, gloo: held-out MAPE {mape_held:.1f}%")
    (out / "results.json").write_text(json.dumps({
        "model": model.name, "held_out_mape": mape_held, "held_out_mape_uncalibrated": mape_before,
        "ranking": ranking, "calibration": {str(k): v for k, v in reports.items()},
        "runs": [{"label": r["label"], "measured_s": float(measured[i]), "predicted_profile_s": float(predicted_before[i]),
                  "predicted_calibrated_s": float(predicted_after[i]), "fit": bool(fitted_mask[i])}
                 for i, r in enumerate(rows)]}, indent=1))
    print(f"wrote {out / 'scatter.png'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
