"""Finding the fastest plan that fits: search the layouts of ``planner.space`` with an injected cost function.

This module is the package's public face; everything it names lives in a private module behind it (as
``optuna.study`` does), and nothing outside the package but its tests imports those modules.

Strategies (one signature: ``search(model, cluster, global_batch, *, cost=default_cost, rank_by="p50",
plans=None, ...)`` returning a ``SearchResult``):

* ``exhaustive``: score every valid plan in one vectorised call.
* ``optuna_search``: sample them with Optuna (TPE, CMA-ES, NSGA-II; resumable, shareable RDB studies,
  worker processes); returns an ``OptunaResult``, a ``SearchResult`` with the study and the Pareto front.
* ``choose_strategy``: which of the two a request gets (``EXHAUSTIVE_LIMIT``), with the valid plans built once.

Cost functions (``CostFn``: ``cost(model, cluster, plans) -> score columns``; ``default_cost`` is
``costmodel.estimate.estimate_arrays``) are passed in: the planner never imports the executor. Results
(``SearchResult``, ``ranked``, ``rank_time``, ``RANK_BY``, ``to_plan``, ``plan_at``, ``pareto_front``),
the Optuna study's space and seeds (``SearchSpace``, ``search_space``, ``OPTUNA_KNOBS``, ``expert_seeds``,
``default_budget``, ``polish_budget``), ``explain_no_fit`` (why nothing fits) and ``offload_alternative`` (what
fits with the optimizer state in host memory) complete the API.

Private modules: ``_results`` (CostFn, result types), ``_ranking`` (orders, Pareto fronts), ``_strategy``
(exhaustive, the choice), ``_keys`` (knob keys, the study's space, trial parameters), ``_seeds`` (expert
seeds), ``_budget`` (trial budgets), ``_objective``, ``_sampler`` (the distinct-proposal wrapper), ``_trials``
(the optimize loop, stop signals), ``_polish`` (the hill-climbing sweep), ``_storage`` (RDB storage,
heartbeats, locks, dead trials), ``_study`` (opening a study), ``_workers`` (worker processes), ``_optuna``
(``optuna_search``), ``_messages`` (no-fit messages). Optuna is imported only when an Optuna search is asked
for: ``optuna_search`` and ``SAMPLERS`` load on first use.
"""

from __future__ import annotations

import importlib

from planner.search._budget import POLISH_FRACTION, default_budget, polish_budget
from planner.search._keys import OPTUNA_KNOBS, SearchSpace, search_space
from planner.search._messages import explain_no_fit, offload_alternative
from planner.search._ranking import OBJECTIVES, RANK_BY, pareto_front, rank_time
from planner.search._results import CostFn, OptunaResult, SearchResult, default_cost, plan_at, ranked, to_plan
from planner.search._seeds import expert_seeds
from planner.search._strategy import EXHAUSTIVE_LIMIT, Strategy, choose_strategy, exhaustive

_LAZY = {"optuna_search": "planner.search._optuna", "SAMPLERS": "planner.search._sampler"}
"""Public names whose modules import Optuna, loaded on first access (``import planner.search`` stays fast)."""

__all__ = ["CostFn", "EXHAUSTIVE_LIMIT", "OBJECTIVES", "OPTUNA_KNOBS", "OptunaResult", "POLISH_FRACTION", "RANK_BY",
           "SAMPLERS", "SearchResult", "SearchSpace", "Strategy", "choose_strategy", "default_budget", "default_cost",
           "exhaustive", "expert_seeds", "explain_no_fit", "offload_alternative", "optuna_search", "pareto_front", "plan_at",
           "polish_budget", "rank_time", "ranked", "search_space", "to_plan"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
