"""The search's contract: the cost function every strategy is given (``CostFn``) and the result every strategy
returns (``SearchResult``; ``OptunaResult`` adds the study), with plans read back from their rows.

The planner never imports the executor; the cost function is passed in (by default the vectorised cost
model, ``costmodel.estimate.estimate_arrays``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.estimate import estimate_arrays

from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec
from planner.search._ranking import fit_order, objective_column

CostFn = Callable[[ModelSpec, ClusterSpec, PlanArrays], dict]
"""cost(model, cluster, plans) -> score columns (``estimate_arrays``'s keys: step_time_s, fits, ...)."""


def default_cost(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays) -> dict:
    return estimate_arrays(model, cluster, plans)


def to_plan(a: PlanArrays, i: int) -> ParallelPlan:
    """Row i as a plan, without its stage split (costmodel.plan.PlanArrays.plan)."""
    return a.plan(i, split=False)


def plan_at(a: PlanArrays, i: int) -> ParallelPlan:
    """Row i as a plan with its uneven stage split (``stage_layers``), if the row has one."""
    return a.plan(i)


@dataclass
class SearchResult:
    """Scored candidates, best first among those that fit."""

    plans: PlanArrays
    scores: dict
    order: np.ndarray          # indices into plans, fitting plans by step time, then the rest
    evaluated: int
    rank_by: str = "p50"       # the step time the fitting plans are ordered by (RANK_BY)

    def plan(self, rank: int = 0) -> ParallelPlan:
        return to_plan(self.plans, int(self.order[rank]))

    def split_plan(self, rank: int = 0) -> ParallelPlan:
        """The plan at ``rank`` with its uneven stage split, when it has one."""
        return plan_at(self.plans, int(self.order[rank]))

    @property
    def any_fits(self) -> bool:
        return bool(self.scores["fits"].any()) if self.evaluated else False


def ranked(plans: PlanArrays, scores: dict, rank_by: str = "p50") -> SearchResult:
    """Scored plans in order: those that fit by step time (``rank_time``), then the rest by peak memory."""
    return SearchResult(plans, scores, fit_order(scores, rank_by), len(plans), rank_by)


@dataclass
class OptunaResult(SearchResult):
    """An Optuna search: the distinct valid plans the study scored (a ``SearchResult``, best first), the
    study, the Pareto front of the objectives among plans that fit, and how the run went.

    ``plans`` / ``scores`` / ``order`` / ``evaluated`` mean what they mean for ``exhaustive`` (``evaluated`` =
    distinct valid plans scored in the whole study, resumed runs included); ``order`` puts the Pareto front
    first (sorted by the first objective), then the other plans that fit, then the rest by peak memory.
    """

    study: object = None                          # optuna.Study (None when no plan is valid)
    objectives: tuple[str, ...] = ("time",)
    pareto: np.ndarray = None                     # indices into plans: non-dominated plans that fit
    nodes: np.ndarray = None                      # node count of each plan
    n_trials: int = 0                             # trials finished by this call
    total_trials: int = 0                         # finished trials in the study
    evaluations: int = 0                          # cost-model evaluations made by this call (cache misses)
    interrupted: bool = False                     # KeyboardInterrupt stopped the search (trials kept)
    sampler: str = "tpe"
    study_name: str | None = None
    storage: str | None = None

    def plan(self, rank: int = 0) -> ParallelPlan:
        """The plan ranked ``rank``, with its uneven stage split (``layers_per_stage``) when it has one."""
        return plan_at(self.plans, int(self.order[rank]))

    @property
    def best_plan(self) -> ParallelPlan | None:
        return self.plan(0) if self.any_fits else None

    def objective_values(self, i: int) -> tuple[float, ...]:
        return tuple(float(objective_column(self.scores, o, self.plans, self.rank_by)[i]) for o in self.objectives)

    def pareto_plans(self) -> list[ParallelPlan]:
        return [plan_at(self.plans, int(i)) for i in self.pareto]


def take_rows(a: PlanArrays, idx) -> PlanArrays:
    """The rows ``idx`` of a PlanArrays."""
    idx = np.atleast_1d(np.asarray(idx, dtype=int))
    cols = {}
    for name in a.__dataclass_fields__:
        v = getattr(a, name)
        cols[name] = None if v is None else v[idx]
    return PlanArrays(**cols)


def concat_scores(parts: list[dict]) -> dict:
    """Score columns of several scored PlanArrays, row after row (2-D columns padded with NaN)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k, v in parts[0].items():
        if isinstance(v, dict):
            out[k] = concat_scores([p[k] for p in parts])
        elif np.ndim(v) == 2:
            w = max(np.shape(p[k])[1] for p in parts)
            out[k] = np.concatenate([np.pad(np.asarray(p[k], float), ((0, 0), (0, w - np.shape(p[k])[1])),
                                            constant_values=np.nan) for p in parts])
        else:
            out[k] = np.concatenate([np.atleast_1d(p[k]) for p in parts])
    return out


def concat_plans(parts: list[PlanArrays]) -> PlanArrays:
    """Rows of several PlanArrays; ``stage_layers`` (uneven splits) is padded: NaN rows stay even splits,
    stages past a plan's depth hold 0 layers."""
    if len(parts) == 1:
        return parts[0]
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in PlanArrays.__dataclass_fields__
            if f != "stage_layers"}
    if all(p.stage_layers is None for p in parts):
        return PlanArrays(**cols, stage_layers=None)
    width = max(p.stage_layers.shape[1] for p in parts if p.stage_layers is not None)
    blocks = []
    for p in parts:
        if p.stage_layers is None:
            blocks.append(np.full((len(p), width), np.nan))
            continue
        sl = p.stage_layers
        pad = np.where(np.isnan(sl[:, :1]), np.nan, 0.0) * np.ones((1, width - sl.shape[1]))
        blocks.append(np.concatenate([sl, pad], axis=1))
    return PlanArrays(**cols, stage_layers=np.concatenate(blocks))
