"""Opening an Optuna study for a search: its space, objective and sampler, the storage and lock, the check
that a resumed study was made for the same search, and the expert seeds enqueued once per study.

The knob lists never change between trials of a study; they are stored in the study's user attributes
(``planner_space``) and a resumed study with other lists is refused. CMA-ES studies use their own parameter
names (the "index" encoding), so a study is resumed with the same encoding (the default study name carries
it). The expert seeds (``_seeds``) are enqueued before sampling, at most a quarter of the trials; they count as
trials and as TPE's start-up trials.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import optuna

from costmodel.plan import PlanArrays
from costmodel.profiles import InputError
from planner.search._budget import default_budget
from planner.search._keys import SearchSpace, search_space
from planner.search._objective import Objective
from planner.search._sampler import DistinctSampler, make_sampler
from planner.search._seeds import expert_seeds
from planner.search._storage import OWNER_ATTR, StudyLock, fail_unsampled_dead_trials, locked_pop, open_storage, owner


@dataclass
class OpenStudy:
    """What ``open_study`` returns: the space, and (None when no plan is valid) the study and its objective."""

    space: SearchSpace
    study: object = None          # optuna.Study
    obj: Objective | None = None
    study_name: str | None = None
    n_trials: int = 0             # finished trials the study should have


def quiet_optuna_warnings() -> None:
    """Warnings Optuna gives for what the planner does on purpose (heartbeats are experimental; CMA-ES
    ignores the constraints, which are still recorded for best_trial and the Pareto front)."""
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler")


def default_study_name(space: SearchSpace, objectives, encoding: str) -> str:
    enc = "" if encoding == "categorical" else f"-{encoding}"
    off = (space.space_kw or {}).get("optimizer_offload")
    return (f"plan-{space.model.name}-{space.cluster.name}-gb{space.global_batch}-"
            f"{'+'.join(objectives)}{enc}{f'-optim-cpu{off:g}' if off else ''}")


def open_study(model, cluster, global_batch, objectives, sampler, storage, study_name, seed, n_trials, cost,
               enqueue: bool = True, rank_by: str = "p50", plans: PlanArrays | None = None,
               space_kw: dict | None = None) -> OpenStudy:
    """Create or resume the study of a search (``plans``: the cluster's valid plans, when already built;
    ``space_kw``: ``planner.space.candidate_columns`` keywords that narrow the space, part of the study's
    signature)."""
    space = search_space(model, cluster, global_batch, vary_nodes="gpus" in objectives, plans=plans,
                         space_kw=space_kw)
    if space.n_valid == 0:
        return OpenStudy(space)
    encoding = "index" if (sampler == "cmaes" or isinstance(sampler, optuna.samplers.CmaEsSampler)) else "categorical"
    n_trials = default_budget(space.n_valid) if n_trials is None else int(n_trials)
    obj = Objective(space, cost, objectives, encoding, penalise=encoding == "index", rank_by=rank_by)
    seeds = expert_seeds(space)
    smp = make_sampler(sampler, seed, n_trials)
    if isinstance(sampler, str):
        smp = DistinctSampler(smp, obj, seed)
    if storage is not None and study_name is None:
        study_name = default_study_name(space, objectives, encoding)
    lock = StudyLock(storage)
    obj.lock = lock
    with lock:
        study = optuna.create_study(storage=open_storage(storage), sampler=smp, study_name=study_name,
                                    directions=["minimize"] * len(objectives), load_if_exists=True)
        locked_pop(study, lock)
        if storage is not None:
            fail_unsampled_dead_trials(study)
        _check_signature(study, space, encoding, objectives, rank_by, storage)
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        obj.remember(done)
        # The seeds are enqueued once per study (the first process to get here), for its first n_trials.
        if enqueue and not study.user_attrs.get("planner_seeded"):
            for cfg in seeds[: max(1, n_trials // 4)]:
                study.enqueue_trial(obj.params_of(cfg), skip_if_exists=True, user_attrs={OWNER_ATTR: owner()})
            study.set_user_attr("planner_seeded", True)
    return OpenStudy(space, study, obj, study_name, n_trials)


def _check_signature(study, space: SearchSpace, encoding: str, objectives, rank_by: str, storage) -> None:
    """Record the search a new study is made for; refuse a resumed study made for another."""
    sig = space.signature(encoding, objectives)
    if rank_by != "p50":  # studies made before --rank-by keep their signature
        sig["rank_by"] = rank_by
    old = study.user_attrs.get("planner_space")
    if old is None:
        study.set_user_attr("planner_space", sig)
    elif old != sig:
        diff = [("knob values" if k == "choices" else f"{k} {old.get(k)} (now {sig[k]})")
                for k in sig if old.get(k) != sig[k]]
        raise InputError(f"study {study.study_name!r} in {storage} was made for another search: "
                         f"{', '.join(diff)} differ; use another --study-name")
