"""The exact pipeline stage split: one dynamic programme over (stage, layers used), for a homogeneous plan
and a heterogeneous one.

Both cases reduce to interval costs ``cost[s, u, v]``: the time of stage s holding the contiguous layers
u..v-1 of one micro-batch, infinite where Megatron's constraints or the stage's memory forbid it (only the
first and the last stage may be empty, every stage holds a multiple of ``multiple_of`` layers, pp = 1 holds
them all). :func:`solve_split` then finds the best split exactly:

* homogeneous (:func:`min_max_split`, :func:`best_split`): every stage runs on the same GPUs, so the
  pipeline's pace is its slowest stage (1F1B: T = m * max(t) + fill) and the split minimises the largest
  stage cost; ties go to the split with the least squared deviation of the stage costs from their mean,
  then to the lexicographically smallest.
* heterogeneous (:func:`optimal_split`, costmodel/hetero.py): each stage has its own costs and capacity, and
  the split minimises the whole 1F1B pipeline time m*max(t) + (sum(t) - max(t))/vpp.

The costs come from the cost model itself: :func:`layer_costs` and :func:`stage_memory_table` read one
plan's per-layer and edge times and every candidate stage's peak memory from ``estimate_arrays`` probes;
:func:`stage_coefficients` reads many plans' per-stage linear costs (a constant, a cost per dense and per
MoE layer) from three probe splits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from costmodel.estimate import estimate_arrays

from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import HardwareProfile, load_profile
from costmodel.specs import ClusterSpec, ModelSpec

StageMemory = Callable[[int, int, int], float]
"""stage_memory(stage_index, first_layer, n_layers) -> peak bytes of that stage."""

_REL_TOL = 1e-9
"""Relative tolerance for ties between stage costs (prefix-sum differences round differently)."""
SPLIT_BATCH = 32
"""Thresholds scored together by the heterogeneous objective's threshold search."""
SPLIT_MAX_ROUNDS = 16
"""Batches of thresholds tried above the min-max one before the split is returned as best found."""


# Interval costs and constraints -------------------------------------------------------------------------


def interval_costs(const, prefix: np.ndarray) -> np.ndarray:
    """cost[s, u, v] = const_s + prefix[s, v] - prefix[s, u] (stage s holding layers u..v-1), inf for v < u.
    ``prefix`` is (pp, L+1) or (L+1,) (the same layer costs on every stage)."""
    prefix = np.asarray(prefix, dtype=float)
    if prefix.ndim == 1:
        prefix = np.broadcast_to(prefix, (len(const), len(prefix)))
    j = np.arange(prefix.shape[1])
    c = np.asarray(const, dtype=float)[:, None, None] + prefix[:, None, :] - prefix[:, :, None]
    return np.where(j[None, None, :] >= j[None, :, None], c, np.inf)


def linear_prefix(b_dense, b_moe, dense_before: np.ndarray) -> np.ndarray:
    """prefix[s, j]: what layers 0..j-1 cost on stage s at ``b_dense`` per dense and ``b_moe`` per MoE layer
    (``dense_before[j]``: dense layers among layers 0..j-1, j = 0..layers)."""
    nd = np.asarray(dense_before)
    j = np.arange(len(nd))
    return np.asarray(b_dense)[:, None] * nd[None, :] + np.asarray(b_moe)[:, None] * (j - nd)[None, :]


def count_ok(pp: int, layers: int, multiple_of: int = 1) -> np.ndarray:
    """Allowed (stage, u, v) by layer count: every stage a multiple of ``multiple_of``, the middle stages at
    least that, the edge stages possibly empty, pp = 1 all layers; the first stage starts at layer 0 and the
    last ends at the last layer."""
    j = np.arange(layers + 1)
    n = j[None, :] - j[:, None]
    m = int(multiple_of)
    step = (n >= 0) & (n % m == 0)
    ok = np.zeros((pp, layers + 1, layers + 1), bool)
    for s in range(pp):
        if pp == 1:
            ok[s] = (n == layers)
        elif s in (0, pp - 1):
            ok[s] = step
        else:
            ok[s] = step & (n >= m)
    ok[0, 1:, :] = False                    # the first stage starts at layer 0
    ok[pp - 1, :, :layers] = False          # the last stage ends at the last layer
    return ok


# The dynamic programme ----------------------------------------------------------------------------------


def _min_max(cost: np.ndarray) -> float:
    """Least achievable largest stage cost (inf when no split is allowed)."""
    pp, L1, _ = cost.shape
    F = np.full(L1, np.inf)
    F[0] = -np.inf
    for s in range(pp):
        F = np.min(np.maximum(F[:, None], cost[s]), axis=0)
    return float(F[-1])


def _min_sum(cost: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Least sum of stage costs with every stage <= threshold, for each threshold. Shape (nT,)."""
    pp, L1, _ = cost.shape
    T = np.asarray(thresholds, dtype=float)[:, None, None]
    F = np.full((len(T), L1), np.inf)
    F[:, 0] = 0.0
    for s in range(pp):
        c = np.where(cost[s][None] <= T, cost[s][None], np.inf)
        F = np.min(F[:, :, None] + c, axis=1)
    return F[:, -1]


def _reconstruct(cost: np.ndarray, threshold: float) -> tuple[int, ...]:
    """A split of least sum of stage costs with every stage <= threshold."""
    pp, L1, _ = cost.shape
    c = np.where(cost <= threshold, cost, np.inf)
    F = np.full((pp + 1, L1), np.inf)
    F[0, 0] = 0.0
    arg = np.zeros((pp, L1), dtype=int)
    for s in range(pp):
        tot = F[s][:, None] + c[s]
        arg[s] = np.argmin(tot, axis=0)
        F[s + 1] = tot[arg[s], np.arange(L1)]
    split, v = [], L1 - 1
    for s in range(pp - 1, -1, -1):
        u = int(arg[s, v])
        split.append(v - u)
        v = u
    return tuple(reversed(split))


def _balanced(cost: np.ndarray, bound: float, tol_sq: float, mean: float) -> tuple[tuple[int, ...], float]:
    """Among splits with every stage <= ``bound``: the least sum of squared deviations from ``mean`` (within
    ``tol_sq``), the lexicographically smallest of those. Returns (split, its largest stage cost)."""
    pp, L1, _ = cost.shape
    ok = np.isfinite(cost) & (cost <= bound)
    dev = np.where(ok, (cost - mean) ** 2, np.inf)
    # G[j][u] = least sum of squared deviations of stages j.. covering layers u..L-1.
    G = np.full((pp + 1, L1), np.inf)
    G[pp, L1 - 1] = 0.0
    for j in range(pp - 1, -1, -1):
        G[j] = np.min(dev[j] + G[j + 1][None, :], axis=1)
    s_bound = G[0, 0] + tol_sq
    split: list[int] = []
    u, acc, worst = 0, 0.0, -math.inf
    for j in range(pp):
        take = np.flatnonzero(ok[j, u] & np.isfinite(G[j + 1]) & (acc + dev[j, u] + G[j + 1] <= s_bound))
        if not len(take):  # pragma: no cover - G guarantees a completion
            raise AssertionError("solve_split: reconstruction failed")
        v = int(take[0])
        split.append(v - u)
        acc += float(dev[j, u, v])
        worst = max(worst, float(cost[j, u, v]))
        u = v
    return tuple(split), worst


def _pipeline_threshold(cost: np.ndarray, t_star: float, microbatches: int, vpp: int) -> tuple[float, bool]:
    """The threshold T minimising alpha*T + beta*S(T) (alpha = m - 1/vpp, beta = 1/vpp, S(T) the least sum of
    stage costs with every stage <= T), from the min-max T* up while alpha*T + beta*S(inf) can still win.
    Returns (T, exact): exact False when SPLIT_MAX_ROUNDS stopped the search."""
    alpha, beta = microbatches - 1.0 / vpp, 1.0 / vpp
    s_star, s_free = _min_sum(cost, np.array([t_star, np.inf]))
    best_val, best_t, exact = alpha * t_star + beta * s_star, t_star, True
    finite = cost[np.isfinite(cost)]
    cand = np.unique(finite[(finite > t_star) & (alpha * finite + beta * s_free < best_val)])
    for rounds, k in enumerate(range(0, len(cand), SPLIT_BATCH)):
        ts = cand[k: k + SPLIT_BATCH]
        ts = ts[alpha * ts + beta * s_free < best_val]
        if not len(ts):
            break
        if rounds == SPLIT_MAX_ROUNDS:
            exact = False
            break
        vals = alpha * ts + beta * _min_sum(cost, ts)
        j = int(np.argmin(vals))
        if vals[j] < best_val:
            best_val, best_t = float(vals[j]), float(ts[j])
    return best_t, exact


def solve_split(cost: np.ndarray, *, microbatches: int | None = None, vpp: int = 1, tie_tol: float = 0.0,
                tie_tol_sq: float = 0.0, mean_cost: float = 0.0) -> tuple[tuple[int, ...], float, bool]:
    """The best split from interval costs ``cost[s, u, v]`` (inf where stage s may not hold layers u..v-1).

    ``microbatches`` None, the homogeneous case: the least largest stage cost T*; among splits within
    ``tie_tol`` of it, the least sum of squared deviations from ``mean_cost`` (within ``tie_tol_sq``), then
    the lexicographically smallest split. ``microbatches`` m, the heterogeneous case: the least
    m*max(t) + (sum(t) - max(t))/vpp, exact: the optimum is min over thresholds T of alpha*T + beta*S(T)
    (:func:`_pipeline_threshold`), the split the least-sum one under the best T.

    Returns (layers per stage, largest stage cost, exact). Raises ValueError when no split is allowed.
    """
    t_star = _min_max(cost)
    if t_star == math.inf:
        raise ValueError("no allowed split")
    if microbatches is None:
        split, worst = _balanced(cost, t_star + tie_tol, tie_tol_sq, mean_cost)
        return split, worst, True
    best_t, exact = _pipeline_threshold(cost, t_star, microbatches, vpp)
    split = _reconstruct(cost, best_t)
    bounds = np.cumsum((0,) + split)
    worst = max(float(cost[s, bounds[s], bounds[s + 1]]) for s in range(len(split)))
    return split, worst, exact


# The homogeneous case -------------------------------------------------------------------------------------


def _check_min_max_args(costs: list[float], pp: int, m: int, first_extra: float, last_extra: float,
                        stage_memory: StageMemory | None, memory_capacity: float | None) -> None:
    """min_max_split's arguments, or a one-line ValueError saying why no split can exist."""
    L = len(costs)
    if pp < 1:
        raise ValueError(f"pp={pp} must be >= 1")
    if m < 1:
        raise ValueError(f"multiple_of={m} must be >= 1")
    if not all(math.isfinite(x) for x in (*costs, first_extra, last_extra)):
        raise ValueError("layer costs and edge extras must be finite")
    if (stage_memory is None) != (memory_capacity is None):
        raise ValueError("stage_memory and memory_capacity must be given together")
    if L % m:
        raise ValueError(f"no split: {L} layers cannot be split into stages of multiples of {m} layers")
    if pp == 1 and L == 0:
        raise ValueError("no split: pp=1 needs at least one layer")
    mid_stages = max(pp - 2, 0)
    if L < m * mid_stages:
        raise ValueError(
            f"no split: {L} layers cannot fill the {mid_stages} middle stages of pp={pp} with at "
            f"least {m} layer(s) each"
        )


def min_max_split(
    layer_cost: Sequence[float],
    pp: int,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    multiple_of: int = 1,
    stage_memory: StageMemory | None = None,
    memory_capacity: float | None = None,
) -> tuple[tuple[int, ...], float]:
    """Split the layers, in order, into ``pp`` contiguous stages minimising the largest stage cost (the
    homogeneous case of :func:`solve_split`).

    Stage cost = sum of its layers' costs, + ``first_extra`` on stage 0 (embedding), +
    ``last_extra`` on stage pp-1 (LM head and loss); with pp == 1 the single stage carries both.
    Only the first or the last stage may be empty, and only when pp > 1; every stage's layer count
    is a multiple of ``multiple_of``. With ``stage_memory`` and ``memory_capacity``, every stage
    must satisfy ``stage_memory(stage_index, first_layer, n_layers) <= memory_capacity``.

    Ties on the maximum (within a relative 1e-9) go to the split with the smaller sum of squared
    deviations of the stage costs from their mean, then to the lexicographically smallest split.

    Returns ``(layers_per_stage, max_stage_cost)``; raises ValueError when no split is feasible.
    """
    costs = [float(x) for x in layer_cost]
    L, pp, m = len(costs), int(pp), int(multiple_of)
    first_extra, last_extra = float(first_extra), float(last_extra)
    _check_min_max_args(costs, pp, m, first_extra, last_extra, stage_memory, memory_capacity)
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    cost_scale = sum(abs(x) for x in costs) + abs(first_extra) + abs(last_extra)
    mean = (float(prefix[L]) + first_extra + last_extra) / pp
    extras = [(first_extra if j == 0 else 0.0) + (last_extra if j == pp - 1 else 0.0) for j in range(pp)]
    allowed = count_ok(pp, L, m)
    if stage_memory is not None:
        where = np.nonzero(allowed)
        peak = [float(stage_memory(j, u, v - u)) for j, u, v in zip(*(w.tolist() for w in where))]
        allowed[where] = np.array(peak) <= memory_capacity
    # Stage cost = (its layers) + its edge extra, summed in that order.
    cost = np.where(allowed, interval_costs(np.zeros(pp), prefix) + np.asarray(extras)[:, None, None], np.inf)
    try:
        split, worst, _ = solve_split(cost, tie_tol=_REL_TOL * cost_scale,
                                      tie_tol_sq=_REL_TOL * cost_scale * cost_scale, mean_cost=mean)
    except ValueError:
        why = " under the memory capacity" if stage_memory is not None else ""
        raise ValueError(f"no feasible split of {L} layers over pp={pp} stages (multiple_of={m}){why}") from None
    return split, worst


def probe(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, stage_layers, score) -> dict[str, np.ndarray]:
    """``score(model, cluster, arrays)`` (estimate_arrays with the caller's profile and framework) of
    ``plans`` with explicit per-stage layer counts ``stage_layers`` (n, width). Stage times and memory in
    ``estimate_arrays`` depend on the stage's own layers (and its index and edge role) only, so a probe
    row can place a stage of interest anywhere."""
    cols = {f.name: getattr(plans, f.name) for f in fields(PlanArrays) if f.name != "stage_layers"}
    return score(model, cluster, PlanArrays(**cols, stage_layers=np.asarray(stage_layers, dtype=float)))


def _plan_probe(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, rows: np.ndarray, *,
                pp: int, vpp: int = 1, profile: HardwareProfile | None = None,
                moe_imbalance: float = 1.0, **overrides) -> dict[str, np.ndarray]:
    """Score one plan (with ``pp``, ``vpp`` and ``overrides``) once per row of per-stage layer counts."""
    base = plan.model_copy(update={"pp": pp, "vpp": vpp, "layers_per_stage": None, **overrides})
    one = PlanArrays.from_plans([base])
    n = len(rows)
    plans = PlanArrays(**{f.name: np.repeat(getattr(one, f.name), n) for f in fields(PlanArrays)
                          if f.name != "stage_layers"})

    def score(mdl, cl, arrays):
        return estimate_arrays(mdl, cl, arrays, profile=profile, framework=plan.framework,
                               moe_imbalance=moe_imbalance)

    return probe(model, cluster, plans, rows, score)


def _unit_costs(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, **kw
                ) -> tuple[float, float, float, float]:
    """(dense layer, MoE layer, first-stage extra, last-stage extra) seconds per micro-batch."""
    kinds = model.moe_mask()
    # pp=4 probe: stage 0 (the layers before, first), 1 (empty, middle: the baseline), 2 (one layer), 3 (last);
    # stage 2's layer is the model's first dense layer, then its first MoE layer.
    # Layer 0 is the first of its kind, so the first row's stage 0 is empty.
    at = sorted(kinds.index(moe) for moe in (False, True) if moe in kinds)
    t = _plan_probe(model, cluster, plan, np.array([[i, 0, 1, 0] for i in at]), pp=4, **kw)["stage_time_s"]
    base = t[0, 1]
    first_extra = float(t[0, 0] - base)
    last_extra = float(t[0, 3] - base)
    one = dict(zip((kinds[i] for i in at), (float(t[r, 2] - t[r, 1]) for r in range(len(at)))))
    return one.get(False, 0.0), one.get(True, 0.0), first_extra, last_extra


def layer_costs(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                profile: HardwareProfile | None = None, moe_imbalance: float = 1.0
                ) -> tuple[list[float], float, float]:
    """Per-layer forward + backward (+ recompute) seconds of one micro-batch, and the edge extras.

    Returns ``(costs, first_extra, last_extra)``: ``costs[i]`` for transformer layer i (the first
    ``model.dense_layers`` are dense for an MoE model, the rest MoE), ``first_extra`` the embedding
    time on the first stage, ``last_extra`` the LM head + cross-entropy time on the last stage.

    They are read from ``estimate_arrays``' per-stage ``stage_time_s`` on a probe split (one
    layer on a stage, edge stages empty) minus an empty middle stage, so they are the cost model's
    own stage times term by term (layer forward and backward as in ``details`` plus recompute;
    embedding and LM head + loss, which ``details`` only partly exposes). The per-stage pipeline
    hop is the same on every stage and drops out.

    Full recompute of only ``recompute_layers`` = k layers per stage makes a stage's recompute
    min(k, n) layers, which is not a per-layer sum; it is approximated by charging every layer the
    fraction min(1, k * pp / layers) of its recompute time (exact for the even split).
    """
    kw = {"profile": profile, "moe_imbalance": moe_imbalance}
    k = plan.recompute_layers
    if plan.recompute == "full" and k is not None:
        d_all, m_all, fe, le = _unit_costs(model, cluster, plan, recompute_layers=None, **kw)
        d_none, m_none, _, _ = _unit_costs(model, cluster, plan, recompute="none",
                                           recompute_layers=None, **kw)
        frac = min(1.0, k * plan.pp / model.layers)
        dense = d_none + frac * (d_all - d_none)
        moe = m_none + frac * (m_all - m_none)
    else:
        dense, moe, fe, le = _unit_costs(model, cluster, plan, **kw)
    return [moe if x else dense for x in model.moe_mask()], fe, le


def stage_memory_table(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                       multiple_of: int = 1, profile: HardwareProfile | None = None,
                       moe_imbalance: float = 1.0) -> tuple[StageMemory, float]:
    """The cost model's peak memory of any candidate stage, as ``stage_memory(j, first, n)``.

    A stage's peak depends on its index j (in-flight micro-batches, embedding / LM head), and on
    how many of its n layers are dense or MoE; every such combination the split can produce is
    scored in one vectorised ``estimate_arrays`` call with the plan's pp and vpp. Returns the
    function and the usable memory capacity of one GPU.
    """
    L, pp, m = model.layers, plan.pp, int(multiple_of)
    keys: list[tuple[int, int, int]] = []
    rows: list[list[int]] = []
    for j in range(pp):
        for n in range(0, L + 1, m):
            # Stage j holding layers u..u+n-1: the first stage starts at 0; a later one is probed once for each
            # count of MoE layers it can hold, placed after u layers on the first stage.
            u = np.arange(1 if j == 0 else L - n + 1)
            nm, at = np.unique(model.moe_before(u + n) - model.moe_before(u), return_index=True)
            for moe, start in zip(nm.tolist(), u[at].tolist()):
                row = [0] * pp
                row[0] = start
                row[j] = n
                keys.append((j, n - moe, moe))
                rows.append(row)
    out = _plan_probe(model, cluster, plan, np.array(rows), pp=pp, vpp=plan.vpp, profile=profile,
                      moe_imbalance=moe_imbalance)
    peak = out["peak_memory_bytes"][np.arange(len(rows)), [k[0] for k in keys]]
    table = dict(zip(keys, (float(x) for x in peak)))
    capacity = float(out["memory_capacity_bytes"][0])

    def stage_memory(j: int, first: int, n: int) -> float:
        nm = int(model.moe_before(first + n) - model.moe_before(first))
        return table[(j, n - nm, nm)]

    return stage_memory, capacity


def best_split(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
               memory: bool = True, profile: HardwareProfile | None = None,
               moe_imbalance: float = 1.0) -> ParallelPlan:
    """The plan with ``layers_per_stage`` set to the min-max split (multiples of vpp).

    With ``memory`` (default) the split must also keep every stage within the GPU's usable memory
    as the cost model sees it; when no split fits, the memory constraint is dropped (the plan will
    then be reported as not fitting). pp == 1 returns the plan unchanged.
    """
    if plan.pp == 1:
        return plan
    kw = {"profile": profile, "moe_imbalance": moe_imbalance}
    costs, fe, le = layer_costs(model, cluster, plan, **kw)
    split = None
    if memory:
        stage_memory, capacity = stage_memory_table(model, cluster, plan, multiple_of=1, **kw)
        try:
            split, _ = min_max_split(costs, plan.pp, fe, le, multiple_of=1,
                                     stage_memory=stage_memory, memory_capacity=capacity)
        except ValueError:
            split = None
    if split is None:
        split, _ = min_max_split(costs, plan.pp, fe, le, multiple_of=1)
    return ParallelPlan.model_validate({**plan.model_dump(), "layers_per_stage": split})


# The heterogeneous case -----------------------------------------------------------------------------------


def score_with(scorer, prof: HardwareProfile, framework: str):
    """``score(model, cluster, arrays)``: ``scorer`` (estimate_arrays' arguments, e.g. with per-plan MoE
    imbalance) or estimate_arrays itself, with the profile and framework bound."""
    def score(model, cluster, arrays):
        if scorer is None:
            return estimate_arrays(model, cluster, arrays, profile=prof, framework=framework)
        return scorer(model, cluster, arrays, profile=prof, framework=framework)
    return score


def stage_coefficients(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, *, profile=None,
                       framework: str = "megatron-core", scorer=None) -> dict[str, np.ndarray]:
    """Per-stage linear costs of every plan row (stage_layers ignored), each (n, max pp):

    ``time0`` / ``mem0``: stage time and peak memory with no layers; ``time_dense`` / ``time_moe`` and
    ``mem_dense`` / ``mem_moe``: what one dense / MoE layer adds; and ``capacity`` (n,). Read from
    ``estimate_arrays`` on three probe splits (no layers, one dense layer, one MoE layer on every stage).
    """
    score = score_with(scorer, profile or load_profile(cluster.gpu), framework)
    width = int(plans.pp.max())
    pp = plans.pp.astype(int)
    on = (np.arange(width)[None, :] < pp[:, None]).astype(float)
    zero = probe(model, cluster, plans, 0.0 * on, score)
    dense_model = model.model_copy(update={"dense_layers": model.layers}) if model.is_moe else model
    one_d = probe(dense_model, cluster, plans, 1.0 * on, score)
    one_m = (probe(model.model_copy(update={"dense_layers": 0, "moe_layer_step": 1}), cluster, plans, 1.0 * on, score)
             if model.is_moe else one_d)
    t0, m0 = zero["stage_time_s"], zero["peak_memory_bytes"]
    return {"time0": t0, "time_dense": one_d["stage_time_s"] - t0, "time_moe": one_m["stage_time_s"] - t0,
            "mem0": m0, "mem_dense": one_d["peak_memory_bytes"] - m0, "mem_moe": one_m["peak_memory_bytes"] - m0,
            "capacity": zero["memory_capacity_bytes"]}


@dataclass(frozen=True)
class Split:
    layers_per_stage: tuple[int, ...]
    pipeline_s: float
    """m*max(t) + (sum(t) - max(t))/vpp of the split, from the linear stage costs."""
    fits: bool
    """Every stage within its capacity (False: no split fits, this is the fastest ignoring memory)."""
    exact: bool
    """False when the threshold search stopped at SPLIT_MAX_ROUNDS before proving optimality."""


def optimal_split(time0, time_dense, time_moe, mem0, mem_dense, mem_moe, capacity, *, dense_before: np.ndarray,
                  microbatches: int, vpp: int = 1) -> Split:
    """The split of the layers (``dense_before[j]``: dense ones among the first j, j = 0..layers) over the stages
    that minimises
    m*max(t) + (sum(t) - max(t))/vpp with linear stage costs t_s = time0_s + time_dense_s*n_dense +
    time_moe_s*n_moe, every stage's memory mem0_s + mem_dense_s*n_dense + mem_moe_s*n_moe <= capacity_s
    (scalar or per stage), the middle stages non-empty (the heterogeneous case of :func:`solve_split`).
    """
    pp, layers = len(time0), len(dense_before) - 1
    if layers < max(pp - 2, 0) or (pp == 1 and layers < 1):
        raise ValueError(f"no split: {layers} layers cannot fill the {max(pp - 2, 1)} stage(s) that must hold one")
    cost = interval_costs(time0, linear_prefix(time_dense, time_moe, dense_before))
    mem = interval_costs(mem0, linear_prefix(mem_dense, mem_moe, dense_before))
    cap = np.broadcast_to(np.asarray(capacity, dtype=float), (pp,))
    ok = count_ok(pp, layers)
    fits = True
    allowed = ok & (mem <= cap[:, None, None])
    if not np.isfinite(_min_sum(np.where(allowed, cost, np.inf), np.array([np.inf]))[0]):
        fits, allowed = False, ok
    split, _, exact = solve_split(np.where(allowed, cost, np.inf), microbatches=microbatches, vpp=vpp)
    t = np.array([time0[s] + _layer_sum(time_dense[s], time_moe[s], split, s, dense_before) for s in range(pp)])
    pipe = microbatches * t.max() + (t.sum() - t.max()) / vpp
    return Split(split, float(pipe), fits, exact)


def _layer_sum(b_dense: float, b_moe: float, split: tuple[int, ...], s: int, dense_before: np.ndarray) -> float:
    """What stage s's layers of ``split`` cost at ``b_dense`` per dense and ``b_moe`` per MoE layer."""
    u = sum(split[:s])
    nd = int(dense_before[u + split[s]] - dense_before[u])
    return b_dense * nd + b_moe * (split[s] - nd)
