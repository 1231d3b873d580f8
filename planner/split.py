"""The exact pipeline stage split: min-max dynamic programming over contiguous layer ranges.

Given a per-layer cost (forward + backward of one micro-batch), the pipeline's pace is set by its
slowest stage (1F1B: T = m * max(t) + fill), so the best split of L layers over pp stages is the one
that minimises the maximum stage cost. :func:`min_max_split` solves that exactly by dynamic
programming over (stage, layers used), O(pp * L^2), with Megatron's constraints: only the first and
the last stage may be empty, every stage holds a multiple of ``multiple_of`` layers (vpp for the
interleaved schedule), and optionally every stage's memory fits.

:func:`layer_costs` reads the per-layer and edge (embedding / LM head + loss) times from the cost
model and :func:`best_split` puts the split into a plan; costmodel/plan.py writes a split as the flags
Megatron is launched with. Megatron's constraints (``TransformerConfig.__post_init__``, uneven PP):
the edge stages may be empty only when written as a layout string, and every stage's layers divide by vpp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import fields

import numpy as np

from costmodel.estimate import PlanArrays, estimate_arrays
from costmodel.profiles import HardwareProfile
from costmodel.specs import ClusterSpec, ModelSpec, ParallelPlan

__all__ = [
    "best_split",
    "layer_costs",
    "min_max_split",
    "stage_memory_table",
]

StageMemory = Callable[[int, int, int], float]
"""stage_memory(stage_index, first_layer, n_layers) -> peak bytes of that stage."""

_REL_TOL = 1e-9
"""Relative tolerance for ties between stage costs (prefix-sum differences round differently)."""


# The dynamic programme --------------------------------------------------------------------------


def min_max_split(
    layer_cost: Sequence[float],
    pp: int,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    multiple_of: int = 1,
    stage_memory: StageMemory | None = None,
    memory_capacity: float | None = None,
) -> tuple[tuple[int, ...], float]:
    """Split the layers, in order, into ``pp`` contiguous stages minimising the largest stage cost.

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
    L = len(costs)
    pp = int(pp)
    m = int(multiple_of)
    first_extra, last_extra = float(first_extra), float(last_extra)
    if pp < 1:
        raise ValueError(f"pp={pp} must be >= 1")
    if m < 1:
        raise ValueError(f"multiple_of={multiple_of} must be >= 1")
    if not all(math.isfinite(x) for x in (*costs, first_extra, last_extra)):
        raise ValueError("layer costs and edge extras must be finite")
    if (stage_memory is None) != (memory_capacity is None):
        raise ValueError("stage_memory and memory_capacity must be given together")
    if L % m:
        raise ValueError(
            f"no split: {L} layers cannot be split into stages of multiples of {m} layers"
        )
    if pp == 1 and L == 0:
        raise ValueError("no split: pp=1 needs at least one layer")
    mid_stages = max(pp - 2, 0)
    if L < m * mid_stages:
        raise ValueError(
            f"no split: {L} layers cannot fill the {mid_stages} middle stages of pp={pp} with at "
            f"least {m} layer(s) each"
        )

    prefix = [0.0]
    for x in costs:
        prefix.append(prefix[-1] + x)
    scale = sum(abs(x) for x in costs) + abs(first_extra) + abs(last_extra)
    tol = _REL_TOL * scale
    tol_sq = _REL_TOL * scale * scale
    mean = (prefix[L] + first_extra + last_extra) / pp

    def extra(j: int) -> float:
        return (first_extra if j == 0 else 0.0) + (last_extra if j == pp - 1 else 0.0)

    extras = [extra(j) for j in range(pp)]

    def counts(j: int, u: int) -> range:
        """Layer counts stage j may take when stages < j used u layers."""
        left = L - u
        if j == pp - 1:
            ok = left >= (1 if pp == 1 else 0) and left % m == 0
            return range(left, left + 1) if ok else range(0)
        lo = 0 if j == 0 else m
        mids_after = max(pp - 2 - j, 0)       # stages j+1 .. pp-2 need >= m layers each
        return range(lo, left - m * mids_after + 1, m)

    def starts(j: int) -> range:
        if j == 0:
            return range(0, 1)
        return range(m * (j - 1), L + 1, m)    # stages 1 .. j-1 hold >= m layers each

    mem_cache: dict[tuple[int, int, int], bool] = {}

    def fits(j: int, u: int, n: int) -> bool:
        if stage_memory is None:
            return True
        key = (j, u, n)
        ok = mem_cache.get(key)
        if ok is None:
            ok = bool(float(stage_memory(j, u, n)) <= memory_capacity)
            mem_cache[key] = ok
        return ok

    inf = math.inf
    # Phase 1: F[j][u] = least achievable max cost of stages j.. covering layers u..L-1.
    F = [[inf] * (L + 1) for _ in range(pp + 1)]
    F[pp][L] = -inf
    for j in range(pp - 1, -1, -1):
        Fj, Fn, ej = F[j], F[j + 1], extras[j]
        for u in starts(j):
            best = inf
            pu = prefix[u]
            for n in counts(j, u):
                rest = Fn[u + n]
                if rest == inf:
                    continue
                c = prefix[u + n] - pu + ej
                v = c if c > rest else rest
                if v < best and fits(j, u, n):
                    best = v
            Fj[u] = best
    m_star = F[0][0]
    if m_star == inf:
        why = " under the memory capacity" if stage_memory is not None else ""
        raise ValueError(
            f"no feasible split of {L} layers over pp={pp} stages (multiple_of={m}){why}"
        )
    bound = m_star + tol

    # Phase 2: G[j][u] = least sum of squared deviations of stages j.. with every stage <= bound.
    G = [[inf] * (L + 1) for _ in range(pp + 1)]
    G[pp][L] = 0.0
    for j in range(pp - 1, -1, -1):
        Gj, Gn, ej = G[j], G[j + 1], extras[j]
        for u in starts(j):
            best = inf
            pu = prefix[u]
            for n in counts(j, u):
                rest = Gn[u + n]
                if rest == inf:
                    continue
                c = prefix[u + n] - pu + ej
                if c > bound:
                    continue
                v = (c - mean) ** 2 + rest
                if v < best and fits(j, u, n):
                    best = v
            Gj[u] = best
    s_bound = G[0][0] + tol_sq

    # Phase 3: lexicographically smallest split whose total stays within the optimum.
    split: list[int] = []
    u, acc, worst = 0, 0.0, -inf
    for j in range(pp):
        for n in counts(j, u):
            rest = G[j + 1][u + n]
            if rest == inf:
                continue
            c = prefix[u + n] - prefix[u] + extras[j]
            if c > bound or not fits(j, u, n):
                continue
            d = (c - mean) ** 2
            if acc + d + rest <= s_bound:
                split.append(n)
                acc += d
                worst = max(worst, c)
                u += n
                break
        else:  # pragma: no cover - the phases above guarantee a completion
            raise AssertionError("min_max_split: reconstruction failed")
    return tuple(split), worst


# Costs from the cost model ----------------------------------------------------------------------


def _probe(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, rows: np.ndarray, *,
           pp: int, vpp: int = 1, profile: HardwareProfile | None = None,
           moe_imbalance: float = 1.0, **overrides) -> dict[str, np.ndarray]:
    """Score one plan with explicit per-stage layer counts ``rows`` (n_rows, pp).

    Stage times and memory in ``estimate_arrays`` depend on the stage's own layers (and its index
    and edge role) only, so each row can place one stage of interest anywhere; the other columns
    are filler and are not read.
    """
    base = plan.model_copy(update={"pp": pp, "vpp": vpp, "layers_per_stage": None, **overrides})
    one = PlanArrays.from_plans([base])
    n = len(rows)
    cols = {f.name: np.repeat(getattr(one, f.name), n) for f in fields(PlanArrays)
            if f.name != "stage_layers"}
    arrays = PlanArrays(**cols, stage_layers=np.asarray(rows, dtype=float))
    return estimate_arrays(model, cluster, arrays, profile=profile, framework=plan.framework,
                           moe_imbalance=moe_imbalance)


def _unit_costs(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, **kw
                ) -> tuple[float, float, float, float]:
    """(dense layer, MoE layer, first-stage extra, last-stage extra) seconds per micro-batch."""
    L = model.layers
    D = model.dense_layers if model.is_moe else L
    # pp=4 probe: stage 0 (empty, first), 1 (empty, middle: the baseline), 2 (one layer), 3 (last).
    rows = [[0, 0, 1, 0]]                     # stage 2 starts at layer 0: dense if D >= 1
    if 0 < D < L:
        rows.append([D, 0, 1, 0])             # stage 2 starts at layer D: an MoE layer
    t = _probe(model, cluster, plan, np.array(rows), pp=4, **kw)["stage_time_s"]
    base = t[0, 1]
    first_extra = float(t[0, 0] - base)
    last_extra = float(t[0, 3] - base)
    layer0 = float(t[0, 2] - base)
    dense = layer0 if D >= 1 else 0.0
    moe = layer0 if D == 0 else (float(t[1, 2] - t[1, 1]) if D < L else 0.0)
    return dense, moe, first_extra, last_extra


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
    D = model.dense_layers if model.is_moe else model.layers
    costs = [dense] * D + [moe] * (model.layers - D)
    return costs, fe, le


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
    D = model.dense_layers if model.is_moe else L
    keys: list[tuple[int, int, int]] = []
    rows: list[list[int]] = []
    for j in range(pp):
        for n in range(0, L + 1, m):
            if not model.is_moe:
                combos = [(n, 0)]
            elif j == 0:
                combos = [(min(D, n), n - min(D, n))]
            else:
                combos = [(nd, n - nd) for nd in range(0, min(D, n) + 1)]
            for nd, nm in combos:
                u = 0 if (not model.is_moe or nm == 0) else D - nd
                row = [0] * pp
                if u:
                    row[0] = u
                row[j] = n
                keys.append((j, nd, nm))
                rows.append(row)
    out = _probe(model, cluster, plan, np.array(rows), pp=pp, vpp=plan.vpp, profile=profile,
                 moe_imbalance=moe_imbalance)
    peak = out["peak_memory_bytes"][np.arange(len(rows)), [k[0] for k in keys]]
    table = dict(zip(keys, (float(x) for x in peak)))
    capacity = float(out["memory_capacity_bytes"][0])

    def stage_memory(j: int, first: int, n: int) -> float:
        nd = min(max(D - first, 0), n) if model.is_moe else n
        return table[(j, nd, n - nd)]

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
