"""Calibrating a fitted profile to the runs of one cluster (``plan calibrate``), and scoring how well that works.

A shipped profile is fitted to many sources; a user's cluster runs one software stack, often faster or slower
than the average by a level shift. A few measured runs determine only a few numbers, so the update fits as many
factors as the runs determine and leaves the rest at the profile's values:

- one or two runs: one factor, the one the runs move most (the largest change in predicted step time for a 10%
  change of the factor, in the direction the measurement needs) for how few of the fitted runs pin it down
  (``factors_for``), solved so the prediction meets the measurement;
- more runs: the (n + 1) // 2 factors ranked first that way, least squares with the prior centred on the profile's own
  values (``costmodel.fit.fit_calibration`` with ``center``), so the update shrinks towards the profile
  and not towards the un-fitted defaults.

The calibrated profile remembers the architectures it was measured on and their kinds (dense or MoE, and
precision). They get the update as fitted; another model of a measured kind gets OTHER_MODELS_WEIGHT of it, one of
another kind OTHER_KIND_WEIGHT (HardwareProfile.for_model), because a run's offset from the shipped profile is
mostly its model's and only partly its software stack's, and the factor one run moves is often one only its kind
exercises. Runs of several architectures give each of them the update its own runs determine
(Calibration.per_model) and leave the update pooled over all of them to the models not measured.

How the schemes compare was measured with costmodel/crossval.py :func:`one_run_calibration_cv` on data/validation/published_runs.csv
(README, "Calibrate the model to your cluster"). Pure: specs in, numbers out; no files.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from costmodel.fit import FACTORS, Measurement, factor_bounds, factor_rows, fit_calibration, predict, relevant_factors
from costmodel.profiles import Calibration, HardwareProfile, model_kind

# Factors a handful of runs cannot pin down: the GEMM shape curve needs many shapes, the host overhead
# executor runs on CPU processes.
NOT_FROM_FEW_RUNS = ("gemm_shape", "layer_overhead_s")
PROBE = 1.1   # factor change used to measure how strongly a run depends on a factor
# Prior weight of a one-factor update (as fit.PRIOR_SCALE). Chosen by one_run_calibration_cv inside held-out
# sources (profiles refitted without the source), MAPE / median % for same model | other models:
# 0: 8.75 / 4.54 | 18.5 / 12.7; 0.02: 8.71 / 4.47 | 18.2 / 12.5; 0.05: 8.76 / 5.04 | 17.1 / 11.5;
# 0.1: 9.59 / 6.45 | 14.6 / 10.2 (uncalibrated: 13.4 / 8.5 | 13.1 / 8.4). A calibrated profile is used first of
# all on the model it was measured on, so the weight favours that.
ONE_RUN_PRIOR_SCALE = 0.02
# Share of a calibration update (log space) that a calibrated profile carries to models it was not measured on
# (Calibration.other_models_weight: those of a kind its runs were, dense or MoE and precision; other_kind_weight:
# any other); the measured models get all of it. Chosen by the other-models one-run calibration inside held-out
# sources (scripts/choose_other_models_weight.py, 2026-12-07), MAPE over all pairs (per-source MAPE) for the
# (source, GPU) groups, 3,019 pairs | the (source, release, GPU) groups, 1,651 pairs: one weight for every model,
# 0: 10.29 (7.12) | 9.58 (7.08); 0.2: 10.20 (6.75) | 9.38 (6.67); 0.3: 10.25 (6.62) | 9.40 (6.52); 0.5: 10.56
# (6.51) | 9.67 (6.37); 1: 12.64 (7.28) | 11.53 (7.04). Split by kind, the same kind's pairs are best at 0.3-0.5
# (8.61 / 8.30% against 8.66 / 8.56% at 0.2) and the other kinds' at 0-0.1 (11.17-11.18 / 10.13%): the factor a
# run moves most is often one that only its kind exercises. 0.3 and 0.1: 10.15 (6.60) | 9.28 (6.50), better than
# 0.2 for both on all four figures; 0.5 and 0.1: 10.24 (6.44) | 9.22 (6.28). A run's offset from the profile is
# mostly its model's, not its stack's.
OTHER_MODELS_WEIGHT = 0.3
OTHER_KIND_WEIGHT = 0.1
# Weight of a run of another GPU type, against one of the profile's own, in how firmly the fit pinned a factor
# down (factor_support). Chosen with the one-run calibration inside held-out sources
# (scripts/choose_one_run_support.py), MAPE / median % for same model | same release | other models:
# ranking by sensitivity alone 8.13 / 4.71 | 7.03 / 4.14 | 11.95 / 7.39; 0.03: 8.19 / 4.63 | 5.69 / 4.15 | 11.88;
# 0.1: 8.06 / 4.63 | 5.47 / 4.14 | 11.74 / 7.35; 0.3: 8.51 / 5.10 | 5.51 / 4.14 | 11.96. An NVFP4 run on a
# GPU whose fp4 factor no run informed now moves that factor, not the GEMM efficiency its bf16 and fp8 siblings
# share (GB300 Llama 3.1 405B inside one release: 32% -> 3% on the fp8 siblings).
POOLED_RUN_WEIGHT = 0.1
# Range of the activation-memory multiplier plan calibrate may fit (Calibration.activation_memory): a stack keeping
# a quarter of the counted activations, or four times them, is outside what the layer model can stand for.
ACTIVATION_MEMORY_BOUNDS = (0.25, 4.0)


def _with(profile: HardwareProfile, values: dict[str, float], fitted_by: str | None = None) -> HardwareProfile:
    upd = dict(values, **({"fitted_by": fitted_by} if fitted_by else {}))
    return profile.model_copy(update={"calibration": profile.calibration.model_copy(update=upd)})


def factor_sensitivity(measurements: list[Measurement], profile: HardwareProfile,
                       names: list[str]) -> dict[str, float]:
    """How far each factor can move the runs' predictions towards their measurements: for each run, the
    larger |log| change of its predicted step time, in the direction that run needs, when the factor goes
    PROBE times up or down (within its bounds); summed over the runs. A factor at a bound or behind a cap (the
    GEMM efficiency ceiling) scores what it can still do."""
    measured = np.array([m.step_time_s for m in measurements])
    p0 = predict(measurements, profile)
    need = np.sign(np.log(measured / p0))   # +1: the run is slower than predicted
    out = {}
    for n in names:
        cur = getattr(profile.calibration, n)
        lo, hi = factor_bounds(n, profile)
        moves = [np.log(predict(measurements, _with(profile, {n: float(np.clip(cur * f, min(lo, cur),
                                                                              max(hi, cur)))})) / p0)
                 for f in (PROBE, 1 / PROBE)]
        out[n] = float(np.sum(np.maximum(np.maximum(need * moves[0], need * moves[1]), 0.0)))
    return out


def factor_support(profile: HardwareProfile, name: str) -> float:
    """How many runs pin a factor down: the runs of the profile's GPU type it was fitted to that exercise it,
    plus POOLED_RUN_WEIGHT of those of every GPU type (Calibration.fitted_rows, fitted_rows_pooled)."""
    cal = profile.calibration
    return cal.fitted_rows.get(name, 0) + POOLED_RUN_WEIGHT * cal.fitted_rows_pooled.get(name, 0)


def micro_batch_pairs(measurements: list[Measurement]) -> int:
    """How many runs repeat another run's model, cluster and layout at another micro-batch size.

    Such a pair pins down the host time per layer and micro-batch (layer_overhead_s): the GEMM,
    attention and communication factors scale with the tokens of a step, the host time with its count of
    micro-batches. One H200, 1.1B model without Transformer Engine (examples/gpu_check_h200): 2.15 s per
    step at micro-batch 1 and 1.19 s at 4, both predicted 0.93 s by the freshly measured profile."""
    sizes: dict[tuple, set[int]] = {}
    for m in measurements:
        key = (m.model, m.cluster, m.plan.model_copy(update={"micro_batch": 1}))
        sizes.setdefault(key, set()).add(m.plan.micro_batch)
    return sum(len(v) - 1 for v in sizes.values())


def factors_for(measurements: list[Measurement], profile: HardwareProfile) -> tuple[list[str], dict[str, float]]:
    """The factors a set of runs determines, most determined first, and every candidate's sensitivity, in
    ranking order (the first of them are the factors).

    A factor ranks by how far it moves the runs towards their measurements (factor_sensitivity) over the square
    root of 1 + the runs that already pin it down (factor_support): the spread of a factor fitted to n runs
    shrinks like 1/sqrt(1 + n), so the update goes where the profile knows least. A profile fitted to no runs
    (defaults, plan profile) ranks by sensitivity alone. Runs that repeat a layout at another micro-batch
    size (micro_batch_pairs) also fit layer_overhead_s, in place of the last ranked factor when there would
    be more factors than runs."""
    cands = [n for n in relevant_factors(measurements) if n not in NOT_FROM_FEW_RUNS]
    sens = factor_sensitivity(measurements, profile, cands)
    ranked = sorted(cands, key=lambda n: -sens[n] / np.sqrt(1.0 + factor_support(profile, n)))
    n = len(measurements)
    k = 1 if n <= 2 else min(len(ranked), (n + 1) // 2)
    if micro_batch_pairs(measurements):
        return ranked[:min(k, n - 1)] + ["layer_overhead_s"], {name: sens[name] for name in ranked}
    return ranked[:k], {name: sens[name] for name in ranked}


def _fit_one(measurements: list[Measurement], profile: HardwareProfile, name: str) -> float:
    """The value of one factor that brings the runs' predictions nearest their measurements (mean squared log
    error, and the prior of fit_calibration centred on the profile's value)."""
    measured = np.array([m.step_time_s for m in measurements])
    cur = getattr(profile.calibration, name)
    lo, hi = factor_bounds(name, profile)
    x0 = np.log(cur)
    width = FACTORS[name][1]

    def objective(x: float) -> float:
        pred = predict(measurements, _with(profile, {name: float(np.exp(x))}))
        prior = (ONE_RUN_PRIOR_SCALE * (x - x0) / width) ** 2 / len(measurements)
        return float(np.mean(np.log(pred / measured) ** 2) + prior)

    res = minimize_scalar(objective, bounds=(min(np.log(lo), x0), max(np.log(hi), x0)), method="bounded",
                          options={"xatol": 1e-4})
    return float(np.exp(res.x)) if res.fun <= objective(x0) else cur


def _fit(measurements: list[Measurement], profile: HardwareProfile, fitted_by: str,
         factors: list[str] | None) -> tuple[Calibration, list[str], dict[str, float], str]:
    """The factor update one set of runs determines (module docstring): the calibration, the factors it moved,
    every candidate's sensitivity (empty for factors given) and the scheme in words."""
    if factors is None:
        names, sens = factors_for(measurements, profile)
    else:
        names, sens = list(factors), {}
    if len(names) == 1:
        value = _fit_one(measurements, profile, names[0])
        cal = _with(profile, {names[0]: value}, fitted_by).calibration
        return cal, names, sens, f"one factor ({names[0]}), solved to {len(measurements)} run(s)"
    # A factor at zero (layer_overhead_s of a profile no run calibrated) gets fit.FACTORS' centre instead.
    center = {n: v for n in names if (v := getattr(profile.calibration, n)) > 0}
    cal, _ = fit_calibration(measurements, profile, fitted_by=fitted_by, factors=names, center=center)
    return cal, names, sens, f"{len(names)} factors from {len(measurements)} runs, prior centred on the profile's values"


def _per_model(measurements: list[Measurement], profile: HardwareProfile, fitted_by: str,
               factors: list[str] | None, pooled: list[str]) -> dict[str, dict[str, float]]:
    """Calibration.per_model: for each measured architecture, the factors its own runs determine, fitted from
    the profile as it predicts that architecture (so, with one run of each, exactly the one-run calibration of
    that model), with every factor that the pooled update (``pooled``) or an earlier calibration moved given the
    value that architecture gets; the earlier calibration's other architectures kept as they were."""
    prior = profile.calibration
    out = {k: dict(v) for k, v in prior.per_model.items()}
    by_arch: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_arch.setdefault(m.model.architecture_key(), []).append(m)
    for key, runs in by_arch.items():
        cal, names, _, _ = _fit(runs, profile.for_model(runs[0].model), fitted_by, factors)
        moved = set(names) | set(pooled) | set(prior.uncalibrated) | set(out.get(key, {}))
        out[key] = {n: round(float(getattr(cal, n)), 6) for n in sorted(moved)}
    return out


def fit_activation_memory(measurements: list[Measurement], profile: HardwareProfile) -> tuple[HardwareProfile, dict]:
    """The profile with Calibration.activation_memory fitted to the runs that measured their peak memory (mean
    squared log error of the largest stage's peak, within ACTIVATION_MEMORY_BOUNDS), and a report; the profile
    unchanged and an empty report when no run measured it. Weights, gradients and optimizer state are counted,
    not fitted: two micro-batch sizes of one layout on one H200 (examples/gpu_check_h200) differ from the model
    by 1.9x in the activations and by 2% in the rest."""
    runs = [m for m in measurements if m.peak_memory_bytes]
    if not runs:
        return profile, {}
    measured = np.array([m.peak_memory_bytes for m in runs])
    lo, hi = np.log(ACTIVATION_MEMORY_BOUNDS)

    def peaks(x: float) -> np.ndarray:
        return predict(runs, _with(profile, {"activation_memory": float(np.exp(x))}), what="peak_memory_bytes")

    res = minimize_scalar(lambda x: float(np.mean(np.log(peaks(x) / measured) ** 2)), bounds=(lo, hi),
                          method="bounded", options={"xatol": 1e-4})
    value = float(np.exp(res.x))
    ape = lambda p: round(float(np.mean(np.abs(p - measured) / measured) * 100), 2)  # noqa: E731
    before = predict(runs, profile, what="peak_memory_bytes")
    fitted = _with(profile, {"activation_memory": value})
    after = predict(runs, fitted, what="peak_memory_bytes")
    return fitted, {"factor": "activation_memory", "previous": profile.calibration.activation_memory,
                    "value": round(value, 4), "runs": len(runs), "mape_before": ape(before), "mape_after": ape(after),
                    "per_run": [{"measured_bytes": float(m), "before_bytes": float(b), "after_bytes": float(a)}
                                for m, b, a in zip(measured, before, after)]}


def recalibrate(measurements: list[Measurement], profile: HardwareProfile, *, fitted_by: str,
                factors: list[str] | None = None) -> tuple[Calibration, dict]:
    """The profile's calibration updated to the runs (see the module docstring), and a report: the scheme,
    factors, previous and new values, the sensitivities, MAPE before and after.

    Runs of several architectures: the pooled update (fitted to all of them) is what a model not measured gets,
    at OTHER_MODELS_WEIGHT; each measured architecture gets the update its own runs determine
    (Calibration.per_model). A pooled update alone leaves each model with the others' offsets: on the published
    runs, one calibration per held-out source and GPU on the first run of every model there predicted those
    models' other runs at 11.3% MAPE that way, 8.4% with each model's own factors (8.0% calibrated one model at
    a time, 10.6% before any calibration; costmodel/crossval.py one_run_calibration_cv, ``same_model_one_file``)."""
    if not measurements:
        raise ValueError("no measurements to calibrate on")
    prior = profile.calibration
    pooled_profile = profile.model_copy(update={"calibration": prior.model_copy(update={"per_model": {}})})
    cal, names, sens, scheme = _fit(measurements, pooled_profile, fitted_by, factors)
    previous = {n: round(float(getattr(prior, n)), 4) for n in names}
    # What the update moved, as it was before (before an earlier plan calibrate, for a profile calibrated again).
    moved = {**{n: float(getattr(prior, n)) for n in names if float(getattr(cal, n)) != float(getattr(prior, n))},
             **prior.uncalibrated}
    archs = {m.model.architecture_key() for m in measurements}
    models = set(prior.measured_models) | archs
    per_model = _per_model(measurements, profile, fitted_by, factors, names) \
        if len(archs) > 1 or prior.per_model else {}
    if per_model:
        scheme += f"; each of the {len(archs)} measured architecture(s) gets the factors its own runs determine"
    _, new_runs = factor_rows(measurements)   # the runs measured here count for this GPU type and for all
    own, pooled = dict(prior.fitted_rows), dict(prior.fitted_rows_pooled)
    for n, k in new_runs.items():
        own[n], pooled[n] = own.get(n, 0) + k, pooled.get(n, 0) + k
    kinds = set(prior.measured_kinds) | {model_kind(m.model) for m in measurements}
    cal = cal.model_copy(update={"measured_models": tuple(sorted(models)), "uncalibrated": moved,
                                 "measured_kinds": tuple(sorted(kinds)),
                                 "other_models_weight": OTHER_MODELS_WEIGHT, "other_kind_weight": OTHER_KIND_WEIGHT,
                                 "fitted_rows": own,
                                 "fitted_rows_pooled": pooled, "per_model": per_model})
    measured = np.array([m.step_time_s for m in measurements])
    before = predict(measurements, profile)
    after = predict(measurements, profile.model_copy(update={"calibration": cal}))
    ape = lambda p: round(float(np.mean(np.abs(p - measured) / measured) * 100), 2)  # noqa: E731
    names_of = {}
    for m in measurements:
        names_of.setdefault(m.model.architecture_key(), m.model.name)
    report = {"profile": profile.name, "measurements": len(measurements), "scheme": scheme, "factors": names,
              "previous": previous, "values": {n: round(float(getattr(cal, n)), 4) for n in names},
              "sensitivity": {n: round(v, 4) for n, v in sorted(sens.items(), key=lambda kv: -kv[1])},
              "support": {n: round(factor_support(profile, n), 1) for n in sens},
              "ranked": list(sens),
              "mape_before": ape(before), "mape_after": ape(after),
              "measured_models": list(cal.measured_models), "measured_kinds": list(cal.measured_kinds),
              "other_models_weight": cal.other_models_weight, "other_kind_weight": cal.other_kind_weight,
              "per_model": {names_of.get(k, k): {n: round(v, 4) for n, v in vals.items()}
                            for k, vals in per_model.items() if k in archs}}
    return cal, report
