"""Diagnose one plan: what is off in its predicted step, and which nearby plan would do better.

``diagnose(model, cluster, plan)`` estimates the plan, measures seven figures against the product
thresholds, and for every figure out of its band scores a small neighbourhood of alternative plans
(one vectorised ``estimate_arrays`` call over at most ``MAX_CANDIDATES`` plans) to propose the best
change that improves that figure:

=================  ===========================================================  ===============
kind               figure                                                        reported when
=================  ===========================================================  ===============
compute_efficiency achieved FLOP/s during compute (model FLOPs per GPU / the      < 60%
                   'compute' seconds) over the dense peak of the GEMM dtype
communication      exposed tp+cp+ep+pp+dp communication / step time               > 30% (warn)
stage_imbalance    slowest / fastest pipeline stage (per micro-batch)             > 1.2 (warn)
bubble             pipeline bubble / step time                                    > 5%; warn > 10%
memory_high        peak memory of the fullest stage / usable capacity             > 85% (warn)
memory_low         the same                                                       < 70% (info)
recompute_gap      peak memory the run holds with selective recompute where the   dense model on
                   stack cannot run it as priced (costmodel.rules                 Transformer
                   selective_runs_as_priced): recompute none's                    Engine (warn)
expert_imbalance   hottest expert rank's load over the mean (moe_imbalance)       > 1.2 (warn)
uneven_chunks      Megatron's interleaved schedule run op by op with the layout's  heaviest stages'
                   chunks (costmodel.pipeline.interleaved_schedule_s) over the     chunks unequal
                   closed form the estimate prices                                 (warn)
optimizer          the optimizer step after the last micro-batch / step time      > 4%; warn > 10%
                   (Adam through HBM; Muon's Newton-Schulz GEMMs on top)
rule_note          costmodel.rules.schedule_notes (launch settings)               always (info)
=================  ===========================================================  ===============

Compute efficiency and a bubble of 5-10% are soft bands: they are ``info`` unless a neighbouring
plan is predicted at least ``ACTIONABLE_GAIN`` (5%) faster while improving the figure, in which
case they are ``warn`` (the plan is not healthy if an obvious neighbour beats it). Compute
efficiency below 60% is common on its own (memory-bound kernels and attention count in the compute
time; MoE expert GEMMs are small), so it is only worth a warning when something nearby fixes it.

Every alternative passes ``costmodel.rules.violations`` with the cluster's GPU count and fits in
memory. The neighbourhood (each move combined with micro_batch /2, x1, x2 and the three recompute
modes): pp halved / doubled / the nearest valid depths with vpp adjusted (1, kept, doubled, same
number of virtual stages), every other vpp, tp x2 and /2, cp 1 / 2 / x2, ep x2 and /2 (MoE), each
with dp taking the rest of the GPUs; the other data-parallel sharding (none -> the distributed optimizer; Megatron-FSDP at pp 1 <-> the
distributed optimizer; a pp move off pp 1 leaves FSDP, which megatron-core runs only without pipeline
stages); plus, for the stage balance, the even split and splits with
one or two layers (in units of vpp) moved off the first and/or last stage.

Which alternative a finding proposes: the fastest one that fits and moves the finding's figure by at
least ``MIN_IMPROVEMENT`` (relative) the right way, preferring those at or under 85% memory. For the
performance figures (compute, communication, stage balance, bubble, memory_low) it must also be
faster than the plan; memory_high may cost time (it prefers plans at or under 85%). Suggestions stay
minimal: a structural move only comes with a micro_batch / recompute change when the move alone does
not fit. stage_imbalance only proposes splits; memory_low only a larger micro-batch and/or lighter
recompute. expert_imbalance proposes balancing the router and predicts the step at moe_imbalance=1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from costmodel.compute import gemm_dtype
from costmodel.estimate import estimate, estimate_arrays
from costmodel.pipeline import interleaved_schedule_s, pipeline_time_s
from costmodel.plan import (ParallelPlan, PlanArrays, chunk_layers, even_split, node_replicas,
                            unequal_chunks)
from costmodel.profiles import load_profile
from costmodel.rules import divisors, schedule_notes, selective_runs_as_priced, violations
from costmodel.specs import ClusterSpec, ModelSpec, StepEstimate

__all__ = ["Candidate", "Finding", "THRESHOLDS", "describe_change", "diagnose", "format_findings", "neighbours",
           "predict"]

FindingKind = Literal["compute_efficiency", "communication", "stage_imbalance", "bubble", "memory_high",
                      "recompute_gap", "memory_low", "expert_imbalance", "uneven_chunks", "optimizer", "rule_note"]

THRESHOLDS = {
    "compute_efficiency": 0.60,   # below: finding
    "communication": 0.30,        # above: warn
    "stage_imbalance": 1.20,      # max/min stage time above: warn
    "bubble_info": 0.05,          # above: info
    "bubble_warn": 0.10,          # above: warn
    "memory_high": 0.85,          # above: warn
    "memory_low": 0.70,           # below: info
    "expert_imbalance": 1.20,     # above: warn (MoE models)
    "optimizer_info": 0.04,       # above: info
    "optimizer_warn": 0.10,       # above: warn
}
ACTIONABLE_GAIN = 0.05
"""A soft-band finding becomes a warning when a neighbour is predicted this much faster (relative)."""
MIN_IMPROVEMENT = 0.02
"""An alternative must move the figure by at least this much (relative) to count as improving it."""
MAX_CANDIDATES = 200
"""Most alternative plans scored per diagnosis (one vectorised estimate call)."""
COMM_KEYS = ("tp_comm_exposed", "cp_comm_exposed", "ep_comm_exposed", "pp_comm_exposed", "dp_comm_exposed")

# The figure each kind is about: its key in ``predicted``, and whether lower is better.
FIGURE = {
    "compute_efficiency": ("compute_efficiency", False),
    "communication": ("comm_fraction", True),
    "stage_imbalance": ("stage_imbalance", True),
    "bubble": ("bubble_fraction", True),
    "memory_high": ("memory_fraction", True),
    "memory_low": ("memory_fraction", False),
    "expert_imbalance": ("moe_imbalance", True),
    "optimizer": ("optimizer_fraction", True),
}
_ORDER = ("memory_high", "recompute_gap", "bubble", "stage_imbalance", "uneven_chunks", "communication",
          "compute_efficiency", "optimizer", "expert_imbalance", "memory_low", "rule_note")


class Finding(BaseModel):
    """One thing the diagnosis found, with the change that helps and what it is predicted to do."""

    model_config = ConfigDict(frozen=True)

    kind: FindingKind
    """What was measured (see the module table)."""
    severity: Literal["info", "warn"]
    """warn: outside the healthy band (or a neighbour is much faster); info: worth knowing."""
    message: str
    """One line with the measured figure."""
    suggestion: str
    """The change that helps, e.g. 'pp 16 -> 8 with vpp 2' (or why none is proposed)."""
    predicted: dict[str, list[float]] = {}
    """Before/after of the figure and of step_time_s, e.g. {'bubble_fraction': [0.11, 0.06], ...}."""
    gain: float = 0.0
    """Relative step-time change of the suggestion (negative = faster); 0 when nothing is proposed."""
    alternative: ParallelPlan | None = None
    """The suggested plan (valid per costmodel.rules and fitting in memory), if any."""


# Figures ---------------------------------------------------------------------------------------------


class _Figures:
    """The diagnosed figures for a batch of plans (arrays, one entry per plan)."""

    def __init__(self, out: dict, plans: list[ParallelPlan], peak_flops: float):
        world = np.array([p.tp * p.pp * p.dp * p.cp for p in plans], dtype=float)
        step = np.asarray(out["step_time_s"], dtype=float)
        self.step = step
        with np.errstate(divide="ignore", invalid="ignore"):
            self.compute_efficiency = (np.asarray(out["model_flops_per_step"], dtype=float) / world
                                       / np.asarray(out["compute_s"]) / peak_flops)
            self.comm_fraction = sum(np.asarray(out[k + "_s"]) for k in COMM_KEYS) / step
            self.bubble_fraction = np.asarray(out["bubble_s"]) / step
            st = out["stage_time_s"]
            self.stage_imbalance = np.nanmax(st, axis=1) / np.nanmin(st, axis=1)
            self.memory_fraction = np.nanmax(out["peak_memory_bytes"], axis=1) / out["memory_capacity_bytes"]
            self.optimizer_fraction = np.asarray(out["optimizer_s"]) / step
        self.fits = np.asarray(out["fits"], dtype=bool)

    def get(self, name: str) -> np.ndarray:
        return getattr(self, name)


def _base_figures(est: StepEstimate, plan: ParallelPlan, peak_flops: float) -> dict[str, float]:
    b = est.breakdown_s
    world = plan.tp * plan.pp * plan.dp * plan.cp
    step = est.step_time_s
    return {
        "step_time_s": step,
        "compute_efficiency": est.model_flops_per_step / world / b["compute"] / peak_flops if b["compute"] > 0 else 0.0,
        "comm_fraction": sum(b[k] for k in COMM_KEYS) / step,
        "bubble_fraction": b["bubble"] / step,
        "stage_imbalance": max(est.stage_time_s) / min(est.stage_time_s),
        "memory_fraction": max(est.peak_memory_bytes) / est.memory_capacity_bytes,
        "optimizer_fraction": b["optimizer"] / step,
    }


# The neighbourhood -----------------------------------------------------------------------------------


def _make(base: ParallelPlan, **upd) -> ParallelPlan | None:
    if "recompute" in upd and upd["recompute"] != base.recompute:
        upd.setdefault("recompute_layers", None)
    if "pp" in upd and upd["pp"] != base.pp:
        upd.setdefault("layers_per_stage", None)
    if base.dist_opt_instances > 1 and "dist_opt_instances" not in upd:
        # Sharded inside replicas: keep the shard group's size where the new dp x cp still divides into it.
        group = base.shard_group
        dp_cp = upd.get("dp", base.dp) * upd.get("cp", base.cp)
        upd["dist_opt_instances"] = dp_cp // group if dp_cp % group == 0 and dp_cp >= group else 1
    try:
        return ParallelPlan(**{**base.model_dump(), **upd})
    except ValidationError:
        return None


def _edge_splits(model: ModelSpec, plan: ParallelPlan) -> list[tuple[int, ...]]:
    """The even split, and one or two layers (in units of vpp) moved off the first and/or last stage."""
    pp, unit = plan.pp, max(plan.vpp, 1)
    if pp < 2:
        return []
    base = list(even_split(model.layers, pp))
    out: list[tuple[int, ...]] = [tuple(base)]
    if pp == 2:
        for k in (-2, -1, 1, 2):
            a, b = base[0] - k * unit, base[1] + k * unit
            if a >= 0 and b >= 0:
                out.append((a, b))
        return out
    for off_first in (0, 1, 2):
        for off_last in (0, 1, 2):
            if off_first == off_last == 0:
                continue
            s = base.copy()
            s[0] -= off_first * unit
            s[-1] -= off_last * unit
            if s[0] < 0 or s[-1] < 0:
                continue
            moved = off_first + off_last
            for j in range(moved):
                s[1 + j % (pp - 2)] += unit
            out.append(tuple(s))
    return out


class Candidate(NamedTuple):
    """One alternative: the move it makes (family and index), and whether it keeps the base knobs."""

    family: str
    """knobs (micro_batch / recompute only), split, pp, vpp, tp, cp, ep, zero (data-parallel sharding) or replicas
    (the sharded state inside replicas, HSDP)."""
    move: int
    """Index of the structural move (candidates sharing it differ only in micro_batch / recompute)."""
    base_knobs: bool
    """The move alone: micro_batch and recompute as in the base plan."""
    plan: ParallelPlan


def neighbours(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
               limit: int = MAX_CANDIDATES) -> list[Candidate]:
    """Valid alternative plans near ``plan`` (per costmodel.rules with the cluster's GPU count).

    Structural moves (pp, vpp, tp, cp, ep, with dp taking the rest of the GPUs) are each combined
    with micro_batch /2, x1, x2 and every recompute mode; stage splits keep the other settings."""
    n = cluster.num_gpus
    tp, pp, vpp, cp, ep = plan.tp, plan.pp, plan.vpp, plan.cp, plan.ep

    def dp_for(t: int, p: int, c: int) -> int | None:
        rest = t * p * c
        return n // rest if n % rest == 0 else None

    moves: list[tuple[str, dict]] = [("knobs", {})]
    # Pipeline depth: halved, doubled, and the nearest valid depths on either side.
    cand_pp = {pp // 2 if pp % 2 == 0 else None, pp * 2}
    usable = [d for d in divisors(model.layers) if dp_for(tp, d, cp)]
    lower = [d for d in usable if d < pp]
    higher = [d for d in usable if d > pp]
    if lower:
        cand_pp.add(lower[-1])
    if higher:
        cand_pp.add(higher[0])
    for p2 in sorted(x for x in cand_pp if x and x != pp):
        dp2 = dp_for(tp, p2, cp)
        if dp2 is None or model.layers % p2:
            continue
        per = model.layers // p2
        vpps = {1, vpp, 2 * vpp, max(1, vpp * pp // p2), max(1, vpp * p2 // pp)} if p2 > 1 else {1}
        leave_fsdp = {"zero_stage": 1} if plan.zero_stage >= 2 and p2 > 1 else {}
        for v2 in sorted(v for v in vpps if per % v == 0 and v <= 16):
            moves.append(("pp", {"pp": p2, "vpp": v2, "dp": dp2, **leave_fsdp}))
    # Interleaving depth at the same pp.
    if pp > 1:
        counts = plan.layers_per_stage or even_split(model.layers, pp)
        g = int(np.gcd.reduce([c for c in counts if c > 0])) if any(counts) else 1
        for v2 in divisors(g):
            if v2 != vpp and v2 <= 16:
                moves.append(("vpp", {"vpp": v2}))
    # Tensor, context and expert parallelism, dp taking the rest.
    for t2 in (tp * 2, tp // 2 if tp % 2 == 0 else None):
        if t2 and t2 <= cluster.domain_gpus and (dp2 := dp_for(t2, pp, cp)):
            moves.append(("tp", {"tp": t2, "dp": dp2}))
    for c2 in sorted({1, 2, cp * 2} - {cp}):
        if (dp2 := dp_for(tp, pp, c2)):
            moves.append(("cp", {"cp": c2, "dp": dp2}))
    if model.is_moe:
        for e2 in (ep * 2, ep // 2 if ep % 2 == 0 else None):
            if e2:
                moves.append(("ep", {"ep": e2}))
        # The all-to-all hidden behind another micro-batch (--overlap-moe-expert-parallel-comm), or not.
        moves.append(("a2a overlap", {"moe_a2a_overlap": not plan.moe_a2a_overlap}))
    # Data-parallel sharding: none -> the distributed optimizer (ZeRO-1; for Muon the layer-wise one, which also
    # deals its Newton-Schulz iterations out); FSDP (ZeRO-3, pp 1 only) <-> the distributed optimizer.
    if plan.zero_stage == 0 and plan.dp * cp > 1:
        moves.append(("zero", {"zero_stage": 1, "distributed_optimizer": True}))
    if plan.zero_stage >= 2:
        moves.append(("zero", {"zero_stage": 1, "distributed_optimizer": True}))
    elif (dp1 := dp_for(tp, 1, cp)) and dp1 * cp > 1:
        moves.append(("zero", {"zero_stage": 3, "distributed_optimizer": True, "pp": 1, "vpp": 1, "dp": dp1}))
    # Sharded state inside replicas (HSDP with FSDP): shard groups of 1, 4, 16, ... nodes, of all of dp x cp, or
    # half / twice the present ones.
    if plan.zero_stage >= 1 and plan.dp * cp > 1:
        dp_cp, r = plan.dp * cp, plan.dist_opt_instances
        node = node_replicas(dp_cp, tp, cluster.gpus_per_node)
        for r2 in sorted({1, r * 2, r // 2, *(node // 4**k for k in range(8))} - {0, r}):
            if dp_cp % r2 == 0:
                moves.append(("replicas", {"dist_opt_instances": r2}))

    # The optimizer state in host memory (all of it), or back on the GPU, where the GPU's host is known.
    from planner.space import offload_searched, optimizer_offload_known, recompute_modes

    if plan.optimizer_offload:
        moves.append(("optimizer offload", {"optimizer_offload": 0.0}))
    elif plan.zero_stage >= 1 and optimizer_offload_known(cluster):
        moves.append(("optimizer offload", {"optimizer_offload": 1.0}))
    mbs = [m for m in (plan.micro_batch, plan.micro_batch * 2, plan.micro_batch // 2) if m >= 1]

    # Offloading (pp 1; violations() drops it elsewhere) where the GPU's host link is known.
    kinds = recompute_modes(model, cluster) + (("offload",) if offload_searched(cluster) else ())
    recs = [plan.recompute] + [r for r in kinds if r != plan.recompute]
    seen = {_key(plan)}
    out: list[Candidate] = []

    def add(family: str, move: int, base_knobs: bool, p: ParallelPlan | None) -> None:
        if p is None or len(out) >= limit:
            return
        k = _key(p)
        if k in seen:
            return
        seen.add(k)
        if violations(model, p, n):
            return
        out.append(Candidate(family, move, base_knobs, p))

    # Stage splits at the current settings first (few, and the only fix for an uneven split).
    if pp > 1:
        even = even_split(model.layers, pp)
        for j, s in enumerate(_edge_splits(model, plan)):
            lps = None if (s == even and model.layers % pp == 0) else s
            add("split", -1 - j, True, _make(plan, layers_per_stage=lps))
    for i, (family, upd) in enumerate(moves):
        for mb in mbs:
            for rc in recs:
                same = (mb, rc) == (plan.micro_batch, plan.recompute)
                add(family, i, same or family == "knobs", _make(plan, **upd, micro_batch=mb, recompute=rc))
    return out


def _key(p: ParallelPlan) -> tuple:
    return tuple(sorted(p.model_dump().items(), key=lambda kv: kv[0]))


# Text ------------------------------------------------------------------------------------------------


def _split_str(model: ModelSpec, p: ParallelPlan) -> str:
    s = p.layers_per_stage or even_split(model.layers, p.pp)
    return "/".join(str(x) for x in s)


def describe_change(model: ModelSpec, base: ParallelPlan, alt: ParallelPlan) -> str:
    """'pp 16 -> 8 with vpp 2, dp 8': the first changed setting in full, the others' new values."""
    changes: list[tuple[str, str, str]] = []
    for f in ("zero_stage", "pp", "tp", "cp", "ep", "vpp", "dp", "dist_opt_instances", "moe_a2a_overlap",
              "optimizer_offload", "micro_batch", "recompute", "recompute_layers"):
        a, b = getattr(base, f), getattr(alt, f)
        if a != b:
            changes.append((f, str(a), str(b)))
    sa, sb = _split_str(model, base), _split_str(model, alt)
    if base.pp == alt.pp and sa != sb:
        changes.append(("layers per stage", sa, sb))
    if not changes:
        return "no change"
    name, a, b = changes[0]
    head = f"{name} {a} -> {b}"
    rest = [f"{n} {v}" for n, _, v in changes[1:]]
    return head + (" with " + ", ".join(rest) if rest else "")


def _fmt_figure(name: str, v: float) -> str:
    if name in ("stage_imbalance", "moe_imbalance"):
        return f"{v:.2f}x"
    return f"{100 * v:.0f}%"


_FIGURE_LABEL = {"compute_efficiency": "compute efficiency", "comm_fraction": "exposed comm",
                 "bubble_fraction": "bubble", "stage_imbalance": "max/min stage", "memory_fraction": "memory",
                 "moe_imbalance": "expert load", "optimizer_fraction": "optimizer step"}


def format_findings(findings: Iterable[Finding]) -> list[str]:
    """One line per finding: '<message>: <suggestion>: <figure> a -> b, step -7%'."""
    lines = []
    for f in findings:
        line = f"{f.message}: {f.suggestion}"
        fig = FIGURE.get(f.kind)
        if fig and f.predicted and (f.alternative is not None or f.kind == "expert_imbalance"):
            name = fig[0]
            a, b = f.predicted[name]
            line += (f": {_FIGURE_LABEL[name]} {_fmt_figure(name, a)} -> {_fmt_figure(name, b)}, "
                     f"step {100 * f.gain:+.0f}%")
        lines.append(line)
    return lines


# Diagnosis -------------------------------------------------------------------------------------------


def predict(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, load=None, *, profile=None,
            moe_imbalance: float = 1.0) -> StepEstimate:
    """The plan's estimate: under the measured expert ``load`` (costmodel.routing.ExpertLoad) when there is one,
    else at ``moe_imbalance``. ``plan check`` computes it once and hands it to :func:`diagnose`."""
    if load is not None:
        from costmodel.routing import estimate_one_routed

        return estimate_one_routed(model, cluster, plan, load, profile=profile)
    return estimate(model, cluster, plan, profile=profile, moe_imbalance=moe_imbalance)


def diagnose(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
             moe_imbalance: float = 1.0, routing=None, placement: str = "contiguous", load=None,
             est: StepEstimate | None = None) -> list[Finding]:
    """Findings for one plan, warnings first. A plan inside every band gets infos only.

    The plan's own validity is not checked here (``plan check`` runs ``costmodel.rules.check_plan``
    first); every alternative it proposes is valid for ``cluster.num_gpus`` and fits in memory.
    ``moe_imbalance`` (hottest expert rank's load over the mean) scores the plan and every alternative.
    ``routing`` (a measured histogram, planner.routing.Routing) replaces it: the plan and every alternative
    get the load their ep and ``placement`` give, and the expert finding reports the measured load with the
    better placement or ep and the capacity factor that would bound it.
    ``load`` (the plan's load under ``routing`` and ``placement``) and ``est`` (:func:`predict` of the plan)
    are computed here unless the caller has them already.
    Cost: one ``estimate`` call (two with an expert imbalance) plus one vectorised call over at most MAX_CANDIDATES plans.
    """
    prof = load_profile(cluster.gpu)
    if routing is not None and model.is_moe:
        load = load if load is not None else routing.load(plan.ep, placement)
        moe_imbalance = load.time_factor
    else:
        load = None
    est = est if est is not None else predict(model, cluster, plan, load, profile=prof, moe_imbalance=moe_imbalance)
    d = _Diagnosis(model, cluster, plan, est, prof, neighbours(model, cluster, plan), routing, placement, load,
                   moe_imbalance)
    found = (_recompute_gap(model, cluster, plan, est, prof, load, moe_imbalance) + _uneven_chunks(plan, est)
             + d.memory() + d.pipeline()
             + d.communication() + d.compute() + d.optimizer() + d.experts())
    for note in schedule_notes(plan):
        found.append(Finding(kind="rule_note", severity="info", message="launch setting", suggestion=note))
    found.sort(key=lambda f: (f.severity != "warn", _ORDER.index(f.kind)))
    return found


def _recompute_gap(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, est: StepEstimate, prof, load,
                   moe_imbalance: float) -> list[Finding]:
    """Selective recomputation the stack cannot run as priced (costmodel.rules.selective_runs_as_priced: a dense
    model on megatron-core's Transformer Engine layers): the memory the run holds, which is recompute none's."""
    if plan.recompute != "selective" or selective_runs_as_priced(model, plan.framework,
                                                                 prof.runs_transformer_engine()):
        return []
    held = predict(model, cluster, plan.model_copy(update={"recompute": "none"}), load, profile=prof,
                   moe_imbalance=moe_imbalance)
    priced, holds = max(est.peak_memory_bytes), max(held.peak_memory_bytes)
    cap = est.memory_capacity_bytes
    return [Finding(kind="recompute_gap", severity="warn",
                    message=f"selective recompute: on a dense model's Transformer Engine layers megatron-core "
                            f"recomputes the attention core only (--recompute-modules core_attn; the LayerNorms "
                            f"are fused into the GEMMs), so the run holds {holds / 1e9:.1f} GB, not the "
                            f"{priced / 1e9:.1f} GB priced (capacity {cap / 1e9:.1f} GB)",
                    suggestion="--recompute none prices what runs; full recompute or offloading frees activations "
                               "megatron-core can free",
                    predicted={"peak_memory_bytes": [priced, holds]})]


def _uneven_chunks(plan: ParallelPlan, est: StepEstimate) -> list[Finding]:
    """An interleaved plan whose heaviest stages split into unequal chunks (an explicit split; the planner offers
    none): the estimate prices each stage's total, the schedule runs at the pace of its larger chunks. The slowdown
    is the op-by-op schedule over the closed form for chunk times from the estimate's stages: a layer's time where
    the stages hold layers only (the middle ranks' median per layer), the rest of an edge stage's time (embedding
    on the first chunk, output layer and loss on the last) on its edge chunk; backward twice the forward."""
    if plan.pp <= 1 or plan.layers_per_stage is None or not unequal_chunks(plan.layers_per_stage, plan.vpp):
        return []
    lps = [int(n) for n in plan.layers_per_stage]
    heaviest = max(lps)
    chunks = np.array(chunk_layers(lps, plan.vpp), dtype=float)
    m = plan.num_microbatches
    stage_s = np.asarray(est.stage_time_s, dtype=float)
    per = stage_s / np.maximum(np.asarray(lps, dtype=float), 1.0)
    per_layer = float(np.median(per[1:-1])) if plan.pp > 2 else float(per.min())
    extra = np.maximum(stage_s - per_layer * np.asarray(lps, dtype=float), 0.0)
    fwd = chunks * per_layer / 3.0
    fwd[0, 0] += extra[0] / 3.0
    fwd[-1, -1] += extra[-1] / 3.0
    stage = 3.0 * fwd.sum(axis=1)[None, :]
    closed = float(pipeline_time_s(stage, np.ones_like(stage), m, plan.vpp)[0][0])
    slow = interleaved_schedule_s(fwd, 2.0 * fwd, m) / closed - 1.0
    even = [v for v in divisors(heaviest) if 1 < v <= min(lps)] or [1]
    pattern = "/".join(str(int(x)) for x in chunks[lps.index(heaviest)])
    return [Finding(kind="uneven_chunks", severity="warn",
                    message=f"vpp {plan.vpp} splits the heaviest stages' {heaviest} layers into unequal chunks "
                            f"({pattern}): Megatron's interleaved schedule runs them about {100 * slow:.0f}% "
                            f"slower than the estimate prices",
                    suggestion=f"vpp {', '.join(map(str, even))} splits them evenly",
                    predicted={"schedule_over_priced": [1.0, 1.0 + slow]})]


class _Diagnosis:
    """The plan's figures, its neighbourhood scored in one vectorised call, and one method per group of findings."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, est: StepEstimate, prof,
                 cands: list[Candidate], routing, placement: str, load, moe_imbalance: float):
        self.model, self.cluster, self.plan, self.est, self.prof = model, cluster, plan, est, prof
        self.routing, self.placement, self.load, self.moe_imbalance = routing, placement, load, moe_imbalance
        self.dtype = gemm_dtype(model.precision)
        self.peak = prof.peak(self.dtype)
        self.base = _base_figures(est, plan, self.peak)
        self.step0 = self.base["step_time_s"]
        self.cands = cands
        self.fams = [c.family for c in cands]
        self.alts = [c.plan for c in cands]
        self.figs = None
        if self.alts:
            arrays = PlanArrays.from_plans([p.with_even_split(model.layers) for p in self.alts])
            if load is not None:
                out = routing.scorer(placement)(model, cluster, arrays, profile=prof, framework=plan.framework)
            else:
                out = estimate_arrays(model, cluster, arrays, profile=prof, framework=plan.framework,
                                      moe_imbalance=moe_imbalance)
            self.figs = _Figures(out, self.alts, self.peak)
            # Keep suggestions minimal: a structural move changes micro_batch / recompute too only when the
            # move alone does not fit (or is not valid).
            alone_fits = {c.move for c, fit in zip(cands, self.figs.fits) if c.base_knobs and fit}
            self.minimal = np.array([c.base_knobs or c.move not in alone_fits for c in cands], dtype=bool)
            self.safe_mem = self.figs.memory_fraction <= THRESHOLDS["memory_high"]

    def best(self, kind: str, *, mask: np.ndarray | None = None, must_be_faster: bool = True,
             extra: Callable[[np.ndarray], np.ndarray] | None = None,
             prefer: Callable[[np.ndarray], np.ndarray] | None = None) -> int | None:
        """Index of the fastest fitting alternative that improves the kind's figure."""
        figs = self.figs
        if figs is None:
            return None
        name, lower_better = FIGURE[kind]
        v, v0 = figs.get(name), self.base[name]
        ok = figs.fits & self.minimal & np.isfinite(figs.step) & np.isfinite(v)
        ok &= (v <= v0 * (1 - MIN_IMPROVEMENT)) if lower_better else (v >= v0 * (1 + MIN_IMPROVEMENT))
        if mask is not None:
            ok &= mask
        if must_be_faster:
            ok &= figs.step < self.step0
        if extra is not None:
            ok &= extra(v)
        if prefer is not None and (ok & prefer(v)).any():
            ok &= prefer(v)
        elif prefer is None and (ok & self.safe_mem).any():
            ok &= self.safe_mem    # a suggestion should not trade its finding for a memory warning
        if not ok.any():
            return None
        return int(np.argmin(np.where(ok, figs.step, np.inf)))

    def finding(self, kind: str, severity: str, message: str, idx: int | None, none_text: str) -> Finding:
        name, _ = FIGURE[kind]
        base, step0 = self.base, self.step0
        if idx is None:
            return Finding(kind=kind, severity=severity, message=message, suggestion=none_text,
                           predicted={name: [base[name], base[name]], "step_time_s": [step0, step0]})
        alt = self.alts[idx]
        after_step = float(self.figs.step[idx])
        return Finding(kind=kind, severity=severity, message=message,
                       suggestion=describe_change(self.model, self.plan, alt),
                       predicted={name: [base[name], float(self.figs.get(name)[idx])],
                                  "step_time_s": [step0, after_step]},
                       gain=after_step / step0 - 1.0, alternative=alt)

    def soft(self, idx: int | None) -> str:
        """Soft bands warn only when the suggestion is much faster and itself inside the memory band."""
        if idx is None or not self.safe_mem[idx]:
            return "info"
        return "warn" if self.figs.step[idx] / self.step0 - 1.0 <= -ACTIONABLE_GAIN else "info"

    def memory(self) -> list[Finding]:
        """Memory first: it decides whether the plan runs at all."""
        est, plan, gb = self.est, self.plan, 1e9
        mem = self.base["memory_fraction"]
        i_stage = int(np.argmax(est.peak_memory_bytes))
        used = f"{max(est.peak_memory_bytes) / gb:.1f} of {est.memory_capacity_bytes / gb:.1f} GB on stage {i_stage}"
        if mem > THRESHOLDS["memory_high"]:
            what = "does not fit" if not est.fits else "risk of OOM / fragmentation"
            idx = self.best("memory_high", must_be_faster=False, prefer=lambda v: v <= THRESHOLDS["memory_high"])
            return [self.finding("memory_high", "warn", f"memory {100 * mem:.0f}% of capacity ({used}): {what}", idx,
                                 "no neighbouring plan fits" if not est.fits else
                                 "no neighbouring plan needs less memory")]
        if mem < THRESHOLDS["memory_low"]:
            # Only the knobs the finding is about: a larger micro-batch and/or lighter recompute.
            rc = {"none": 0, "selective": 1, "offload": 1.5, "full": 2}   # lighter first
            more = np.array([c.family == "knobs" and c.plan.micro_batch >= plan.micro_batch
                             and rc[c.plan.recompute] <= rc[plan.recompute] for c in self.cands], dtype=bool)
            idx = self.best("memory_low", mask=more, extra=lambda v: v <= THRESHOLDS["memory_high"])
            return [self.finding("memory_low", "info",
                                 f"memory {100 * mem:.0f}% of capacity ({used}): room for a larger micro-batch "
                                 f"or less recompute", idx,
                                 "no larger micro-batch or lighter recompute nearby is faster")]
        return []

    def pipeline(self) -> list[Finding]:
        """The bubble and the stage balance (pp > 1)."""
        est, plan, step0, found = self.est, self.plan, self.step0, []
        bub = self.base["bubble_fraction"]
        if bub > THRESHOLDS["bubble_info"] and plan.pp > 1:
            idx = self.best("bubble")
            sev = "warn" if bub > THRESHOLDS["bubble_warn"] else self.soft(idx)
            found.append(self.finding("bubble", sev, f"bubble {100 * bub:.0f}% of the step "
                                                     f"({est.breakdown_s['bubble']:.2f} of {step0:.2f} s)", idx,
                                      "no neighbouring plan has a smaller bubble and a shorter step"))
        imb = self.base["stage_imbalance"]
        if plan.pp > 1 and imb > THRESHOLDS["stage_imbalance"]:
            st = est.stage_time_s
            idx = self.best("stage_imbalance", mask=np.array([f == "split" for f in self.fams], dtype=bool))
            found.append(self.finding("stage_imbalance", "warn",
                                      f"pipeline stages differ by {100 * (imb - 1):.0f}% (stage {int(np.argmax(st))} "
                                      f"{1e3 * max(st):.1f} ms vs stage {int(np.argmin(st))} {1e3 * min(st):.1f} ms "
                                      f"per micro-batch; layers per stage {_split_str(self.model, plan)})", idx,
                                      "no neighbouring split is more even and faster"))
        return found

    def communication(self) -> list[Finding]:
        comm = self.base["comm_fraction"]
        if not comm > THRESHOLDS["communication"]:
            return []
        parts = sorted(((self.est.breakdown_s[k] / self.step0, k.split("_")[0]) for k in COMM_KEYS), reverse=True)
        top = ", ".join(f"{k} {100 * v:.0f}%" for v, k in parts if v >= 0.01)
        idx = self.best("communication")
        return [self.finding("communication", "warn", f"exposed communication {100 * comm:.0f}% of the step ({top})",
                             idx, "no neighbouring plan exposes less communication and is faster")]

    def compute(self) -> list[Finding]:
        eff, peak = self.base["compute_efficiency"], self.peak
        if not eff < THRESHOLDS["compute_efficiency"]:
            return []
        idx = self.best("compute_efficiency")
        return [self.finding("compute_efficiency", self.soft(idx),
                             f"compute at {100 * eff:.0f}% of the {self.dtype} dense peak ({eff * peak / 1e12:.0f} of "
                             f"{peak / 1e12:.0f} TFLOP/s per GPU while computing)", idx,
                             "no neighbouring plan computes more efficiently and faster")]

    def optimizer(self) -> list[Finding]:
        """The optimizer step (Adam's pass over its state; Muon's Newton-Schulz GEMMs, dealt out over the
        data-parallel ranks only by the distributed optimizer)."""
        frac = self.base["optimizer_fraction"]
        if not frac > THRESHOLDS["optimizer_info"]:
            return []
        idx = self.best("optimizer")
        sev = "warn" if frac > THRESHOLDS["optimizer_warn"] else self.soft(idx)
        what = "Muon's Newton-Schulz iterations and the state update" if self.model.optimizer == "muon" \
            else "the state update"
        return [self.finding("optimizer", sev, f"optimizer step {100 * frac:.0f}% of the step "
                                               f"({self.est.breakdown_s['optimizer']:.2f} of {self.step0:.2f} s: "
                                               f"{what})", idx,
                             "no neighbouring plan has a shorter optimizer step and a shorter step")]

    def experts(self) -> list[Finding]:
        """The measured expert load (with routing), or the assumed moe_imbalance of an MoE model."""
        model, cluster, plan, step0, figs = self.model, self.cluster, self.plan, self.step0, self.figs
        if self.load is not None:
            faster = [(self.alts[i], float(figs.step[i])) for i in range(len(self.alts))
                      if figs.fits[i] and self.minimal[i] and figs.step[i] < step0] if figs else []
            return [_routing_finding(model, cluster, plan, self.routing, self.placement, self.load, step0, self.prof,
                                     faster)]
        imb = self.moe_imbalance
        if not (model.is_moe and imb > THRESHOLDS["expert_imbalance"]):
            return []
        bal = estimate(model, cluster, plan, profile=self.prof, moe_imbalance=1.0)
        return [Finding(kind="expert_imbalance", severity="warn",
                        message=f"hottest expert rank gets {imb:.2f}x the mean token load (ep={plan.ep}, "
                                f"{model.num_experts} experts, top-{model.moe_topk})",
                        suggestion="balance the router (auxiliary load-balancing loss or aux-loss-free expert bias)",
                        predicted={"moe_imbalance": [imb, 1.0], "step_time_s": [step0, bal.step_time_s]},
                        gain=bal.step_time_s / step0 - 1.0)]


# Measured routing ------------------------------------------------------------------------------------


CAPACITY_FACTOR_HINT = 1.25
"""Capacity factor quoted when none is set (Megatron-LM MoE examples use 1.0-1.25)."""


def _routing_finding(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, routing, placement: str, load,
                     step0: float, prof, faster: list[tuple[ParallelPlan, float]]) -> Finding:
    """The measured expert load of the plan, and the better placement or expert-parallel degree if any."""
    from costmodel.routing import dropped_fraction, estimate_one_routed, expert_load, top_share

    f0 = load.time_factor
    E = model.num_experts
    k = max(1, E // 16)
    msg = (f"routing histogram: hottest EP rank gets {f0:.2f}x the mean token load per layer (worst layer "
           f"{load.worst_layer}: {load.worst_layer_factor:.2f}x; {load.memory_factor:.2f}x over the layers, which "
           f"sets the memory peak) with ep={plan.ep} and {placement} placement; the {k} hottest of {E} experts get "
           f"{100 * top_share(routing.fractions, k):.0f}% of the routed tokens")
    if load.capacity_factor is not None:
        msg += f"; capacity factor {load.capacity_factor:g} drops {100 * load.dropped_fraction:.1f}% of them"
    options: list[tuple[float, float, str, ParallelPlan | None]] = []   # (step, factor, text, alternative)
    best = routing.load(plan.ep)
    if best.placement != placement and best.time_factor < f0 * (1 - MIN_IMPROVEMENT):
        step = estimate_one_routed(model, cluster, plan, best, profile=prof).step_time_s
        options.append((step, best.time_factor, f"place experts by load ({best.placement}: permute the experts of "
                                                f"the checkpoint)", None))
    ep_opts = []
    for alt, step in faster:
        f1 = routing.load(alt.ep, placement).time_factor
        if alt.ep != plan.ep and f1 < f0 * (1 - MIN_IMPROVEMENT):
            ep_opts.append((step, f1, describe_change(model, plan, alt), alt))
    if ep_opts:
        options.append(min(ep_opts, key=lambda o: o[0]))
    cap_text = ""
    if load.capacity_factor is None:
        capped = expert_load(routing.fractions, plan.ep, placement, CAPACITY_FACTOR_HINT)
        cap_text = (f"; a capacity factor of {CAPACITY_FACTOR_HINT:g} would cap the hottest rank at "
                    f"{capped.time_factor:.2f}x the balanced load but drop "
                    f"{100 * dropped_fraction(routing.fractions, CAPACITY_FACTOR_HINT):.1f}% of routed tokens")
    severity = "warn" if f0 > THRESHOLDS["expert_imbalance"] else "info"
    if options:
        step, f1, text, alt = min(options, key=lambda o: o[0])
        if step < step0:
            return Finding(kind="expert_imbalance", severity=severity, message=msg, suggestion=f"{text}{cap_text}",
                           predicted={"moe_imbalance": [f0, f1], "step_time_s": [step0, step]},
                           gain=step / step0 - 1.0, alternative=alt)
    if severity == "info":
        return Finding(kind="expert_imbalance", severity="info", message=msg,
                       suggestion=f"none needed: within {100 * (THRESHOLDS['expert_imbalance'] - 1):.0f}% of "
                                  f"balanced routing",
                       predicted={"moe_imbalance": [f0, f0], "step_time_s": [step0, step0]})
    bal = estimate(model, cluster, plan, profile=prof, moe_imbalance=1.0)
    return Finding(kind="expert_imbalance", severity=severity, message=msg,
                   suggestion=f"balance the router (auxiliary load-balancing loss or aux-loss-free expert bias)"
                              f"{cap_text}",
                   predicted={"moe_imbalance": [f0, 1.0], "step_time_s": [step0, bal.step_time_s]},
                   gain=bal.step_time_s / step0 - 1.0)
