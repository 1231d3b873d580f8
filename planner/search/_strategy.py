"""Search strategies behind one signature, and the choice between them.

Every strategy is a function ``search(model, cluster, global_batch, *, cost=default_cost, rank_by="p50",
plans=None, **options) -> SearchResult``: ``exhaustive`` scores every valid plan in one vectorised call,
``optuna_search`` samples them (``_optuna``); the routed search (``planner.routing.routed_search``) is
``exhaustive`` over the expert space with a routed cost function, and the heterogeneous search
(``planner.hetero``) runs ``exhaustive`` on each device group with the same cost function before it adds
mixed layouts (its result, ``HeteroResult``, is its own). ``choose_strategy`` picks exhaustive or Optuna for a
request and builds the valid plans at most once: the space it counts to decide is the space the chosen
strategy searches.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from costmodel.plan import PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.trust import with_intervals
from planner.search._results import CostFn, SearchResult, default_cost, ranked
from planner.space import valid_plans

EXHAUSTIVE_LIMIT = 50_000
"""Up to this many valid layouts, a plain search scores them all instead of sampling: the vectorised cost model
scores a few thousand layouts in well under a second, faster than sampling and exactly."""


def exhaustive(model: ModelSpec, cluster: ClusterSpec, global_batch: int, cost: CostFn = default_cost,
               rank_by: str = "p50", plans: PlanArrays | None = None, **space_kw) -> SearchResult:
    """Score every valid plan in one vectorised call (``space_kw``: ``planner.space.candidate_columns``
    keywords that narrow the space, e.g. zero_stages=(1,); ``plans``: the plans to score when the caller has
    built them, instead of ``planner.space.valid_plans``); the scores gain the P10/P90 step times and the
    support of every plan (``costmodel.trust.with_intervals``), and ``rank_by`` says which time ranks them."""
    if plans is None:
        plans = valid_plans(model, cluster, global_batch, **space_kw)
    elif space_kw:
        raise TypeError(f"exhaustive: plans given, so the space keywords {sorted(space_kw)} would be ignored")
    if len(plans) == 0:
        return SearchResult(plans, {}, np.zeros(0, dtype=int), 0)
    return ranked(plans, with_intervals(model, cluster, plans, cost(model, cluster, plans)), rank_by)


@dataclass(frozen=True)
class Strategy:
    """The search chosen for a request: its name and the strategy function, with the space it has already
    built bound in. Call ``search(model, cluster, global_batch, **options)`` with the request it was chosen
    for."""

    name: str                              # "exhaustive" or "optuna"
    search: Callable[..., SearchResult]
    n_valid: int | None = None             # valid layouts counted to choose (None: not counted)


def choose_strategy(model: ModelSpec, cluster: ClusterSpec, global_batch: int, *, exhaustive_only: bool = False,
                    sample: bool = False, limit: int = EXHAUSTIVE_LIMIT, space_kw: dict | None = None) -> Strategy:
    """Exhaustive when asked for (``exhaustive_only``) or when not asked to sample and the space has at most
    ``limit`` valid layouts; else Optuna (``sample``: the request needs a study, e.g. a sampler, a storage, a
    trial count or several objectives). The valid plans are built once, only when they must be counted,
    and handed to the strategy. ``space_kw``: ``planner.space.candidate_columns`` keywords that narrow the
    space (e.g. optimizer_offload=1), for either strategy."""
    plans = None
    space_kw = dict(space_kw or {})
    if exhaustive_only or not sample:
        plans = valid_plans(model, cluster, global_batch, **space_kw)
        if exhaustive_only or len(plans) <= limit:
            return Strategy("exhaustive", partial(exhaustive, plans=plans), len(plans))
    from planner.search._optuna import optuna_search   # (imports Optuna: only when it is chosen)

    search = partial(optuna_search, space_kw=space_kw or None)
    if plans is None:
        return Strategy("optuna", search)
    return Strategy("optuna", partial(search, plans=plans), len(plans))
