"""The Optuna strategy: ``optuna_search`` samples the layouts of ``planner.space`` instead of scoring them all,
and returns the distinct plans its study scored as an ``OptunaResult``.

A study runs in phases: the sampler's trials (expert seeds first), the polish sweep (``_polish``, a share of
the budget for one objective), then the sampler's again for any of it left over. With ``workers=N`` the
seeds run here, the sampled trials in N processes sharing the RDB storage (``_workers``), and the polish here
last, over every worker's trials. ``n_trials`` is the number of finished trials the study should have: each
process stops once the study has them, and a resumed study runs only the rest. Several processes may share
one RDB study (SQLite or PostgreSQL) the same way: the same ``plan`` command with the same ``--storage`` and
``--study-name`` in several shells.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import numpy as np
import optuna

from costmodel.plan import PlanArrays
from costmodel.profiles import InputError
from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.trust import with_intervals
from planner.search._budget import polish_budget
from planner.search._keys import SearchSpace, key_of
from planner.search._objective import Objective
from planner.search._polish import polish
from planner.search._ranking import OBJECTIVES, pareto_order, rank_time
from planner.search._results import CostFn, OptunaResult, concat_plans, concat_scores, default_cost, take_rows
from planner.search._sampler import SAMPLERS
from planner.search._storage import n_complete
from planner.search._study import open_study, quiet_optuna_warnings
from planner.search._trials import drain, on_stop_signals, optimize, raise_interrupt, remaining, shifted
from planner.search._workers import run_workers


def check_args(objectives, sampler) -> tuple[tuple[str, ...], str]:
    """Objectives as a tuple and the sampler's name (None / "auto": tpe for one objective, else nsga2), or a
    one-line InputError."""
    if isinstance(objectives, str):
        objectives = tuple(o.strip() for o in objectives.split(",") if o.strip())
    objectives = tuple(objectives)
    bad = [o for o in objectives if o not in OBJECTIVES]
    if not objectives or bad or len(set(objectives)) != len(objectives):
        raise InputError(f"objectives {','.join(objectives) or '(none)'}: valid objectives are "
                         f"{', '.join(OBJECTIVES)}, each at most once (e.g. time or time,memory)")
    if sampler in (None, "auto"):
        sampler = "tpe" if len(objectives) == 1 else "nsga2"
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise InputError(f"sampler {sampler!r}: valid samplers are {', '.join(SAMPLERS)}")
        if sampler == "cmaes" and len(objectives) > 1:
            raise InputError(f"sampler cmaes is single-objective but objectives are {','.join(objectives)}; "
                             f"use nsga2 or tpe")
    return objectives, sampler


def _check_workers(workers: int, storage) -> int:
    workers = int(workers)
    if workers < 1:
        raise InputError(f"workers={workers}: valid workers are 1 or more")
    if workers > 1 and not (isinstance(storage, str) and "://" in storage and storage != "sqlite://"
                            and ":memory:" not in storage):
        raise InputError(f"workers={workers} needs a shared RDB storage such as sqlite:///plan.db "
                         f"(got storage={storage!r})")
    return workers


def optuna_search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, *, cost: CostFn = default_cost,
                  sampler: str | None = None, n_trials: int | None = None,
                  objectives: tuple[str, ...] | str = ("time",), storage: str | None = None,
                  study_name: str | None = None, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None, timeout_s: float | None = None,
                  workers: int = 1, rank_by: str = "p50", plans: PlanArrays | None = None,
                  space_kw: dict | None = None) -> OptunaResult:
    """Search the layouts of ``planner.space`` with Optuna instead of scoring them all.

    sampler: "tpe", "cmaes" (single objective) or "nsga2"; None picks tpe for one objective, nsga2 for
      several (an ``optuna.samplers.BaseSampler`` instance is used as given).
    n_trials: finished trials the study should have (default ``default_budget``: 10% of the valid plans, at
      least 50); a resumed study keeps its finished trials and runs only the rest, and processes sharing a
      study each stop once it has n_trials. Expert seeds (``expert_seeds``) are enqueued once per study and
      count as trials.
    objectives: any of "time" (step time), "memory" (peak memory), "gpus" (GPU count; the node count is then
      sampled over powers of two up to the cluster's nodes), minimised; several give a Pareto front.
    storage: None (in memory), an RDB URL such as "sqlite:///plan.db", or an Optuna storage. With a storage,
      ``study_name`` (default: derived from model, cluster, batch, objectives) is created or resumed.
    progress: called as progress(finished_trials, n_trials) after each trial (in-process runs; with
      workers > 1 the parent polls the storage and reports the study's new trials).
    timeout_s: stop starting new trials after this many seconds.
    workers: processes sharing the RDB storage (each runs its share of n_trials with seed + its index, and
      ends with this process); only with a storage URL. ``cost`` must then be picklable (a module-level
      function).
    rank_by: "p50" ranks by the predicted step time, "p90" by its P90 (costmodel/trust.py): the "time"
      objective the samplers minimise and the order of the result.
    plans: the valid plans of ``cluster`` when the caller has built them (``choose_strategy``).
    space_kw: ``planner.space.candidate_columns`` keywords that narrow the space (optimizer_offload=F: only
      layouts with that share of the optimizer state in host memory); part of the study's signature and
      default name, so a stored study of another space is not resumed by mistake.

    KeyboardInterrupt, SIGINT or SIGTERM ends the search early: the trial in flight finishes, finished trials
    are kept (in the storage too) and the result, best so far, has ``interrupted=True``.
    """
    objectives, sampler_name = check_args(objectives, sampler)
    rank_time({"step_time_s": []}, rank_by)  # one-line error on a bad rank_by
    workers = _check_workers(workers, storage)
    # Optuna logs every trial (INFO) and a trial stopped by Ctrl-C with its traceback (WARNING); the result
    # reports both (n_trials, interrupted), and an objective's own errors are raised, not logged.
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            quiet_optuna_warnings()
            opened = open_study(model, cluster, global_batch, objectives, sampler_name, storage, study_name, seed,
                                n_trials, cost, rank_by=rank_by, plans=plans, space_kw=space_kw)
            name = sampler_name if isinstance(sampler_name, str) else type(sampler_name).__name__
            if opened.study is None:
                empty = PlanArrays.from_columns(0, global_batch=global_batch)
                return OptunaResult(empty, {}, np.zeros(0, dtype=int), 0, objectives=objectives,
                                    pareto=np.zeros(0, dtype=int), nodes=np.zeros(0, dtype=int), sampler=name)
            study, obj = opened.study, opened.obj
            base = n_complete(study)
            need = max(0, opened.n_trials - base)   # n_trials finished trials in the study: a resumed one runs the rest
            finished, interrupted = 0, False
            try:
                with on_stop_signals(raise_interrupt):   # SIGTERM like Ctrl-C, between trials too
                    if workers == 1:
                        finished, interrupted = run_phases(study, obj, need, timeout_s, progress, base=base)
                    else:
                        finished, interrupted = _run_shared(
                            study, obj, need, base, timeout_s, progress, workers,
                            dict(model=model, cluster=cluster, global_batch=global_batch, cost=cost,
                                 sampler=sampler_name, objectives=objectives, storage=storage,
                                 study_name=opened.study_name, seed=seed, rank_by=rank_by, space_kw=space_kw))
                    if not interrupted:
                        more, interrupted = drain(study, obj, timeout_s)
                        finished += more
            except KeyboardInterrupt:
                interrupted = True
                finished = max(finished, min(need, n_complete(study) - base))
            finally:
                obj.lock.close()
            return study_result(opened.space, study, cost, objectives, name, finished, obj.evaluations, interrupted,
                                opened.study_name, storage, rank_by)
    finally:
        optuna.logging.set_verbosity(level)


def run_phases(study, obj: Objective, n_trials: int, timeout_s, progress, base: int | None = None) -> tuple[int, bool]:
    """``n_trials`` new trials in this process: the sampler's, then the polish sweep (``polish_budget`` of
    them), then the sampler's again for any of the polish budget left over. Each phase also ends once the
    study (other processes included) has ``base`` (default: its finished trials now) plus that phase's share
    of ``n_trials`` finished trials. Returns (trials finished here, interrupted)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    base = n_complete(study) if base is None else base
    n_polish = polish_budget(n_trials, obj.objectives)
    finished, interrupted = optimize(study, obj, n_trials - n_polish, timeout_s, shifted(progress, 0, n_trials),
                                     target=base + n_trials - n_polish)
    if interrupted or remaining(deadline) == 0.0:
        return finished, interrupted
    more, interrupted = polish(study, obj, n_polish, deadline, shifted(progress, finished, n_trials),
                               target=base + n_trials)
    finished += more
    if not interrupted and finished < n_trials and remaining(deadline) != 0.0:
        more, interrupted = optimize(study, obj, n_trials - finished, remaining(deadline),
                                     shifted(progress, finished, n_trials), target=base + n_trials)
        finished += more
    return finished, interrupted


def _run_shared(study, obj: Objective, need: int, base: int, timeout_s, progress, workers: int,
                search: dict) -> tuple[int, bool]:
    """``need`` new trials with worker processes: the enqueued seeds run here first, so that the workers never
    race for waiting trials; the sampled trials in the workers; the polish sweep here last, over every
    worker's trials. ``search``: the keywords the workers open the study with."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    n_sampled = need - polish_budget(need, obj.objectives)
    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    finished, interrupted = optimize(study, obj, min(waiting, n_sampled), timeout_s, progress,
                                     target=base + n_sampled)
    if not interrupted and n_complete(study) < base + n_sampled:
        more, interrupted, ev = run_workers(
            study, search["model"], search["cluster"], search["global_batch"], search["cost"], search["sampler"],
            n_sampled - finished, search["objectives"], search["storage"], search["study_name"], search["seed"],
            shifted(progress, finished, need), timeout_s, workers, target=base + n_sampled,
            rank_by=search["rank_by"], space_kw=search.get("space_kw"))
        finished, obj.evaluations = finished + more, obj.evaluations + ev
    if not interrupted and n_complete(study) < base + need:
        more, interrupted = polish(study, obj, need - finished, deadline, shifted(progress, finished, need),
                                   target=base + need)
        finished += more
    return finished, interrupted


def study_result(space: SearchSpace, study, cost, objectives, sampler_name, n_trials, evaluations, interrupted,
                 study_name, storage, rank_by: str = "p50") -> OptunaResult:
    """The distinct valid plans the study scored, re-scored together and ordered (``pareto_order``)."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    by_nodes: dict[int, list[int]] = {}
    seen = set()
    for t in trials:
        ev = t.user_attrs.get("eval")
        if not ev or not ev.get("valid"):
            continue
        k = key_of(ev["config"])
        if k in seen:
            continue
        seen.add(k)
        i = space.index.get(k[0], {}).get(k[1:])
        if i is not None:
            by_nodes.setdefault(k[0], []).append(i)
    parts, plan_parts, node_col = [], [], []
    for nodes in sorted(by_nodes):
        sub = take_rows(space.valid[nodes], sorted(by_nodes[nodes]))
        plan_parts.append(sub)
        cl = space.cluster_for(nodes)
        parts.append(with_intervals(space.model, cl, sub, cost(space.model, cl, sub)))
        node_col.append(np.full(len(sub), nodes))
    common = dict(study=study, objectives=objectives, n_trials=n_trials, total_trials=len(trials),
                  evaluations=evaluations, interrupted=interrupted, sampler=sampler_name, study_name=study_name,
                  storage=storage if isinstance(storage, str) or storage is None else repr(storage))
    if not parts:
        empty = PlanArrays.from_columns(0, global_batch=space.global_batch)
        return OptunaResult(empty, {}, np.zeros(0, dtype=int), 0, pareto=np.zeros(0, dtype=int),
                            nodes=np.zeros(0, dtype=int), **common)
    plans = concat_plans(plan_parts)
    scores = concat_scores(parts)
    order, front = pareto_order(scores, plans, objectives, rank_by)
    return OptunaResult(plans, scores, order, len(plans), pareto=front, nodes=np.concatenate(node_col),
                        rank_by=rank_by, **common)
