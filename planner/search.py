"""Finding the fastest plan that fits: score the space with an injected cost function.

The planner never imports the executor; the cost function is passed in (by default the vectorised
cost model, ``costmodel.estimate.estimate_arrays``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.estimate import PlanArrays, estimate_arrays
from costmodel.specs import ClusterSpec, ModelSpec, ParallelPlan
from planner.space import RECOMPUTE_NAMES, valid_plans

CostFn = Callable[[ModelSpec, ClusterSpec, PlanArrays], dict]


def default_cost(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays) -> dict:
    return estimate_arrays(model, cluster, plans)


@dataclass
class SearchResult:
    """Scored candidates, best first among those that fit."""

    plans: PlanArrays
    scores: dict
    order: np.ndarray          # indices into plans, fitting plans by step time, then the rest
    evaluated: int

    def plan(self, rank: int = 0) -> ParallelPlan:
        return to_plan(self.plans, int(self.order[rank]))

    @property
    def any_fits(self) -> bool:
        return bool(self.scores["fits"].any()) if self.evaluated else False


def to_plan(a: PlanArrays, i: int) -> ParallelPlan:
    rl = a.recompute_layers[i]
    return ParallelPlan(tp=int(a.tp[i]), pp=int(a.pp[i]), vpp=int(a.vpp[i]), dp=int(a.dp[i]), cp=int(a.cp[i]),
                        ep=int(a.ep[i]), etp=int(a.etp[i]), sequence_parallel=bool(a.sp[i]),
                        micro_batch=int(a.micro_batch[i]), global_batch=int(a.global_batch[i]),
                        recompute=RECOMPUTE_NAMES[int(a.recompute[i])],
                        recompute_layers=None if rl < 0 else int(rl),
                        distributed_optimizer=bool(a.distributed_optimizer[i]), zero_stage=int(a.zero_stage[i]))


def exhaustive(model: ModelSpec, cluster: ClusterSpec, global_batch: int, cost: CostFn = default_cost) -> SearchResult:
    """Score every valid plan in one vectorised call."""
    plans = valid_plans(model, cluster, global_batch)
    if len(plans) == 0:
        return SearchResult(plans, {}, np.zeros(0, dtype=int), 0)
    scores = cost(model, cluster, plans)
    t = np.where(scores["fits"], scores["step_time_s"], np.inf)
    fit_order = np.argsort(t, kind="stable")
    n_fit = int(scores["fits"].sum())
    rest = np.argsort(np.nanmax(scores["peak_memory_bytes"], axis=1), kind="stable")
    rest = rest[~scores["fits"][rest]]
    order = np.concatenate([fit_order[:n_fit], rest])
    return SearchResult(plans, scores, order, len(plans))
