"""How far to trust a step-time prediction: P10-P90 intervals and the validated runs near a plan.

Intervals. The residuals are log(published / predicted) of the held-out rows of ``plan validate
--cross-validate`` (each row predicted by profiles fitted without its source). Their split-conformal
quantiles (the finite-sample ranks ceil((n+1) q) and floor((n+1) q), so a class with few residuals gets
the more extreme order statistics) are taken by class: GPU generation x dense/MoE x scale band
(<= 64, 65-1024, > 1024 GPUs). Each class is blended toward its parent (generation x dense/MoE, then the
generation, then all rows) with weight n / (n + prior_rows), prior_rows chosen by cross-validation in
``scripts/fit_intervals.py``; a class without residuals takes its parent's quantiles. P50 is the point
estimate itself (its class median shift is measured, not applied: it is a level correction, the fit's
business). The script writes hardware_profiles/trust/intervals.json.

Support. The validated runs (hardware_profiles/trust/validated_runs.json, written by the same script from
data/validation/published_runs.csv) near a plan: Megatron runs (Paxml's are not of the planner's program)
of the same GPU family (generation), same data-parallel sharding
(distributed optimizer / DDP, or Megatron-FSDP = ZeRO-2/3), same regime of pp, cp and ep (> 1 or not) and of
the MoE all-to-all overlap and the optimizer offload (on or off), dense or MoE, and within 4x in GPUs. A plan with fewer than ``thin_support`` of them gets its class's
interval widened about P50 by ``thin_width_factor``: the smallest factor with which the cross-validated
rows that had thin support in their own training fold are covered as often as the nominal 80%.

Everything here is a pure function of its arguments and the two shipped files (read once per version of
the file); nothing reads data/.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from costmodel.profiles import PROFILE_DIR, InputError, file_version, load_profile
from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.plan import ParallelPlan

TRUST_DIR = PROFILE_DIR / "trust"
INTERVALS_FILE = TRUST_DIR / "intervals.json"
RUNS_FILE = TRUST_DIR / "validated_runs.json"

LEVELS = (0.1, 0.5, 0.9)
SCALE_BANDS = ((64, "le64"), (1024, "65-1024"), (math.inf, "gt1024"))
SCALE_SPAN = 4.0
"""Support: a validated run counts when its GPU count is within this factor of the plan's."""
CALIBRATED_KEY = "calibrated_width_factor"
"""Key of intervals.json: the factor on a prediction's interval widths when a plan calibrate profile was
measured on the model (HardwareProfile.measured_on), chosen by scripts/fit_intervals.py so that the one-run
calibrated same-model predictions of the held-out sources are covered 80% of the time; 1 where absent."""
THIN_SUPPORT = 3
"""Fewer validated runs near a plan than this: thin support (the wider interval)."""
FSDP_MIN_STAGE = 2
"""ZeRO stage from which the data-parallel sharding is Megatron-FSDP (2 = optim_grads, 3 = optim_grads_params)."""


# ---------------------------------------------------------------------------------------------------------
# Classes and the conformal fit
# ---------------------------------------------------------------------------------------------------------

def scale_band(num_gpus: int) -> str:
    return next(name for top, name in SCALE_BANDS if num_gpus <= top)


def class_path(generation: str | None, moe: bool, num_gpus: int) -> tuple[str, ...]:
    """The class of a prediction and its parents, most specific first, ending in "all"."""
    if not generation:
        return ("all",)
    kind = "moe" if moe else "dense"
    return (f"{generation}/{kind}/{scale_band(num_gpus)}", f"{generation}/{kind}", generation, "all")


def conformal_quantile(residuals: np.ndarray, level: float) -> float:
    """Split-conformal quantile of n residuals: the ceil((n+1) level)-th smallest above the median, the
    floor((n+1) level)-th below it (the median: the plain sample median). NaN when that rank does not
    exist (too few residuals for the level)."""
    r = np.sort(np.asarray(residuals, dtype=float))
    n = len(r)
    if n == 0:
        return math.nan
    if level == 0.5:
        return float(np.median(r))
    k = math.ceil((n + 1) * level) if level > 0.5 else math.floor((n + 1) * level)
    return float(r[k - 1]) if 1 <= k <= n else math.nan


def class_quantiles(residuals: np.ndarray, paths: list[tuple[str, ...]], prior_rows: float,
                    levels: tuple[float, ...] = LEVELS) -> dict[str, dict]:
    """{class: {"n": residuals in it, "q": blended quantiles}} for every class on the given paths.

    A class's raw conformal quantile is blended with its parent's: (n q_raw + prior_rows q_parent) /
    (n + prior_rows); where q_raw does not exist (too few residuals) the parent's is taken, widened to the
    class's smallest / largest residual when that lies outside it."""
    res = np.asarray(residuals, dtype=float)
    members: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        for c in path:
            members.setdefault(c, []).append(i)
    out: dict[str, dict] = {}
    # Parents before children: a path's length from the end is the depth.
    depth = {c: len(p) - j for p in paths for j, c in enumerate(p)}
    parent = {c: (p[j + 1] if j + 1 < len(p) else None) for p in paths for j, c in enumerate(p)}
    for c in sorted(members, key=lambda c: depth[c]):
        r = res[members[c]]
        n = len(r)
        q = []
        for li, lv in enumerate(levels):
            raw = conformal_quantile(r, lv)
            up = None if parent[c] is None else out[parent[c]]["q"][li]
            if up is None:
                q.append(raw if math.isfinite(raw) else (float(r.min()) if lv < 0.5 else float(r.max())))
            elif not math.isfinite(raw):
                # Too few residuals for the rank: the parent's quantile, but never inside the class's own
                # residuals (a thin class is wider than its data, not narrower).
                q.append(min(up, float(r.min())) if lv < 0.5 else max(up, float(r.max())) if lv > 0.5 else up)
            else:
                q.append((n * raw + prior_rows * up) / (n + prior_rows))
        out[c] = {"n": n, "q": [round(x, 5) for x in q]}
    return out


def lookup(classes: dict[str, dict], path: tuple[str, ...]) -> tuple[str, list[float]]:
    """The most specific class of ``path`` that has quantiles."""
    for c in path:
        if c in classes:
            return c, classes[c]["q"]
    raise KeyError(f"no class of {path} in the intervals (need at least 'all')")


def widened(q: list[float], factor: float) -> tuple[float, float]:
    """P10 and P90 log quantiles of ``q`` (P10, P50, P90) widened about P50 by ``factor``."""
    return q[1] - factor * (q[1] - q[0]), q[1] + factor * (q[2] - q[1])


def thin_width_factor(residuals: np.ndarray, qs: list[list[float]], thin: np.ndarray, target: float = 0.8,
                      max_factor: float = 4.0) -> float:
    """Smallest factor >= 1 (in steps of 0.05) with which the thin-support rows' class intervals, widened
    about P50, hold ``target`` of their residuals (``max_factor`` if none does)."""
    r = np.asarray(residuals, dtype=float)[thin]
    q = np.asarray(qs, dtype=float)[thin]
    if len(r) == 0:
        return 1.0
    for f in np.arange(1.0, max_factor + 1e-9, 0.05):
        lo, hi = q[:, 1] - f * (q[:, 1] - q[:, 0]), q[:, 1] + f * (q[:, 2] - q[:, 1])
        if np.mean((r >= lo) & (r <= hi)) >= target:
            return round(float(f), 2)
    return max_factor


def fit_intervals(residuals: np.ndarray, paths: list[tuple[str, ...]], support: np.ndarray,
                  prior_rows: float, folds: list[str] | None = None, width_factor: float = 1.0,
                  thin_factor: float | None = None) -> dict:
    """Class quantiles and the thin-support width factor from CV residuals, each row's class path and the
    count of validated runs near it in its training fold.

    With ``folds`` the width factor is measured out of fold: each thin row against the class quantiles
    fitted without its fold (a thin-support plan is one unlike the runs the intervals were fitted on, so
    its interval must hold on rows the quantiles did not see); without, in-sample. ``width_factor`` widens
    every interval about P50; ``thin_factor`` sets the thin-support factor instead of measuring it (the script
    chooses both by nested coverage); a thin-support plan gets the larger of the two factors."""
    res, sup = np.asarray(residuals, float), np.asarray(support)
    classes = class_quantiles(res, paths, prior_rows)
    if thin_factor is None:
        if folds is None:
            qs = [lookup(classes, p)[1] for p in paths]
        else:
            fold = np.array(folds)
            qs = [None] * len(res)
            for f in sorted(set(folds)):
                train = np.flatnonzero(fold != f)
                other = class_quantiles(res[train], [paths[i] for i in train], prior_rows) if len(train) else classes
                for i in np.flatnonzero(fold == f):
                    qs[i] = lookup(other, paths[i])[1]
        thin_factor = thin_width_factor(res, qs, sup < THIN_SUPPORT)
    return {"levels": list(LEVELS), "prior_rows": prior_rows, "thin_support": THIN_SUPPORT,
            "width_factor": width_factor, "thin_width_factor": thin_factor, "classes": classes}


def width_factors(fit: dict) -> tuple[float, float]:
    """(supported, thin) widening of the class intervals under ``fit``."""
    k = fit.get("width_factor", 1.0)
    return k, max(k, fit["thin_width_factor"])


def row_bounds(fit: dict, paths: list[tuple[str, ...]], support: np.ndarray,
               scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """P10 and P90 log bounds of each row under ``fit``, the widths times ``scale`` (a calibrated profile's
    CALIBRATED_KEY)."""
    lo, hi = [], []
    k_ok, k_thin = (scale * k for k in width_factors(fit))
    for p, s in zip(paths, support):
        q = lookup(fit["classes"], p)[1]
        a, b = widened(q, k_thin if s < fit["thin_support"] else k_ok)
        lo.append(a)
        hi.append(b)
    return np.array(lo), np.array(hi)


def describe_run(row: int, source_id: str, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> dict:
    """A validated run as the support table holds it."""
    parts = [f"tp{plan.tp}", f"pp{plan.pp}"] + ([f"vpp{plan.vpp}"] if plan.vpp > 1 else []) + [f"dp{plan.dp}"] \
        + [f"{k}{getattr(plan, k)}" for k in ("cp", "ep") if getattr(plan, k) > 1]
    if plan.zero_stage >= FSDP_MIN_STAGE:
        parts.append("fsdp")
    # The overlap and the optimizer offload are recorded only where a run had them (the shared runs do not), so
    # the file stays as it was.
    overlap = {"moe_a2a_overlap": True} if plan.moe_a2a_overlap else {}
    if overlap:
        parts.append("a2a-overlap")
    if plan.optimizer_offload > 0:
        overlap["optimizer_offload"] = plan.optimizer_offload
        parts.append("optim-cpu")
    return {**overlap, "row": row, "source_id": source_id, "model_name": model.name, "gpu_type": cluster.gpu,
            "software": software(plan.framework),
            "generation": _generation(cluster), "moe": model.num_experts > 0, "num_gpus": cluster.num_gpus,
            "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp,
            "zero_stage": plan.zero_stage, "layout": " ".join(parts)}


def training_support(runs: list[dict], folds: list[str]) -> np.ndarray:
    """For each run, the runs of the other folds that would count as its support."""
    gen = np.array([f"{r['generation'] or ''}/{r['software']}" for r in runs])
    moe = np.array([r["moe"] for r in runs], dtype=bool)
    gpus = np.array([r["num_gpus"] for r in runs], dtype=float)
    code = np.array([_run_code(r) for r in runs])
    fold = np.array(folds)
    near = ((gen[:, None] == gen[None, :]) & (moe[:, None] == moe[None, :]) & (code[:, None] == code[None, :])
            & (gpus[:, None] <= gpus[None, :] * SCALE_SPAN) & (gpus[None, :] <= gpus[:, None] * SCALE_SPAN)
            & (fold[:, None] != fold[None, :]))
    return near.sum(axis=1)


def cv_inputs(runs: list[dict], rows: list[dict]) -> dict:
    """From the run descriptors (``describe_run`` of every case) and the held-out rows of a cross-validation
    (with row, source_id, optional fold, predicted and published step time): the usable rows, their log
    residuals, class paths, support in their training fold and folds."""
    by_row = {r["row"]: r for r in runs}
    rows = [r for r in rows if r.get("predicted_step_time_s") and r.get("published_step_time_s")
            and math.isfinite(r["predicted_step_time_s"]) and r["row"] in by_row]
    fold_of = {r["row"]: str(r.get("fold", r["source_id"])) for r in rows}
    sup_all = training_support(runs, [fold_of.get(r["row"], r["source_id"]) for r in runs])
    sup_of = {r["row"]: int(s) for r, s in zip(runs, sup_all)}
    descs = [by_row[r["row"]] for r in rows]
    return {"rows": rows,
            "residuals": np.array([math.log(r["published_step_time_s"] / r["predicted_step_time_s"]) for r in rows]),
            "paths": [class_path(d["generation"], d["moe"], d["num_gpus"]) for d in descs],
            "support": np.array([sup_of[r["row"]] for r in rows], dtype=int),
            "folds": [fold_of[r["row"]] for r in rows]}


def held_out_bounds(residuals: np.ndarray, paths: list[tuple[str, ...]], support: np.ndarray, folds: list[str],
                    prior_rows: float, width_factor: float = 1.0,
                    thin_factor: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's P10 / P90 log bounds with the intervals fitted without its fold (nested cross-validation
    of the conformal step itself: how the shipped intervals do on a source they have not seen)."""
    res, sup, fold = np.asarray(residuals, float), np.asarray(support), np.array(folds)
    lo, hi = np.full(len(res), np.nan), np.full(len(res), np.nan)
    for f in sorted(set(folds)):
        test, train = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        fit = fit_intervals(res[train], [paths[i] for i in train], sup[train], prior_rows,
                            [folds[i] for i in train], width_factor, thin_factor)
        lo[test], hi[test] = row_bounds(fit, [paths[i] for i in test], sup[test])
    return lo, hi


def coverage(residuals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict:
    r = np.asarray(residuals, float)
    inside = (r >= lo) & (r <= hi)
    return {"rows": int(len(r)), "inside": int(inside.sum()),
            "fraction": round(float(inside.mean()), 4) if len(r) else None,
            "below_p10": int((r < lo).sum()), "above_p90": int((r > hi).sum())}


# ---------------------------------------------------------------------------------------------------------
# The shipped files
# ---------------------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    return _parse_json(path, *file_version(path, "file not found (package data; rebuild with scripts/fit_intervals.py)"))


@lru_cache(maxsize=8)
def _parse_json(path: Path, _mtime_ns: int, _size: int) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON (line {exc.lineno}: {exc.msg})") from None
    if path.name == RUNS_FILE.name:
        runs = data["runs"]
        data["_arrays"] = {
            "generation": np.array([r["generation"] or "" for r in runs]),
            "software": np.array([r["software"] for r in runs]),
            "moe": np.array([r["moe"] for r in runs], dtype=bool),
            "num_gpus": np.array([r["num_gpus"] for r in runs], dtype=float),
            "code": np.array([_run_code(r) for r in runs], dtype=int),
        }
    return data


def intervals_data(path: Path = INTERVALS_FILE) -> dict:
    return _read_json(Path(path))


def validated_runs(path: Path = RUNS_FILE) -> dict:
    return _read_json(Path(path))


# ---------------------------------------------------------------------------------------------------------
# Per plan, vectorised
# ---------------------------------------------------------------------------------------------------------

REGIMES = 64
"""Distinct values of regime_code."""


def regime_code(zero_stage, pp, cp, ep, a2a_overlap=False, optimizer_offload=0.0):
    """The plan-dependent part of the support key (scalars or arrays): the optimizer state in host memory (a CPU
    optimizer step, which no run without it supports), the MoE all-to-all overlap, FSDP, pp > 1, cp > 1, ep > 1 as
    bits."""
    return ((np.asarray(optimizer_offload, dtype=float) > 0).astype(int) * 32
            + np.asarray(a2a_overlap, dtype=bool).astype(int) * 16
            + (np.asarray(zero_stage) >= FSDP_MIN_STAGE).astype(int) * 8 + (np.asarray(pp) > 1) * 4
            + (np.asarray(cp) > 1) * 2 + (np.asarray(ep) > 1) * 1)


def _run_code(run: dict) -> int:
    return int(regime_code(run["zero_stage"], run["pp"], run["cp"], run["ep"], run.get("moe_a2a_overlap", False),
                           run.get("optimizer_offload", 0.0)))


def _generation(cluster: ClusterSpec) -> str | None:
    return load_profile(cluster.gpu).generation


def software(framework: str) -> str:
    """The family of programs a run belongs to for support: Megatron (Megatron-LM of any year, megatron-core,
    NeMo, Megatron-Bridge: the planner's plans) or another framework (Paxml) whose runs support none of them."""
    return "megatron" if framework.startswith("megatron") else framework


def _support_mask(runs: dict, generation: str | None, moe: bool, num_gpus: int,
                  framework: str = "megatron-core", hybrid: bool = False) -> np.ndarray:
    """Validated runs of the generation, dense or MoE, software and scale span. A hybrid Mamba model
    (ModelSpec.hybrid_pattern) has none: the validated runs are all transformers (the CSV's Nemotron 3 runs are
    not scored)."""
    a = runs["_arrays"]
    return ((a["generation"] == (generation or "")) & (a["moe"] == moe) & (a["software"] == software(framework))
            & (a["num_gpus"] * SCALE_SPAN >= num_gpus) & (a["num_gpus"] <= num_gpus * SCALE_SPAN) & (not hybrid))


def support_counts(model: ModelSpec, cluster: ClusterSpec, plans, runs: dict | None = None,
                   framework: str = "megatron-core") -> np.ndarray:
    """Validated runs near each plan (PlanArrays): one class lookup per call, then a table of the REGIMES regimes."""
    runs = runs or validated_runs()
    mask = _support_mask(runs, _generation(cluster), model.num_experts > 0, cluster.num_gpus, framework,
                         bool(model.hybrid_pattern))
    table = np.bincount(runs["_arrays"]["code"][mask], minlength=REGIMES)
    return table[regime_code(plans.zero_stage, plans.pp, plans.cp, plans.ep, plans.moe_a2a_overlap,
                             plans.optimizer_offload)]


def interval_class(model: ModelSpec, cluster: ClusterSpec, data: dict | None = None) -> tuple[str, list[float]]:
    """The class of the model on the cluster that has quantiles, and its (P10, P50, P90) log quantiles."""
    data = data or intervals_data()
    return lookup(data["classes"], class_path(_generation(cluster), model.num_experts > 0, cluster.num_gpus))


def calibrated_scale(model: ModelSpec, profile, data: dict) -> float:
    """The factor on the interval widths of ``model``'s predictions by ``profile``: CALIBRATED_KEY of the
    intervals ``data`` where plan calibrate measured the profile on the model, else 1."""
    return data.get(CALIBRATED_KEY, 1.0) if profile.measured_on(model) else 1.0


def step_intervals(model: ModelSpec, cluster: ClusterSpec, plans, step_time_s: np.ndarray,
                   framework: str = "megatron-core", profile=None) -> dict:
    """P10 / P90 step time and support of each plan (PlanArrays) given its predicted (P50) step time. The
    profile that predicted it (default: the cluster's GPU, which is a --profile file's path where one is given):
    one that ``plan calibrate`` measured on this model narrows the interval by CALIBRATED_KEY."""
    data = intervals_data()
    _, q = interval_class(model, cluster, data)
    support = support_counts(model, cluster, plans, framework=framework)
    thin = support < data["thin_support"]
    scale = calibrated_scale(model, profile or load_profile(cluster.gpu), data)
    k_ok, k_thin = (scale * k for k in width_factors(data))
    lo0, hi0 = widened(q, k_ok)
    lo1, hi1 = widened(q, k_thin)
    t = np.asarray(step_time_s, dtype=float)
    return {"step_time_p10_s": t * np.where(thin, math.exp(lo1), math.exp(lo0)),
            "step_time_p90_s": t * np.where(thin, math.exp(hi1), math.exp(hi0)),
            "support_runs": support}


def with_intervals(model: ModelSpec, cluster: ClusterSpec, plans, scores: dict) -> dict:
    """``scores`` (a cost function's output) with step_intervals added, unless it has them already."""
    if "step_time_p10_s" in scores or "step_time_s" not in scores:
        return scores
    return {**scores, **step_intervals(model, cluster, plans, scores["step_time_s"])}


def nearest_runs(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, limit: int = 5) -> list[dict]:
    """The validated runs near one plan, closest in GPU count first (then same tp, then same pp)."""
    runs = validated_runs()
    mask = _support_mask(runs, _generation(cluster), model.num_experts > 0, cluster.num_gpus, plan.framework,
                         bool(model.hybrid_pattern))
    code = int(regime_code(plan.zero_stage, plan.pp, plan.cp, plan.ep, plan.moe_a2a_overlap, plan.optimizer_offload))
    idx = np.flatnonzero(mask & (runs["_arrays"]["code"] == code))
    rows = [runs["runs"][i] for i in idx]
    rows.sort(key=lambda r: (abs(math.log(r["num_gpus"] / cluster.num_gpus)), r["tp"] != plan.tp, r["pp"] != plan.pp))
    keep = ("source_id", "model_name", "gpu_type", "num_gpus", "layout")
    return [{k: r[k] for k in keep} for r in rows[:limit]]


def plan_trust(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, step_time_s: float) -> dict:
    """Interval, class and support of one plan (plan check, plan.json)."""
    from costmodel.plan import PlanArrays

    one = PlanArrays.from_plans([plan])
    iv = step_intervals(model, cluster, one, np.array([step_time_s]), plan.framework)
    cls, _ = interval_class(model, cluster)
    scale = calibrated_scale(model, load_profile(cluster.gpu), intervals_data())
    if scale != 1.0:
        cls += f", narrowed x{scale:g}: the profile was calibrated on this model"
    n = int(iv["support_runs"][0])
    return {"predicted_p10_step_time_s": float(iv["step_time_p10_s"][0]),
            "predicted_p50_step_time_s": float(step_time_s),
            "predicted_p90_step_time_s": float(iv["step_time_p90_s"][0]),
            "interval_class": cls, "support_runs": n, "thin_support": n < intervals_data()["thin_support"],
            "nearest_validated_runs": nearest_runs(model, cluster, plan)}
