"""Fitting a hardware profile's calibration factors to measured steps (scipy least squares).

Used by ``scripts/fit_profiles.py`` on the published runs, by ``plan validate --cross-validate`` for
leave-sources-out folds, and by the executor's calibration on its own measurements. Factors are fitted
in log space with a robust loss and a weak prior pulling each towards its default, so a profile with
few measurements stays near the defaults instead of chasing noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, minimize

from costmodel.estimate import estimate_arrays

from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import Calibration, HardwareProfile
from costmodel.specs import ClusterSpec, ModelSpec

# Factor -> (default, prior width in log space, bounds). Defaults are the un-fitted physics.
FACTORS: dict[str, tuple[float, float, tuple[float, float]]] = {
    "gemm_efficiency": (1.0, 0.15, (0.5, 1.3)),
    "fp8_gemm_efficiency": (1.0, 0.20, (0.4, 1.5)),
    "fp4_gemm_efficiency": (1.0, 0.30, (0.3, 1.5)),
    "memory_bound_efficiency": (0.7, 0.30, (0.2, 1.0)),
    "moe_overhead": (1.0, 0.50, (0.2, 5.0)),
    "comm_exposed": (1.0, 0.50, (0.1, 3.0)),
    "attention_efficiency": (1.0, 0.20, (0.4, 1.5)),
    "gemm_shape": (1.0, 0.70, (0.25, 4.0)),
    "a2a_time": (1.0, 0.50, (0.2, 5.0)),
    # Seconds, not a multiplier: fitted in log space from a 1 ms start with a wide prior (CPU hosts only).
    "layer_overhead_s": (1e-3, 3.0, (1e-6, 1.0)),
}
# Tighter bounds on GPU profiles. comm_exposed scales the exposed part of NCCL collectives that the overlap
# model already splits into hidden and exposed: a factor beyond 2x either way would stand for something
# other than communication (on B200 an unbounded fit took it to the 3.0 bound, absorbing MoE compute
# error). CPU hosts on gloo keep the wide bound: nothing overlaps there and a shared box varies more.
# A bound of 1.5 was measured on the grouped folds (2026-12-07) and moved nothing held out (README, Accuracy).
GPU_BOUNDS: dict[str, tuple[float, float]] = {"comm_exposed": (0.5, 2.0), "fp8_gemm_efficiency": (0.4, 1.1)}
# Weight of the prior against the mean absolute relative error: the penalty is
# PRIOR_SCALE^2 * sum((log(x / default) / width)^2), independent of the number of measurements.
# Chosen by leave-one-source-out cross-validation on data/validation/published_runs.csv
# (plan validate --cross-validate): 0.1 gave 10.24% in-sample and 13.2% across sources, 0.05 gave 9.83%
# and 13.3% (no fold worse by more than 0.6 points); weaker priors move factors towards their bounds.
PRIOR_SCALE = 0.05


@dataclass
class Measurement:
    """One measured step: what ran, on what, and how long it took."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    step_time_s: float
    peak_memory_bytes: float | None = None
    """The run's peak device memory where it was measured (CUDA allocator), else None."""


def _plan_groups(measurements: list[Measurement]) -> dict[tuple, dict[ParallelPlan, list[int]]]:
    """The measurements as one vectorised estimate each: {(model, cluster, framework): {plan: [indices]}}."""
    groups: dict[tuple, dict[ParallelPlan, list[int]]] = {}
    for i, m in enumerate(measurements):
        groups.setdefault((m.model, m.cluster, m.plan.framework), {}).setdefault(m.plan, []).append(i)
    return groups


def _predict_group(key: tuple, plans: list[ParallelPlan], prof: HardwareProfile, what: str) -> np.ndarray:
    model, cluster, framework = key
    r = estimate_arrays(model, cluster, PlanArrays.from_plans(plans), profile=prof, framework=framework)
    return r[what] if what == "step_time_s" else np.nanmax(r[what], axis=1)


def predict(measurements: list[Measurement], profile: HardwareProfile | dict[str, HardwareProfile],
            what: str = "step_time_s") -> np.ndarray:
    """Predicted step time of each measurement (``what="peak_memory_bytes"``: its largest stage's peak memory):
    one vectorised call per (model, cluster, framework), identical plans scored once. ``profile`` is one profile
    for all, or one per GPU type (cluster.gpu)."""
    out = np.empty(len(measurements))
    for key, by_plan in _plan_groups(measurements).items():
        plans = list(by_plan)
        value = _predict_group(key, plans, profile[key[1].gpu] if isinstance(profile, dict) else profile, what)
        for j, plan in enumerate(plans):
            out[by_plan[plan]] = value[j]
    return out


def factor_moves(name: str, m: Measurement) -> bool:
    """Whether calibration factor ``name`` can change the predicted step of ``m``: the fp8 factor only quantised
    GEMMs (fp8, MXFP8, NVFP4 runs), the fp4 factor only NVFP4 ones, the MoE routing and all-to-all factors only
    MoE layers; every other factor any run (costmodel/compute.py, costmodel/estimate.py)."""
    if name == "fp8_gemm_efficiency":
        return m.model.precision in ("fp8", "mxfp8", "nvfp4")
    if name == "fp4_gemm_efficiency":
        return m.model.precision == "nvfp4"
    if name in ("moe_overhead", "a2a_time"):
        return m.model.is_moe
    return True


def relevant_factors(measurements: list[Measurement]) -> list[str]:
    """Factors the measurements can inform, most important first."""
    moves = lambda name: any(factor_moves(name, m) for m in measurements)  # noqa: E731
    names = ["gemm_efficiency", "comm_exposed", "memory_bound_efficiency"]
    names += [k for k in ("fp8_gemm_efficiency", "fp4_gemm_efficiency") if moves(k)]
    names += ["attention_efficiency", "gemm_shape"]
    return names + [k for k in ("moe_overhead", "a2a_time") if moves(k)]


def factor_rows(measurements: list[Measurement]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """How many of the runs exercise each calibration factor (relevant_factors of each run):
    ({GPU type: {factor: runs}}, {factor: runs of every GPU type}), factors in FACTORS order."""
    order = {name: i for i, name in enumerate(FACTORS)}
    by_gpu: dict[str, dict[str, int]] = {}
    pooled: dict[str, int] = {}
    for m in measurements:
        counts = by_gpu.setdefault(m.cluster.gpu, {})
        for name in relevant_factors([m]):
            counts[name] = counts.get(name, 0) + 1
            pooled[name] = pooled.get(name, 0) + 1
    ordered = lambda c: dict(sorted(c.items(), key=lambda kv: order[kv[0]]))  # noqa: E731
    return {g: ordered(c) for g, c in sorted(by_gpu.items())}, ordered(pooled)


def host_factors(measurements: list[Measurement]) -> list[str]:
    """Factors for executor runs on CPU processes: GEMM rate, host overhead per layer, exposed gloo
    communication, element-wise bandwidth (attention runs as plain GEMMs and softmax there)."""
    names = ["gemm_efficiency", "layer_overhead_s", "comm_exposed", "memory_bound_efficiency"]
    if any(m.model.is_moe for m in measurements):
        names += ["moe_overhead"]
    return names


def fit_factors(measurements: list[Measurement], profiles: dict[str, HardwareProfile], names: list[str], *,
                center: dict[str, float] | None = None, prior_weight: float | None = None,
                weights: np.ndarray | None = None, fitted_by: str = "fit", max_nfev: int = 100,
                polish_evals: int = 120) -> dict[str, float]:
    """One set of factor values shared by every measurement, each predicted on its own GPU's profile
    (``profiles[cluster.gpu]``, whose other calibration fields are kept).

    Least squares in log space on the relative step-time errors (robust soft-L1 loss), plus a Gaussian prior
    on log(x / center) of width FACTORS[name][1]; ``center`` defaults to the un-fitted physics. The prior
    weighs as ``prior_weight`` measurements' worth (times PRIOR_SCALE^2); None: as many as there are
    measurements, so the prior's pull does not fade with more data. A fixed prior_weight lets data
    outweigh the prior as it grows (partial pooling). ``weights`` (one per measurement, mean 1) set each
    measurement's share of the data term.
    """
    measured = np.array([m.step_time_s for m in measurements])
    n = len(measured)
    w = np.ones(n) if weights is None else np.asarray(weights, float) * n / np.sum(weights)
    sw = np.sqrt(w)
    center = center or {}
    x0 = np.log([center.get(k, FACTORS[k][0]) for k in names])
    kinds = {p.kind for p in profiles.values()}
    gpu = kinds == {"gpu"}
    bounds = {k: (GPU_BOUNDS.get(k, FACTORS[k][2]) if gpu else FACTORS[k][2]) for k in names}
    lo = np.log([bounds[k][0] for k in names])
    hi = np.log([bounds[k][1] for k in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    prior_w = np.array([1.0 / FACTORS[k][1] for k in names]) * PRIOR_SCALE * np.sqrt(
        n if prior_weight is None else prior_weight)
    bases = {g: p.calibration.model_dump() for g, p in profiles.items()}

    def calibrated(x: np.ndarray) -> dict[str, HardwareProfile]:
        vals = {k: float(np.exp(v)) for k, v in zip(names, x)}
        return {g: p.model_copy(update={"calibration": Calibration(**{**bases[g], **vals, "fitted_by": fitted_by})})
                for g, p in profiles.items()}

    # A group of runs is estimated again only when a factor that moves it changed (factor_moves): a finite-
    # difference Jacobian column of the fp8, fp4 or MoE factors leaves the other groups' estimates as they were.
    groups = [(key, list(by_plan), list(by_plan.values())) for key, by_plan in _plan_groups(measurements).items()]
    # Per group, the positions in x of the factors that move its runs (runs of one group share model and framework).
    moving = [np.array([j for j, k in enumerate(names) if factor_moves(k, measurements[idx[0][0]])], dtype=int)
              for _, _, idx in groups]
    cache: dict[tuple, np.ndarray] = {}

    def predicted(x: np.ndarray) -> np.ndarray:
        if len(cache) > 100_000:
            cache.clear()
        profs = calibrated(x)
        out = np.empty(n)
        for g, (key, plans, idx) in enumerate(groups):
            ck = (g, x[moving[g]].tobytes())
            if ck not in cache:
                cache[ck] = _predict_group(key, plans, profs[key[1].gpu], "step_time_s")
            for j, ix in enumerate(idx):
                out[ix] = cache[ck][j]
        return out

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predicted(x)
        return np.concatenate([sw * (pred / measured - 1.0), prior_w * (x - x0)])

    res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.03, diff_step=0.02,
                        max_nfev=max_nfev, ftol=1e-3, xtol=1e-3, gtol=1e-4)
    x = res.x
    if polish_evals:
        # The step time is piecewise smooth (max of overlapped terms, discrete fallbacks), so finish with a
        # derivative-free search (Powell) on the weighted mean absolute relative error plus the same prior.
        def objective(x: np.ndarray) -> float:
            r = residuals(x)
            return float(np.sum(w * np.abs(r[:n] / sw)) / n + np.sum(r[n:] ** 2) / n)

        pol = minimize(objective, x, method="Powell", bounds=list(zip(lo, hi)),
                       options={"maxfev": polish_evals, "xtol": 1e-2, "ftol": 1e-4})
        if pol.fun < objective(x):
            x = pol.x
    return {k: float(np.exp(v)) for k, v in zip(names, x)}


def factor_bounds(name: str, profile: HardwareProfile) -> tuple[float, float]:
    """Where a fit may take a factor on this kind of profile."""
    return GPU_BOUNDS.get(name, FACTORS[name][2]) if profile.kind == "gpu" else FACTORS[name][2]


def fit_calibration(measurements: list[Measurement], profile: HardwareProfile, *, fitted_by: str,
                    factors: list[str] | None = None, min_measurements: int | None = None,
                    max_nfev: int = 100, polish_evals: int = 120, center: dict[str, float] | None = None,
                    prior_weight: float | None = None) -> tuple[Calibration, dict]:
    """Least-squares fit of one profile's factors (fit_factors); returns the calibration and a before/after
    report.

    Refuses (ValueError) when there are fewer measurements than factors to fit.
    """
    names = factors or relevant_factors(measurements)
    need = min_measurements if min_measurements is not None else len(names)
    if len(measurements) < need:
        raise ValueError(f"{len(measurements)} measurement(s) for {len(names)} factor(s) ({', '.join(names)}); "
                         f"need at least {need}")
    measured = np.array([m.step_time_s for m in measurements])
    profiles = {m.cluster.gpu: profile for m in measurements} or {profile.name: profile}
    vals = fit_factors(measurements, profiles, names, center=center, prior_weight=prior_weight,
                       fitted_by=fitted_by, max_nfev=max_nfev, polish_evals=polish_evals)
    cal = Calibration(**{**profile.calibration.model_dump(), **vals, "fitted_by": fitted_by})
    before = predict(measurements, profile)
    after = predict(measurements, profile.model_copy(update={"calibration": cal}))
    ape = lambda p: float(np.mean(np.abs(p - measured) / measured) * 100)  # noqa: E731
    report = {"profile": profile.name, "measurements": len(measurements), "factors": names,
              "values": {k: round(v, 4) for k, v in vals.items()},
              "mape_before": round(ape(before), 2), "mape_after": round(ape(after), 2)}
    return cal, report
