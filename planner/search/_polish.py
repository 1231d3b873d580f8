"""The polish sweep: hill-climbing one knob at a time from the best plans an Optuna study has found.

TPE samples each knob from a density over the good trials; near the optimum it settles on values that are
good together (vpp 6 with no recompute, vpp 7 with selective) and can miss the one combination of them that is
best. A sweep along the knobs from the incumbent finds it in a few trials (its share of the budget:
``_budget.POLISH_FRACTION``).
"""

from __future__ import annotations

import optuna

from planner.search._keys import cfg_of_key
from planner.search._objective import Objective, overflow, raw_values
from planner.search._storage import OWNER_ATTR, n_complete, owner, taken
from planner.search._trials import optimize, remaining, shifted

FAMILY_SLACK = 1.5
"""The sweep climbs from the best plan of another ZeRO stage when it is at most this much slower than the best
found (a sweep of its knobs may bring it that far; 175B on 1,024 A100: FSDP tp8 at 1.20x the best pipelined plan,
tp4 beats it)."""


def moves(a: tuple[int, ...], b: tuple[int, ...]) -> set[tuple[int, int]]:
    """(key position, direction) of every knob that differs between two configuration keys."""
    return {(i, 1 if y > x else -1) for i, (x, y) in enumerate(zip(a, b)) if x != y}


def climb_starts(obj: Objective) -> list[tuple[int, ...]]:
    """Plans to climb from, in order: the best plan; the best that fits of each ZeRO stage when within
    FAMILY_SLACK of it (Megatron-FSDP plans, pp 1, lie several knobs away from pipelined ones, out of reach of
    single steps); plans that beat the best but overflow memory (a step in recompute or micro-batch may bring
    them in); then every plan by its objective x (1 + memory overflow)."""
    ranking = obj.ranked_keys()
    if not ranking:
        return []
    raw = {k: raw_values(obj.cache[k], obj.rank_by)[obj.objectives[0]] for k in ranking}
    best_raw = raw[ranking[0]]
    first: dict[int, tuple[int, ...]] = {}
    for k in ranking:
        if overflow(obj.cache[k]) <= 0:
            first.setdefault(k[-1], k)   # k[-1]: the ZeRO stage
    family_best = [k for k in first.values() if raw[k] <= FAMILY_SLACK * best_raw]
    penalised = obj.ranked_keys(penalised=True)
    over = [k for k in penalised if overflow(obj.cache[k]) > 0 and raw[k] < best_raw]
    return list(dict.fromkeys(ranking[:1] + family_best + over + penalised))


def _next_batch(study, obj: Objective) -> tuple[tuple[int, ...] | None, list[tuple[int, ...]]]:
    """The first plan of ``climb_starts`` with unseen valid neighbours (one knob one step away; once those are
    spent, a rule-breaking step repaired by a second knob), and those neighbours."""
    seen = set(obj.cache) | taken(study, obj)
    for key in climb_starts(obj):
        batch = [k for k in obj.neighbours(key) if k not in seen]
        batch = batch or list(dict.fromkeys(k for k in obj.neighbours(key, repair=True) if k not in seen))
        if batch:
            return key, batch
    return None, []


def polish(study, obj: Objective, budget: int, deadline, progress, target: int | None = None) -> tuple[int, bool]:
    """Hill-climb from the plans found, one trial at a time. The first plan of ``climb_starts`` with an
    unseen valid neighbour (``KnobCodec.neighbours``: one knob one step away; once those are spent, a
    rule-breaking step repaired by a second knob) has its neighbours tried; the first that beats the best
    becomes the new start, and its neighbours along the move that won are tried first (vpp 4 -> 5 -> 6 ...).
    Stops when ``budget`` trials are spent or no plan has an unseen neighbour. Returns (trials finished,
    interrupted)."""
    done, favoured = 0, set()
    obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))

    def reached() -> bool:
        return target is not None and n_complete(study) >= target

    while done < budget and remaining(deadline) != 0.0 and not reached():
        start, batch = _next_batch(study, obj)
        if not batch:
            break
        batch.sort(key=lambda k: not (moves(start, k) & favoured))
        top = obj.best_key()
        for k in batch[: budget - done]:
            with obj.lock:
                # Another process of the study may have tried, be trying or have enqueued this step.
                obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
                if k in obj.cache or k in taken(study, obj):
                    continue
                study.enqueue_trial(obj.params_of({"nodes": k[0], **cfg_of_key(k[1:])}),
                                    user_attrs={OWNER_ATTR: owner()})
            finished, interrupted = optimize(study, obj, 1, remaining(deadline),
                                             shifted(progress, done, budget), target=target, run_first=True)
            done += finished
            if interrupted or not finished:
                return done, interrupted
            obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            if obj.best_key() != top:   # a new best: climb on from it
                favoured = moves(start, k)
                break
            if reached():
                break
    return done, False
