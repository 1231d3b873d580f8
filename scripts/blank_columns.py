"""How much a published-runs CSV loses when it leaves columns blank: the shared runs read back with columns blanked.

Blind CSVs of other sources publish less than the shared one: no micro-batch, no interleaving, no sequence
parallelism, no degrees beside the GPU count. ``plan validate`` fills what a row leaves open the way its stack fills
it, or with the fastest setting that fits (a published run was tuned). This blanks one column, or a set of them,
in every row of data/validation/published_runs.csv, predicts the 342 scored rows again with the shipped profiles
(nothing refitted) and prints their MAPE and median next to the CSV as published, with the rows that became errors
and those predicted not to fit. README "Accuracy against published runs" quotes the table.

    python scripts/blank_columns.py [--json OUT]      # about a minute on one core
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from costmodel.validate import validate  # noqa: E402

DATA = ROOT / "data" / "validation" / "published_runs.csv"
# (label, columns blanked together).
BLANKS = (
    ("nothing (as published)", ()),
    ("micro_batch", ("micro_batch",)),
    ("vp", ("vp",)),
    ("sp", ("sp",)),
    ("recompute", ("recompute",)),
    ("zero_stage_or_distopt", ("zero_stage_or_distopt",)),
    ("framework", ("framework",)),
    ("notes", ("notes",)),
    ("gpus_per_node", ("gpus_per_node",)),
    ("ep", ("ep",)),
    ("cp", ("cp",)),
    ("vocab", ("vocab",)),
    ("tp, pp (dp given)", ("tp", "pp")),
    ("tp, pp, dp", ("tp", "pp", "dp")),
    ("precision", ("precision",)),
    ("all of micro_batch, vp, sp, recompute, zero_stage_or_distopt, framework, gpus_per_node, ep, dp, notes",
     ("micro_batch", "vp", "sp", "recompute", "zero_stage_or_distopt", "framework", "gpus_per_node", "ep", "dp",
      "notes")),
)


def blanked(rows: list[dict], columns: tuple[str, ...], path: Path) -> dict:
    """validate() of ``rows`` with ``columns`` blank in every row, summarised."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows({**r, **{c: "" for c in columns}} for r in rows)
    out = validate(path)
    ape = [r["ape"] for r in out["rows"] if r["ape"] is not None]
    return {"rows": len(ape), "mape": round(statistics.mean(ape), 2), "median_ape": round(statistics.median(ape), 2),
            "errors": sum(1 for r in out["rows"] if r.get("error")),
            "not_fit": sum(1 for r in out["rows"] if r.get("fits") is False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    with DATA.open() as f:
        rows = list(csv.DictReader(f))
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, columns in BLANKS:
            figures[label] = blanked(rows, columns, Path(tmp) / "blank.csv")
            f = figures[label]
            print(f"{label:34.34s} rows {f['rows']:3d}  MAPE {f['mape']:6.2f}%  median {f['median_ape']:5.2f}%  "
                  f"errors {f['errors']:3d}  not fitting {f['not_fit']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
