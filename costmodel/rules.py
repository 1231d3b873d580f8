"""Megatron-core (0.16) validity rules for a parallel plan against a model and a cluster size.

Pure functions only: no torch, no megatron import, no module state. Every rule is written once,
as a numpy-broadcasting predicate over the plan's degrees, and used both by the scalar checker
(:func:`violations` / :func:`check_plan`) and by the vectorised planner mask (:func:`valid_mask`),
so the two cannot drift apart.

Each violation message names every degree involved with its value and says what would be valid,
e.g. ``"tp=3 does not divide heads=64; valid tp: 1, 2, 4, 8, 16, 32, 64"``.

Sources (paths are in github.com/NVIDIA/Megatron-LM, megatron-core 0.16 / main):

* world size = tp*pp*dp*cp: ``megatron/training/arguments.py`` ``validate_args``
  ("world size ... is not divisible by total_model_size") and
  ``megatron/core/parallel_state.py`` ``initialize_model_parallel``.
* expert grid: ``parallel_state.initialize_model_parallel`` builds a second rank grid
  world = etp*ep*edp*pp and raises unless world % (etp*ep*pp) == 0, i.e. ep*etp | tp*cp*dp.
  The same function asserts that a rank order that is not pp-last needs edp == dp.
* heads % tp, num_query_groups vs tp: ``megatron/core/transformer/transformer_config.py``
  ``TransformerConfig.__post_init__``.
* experts % ep, ep > 1 only for MoE: ``validate_args`` ("Number of experts should be a multiple
  of expert model parallel_size") and ``TransformerConfig.__post_init__``.
* MoE with tp > 1 needs sequence parallelism: ``megatron/training/yaml_arguments.py``
  ("When using MoE and tensor parallelism, sequence parallelism must be used") and
  ``megatron/core/model_parallel_config.py`` ``ModelParallelConfig.__post_init__``
  (ep > 1 and tp > 1 without sequence_parallel: "must be used for training").
* seq_len % (2*cp): ``validate_args`` ("seq-length should be a multiple of 2 *
  context-parallel-size"), the load-balanced causal split into 2*cp chunks.
* sequence parallel scatters the (per-cp-rank) sequence over tp ranks, so seq_len/cp % tp == 0.
* layers % pp, per-stage % vpp, uneven first/last stages: ``validate_args`` and
  ``TransformerConfig.__post_init__`` (num_layers_in_first/last_pipeline_stage,
  pipeline_model_parallel_layout).
* vpp needs pp > 1 (pp > 2 without p2p overlap): ``validate_args``.
* interleaved schedule and the number of micro-batches: see :func:`_ok_interleaved_microbatches`.
* global_batch % (dp*micro_batch): ``megatron/core/num_microbatches_calculator.py``
  ``ConstantNumMicroBatchesCalculator``.
* full recompute layers between 1 and layers per pipeline rank: ``TransformerConfig.__post_init__``.
* Megatron-FSDP (zero_stage 2/3 = ``--use-megatron-fsdp`` with ``optim_grads`` / ``optim_grads_params``)
  needs pp == 1: megatron-core 0.16.1 ``distributed/fsdp/mcore_fsdp_adapter.py`` ``_init_dist_index``
  builds its device mesh with ``_get_dp_tp_mesh``, ``einops.rearrange(torch.arange(world_size),
  "(dp_cp ep tp) -> ep dp_cp tp", ...)`` (``_get_hsdp_tp_mesh`` likewise ``(outer_fsdp_dp fsdp tp)``),
  i.e. the whole world must be dp*cp x tp ranks; a pipeline stage has no place in it.

* dist_opt_instances (``--num-distributed-optimizer-instances``) divides dp*cp and the expert data-parallel size:
  ``parallel_state.initialize_model_parallel`` and its expert grid; it replicates a sharded state, so it needs
  one (``distributed_data_parallel.py``: "Partial DistOpt cannot be used without DistOpt"); with
  Megatron-FSDP it needs ep == 1 (``mcore_fsdp_adapter.py`` builds no expert mesh for HSDP).

* optimizer_offload (``--optimizer-cpu-offload --optimizer-offload-fraction``) runs with
  ``--use-precision-aware-optimizer``, which asserts the distributed optimizer (megatron-core 0.16.1
  ``optimizer/optimizer_config.py``); DeepSpeed's ``offload_optimizer`` is a ZeRO option.

* moe_a2a_overlap (``--overlap-moe-expert-parallel-comm``): ``TransformerConfig.__post_init__`` (megatron-core
  0.16.1 transformer_config.py) asserts ep > 1, a virtual pipeline when pp > 1, no full recomputation, a bf16 or
  fp16 model and at most one MTP layer, which needs pp > 1.

Rules that are not Megatron's but the planner's own consistency (zero_stage vs
distributed_optimizer, recompute_layers only with full recompute) are marked as such.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.memory import FULL_PRECISION
from costmodel.profiles import InputError
from costmodel.plan import ParallelPlan, even_split, num_microbatches
from costmodel.specs import ModelSpec

__all__ = [
    "PlanError",
    "a2a_overlap_violations",
    "check_plan",
    "divisors",
    "schedule_notes",
    "valid_mask",
    "valid_values",
    "violations",
]

DEGREES = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp")
"""The parallel degrees, named as in Megatron."""

MASK_KEYS = (*DEGREES, "micro_batch", "global_batch", "sequence_parallel", "uneven", "zero_stage")
"""Columns :func:`valid_mask` reads (missing ones take the ParallelPlan defaults)."""

RANK_ORDER_TOKENS = ("tp", "cp", "ep", "dp", "pp")
# Python's garbage collector off, run by hand every this many steps on every rank at once (Megatron-LM --manual-gc
# --manual-gc-interval: "Manual garbage collection helps to align the timing of the collection across ranks which
# mitigates the impact of CPU-associated jitters"). NVIDIA's Megatron-Bridge performance recipes, whose runs the
# shipped profiles are fitted to, set manual_gc=True and manual_gc_interval=100 for every benchmark
# (scripts/performance recipes' _benchmark_common); the planner's flags and the executor do the same.
MANUAL_GC_INTERVAL_STEPS = 100
"""Tokens Megatron's RankGenerator accepts in a rank order string."""


class PlanError(InputError):
    """A parallel plan that Megatron-core would reject: all violations in one line."""


# Helpers ------------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n`` in increasing order (empty for n < 1)."""
    n = int(n)
    if n < 1:
        return []
    if n > 1 << 32:
        # Trial division to sqrt(n) would take minutes for a file's num_hidden_layers of 2**62; SymPy
        # factorises (Pollard rho) instead.
        from sympy import divisors as factored_divisors

        return [int(d) for d in factored_divisors(n)]
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def valid_values(candidates: Iterable[int], ok: Callable[[int], bool]) -> list[int]:
    """The candidates (sorted, unique) for which ``ok`` holds."""
    return sorted({int(c) for c in candidates if ok(int(c))})


def common_divisors(*numbers: int) -> list[int]:
    """Divisors shared by all ``numbers``."""
    g = 0
    for x in numbers:
        g = int(np.gcd(g, int(x)))
    return divisors(g)


def nearest_multiples(value: int, step: int) -> list[int]:
    """The multiples of ``step`` just below and above ``value`` (positive only)."""
    lo = (value // step) * step
    hi = lo + step
    return [m for m in (lo, hi) if m > 0 and m != value] or [step]


def _fmt(values: Iterable[int], limit: int = 24) -> str:
    vals = list(values)
    if not vals:
        return "none"
    if len(vals) > limit:
        head = ", ".join(str(v) for v in vals[: limit - 1])
        return f"{head}, ..., {vals[-1]}"
    return ", ".join(str(v) for v in vals)


# Column view shared by the scalar and vectorised paths -------------------------------------


@dataclass(frozen=True)
class _Cols:
    """Plan degrees as ints (scalar path) or equally long int arrays (vectorised path)."""

    tp: Any
    pp: Any
    vpp: Any
    dp: Any
    cp: Any
    ep: Any
    etp: Any
    micro_batch: Any
    global_batch: Any
    sequence_parallel: Any
    zero_stage: Any = 1

    @property
    def num_microbatches(self) -> Any:
        """Megatron's micro-batches per step, as ParallelPlan.num_microbatches computes it."""
        return num_microbatches(self.global_batch, self.dp, self.micro_batch)

    @property
    def sp_active(self) -> Any:
        """Sequence parallelism is only in effect with tp > 1 (Megatron turns it off at tp=1)."""
        return np.logical_and(self.sequence_parallel, self.tp > 1)


def _scalar_cols(plan: ParallelPlan) -> _Cols:
    return _Cols(
        tp=plan.tp,
        pp=plan.pp,
        vpp=plan.vpp,
        dp=plan.dp,
        cp=plan.cp,
        ep=plan.ep,
        etp=plan.etp,
        micro_batch=plan.micro_batch,
        global_batch=plan.global_batch,
        sequence_parallel=bool(plan.sequence_parallel),
        zero_stage=plan.zero_stage,
    )


# The rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    name: str
    applies: Callable[[ModelSpec], bool]
    """Model-level gate: the rule only exists for such models (e.g. MoE-only rules)."""
    ok: Callable[[ModelSpec, _Cols, int | None, bool], Any]
    """Predicate (broadcasting): model, columns, num_gpus, kv_head_replication."""
    message: Callable[[ModelSpec, _Cols, int | None, bool], str]
    """One-line explanation for a scalar plan where ``ok`` is False."""
    even_split_only: bool = False
    """Only checked when the plan has no explicit layers_per_stage."""
    needs_num_gpus: bool = False
    """Only checked when num_gpus is given."""


def _always(_: ModelSpec) -> bool:
    return True


def _is_moe(m: ModelSpec) -> bool:
    return m.is_moe


def _is_dense(m: ModelSpec) -> bool:
    return not m.is_moe


def _is_mla(m: ModelSpec) -> bool:
    return m.mla_kv_lora_rank is not None


def _has_dense_ffn(m: ModelSpec) -> bool:
    return m.moe_layers < m.layers


def _shared_ffn(m: ModelSpec) -> int:
    return m.shared_experts * m.expert_ffn


# world size


def _ok_world(m, c, n, kv):
    return c.tp * c.pp * c.dp * c.cp == n


def _msg_world(m, c, n, kv):
    prod = c.tp * c.pp * c.dp * c.cp
    other = c.tp * c.pp * c.cp
    if n % other == 0:
        hint = f"valid dp for tp={c.tp}, pp={c.pp}, cp={c.cp}: {n // other}"
    else:
        hint = (
            f"no dp works for tp={c.tp}, pp={c.pp}, cp={c.cp} because tp*pp*cp={other} "
            f"does not divide num_gpus={n}; valid tp*pp*cp: {_fmt(divisors(n))}"
        )
    return (
        f"tp*pp*dp*cp = tp={c.tp} * pp={c.pp} * dp={c.dp} * cp={c.cp} = {prod} "
        f"but num_gpus={n}; {hint}"
    )


# expert grid (parallel_state.initialize_model_parallel)


def _ok_expert_grid(m, c, n, kv):
    return (c.tp * c.cp * c.dp) % (c.ep * c.etp) == 0


def _msg_expert_grid(m, c, n, kv):
    dense = c.tp * c.cp * c.dp
    ok_ep = valid_values(divisors(dense), lambda e: dense % (e * c.etp) == 0)
    ok_etp = valid_values(divisors(dense), lambda t: dense % (c.ep * t) == 0)
    return (
        f"ep={c.ep} * etp={c.etp} = {c.ep * c.etp} does not divide "
        f"tp={c.tp} * cp={c.cp} * dp={c.dp} = {dense} (Megatron's expert grid is "
        f"world = etp*ep*edp*pp); valid ep for etp={c.etp}: {_fmt(ok_ep)}; "
        f"valid etp for ep={c.ep}: {_fmt(ok_etp)}"
    )


# attention heads


def _ok_heads(m, c, n, kv):
    return m.heads % c.tp == 0


def _msg_heads(m, c, n, kv):
    return f"tp={c.tp} does not divide heads={m.heads}; valid tp: {_fmt(divisors(m.heads))}"


def _ok_kv_heads(m, c, n, kv):
    g = m.kv_head_count
    ok = g % c.tp == 0
    if kv:
        ok = np.logical_or(ok, c.tp % g == 0)
    return ok


def _msg_kv_heads(m, c, n, kv):
    g = m.kv_head_count
    if kv:
        valid = valid_values(divisors(m.heads), lambda t: g % t == 0 or t % g == 0)
        what = "neither divides nor is a multiple of"
    else:
        valid = divisors(g)
        what = "does not divide"
    return (
        f"tp={c.tp} {what} kv_heads={g} (Megatron splits the key/value head groups across "
        f"tensor-parallel ranks); valid tp: {_fmt(valid)}"
    )


# FFN widths


def _ok_ffn(m, c, n, kv):
    return m.ffn_hidden % c.tp == 0


def _msg_ffn(m, c, n, kv):
    return (
        f"tp={c.tp} does not divide ffn_hidden={m.ffn_hidden}; "
        f"valid tp: {_fmt(divisors(m.ffn_hidden))}"
    )


def _ok_shared_ffn(m, c, n, kv):
    return _shared_ffn(m) % c.tp == 0


def _msg_shared_ffn(m, c, n, kv):
    w = _shared_ffn(m)
    return (
        f"tp={c.tp} does not divide the shared-expert width shared_experts={m.shared_experts} "
        f"* moe_ffn_hidden={m.expert_ffn} = {w} (shared experts use tp, not etp); "
        f"valid tp: {_fmt(divisors(w))}"
    )


def _ok_moe_ffn(m, c, n, kv):
    return m.expert_ffn % c.etp == 0


def _msg_moe_ffn(m, c, n, kv):
    return (
        f"etp={c.etp} does not divide moe_ffn_hidden={m.expert_ffn}; "
        f"valid etp: {_fmt(divisors(m.expert_ffn))}"
    )


# experts


def _ok_experts(m, c, n, kv):
    return m.num_experts % c.ep == 0


def _msg_experts(m, c, n, kv):
    return (
        f"ep={c.ep} does not divide num_experts={m.num_experts}; "
        f"valid ep: {_fmt(divisors(m.num_experts))}"
    )


def _ok_ep_dense(m, c, n, kv):
    return c.ep == 1


def _msg_ep_dense(m, c, n, kv):
    return f"ep={c.ep} needs a MoE model but num_experts=0; valid ep: 1"


def _ok_moe_sp(m, c, n, kv):
    return np.logical_or(c.tp == 1, c.sequence_parallel)


def _msg_moe_sp(m, c, n, kv):
    return (
        f"tp={c.tp} with a MoE model (num_experts={m.num_experts}, ep={c.ep}) requires "
        f"sequence_parallel=True but sequence_parallel=False; "
        f"valid: sequence_parallel=True, or tp=1"
    )


# sequence length


def _ok_cp_seq(m, c, n, kv):
    return np.logical_or(c.cp == 1, m.seq_len % (2 * c.cp) == 0)


def _msg_cp_seq(m, c, n, kv):
    valid = [1] + valid_values(divisors(m.seq_len), lambda x: x > 1 and m.seq_len % (2 * x) == 0)
    return (
        f"cp={c.cp} needs seq_len={m.seq_len} divisible by 2*cp={2 * c.cp} (load-balanced causal "
        f"context parallelism splits the sequence into 2*cp chunks); valid cp: {_fmt(valid)}"
    )


def _ok_sp_seq(m, c, n, kv):
    return np.logical_or(np.logical_not(c.sp_active), m.seq_len % (c.tp * c.cp) == 0)


def _msg_sp_seq(m, c, n, kv):
    local = m.seq_len // c.cp if m.seq_len % c.cp == 0 else m.seq_len / c.cp
    valid = valid_values(divisors(m.seq_len), lambda t: m.seq_len % (t * c.cp) == 0)
    return (
        f"sequence_parallel=True with tp={c.tp} and cp={c.cp} needs seq_len={m.seq_len} divisible "
        f"by tp*cp={c.tp * c.cp} (each cp rank's {local} tokens are scattered over tp ranks); "
        f"valid tp for cp={c.cp}: {_fmt(valid)}, or sequence_parallel=False"
    )


# layers and pipeline


def _ok_layers_pp(m, c, n, kv):
    return m.layers % c.pp == 0


def _msg_layers_pp(m, c, n, kv):
    counted = ""
    if (m.layers + 2) % c.pp == 0:
        # Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split split: the
        # first and last stages a layer short, which is the even split with its remainder in the middle stages.
        counted = (f"; with the embedding and loss counted as a layer each it divides: layers_per_stage "
                   f"{','.join(map(str, even_split(m.layers, c.pp)))}")
    return (
        f"pp={c.pp} does not divide layers={m.layers}; valid pp: {_fmt(divisors(m.layers))} "
        f"(or give layers_per_stage for an uneven split{counted})"
    )


def _ok_layers_vpp(m, c, n, kv):
    # Only judged when the even split itself is valid (otherwise _ok_layers_pp reports it);
    # pp == 1 with vpp > 1 is reported by _ok_vpp_pp.
    per_stage = m.layers // c.pp
    skip = np.logical_or(m.layers % c.pp != 0, c.pp == 1)
    return np.logical_or(skip, per_stage % c.vpp == 0)


def _msg_layers_vpp(m, c, n, kv):
    per_stage = m.layers // c.pp
    return (
        f"vpp={c.vpp} does not divide the layers per stage layers={m.layers} / pp={c.pp} = "
        f"{per_stage}; valid vpp for pp={c.pp}: {_fmt(divisors(per_stage))}"
    )


def _has_mamba(m: ModelSpec) -> bool:
    return bool(m.hybrid_pattern) and "M" in m.hybrid_pattern


def _ok_mamba_tp(m, c, n, kv):
    return np.logical_and.reduce([m.mamba_heads % c.tp == 0, m.mamba_groups % c.tp == 0,
                                  m.mamba_heads % (c.tp * c.cp) == 0])


def _msg_mamba_tp(m, c, n, kv):
    return (f"tp={c.tp}, cp={c.cp}: megatron-core's MambaMixer splits mamba_heads={m.mamba_heads} and "
            f"mamba_groups={m.mamba_groups} over tp and the heads over tp x cp (ssm/mamba_context_parallel.py); valid "
            f"tp: {_fmt(common_divisors(m.mamba_heads, m.mamba_groups))}, with tp x cp dividing {m.mamba_heads}")


def _ok_hybrid_vpp(m, c, n, kv):
    return c.vpp == 1


def _msg_hybrid_vpp(m, c, n, kv):
    return (f"vpp={c.vpp} with a hybrid Mamba model: Megatron-Bridge's MambaModelProvider does not run the "
            f"interleaved schedule (\"Virtual pipeline model parallelism is temporarily unsupported in SSM/Mamba "
            f"models\"); valid vpp: 1")


def _ok_vpp_pp(m, c, n, kv):
    return np.logical_or(c.vpp == 1, c.pp > 1)


def _msg_vpp_pp(m, c, n, kv):
    return (
        f"vpp={c.vpp} (interleaved schedule) needs pp > 1 but pp={c.pp}; "
        f"valid vpp for pp={c.pp}: 1"
    )


def _ok_interleaved_microbatches(m, c, n, kv):
    """Interleaved 1F1B and the number of micro-batches M, as megatron-core 0.16 checks it.

    ``megatron/core/pipeline_parallel/schedules.py``
    ``forward_backward_pipelining_with_interleaving`` (the old "num_microbatches % pp == 0"
    assert was replaced by a micro-batch group size N,
    ``config.microbatch_group_size_per_vp_stage``):

    * ``ValueError`` unless pp <= N <= M;
    * ``RuntimeError`` if 0 < M % N < pp ("dependency bubbles").

    ``megatron/core/model_parallel_config.py`` ``ModelParallelConfig.__post_init__`` defaults
    N to pp, and a plan has no N of its own, so with N = pp the remainder M % pp is always
    < pp: the 0.16 rule is M >= pp and M % pp == 0. (A custom N could relax the divisibility
    to M % N == 0 or M % N >= pp; the plan does not model N.)
    """
    nmb = c.num_microbatches
    interleaved = np.logical_and(c.vpp > 1, c.pp > 1)
    ok = np.logical_and(nmb >= c.pp, nmb % c.pp == 0)
    return np.logical_or(np.logical_not(interleaved), ok)


def _msg_interleaved_microbatches(m, c, n, kv):
    nmb = int(c.num_microbatches)
    step = c.dp * c.micro_batch * c.pp
    return (
        f"vpp={c.vpp} (interleaved schedule) with pp={c.pp} needs num_microbatches >= pp and "
        f"divisible by pp, but num_microbatches = global_batch={c.global_batch} // "
        f"(dp={c.dp} * micro_batch={c.micro_batch}) = {nmb}; valid global_batch for "
        f"dp={c.dp}, micro_batch={c.micro_batch}, pp={c.pp}: multiples of {step} "
        f"(nearest: {_fmt(nearest_multiples(c.global_batch, step))}), or vpp=1"
    )


# batch


def _ok_global_batch(m, c, n, kv):
    return c.global_batch % (c.dp * c.micro_batch) == 0


def _msg_global_batch(m, c, n, kv):
    step = c.dp * c.micro_batch
    hint = ""
    if c.global_batch % c.dp == 0:
        mbs = divisors(c.global_batch // c.dp)
        hint = f"; valid micro_batch for dp={c.dp}: {_fmt(mbs)}"
    return (
        f"global_batch={c.global_batch} is not divisible by dp={c.dp} * "
        f"micro_batch={c.micro_batch} = {step}; valid global_batch: multiples of {step} "
        f"(nearest: {_fmt(nearest_multiples(c.global_batch, step))}){hint}"
    )


# ZeRO-2/3 (Megatron-FSDP)


def _ok_fsdp_pp(m, c, n, kv):
    return np.logical_or(c.zero_stage < 2, c.pp == 1)


def _msg_fsdp_pp(m, c, n, kv):
    strategy = "optim_grads" if c.zero_stage == 2 else "optim_grads_params"
    return (
        f"zero_stage={c.zero_stage} (Megatron-FSDP, {strategy}) needs pp=1 but pp={c.pp} (megatron-core "
        f"0.16's FSDP device mesh spans the whole world as dp*cp x tp ranks); valid: pp=1 with "
        f"dp={c.dp * c.pp}, or zero_stage 0/1 (distributed optimizer) with pp={c.pp}"
    )


def _ok_muon_fsdp(m: ModelSpec, c: _Cols, n: int | None, kvrep: bool) -> Any:
    return c.zero_stage < 2


def _msg_muon_fsdp(m: ModelSpec, c: _Cols, n: int | None, kvrep: bool) -> str:
    return (f"optimizer=muon with zero_stage={c.zero_stage} (Megatron-FSDP): megatron-core 0.16.1 steps Muon with "
            f"whole parameters and gradients on each rank (optimizer/muon.py, layer_wise_optimizer.py: \"Megatron "
            f"DDP handle allreduce grad, note that each rank have full model and grad\"); valid: zero_stage 0, or 1 "
            f"(the layer-wise distributed optimizer, --optimizer dist_muon)")


def _never(m: ModelSpec, c: _Cols, n: int | None, kvrep: bool) -> Any:
    return c.tp < 0


def _msg_muon_fp16(m: ModelSpec, c: _Cols, n: int | None, kvrep: bool) -> str:
    return ("optimizer=muon with precision=fp16: megatron-core 0.16.1 \"muon with fp16 is not supported\" "
            "(optimizer/muon.py); valid: precision bf16, fp8, mxfp8 or nvfp4, or optimizer=adam")


_RULES: tuple[_Rule, ...] = (
    _Rule("world_size", _always, _ok_world, _msg_world, needs_num_gpus=True),
    _Rule("expert_grid", _always, _ok_expert_grid, _msg_expert_grid),
    _Rule("heads", _always, _ok_heads, _msg_heads),
    _Rule("kv_heads", lambda m: not _is_mla(m), _ok_kv_heads, _msg_kv_heads),
    _Rule("ffn_hidden", _has_dense_ffn, _ok_ffn, _msg_ffn),
    _Rule("shared_expert_ffn", lambda m: m.is_moe and m.shared_experts > 0, _ok_shared_ffn,
          _msg_shared_ffn),
    _Rule("moe_ffn_hidden", _is_moe, _ok_moe_ffn, _msg_moe_ffn),
    _Rule("experts", _is_moe, _ok_experts, _msg_experts),
    _Rule("ep_dense", _is_dense, _ok_ep_dense, _msg_ep_dense),
    _Rule("moe_sequence_parallel", _is_moe, _ok_moe_sp, _msg_moe_sp),
    _Rule("cp_seq_len", _always, _ok_cp_seq, _msg_cp_seq),
    _Rule("sp_seq_len", _always, _ok_sp_seq, _msg_sp_seq),
    _Rule("layers_pp", _always, _ok_layers_pp, _msg_layers_pp, even_split_only=True),
    _Rule("layers_vpp", _always, _ok_layers_vpp, _msg_layers_vpp, even_split_only=True),
    _Rule("vpp_needs_pp", _always, _ok_vpp_pp, _msg_vpp_pp),
    _Rule("mamba_heads", _has_mamba, _ok_mamba_tp, _msg_mamba_tp),
    _Rule("hybrid_vpp", lambda m: bool(m.hybrid_pattern), _ok_hybrid_vpp, _msg_hybrid_vpp),
    _Rule("interleaved_microbatches", _always, _ok_interleaved_microbatches,
          _msg_interleaved_microbatches),
    _Rule("global_batch", _always, _ok_global_batch, _msg_global_batch),
    _Rule("fsdp_pipeline", _always, _ok_fsdp_pp, _msg_fsdp_pp),
    _Rule("muon_fsdp", lambda m: m.optimizer == "muon", _ok_muon_fsdp, _msg_muon_fsdp),
    _Rule("muon_fp16", lambda m: m.optimizer == "muon" and m.precision == "fp16", _never, _msg_muon_fp16),
)


# Scalar-only rules (fields the vectorised mask does not carry) ------------------------------


def _layers_per_stage_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """Explicit (uneven) split, Megatron's --decoder-first/last-pipeline-num-layers or layout."""
    lps = plan.layers_per_stage
    if lps is None:
        return []
    out: list[str] = []
    pp = plan.pp
    shown = "(" + ", ".join(str(x) for x in lps) + ")"
    if sum(lps) != model.layers:
        out.append(
            f"layers_per_stage={shown} with pp={pp} sums to {sum(lps)} but layers={model.layers}; "
            f"valid: {pp} non-negative counts summing to {model.layers}"
        )
    negative = [i for i, x in enumerate(lps) if x < 0]
    if negative:
        out.append(
            f"layers_per_stage={shown} with pp={pp} has negative counts at stages "
            f"{_fmt(negative)}; valid: counts >= 0"
        )
    if pp == 1:
        if lps[0] < 1:
            out.append(
                f"layers_per_stage={shown} with pp=1 leaves the only stage empty; "
                f"valid: ({model.layers},)"
            )
    else:
        empty_middle = [i for i in range(1, pp - 1) if lps[i] == 0]
        if empty_middle:
            out.append(
                f"layers_per_stage={shown} with pp={pp} has empty middle stages "
                f"{_fmt(empty_middle)}; only the first/last stage may hold 0 layers"
            )
    # With an explicit split the planner emits megatron-core's pipeline_model_parallel_layout, whose
    # virtual stages may hold any number of layers (PipelineParallelLayerLayout.validate_layer_layout only
    # needs the embedding first, the loss last and every decoder layer placed once): stage counts need not
    # be multiples of vpp. Only the --decoder-first/last-pipeline-num-layers flags would need that.
    return out


def _stage_layers(model: ModelSpec, plan: ParallelPlan) -> int:
    if plan.layers_per_stage is not None:
        return max(plan.layers_per_stage)
    return model.layers // plan.pp


def _offload_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """megatron-core 0.16.1 TransformerConfig.__post_init__ (transformer/transformer_config.py:1137-1153):
    CPU offloading needs pipeline parallelism off and no recomputation (the plan's recompute is 'offload'), and
    offloads fewer layers than the model has."""
    out: list[str] = []
    if plan.pp > 1:
        out.append(f"recompute='offload' needs pp=1 but pp={plan.pp} (megatron-core: \"Currently there is no support "
                   f"for Pipeline parallelism with CPU offloading\"); valid: pp=1, or recompute none/selective/full")
    if plan.recompute_layers is not None and not 1 <= plan.recompute_layers < model.layers:
        out.append(f"recompute_layers={plan.recompute_layers} offloaded layers: megatron-core offloads 1 to "
                   f"{model.layers - 1} of the {model.layers} layers; valid: 1..{model.layers - 1} or None "
                   f"({model.layers - 1})")
    if plan.framework != "megatron-core":
        out.append(f"recompute='offload' is megatron-core's --cpu-offloading, not {plan.framework}'s; valid: "
                   f"framework='megatron-core'")
    return out


def _recompute_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    if plan.recompute == "offload":
        return _offload_violations(model, plan)
    if plan.recompute_layers is None:
        return []
    out: list[str] = []
    if plan.recompute != "full":
        # Megatron: "When using recompute_granularity: selective recompute_num_layers must be None".
        out.append(
            f"recompute_layers={plan.recompute_layers} needs recompute='full' but "
            f"recompute='{plan.recompute}'; valid: recompute_layers=None, or recompute='full'"
        )
    per_stage = _stage_layers(model, plan)
    if plan.recompute_layers > per_stage:
        where = (
            f"the largest stage of layers_per_stage (pp={plan.pp})"
            if plan.layers_per_stage is not None
            else f"layers={model.layers} / pp={plan.pp}"
        )
        out.append(
            f"recompute_layers={plan.recompute_layers} exceeds the layers per stage "
            f"{per_stage} ({where}); valid recompute_layers: 0..{per_stage} or None (all)"
        )
    return out


def _muon_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """megatron-core 0.16.1 optimizer/muon.py get_megatron_muon_optimizer: Muon's state stays on the GPU (the host
    offload is the Adam HybridDeviceOptimizer's);
    the layer-wise distributed optimizer deals parameters over the whole data-parallel group (no replicas)."""
    if model.optimizer != "muon":
        return []
    out: list[str] = []
    if plan.optimizer_offload > 0:
        out.append(f"optimizer=muon with optimizer_offload={plan.optimizer_offload:g}: megatron-core's optimizer CPU "
                   "offload is Adam's (HybridDeviceOptimizer); valid: optimizer_offload=0, or optimizer=adam")
    if plan.dist_opt_instances > 1:
        out.append(f"optimizer=muon with dist_opt_instances={plan.dist_opt_instances}: Megatron's layer-wise "
                   "distributed optimizer deals the parameters over the whole data-parallel group; valid: "
                   "dist_opt_instances=1")
    return out


def _optimizer_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    # Planner consistency: Megatron's distributed optimizer *is* ZeRO-1 (optimizer-state
    # sharding over dp x cp); ZeRO-2/3 are Megatron-FSDP's optim_grads / optim_grads_params.
    if plan.distributed_optimizer and plan.zero_stage == 0:
        return [
            "distributed_optimizer=True shards optimizer states (ZeRO-1) but zero_stage=0; "
            "valid: zero_stage in 1, 2, 3, or distributed_optimizer=False"
        ]
    if plan.zero_stage >= 1 and not plan.distributed_optimizer:
        # The estimate prices any ZeRO stage as a sharded optimizer state, which Megatron shards only with
        # --use-distributed-optimizer (Megatron-FSDP runs with it too); the flags follow distributed_optimizer.
        return [f"zero_stage={plan.zero_stage} shards optimizer states (Megatron's distributed optimizer) but "
                "distributed_optimizer=False; valid: distributed_optimizer=True, or zero_stage=0"]
    if plan.optimizer_offload > 0 and plan.zero_stage == 0:
        # megatron-core 0.16.1 optimizer_config.py: --optimizer-cpu-offload runs with
        # --use-precision-aware-optimizer, which asserts the distributed optimizer; DeepSpeed offloads
        # optimizer state only under ZeRO (offload_optimizer is a zero_optimization option).
        return [f"optimizer_offload={plan.optimizer_offload:g} offloads the sharded optimizer state but nothing is "
                "sharded (zero_stage=0); valid: optimizer_offload=0, or zero_stage 1, 2 or 3"]
    r = plan.dist_opt_instances
    if r == 1:
        return []
    if plan.zero_stage == 0 and not plan.distributed_optimizer:
        return [f"dist_opt_instances={r} replicates a sharded optimizer state but nothing is sharded "
                "(zero_stage=0, distributed_optimizer=False); valid: dist_opt_instances=1, or zero_stage 1, 2 or 3"]
    if plan.zero_stage >= 2 and plan.ep > 1:
        # megatron-core 0.16.1 distributed/fsdp/mcore_fsdp_adapter.py _init_dist_index: with HSDP
        # (num_distributed_optimizer_instances > 1) Megatron-FSDP builds no expert device mesh.
        return [f"dist_opt_instances={r} with Megatron-FSDP (zero_stage={plan.zero_stage}) and ep={plan.ep}: "
                "megatron-core 0.16.1 builds no expert mesh for HSDP; valid: dist_opt_instances=1, ep=1, or "
                "zero_stage=1 (distributed optimizer)"]
    # megatron-core parallel_state.initialize_model_parallel: "data_parallel_size * context_parallel_size
    # must be divisible by num_distributed_optimizer_instances", and the expert data-parallel size likewise.
    dp_cp = plan.dp * plan.cp
    edp = plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp) if model.is_moe else dp_cp
    if dp_cp % r or edp % r:
        what = (f"dp={plan.dp} * cp={plan.cp} = {dp_cp}" + (f" and the expert data-parallel size {edp}"
                                                          if model.is_moe else ""))
        return [f"dist_opt_instances={r} does not divide {what}; valid dist_opt_instances: "
                f"{_fmt(common_divisors(dp_cp, edp))}"]
    return []


def a2a_overlap_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """megatron-core 0.16.1 TransformerConfig.__post_init__, when overlap_moe_expert_parallel_comm is set."""
    if not plan.moe_a2a_overlap:
        return []
    out = []
    if plan.ep == 1:
        out.append("moe_a2a_overlap=True overlaps the expert-parallel all-to-all but ep=1; valid: ep > 1 "
                   "(an MoE model), or moe_a2a_overlap=False")
    if plan.pp > 1 and plan.vpp == 1:
        out.append(f"moe_a2a_overlap=True with pp={plan.pp} needs the interleaved schedule (megatron-core: "
                   f"virtual_pipeline_model_parallel_size must be set); valid: vpp > 1, pp=1, or moe_a2a_overlap=False")
    if plan.recompute == "full":
        out.append("moe_a2a_overlap=True with recompute=full (megatron-core: disable full recomputation); valid: "
                   "recompute none, selective or offload, or moe_a2a_overlap=False")
    if model.precision in FULL_PRECISION:
        out.append(f"moe_a2a_overlap=True needs a bf16 or fp16 model (precision={model.precision}); valid: precision "
                   "bf16, fp8, mxfp8 or nvfp4, or moe_a2a_overlap=False")
    if model.mtp_layers > 1 or (model.mtp_layers == 1 and plan.pp == 1):
        out.append(f"moe_a2a_overlap=True with {model.mtp_layers} MTP layer(s) at pp={plan.pp} (megatron-core: one "
                   f"MTP layer at most, and then pp > 1); valid: moe_a2a_overlap=False")
    return out


def _rank_order_violations(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    tokens = [t.strip() for t in plan.rank_order.split("-") if t.strip()]
    out: list[str] = []
    unknown = [t for t in tokens if t not in RANK_ORDER_TOKENS]
    dup = sorted({t for t in tokens if tokens.count(t) > 1})
    if unknown or dup:
        out.append(
            f"rank_order='{plan.rank_order}' has "
            + ("unknown tokens " + _fmt(unknown) if unknown else "")
            + (" and " if unknown and dup else "")
            + ("repeated tokens " + _fmt(dup) if dup else "")
            + f"; valid: a '-'-joined order of {', '.join(RANK_ORDER_TOKENS)}, "
            + "e.g. 'tp-cp-ep-dp-pp'"
        )
        return out
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp, "pp": plan.pp}
    missing = [f"{t}={sizes[t]}" for t in RANK_ORDER_TOKENS if sizes[t] > 1 and t not in tokens]
    if missing:
        # RankGenerator: "The size of (tp) is (2), but you haven't specify the order".
        out.append(
            f"rank_order='{plan.rank_order}' omits {_fmt(missing)}; every degree > 1 must appear"
        )
    pp_last = bool(tokens) and tokens[-1] == "pp"
    dense = plan.tp * plan.cp * plan.dp
    if not pp_last and plan.pp > 1 and dense % (plan.ep * plan.etp) == 0:
        edp = dense // (plan.ep * plan.etp)
        if edp != plan.dp:
            out.append(
                f"rank_order='{plan.rank_order}' is not pp-last with pp={plan.pp}, so Megatron "
                f"needs the expert data-parallel size tp*cp*dp/(ep*etp) = tp={plan.tp} * "
                f"cp={plan.cp} * dp={plan.dp} / (ep={plan.ep} * etp={plan.etp}) = {edp} to equal "
                f"dp={plan.dp}; valid: a pp-last rank_order, or ep*etp == tp*cp"
            )
    return out


# Public API ----------------------------------------------------------------------------------


def violations(
    model: ModelSpec,
    plan: ParallelPlan,
    num_gpus: int | None = None,
    *,
    kv_head_replication: bool = True,
) -> list[str]:
    """Every Megatron-core rule the plan breaks, one message per rule (empty = valid).

    ``num_gpus``: when given, tp*pp*dp*cp must equal it.
    ``kv_head_replication``: accept tp as a multiple of kv_heads too (Megatron-LM PR #2565,
    "Support TP greater than num_kv_heads", in core 0.16's ``TransformerConfig.__post_init__``:
    num_query_groups must be a multiple *or divisor* of tp). Off by default: the planner requires
    kv_heads % tp == 0 so each tp rank owns whole KV heads.
    ``sequence_parallel`` with tp=1 is not an error (Megatron silently turns it off).
    """
    cols = _scalar_cols(plan)
    out: list[str] = []
    for rule in _RULES:
        if not rule.applies(model):
            continue
        if rule.needs_num_gpus and num_gpus is None:
            continue
        if rule.even_split_only and plan.layers_per_stage is not None:
            continue
        if not bool(rule.ok(model, cols, num_gpus, kv_head_replication)):
            out.append(rule.message(model, cols, num_gpus, kv_head_replication))
    out += _layers_per_stage_violations(model, plan)
    out += _recompute_violations(model, plan)
    out += _optimizer_violations(model, plan)
    out += _muon_violations(model, plan)
    out += a2a_overlap_violations(model, plan)
    out += _rank_order_violations(model, plan)
    return out


def check_plan(
    model: ModelSpec,
    plan: ParallelPlan,
    num_gpus: int | None = None,
    *,
    kv_head_replication: bool = True,
) -> None:
    """Raise :class:`PlanError` with every violation joined by '; ' on one line."""
    found = violations(model, plan, num_gpus, kv_head_replication=kv_head_replication)
    if found:
        raise PlanError(f"invalid plan for {model.name}: " + "; ".join(found))


def selective_runs_as_priced(model: ModelSpec, framework: str, transformer_engine: bool) -> bool:
    """Whether the stack runs the selective recomputation the estimate prices (costmodel/memory.py
    layer_activation_bytes: the LayerNorm outputs and the MLP activation recomputed, with flash attention).

    megatron-core on Transformer Engine runs it through ``--recompute-modules`` (megatron-core 0.16.1
    transformer_config.py): a MoE layer's pre-MLP LayerNorm ("layernorm") and experts' activation ("moe_act"),
    which planner/outputs.py writes and the estimate prices for a MoE model there (``te_moe_modules``). A dense
    layer's LayerNorms are fused into its QKV and FC1 GEMMs (gpt_layer_specs.py: input_layernorm and
    pre_mlp_layernorm are IdentityOp) and no module recomputes a dense MLP's activation alone ("mlp" recomputes
    the whole MLP), so its selective is the default core_attn, which
    frees nothing flash attention keeps: the run holds what recompute 'none' holds. Without Transformer Engine
    (local layers, attention unfused) selective is the attention-core recompute of Korthikanti et al. and the
    estimate prices that. Other stacks checkpoint op by op (torchtitan's selective "op" mode)."""
    return framework != "megatron-core" or not transformer_engine or model.is_moe


def grouped_gemm_issue(model: ModelSpec, transformer_engine: bool) -> str | None:
    """Why megatron-core cannot run a MoE model's experts as a grouped GEMM (None: it can). Megatron-LM
    validate_args: "assert args.bf16, 'Currently GroupedGEMM for MoE only supports bf16 dtype.'" and
    "assert dc[0] >= 8, 'Unsupported compute capability for GroupedGEMM kernels.'" (fp8/fp4 run with --bf16)."""
    if model.precision in ("fp16", *FULL_PRECISION):
        return f"Megatron's grouped GEMM needs --bf16, the plan trains in {model.precision}"
    if not transformer_engine:
        return "Megatron's grouped GEMM needs compute capability 8.0"
    return None


def moe_recompute_modules(grouped_gemm: bool) -> list[str]:
    """megatron-core's ``recompute_modules`` for a MoE model's selective recomputation on Transformer Engine:
    what it can run of the estimate's (:func:`selective_runs_as_priced`), the attention core, the pre-MLP
    LayerNorm and the experts' activation. megatron-core 0.16.1 transformer_config.py: "moe_act in
    recompute_modules is only supported with moe_grouped_gemm"; with fp8 "Delayed scaling does not support moe_act
    and layernorm recompute for fp8" (a delayed-scaling run keeps the default core_attn)."""
    return ["core_attn", "layernorm"] + (["moe_act"] if grouped_gemm else [])


def schedule_notes(plan: ParallelPlan) -> list[str]:
    """Settings the plan needs that are not errors (what Megatron must be launched with)."""
    notes: list[str] = []
    if plan.vpp > 1 and plan.pp == 2:
        # validate_args: without p2p overlap the interleaved schedule needs pp > 2;
        # ModelParallelConfig: overlap_p2p_comm and batch_p2p_comm are mutually exclusive.
        notes.append(
            f"interleaved schedule with pp=2 and vpp={plan.vpp} needs overlap_p2p_comm=True and "
            f"batch_p2p_comm=False (Megatron requires pp > 2 without p2p overlap)"
        )
    return notes


def valid_mask(
    model: ModelSpec,
    arrays: Mapping[str, np.ndarray],
    num_gpus: int | None,
    *,
    kv_head_replication: bool = True,
) -> np.ndarray:
    """The same rules as :func:`violations` over columns of candidate plans (even split only).

    ``arrays`` maps names in :data:`MASK_KEYS` to equally long 1-d arrays; a missing key takes
    the ParallelPlan default (1 for degrees and micro_batch, True for sequence_parallel);
    ``global_batch`` is required; ``zero_stage`` defaults to 1. Plan fields without a column
    (recompute, distributed_optimizer, rank_order, layers_per_stage) are taken at their defaults,
    which satisfy every rule. Returns a bool array, True where the plan is valid.
    """
    unknown = sorted(set(arrays) - set(MASK_KEYS))
    if unknown:
        raise InputError(f"valid_mask: unknown columns {unknown}; valid: {', '.join(MASK_KEYS)}")
    if "global_batch" not in arrays:
        raise InputError("valid_mask: column 'global_batch' is required")
    lengths = {k: np.shape(v) for k, v in arrays.items()}
    shape = np.broadcast_shapes(*lengths.values())

    def col(key: str, default: Any, dtype: Any) -> np.ndarray:
        v = arrays.get(key, default)
        return np.broadcast_to(np.asarray(v, dtype=dtype), shape)

    raw = {k: col(k, 1, np.int64) for k in (*DEGREES, "micro_batch", "global_batch")}
    positive = np.ones(shape, dtype=bool)
    for v in raw.values():
        positive &= v >= 1
    # Guard against division by zero; those rows are already False via `positive`.
    safe = {k: np.where(v >= 1, v, 1) for k, v in raw.items()}
    cols = _Cols(
        **safe,
        sequence_parallel=col("sequence_parallel", True, bool),
        zero_stage=col("zero_stage", 1, np.int64),
    )
    # Rows with an explicit uneven stage split (checked by violations() on that split) skip the
    # even-split layer rules.
    uneven = col("uneven", False, bool)
    mask = positive.copy()
    for rule in _RULES:
        if not rule.applies(model):
            continue
        if rule.needs_num_gpus and num_gpus is None:
            continue
        ok = np.broadcast_to(np.asarray(rule.ok(model, cols, num_gpus, kv_head_replication), dtype=bool), shape)
        if rule.ok in (_ok_layers_pp, _ok_layers_vpp):
            ok = ok | uneven
        mask &= ok
    return mask
