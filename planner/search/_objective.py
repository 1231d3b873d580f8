"""The Optuna objective: score a trial's configuration with the injected cost function (once per
configuration the study has seen), and turn the score into objective values and constraints.

Invalid combinations that still reach the objective (enqueued by hand, a sampler instance passed in, or an
exhausted space) are never scored by the cost model. The trial completes with a penalty value and a violated
constraint ``rules`` = RULE_WEIGHT x the number of broken rules (so any valid plan, even one far over memory,
ranks before an invalid one). Pruning them (``optuna.TrialPruned``) was not chosen: NSGA-II and CMA-ES leave
pruned trials out of their populations, so they would never learn where the invalid region is, while a
completed infeasible trial is ranked by constrained domination (NSGA-II) and put in TPE's "above" group by
its violation; every sampler sees the same, complete history.

A valid plan that does not fit is scored and kept; its constraint ``memory`` is peak_memory / capacity - 1
(> 0 = infeasible). Constraints are set with ``Trial.set_constraint`` (Optuna >= 5, where
``constraints_func`` is deprecated; the samplers read ``FrozenTrial.constraints`` either way); on older Optuna
the same values go through ``constraints_func``. CMA-ES has no constraints: with the "index" encoding the
objective is penalised instead, a plan over memory scoring PENALTY * (1 + overflow), above every plan that
fits.

A configuration already scored in the study (Optuna's samplers do propose duplicates) is answered from the
study's own record of it (trial user attribute ``eval``), not re-scored; a resumed study fills the cache from
its finished trials.
"""

from __future__ import annotations

import warnings

import numpy as np
import optuna

from costmodel.rules import violations
from costmodel.plan import ParallelPlan, data_parallel
from costmodel.trust import with_intervals
from planner.search._keys import OPTUNA_KNOBS, KnobCodec, SearchSpace
from planner.search._results import CostFn, take_rows
from planner.search._storage import StudyLock

PENALTY = {"time": 1.0e4, "memory": 1.0e15, "gpus": 1.0e7}
"""Objective values of plans that break a rule, and the scale of the memory penalty used with CMA-ES."""
RULE_WEIGHT = 1000.0


def raw_values(ev: dict, rank_by: str = "p50") -> dict[str, float]:
    """Every objective's value of a valid evaluation, unpenalised ("time": its P50 or P90 step time)."""
    t = ev.get("step_time_p90_s", ev["step_time_s"]) if rank_by == "p90" else ev["step_time_s"]
    return {"time": t, "memory": ev["peak_memory_bytes"], "gpus": float(ev["config"]["num_gpus"])}


def overflow(ev: dict) -> float:
    """How far a valid evaluation's peak memory exceeds the capacity (negative: headroom), as a fraction."""
    return ev["peak_memory_bytes"] / ev["memory_capacity_bytes"] - 1.0


class Objective(KnobCodec):
    """Optuna objective over a SearchSpace; caches every configuration the study has seen."""

    def __init__(self, space: SearchSpace, cost: CostFn, objectives: tuple[str, ...], encoding: str,
                 penalise: bool, rank_by: str = "p50"):
        super().__init__(space, encoding)
        self.cost, self.objectives, self.rank_by = cost, objectives, rank_by
        self.penalise = penalise
        self.cache: dict[tuple[int, ...], dict] = {}
        self.evaluations = 0
        self.new_api = hasattr(optuna.trial.Trial, "set_constraint")
        self.lock = StudyLock(None)   # the study's lock once the study is opened (_study.open_study)

    def _rank(self, ev: dict, penalised: bool) -> tuple:
        """Sort key of a valid evaluation for ``ranked_keys``."""
        raw, over = raw_values(ev, self.rank_by)[self.objectives[0]], overflow(ev)
        if penalised:
            return (raw * (1.0 + max(0.0, over)),)
        return (0, raw) if over <= 0 else (1, over)

    def ranked_keys(self, penalised: bool = False) -> list[tuple[int, ...]]:
        """Keys of the valid configurations evaluated so far, best first: plans that fit by the first
        objective, then plans that do not by how far they overflow memory; with ``penalised``, all of them
        by the first objective times (1 + overflow), so that a fast plan just over the memory comes early."""
        rows = [(self._rank(ev, penalised), key) for key, ev in self.cache.items() if ev.get("valid")]
        rows.sort()
        return [k for _, k in rows]

    def best_key(self) -> tuple[int, ...] | None:
        """``ranked_keys()[0]`` without sorting them all (None before any valid evaluation)."""
        rows = [(self._rank(ev, False), key) for key, ev in self.cache.items() if ev.get("valid")]
        return min(rows)[1] if rows else None

    def remember(self, trials) -> None:
        """Fill the cache from finished trials (a resumed study, or other workers)."""
        for t in trials:
            ev = t.user_attrs.get("eval")
            if ev and "config" in ev:
                self.cache.setdefault(self.key_of(ev["config"]), {**ev, "scored": False})

    def evaluate(self, cfg: dict) -> dict:
        sp = self.space
        nodes = int(cfg["nodes"])
        n_gpus = nodes * sp.cluster.gpus_per_node
        key = self.key_of(cfg)[1:]
        tp, cp, pp = key[0], key[1], key[2]
        dp = data_parallel(n_gpus, tp, pp, cp)
        config = {**{k: cfg[k] for k in OPTUNA_KNOBS}, "dp": dp, "nodes": nodes, "num_gpus": n_gpus}
        i = sp.index.get(nodes, {}).get(key)
        if i is None:
            plan = ParallelPlan(tp=tp, pp=pp, vpp=key[3], dp=dp, cp=cp, ep=key[4], sequence_parallel=tp > 1,
                                micro_batch=key[5], global_batch=sp.global_batch, recompute=cfg["recompute"],
                                zero_stage=key[7], distributed_optimizer=key[7] >= 1)
            msgs = violations(sp.model, plan, n_gpus) or ["outside the planner's candidate space "
                                                          "(planner.space.candidate_columns)"]
            return {"config": config, "valid": False, "violations": msgs, "scored": False}
        one = take_rows(sp.valid[nodes], i)
        out = with_intervals(sp.model, sp.cluster_for(nodes), one, self.cost(sp.model, sp.cluster_for(nodes), one))
        self.evaluations += 1
        peak = float(np.nanmax(out["peak_memory_bytes"][0]))
        capacity = float(out["memory_capacity_bytes"][0])
        return {"config": config, "valid": True, "scored": True, "step_time_s": float(out["step_time_s"][0]),
                "step_time_p90_s": float(out["step_time_p90_s"][0]),
                "peak_memory_bytes": peak, "memory_capacity_bytes": capacity, "fits": bool(out["fits"][0]),
                "mfu": float(out["mfu"][0])}

    def values(self, ev: dict) -> tuple[list[float], dict]:
        if not ev["valid"]:
            n = len(ev["violations"])
            return ([PENALTY[o] * (RULE_WEIGHT + n) for o in self.objectives],
                    {"rules": RULE_WEIGHT * n, "memory": 0.0})
        over, raw = overflow(ev), raw_values(ev, self.rank_by)
        vals = [raw[o] for o in self.objectives]
        if self.penalise and over > 0:
            vals = [PENALTY[o] * (1.0 + over) for o in self.objectives]
        return vals, {"rules": 0.0, "memory": over}

    def __call__(self, trial):
        cfg = self.suggest(trial)
        key = self.key_of(cfg)
        ev = self.cache.get(key)
        if ev is None:
            ev = self.evaluate(cfg)
            self.cache[key] = {**ev, "scored": False}
        vals, cons = self.values(ev)
        trial.set_user_attr("eval", ev)
        if self.new_api:
            with warnings.catch_warnings():
                # A trial retried after its process died (RetryFailedTrialCallback) carries the constraints its first
                # attempt set for the same configuration: the same values, which Optuna keeps, warning.
                warnings.filterwarnings("ignore", message="The constraint value is ignored", category=UserWarning)
                for k, v in cons.items():
                    trial.set_constraint(k, v)
        else:
            trial.set_user_attr("constraints", cons)
        return vals[0] if len(vals) == 1 else vals


def constraints_func(trial) -> tuple[float, float]:
    """Optuna < 5: the constraints the objective recorded (``constraints_func`` API)."""
    c = trial.user_attrs.get("constraints", {})
    return (float(c.get("rules", 0.0)), float(c.get("memory", 0.0)))
