"""estimate(model, cluster, plans) -> step time, breakdown and memory, vectorised over plans.

The step is built bottom-up for one micro-batch on one rank of each pipeline stage:
  layer forward  = GEMMs + flash attention + memory-bound kernels + exposed TP / CP / EP comm
  layer backward = 2x GEMMs + attention backward + 2x memory-bound + exposed comm
  recompute      = a layer forward (full) or the attention core (selective)
then the pipeline schedule (pipeline.py) turns stage times into the step, and the data-parallel
gradient / parameter collectives add what the overlap with the last backward / first forward does
not hide, plus the optimizer step. Both bounds are reported: every overlappable collective hidden
(lower) and none hidden (upper).

Each of these is one named term, in the order :func:`compose_step` composes them: :func:`layer_terms`
(one dense / MoE layer and its recompute), :func:`stage_times` (each representative stage and the
pipeline), :func:`stage_params` and :func:`dp_tail` (data-parallel sync and optimizer), :func:`stage_memory`
(per-stage peak memory), then :func:`step_time_s` and :func:`mfu`, which costmodel/hetero.py shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from costmodel import comm, compute, memory, muon, pipeline, rules, scale
from costmodel.compression import GradCompression
from costmodel.flops import (MAMBA_CHUNK, attention_proj_dims, embedding_params, expert_mlp_params, layer_params,
                             mamba_dims, mlp_params, model_flops_per_step, mtp_layer_params)
from costmodel.profiles import HardwareProfile, load_profile
from costmodel.plan import ParallelPlan, PlanArrays, even_split_columns
from costmodel.specs import ClusterSpec, ModelSpec, StepEstimate


# What each framework generation overlaps (fraction of the overlappable communication left exposed).
# megatron-core with --tp-comm-overlap (userbuffers) hides most TP traffic behind the GEMMs;
# Megatron-LM of 2020/2021 ran TP all-reduces and the DP all-reduce without overlap
# (Narayanan et al. 2021 Sec. 4; Korthikanti et al. 2022 Sec. 5 added none). Paxml (JAX/XLA) is taken to
# compute attention unfused (XLA's cuDNN flash-attention path is opt-in), with its FSDP overlapped.
# "te_ce": the cross-entropy runs as Transformer Engine's fused kernel, in place on the logits
# (costmodel/memory.py LOGITS_BYTES_TE_FUSED; megatron-core and the flags planner/outputs.py writes).
FRAMEWORK = {
    "megatron-core": {"tp_exposed": 0.25, "dp_overlap": True, "flash": True, "p2p_exposed": 0.5, "te_ce": True,
                      "pp_grad_overlap": True},
    "megatron-lm-2021": {"tp_exposed": 1.0, "dp_overlap": False, "flash": False, "p2p_exposed": 1.0, "te_ce": False,
                         "pp_grad_overlap": False},
    "megatron-lm-2020": {"tp_exposed": 1.0, "dp_overlap": False, "flash": False, "p2p_exposed": 1.0, "te_ce": False,
                         "pp_grad_overlap": False},
    "paxml": {"tp_exposed": 0.5, "dp_overlap": True, "flash": False, "p2p_exposed": 0.5, "te_ce": False,
              "pp_grad_overlap": True},
    # A stack other than Megatron or Paxml (DeepSpeed, PyTorch FSDP, torchtitan, MaxText, ...): flash attention
    # and overlapped data-parallel reduction are taken as given, but not Transformer Engine's userbuffer
    # overlap of tensor-parallel collectives with the GEMMs or Megatron's interleaved p2p overlap, which are
    # Megatron features (Megatron-LM --tp-comm-overlap, --overlap-p2p-communication), nor its fused
    # cross-entropy. With a pipeline ("pp_grad_overlap" False) their gradient reduction starts after the
    # schedule's last backward, where megatron-core's runs under it: DeepSpeed's PipelineEngine
    # (deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceTiedGrads, ReduceGrads and OptimizerStep appended
    # at the last step, Megatron-DeepSpeed and GPT-NeoX's pipelines) and PyTorch's pipelining that torchtitan
    # runs (torch/distributed/pipelining/stage.py perform_reduce_grad: "REDUCE_GRAD action is scheduled after
    # all microbatches W, B actions", FSDP's post-backward called by hand).
    "other": {"tp_exposed": 1.0, "dp_overlap": True, "flash": True, "p2p_exposed": 1.0, "te_ce": False,
              "pp_grad_overlap": False},
    # Such a stack running asynchronous tensor parallelism: PyTorch's micro-pipelined TP (torchtitan
    # --parallelism.enable_async_tensor_parallel, torchtitan/distributed/tensor_parallel.py maybe_enable_async_tp:
    # symmetric memory on the TP group and torch._inductor.config._micro_pipeline_tp) splits each all-gather /
    # reduce-scatter into per-rank chunks pipelined against the GEMM that consumes / produces them, as Transformer
    # Engine's userbuffers do for megatron-core, so the same share shows; XLA's collective matmul (windowed
    # einsum, MaxText on GPU) does the same. Everything else as "other".
    "other-async-tp": {"tp_exposed": 0.25, "dp_overlap": True, "flash": True, "p2p_exposed": 1.0, "te_ce": False,
                       "pp_grad_overlap": False},
    # The same stacks up to 2022: attention unfused (softmax, mask and dropout through HBM on the s x s scores), as
    # Megatron-LM's own 2020-2022 generations run it. FlashAttention appeared in May 2022 (Dao et al.,
    # arXiv:2205.14135) and reached them later (PyTorch 2.0's scaled_dot_product_attention, March 2023).
    "other-2022": {"tp_exposed": 1.0, "dp_overlap": True, "flash": False, "p2p_exposed": 1.0, "te_ce": False,
                   "pp_grad_overlap": False},
}
# Fixed cost per optimizer step outside the layers (data loader, loss reduction, logging, launch gaps).
STEP_OVERHEAD_S = 0.02
# Host-device synchronisation and launch overhead of one MoE layer pass (router top-k, token-count
# exchange of the dropless all-to-all dispatcher, permutation kernels, grouped-GEMM launch).
MOE_LAYER_OVERHEAD_S = 250e-6
# Host (CPU) time to issue one MoE layer's forward pass (megatron-core + Transformer Engine, eager). The
# dropless all-to-all dispatcher copies the per-expert token counts to the host in every layer (the
# all-to-all splits and the grouped-GEMM sizes are host lists), a device-to-host sync, so the CPU cannot run
# ahead of the GPU across MoE layers: a layer takes at least its host time (Megatron-Core MoE report,
# arXiv:2603.07685, "host-boundedness"; TaxBreak, arXiv:2603.12465: MoE models issue 8-11x the kernels of
# dense ones and host CPU speed is first-order for them). Estimate: about 50 framework ops in the attention
# block, router and dispatcher at about 25 us of host time each (5-25 us of dispatch per eager PyTorch op
# plus Transformer Engine module bookkeeping) ...
MOE_HOST_FIXED_S = 1.25e-3
# ... plus the grouped MLP's work per local expert: fc1 and fc2 each split the input, quantise it, fetch the
# weight workspace, save tensors for backward and launch one cuBLAS GEMM (Transformer Engine's GroupedLinear
# loops over the experts in Python; TE issue #1499: its host time is per-GEMM torch.split/torch.empty calls;
# TE issue #2897: a 64-expert grouped MLP block takes 1.2 ms forward / 2.1 ms backward of host time even in
# the fused path). Backward issues twice this (dgrad and wgrad per expert GEMM, gradient quantisation, one
# megatron-core grad hook per expert weight).
MOE_HOST_PER_EXPERT_S = 90e-6
# GPU-side fixed time of one local expert's GEMM in the grouped MLP, beyond what the dense shape curve
# (costmodel/compute.py gemm_efficiency on the tokens per expert) gives: a per-expert GEMM has few output tiles
# (wave quantisation) and a short K loop, whichever kernel runs it. Measured on H100 (tgale96/grouped_gemm
# PR #37, Qwen3-30B-A3B up_proj: 128 experts, K=2048, N=1536, 512 tokens each, uniform routing): 160.5 TFLOP/s
# with the CUTLASS SM90 grouped kernel, 129.5 with the cuBLAS loop, i.e. 20.1 / 24.9 us per expert GEMM,
# where the un-calibrated shape curve gives 7.6 us: 12.5 us more with the faster kernel, taken here. Forward
# runs two such GEMMs per local expert (fc1, fc2), backward four (dgrad and wgrad of each).
GROUPED_GEMM_FIXED_S = 12.5e-6
# HBM elements per routed token and expert-width unit that a clamped GLU activation (ModelSpec.activation_clamp,
# gpt-oss's swiglu_limit) moves outside the fused activation kernel: megatron-core 0.16.1
# fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl clamps each half of the fc1 output (reads and
# writes ffn elements each: 4) and concatenates them again (reads and writes 2 x ffn: 4) before the fused
# kernel runs (transformer/mlp.py does the same for a dense MLP). Backward is priced at twice the forward, as every
# element-wise term here; the clamps' and concatenation's own backward moves about 10 x ffn. Read off the code,
# not fitted.
GLU_CLAMP_ELEMENTS = 8.0
# Share of the GPU's SMs the all-to-all kernels hold while they run beside another micro-batch's compute
# (megatron-core --overlap-moe-expert-parallel-comm): DeepSeek-V3 dispatches and combines on 20 of the H800's
# 132 SMs and finds that enough for the IB and NVLink bandwidth (DeepSeek-V3 Technical Report,
# arXiv:2412.19437, Sec. 3.2.2), so the compute running under the overlapped communication slows by that share.
EP_OVERLAP_SM_SHARE = 20.0 / 132.0
# Per chunk and micro-batch fixed cost of a pipeline hop (p2p launch, synchronisation).
P2P_FIXED_S = 60e-6
# Unfused attention (Megatron-LM 2020-2022, Paxml): bytes of HBM traffic per element of the a*s*s score
# matrix in the forward (twice that backward): the fp16 scores (2 B) are read or written in about five passes,
# QK^T written, softmax read and written, dropout read and written, the same tensors Korthikanti et al. 2022
# Sec. 4.1 count as the attention core's 5as^2b activation bytes. The pass count is read off the unfused
# kernels, not fitted.
UNFUSED_SCORE_BYTES = 10.0
# Cross-entropy over the logits: Megatron's vocab-parallel cross-entropy works on an fp32 copy of the logits
# (tensor_parallel/cross_entropy.py:28 `vocab_parallel_logits.float()`, as costmodel/memory.py
# LOGITS_BYTES_UNFUSED cites) and passes over it about three times (max and shift, exp and sum, the softmax
# saved for backward at :187); the backward writes the gradient in one more pass of the same size.
CROSS_ENTROPY_ELEMENT_BYTES = 4.0
CROSS_ENTROPY_PASSES = 3
CP_RING_EXPOSED_FRACTION = 0.1
"""Share of a context-parallel ring exchange (K and V, cp-1 send/recv steps) left exposed even when the
attention chunks are long enough to hide it: the per-step synchronisation of the ring's send/recv with the
attention kernels. A guess set with the foundation cost model (c10d414), not fitted and from no
measurement; the fit's comm_exposed factor does not scale it."""
FSDP_EXPOSED_FRACTION = 0.05
"""Share of Megatron-FSDP's per-micro-batch weight all-gathers and gradient reduce-scatters left exposed
when the compute of the micro-batches could hide them all (the first gather before any compute, the last
reduce-scatter after it). A guess set with the foundation cost model (c10d414), not fitted and from no
measurement."""


@dataclass
class Stages:
    """Pipeline stages as columns. With Megatron's even split only three kinds of stage differ (the first
    holds the embedding, the last the LM head and loss, the middle ones are alike), so three
    representative columns with weights (1, pp-2, 1) stand for all pp stages; explicit uneven splits get
    one column per stage. ``index`` is the stage's position (for in-flight micro-batches)."""

    layers: np.ndarray
    weight: np.ndarray
    index: np.ndarray
    first: np.ndarray
    last: np.ndarray
    start: np.ndarray   # index of the stage's first layer

    @property
    def valid(self) -> np.ndarray:
        return self.weight > 0


def _stages(model: ModelSpec, a: PlanArrays) -> Stages:
    """The plans' pipeline stages: three representative columns for the even split, one per stage for
    explicit splits (``a.stage_layers``; NaN rows take the even split)."""
    pp = a.pp.astype(int)
    n = len(pp)
    if a.stage_layers is None:
        per = (model.layers // pp).astype(float)
        rem = model.layers - per * pp
        idx = np.stack([np.zeros(n), np.minimum(1, pp - 1), pp - 1], axis=1).astype(float)
        w = np.stack([np.ones(n), np.maximum(pp - 2, 0), (pp > 1).astype(float)], axis=1)
        # Any remainder (plans the rules reject) sits on the middle stages.
        layers = np.stack([per, per + (rem > 0), per], axis=1)
        layers[:, 2] = np.where(pp > 1, per, layers[:, 0])
        first = np.zeros((n, 3), bool)
        first[:, 0] = True
        last = np.zeros((n, 3), bool)
        last[:, 2] = pp > 1
        last[:, 0] = pp == 1
        start = idx * per[:, None]
        return Stages(layers, w, idx, first, last, start)
    max_pp = int(pp.max())
    even = even_split_columns(model.layers, pp, max_pp)
    sl = a.stage_layers
    if sl.shape[1] < max_pp:
        sl = np.pad(sl, ((0, 0), (0, max_pp - sl.shape[1])))
    layers = np.where(np.isnan(sl[:, :1]), even, sl[:, :max_pp])
    i = np.arange(max_pp)[None, :]
    w = (i < pp[:, None]).astype(float)
    start = np.cumsum(layers, axis=1) - layers
    return Stages(layers, w, np.broadcast_to(i, layers.shape).astype(float), np.broadcast_to(i == 0, layers.shape),
                  i == (pp[:, None] - 1), start)


def _context(model: ModelSpec, cluster: ClusterSpec, a: PlanArrays, prof: HardwareProfile, framework: str,
             moe_imbalance: float, grad_compression: GradCompression | None) -> SimpleNamespace:
    """What every step term reads: the plans, the profile and its calibration, the framework's overlap
    switches (``fw``), the GEMM dtype, activation bytes, per-rank tokens, micro-batches ``m`` and where each
    parallel group sits on the fabric (``*_k`` / ``*_N``: comm.group_span)."""
    fw = FRAMEWORK[framework]
    prof = prof.for_model(model)   # a profile calibrated on other models keeps only part of that update
    if prof.kind == "host":
        # CPU processes on gloo: collectives run synchronously on the calling thread (no side streams), so
        # no TP, pipeline or data-parallel communication overlaps compute.
        fw = dict(fw, tp_exposed=1.0, p2p_exposed=1.0, dp_overlap=False, flash=False)
    else:
        if framework == "megatron-core" and not prof.runs_transformer_engine():
            # Where Transformer Engine does not run (V100) the planner writes --transformer-impl local: no
            # userbuffers TP overlap, no fused cross-entropy.
            fw = dict(fw, tp_exposed=1.0, te_ce=False)
        if prof.unfused_attention_source:
            # No fused attention kernel for this GPU (V100): every framework ran it unfused there.
            fw = dict(fw, flash=False)
    dtype = compute.gemm_dtype(model.precision)
    native = dtype not in ("fp8", "fp4") or "fp8" in prof.peak_flops
    # A GPU without fp8 tensor cores (A100, V100) cannot run an fp8 recipe (Transformer Engine's fp8 needs compute
    # capability 8.9): a plan asked for in fp8 there is costed as the bf16 run it falls back to.
    dtype = dtype if native else "bf16"
    c = SimpleNamespace(model=model, cluster=cluster, a=a, prof=prof, fw=fw, cal=prof.calibration,
                        framework=framework, moe_imbalance=moe_imbalance, grad_compression=grad_compression,
                        dtype=dtype, fp8=dtype in ("fp8", "fp4"),
                        # Weight-gradient GEMMs per data-gradient GEMM: none for LoRA's frozen weights.
                        wgrad=0.0 if model.finetune == "lora" else 1.0)
    # A MoE model's selective on megatron-core's Transformer Engine layers runs the --recompute-modules the planner
    # writes (moe_act only with the grouped GEMM): costmodel.memory.layer_activation_bytes.
    te_layers = framework == "megatron-core" and prof.kind != "host" and prof.runs_transformer_engine()
    c.selective_modules = dict(te_moe_modules=te_layers,
                               grouped_gemm=rules.grouped_gemm_issue(model, te_layers) is None)
    # Quantisation traffic per GEMM-input element, in units of bf16 elements (2 bytes): fp8 reads 2 B
    # and writes a row-wise and a column-wise (transposed) 1 B copy; MXFP8 adds 1/32 scales; NVFP4
    # writes two 0.5 B copies plus scales and runs a Hadamard transform pass on the wgrad inputs
    # (NVIDIA NVFP4 recipe, arXiv:2509.25149).
    c.q = {"fp8": 2.0, "mxfp8": 2.1, "nvfp4": 3.5}.get(model.precision, 0.0) if native else 0.0
    # Bytes per activation element: 2 (bf16/fp16 and the fp8 recipes' high-precision tensors), 4 for fp32
    # training (the executor on CPUs without bf16 arithmetic).
    c.eb = memory.activation_element_bytes(model.precision)
    # Attention core and LM head dtype: fp32 training keeps them in fp32 (TF32 on its tensor cores), the rest bf16.
    c.wide = model.precision if model.precision in memory.FULL_PRECISION else "bf16"
    c.D = D = cluster.domain_gpus
    c.h, c.s = model.hidden, model.seq_len
    c.tp, c.pp, c.dp, c.cp = tp, pp, dp, cp = a.tp, a.pp, a.dp, a.cp
    c.vpp, c.sp = a.vpp, a.sp & (a.tp > 1)
    c.ep, c.etp, c.mbs = ep, etp, mbs = a.ep, a.etp, a.micro_batch
    c.n = len(a)
    c.m = a.num_microbatches
    c.tokens = mbs * c.s / cp                      # tokens of this rank's sequence shard per micro-batch
    c.dims = attention_proj_dims(model)

    # Group placement (rank order tp-cp-ep-dp-pp; experts etp-ep-edp).
    c.tp_k, c.tp_N = comm.group_span(1, tp, D)
    c.cp_k, c.cp_N = comm.group_span(tp, cp, D)
    c.dp_size = dp * cp                           # gradients reduce over dp x cp
    c.dp_k, c.dp_N = comm.group_span(tp, c.dp_size, D)
    c.ep_k, c.ep_N = comm.group_span(etp, ep, D)
    c.edp = np.maximum(tp * cp * dp / (ep * etp), 1.0)
    c.edp_k, c.edp_N = comm.group_span(ep * etp, c.edp, D)
    # Sharded state (distributed optimizer, Megatron-FSDP / HSDP): over ``sh`` neighbouring dp x cp ranks
    # (``sh_e`` expert data-parallel ranks), replicated ``R`` times (dist_opt_instances; 1: over all of them).
    c.R = R = a.dist_opt_instances
    c.sh, c.sh_e = c.dp_size / R, np.maximum(c.edp / R, 1.0)
    c.sh_k, c.sh_N = comm.group_span(tp, c.sh, D)
    c.rep_k, c.rep_N = comm.group_span(tp * c.sh, R, D)
    c.sh_e_k, c.sh_e_N = comm.group_span(ep * etp, c.sh_e, D)
    c.rep_e_k, c.rep_e_N = comm.group_span(ep * etp * c.sh_e, R, D)
    c.pp_k, c.pp_N = comm.group_span(tp * cp * dp, pp, D)
    # GPUs' shares of a node's host (memory, DRAM bandwidth) each rank has: a run on fewer GPUs than a node
    # holds leaves the idle GPUs' shares to the others.
    gpn = float(cluster.gpus_per_node)
    c.host_share = gpn / np.minimum(tp * pp * dp * cp, gpn)
    return c


def _gemm(c: SimpleNamespace, flops, min_dim):
    """Seconds of GEMMs of ``flops`` in the plans' GEMM dtype, ``min_dim`` their smallest dimension."""
    return compute.gemm_time_s(c.prof, c.dtype, flops, min_dim)


def _clamp_elements(model: ModelSpec) -> float:
    """Extra element-wise elements per token and unit of MLP width of a clamped GLU (GLU_CLAMP_ELEMENTS)."""
    return GLU_CLAMP_ELEMENTS if (model.activation_clamp is not None and model.gated_mlp) else 0.0


def _mlp_block(c: SimpleNamespace, ffn, tok, width_div):
    """(GEMM seconds, memory-bound elements) of one MLP of width ``ffn`` over ``tok`` tokens, split
    ``width_div`` ways."""
    model, h = c.model, c.h
    flops = 2.0 * tok * mlp_params(model, ffn) / width_div
    mn = np.minimum.reduce([tok, np.full(c.n, float(h)), np.full(c.n, float(ffn)) / width_div])
    elems = tok * ((3 if model.gated_mlp else 2) + _clamp_elements(model)) * ffn / width_div
    if c.fp8:
        elems = elems + tok * c.q * (h + ffn / width_div)
    return _gemm(c, flops, mn), elems


def _tp_exposed(t_tp, t_gemm_f, fw: dict, cal, wgrad: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Exposed tensor-parallel communication of one layer's forward and backward (its collectives take
    ``t_tp`` each way). A framework that overlaps them with the layer's GEMMs (Transformer Engine userbuffers,
    ``--tp-comm-overlap``: the all-gather / reduce-scatter is split into chunks pipelined against the GEMM
    that consumes / produces them) leaves the share ``tp_exposed`` of it showing, but it cannot hide more
    than the GEMMs last: the forward's ``t_gemm_f``, twice that backward (dgrad and wgrad; once for frozen LoRA
    weights, ``wgrad`` 0). With fast GEMMs (fp8 / NVFP4 at high tp) the rest shows. The profile's
    ``comm_exposed`` scales both."""
    share = t_tp * fw["tp_exposed"]
    return (np.maximum(share, t_tp - t_gemm_f) * cal.comm_exposed,
            np.maximum(share, t_tp - (1.0 + wgrad) * t_gemm_f) * cal.comm_exposed)


def _dense_layer(c: SimpleNamespace) -> SimpleNamespace:
    """One dense layer's forward / backward seconds per micro-batch: attention projections, attention core,
    MLP, memory-bound kernels and the exposed TP and CP communication (``dense_f`` / ``dense_b``), with the
    parts the MoE layer and the breakdown reuse."""
    model, prof, cluster, fw, cal = c.model, c.prof, c.cluster, c.fw, c.cal
    h, s, n, tokens, dims, tp, cp, sp, eb = c.h, c.s, c.n, c.tokens, c.dims, c.tp, c.cp, c.sp, c.eb
    d = SimpleNamespace()
    attn_proj_flops = 2.0 * tokens * dims["params"] / tp
    attn_min = np.minimum.reduce([tokens, np.full(n, float(h)), dims["qkv_out"] / tp, dims["o_in"] / tp])
    d.t_attn_proj = _gemm(c, attn_proj_flops, attn_min)
    core_flops = 2.0 * tokens * s * model.heads * (dims["qk_head_dim"] + dims["v_head_dim"]) * 0.5 / tp
    d.t_core_f, d.t_core_b = compute.attention_time_s(prof, core_flops, s / cp, dims["qk_head_dim"], c.wide)
    if not fw["flash"]:
        # Unfused attention (2020-2022 Megatron): batched GEMMs plus softmax/dropout over the
        # a*s*s score matrix in fp16 (UNFUSED_SCORE_BYTES per score element forward, twice that backward).
        score_bytes = UNFUSED_SCORE_BYTES * model.heads * tokens * s / tp
        d.t_core_f = _gemm(c, core_flops * 2, np.minimum(s / cp, dims["qk_head_dim"]) * 8) + \
            compute.memory_bound_time_s(prof, score_bytes)
        d.t_core_b = 2 * _gemm(c, core_flops * 2, np.minimum(s / cp, dims["qk_head_dim"]) * 8) + \
            compute.memory_bound_time_s(prof, 2 * score_bytes)

    d.ln_tokens = np.where(sp, tokens / tp, tokens)          # LN / residual run on the SP shard
    gpt_dropout = 0.0 if model.gated_mlp else 1.0
    d.elem_attn = d.ln_tokens * (4 * h + 6 * h + gpt_dropout * 5 * h) + tokens * (2 * dims["qkv_out"]) / tp
    # one norm and residual of the two (a hybrid model's layer has one: _hybrid_means)
    d.elem_norm = d.ln_tokens * (5 * h + gpt_dropout * 2.5 * h)
    if c.fp8:
        d.elem_attn = d.elem_attn + tokens * c.q * (h + dims["o_in"] / tp)
    d.t_mlp_dense, elem_mlp_dense = _mlp_block(c, model.ffn_hidden, tokens, tp)
    mb_bytes_dense = eb * (d.elem_attn + elem_mlp_dense)

    # TP collectives: with SP 2 all-gathers + 2 reduce-scatters per pass, else 2 all-reduces.
    act_bytes = tokens * h * eb
    t_ag = comm.collective_time_s(prof, cluster, "all_gather", act_bytes, tp, c.tp_k, c.tp_N)
    t_rs = comm.collective_time_s(prof, cluster, "reduce_scatter", act_bytes, tp, c.tp_k, c.tp_N)
    t_ar = comm.collective_time_s(prof, cluster, "all_reduce", act_bytes, tp, c.tp_k, c.tp_N)
    d.t_tp = np.where(sp, 2 * (t_ag + t_rs), 2 * t_ar)
    d.tp_exp_f, d.tp_exp_b = _tp_exposed(d.t_tp, d.t_attn_proj + d.t_mlp_dense, fw, cal, c.wgrad)
    d.t_tp_exposed = 0.5 * (d.tp_exp_f + d.tp_exp_b)

    # CP: ring exchange of K and V, (cp-1) steps, overlapped with the attention chunks.
    kv_bytes = tokens * 2 * model.kv_head_count * dims["qk_head_dim"] * eb / tp
    if model.mla_kv_lora_rank:
        kv_bytes = tokens * 2 * model.heads * dims["qk_head_dim"] * eb / tp
    t_cp_f = (cp - 1) * comm.collective_time_s(prof, cluster, "send_recv", kv_bytes, cp, c.cp_k, c.cp_N)
    d.cp_exp_f = np.where(cp > 1, np.maximum(t_cp_f - d.t_core_f, 0.0) + CP_RING_EXPOSED_FRACTION * t_cp_f, 0.0)
    d.cp_exp_b = np.where(cp > 1, np.maximum(2 * t_cp_f - d.t_core_b, 0.0) + CP_RING_EXPOSED_FRACTION * t_cp_f,
                          0.0)

    d.mb_f = compute.memory_bound_time_s(prof, mb_bytes_dense)
    # Fixed host time per layer and micro-batch (kernel launches, Python): zero unless a profile's
    # calibration measured it (executor runs on CPU hosts, where it dominates small models).
    d.t_host = t_host = cal.layer_overhead_s
    d.dense_f = d.t_attn_proj + d.t_mlp_dense + d.t_core_f + d.mb_f + d.tp_exp_f + d.cp_exp_f + t_host
    d.dense_b = ((1 + c.wgrad) * (d.t_attn_proj + d.t_mlp_dense) + d.t_core_b + 2 * d.mb_f + d.tp_exp_b + d.cp_exp_b
                 + 2 * t_host)
    d.dense_comm_f = d.t_tp + t_cp_f
    d.dense_comm_b = d.t_tp + 2 * t_cp_f
    return d


def _moe_layer(c: SimpleNamespace, d: SimpleNamespace, attention: bool = True) -> dict[str, np.ndarray]:
    """One MoE layer's forward / backward seconds per micro-batch (``moe_f`` / ``moe_b``): the dense layer's
    attention (``d``), shared experts, router, routed experts on the hottest rank, the all-to-all and expert
    tensor-parallel communication, fixed per-layer overheads and the host floor. ``attention`` False: a hybrid
    model's MoE layer, its own norm and residual without the attention (:func:`_hybrid_means`). A LatentMoE
    (ModelSpec.moe_latent) projects each token to the latent width before the dispatch and back after the
    combine: the routed experts, their all-to-all and copies work in that width."""
    model, prof, cluster, cal = c.model, c.prof, c.cluster, c.cal
    h, n, tokens, tp, ep, etp, eb, imb = c.h, c.n, c.tokens, c.tp, c.ep, c.etp, c.eb, c.moe_imbalance
    lat = model.moe_latent or h
    k_top, E = model.moe_topk, model.num_experts
    shared_ffn = model.shared_experts * model.expert_ffn
    t_shared, elem_shared = (_mlp_block(c, shared_ffn, tokens, tp) if shared_ffn else (0.0, 0.0))
    router_flops = 2.0 * tokens * h * E / tp
    t_router = _gemm(c, router_flops, np.minimum(E, h))
    # Routed experts: tokens owned by the rank (tokens/tp with SP) go to k experts; balanced,
    # each expert holds tokens*k*ep/(tp*E) of them; the hottest rank sets the pace. With expert tensor
    # parallelism the etp ranks of an expert all-gather the tokens it received and each computes 1/etp
    # of its width (megatron-core alltoall dispatcher), reduce-scattering the outputs.
    own = tokens / tp
    gathered = own * etp
    per_expert = gathered * k_top * ep / E * imb
    exp_flops = 2.0 * gathered * k_top * expert_mlp_params(model) / etp * imb
    mn = np.minimum.reduce([per_expert, np.full(n, float(lat)), model.expert_ffn / etp])
    t_experts = _gemm(c, exp_flops, mn)
    # activation (with a clamped GLU's clamps and concatenation) + permute/unpermute copies
    act = (3 if model.gated_mlp else 2) + _clamp_elements(model)
    elem_exp = gathered * k_top * imb * (act * model.expert_ffn / etp + 4 * lat)
    if c.fp8:
        elem_exp = elem_exp + gathered * k_top * c.q * (lat + model.expert_ffn / etp)
    etp_k, etp_N = comm.group_span(1, etp, c.D)
    etp_bytes = gathered * k_top * lat * eb * imb
    t_etp = (comm.collective_time_s(prof, cluster, "all_gather", etp_bytes, etp, etp_k, etp_N)
             + comm.collective_time_s(prof, cluster, "reduce_scatter", etp_bytes, etp, etp_k, etp_N))
    # Routing work (permute/unpermute copies, expert activation, router softmax/top-k) is scaled by the
    # profile's moe_overhead: it runs as many small kernels that reach less than streaming bandwidth.
    elem_rest = d.elem_attn if attention else d.elem_norm
    mb_moe = compute.memory_bound_time_s(prof, eb * (elem_rest + elem_shared
                                                      + cal.moe_overhead * (elem_exp + own * E * 3)))
    limited = ((model.moe_router_groups, model.moe_router_group_topk) if model.moe_router_groups else None)
    t_a2a = 2 * comm.moe_dispatch_time_s(prof, cluster, own * lat * eb * imb, k_top, ep, c.ep_k, c.ep_N,
                                         nvlink_factor=cal.a2a_time, groups=limited)
    t_a2a = t_a2a + t_etp   # expert-parallel communication of the layer (zero with etp = 1)
    t_moe_fixed = MOE_LAYER_OVERHEAD_S * cal.moe_overhead
    t_experts = t_experts + 2.0 * (E / ep) * GROUPED_GEMM_FIXED_S * (prof.kind == "gpu")
    if attention:
        moe_gemm = d.t_attn_proj + t_shared + t_router + t_experts
        tp_exp_f, tp_exp_b = _tp_exposed(d.t_tp, moe_gemm, c.fw, cal, c.wgrad)
        core_f, core_b, cp_f, cp_b = d.t_core_f, d.t_core_b, d.cp_exp_f, d.cp_exp_b
    else:
        # the latent projections (h -> latent -> h, split over tp as the router is)
        t_latent = _gemm(c, 2.0 * tokens * 2 * h * lat / tp, np.minimum(tokens, float(lat))) if model.moe_latent \
            else 0.0
        moe_gemm = t_shared + t_router + t_experts + t_latent
        tp_exp_f, tp_exp_b = _tp_exposed(d.t_tp / 2, moe_gemm, c.fw, cal, c.wgrad)
        core_f = core_b = cp_f = cp_b = 0.0
    moe_f = moe_gemm + core_f + mb_moe + tp_exp_f + cp_f + t_a2a + t_moe_fixed + d.t_host
    moe_b = ((1 + c.wgrad) * moe_gemm + core_b + 2 * mb_moe + tp_exp_b + cp_b + t_a2a + 2 * t_moe_fixed
             + 2 * d.t_host)
    t_a2a_exposed = t_a2a
    if np.any(c.a.moe_a2a_overlap):
        # Forward plus backward computation, communication aside: what the overlap can hide the all-to-all behind.
        t_a2a_exposed = _a2a_exposed(c, t_a2a, moe_f + moe_b - 2.0 * t_a2a)
        moe_f, moe_b = moe_f - t_a2a + t_a2a_exposed, moe_b - t_a2a + t_a2a_exposed
    # Host floor (GPU profiles; a CPU-host profile's layer_overhead_s already is its host time): the layer
    # cannot finish before the host has issued it. Scaled by moe_overhead: the system's host CPU sets it. A
    # token-drop MoE padded to capacity has static shapes: no token counts go to the host and its layers can be
    # CUDA-graphed, so the host runs ahead of the GPU and sets no floor (ModelSpec.moe_token_drop; Megatron-Bridge
    # Qwen3-30B-A3B on 8 B200 at micro-batch 1: 14.5 s token-drop against 27-28 s dropless, the dropless runs
    # host-bound as modelled).
    t_moe_host = (MOE_HOST_FIXED_S + E / ep * MOE_HOST_PER_EXPERT_S) * cal.moe_overhead * (prof.kind == "gpu") \
        * (not model.moe_token_drop)
    return dict(moe_f=np.maximum(moe_f, t_moe_host), moe_b=np.maximum(moe_b, 2 * t_moe_host), mb_moe=mb_moe,
                t_tp_exposed_moe=0.5 * (tp_exp_f + tp_exp_b),
                t_a2a=t_a2a_exposed, t_a2a_raw=t_a2a, t_shared=t_shared, t_router=t_router, t_experts=t_experts,
                t_moe_fixed=t_moe_fixed, t_moe_host=t_moe_host)


def _a2a_exposed(c: SimpleNamespace, t_a2a, t_comp) -> np.ndarray:
    """Seconds of a MoE layer's expert-parallel communication (``t_a2a`` each way: dispatch and combine) left
    exposed in its forward and in its backward, ``t_comp`` its forward plus backward computation.

    All of it for plans without the overlap. With megatron-core's --overlap-moe-expert-parallel-comm the combined 1F1B
    schedule merges the forward of one micro-batch with the backward of another (combined_1f1b.py): a merged
    pair takes max(communication, compute) plus the compute slowed by the SMs the all-to-all kernels hold
    (EP_OVERLAP_SM_SHARE) while both run. Only the steady phase merges. Of a rank's m x vpp chunk passes, the
    warm-up forwards run alone (Megatron's interleaved schedule warms up with 2 (pp - rank - 1) + (vpp - 1) pp
    of them, (pp - 1) + (vpp - 1) pp on average over the ranks), and so does the one extra forward the overlap
    schedules; their backward passes run alone in the cool-down."""
    plain = np.broadcast_to(t_a2a, (c.n,)).astype(float)
    both = 2.0 * plain
    merged = np.maximum(both - t_comp, 0.0) + EP_OVERLAP_SM_SHARE * np.minimum(both, t_comp)
    chunks = c.m * c.vpp
    warmup = (c.pp - 1.0) + (c.vpp - 1.0) * c.pp
    steady = np.clip(chunks - warmup - 1.0, 0.0, None) / np.maximum(chunks, 1.0)
    return np.where(c.a.moe_a2a_overlap, steady * merged / 2.0 + (1.0 - steady) * plain, plain)


# The SSD scan costs, per token and head, what causal flash attention over this many tokens of this head width
# does: the sequence length at which Dao & Gu's SSD kernel and FlashAttention-2 take the same time (arXiv:2405.21060
# Sec. 9.3, Fig. 10: "faster than FlashAttention-2 starting at sequence length 2K"; head width 64 there).
SSD_ATTENTION_EQUIV_LEN = 2048
SSD_ATTENTION_EQUIV_DIM = 64


def _sublayer(f, b, mb, tp_exp, core_f=0.0, core_b=0.0, cp_f=0.0, cp_b=0.0, a2a=0.0, a2a_raw=0.0) -> dict:
    """One hybrid-model layer's terms, keyed as :func:`_hybrid_means` averages them."""
    return dict(f=f, b=b, mb=mb, tp_exp=tp_exp, core_f=core_f, core_b=core_b, cp_f=cp_f, cp_b=cp_b, a2a=a2a,
                a2a_raw=a2a_raw)


def _attention_sublayer(c: SimpleNamespace, d: SimpleNamespace) -> dict:
    """A hybrid model's attention layer (``*``): the dense layer's attention half, one norm and residual, half its
    tensor-parallel collectives."""
    mb = compute.memory_bound_time_s(c.prof, c.eb * (d.elem_attn - d.elem_norm))
    tp_f, tp_b = _tp_exposed(d.t_tp / 2, d.t_attn_proj, c.fw, c.cal, c.wgrad)
    f = d.t_attn_proj + d.t_core_f + mb + tp_f + d.cp_exp_f + d.t_host
    b = (1 + c.wgrad) * d.t_attn_proj + d.t_core_b + 2 * mb + tp_b + d.cp_exp_b + 2 * d.t_host
    return _sublayer(f, b, mb, 0.5 * (tp_f + tp_b), d.t_core_f, d.t_core_b, d.cp_exp_f, d.cp_exp_b)


def _mlp_sublayer(c: SimpleNamespace, d: SimpleNamespace) -> dict:
    """A hybrid model's MLP layer (``-``): the dense layer's MLP half."""
    t_mlp, elems = _mlp_block(c, c.model.ffn_hidden, c.tokens, c.tp)
    mb = compute.memory_bound_time_s(c.prof, c.eb * (elems + d.elem_norm))
    tp_f, tp_b = _tp_exposed(d.t_tp / 2, t_mlp, c.fw, c.cal, c.wgrad)
    return _sublayer(t_mlp + mb + tp_f + d.t_host, (1 + c.wgrad) * t_mlp + 2 * mb + tp_b + 2 * d.t_host, mb,
                     0.5 * (tp_f + tp_b))


def _mamba_sublayer(c: SimpleNamespace, d: SimpleNamespace) -> dict:
    """A hybrid model's Mamba-2 layer (``M``; flops.mamba_dims): in_proj and out_proj as GEMMs split over tp
    (column- and row-parallel, with the collectives of an attention block), the heads split over tp for the
    conv1d, the SSD scan and the gated norm. The scan is priced by the measured kernel's speed against flash
    attention (SSD_ATTENTION_EQUIV_LEN), not by its FLOPs (flops.ssd_forward_flops_per_token, which MFU counts);
    the element-wise traffic per token is in_proj's output split, the conv1d's read and write, the scan's inputs
    and output and its fp32 chunk states in and out (heads x P x N / chunk), and the gated norm's two reads and
    one write. Not fitted to any run."""
    model, tokens, tp = c.model, c.tokens, c.tp
    md = mamba_dims(model)
    h = c.h
    flops = 2.0 * tokens * h * (md["d_in_proj"] + md["d_inner"]) / tp
    t_gemm = _gemm(c, flops, np.minimum.reduce([tokens, np.full(c.n, float(h)), md["d_inner"] / tp]))
    # The SSD scan at the rate of the measured kernels: Dao & Gu (arXiv:2405.21060, Sec. 9.3, Fig. 10) time it
    # against FlashAttention-2 and find it as fast at 2K tokens (faster beyond), with little slowdown as the state
    # grows (N 64 to 256). So per token and head it costs what causal flash attention over SSD_ATTENTION_EQUIV_LEN
    # tokens of head width 64 costs on this GPU, forward and backward (compute.attention_time_s).
    eq = 2.0 * tokens * SSD_ATTENTION_EQUIV_LEN * md["heads"] * (2 * SSD_ATTENTION_EQUIV_DIM) * 0.5 / tp
    t_ssd, t_ssd_b = compute.attention_time_s(c.prof, eq, SSD_ATTENTION_EQUIV_LEN, SSD_ATTENTION_EQUIV_DIM, c.wide)
    states = 2 * 2 * md["heads"] * model.mamba_head_dim * model.mamba_state_dim / MAMBA_CHUNK
    elems = tokens / tp * (md["d_in_proj"] + 3 * md["conv_dim"] + md["heads"] + md["d_inner"] + states
                           + 3 * md["d_inner"]) + d.elem_norm
    if c.fp8:
        elems = elems + tokens * c.q * (h + md["d_inner"] / tp)
    mb = compute.memory_bound_time_s(c.prof, c.eb * elems)
    tp_f, tp_b = _tp_exposed(d.t_tp / 2, t_gemm, c.fw, c.cal, c.wgrad)
    # Context parallelism (megatron-core ssm/mamba_context_parallel.py): all-to-alls turn the cp sequence shards into
    # head shards before the conv1d and scan (x, B, C, dt) and back after it (y), on the mixer's path; the backward
    # runs them in reverse.
    a2a_bytes = tokens * (md["conv_dim"] + md["heads"] + md["d_inner"]) / tp * c.eb
    t_cp = np.where(c.cp > 1, comm.collective_time_s(c.prof, c.cluster, "all_to_all", a2a_bytes, c.cp, c.cp_k,
                                                     c.cp_N) * c.cal.comm_exposed, 0.0)
    f = t_gemm + t_ssd + mb + tp_f + t_cp + d.t_host
    b = (1 + c.wgrad) * t_gemm + t_ssd_b + 2 * mb + tp_b + t_cp + 2 * d.t_host
    return _sublayer(f, b, mb, 0.5 * (tp_f + tp_b), core_f=t_ssd, core_b=t_ssd_b, cp_f=t_cp, cp_b=t_cp)


def _hybrid_means(c: SimpleNamespace, lt: SimpleNamespace) -> None:
    """A hybrid model (ModelSpec.hybrid_pattern): every layer term becomes the mean over the pattern of its
    layers' (attention, MLP, MoE, Mamba-2), and the pipeline stages count layers of that mean. A stage's time is
    exact where it holds the pattern in proportion (pp 1), close where the pattern repeats within a stage."""
    model = c.model
    kinds = {"*": _attention_sublayer, "-": _mlp_sublayer, "M": _mamba_sublayer}
    parts = {}
    for kind, n in model.hybrid_counts.items():
        if not n:
            continue
        if kind == "E":
            e = _moe_layer(c, lt, attention=False)
            parts[kind] = _sublayer(e["moe_f"], e["moe_b"], e["mb_moe"], e["t_tp_exposed_moe"], a2a=e["t_a2a"],
                                    a2a_raw=e["t_a2a_raw"])
        else:
            parts[kind] = kinds[kind](c, lt)
    w = {k: model.hybrid_counts[k] / model.layers for k in parts}

    def mean(key):
        return sum(w[k] * np.asarray(parts[k][key], dtype=float) for k in parts) + np.zeros(c.n)

    f, b = mean("f"), mean("b")
    if model.is_moe:
        lt.moe_f, lt.moe_b = f, b
    else:
        lt.dense_f, lt.dense_b = f, b
    lt.mb_f = lt.mb_moe = mean("mb")
    lt.t_tp_exposed = lt.t_tp_exposed_moe = mean("tp_exp")
    lt.t_core_f, lt.t_core_b = mean("core_f"), mean("core_b")
    lt.cp_exp_f, lt.cp_exp_b = mean("cp_f"), mean("cp_b")
    lt.t_a2a, lt.t_a2a_raw = mean("a2a"), mean("a2a_raw")
    lt.t_tp = lt.t_tp / 2                       # each layer has one block's collectives
    lt.dense_comm_f = lt.dense_comm_b = lt.t_tp


def layer_terms(c: SimpleNamespace) -> SimpleNamespace:
    """Per-layer terms of one micro-batch on one rank: the dense layer (:func:`_dense_layer`), the MoE layer
    (:func:`_moe_layer`, zeros for a dense model) and what recomputing each costs (``rec_dense`` /
    ``rec_moe``: a whole forward with full recompute, the attention core with selective); a multi-token-prediction
    module's layer (``mtp_f`` / ``mtp_b``); for a hybrid model the means over its pattern (:func:`_hybrid_means`)."""
    lt = _dense_layer(c)
    if c.model.is_moe:
        vars(lt).update(_moe_layer(c, lt))
    else:
        lt.moe_f = lt.moe_b = lt.mb_moe = np.zeros(c.n)
        lt.t_tp_exposed_moe = lt.t_tp_exposed
        lt.t_a2a = lt.t_a2a_raw = np.zeros(c.n)
    # the module repeats the last layer (MoE unless all are dense; a hybrid model's MTP pattern, attention and MoE)
    lt.mtp_f, lt.mtp_b = (lt.moe_f, lt.moe_b) if c.model.is_moe_layer(c.model.layers - 1) else (lt.dense_f, lt.dense_b)
    if c.model.hybrid_pattern:
        _hybrid_means(c, lt)
    rc = c.a.recompute
    # Selective: the attention core, plus (flash era) the LayerNorms and MLP activation, which are
    # memory-bound: about a third of the layer's element-wise traffic.
    sel_dense = lt.t_core_f + (lt.mb_f / 3.0 if c.fw["flash"] else 0.0)
    sel_moe = lt.t_core_f + (lt.mb_moe / 3.0 if (c.fw["flash"] and c.model.is_moe) else 0.0)
    lt.rec_dense = np.where(rc == 2, lt.dense_f, np.where(rc == 1, sel_dense, 0.0))
    lt.rec_moe = np.where(rc == 2, lt.moe_f, np.where(rc == 1, sel_moe, 0.0))
    return lt


def _col(x) -> np.ndarray:
    """A per-plan array as a column, to broadcast against (plan, stage) arrays."""
    return np.asarray(x, dtype=float)[:, None]


def stage_times(c: SimpleNamespace, lt: SimpleNamespace) -> SimpleNamespace:
    """Per representative stage (:class:`Stages`) the forward, backward and recompute seconds of one
    micro-batch (``stage_f`` / ``stage_b`` / ``stage_rec``): its dense and MoE layers, the embedding on the
    first stage, LM head + cross-entropy and any multi-token-prediction modules on the last, plus the
    pipeline hops (``p2p_stage``); and the pipelined part of the step from the schedule (``pipe_s``,
    ``bubble_s``: pipeline.pipeline_time_s)."""
    model, prof, a, fw, cal = c.model, c.prof, c.a, c.fw, c.cal
    h, n, tokens, tp, pp, vpp, sp, eb, col = c.h, c.n, c.tokens, c.tp, c.pp, c.vpp, c.sp, c.eb, _col
    st = SimpleNamespace(stages=_stages(model, a))
    SL = st.SL = st.stages.layers
    st.valid = st.stages.valid
    st.n_moe = n_moe = model.moe_before(st.stages.start + SL) - model.moe_before(st.stages.start)
    st.n_dense = n_dense = SL - n_moe
    st.rl = np.where(a.recompute_layers[:, None] < 0, SL, np.minimum(a.recompute_layers[:, None], SL))
    st.rec_frac = rec_frac = np.where(SL > 0, st.rl / np.maximum(SL, 1), 0.0)
    stage_f = n_dense * col(lt.dense_f) + n_moe * col(lt.moe_f)
    stage_b = n_dense * col(lt.dense_b) + n_moe * col(lt.moe_b)
    stage_rec = rec_frac * (n_dense * col(lt.rec_dense) + n_moe * col(lt.rec_moe))
    st.k_off_dense, st.k_off_moe = _offloaded_layers(c, st)
    st.off_f, st.off_b = _offload_exposed(c, lt, st)
    stage_f, stage_b = stage_f + st.off_f, stage_b + st.off_b

    # Edge stages: embedding on the first, LM head + cross-entropy on the last.
    logit_flops = 2.0 * tokens * h * model.vocab / tp
    # The output layer runs outside the fp8 autocast region in megatron-core: always bf16.
    st.t_logit = t_logit = compute.gemm_time_s(prof, c.wide, logit_flops,
                                               np.minimum.reduce([tokens, np.full(n, float(h)), model.vocab / tp]))
    t_ce = compute.memory_bound_time_s(prof, tokens * model.vocab / tp * CROSS_ENTROPY_ELEMENT_BYTES
                                       * CROSS_ENTROPY_PASSES)
    t_emb = compute.memory_bound_time_s(prof, lt.ln_tokens * h * eb * 3)
    st.first, st.last = first, last = st.stages.first, st.stages.last
    stage_f = stage_f + first * col(t_emb) + last * col(t_logit + t_ce)
    stage_b = stage_b + first * col(t_emb) + last * col((1 + c.wgrad) * t_logit + t_ce)
    # Multi-token prediction (megatron-core: on the last stage): per module a layer of the last kind, the
    # 2h->h projection of [norm(h); norm(embedding)] and the shared output layer and loss once more.
    st.mtp = mtp = model.mtp_layers
    st.mtp_moe = mtp_moe = model.is_moe_layer(model.layers - 1)    # the module repeats the last layer
    if mtp:
        t_eh = _gemm(c, 2.0 * tokens * 2 * h * h / tp, np.minimum(tokens, float(h)))
        mtp_f = lt.mtp_f + t_eh + t_logit + t_ce
        mtp_b = lt.mtp_b + (1 + c.wgrad) * (t_eh + t_logit) + t_ce
        stage_f = stage_f + last * col(mtp * mtp_f)
        stage_b = stage_b + last * col(mtp * mtp_b)
        stage_rec = stage_rec + last * rec_frac * col(mtp * (lt.rec_moe if mtp_moe else lt.rec_dense))

    # Pipeline hops: activation send/recv per chunk and micro-batch, forward and backward.
    p2p_bytes = tokens * h * eb / np.where(sp, tp, 1.0)
    st.t_p2p = comm.collective_time_s(prof, c.cluster, "send_recv", p2p_bytes, 2 * np.ones(n), np.ones(n),
                                      np.where(c.pp_N > 1, 2.0, 1.0)) + P2P_FIXED_S
    # Megatron overlaps pipeline send/recv with compute only in the interleaved schedule: without virtual
    # stages it turns overlap_p2p_comm off (megatron/training/arguments.py: "non-interleaved schedule does
    # not support overlapping p2p communication") and each hop waits on its blocking batched send/recv.
    p2p_exposed = np.where(vpp > 1, fw["p2p_exposed"], 1.0)
    st.p2p_stage = np.where(pp > 1, 2 * vpp * st.t_p2p * p2p_exposed * cal.comm_exposed, 0.0)
    st.stage_f, st.stage_b, st.stage_rec = stage_f, stage_b, stage_rec
    st.stage_time = stage_f + stage_b + stage_rec + col(st.p2p_stage)
    st.pipe_s, st.bubble_s = pipeline.pipeline_time_s(st.stage_time, st.stages.weight, c.m, vpp)
    return st


def _offloaded_layers(c: SimpleNamespace, st: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) layers per stage whose activations go to host memory: with recompute='offload' (pp 1) the
    first ``recompute_layers`` of the model (megatron-core --cpu-offloading-num-layers; unset: all but the
    last), the dense ones first; zero for every other plan."""
    a = c.a
    k = np.where(a.recompute[:, None] == 3,
                 np.where(a.recompute_layers[:, None] < 0, st.SL - 1.0, np.minimum(a.recompute_layers[:, None], st.SL)),
                 0.0)
    k = np.maximum(k, 0.0)
    k_dense = np.minimum(k, st.n_dense)
    return k_dense, k - k_dense


def _layer_activation_bytes(c: SimpleNamespace, recompute=None) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) bytes one layer keeps for its backward per micro-batch at 2-byte activations
    (costmodel.memory.layer_activation_bytes) with the plans' ``recompute`` codes; None: without recomputation."""
    model, fw, n = c.model, c.fw, c.n
    rc = np.zeros(n) if recompute is None else recompute
    dense = memory.layer_activation_bytes(model, c.tokens, c.tp, c.sp, rc, fw["flash"], False, c.fp8,
                                          **c.selective_modules)
    moe = (memory.layer_activation_bytes(model, c.tokens * c.moe_imbalance, c.tp, c.sp, rc, fw["flash"], True,
                                         c.fp8, **c.selective_modules) if model.is_moe else np.zeros(n))
    return dense, moe


def _offload_exposed(c: SimpleNamespace, lt: SimpleNamespace, st: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    """Forward / backward seconds per micro-batch that activation offloading adds to a stage: each offloaded
    layer's activations cross the host link (HardwareProfile.host_link_bandwidth_bytes_per_s) one layer at a
    time, out while the next layer computes its forward and back in before the layer's own backward
    (Transformer Engine's CPU-offload handler behind megatron-core --cpu-offloading, which prefetches one
    layer ahead); a copy that takes longer than the layer it hides behind shows. Infinite without a known host
    link.

    On a GPU whose host link also carries its network traffic (HardwareProfile.host_link_shared_with_network: a
    PCIe GPU) a Megatron-FSDP plan whose shard group spans nodes gathers each layer's weights (and in the backward
    reduce-scatters its gradients) over the NIC while the layer computes, and those bytes cross the same PCIe link
    as the offload copies: the link then needs (offload + network bytes) / link rate a layer, and what that takes
    beyond the layer shows (:func:`_fsdp_layer_nic_bytes`). A layer whose network time outlasts it is FSDP's
    exposure (:func:`dp_tail`, the longer of the stage and its network time), so the step is at least the link's
    time, the network's and the layers' with their own copies, and no faster network makes it slower."""
    k_dense, k_moe = st.k_off_dense, st.k_off_moe
    if not (k_dense.any() or k_moe.any()):
        return np.zeros_like(k_dense), np.zeros_like(k_dense)
    link = c.prof.host_link_bandwidth_bytes_per_s
    rate = link.value if link is not None else 0.0
    bw = rate / (c.eb / 2.0)   # in 2-byte-activation bytes per second
    b_dense, b_moe = _layer_activation_bytes(c)
    with np.errstate(divide="ignore"):
        t_dense, t_moe = b_dense / bw, b_moe / bw
    col = _col
    shared = c.prof.host_link_shared_with_network and rate > 0
    nic = _fsdp_layer_nic_bytes(c) if shared else {}

    def shown(t_off, layer_s, key):
        alone = np.maximum(t_off - layer_s, 0.0)
        return np.maximum(alone, t_off + nic[key] / rate - layer_s) if shared else alone

    exp_f = k_dense * col(shown(t_dense, lt.dense_f, "dense_f")) + k_moe * col(shown(t_moe, lt.moe_f, "moe_f"))
    exp_b = k_dense * col(shown(t_dense, lt.dense_b, "dense_b")) + k_moe * col(shown(t_moe, lt.moe_b, "moe_b"))
    return exp_f, exp_b


def _fsdp_layer_nic_bytes(c: SimpleNamespace) -> dict[str, np.ndarray]:
    """Bytes one GPU's NIC moves each way for one layer of a Megatron-FSDP plan: the weight gather (forward,
    ``*_f``), the gather and the gradient reduce-scatter (backward, ``*_b``), dense and MoE layers apart. A
    collective over S ranks, k of them in each NVLink domain, brings each rank the (S - k) / S of the layer held in
    other domains, and NCCL spreads that over the k ranks' NICs (rings entering and leaving each domain at
    different ranks): B (S - k) / (S k) of B gathered bytes. Zero where the plan does not shard its weights
    (ZeRO < 3) or a shard group stays inside one domain."""
    model = c.model
    zero3 = np.asarray(c.a.zero_stage) >= 3
    grad_b = max(_grad_bytes(c), c.eb)

    def crossing(params, size, k, n_dom):
        return np.where(zero3 & (n_dom > 1), params * (size - k) / (size * k), 0.0)

    def layer(dense_params, expert_params):
        dense = crossing(dense_params / c.tp, c.sh, c.sh_k, c.sh_N)
        expert = crossing(expert_params / (c.ep * c.etp), c.sh_e, c.sh_e_k, c.sh_e_N)
        gather = (dense + expert) * c.eb
        return gather, gather + c.wgrad * (dense + expert) * grad_b

    out = dict(zip(("dense_f", "dense_b"), layer(layer_params(model, False)["dense"], 0.0)))
    lp_moe = layer_params(model, True) if model.is_moe else {"dense": 0.0, "expert": 0.0}
    out.update(zip(("moe_f", "moe_b"), layer(lp_moe["dense"], lp_moe["expert"])))
    return out


def _grad_bytes(c: SimpleNamespace) -> float:
    """Bytes a gradient element takes in the buffer the data-parallel reduce moves (costmodel/memory.py)."""
    if c.framework == "megatron-core" or c.framework.startswith("other"):
        return memory.GRAD_BYTES_CORE
    if c.model.precision == "fp16" and c.framework == "megatron-lm-2020":
        return memory.GRAD_BYTES_FP16_MEGATRON_LM_2020
    return memory.GRAD_BYTES


def stage_params(c: SimpleNamespace, st: SimpleNamespace) -> SimpleNamespace:
    """Parameters each stage's rank holds, dense (sharded over tp) and expert (over ep x etp), its layers'
    parameter counts (for the FSDP unit) and the ZeRO / distributed-optimizer sharding (``shard``,
    ``shard_e``: the group each optimizer state is split over)."""
    model, a, h, col = c.model, c.a, c.h, _col
    first, last, mtp, n_dense, n_moe = st.first, st.last, st.mtp, st.n_dense, st.n_moe
    p = SimpleNamespace()
    p.lp_dense = layer_params(model, False)
    p.lp_moe = layer_params(model, True) if model.is_moe else {"dense": 0.0, "expert": 0.0}
    emb = embedding_params(model)
    edge_params = first * emb["embedding"] + last * emb["lm_head"]
    lp_mtp = mtp_layer_params(model)
    mtp_dense = mtp * (lp_mtp["dense"] + 2.0 * h * h + 2.0 * h)    # layer, eh projection, two norms
    p.dense = (n_dense * p.lp_dense["dense"] + n_moe * p.lp_moe["dense"] + edge_params
               + last * mtp_dense) / col(c.tp)
    p.edge = edge_params / col(c.tp)    # vocabulary-parallel embedding and output layer (Adam's under Muon)
    p.expert = (n_moe * p.lp_moe["expert"] + last * mtp * lp_mtp["expert"]) / col(c.ep * c.etp)
    p.zero = a.zero_stage
    distopt = a.distributed_optimizer | (p.zero >= 1)
    p.dist = col(distopt)
    p.fsdp = col(p.zero >= 3)
    p.grad_b = max(_grad_bytes(c), c.eb)
    p.shard = np.where(p.dist, col(c.sh), 1.0)
    p.shard_e = np.where(p.dist, col(c.sh_e), 1.0)
    return p


def _bucket_latency(c: SimpleNamespace, collective, params, size, k_dom, n_dom, count):
    """Latency over many nodes (costmodel/scale.py): every gradient bucket (megatron-core DDP) and every FSDP
    layer is one NCCL collective whose latency grows with the ring (NCCL's tuning model); collective_time_s
    counted one small-message latency for the whole stage, so only the rest is returned."""
    once = c.prof.latency_s(collective) * np.where(n_dom > 1, 2.0, 1.0)
    each = np.where(n_dom > 1, scale.nccl_latency_s(collective, size, n_dom), c.prof.latency_s(collective))
    return np.where((size > 1) & (params > 0), np.maximum(count * each - once, 0.0), 0.0)


def dp_tail(c: SimpleNamespace, st: SimpleNamespace, p: SimpleNamespace) -> SimpleNamespace:
    """What each stage adds after its last micro-batch: the data-parallel gradient reduce and parameter
    gather (or Megatron-FSDP's per-micro-batch gathers and reduces) left exposed by the overlap with the
    last backward / first forward (``dp_exposed``, with the ``*_sync`` / ``fsdp_comm`` totals for the upper
    bound), gradient compression kernels (``t_compress``) and the optimizer step (``t_opt``)."""
    prof, cluster, fw, cal, gc, col = c.prof, c.cluster, c.fw, c.cal, c.grad_compression, _col
    dp_size, dp_k, dp_N, edp, edp_k, edp_N, m = c.dp_size, c.dp_k, c.dp_N, c.edp, c.edp_k, c.edp_N, c.m
    p_dense_stage, p_exp_stage, grad_b, valid, SL = p.dense, p.expert, p.grad_b, st.valid, st.SL
    wire_b = grad_b if gc is None else gc.wire_bytes_per_element

    # Each group as (size, members per NVLink domain, domains), one column per plan. Sharded gathers and
    # reduces run inside a replica's shard group; the replicas then all-reduce their gradient shards (none with
    # one replica). Without sharding (DDP) the gradients all-reduce over dp x cp.
    sh, sh_e, R = col(c.sh), col(c.sh_e), col(c.R)
    shard_d, shard_e = (sh, col(c.sh_k), col(c.sh_N)), (sh_e, col(c.sh_e_k), col(c.sh_e_N))
    ddp_d, ddp_e = (col(dp_size), col(dp_k), col(dp_N)), (col(edp), col(edp_k), col(edp_N))
    rep_grp_d, rep_grp_e = (R, col(c.rep_k), col(c.rep_N)), (R, col(c.rep_e_k), col(c.rep_e_N))

    # A dense model holds no expert parameters: its expert-group collectives are zero and are not computed.
    expert = c.model.is_moe

    def coll(kind, params, nbytes, group, of_experts=False):
        if of_experts and not expert:
            return 0.0
        return comm.collective_time_s(prof, cluster, kind, params * nbytes, *group)

    rs_d = coll("reduce_scatter", p_dense_stage, wire_b, shard_d)
    ar_d = coll("all_reduce", p_dense_stage, wire_b, ddp_d)
    ag_d = coll("all_gather", p_dense_stage, c.eb, shard_d)
    rep_d = coll("all_reduce", p_dense_stage / sh, wire_b, rep_grp_d)
    rs_e = coll("reduce_scatter", p_exp_stage, wire_b, shard_e, True)
    ar_e = coll("all_reduce", p_exp_stage, wire_b, ddp_e, True)
    ag_e = coll("all_gather", p_exp_stage, c.eb, shard_e, True)
    rep_e = coll("all_reduce", p_exp_stage / sh_e, wire_b, rep_grp_e, True)

    def latency(kind, count_d, count_e, group_d=shard_d, group_e=shard_e, params_d=p_dense_stage,
                params_e=p_exp_stage):
        return (_bucket_latency(c, kind, params_d, *group_d, count_d)
                + (_bucket_latency(c, kind, params_e, *group_e, count_e) if expert else 0.0))

    def replicas_latency(count_d, count_e):
        return latency("all_reduce", count_d, count_e, rep_grp_d, rep_grp_e, p_dense_stage / sh, p_exp_stage / sh_e)

    nb_d = scale.ddp_buckets(p_dense_stage, col(dp_size))
    nb_e = scale.ddp_buckets(p_exp_stage, col(edp))
    lat = {k: latency(k, nb_d, nb_e) for k in ("reduce_scatter", "all_gather")}
    lat["all_reduce"] = latency("all_reduce", nb_d, nb_e, ddp_d, ddp_e)
    lat["replicas"] = replicas_latency(nb_d, nb_e)
    # Megatron-FSDP: one gather / reduce per layer (its unit) and micro-batch, dense and expert groups apart.
    lat_fsdp = {k: latency(k, SL, SL) for k in ("reduce_scatter", "all_gather")}
    lat_fsdp["replicas"] = replicas_latency(SL, SL)
    dist, fsdp = p.dist, p.fsdp
    t = SimpleNamespace()
    # Frozen (LoRA) weights have no gradients to reduce and, unchanged, none to gather after the step.
    w = c.wgrad
    # The replicas all-reduce their gradient shards once a step on megatron-core (Megatron-FSDP: on the last
    # micro-batch, megatron_fsdp.py outer_fsdp_group_grad_reduce), in every backward on PyTorch FSDP's HSDP.
    rep_times = 1.0 if c.framework == "megatron-core" else col(m)
    # ZeRO-2 (Megatron-FSDP optim_grads, DeepSpeed stage 2) keeps only its gradient shard, so it reduce-scatters
    # in every backward (megatron_fsdp.py grad_reduce_every_bprop); the distributed optimizer on the last.
    zero2 = col(p.zero == 2) > 0      # (ZeRO-3 is fsdp)
    # Muon's layer-wise distributed optimizer keeps whole gradients on every rank: DDP all-reduces them.
    is_muon = c.model.optimizer == "muon"
    t.grad_sync = w * np.where((dist > 0) & (not is_muon),
                               np.where(zero2, col(m), 1.0) * (rs_d + rs_e + lat["reduce_scatter"])
                               + np.where(zero2, rep_times, 1.0) * (rep_d + rep_e + lat["replicas"]),
                               ar_d + ar_e + lat["all_reduce"])
    t.param_sync = w * np.where(dist, ag_d + ag_e + lat["all_gather"], 0.0)
    # FSDP gathers weights for every micro-batch forward and backward and reduce-scatters grads.
    t.fsdp_comm = (col(m) * (2 * (ag_d + ag_e + lat_fsdp["all_gather"]) + w * (rs_d + rs_e + lat_fsdp["reduce_scatter"]))
                   + w * rep_times * (rep_d + rep_e + lat_fsdp["replicas"]))
    stage_f, stage_b, vpp = st.stage_f, st.stage_b, c.vpp
    if fw["dp_overlap"]:
        # Overlapped with the last micro-batch's backward / the first one's forward; the last bucket
        # (~1/8 of a stage's gradients, Megatron's bucket size relative to a layer stack) stays exposed.
        # ZeRO-2's reduces run under every micro-batch's backward, the last one's tail exposed.
        last_b = np.where(zero2, col(m) * (stage_b + st.stage_rec), stage_b / col(vpp) + st.stage_rec / col(vpp))
        first_f = stage_f / col(vpp)
        # Muon's layer-wise distributed optimizer gathers the updated weights inside its step
        # (layer_wise_optimizer.py step -> allgather_params), before the next forward: nothing hides it.
        param_exposed = t.param_sync if is_muon else np.maximum(t.param_sync - first_f, 0.0) + 0.125 * t.param_sync
        grad_exposed = np.maximum(t.grad_sync - last_b, 0.0) + 0.125 * t.grad_sync / np.where(zero2, col(m), 1.0)
        if not fw["pp_grad_overlap"]:
            grad_exposed = np.where(col(c.pp) > 1, t.grad_sync, grad_exposed)
        dp_exposed = (grad_exposed + param_exposed) * cal.comm_exposed
        fsdp_exposed = (np.maximum(t.fsdp_comm - col(m) * (stage_f + stage_b), 0.0)
                        + FSDP_EXPOSED_FRACTION * t.fsdp_comm)
    else:
        dp_exposed = t.grad_sync + t.param_sync
        fsdp_exposed = t.fsdp_comm
    dp_exposed = np.where(fsdp > 0, fsdp_exposed, dp_exposed)
    t.dp_exposed = np.where(valid, dp_exposed, 0.0)
    if gc is not None:
        # Compress/decompress kernels over the local gradients (per micro-batch with FSDP): they occupy the
        # GPU, so nothing hides them.
        t_compress = compute.memory_bound_time_s(
            prof, (p_dense_stage + p_exp_stage) * gc.kernel_bytes_per_element(grad_b))
        t.t_compress = np.where(valid, c.wgrad * t_compress * np.where(fsdp > 0, col(m), 1.0), 0.0)
    else:
        t.t_compress = np.zeros_like(t.dp_exposed)

    # Optimizer (Adam, memory-bound): read param, grad, m, v (fp32); write param, m, v and the bf16 copy. The
    # share offloaded to the host (optimizer_offload) steps on the CPU while the GPU steps the rest.
    opt_params = p_dense_stage / p.shard + p_exp_stage / p.shard_e
    off = col(c.a.optimizer_offload)
    t_opt = c.wgrad * compute.memory_bound_time_s(prof, (1.0 - off) * opt_params * 34.0)
    if np.any(off > 0):
        t_opt = np.maximum(t_opt, c.wgrad * compute.cpu_optimizer_time_s(prof, off * opt_params, col(c.host_share)))
    if is_muon:
        t_opt = t_opt + c.wgrad * _newton_schulz_s(c, st, p)
    t.t_opt = np.where(valid, t_opt, 0.0)
    t.stage_tail = t.dp_exposed + t.t_compress + t.t_opt
    t.tail = t.stage_tail.max(axis=1)
    return t


def _newton_schulz_s(c: SimpleNamespace, st: SimpleNamespace, p: SimpleNamespace) -> np.ndarray:
    """Seconds of Muon's Newton-Schulz iterations on each stage's rank (costmodel/muon.py): its layers'
    matrices (an MTP module's layer on the last stage), dealt over the ranks sharing the optimizer state
    (``shard``, ``shard_e``: 1 without the distributed optimizer)."""
    ns = muon.newton_schulz_layer_s(c.model, c.prof, c.tp, c.etp, c.ep)
    dense, moe_dense, expert = _col(ns["dense"]), _col(ns["moe_dense"]), _col(ns["expert"])
    mtp = st.last * st.mtp
    mtp_dense = moe_dense if st.mtp_moe else dense
    own = st.n_dense * dense + st.n_moe * moe_dense + mtp * mtp_dense
    return own / p.shard + (st.n_moe + mtp * st.mtp_moe) * expert / p.shard_e


def stage_memory(c: SimpleNamespace, st: SimpleNamespace, p: SimpleNamespace) -> SimpleNamespace:
    """Peak memory of one GPU of each stage (``peak``): weights, gradients, optimizer state, the activations
    of the micro-batches in flight (partial recompute, MTP, the last stage's logits), FSDP's unsharded
    layers, workspaces and fragmentation; ``fits`` when every stage is within the usable capacity."""
    model, a, fw, eb, tokens, tp, col = c.model, c.a, c.fw, c.eb, c.tokens, c.tp, _col
    SL, rl, n_dense, n_moe, last, mtp, fp8 = st.SL, st.rl, st.n_dense, st.n_moe, st.last, st.mtp, c.fp8
    rc_arr = a.recompute
    act_dense, act_moe = _layer_activation_bytes(c, rc_arr)
    act_none_dense, act_none_moe = _layer_activation_bytes(c)
    # Partial full-recompute: recomputed layers keep their input only, the rest keep everything.
    full = col(rc_arr == 2)
    per_mb = np.where(full,
                      rl * (n_dense / np.maximum(SL, 1) * col(act_dense) + n_moe / np.maximum(SL, 1) * col(act_moe))
                      + (SL - rl) * (n_dense / np.maximum(SL, 1) * col(act_none_dense)
                                     + n_moe / np.maximum(SL, 1) * col(act_none_moe)),
                      n_dense * col(act_dense) + n_moe * col(act_moe))
    # Offloaded layers (recompute='offload') keep nothing on the GPU but the layer in transit; host memory holds
    # the rest of one micro-batch (pp 1: one in flight).
    k_dense, k_moe = st.k_off_dense, st.k_off_moe
    offloaded = k_dense * col(act_none_dense) + k_moe * col(act_none_moe)
    per_mb = per_mb - offloaded + np.where(k_dense + k_moe > 0, col(np.maximum(act_none_dense, act_none_moe)), 0.0)
    inflight = pipeline.in_flight_microbatches(c.pp, c.vpp, c.m, st.stages.index)
    if np.any(c.a.moe_a2a_overlap):
        # The overlap's schedule runs one more forward chunk ahead of its backward (schedules.py: "one extra
        # micro-batch"): one chunk's activations more on every stage.
        inflight = inflight + np.where(c.a.moe_a2a_overlap, 1.0 / c.vpp, 0.0)[:, None]
    # Working set of the layer being recomputed / computed (one layer's full activations).
    working = np.where(full, col(np.maximum(act_none_dense, act_none_moe)), 0.0)
    if mtp:   # the module's layer (recomputed like the stage's layers) and its logits
        a_rc, a_none = (act_moe, act_none_moe) if st.mtp_moe else (act_dense, act_none_dense)
        per_mb = per_mb + last * mtp * np.where(full, st.rec_frac * col(a_rc) + (1 - st.rec_frac) * col(a_none),
                                                col(a_rc))
    # The last stage's logits are live from its loss forward to the output layer's backward; a fully
    # recomputed layer is rebuilt only inside its own backward (megatron-core tensor_parallel/random.py
    # CheckpointFunction.backward), after the logits gradient is consumed: the peak holds one or the other.
    logit_b = eb if fw["te_ce"] else memory.LOGITS_BYTES_UNFUSED
    logits = col((1 + mtp) * memory.logits_bytes(model, tokens, tp, logit_b))
    work_b = working * (eb / 2.0)
    mem = SimpleNamespace()
    mem.activations = (per_mb * inflight * (eb / 2.0) + np.where(last, np.maximum(work_b, logits), work_b)) \
        * c.cal.activation_memory
    p_dense_stage, p_exp_stage, grad_b, fsdp, zero = p.dense, p.expert, p.grad_b, p.fsdp, p.zero
    # FP8 weights stay FP8 only with Megatron's distributed optimizer or FSDP (--fp8-param-gather), not under
    # Muon's layer-wise one (planner/outputs.py _fp8_param_flags).
    fp8_params = (p.dist > 0) & (model.optimizer != "muon")
    w_bytes = max(memory.WEIGHT_BYTES, eb) + (np.where(fp8_params, 0.0, memory.FP8_WEIGHT_EXTRA_BYTES_UNSHARDED)
                                              if fp8 else 0.0)
    p_stage = p_dense_stage + p_exp_stage
    mem.weights = np.where(fsdp > 0, p_dense_stage * w_bytes / col(c.sh) + p_exp_stage * w_bytes / col(c.sh_e),
                           p_stage * w_bytes)
    mem.grads = c.wgrad * np.where(col(zero >= 2), p_dense_stage * grad_b / col(c.sh)
                                   + p_exp_stage * grad_b / col(c.sh_e), p_stage * grad_b)
    if c.grad_compression is not None:
        mem.grads = mem.grads + c.wgrad * p_stage * c.grad_compression.residual_bytes_per_element
    adam_b = memory.optimizer_state_bytes(model.precision)
    if model.optimizer == "muon":
        # Muon's matrices keep one momentum beside the fp32 master weight; the embedding and output layer Adam's.
        muon_b = memory.muon_state_bytes(model.precision)
        opt_bytes = c.wgrad * (adam_b * p.edge / p.shard
                               + muon_b * ((p_dense_stage - p.edge) / p.shard + p_exp_stage / p.shard_e))
    else:
        opt_bytes = c.wgrad * adam_b * (p_dense_stage / p.shard + p_exp_stage / p.shard_e)
    # Optimizer offload: that share of the state (and a pinned fp32 copy of its gradients) lives in host memory.
    # DeepSpeed's ZeRO-Offload also moves the gradient shard it keeps (ZeRO-2 and up) to the host as it is
    # reduced; megatron-core keeps its gradient buffer on the GPU.
    off = col(a.optimizer_offload)
    mem.optim = (1.0 - off) * opt_bytes
    if c.framework.startswith("other"):
        mem.grads = np.where(col(zero >= 2), (1.0 - off) * mem.grads, mem.grads)
    host_optim = off * (opt_bytes + c.wgrad * compute.OFFLOAD_GRAD_BYTES * (p_dense_stage / p.shard
                                                                            + p_exp_stage / p.shard_e))
    # Megatron-FSDP materialises layers' weights (all-gathered: the one at work and the prefetch) and, in the
    # backward, their gradients before the reduce-scatter (the one reduced and the queue): memory.py
    # fsdp_unsharded_elements. An FSDP unit is one TransformerLayer on this rank: its expert part holds the
    # local experts only (E/ep, sharded over the expert data-parallel group; megatron-core
    # distributed/fsdp/mcore_fsdp_adapter.py:221-282 builds the expert mesh from expt_dp and expt_tp).
    lp_dense, lp_moe = p.lp_dense, p.lp_moe
    layer_p = np.maximum((n_dense > 0) * lp_dense["dense"] / col(tp),
                         (n_moe > 0) * (lp_moe["dense"] / col(tp) + lp_moe["expert"] / col(c.ep * c.etp)))
    w_unsh, g_unsh = memory.fsdp_unsharded_elements(layer_p, SL)
    unsharded = np.where(fsdp > 0, w_unsh * w_bytes, 0.0) + c.wgrad * np.where(col(zero >= 2), g_unsh * grad_b, 0.0)
    live = mem.weights + mem.grads + mem.optim + mem.activations + unsharded
    mem.buffers = memory.WORKSPACE_BYTES + memory.FRAGMENTATION * live
    mem.peak = np.where(st.valid, live + mem.buffers, 0.0)
    mem.capacity = c.prof.memory_bytes.value * c.prof.usable_memory_fraction
    mem.host = np.where(st.valid, offloaded * (eb / 2.0) + host_optim, 0.0)
    host = c.prof.host_memory_bytes
    host_cap = host.value * memory.HOST_USABLE_FRACTION * col(c.host_share) if host is not None else np.inf
    mem.host_capacity = np.broadcast_to(host_cap, mem.host.shape)[:, 0]
    mem.host_fits = (mem.host <= host_cap).all(axis=1)
    mem.fits = (mem.peak <= mem.capacity).all(axis=1) & mem.host_fits
    return mem


def step_time_s(pipe_s, tail_s, world, on_gpus) -> tuple[np.ndarray, np.ndarray]:
    """(step seconds, straggler seconds) from the pipelined part and the slowest stage's tail: stragglers
    (costmodel/scale.py: the pipeline runs at the pace of the slowest of the ``world`` GPUs; GPU profiles
    only) and the fixed STEP_OVERHEAD_S added. Shared by :func:`compose_step` and costmodel/hetero.py."""
    t_strag = scale.straggler_fraction(world) * pipe_s * on_gpus
    return pipe_s + t_strag + tail_s + STEP_OVERHEAD_S, t_strag


def mfu(model_flops, step_s, gpus, peak_flops):
    """Model FLOPs utilisation: model FLOPs of a step over ``gpus`` GPUs' dense ``peak_flops`` for the step.
    Shared by :func:`compose_step` and costmodel/hetero.py."""
    return model_flops / (step_s * gpus * peak_flops)


def _bounds(c, lt, st, p, t, step) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) step seconds: every overlappable collective hidden vs none hidden."""
    col, m, n_dense, n_moe, valid = _col, c.m, st.n_dense, st.n_moe, st.valid
    overl_layer = n_dense * col(lt.dense_comm_f + lt.dense_comm_b - 2 * lt.t_tp_exposed) + \
        n_moe * col(2 * lt.t_tp - 2 * lt.t_tp_exposed_moe)
    upper = step + (col(m) * np.where(valid, overl_layer, 0.0)).max(axis=1) + \
        np.where(valid, np.where(p.fsdp > 0, t.fsdp_comm, t.grad_sync + t.param_sync) - t.dp_exposed,
                 0.0).max(axis=1)
    hidden_now = (col(m) * np.where(valid, n_dense * col(2 * lt.t_tp_exposed) + n_moe * col(2 * lt.t_tp_exposed_moe),
                                    0.0)).max(axis=1)
    lower = np.maximum(step - hidden_now - t.dp_exposed.max(axis=1), 0.0)
    return lower, upper


def _outputs(c, lt, st, t, mem, step, t_strag, lower, upper) -> dict[str, np.ndarray]:
    """The arrays estimate_arrays returns, keyed by quantity (per plan, or per plan and stage)."""
    model, a, n, m, col = c.model, c.a, c.n, c.m, _col
    n_dense, n_moe, SL, valid, stage_time = st.n_dense, st.n_moe, st.SL, st.valid, st.stage_time
    world = c.tp * c.pp * c.dp * c.cp
    mflops = model_flops_per_step(model, a.global_batch)
    i_max = np.argmax(np.where(valid, stage_time, -1.0), axis=1)
    rows = np.arange(n)
    details = {"attn_proj_s": lt.t_attn_proj, "attn_core_fwd_s": lt.t_core_f, "attn_core_bwd_s": lt.t_core_b,
               "mlp_dense_s": lt.t_mlp_dense, "memory_bound_dense_s": lt.mb_f, "tp_comm_s": lt.t_tp,
               "layer_dense_fwd_s": lt.dense_f, "layer_dense_bwd_s": lt.dense_b, "layer_moe_fwd_s": lt.moe_f,
               "layer_moe_bwd_s": lt.moe_b, "a2a_s": lt.t_a2a_raw, "logits_s": st.t_logit, "p2p_s": st.t_p2p}
    if c.grad_compression is not None:
        details["grad_compression_s"] = t.t_compress.max(axis=1)
    if model.is_moe:
        details.update({"experts_s": lt.t_experts, "shared_s": lt.t_shared, "router_s": lt.t_router,
                        "memory_bound_moe_s": lt.mb_moe, "moe_fixed_s": np.full(n, lt.t_moe_fixed),
                        "moe_host_s": lt.t_moe_host})
    m_col = col(m)[:, 0]
    per_layer_tp = col(2 * lt.t_tp_exposed)
    return {
        "details": details,
        "step_time_s": step,
        "step_time_lower_s": np.minimum(lower, step),
        "step_time_upper_s": np.maximum(upper, step),
        "pipeline_s": st.pipe_s,
        "bubble_s": st.bubble_s,
        "compute_s": m_col * (st.stage_f + st.stage_b)[rows, i_max] - m_col * (
            n_dense * col(2 * lt.t_tp_exposed + lt.cp_exp_f + lt.cp_exp_b)
            + n_moe * col(2 * lt.t_tp_exposed_moe + 2 * lt.t_a2a) + st.off_f + st.off_b)[rows, i_max],
        "recompute_s": m_col * st.stage_rec[rows, i_max],
        "offload_s": m_col * (st.off_f + st.off_b)[rows, i_max],
        "tp_comm_exposed_s": m_col * (n_dense * per_layer_tp + n_moe * col(2 * lt.t_tp_exposed_moe))[rows, i_max],
        "cp_comm_exposed_s": m_col * (SL * col(lt.cp_exp_f + lt.cp_exp_b))[rows, i_max],
        "ep_comm_exposed_s": m_col * (n_moe * col(2 * lt.t_a2a))[rows, i_max],
        "pp_comm_exposed_s": m * st.p2p_stage,
        "dp_comm_exposed_s": (t.dp_exposed + t.t_compress).max(axis=1),
        "optimizer_s": t.t_opt.max(axis=1),
        "straggler_s": t_strag,
        "stage_tail_s": np.where(valid, t.stage_tail, np.nan),  # after the last micro-batch
        "stage_time_s": np.where(valid, stage_time, np.nan),
        "peak_memory_bytes": np.where(valid, mem.peak, np.nan),
        "weights_bytes": mem.weights[rows, 0],
        "grads_bytes": mem.grads[rows, 0],
        "optimizer_bytes": mem.optim[rows, 0],
        "activations_bytes": mem.activations[rows, 0],
        "buffers_bytes": mem.buffers[rows, 0],
        "host_offload_bytes": mem.host[rows, 0],
        "host_capacity_bytes": mem.host_capacity,
        "memory_capacity_bytes": np.full(n, mem.capacity),
        "fits": mem.fits,
        "host_fits": mem.host_fits,
        "model_flops_per_step": mflops,
        "tokens_per_s_per_gpu": a.global_batch * c.s / (step * world),
        "mfu": mfu(mflops, step, world, c.prof.peak(c.dtype)),
    }


def compose_step(model: ModelSpec, cluster: ClusterSpec, a: PlanArrays, prof: HardwareProfile, *,
                 framework: str = "megatron-core", moe_imbalance: float = 1.0,
                 grad_compression: GradCompression | None = None) -> dict[str, np.ndarray]:
    """The step of every plan in ``a``, composed from its terms: :func:`layer_terms` (one layer's compute,
    recompute and exposed TP / CP / EP comm), :func:`stage_times` (each stage's micro-batch and the
    pipeline schedule), :func:`dp_tail` (data-parallel sync and optimizer after the last micro-batch) and
    :func:`stage_memory`; then :func:`step_time_s`, the bounds and the outputs."""
    c = _context(model, cluster, a, prof, framework, moe_imbalance, grad_compression)
    lt = layer_terms(c)
    st = stage_times(c, lt)
    p = stage_params(c, st)
    t = dp_tail(c, st, p)
    mem = stage_memory(c, st, p)
    world = c.tp * c.pp * c.dp * c.cp
    step, t_strag = step_time_s(st.pipe_s, t.tail, world, prof.kind == "gpu")
    lower, upper = _bounds(c, lt, st, p, t, step)
    return _outputs(c, lt, st, t, mem, step, t_strag, lower, upper)


def estimate_arrays(model: ModelSpec, cluster: ClusterSpec, a: PlanArrays, *,
                    profile: HardwareProfile | None = None, framework: str = "megatron-core",
                    moe_imbalance: float = 1.0,
                    grad_compression: GradCompression | None = None) -> dict[str, np.ndarray]:
    """Score every plan in ``a`` (:func:`compose_step`). Returns arrays keyed by quantity (per plan, or per
    plan and stage).

    ``grad_compression`` (costmodel/compression.py) quantises the data-parallel gradient collective: its
    bytes shrink, the compress/decompress kernels add HBM-bound time to the step (reported within
    ``dp_comm_exposed_s``) and the error-feedback residual adds to the gradient memory. None: uncompressed.
    """
    return compose_step(model, cluster, a, profile or load_profile(cluster.gpu), framework=framework,
                        moe_imbalance=moe_imbalance, grad_compression=grad_compression)


BREAKDOWN_KEYS = ("compute_s", "recompute_s", "offload_s", "bubble_s", "tp_comm_exposed_s", "cp_comm_exposed_s",
                  "ep_comm_exposed_s", "pp_comm_exposed_s", "dp_comm_exposed_s", "optimizer_s", "straggler_s")


def to_step_estimate(out: dict[str, np.ndarray], i: int = 0) -> StepEstimate:
    """Plan ``i`` of an estimate_arrays result as a StepEstimate."""
    stage = out["stage_time_s"][i]
    peak = out["peak_memory_bytes"][i]
    return StepEstimate(
        step_time_s=float(out["step_time_s"][i]),
        step_time_lower_s=float(out["step_time_lower_s"][i]),
        step_time_upper_s=float(out["step_time_upper_s"][i]),
        breakdown_s={k.removesuffix("_s"): float(out[k][i]) for k in BREAKDOWN_KEYS},
        tokens_per_s_per_gpu=float(out["tokens_per_s_per_gpu"][i]),
        mfu=float(out["mfu"][i]),
        model_flops_per_step=float(out["model_flops_per_step"][i]),
        stage_time_s=tuple(float(x) for x in stage[~np.isnan(stage)]),
        peak_memory_bytes=tuple(float(x) for x in peak[~np.isnan(peak)]),
        memory_capacity_bytes=float(out["memory_capacity_bytes"][i]),
        fits=bool(out["fits"][i]),
        memory_breakdown_bytes={k.removesuffix("_bytes"): float(out[k][i]) for k in
                                ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                                 "buffers_bytes", "host_offload_bytes")},
    )


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
             profile: HardwareProfile | None = None, moe_imbalance: float = 1.0,
             grad_compression: GradCompression | None = None) -> StepEstimate:
    """Step time and memory of one plan, with every pipeline stage reported."""
    plan = plan.with_even_split(model.layers)
    out = compose_step(model, cluster, PlanArrays.from_plans([plan]), profile or load_profile(cluster.gpu),
                       framework=plan.framework, moe_imbalance=moe_imbalance, grad_compression=grad_compression)
    return to_step_estimate(out, 0)
