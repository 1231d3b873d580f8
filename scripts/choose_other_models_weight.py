"""Choose how much of a one-run calibration carries to other models (costmodel/recalibrate.py
OTHER_MODELS_WEIGHT for a model of the measured runs' kind, dense or MoE, and precision; OTHER_KIND_WEIGHT for
any other).

For each source of the published runs: fit the profiles without it (as ``plan validate --cross-validate``
does), then in each (source, GPU) group with two or more models calibrate on each model's first run and
predict the group's runs of other architectures, with the calibrated profile's ``other_models_weight`` set to
each candidate. Prints MAPE and median over all pairs and averaged per source; then the same inside each
software release of a source (source, release, GPU: one stack, as a user's cluster runs it), over all pairs
and split by whether the anchor and the predicted model are of one kind (dense or MoE) and precision.
About 2 minutes on 2 cores.

    python scripts/choose_other_models_weight.py [data/validation/published_runs.csv] [--json OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.crossval import held_out  # noqa: E402
from costmodel.recalibrate import recalibrate  # noqa: E402
from costmodel.validate import abs_percent_error, fit_profiles, load_cases, measurements_for, predict_case  # noqa: E402
from held_out_sources import run  # noqa: E402

WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def _kind(case) -> tuple[bool, str]:
    return case.model.num_experts > 0, case.model.precision


def fold(args: tuple[str, str]) -> tuple[str, dict[str, dict[float, list[float]]]]:
    """Errors per weight for the groups by (GPU) ("all"), by (release, GPU) ("release"), and the release pairs
    whose anchor and target share kind and precision ("release_same_kind") or not ("release_other_kind")."""
    path, source = args
    cases, _ = load_cases(path)
    profiles, _ = fit_profiles(cases, fitted_by=f"without {source}", exclude=lambda c: held_out(c, "source", source))
    errors = {key: {w: [] for w in WEIGHTS} for key in ("all", "all_same_kind", "all_other_kind", "release",
                                                        "release_same_kind", "release_other_kind")}
    calibrated: dict[int, object] = {}
    for by_release in (False, True):
        groups: dict[tuple, list] = {}
        for c in cases:
            if c.source_id == source:
                groups.setdefault((c.gpu_type, c.release if by_release else None), []).append(c)
        for rows in groups.values():
            firsts = {}
            for c in rows:
                firsts.setdefault(c.model.name, c)
            if len(firsts) < 2:
                continue
            base = profiles[rows[0].cluster.gpu]
            for name, anchor in firsts.items():
                if anchor.row not in calibrated:
                    calibrated[anchor.row], _ = recalibrate(measurements_for([anchor], {anchor.gpu_type: base}), base,
                                                            fitted_by="one run")
                cal = calibrated[anchor.row]
                for w in WEIGHTS:
                    prof = base.model_copy(update={"calibration": cal.model_copy(
                        update={"other_models_weight": w, "other_kind_weight": w})})
                    for t in rows:
                        if t.model.name == name:
                            continue
                        e = abs_percent_error(predict_case(t, prof)["predicted_step_time_s"], t.published_step_time_s)
                        key = "release" if by_release else "all"
                        errors[key][w].append(e)
                        same = _kind(t) == _kind(anchor)
                        errors[f"{key}_same_kind" if same else f"{key}_other_kind"][w].append(e)
    return source, errors


def main() -> int:
    args, per_source = run(__doc__, fold, "write the per-source errors to this file")
    titles = {"all": "(source, GPU) groups",
              "all_same_kind": "  of them, anchor and target of one kind (dense / MoE) and precision",
              "all_other_kind": "  of them, of another kind or precision",
              "release": "(source, release, GPU) groups",
              "release_same_kind": "  of them, anchor and target of one kind (dense / MoE) and precision",
              "release_other_kind": "  of them, of another kind or precision"}
    for key, title in titles.items():
        print(title)
        print(f"{'weight':>6} {'pairs':>6} {'MAPE %':>7} {'median %':>9} {'per-source MAPE %':>18}")
        for w in WEIGHTS:
            every = [x for e in per_source.values() for x in e[key][w]]
            by_src = [float(np.mean(e[key][w])) for e in per_source.values() if e[key][w]]
            if every:
                print(f"{w:>6} {len(every):>6} {np.mean(every):>7.2f} {np.median(every):>9.2f} {np.mean(by_src):>18.2f}")
    # The two weights a calibrated profile carries (Calibration.other_models_weight for a model of the measured
    # runs' kind and precision, other_kind_weight for any other), each pair's errors over all pairs of each grouping.
    for key, title in (("all", "(source, GPU) groups"), ("release", "(source, release, GPU) groups")):
        print(f"{title}: same kind weight x other kind weight, MAPE % over all pairs (per-source MAPE %)")
        print(f"{'same':>6} " + " ".join(f"{'other ' + str(w):>15}" for w in WEIGHTS))
        for ws in WEIGHTS:
            cells = []
            for wo in WEIGHTS:
                same = {s: e[f"{key}_same_kind"][ws] for s, e in per_source.items()}
                other = {s: e[f"{key}_other_kind"][wo] for s, e in per_source.items()}
                every = [x for s in per_source for x in same[s] + other[s]]
                by_src = [float(np.mean(same[s] + other[s])) for s in per_source if same[s] + other[s]]
                cells.append(f"{np.mean(every):>6.2f} ({np.mean(by_src):>5.2f})")
            print(f"{ws:>6} " + " ".join(f"{c:>15}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps({s: {k: {str(w): v for w, v in ew.items()} for k, ew in e.items()}
                                               for s, e in per_source.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
