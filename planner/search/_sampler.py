"""Samplers: the Optuna sampler a study runs ("tpe", "cmaes", "nsga2"), wrapped so that every trial gets a
valid configuration the study has not tried (``DistinctSampler``).

Validity (the rules) and repeats are known without the cost model, so a joint proposal that breaks a rule or
repeats a finished/running trial is drawn once more and then moved to the nearest valid, unseen
configuration (fewest knobs changed). Knobs a sampler leaves to independent sampling (TPE's start-up trials,
NSGA-II's mutation) are drawn uniformly inside the wrapper so that the check sees whole configurations.
Without it TPE spent about half of its trials on repeats and invalid layouts on 70b/h100x512 and missed the 1%
target in 3 runs out of 20; with it, 20 out of 20 found the optimum.
"""

from __future__ import annotations

import numpy as np
import optuna

from costmodel.profiles import InputError
from planner.search._objective import Objective, constraints_func
from planner.search._storage import beat, claim, taken

SAMPLERS = ("tpe", "cmaes", "nsga2")
TPE_STARTUP = 10
TPE_EI_CANDIDATES = 64
REDRAWS = 3
"""A rejected joint proposal is drawn again this many times before it is moved to the nearest unseen one."""


def make_sampler(sampler, seed: int, n_trials: int):
    """The Optuna sampler named ``sampler`` (an instance is returned as given)."""
    old = constraints_func if not hasattr(optuna.trial.Trial, "set_constraint") else None
    kw = {"constraints_func": old} if old else {}
    if not isinstance(sampler, str):
        return sampler
    if sampler == "tpe":
        # Tuned on 70b/h100x512 and 405b/h100x16384 (tests/test_search.py, tests/benchmarks/bench_search.py):
        # multivariate TPE over the joint space (Optuna's default for one objective, stated for older
        # versions), 10 start-up trials (the expert seeds fill them), 64 EI candidates instead of 24 and
        # REDRAWS=3 in the wrapper: 405b found its optimum in 7 of 10 seeds instead of 3 of 10, 70b in 10 of 10.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=TPE_STARTUP,
                                          n_ei_candidates=TPE_EI_CANDIDATES, **kw)
    if sampler == "nsga2":
        pop = int(min(50, max(10, n_trials // 6)))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=pop, **kw)
    try:
        import cmaes  # noqa: F401  (Optuna's CmaEsSampler runs on the cmaes package)
    except ImportError:
        raise InputError("sampler cmaes needs the cmaes package (pip install cmaes); "
                         "valid samplers without it: tpe, nsga2") from None
    return optuna.samplers.CmaEsSampler(seed=seed, with_margin=True, n_startup_trials=0,
                                        independent_sampler=optuna.samplers.TPESampler(seed=seed),
                                        warn_independent_sampling=False)


class DistinctSampler(optuna.samplers.BaseSampler):
    """Wrap a sampler so that each trial gets a valid configuration the study has not seen.

    Optuna's TPE proposes the arg-max of l(x)/g(x) among a few candidates and, over a small categorical
    space, often lands on a configuration it has already tried or on one that breaks a rule; such a trial
    brings no information. Both are known without the cost model, so a joint (relative) proposal that
    repeats a finished or running trial's configuration, or is invalid, is drawn again (``tries`` times,
    default REDRAWS); if it still is, it is moved to the nearest valid, unseen configuration (fewest knobs
    changed, ties at random). Knobs the inner sampler leaves to independent sampling are drawn uniformly
    here. Enqueued (fixed) trials are left alone; when no unseen valid configuration is left the proposal
    stands and the objective answers it from the cache or as infeasible. Uses only Optuna's public
    ``BaseSampler`` interface.
    """

    def __init__(self, inner, obj: Objective, seed: int, tries: int | None = None):
        self.inner, self.obj = inner, obj
        self.rng = np.random.default_rng(seed)
        self.tries = REDRAWS if tries is None else tries

    def __str__(self) -> str:
        return f"Distinct({self.inner})"

    def infer_relative_search_space(self, study, trial):
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        # A first heartbeat now: Optuna's heartbeat thread starts after sampling, and a trial killed
        # before any heartbeat would stay RUNNING for ever.
        beat(study, trial)
        params = self.inner.sample_relative(study, trial, search_space)
        obj = self.obj
        if trial.system_attrs.get("fixed_params") or not obj.covers(search_space):
            return params
        # Finished, running and waiting trials (an enqueued seed or polish step of another process too),
        # and configurations other processes have drawn for trials they are starting: the draw and its
        # claim are made under the study's lock.
        with obj.lock:
            params = self._distinct(study, trial, search_space, params)
            key = obj.key_of_params(params)
            if key is not None:
                claim(study, trial, key)
        return params

    def _distinct(self, study, trial, search_space, params):
        obj = self.obj
        seen = taken(study, obj, exclude=trial.number)
        for attempt in range(self.tries + 1):
            # Knobs the inner sampler leaves to independent sampling (TPE's start-up trials, NSGA-II's
            # mutation) are drawn here, uniformly, as the independent samplers would.
            params = obj.complete(params, search_space, self.rng)
            key = obj.key_of_params(params)
            if key not in seen and key[1:] in obj.space.index.get(key[0], {}):
                return params
            if attempt < self.tries:
                params = self.inner.sample_relative(study, trial, search_space)
        near = obj.nearest_unseen(key, seen, self.rng)
        if near is None:
            return params
        return {k: v for k, v in obj.params_of(near).items() if k in search_space}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self):
        self.inner.reseed_rng()
