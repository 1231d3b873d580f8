"""One definition of a parallel plan: ``ParallelPlan`` (one layout and its training knobs), ``PlanArrays``
(the same plans as columns, for the vectorised cost model) and every value derived from a plan's degrees:
the data-parallel degree when it is not given, the number of micro-batches, Megatron's even layer split,
the default global batch, and the Megatron-LM layout flags of a split.

Nothing else in the house derives these; it calls the functions here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, model_validator

from costmodel.specs import Count, Count0, Framework, FrozenSpec, RecomputeMode

RECOMPUTE_CODE = {"none": 0, "selective": 1, "full": 2, "offload": 3}
"""Activation recomputation as the integer code of PlanArrays.recompute."""
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODE.items()}
"""The inverse of RECOMPUTE_CODE."""


def _floor_div_at_least_1(a, b):
    q = a // b
    return np.maximum(q, 1) if isinstance(q, np.ndarray) else max(int(q), 1)


def data_parallel(num_gpus, tp, pp=1, cp=1):
    """The data-parallel degree that fills ``num_gpus`` with tp x pp x cp model replicas' ranks (at least 1).
    Ints or equally long arrays."""
    return _floor_div_at_least_1(num_gpus, tp * pp * cp)


def num_microbatches(global_batch, dp, micro_batch):
    """Micro-batches per step and data-parallel rank, as megatron-core's ``num_microbatches_calculator``
    computes them (global batch // (dp x micro-batch), at least 1). Ints or equally long arrays."""
    return _floor_div_at_least_1(global_batch, dp * micro_batch)


def even_split(layers: int, pp: int) -> tuple[int, ...]:
    """Megatron's default split: layers / pp on every stage. A remainder (only for layer counts the rules
    reject, or imported runs) goes one each to the stages after the first."""
    return tuple(int(x) for x in even_split_columns(int(layers), np.array([int(pp)]), int(pp))[0])


def even_split_columns(layers: int, pp: np.ndarray, max_pp: int) -> np.ndarray:
    """:func:`even_split` of many plans at once (the rules reject a remainder).

    Returns an (n_plans, max_pp) array of transformer layers per stage, zero-padded past pp.
    """
    pp = np.asarray(pp, dtype=int)
    idx = np.arange(max_pp)[None, :]
    per = layers // pp
    rem = layers - per * pp
    counts = np.where(idx < pp[:, None], per[:, None], 0)
    # Any remainder (only for plans the rules reject or uneven imports) goes to the middle stages.
    counts = counts + np.where((idx >= 1) & (idx < 1 + rem[:, None]), 1, 0)
    return counts.astype(float)


def default_global_batch(seq_len: int, num_gpus: int) -> int:
    """About 4M tokens per step (Llama 3 pre-training used 4M-16M): a power of two times the odd part of
    the GPU count, so that data-parallel sizes of such clusters (576 = 9 x 64 GPUs) divide it."""
    odd = num_gpus
    while odd % 2 == 0:
        odd //= 2
    target = max(1.0, (4 * 2**20) / seq_len / odd)
    return int(odd * 2 ** max(0, round(np.log2(target))))


class ParallelPlan(FrozenSpec):
    """One Megatron-style parallel layout and its training knobs."""

    tp: Count = 1
    """Tensor-parallel degree."""
    pp: Count = 1
    """Pipeline-parallel degree (stages)."""
    vpp: Count = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B); 1 = plain 1F1B."""
    dp: Count = 1
    """Data-parallel degree."""
    cp: Count = 1
    """Context-parallel degree (sequence split across ranks for attention)."""
    ep: Count = 1
    """Expert-parallel degree (MoE layers)."""
    etp: Count = 1
    """Expert tensor-parallel degree (MoE layers)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism with tp (all-gather / reduce-scatter instead of all-reduce)."""
    micro_batch: Count = 1
    """Micro-batch size (sequences per micro-batch per dp rank)."""
    global_batch: Count
    """Global batch size (sequences per optimizer step)."""
    recompute: RecomputeMode = "selective"
    """What saves activation memory: nothing (none), recomputation of the attention core and element-wise
    kernels (selective) or of whole layers (full), or offloading layers' activations to host memory (offload:
    megatron-core --cpu-offloading; pp 1 only, without recomputation)."""
    recompute_layers: Count0 | None = None
    """With full recompute: layers per stage recomputed (None = all). With offload: layers whose activations
    go to host memory (None = all but the last, the most megatron-core allows)."""
    distributed_optimizer: bool = True
    """Megatron distributed optimizer (ZeRO-1 style optimizer-state sharding over dp x cp)."""
    zero_stage: Literal[0, 1, 2, 3] = 1
    """ZeRO stage: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters (FSDP)."""
    dist_opt_instances: Count = 1
    """Replicas of the sharded data-parallel state (megatron-core --num-distributed-optimizer-instances; HSDP /
    FSDP HYBRID_SHARD's replicate degree): optimizer states (and with zero_stage 2 / 3 gradients / weights) are
    sharded over dp x cp / dist_opt_instances neighbouring ranks and replicated this many times, the replicas
    all-reducing their gradient shards; 1 = sharded over all of dp x cp."""
    optimizer_offload: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of this rank's optimizer state (fp32 master weights and Adam moments) kept in host memory and
    stepped by the CPU: megatron-core --optimizer-cpu-offload --optimizer-offload-fraction (its
    HybridDeviceOptimizer), DeepSpeed ZeRO-Offload (offload_optimizer to cpu: 1.0). 0 = all on the GPU."""
    moe_a2a_overlap: bool = False
    """Overlap each MoE layer's expert-parallel all-to-all with another micro-batch's computation (megatron-core
    --overlap-moe-expert-parallel-comm, the combined 1F1B schedule: in the steady phase the forward of one
    micro-batch runs merged with the backward of another, so one's dispatch / combine hides behind the other's
    compute). Needs ep > 1, interleaving when pp > 1 and no full recompute (costmodel/rules.py)."""
    layers_per_stage: tuple[int, ...] | None = None
    """Transformer layers on each pipeline stage (uneven splits); None = even split."""
    rank_order: str = "tp-cp-ep-dp-pp"
    """Order of degrees in the rank layout, innermost first (Megatron's default)."""
    framework: Framework = "megatron-core"
    """Which framework generation runs the plan (sets overlap behaviour)."""

    @model_validator(mode="after")
    def _check(self) -> ParallelPlan:
        if self.layers_per_stage is not None and len(self.layers_per_stage) != self.pp:
            raise ValueError(
                f"layers_per_stage has {len(self.layers_per_stage)} entries but pp={self.pp}"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return num_microbatches(self.global_batch, self.dp, self.micro_batch)

    @property
    def shard_group(self) -> int:
        """Data-parallel ranks (of dp x cp) one copy of the sharded state is split over."""
        return self.dp * self.cp // self.dist_opt_instances

    def with_even_split(self, layers: int) -> ParallelPlan:
        """This plan with its split written out (``layers_per_stage`` as :func:`even_split` fills it)."""
        if self.layers_per_stage is not None:
            return self
        return self.model_copy(update={"layers_per_stage": even_split(layers, self.pp)})


@dataclass
class PlanArrays:
    """Columns of candidate plans, one entry per plan (the vectorised form of ParallelPlan)."""

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    sp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    distributed_optimizer: np.ndarray
    zero_stage: np.ndarray
    dist_opt_instances: np.ndarray
    moe_a2a_overlap: np.ndarray
    optimizer_offload: np.ndarray | None = None
    stage_layers: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.optimizer_offload is None:
            self.optimizer_offload = np.zeros(len(self.tp))

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def num_microbatches(self) -> np.ndarray:
        return num_microbatches(self.global_batch, self.dp, self.micro_batch)

    @classmethod
    def from_columns(cls, n: int | None = None, **cols) -> PlanArrays:
        n = n or max(np.size(v) for v in cols.values())
        defaults = dict(tp=1, pp=1, vpp=1, dp=1, cp=1, ep=1, etp=1, sp=True, micro_batch=1, global_batch=1,
                        recompute=1, recompute_layers=-1, distributed_optimizer=True, zero_stage=1,
                        dist_opt_instances=1, moe_a2a_overlap=False, optimizer_offload=0.0)
        out = {}
        for f in fields(cls):
            if f.name == "stage_layers":
                out[f.name] = cols.get("stage_layers")
                continue
            v = cols.get(f.name, defaults[f.name])
            dtype = bool if f.name in ("sp", "distributed_optimizer", "moe_a2a_overlap") else float
            out[f.name] = np.broadcast_to(np.asarray(v, dtype=dtype), (n,)).copy()
        return cls(**out)

    @classmethod
    def from_plans(cls, plans: list[ParallelPlan]) -> PlanArrays:
        cols = {name: [getattr(p, name) for p in plans] for name in
                ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "micro_batch", "global_batch",
                 "distributed_optimizer", "zero_stage", "dist_opt_instances", "moe_a2a_overlap",
                 "optimizer_offload")}
        cols["sp"] = [p.sequence_parallel and p.tp > 1 for p in plans]
        cols["recompute"] = [RECOMPUTE_CODE[p.recompute] for p in plans]
        cols["recompute_layers"] = [-1 if p.recompute_layers is None else p.recompute_layers for p in plans]
        arrays = cls.from_columns(len(plans), **cols)
        if any(p.layers_per_stage for p in plans):
            max_pp = max(p.pp for p in plans)
            sl = np.zeros((len(plans), max_pp))
            for i, p in enumerate(plans):
                if p.layers_per_stage:
                    sl[i, : p.pp] = p.layers_per_stage
                else:
                    sl[i] = np.nan
            arrays.stage_layers = sl
        return arrays

    def plan(self, i: int, *, split: bool = True) -> ParallelPlan:
        """Row ``i`` as a ParallelPlan, with its uneven stage split (``stage_layers``) when it has one and
        ``split`` is set."""
        rl = self.recompute_layers[i]
        plan = ParallelPlan(tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]), dp=int(self.dp[i]),
                            cp=int(self.cp[i]), ep=int(self.ep[i]), etp=int(self.etp[i]),
                            sequence_parallel=bool(self.sp[i]), micro_batch=int(self.micro_batch[i]),
                            global_batch=int(self.global_batch[i]), recompute=RECOMPUTE_NAMES[int(self.recompute[i])],
                            recompute_layers=None if rl < 0 else int(rl),
                            distributed_optimizer=bool(self.distributed_optimizer[i]),
                            zero_stage=int(self.zero_stage[i]),
                            dist_opt_instances=int(self.dist_opt_instances[i]),
                            moe_a2a_overlap=bool(self.moe_a2a_overlap[i]),
                            optimizer_offload=float(self.optimizer_offload[i]))
        sl = self.stage_layers
        if split and sl is not None and not np.isnan(sl[i, 0]):
            plan = plan.model_copy(update={"layers_per_stage": tuple(int(x) for x in sl[i, : plan.pp])})
        return plan


def node_replicas(dp_cp: int, tp: int, gpus_per_node: int) -> int:
    """Replicas (dist_opt_instances) when the sharded state is split inside one node: the dp x cp ranks of
    gpus_per_node / tp GPUs each (rank order tp first), all of dp x cp at most."""
    return dp_cp // min(dp_cp, max(1, gpus_per_node // max(tp, 1)))


ZERO_TAGS = {2: "zero2", 3: "fsdp"}
"""The short tag of a ZeRO stage in a layout label (none for the distributed optimizer, ZeRO-1)."""


def layout_label(p: Mapping) -> str:
    """'tp2 pp1 dp256 fsdp' for a plan's fields (``ParallelPlan.model_dump()`` or a plan row): the degrees above 1
    (tp, pp, dp always), the sharding when it is ZeRO-2 or FSDP, and 'optim-cpu' (or 'optim-cpu50%') where the
    optimizer state is (partly) in host memory."""
    parts = [f"tp{p['tp']}", f"pp{p['pp']}"]
    if p["vpp"] > 1:
        parts.append(f"vpp{p['vpp']}")
    parts.append(f"dp{p['dp']}")
    for k in ("cp", "ep", "etp"):
        if p.get(k, 1) > 1:
            parts.append(f"{k}{p[k]}")
    if p.get("zero_stage", 1) in ZERO_TAGS:
        parts.append(ZERO_TAGS[p["zero_stage"]])
    off = offload_tag(float(p.get("optimizer_offload") or 0.0))
    return " ".join(parts + ([off] if off else []))


def offload_tag(share: float) -> str:
    """'optim-cpu' (all of the optimizer state in host memory), 'optim-cpu50%' (a share of it), '' (none)."""
    return "" if share <= 0 else ("optim-cpu" if share >= 1 else f"optim-cpu{share:.0%}")


def plan_label(plan: ParallelPlan) -> str:
    """A plan in one short line: its layout (``layout_label``), micro-batch, recompute."""
    return f"{layout_label(plan.model_dump())} mb{plan.micro_batch} {plan.recompute}"



# Megatron-LM layout flags of a split ----------------------------------------------------------------------
#
# Megatron sources (github.com/NVIDIA/Megatron-LM):
# * megatron/core/transformer/pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout.parse_str_to_list /
#   __init__ / validate_layer_layout: the --pipeline-model-parallel-layout string. Virtual stages are separated
#   by "|"; each holds E (embedding), t (transformer layer), m (MTP layer), L (loss); commas are cosmetic;
#   "x*n" repeats one character and "(...)*n" a group. The string lists pp*vpp virtual stages in layer order:
#   entry k = vpp_rank * pp + pp_rank. E must open the first virtual stage and L close the last, each once.
# * megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ (uneven PP) and
#   megatron/training/arguments.py: --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
#   must be > 0 and divisible by vpp, and the remaining layers are split evenly over the middle stages.


def _check_split(layers_per_stage: Sequence[int], vpp: int, multiples: bool = True) -> tuple[int, ...]:
    lps = tuple(int(x) for x in layers_per_stage)
    if not lps:
        raise ValueError("layers_per_stage is empty")
    if vpp < 1:
        raise ValueError(f"vpp={vpp} must be >= 1")
    if any(x < 0 for x in lps):
        raise ValueError(f"layers_per_stage={lps} has negative counts")
    bad = [i for i, x in enumerate(lps) if x % vpp] if multiples else []
    if bad:
        raise ValueError(f"layers_per_stage={lps}: stages {bad} are not multiples of vpp={vpp}")
    return lps


def chunk_layers(layers_per_stage: Sequence[int], vpp: int) -> list[list[int]]:
    """Decoder layers of each pipeline rank's ``vpp`` model chunks as :func:`megatron_layout` writes them: as even
    as possible, later chunks taking the remainder, except on the last rank, whose last chunk also holds the
    output layer and loss (its earlier chunks take it).

    >>> chunk_layers((7, 8, 8, 7), 4)
    [[1, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 1]]
    """
    pp = len(layers_per_stage)
    out = []
    for r, n in enumerate(layers_per_stage):
        base, rem = divmod(int(n), vpp)
        out.append([base + (1 if (v < rem if r == pp - 1 else v >= vpp - rem) else 0) for v in range(vpp)])
    return out


def unequal_chunks(layers_per_stage: Sequence[int], vpp: int) -> bool:
    """Whether ``vpp`` model chunks split the heaviest stages' layers unequally (the interleaved schedule then runs
    at the pace of their larger chunks, slower than the closed form of costmodel/pipeline.py prices)."""
    return vpp > 1 and max(int(n) for n in layers_per_stage) % vpp != 0


def megatron_layout(layers_per_stage: Sequence[int], vpp: int = 1, *, compact: bool = True, mtp: int = 0) -> str:
    """megatron-core's ``--pipeline-model-parallel-layout`` string for a split.

    Each pipeline rank's layers are divided over its ``vpp`` model chunks as evenly as possible (later
    chunks take the remainder, except on the last rank, whose last chunk also holds the output layer and loss:
    there the earlier chunks take it, so that no chunk outweighs the others' and stalls the interleaved
    schedule; megatron-core's layout allows unequal virtual stages); the string lists
    the pp*vpp virtual stages in layer order (chunk v of rank r is entry v*pp + r), ``E`` opening
    the first and ``mtp`` MTP modules ``m`` and ``L`` closing the last. With ``compact``, a stage's layers are written ``t*n``
    and runs of equal stages ``(...|)*k``; otherwise every layer is one ``t``. Quote it for a shell.

    >>> megatron_layout((7, 8, 8, 7))
    'Et*7|t*8|t*8|t*7L'
    >>> megatron_layout((2, 4), vpp=2)
    'Et|t*2|t|t*2L'
    """
    lps = _check_split(layers_per_stage, vpp, multiples=False)
    pp = len(lps)
    total = pp * vpp
    chunks = chunk_layers(lps, vpp)
    stages = []
    for k in range(total):
        v, r = divmod(k, pp)
        n = chunks[r][v]
        body = "t" * n if not compact or n < 2 else f"t*{n}"
        stages.append(("E" if k == 0 else "") + body + ("m" * mtp + "L" if k == total - 1 else ""))
    if not compact:
        return "|".join(stages)
    runs: list[list] = []
    for s in stages:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    parts: list[str] = []
    for i, (s, c) in enumerate(runs):
        last = i == len(runs) - 1
        reps = c - 1 if last else c            # the final stage is written without a trailing '|'
        if reps >= 3:
            parts.append(f"({s}|)*{reps},")
        else:
            parts.append(f"{s}|" * reps)
        if last:
            parts.append(s)
    return "".join(parts).rstrip(",")


_LAYOUT_CHARS = set("ELtm")


LAYOUT_MAX_CHARS = 1_000_000
"""Longest layout string read once unrolled: a million layer characters is far beyond any model, and a
repeat count such as ``t*99999999999999999999`` would otherwise be built in memory."""


def unroll_layout(text: str) -> str:
    """``(...)*n`` then ``x*n`` unrolled, as megatron-core's ``parse_str_to_list`` does; a ValueError when that
    would exceed LAYOUT_MAX_CHARS characters."""
    grown = [len(text)]

    def repeat(part: str, times: str) -> str:
        n = int(times) if len(times) < 10 else LAYOUT_MAX_CHARS + 1
        grown[0] += len(part) * (n - 1)
        if grown[0] > LAYOUT_MAX_CHARS:
            raise ValueError(f"layout repeats {part!r} {times} times: more than {LAYOUT_MAX_CHARS:,} layers")
        return part * n

    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: repeat(x.group(1), x.group(2)), text)
    return re.sub(r"(.)\*(\d+)", lambda x: repeat(x.group(1), x.group(2)), text)


def parse_megatron_layout(s: str, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Transformer layers per pipeline rank of a ``--pipeline-model-parallel-layout`` string.

    Parsed as megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list`` does (commas
    dropped, ``(...)*n`` then ``x*n`` unrolled, ``|`` between virtual stages), then checked like
    ``__init__`` / ``validate_layer_layout``: pp*vpp virtual stages, ``E`` first and ``L`` last,
    each exactly once. Rank r holds virtual stages r, r+pp, ..., r+(vpp-1)*pp; its chunks may hold
    different numbers of layers (only their total is returned). ``m`` (MTP) layers are not counted.
    """
    text = unroll_layout(s.strip().replace(",", ""))
    stages = text.split("|")
    bad = sorted({ch for ch in text if ch not in _LAYOUT_CHARS | {"|"}})
    if bad:
        raise ValueError(f"layout {s!r} has invalid characters {bad}; valid: E, L, t, m, |")
    if len(stages) != pp * vpp:
        raise ValueError(
            f"layout {s!r} has {len(stages)} virtual stages but pp={pp} * vpp={vpp} = {pp * vpp}"
        )
    flat = text.replace("|", "")
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise ValueError(f"layout {s!r}: the embedding 'E' must come first, exactly once")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise ValueError(f"layout {s!r}: the loss 'L' must come last, exactly once")
    return tuple(sum(stages[v * pp + r].count("t") for v in range(vpp)) for r in range(pp))


FIRST_FLAG = "--decoder-first-pipeline-num-layers"
LAST_FLAG = "--decoder-last-pipeline-num-layers"


def uneven_flags(layers_per_stage: Sequence[int]) -> list[str] | None:
    """Megatron-LM's uneven-split flags for a split, or None if they cannot express it.

    ``[]`` for an even split (no flags needed); ``[FIRST_FLAG, "N"]`` and/or ``[LAST_FLAG, "M"]``
    when only the first and/or last stage differs from the equal middle stages; None when the
    middle stages differ or an edge stage that differs is empty (Megatron requires both flags to be
    > 0; use :func:`megatron_layout` then). With pp == 2 only the first-stage flag is used (the
    last stage takes the rest). Divisibility by vpp is the caller's (the split's) business.
    """
    lps = _check_split(layers_per_stage, 1)
    pp = len(lps)
    if len(set(lps)) == 1:
        return []
    if pp == 2:
        if min(lps) == 0:
            return None
        return [FIRST_FLAG, str(lps[0])]
    middle = lps[1:-1]
    if len(set(middle)) != 1:
        return None
    mid = middle[0]
    flags: list[str] = []
    if lps[0] != mid:
        if lps[0] == 0:
            return None
        flags += [FIRST_FLAG, str(lps[0])]
    if lps[-1] != mid:
        if lps[-1] == 0:
            return None
        flags += [LAST_FLAG, str(lps[-1])]
    return flags
