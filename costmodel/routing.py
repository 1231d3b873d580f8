"""MoE routing imbalance from a routing histogram: per-rank token load for an expert-parallel degree and an
expert placement, the capacity factor that bounds it, and the factors the cost model takes.

A histogram gives, per MoE layer, how many token-to-expert assignments each expert received (counts summed
over a run, or fractions). Normalised per layer, f[l, e] is expert e's share of layer l's routed slots;
balanced routing is f = 1/E. With ep expert-parallel ranks each rank holds E/ep experts (Megatron splits
them equally; the placement says which), and rank r's load relative to the balanced mean is

    load[l, r] = ep * sum_{e on r} f[l, e]                       (1.0 = balanced)

Every MoE layer ends in a synchronising all-to-all, so the hottest rank of each layer sets that layer's
pace; the layers of a stage run one after another, so the expert compute and the dispatch/combine time
scale by the **time factor** mean_l max_r load[l, r]. A rank keeps the activations of all its layers, so
the peak is set by the rank that is hottest over the layers together: the **memory factor**
max_r mean_l load[l, r] (never above the time factor). Both feed ``estimate_arrays``' ``moe_imbalance``
(:func:`estimate_routed` runs it once per factor and takes time from the first, memory from the second).

Placements: ``contiguous`` is Megatron's default (expert e on rank e // (E/ep)); ``lpt`` is the greedy
longest-processing-time assignment per layer (hottest expert first, to the least-loaded rank that still has
room for E/ep experts). A non-contiguous placement is not a Megatron flag: it is applied by permuting the
experts (their weights and router rows) of a checkpoint.

A capacity factor C (Megatron ``--moe-expert-capacity-factor``, without padding) lets an expert process at
most C/E of the routed slots and drops the rest, so a rank's load is at most C; :func:`capacity_to_drop_none`
is the smallest C that drops nothing. The histogram is summed over a run: the model sees the persistent
skew, not step-to-step fluctuation around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.estimate import estimate_arrays
from costmodel.plan import PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec

PLACEMENTS = ("contiguous", "lpt")
MEMORY_KEYS = ("peak_memory_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
               "buffers_bytes", "memory_capacity_bytes", "fits")
"""estimate_arrays outputs taken from the memory-factor run (the rest come from the time-factor run)."""


def expert_fractions(histogram) -> np.ndarray:
    """Per-layer shares of the routed slots, shape (layers, experts), each row summing to 1.

    ``histogram``: one list of per-expert counts or fractions, or a list of them (one per MoE layer).
    Raises ValueError (one line) on ragged rows, negative or non-finite values, or a layer with no tokens.
    """
    try:
        h = np.asarray(histogram, dtype=float)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise ValueError("expected a list of numbers per expert, or a list of such lists (one per MoE layer) "
                         "of equal length") from None
    if h.ndim == 1:
        h = h[None, :]
    if h.ndim != 2 or h.shape[1] == 0 or h.shape[0] == 0:
        raise ValueError(f"expected a list of per-expert numbers or a list of them per layer, got shape {h.shape}")
    if not np.isfinite(h).all() or (h < 0).any():
        raise ValueError("counts must be finite and >= 0")
    with np.errstate(over="ignore"):   # an overflowing total is refused just below, not warned about
        sums = h.sum(axis=1)
    if not np.isfinite(sums).all():
        raise ValueError("counts too large: a layer's total overflows float64")
    empty = np.flatnonzero(sums <= 0)
    if len(empty):
        raise ValueError(f"layer {int(empty[0])} has no routed tokens")
    return h / sums[:, None]


def contiguous_placement(num_experts: int, ep: int, layers: int = 1) -> np.ndarray:
    """Megatron's placement: expert e on EP rank e // (E/ep), for every layer. Shape (layers, E)."""
    per = num_experts // ep
    return np.broadcast_to(np.arange(num_experts) // per, (layers, num_experts)).copy()


def lpt_placement(fractions: np.ndarray, ep: int) -> np.ndarray:
    """Greedy LPT placement per layer with E/ep experts per rank. Shape (layers, E) of rank ids.

    Experts in decreasing share (ties: lower index first) go to the least-loaded rank with room (ties: lower
    rank). Vectorised over layers: E steps of one argmin each.
    """
    f = np.asarray(fractions, dtype=float)
    n_layers, E = f.shape
    per = E // ep
    order = np.argsort(-f, axis=1, kind="stable")
    rows = np.arange(n_layers)
    loads = np.zeros((n_layers, ep))
    counts = np.zeros((n_layers, ep), dtype=int)
    assign = np.zeros((n_layers, E), dtype=int)
    for j in range(E):
        e = order[:, j]
        r = np.argmin(np.where(counts < per, loads, np.inf), axis=1)
        assign[rows, e] = r
        loads[rows, r] += f[rows, e]
        counts[rows, r] += 1
    return assign


def placement(kind: str, fractions: np.ndarray, ep: int) -> np.ndarray:
    if kind == "contiguous":
        return contiguous_placement(fractions.shape[1], ep, fractions.shape[0])
    if kind == "lpt":
        return lpt_placement(fractions, ep)
    raise ValueError(f"unknown placement {kind!r}; valid: {', '.join(PLACEMENTS)}")


def clipped(fractions: np.ndarray, capacity_factor: float | None) -> np.ndarray:
    """Shares each expert actually processes: at most capacity_factor / E with a capacity factor."""
    f = np.asarray(fractions, dtype=float)
    if capacity_factor is None:
        return f
    return np.minimum(f, capacity_factor / f.shape[1])


def rank_loads(fractions: np.ndarray, assign: np.ndarray, ep: int,
               capacity_factor: float | None = None) -> np.ndarray:
    """load[l, r]: rank r's processed tokens of layer l over the balanced mean. Shape (layers, ep)."""
    f = clipped(fractions, capacity_factor)
    n_layers = f.shape[0]
    out = np.zeros((n_layers, ep))
    np.add.at(out, (np.repeat(np.arange(n_layers), f.shape[1]), assign.ravel()), f.ravel())
    return out * ep


def capacity_to_drop_none(fractions: np.ndarray) -> float:
    """The smallest capacity factor that drops no token: the hottest expert's share times E."""
    f = np.asarray(fractions, dtype=float)
    return float(f.max() * f.shape[1])


def dropped_fraction(fractions: np.ndarray, capacity_factor: float | None) -> float:
    """Share of routed slots a capacity factor drops (mean over layers)."""
    if capacity_factor is None:
        return 0.0
    f = np.asarray(fractions, dtype=float)
    return float((f - clipped(f, capacity_factor)).sum(axis=1).mean())


def top_share(fractions: np.ndarray, k: int) -> float:
    """Share of routed slots on each layer's k hottest experts (mean over layers)."""
    f = np.sort(np.asarray(fractions, dtype=float), axis=1)[:, ::-1]
    return float(f[:, :k].sum(axis=1).mean())


@dataclass(frozen=True)
class ExpertLoad:
    """The load of one (ep, placement) under a histogram."""

    ep: int
    placement: str
    time_factor: float
    """mean over layers of the hottest rank's load (paces expert compute and the all-to-all)."""
    memory_factor: float
    """the hottest rank's mean load over the layers (sets the activation peak)."""
    worst_layer: int
    worst_layer_factor: float
    capacity_factor: float | None
    dropped_fraction: float
    assignment: np.ndarray
    """(layers, E) EP rank of every expert."""

    def summary(self) -> dict:
        """JSON-ready description (the placement as one list per layer of the experts on each rank)."""
        experts_by_rank = [[[int(e) for e in np.flatnonzero(row == r)] for r in range(self.ep)]
                           for row in self.assignment]
        return {"ep": self.ep, "placement": self.placement, "time_factor": self.time_factor,
                "memory_factor": self.memory_factor, "worst_layer": self.worst_layer,
                "worst_layer_factor": self.worst_layer_factor, "capacity_factor": self.capacity_factor,
                "dropped_fraction": self.dropped_fraction, "experts_by_rank": experts_by_rank,
                "megatron_default": self.placement == "contiguous"}


def expert_load(fractions: np.ndarray, ep: int, kind: str = "contiguous",
                capacity_factor: float | None = None) -> ExpertLoad:
    """Load factors of ``ep`` ranks with the ``kind`` placement. ep must divide the expert count."""
    f = np.asarray(fractions, dtype=float)
    E = f.shape[1]
    if ep < 1 or E % ep:
        raise ValueError(f"ep={ep} does not divide the {E} experts of the histogram")
    assign = placement(kind, f, ep)
    load = rank_loads(f, assign, ep, capacity_factor)
    per_layer = load.max(axis=1)
    worst = int(np.argmax(per_layer))
    return ExpertLoad(ep=ep, placement=kind, time_factor=float(per_layer.mean()),
                      memory_factor=float(load.mean(axis=0).max()), worst_layer=worst,
                      worst_layer_factor=float(per_layer[worst]), capacity_factor=capacity_factor,
                      dropped_fraction=dropped_fraction(f, capacity_factor), assignment=assign)


def best_load(fractions: np.ndarray, ep: int, capacity_factor: float | None = None,
              placements: tuple[str, ...] = PLACEMENTS) -> ExpertLoad:
    """The placement with the lowest time factor (then memory factor); ties keep Megatron's contiguous."""
    loads = [expert_load(fractions, ep, k, capacity_factor) for k in placements]
    return min(loads, key=lambda x: (round(x.time_factor, 12), round(x.memory_factor, 12),
                                     x.placement != "contiguous"))


def loads_for(fractions: np.ndarray, eps, capacity_factor: float | None = None,
              placements: tuple[str, ...] = PLACEMENTS) -> dict[int, ExpertLoad]:
    """best_load for every distinct ep in ``eps``."""
    return {int(e): best_load(fractions, int(e), capacity_factor, placements) for e in np.unique(np.asarray(eps))}


def row_factors(loads: dict[int, ExpertLoad], ep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(time, memory) factor per plan row from its ep."""
    ep = np.asarray(ep).astype(int)
    t = np.array([loads[int(e)].time_factor for e in ep], dtype=float)
    m = np.array([loads[int(e)].memory_factor for e in ep], dtype=float)
    return t, m


def estimate_routed(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, time_factor, memory_factor,
                    **kw) -> dict[str, np.ndarray]:
    """``estimate_arrays`` with per-plan imbalance: step time and its parts at ``time_factor``, memory at
    ``memory_factor`` (each a scalar or one value per plan)."""
    out = estimate_arrays(model, cluster, plans, moe_imbalance=np.asarray(time_factor, dtype=float), **kw)
    if np.array_equal(np.asarray(time_factor), np.asarray(memory_factor)):
        return out
    mem = estimate_arrays(model, cluster, plans, moe_imbalance=np.asarray(memory_factor, dtype=float), **kw)
    out.update({k: mem[k] for k in MEMORY_KEYS})
    return out


def estimate_one_routed(model: ModelSpec, cluster: ClusterSpec, plan, load: ExpertLoad, **kw):
    """``estimate`` of one plan under ``load``: time at its time factor, memory at its memory factor."""
    from costmodel.estimate import estimate

    est = estimate(model, cluster, plan, moe_imbalance=load.time_factor, **kw)
    if load.memory_factor == load.time_factor:
        return est
    mem = estimate(model, cluster, plan, moe_imbalance=load.memory_factor, **kw)
    return est.model_copy(update={k: getattr(mem, k) for k in ("peak_memory_bytes", "memory_capacity_bytes",
                                                                "fits", "memory_breakdown_bytes")})
