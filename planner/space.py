"""The search space: every layout Megatron accepts for a model on a cluster, as columns of plans.

Degrees are powers of two (tp, cp, ep bounded by the NVLink domain / expert count), pp a divisor of the
layers, vpp a divisor of the layers per stage, dp what is left of the world size. Only plans that pass
every rule of ``costmodel.rules`` are returned; fitting in memory is the search's business. ``layout`` names
a layout in one short label ("tp8 pp4 vpp5 dp16").

Data-parallel sharding (``zero_stage``, ZERO_STAGES): every layout runs with Megatron's distributed
optimizer (ZeRO-1: optimizer states sharded over dp x cp), and layouts without pipeline parallelism and
with dp*cp > 1 also with Megatron-FSDP ``optim_grads_params`` (ZeRO-3: weights, gradients and optimizer
states sharded; weights gathered per layer for every micro-batch's forward and backward, gradients
reduce-scattered after every backward). Left out, on purpose:

* ZeRO-3 with pp > 1: megatron-core 0.16 rejects it (``costmodel.rules``, rule ``fsdp_pipeline``).
* ZeRO-3 with dp*cp = 1: nothing to shard over; the same plan as ZeRO-1.
* ZeRO-2 (``optim_grads``): Megatron-FSDP reduce-scatters the gradients after every backward
  (``megatron_fsdp.py``: "With gradient-sharding strategies, gradient reduction occurs on every backward
  propagation"), while ``costmodel.estimate`` prices ZeRO-2 gradient traffic like ZeRO-1's (once per
  step), which would make it look like memory for free; the layouts it would save fit under ZeRO-3 too.
* ZeRO-0 (no distributed optimizer): the same traffic as ZeRO-1 with more memory, never better.
"""

from __future__ import annotations

import itertools

import numpy as np

from costmodel.plan import RECOMPUTE_CODE, ParallelPlan, PlanArrays, data_parallel, layout_label, unequal_chunks
from costmodel.profiles import transformer_engine_runs
from costmodel.rules import divisors, selective_runs_as_priced, valid_mask
from costmodel.specs import ClusterSpec, ModelSpec

MICRO_BATCHES = (1, 2, 4, 8)
MAX_VPP = 16
ZERO_STAGES = (1, 3)
"""ZeRO stages the search enumerates (see the module docstring for why not 0 and 2)."""
FSDP_STAGE = 3


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def cp_degrees(model: ModelSpec) -> list[int]:
    """Context-parallel degrees searched: powers of two up to 8 keeping 1,024 tokens per rank, for sequences
    of 8k tokens or more; else 1."""
    return [c for c in pow2_upto(8) if model.seq_len // c >= 1024] if model.seq_len >= 8192 else [1]


def ep_degrees(model: ModelSpec) -> list[int]:
    """Expert-parallel degrees searched: powers of two that divide the routed experts (1 for dense models)."""
    return [e for e in pow2_upto(model.num_experts) if model.num_experts % e == 0] if model.is_moe else [1]


layout = layout_label
"""'tp2 pp1 dp256 fsdp' for a plan's fields (costmodel.plan.layout_label, which the executor shares)."""


def offload_searched(cluster: ClusterSpec) -> bool:
    """Whether the search tries activation offloading (recompute='offload'): where the GPU's host link is
    known (HardwareProfile.host_link_bandwidth_bytes_per_s)."""
    from costmodel.profiles import load_profile

    return load_profile(cluster.gpu).host_link_bandwidth_bytes_per_s is not None


def missing_host_fields(gpu: str) -> list[str]:
    """The host fields of GPU profile ``gpu`` that a CPU optimizer step streams through (host DRAM, host link)
    and the profile does not state."""
    from costmodel.profiles import load_profile

    prof = load_profile(gpu)
    return [k for k in ("host_memory_bandwidth_bytes_per_s", "host_link_bandwidth_bytes_per_s")
            if getattr(prof, k) is None]


def optimizer_offload_known(cluster: ClusterSpec) -> bool:
    """Whether a plan may keep its optimizer state in host memory (optimizer_offload): where the GPU's host DRAM
    bandwidth and host link are known. plan check offers it as a move; the search tries it only when asked
    (``plan --optimizer-offload F``: candidate_columns ``optimizer_offload``)."""
    return not missing_host_fields(cluster.gpu)


def recompute_modes(model: ModelSpec, cluster: ClusterSpec) -> tuple[str, ...]:
    """The recompute settings a search tries (before offloading): none, selective and full, selective only where
    megatron-core runs what the estimate prices (costmodel.rules.selective_runs_as_priced): on a dense model's
    Transformer Engine layers it frees nothing, and the plan would hold recompute none's memory."""
    sel = selective_runs_as_priced(model, "megatron-core", transformer_engine_runs(cluster))
    return ("none", "selective", "full") if sel else ("none", "full")


def candidate_columns(model: ModelSpec, cluster: ClusterSpec, global_batch: int,
                      micro_batches: tuple[int, ...] = MICRO_BATCHES,
                      recompute: tuple[str, ...] | None = None,
                      zero_stages: tuple[int, ...] = ZERO_STAGES,
                      optimizer_offload: float = 0.0) -> dict[str, np.ndarray]:
    """All combinations of degrees and knobs (before the rules); ZeRO stages >= 2 only where they shard
    something (dp*cp > 1) and Megatron-FSDP runs (pp = 1). ``recompute`` defaults to none, selective, full and,
    where the GPU's host link is known, offload (of all layers but the last; pp = 1 only, as megatron-core
    allows). ``optimizer_offload`` F > 0: every candidate keeps that share of its optimizer state in host memory
    (megatron-core --optimizer-cpu-offload --optimizer-offload-fraction F), so only sharded ones (ZeRO stage >= 1)
    are built."""
    if recompute is None:
        recompute = recompute_modes(model, cluster) + (("offload",) if offload_searched(cluster) else ())
    bad = sorted(set(zero_stages) - {0, 1, 2, 3})
    if bad or not zero_stages:
        from costmodel.profiles import InputError

        raise InputError(f"zero_stages {list(zero_stages)}: valid ZeRO stages are 0, 1, 2, 3 (at least one)")
    if not 0.0 <= optimizer_offload <= 1.0:
        from costmodel.profiles import InputError

        raise InputError(f"optimizer_offload {optimizer_offload}: a share from 0 to 1")
    if optimizer_offload > 0:
        zero_stages = tuple(z for z in zero_stages if z >= 1)
    n = cluster.num_gpus
    tps = [t for t in pow2_upto(min(cluster.domain_gpus, 16)) if n % t == 0]
    cps = cp_degrees(model)
    pps = [p for p in divisors(model.layers) if p <= 64 and n % p == 0]
    # Pipeline depths that do not divide the layers run with an uneven split (lighter edge stages,
    # Megatron's --decoder-first/last-pipeline-num-layers or pipeline_model_parallel_layout).
    uneven_pps = [p for p in pow2_upto(min(64, model.layers // 2)) if n % p == 0 and model.layers % p]
    eps = ep_degrees(model)
    rows = []
    for tp, cp, pp, ep in itertools.product(tps, cps, pps + uneven_pps, eps):
        if n % (tp * cp * pp):
            continue
        dp = data_parallel(n, tp, pp, cp)
        if ep > dp * cp * tp:
            continue
        uneven = model.layers % pp != 0
        per_stage = model.layers // pp
        if uneven:
            # Uneven splits are emitted as megatron-core layout strings, whose virtual stages may differ in
            # size: any vpp up to the layers per stage here; valid_plans keeps those that split the heaviest
            # stages of the solved split evenly.
            vpps = [v for v in range(1, MAX_VPP + 1) if per_stage >= v] if pp > 1 else [1]
        else:
            vpps = [v for v in divisors(per_stage) if v <= MAX_VPP] if pp > 1 else [1]
        zeros = [z for z in zero_stages if z < 2 or (pp == 1 and dp * cp > 1)]
        for vpp, mbs, rc, zero in itertools.product(vpps, micro_batches, recompute, zeros):
            if rc == "offload" and pp > 1:
                continue
            rows.append((tp, pp, vpp, dp, cp, ep, mbs, RECOMPUTE_CODE[rc], uneven, zero))
    names = ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "recompute", "uneven", "zero_stage")
    if not rows:
        return {k: np.zeros(0) for k in names}
    arr = np.array(rows, dtype=float)
    cols = dict(zip(names, arr.T))
    cols["uneven"] = cols["uneven"].astype(bool)
    cols["global_batch"] = np.full(len(arr), float(global_batch))
    cols["sp"] = cols["tp"] > 1
    cols["distributed_optimizer"] = cols["zero_stage"] >= 1
    if optimizer_offload > 0:
        cols["optimizer_offload"] = np.full(len(arr), float(optimizer_offload))
    return cols


def uneven_split(model: ModelSpec, cluster: ClusterSpec, pp: int, global_batch: int, vpp: int = 1,
                 tp: int | None = None, ep: int | None = None) -> tuple[int, ...]:
    """The exact min-max stage split for a pipeline depth that does not divide the layers, solved on a
    representative plan of that depth, tp and ep (the split depends on the edge-stage and dense-layer costs
    relative to a MoE layer, which tp and ep change; micro-batch and recompute barely do)."""
    from costmodel.split import best_split

    tp = tp or min(8, cluster.domain_gpus, cluster.num_gpus // pp)
    dp = data_parallel(cluster.num_gpus, tp, pp)
    if ep is None:
        ep = min(model.num_experts, 8) if model.is_moe and model.num_experts % 8 == 0 else 1
    rep = ParallelPlan(tp=tp, pp=pp, vpp=vpp, dp=dp, global_batch=global_batch, recompute="selective", ep=ep)
    return best_split(model, cluster, rep, memory=False).layers_per_stage


def valid_plans(model: ModelSpec, cluster: ClusterSpec, global_batch: int, **kw) -> PlanArrays:
    """Candidate plans that satisfy every Megatron rule, as PlanArrays (uneven pipeline splits carry
    their layers per stage in ``stage_layers``; even rows there are NaN)."""
    cols = candidate_columns(model, cluster, global_batch, **kw)
    if len(cols["tp"]) == 0:
        return PlanArrays.from_columns(0, global_batch=global_batch)
    mask_cols = {k: cols[k].astype(np.int64) for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch",
                                                      "global_batch", "zero_stage")}
    mask_cols["sequence_parallel"] = cols["sp"]
    mask_cols["uneven"] = cols["uneven"]
    ok = valid_mask(model, mask_cols, cluster.num_gpus)
    sel = {k: v[ok] for k, v in cols.items()}
    uneven = sel.pop("uneven")
    # The solved split of each uneven (pp, vpp, tp, ep), and the rows whose heaviest stages it would split into
    # unequal virtual chunks: the estimate prices a stage's total, the interleaved schedule runs at the pace of its
    # larger chunks (simulated with Megatron's interleaved 1F1B order, 126 layers on pp 16 at vpp 7, chunks of 2
    # and 1 layers: 6-10% slower than priced; costmodel/pipeline.py interleaved_schedule_s), so only vpp that split
    # the heaviest stages evenly are offered (lighter stages' smaller chunks cost nothing).
    splits, rows_of, drop = {}, {}, np.zeros(len(uneven), bool)
    keys = zip(sel["pp"][uneven], sel["vpp"][uneven], sel["tp"][uneven], sel["ep"][uneven])
    for key in sorted({tuple(int(x) for x in k) for k in keys}):
        pp, vpp, tp, ep = key
        split = uneven_split(model, cluster, pp, global_batch, vpp, tp=tp, ep=ep)
        rows = uneven & (sel["pp"] == pp) & (sel["vpp"] == vpp) & (sel["tp"] == tp) & (sel["ep"] == ep)
        if unequal_chunks(split, vpp):
            drop |= rows
        else:
            splits[key], rows_of[key] = split, rows
    keep = ~drop
    plans = PlanArrays.from_columns(int(keep.sum()), **{k: v[keep] for k, v in sel.items()})
    if splits:
        max_pp = int(plans.pp.max())
        sl = np.full((len(plans), max_pp), np.nan)
        for key, split in splits.items():
            pp, rows = key[0], rows_of[key][keep]
            sl[rows] = 0.0
            sl[np.ix_(rows, np.arange(pp))] = split
        plans.stage_layers = sl
    return plans
