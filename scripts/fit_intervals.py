"""Fit the P10-P90 step-time intervals and build the support table (package data of costmodel/trust.py).

    plan validate data/validation/published_runs.csv --cross-validate --json /tmp/cv.json
    python scripts/fit_intervals.py data/validation/published_runs.csv /tmp/cv.json [--scheme KEY]

Writes hardware_profiles/trust/validated_runs.json (one descriptor per scored row of the CSV: GPU,
generation, dense/MoE, GPU count, degrees, sharding) and hardware_profiles/trust/intervals.json (class
quantiles of the held-out log residuals, the blending strength, the thin-support width factor and the width
factor of a profile calibrated on the model, from the one-run calibration residuals), and
prints the coverage: in-sample (intervals from all held-out residuals) and nested (each fold's intervals
fitted without it), by class. ``--scheme`` picks the cross-validation scheme when the JSON holds several
(``cross_validation[KEY]`` or ``cross_validation["schemes"][KEY]``: source, release, gpu); by default
leave-one-source-out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import trust  # noqa: E402
from costmodel.validate import load_cases, run_descriptors  # noqa: E402

PRIOR_GRID = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0)
WIDTH_GRID = (1.0, 1.25, 1.5, 2.0)
THIN_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0)
CALIBRATED_GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(15))   # 0.3 ... 1.0
NOMINAL = 0.8   # the share of step times a P10-P90 interval is meant to hold


def cv_rows(data: dict, scheme: str | None) -> tuple[str, list[dict]]:
    cv = data.get("cross_validation")
    if cv is None:
        raise SystemExit("the JSON has no cross_validation: run plan validate CSV --cross-validate --json OUT")
    options = {k: v for k, v in {**cv, **cv.get("schemes", {})}.items() if isinstance(v, dict) and "rows" in v}
    if "rows" in cv:
        options.setdefault("leave_one_source_out", cv)
    if scheme is not None:
        if scheme not in options:
            raise SystemExit(f"--scheme {scheme}: valid: {', '.join(sorted(options)) or '(none with rows)'}")
        return scheme, options[scheme]["rows"]
    if not options:
        raise SystemExit("the JSON's cross_validation has no held-out rows (rerun plan validate --cross-validate)")
    key = next((k for k in ("source", "leave_one_source_out") if k in options), sorted(options)[0])
    return key, options[key]["rows"]


def pinball(r: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Quantile loss of the P10 and P90 bounds."""
    def loss(q, level):
        d = r - q
        return np.maximum(level * d, (level - 1) * d)
    return float(np.mean(loss(lo, 0.1) + loss(hi, 0.9)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="published-runs CSV (data/validation/published_runs.csv)")
    ap.add_argument("cv_json", help="output of plan validate CSV --cross-validate --json OUT")
    ap.add_argument("--scheme", default=None, help="cross-validation scheme key, when the JSON has several")
    ap.add_argument("--out-dir", default=str(trust.TRUST_DIR), help="where the two JSON files go")
    # Defaults: each width is the smallest (never below 1, the split-conformal quantiles) whose intervals, fitted
    # without each row's fold, hold the nominal 80% of the rows they apply to: supported rows set the width of
    # every interval, thinly supported rows their own factor (a plan unlike the validated runs must still get a
    # P10-P90 that means P10-P90 on a stack the data has not seen). The quantile loss is printed beside each;
    # on the 342 shared runs after the GB300 refit it is flat for thin rows (1.75x 0.0871, 75% inside; 2.25x
    # 0.0885, 81%), so coverage decides.
    ap.add_argument("--width-factor", type=float, default=None,
                    help="widen every class interval about P50 (default: the smallest of WIDTH_GRID whose nested "
                         "intervals hold 80%% of the supported rows)")
    ap.add_argument("--thin-factor", type=float, default=None,
                    help="widening of a thinly supported plan's interval (default: the smallest of THIN_GRID whose "
                         "nested intervals hold 80%% of the thin-support rows)")
    args = ap.parse_args()

    cases, _ = load_cases(args.csv)
    runs = run_descriptors(cases)
    data = json.loads(Path(args.cv_json).read_text())
    scheme, rows = cv_rows(data, args.scheme)
    cv = trust.cv_inputs(runs, rows)
    rows, res, paths, support, folds = cv["rows"], cv["residuals"], cv["paths"], cv["support"], cv["folds"]

    # Blending strength: the one whose nested (fold-held-out) intervals have the least quantile loss.
    losses = {}
    for n0 in PRIOR_GRID:
        lo, hi = trust.held_out_bounds(res, paths, support, folds, n0)
        losses[n0] = pinball(res, lo, hi)
    prior = min(losses, key=losses.get)
    # Widening trades coverage of the rows (as shipped) against coverage of an unseen source (nested).
    whole = trust.training_support(runs, [str(r["row"]) for r in runs]) + 1   # support as plan validate sees it
    by_row = {r["row"]: i for i, r in enumerate(runs)}
    support_now = np.array([whole[by_row[r["row"]]] for r in rows])
    thin = support < trust.THIN_SUPPORT
    widths, thins = {}, {}
    for k in sorted({*WIDTH_GRID, *([args.width_factor] if args.width_factor else [])}):
        lo, hi = trust.held_out_bounds(res, paths, support, folds, prior, k, k)
        widths[k] = {"nested_pinball_supported": round(pinball(res[~thin], lo[~thin], hi[~thin]), 5),
                     "nested_supported": trust.coverage(res[~thin], lo[~thin], hi[~thin])["fraction"]}
    width = args.width_factor or next((k for k in WIDTH_GRID if widths[k]["nested_supported"] >= NOMINAL),
                                      WIDTH_GRID[-1])
    for k in sorted({*THIN_GRID, *([args.thin_factor] if args.thin_factor else [])}):
        if k < width:
            continue
        lo, hi = trust.held_out_bounds(res, paths, support, folds, prior, width, k)
        thins[k] = {"nested_pinball_thin": round(pinball(res[thin], lo[thin], hi[thin]), 5),
                    "nested_thin": trust.coverage(res[thin], lo[thin], hi[thin])["fraction"]}
    thin_k = args.thin_factor or next((k for k in thins if thins[k]["nested_thin"] >= NOMINAL), max(thins))
    fit = trust.fit_intervals(res, paths, support, prior, folds, width, thin_k)
    lo_in, hi_in = trust.row_bounds(fit, paths, support)
    lo_out, hi_out = trust.held_out_bounds(res, paths, support, folds, prior, width, thin_k)
    lo_now, hi_now = trust.row_bounds(fit, paths, support_now)

    # A profile plan calibrate measured on the model: the smallest factor on the widths with which the one-run
    # calibrated same-model predictions of each held-out source (plan validate --cross-validate) fall inside
    # their row's interval, as shipped, about the calibrated prediction 80% of the time.
    one = data["cross_validation"].get("one_run_calibration", {}).get("same_model", {}).get("residuals", [])
    at = {r["row"]: i for i, r in enumerate(rows)}
    one = [(at[x["row"]], x["log_residual"]) for x in one if x["row"] in at]
    calibrated = {}
    if one:
        idx, r1 = np.array([i for i, _ in one]), np.array([x for _, x in one])
        for k in CALIBRATED_GRID:
            lo, hi = trust.row_bounds(fit, [paths[i] for i in idx], support_now[idx], scale=k)
            calibrated[k] = trust.coverage(r1, lo, hi)
        fit[trust.CALIBRATED_KEY] = next((k for k in CALIBRATED_GRID if calibrated[k]["fraction"] >= NOMINAL), 1.0)

    med = np.array([trust.lookup(fit["classes"], p)[1][1] for p in paths])
    pub = np.array([r["published_step_time_s"] for r in rows])
    pred = np.array([r["predicted_step_time_s"] for r in rows])
    mape_point = float(np.mean(np.abs(pred - pub) / pub) * 100)
    mape_shift = float(np.mean(np.abs(pred * np.exp(med) - pub) / pub) * 100)

    by_class = {}
    for c in sorted({p[0] for p in paths}):
        sel = np.array([p[0] == c for p in paths])
        used, q = trust.lookup(fit["classes"], next(p for p in paths if p[0] == c))
        by_class[c] = {"rows": int(sel.sum()), "quantiles_from": used, "q": q,
                       "shipped_support": trust.coverage(res[sel], lo_now[sel], hi_now[sel]),
                       "held_out": trust.coverage(res[sel], lo_out[sel], hi_out[sel])}
    report = {
        "in_sample": trust.coverage(res, lo_in, hi_in),
        "shipped_support": trust.coverage(res, lo_now, hi_now),
        "thin_support_rows_shipped": int((support_now < trust.THIN_SUPPORT).sum()),
        "held_out_folds": trust.coverage(res, lo_out, hi_out),
        "thin_support_rows": int(thin.sum()),
        "thin_support_held_out": trust.coverage(res[thin], lo_out[thin], hi_out[thin]),
        "supported_held_out": trust.coverage(res[~thin], lo_out[~thin], hi_out[~thin]),
        "p50_mape_point_estimate": round(mape_point, 2),
        "p50_mape_shifted_by_class_median": round(mape_shift, 2),
        "pinball_by_prior_rows": {str(k): round(v, 5) for k, v in losses.items()},
        "by_width_factor": {str(k): v for k, v in widths.items()},
        "by_thin_factor": {str(k): v for k, v in thins.items()},
        "by_class": by_class,
        "calibrated_same_model_by_factor": {str(k): v for k, v in calibrated.items()},
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = {"csv": Path(args.csv).name, "cross_validation_scheme": scheme, "rows": len(rows)}
    (out_dir / trust.RUNS_FILE.name).write_text(json.dumps(
        {"fitted_by": "scripts/fit_intervals.py", "source": src["csv"], "scale_span": trust.SCALE_SPAN,
         "runs": runs}, indent=1) + "\n")
    (out_dir / trust.INTERVALS_FILE.name).write_text(json.dumps(
        {"fitted_by": "scripts/fit_intervals.py", "source": src, **fit, "coverage": report}, indent=1) + "\n")

    print(f"{len(rows)} held-out residuals ({scheme}); blending prior_rows={prior:g} "
          f"(nested quantile loss {', '.join(f'{k:g}: {v:.4f}' for k, v in losses.items())})")
    print(f"width factor {width:g} (supported rows, nested: " + "; ".join(
        f"{k:g}: {100 * v['nested_supported']:.1f}% inside, quantile loss {v['nested_pinball_supported']:.4f}"
        for k, v in widths.items()) + ")")
    print(f"thin-support factor {thin_k:g} (thin rows, nested: " + "; ".join(
        f"{k:g}: {100 * v['nested_thin']:.1f}%, {v['nested_pinball_thin']:.4f}" for k, v in thins.items()) + ")")
    for name, key in (("in-sample (training-fold support)", "in_sample"),
                      ("in-sample (support from the shipped table, as plan validate)", "shipped_support"),
                      ("held-out folds", "held_out_folds"),
                      ("  thin support", "thin_support_held_out"), ("  supported", "supported_held_out")):
        c = report[key]
        print(f"P10-P90 coverage {name}: {c['inside']}/{c['rows']} = {100 * (c['fraction'] or 0):.1f}% "
              f"({c['below_p10']} below, {c['above_p90']} above)")
    print(f"thin support (< {trust.THIN_SUPPORT} runs): {int(thin.sum())} rows in their training fold, "
          f"{report['thin_support_rows_shipped']} against the shipped table; their factor {fit['thin_width_factor']}")
    if calibrated:
        print(f"calibrated width factor {fit[trust.CALIBRATED_KEY]:g} ({len(one)} one-run calibrated same-model "
              f"predictions of held-out sources: " + "; ".join(
                  f"{k:g}: {100 * v['fraction']:.1f}%" for k, v in calibrated.items()) + ")")
    else:
        print("no one-run calibration residuals in the JSON: calibrated predictions keep the full width")
    print(f"P50 MAPE: point estimate {mape_point:.1f}%, shifted by the class median {mape_shift:.1f}%")
    print(f"{'class':28s} {'rows':>5s}  {'quantiles from':22s} {'P10':>6s} {'P50':>6s} {'P90':>6s}  as shipped  held-out")
    for c, v in by_class.items():
        q = v["q"]
        print(f"{c:28s} {v['rows']:5d}  {v['quantiles_from']:22s} {math.exp(q[0]):6.3f} {math.exp(q[1]):6.3f} "
              f"{math.exp(q[2]):6.3f}  {v['shipped_support']['inside']:4d}/{v['rows']:<4d} "
              f"{v['held_out']['inside']:4d}/{v['rows']:<4d}")


if __name__ == "__main__":
    main()
