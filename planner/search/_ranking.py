"""Ranking scored plans: the step time they are ranked by, the order of a scored space, and Pareto fronts.

Pure numpy over the score columns of a cost function (``planner.search.CostFn``); the result types built from
these orders live in ``_results``.
"""

from __future__ import annotations

import numpy as np

from costmodel.plan import PlanArrays
from costmodel.profiles import InputError

RANK_BY = ("p50", "p90")
"""What "time" means when plans are ranked: the predicted (P50) step time or its P90 (costmodel/trust.py)."""
OBJECTIVES = ("time", "memory", "gpus")
"""What a search can minimise: step time, peak memory per GPU, GPU count (``objective_column``)."""


def rank_time(scores: dict, rank_by: str = "p50") -> np.ndarray:
    """The step time plans are ranked by: P50 (the prediction) or P90 (where the scores have it)."""
    if rank_by not in RANK_BY:
        raise InputError(f"--rank-by {rank_by}: valid: {', '.join(RANK_BY)}")
    key = "step_time_p90_s" if rank_by == "p90" and "step_time_p90_s" in scores else "step_time_s"
    return np.asarray(scores[key], dtype=float)


def fit_order(scores: dict, rank_by: str = "p50") -> np.ndarray:
    """Row order of scored plans: those that fit by step time (``rank_time``), then the rest by peak memory."""
    t = np.where(scores["fits"], rank_time(scores, rank_by), np.inf)
    fit_first = np.argsort(t, kind="stable")
    n_fit = int(scores["fits"].sum())
    rest = np.argsort(np.nanmax(scores["peak_memory_bytes"], axis=1), kind="stable")
    rest = rest[~scores["fits"][rest]]
    return np.concatenate([fit_first[:n_fit], rest])


def objective_column(scores: dict, objective: str, plans: PlanArrays, rank_by: str = "p50") -> np.ndarray:
    """The value of one objective ("time", "memory", "gpus") of every scored plan."""
    if objective == "time":
        return rank_time(scores, rank_by)
    if objective == "memory":
        return np.nanmax(scores["peak_memory_bytes"], axis=1)
    return plans.tp * plans.pp * plans.dp * plans.cp


def pareto_front(values: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``values`` (n x k, minimised) that no other row dominates."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return np.zeros(0, dtype=int)
    le = (v[:, None, :] <= v[None, :, :]).all(axis=2)   # le[j, i]: j <= i everywhere
    lt = (v[:, None, :] < v[None, :, :]).any(axis=2)
    dominated = (le & lt).any(axis=0)
    return np.flatnonzero(~dominated)


def pareto_order(scores: dict, plans: PlanArrays, objectives: tuple[str, ...],
                 rank_by: str = "p50") -> tuple[np.ndarray, np.ndarray]:
    """(order, front) of scored plans under several objectives: the Pareto front of the plans that fit (sorted
    by the first objective, then time), the other plans that fit likewise, then the rest by peak memory."""
    fits = np.asarray(scores["fits"], dtype=bool)
    vals = np.stack([objective_column(scores, o, plans, rank_by) for o in objectives], axis=1)
    feas = np.flatnonzero(fits)
    front = feas[pareto_front(vals[feas])] if len(feas) else np.zeros(0, dtype=int)
    primary, time_ = vals[:, 0], rank_time(scores, rank_by)
    front = front[np.lexsort((time_[front], primary[front]))]
    rest_fit = np.setdiff1d(feas, front)
    rest_fit = rest_fit[np.lexsort((time_[rest_fit], primary[rest_fit]))]
    peak = np.nanmax(scores["peak_memory_bytes"], axis=1)
    nofit = np.flatnonzero(~fits)
    nofit = nofit[np.argsort(peak[nofit], kind="stable")]
    return np.concatenate([front, rest_fit, nofit]).astype(int), front
