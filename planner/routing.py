"""Measured MoE routing in the planner: read a routing histogram, and search ep, expert tp and the expert
placement under the load it implies (the load model is ``costmodel/routing.py``).

File formats (``--routing FILE``):

* JSON with the key ``moe_routing_histogram``: a list with one entry per MoE layer, each a list with one
  token count per expert (ints summed over a run) -- what the executor writes into a run's summary.json;
  other keys are ignored. A directory is read as DIR/summary.json.
* a bare JSON list of per-expert counts (applied to every MoE layer), or a list of such lists;
* YAML or JSON with fractions instead of counts, bare or under the same key.

Each layer is normalised to shares of its routed slots, so counts, fractions of slots and fractions of
tokens (summing to top-k) mean the same. The histogram needs the model's expert count and either one row or
one row per MoE layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from costmodel.plan import PlanArrays
from costmodel.profiles import InputError, parse_json, parse_yaml, read_text
from costmodel.routing import (PLACEMENTS, ExpertLoad, best_load, capacity_to_drop_none, estimate_routed,
                               expert_fractions, expert_load, row_factors, top_share)
from costmodel.rules import valid_mask
from costmodel.specs import ClusterSpec, ModelSpec
from planner.search import SearchResult, exhaustive, ranked, to_plan
from planner.space import valid_plans

HISTOGRAM_KEY = "moe_routing_histogram"
MAX_ETP = 8


def _read(path: Path):
    text = read_text(path, "routing histogram")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return parse_yaml(text, path)
    if suffix == ".json":
        return parse_json(text, path)
    try:
        return parse_json(text, path)
    except InputError:
        pass
    try:
        return parse_yaml(text, path)
    except InputError:
        raise InputError(f"{path}: neither JSON nor YAML") from None


@dataclass
class Routing:
    """A routing histogram for one model, with the capacity factor and placements to consider."""

    path: str
    fractions: np.ndarray
    """(layers, experts) shares of each layer's routed slots."""
    capacity_factor: float | None = None
    placements: tuple[str, ...] = PLACEMENTS
    _cache: dict = field(default_factory=dict, repr=False)

    def load(self, ep: int, placement: str | None = None) -> ExpertLoad:
        """The load at ``ep`` with ``placement`` (None: the best of ``placements``)."""
        key = (int(ep), placement)
        if key not in self._cache:
            self._cache[key] = (best_load(self.fractions, int(ep), self.capacity_factor, self.placements)
                                if placement is None else
                                expert_load(self.fractions, int(ep), placement, self.capacity_factor))
        return self._cache[key]

    def factors(self, ep: np.ndarray, placement: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        loads = {int(e): self.load(int(e), placement) for e in np.unique(np.asarray(ep).astype(int))}
        return row_factors(loads, ep)

    def scorer(self, placement: str | None = None):
        """estimate_arrays with each row's imbalance from its ep (for searches and estimate_hetero)."""
        def score(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, **kw) -> dict:
            t, m = self.factors(plans.ep, placement)
            return estimate_routed(model, cluster, plans, t, m, **kw)
        return score

    def cost(self, model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays) -> dict:
        """A planner.search CostFn."""
        return self.scorer()(model, cluster, plans)

    def summary(self) -> dict:
        E = self.fractions.shape[1]
        return {"file": self.path, "layers": int(self.fractions.shape[0]), "experts": int(E),
                "top_share": {str(k): top_share(self.fractions, k) for k in sorted({1, max(1, E // 16), max(1, E // 8)})},
                "capacity_factor_to_drop_none": capacity_to_drop_none(self.fractions),
                "capacity_factor": self.capacity_factor}


def load_routing(path: str, model: ModelSpec, *, capacity_factor: float | None = None,
                 placements: tuple[str, ...] = PLACEMENTS) -> Routing:
    """Read and check a routing histogram for ``model`` (one-line InputError on anything wrong)."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.exists():
        raise InputError(f"{p}: routing histogram file not found")
    if not model.is_moe:
        raise InputError(f"{p}: --routing needs a MoE model but {model.name} has no routed experts")
    if capacity_factor is not None and not capacity_factor > 0:
        raise InputError(f"--capacity-factor {capacity_factor}: must be > 0 (e.g. 1.0-2.0)")
    data = _read(p)
    where = "(top level)"
    if isinstance(data, dict):
        if HISTOGRAM_KEY not in data:
            keys = ", ".join(repr(k) for k in sorted(map(str, data))[:8]) or "none"
            raise InputError(f"{p}: no field '{HISTOGRAM_KEY}' (keys: {keys}); expected a list per MoE layer of "
                             f"token counts per expert")
        data, where = data[HISTOGRAM_KEY], HISTOGRAM_KEY
    try:
        fractions = expert_fractions(data)
    except ValueError as exc:
        raise InputError(f"{p}: field '{where}': {exc}") from None
    n_layers, E = fractions.shape
    if E != model.num_experts:
        raise InputError(f"{p}: field '{where}': the histogram has {E} experts per layer but {model.name} has "
                         f"{model.num_experts} routed experts; record it on the same model")
    if n_layers not in (1, model.moe_layers):
        raise InputError(f"{p}: field '{where}': the histogram has {n_layers} layers but {model.name} has "
                         f"{model.moe_layers} MoE layers; valid: 1 (applied to every MoE layer) or {model.moe_layers}")
    return Routing(str(p), fractions, capacity_factor, placements)


# Search --------------------------------------------------------------------------------------------------


def expert_space(model: ModelSpec, cluster: ClusterSpec, global_batch: int, **space_kw) -> PlanArrays:
    """Valid plans with expert tensor parallelism added: every valid plan at each etp (powers of two up to
    the NVLink domain and MAX_ETP) that Megatron's expert grid and the expert width accept. ``space_kw``
    narrows the base space (``planner.space.candidate_columns`` keywords, e.g. zero_stages=(1,))."""
    base = valid_plans(model, cluster, global_batch, **space_kw)
    etps = [t for t in (1, 2, 4, 8) if t <= min(MAX_ETP, cluster.domain_gpus)] if model.is_moe else [1]
    n = len(base)
    idx = np.tile(np.arange(n), len(etps))
    etp = np.repeat(np.asarray(etps, dtype=float), n)
    cols = {k: getattr(base, k)[idx] for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch")}
    uneven = (np.zeros(len(idx), bool) if base.stage_layers is None else ~np.isnan(base.stage_layers[idx, 0]))
    mask_cols = {k: v.astype(np.int64) for k, v in cols.items()}
    mask_cols.update(etp=etp.astype(np.int64), sequence_parallel=base.sp[idx], uneven=uneven)
    ok = valid_mask(model, mask_cols, cluster.num_gpus)
    keep = idx[ok]
    out = PlanArrays(**{k: v[keep].copy() for k, v in base.__dict__.items() if k != "stage_layers"},
                     stage_layers=None if base.stage_layers is None else base.stage_layers[keep])
    out.etp = etp[ok]
    return out


@dataclass
class RoutedSearch:
    """A search under a routing histogram, and what balanced routing would have chosen."""

    result: SearchResult
    routing: Routing
    balanced_best: int
    """Index (into result.plans) of the plan that is best under balanced routing."""
    balanced_scores: dict = field(default_factory=dict, repr=False)
    """The same plans scored with balanced routing."""

    def load_of(self, i: int) -> ExpertLoad:
        return self.routing.load(int(self.result.plans.ep[i]))

    def balanced_step_s(self, i: int) -> float:
        return float(self.balanced_scores["step_time_s"][i])


def routed_search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, routing: Routing,
                  **space_kw) -> RoutedSearch:
    """Score the expert space (ep, etp, placement per ep) under the histogram (the exhaustive strategy with the
    routed cost function, ``Routing.cost``); also score it balanced."""
    plans = expert_space(model, cluster, global_batch, **space_kw)
    res = exhaustive(model, cluster, global_batch, routing.cost, plans=plans)
    if res.evaluated == 0:
        return RoutedSearch(res, routing, -1)
    balanced = estimate_routed(model, cluster, plans, 1.0, 1.0)
    return RoutedSearch(res, routing, int(ranked(plans, balanced).order[0]), balanced)


def routing_lines(rs: RoutedSearch) -> list[str]:
    """What the histogram did to the search, for people."""
    res, r = rs.result, rs.routing
    i = int(res.order[0])
    load = rs.load_of(i)
    plan = res.plan(0)
    cont = r.load(plan.ep, "contiguous")
    s = r.summary()
    E = s["experts"]
    tops = ", ".join(f"top {k}: {100 * v:.0f}%" for k, v in s["top_share"].items())
    lines = [f"routing histogram {r.path}: {s['layers']} layer(s) x {E} experts; share of routed tokens on the "
             f"hottest experts {tops}; capacity factor to drop nothing {s['capacity_factor_to_drop_none']:.2f}"]
    place = (f"{load.placement} placement (contiguous: {cont.time_factor:.2f}x)" if load.placement != "contiguous"
             else "contiguous placement (Megatron default)")
    lines.append(f"best plan ep{plan.ep} etp{plan.etp} with {place}: hottest EP rank {load.time_factor:.2f}x the mean "
                 f"token load per layer, {load.memory_factor:.2f}x over the layers (memory); step "
                 f"{res.scores['step_time_s'][i]:.3f} s vs {rs.balanced_step_s(i):.3f} s with balanced routing")
    if load.capacity_factor is not None:
        lines.append(f"capacity factor {load.capacity_factor:g} drops {100 * load.dropped_fraction:.1f}% of routed "
                     f"tokens")
    j = rs.balanced_best
    if j != i:
        q = to_plan(res.plans, j)
        after = ("does not fit in memory" if not res.scores["fits"][j] else
                 f"takes {res.scores['step_time_s'][j]:.3f} s")
        lines.append(f"under balanced routing the best plan would be tp{q.tp} pp{q.pp} dp{q.dp} ep{q.ep} etp{q.etp} "
                     f"({rs.balanced_step_s(j):.3f} s); with this routing it {after}")
    else:
        lines.append("the histogram does not change the best layout (balanced routing picks the same)")
    return lines
