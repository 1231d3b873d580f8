"""Expert agreement: for each scored published run, search layouts with that run's model, cluster and batch,
and compare the cost model's prediction of the published configuration with the planner's best.

    python scripts/expert_agreement.py [--csv data/validation/published_runs.csv] [--json OUT]

Prints, per row, ratio = predicted(published config) / predicted(planner's best); a ratio below 1 means the
planner's best is predicted slower than what the experts ran (a search-space gap), which is counted. Rows
published with FSDP (zero_stage_or_distopt "fsdp") are read as ZeRO-3 (costmodel.validate.row_plan) and
compared with a search that has ZeRO-3 too (planner.space.ZERO_STAGES); layouts carry "fsdp" when sharded so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from costmodel.validate import load_cases, predict_case  # noqa: E402
from costmodel.plan import ZERO_TAGS  # noqa: E402
from planner.search import exhaustive  # noqa: E402


def describe(plan) -> str:
    tag = f" {ZERO_TAGS[plan.zero_stage]}" if plan.zero_stage in ZERO_TAGS else ""
    return (f"tp{plan.tp} pp{plan.pp} vpp{plan.vpp} dp{plan.dp} cp{plan.cp} ep{plan.ep} mbs{plan.micro_batch} "
            f"{plan.recompute}{tag}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "data" / "validation" / "published_runs.csv"))
    ap.add_argument("--json", default=None, help="write the per-row results here")
    args = ap.parse_args(argv)
    cases, _ = load_cases(args.csv)
    rows, seen = [], {}
    for c in cases:
        if c.plan.framework != "megatron-core":
            continue  # the planner plans megatron-core layouts
        pred = predict_case(c)
        published = pred["predicted_step_time_s"]
        key = (c.model, c.cluster, c.plan.global_batch)
        if key not in seen:
            res = exhaustive(c.model, c.cluster, c.plan.global_batch)
            seen[key] = (float(res.scores["step_time_s"][res.order[0]]) if res.any_fits else float("nan"),
                         res.plan(0) if res.any_fits else None)
        best, plan = seen[key]
        ratio = published / best if np.isfinite(best) else float("nan")
        rows.append({"row": c.row, "source_id": c.source_id, "model": c.model.name, "gpu": c.cluster.gpu,
                     "num_gpus": c.cluster.num_gpus, "published_pred_s": published, "best_pred_s": best,
                     "ratio": ratio, "published_layout": describe(pred["plan"]),
                     "best_layout": None if plan is None else describe(plan),
                     "published_zero_stage": pred["plan"].zero_stage,
                     "best_zero_stage": None if plan is None else plan.zero_stage})
    r = np.array([x["ratio"] for x in rows])
    ok = np.isfinite(r)
    print(f"rows {len(rows)} (megatron-core runs), planner found a fitting plan for {ok.sum()}")
    print(f"ratio predicted(published) / predicted(planner best): median {np.median(r[ok]):.3f}, "
          f"p10 {np.percentile(r[ok], 10):.3f}, p90 {np.percentile(r[ok], 90):.3f}")
    fsdp_pub = sum(1 for x in rows if x["published_zero_stage"] >= 3)
    fsdp_best = sum(1 for x in rows if (x["best_zero_stage"] or 0) >= 3)
    print(f"FSDP (ZeRO-3): {fsdp_pub} rows published with it, planner's best uses it in {fsdp_best} rows")
    worse = [x for x in rows if np.isfinite(x["ratio"]) and x["ratio"] < 1 - 1e-9]
    print(f"planner's best predicted slower than the published config: {len(worse)} rows")
    for x in worse[:20]:
        print(f"  row {x['row']} {x['model']} on {x['num_gpus']} {x['gpu']}: ratio {x['ratio']:.3f}, "
              f"published {x['published_layout']}, best {x['best_layout']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
