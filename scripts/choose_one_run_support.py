"""Choose how a one-run calibration weighs the runs that already pin a factor down (costmodel/recalibrate.py
POOLED_RUN_WEIGHT).

For each source of the published runs: fit the profiles without it (as ``plan validate --cross-validate``
does), then score the one-run calibration inside it (costmodel/crossval.py one_run_calibration_cv: same model,
same release, other models, other models inside one release) with each candidate weight, and with the factor
ranked by sensitivity alone (the profiles' run counts emptied). Prints MAPE and median pooled over the sources.
About 3 minutes on 2 cores.

    python scripts/choose_one_run_support.py [data/validation/published_runs.csv] [--json OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import costmodel.recalibrate as recalibrate  # noqa: E402
from costmodel.crossval import held_out, one_run_calibration_cv, pool_one_run  # noqa: E402
from costmodel.validate import fit_profiles, load_cases  # noqa: E402
from held_out_sources import run  # noqa: E402

WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0)
FIGURES = ("same_model", "same_release", "other_models", "other_models_same_release")


def _unsupported(profiles: dict) -> dict:
    """The profiles with their run counts emptied: every factor ranks by its sensitivity alone."""
    return {g: p.model_copy(update={"calibration": p.calibration.model_copy(
        update={"fitted_rows": {}, "fitted_rows_pooled": {}})}) for g, p in profiles.items()}


def fold(args: tuple[str, str]) -> tuple[str, dict[str, dict]]:
    path, source = args
    cases, _ = load_cases(path)
    profiles, _ = fit_profiles(cases, fitted_by=f"without {source}", exclude=lambda c: held_out(c, "source", source))
    held = [c for c in cases if c.source_id == source]
    out = {"sensitivity alone": one_run_calibration_cv(held, _unsupported(profiles))}
    for w in WEIGHTS:
        recalibrate.POOLED_RUN_WEIGHT = w
        out[str(w)] = one_run_calibration_cv(held, profiles)
    return source, out


def _cell(fig: dict) -> str:
    """MAPE / median (pairs) of one pooled figure; a dash where the sources gave it no pairs (a subset without
    release groups or second models)."""
    if not fig["count"]:
        return "- (0)"
    return f"{fig['mape']:>6.2f} / {fig['median_ape']:>5.2f} ({fig['count']})"


def main() -> int:
    args, per_source = run(__doc__, fold, "write the pooled figures to this file")
    sources = sorted(per_source)
    labels = ["sensitivity alone", *map(str, WEIGHTS)]
    pooled = {label: pool_one_run([per_source[s][label] for s in sources]) for label in labels}
    print(f"{'weight':>17} " + " ".join(f"{f:>27}" for f in FIGURES))
    for label in labels:
        cells = [_cell(pooled[label][f]) for f in FIGURES]
        print(f"{label:>17} " + " ".join(f"{c:>27}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps({label: {f: {k: pooled[label][f][k] for k in ("count", "mape", "median_ape")}
                                                       for f in FIGURES} for label in labels}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
