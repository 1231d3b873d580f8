"""estimate(model, cluster, plans) -> step time, breakdown and memory, vectorised over plans.

The step is built bottom-up for one micro-batch on one rank of each pipeline stage:
  layer forward  = GEMMs + flash attention + memory-bound kernels + exposed TP / CP / EP comm
  layer backward = 2x GEMMs + attention backward + 2x memory-bound + exposed comm
  recompute      = a layer forward (full) or the attention core (selective)
then the pipeline schedule (pipeline.py) turns stage times into the step, and the data-parallel
gradient / parameter collectives add what the overlap with the last backward / first forward does
not hide, plus the optimizer step. Both bounds are reported: every overlappable collective hidden
(lower) and none hidden (upper).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm, compute, memory, pipeline, scale
from costmodel.compression import GradCompression
from costmodel.flops import attention_proj_dims, layer_params, embedding_params, mlp_params, model_flops_per_step
from costmodel.profiles import HardwareProfile, load_profile
from costmodel.plan import RECOMPUTE_CODE, ParallelPlan, PlanArrays  # noqa: F401  (RECOMPUTE_CODE: callers)
from costmodel.specs import ClusterSpec, ModelSpec, StepEstimate


# What each framework generation overlaps (fraction of the overlappable communication left exposed).
# megatron-core with --tp-comm-overlap (userbuffers) hides most TP traffic behind the GEMMs;
# Megatron-LM of 2020/2021 ran TP all-reduces and the DP all-reduce without overlap
# (Narayanan et al. 2021 Sec. 4; Korthikanti et al. 2022 Sec. 5 added none). Paxml (JAX/XLA) is taken to
# compute attention unfused (XLA's cuDNN flash-attention path is opt-in), with its FSDP overlapped.
# "te_ce": the cross-entropy runs as Transformer Engine's fused kernel, in place on the logits
# (costmodel/memory.py LOGITS_BYTES_TE_FUSED; megatron-core and the flags planner/outputs.py writes).
FRAMEWORK = {
    "megatron-core": {"tp_exposed": 0.25, "dp_overlap": True, "flash": True, "p2p_exposed": 0.5, "te_ce": True},
    "megatron-lm-2021": {"tp_exposed": 1.0, "dp_overlap": False, "flash": False, "p2p_exposed": 1.0, "te_ce": False},
    "megatron-lm-2020": {"tp_exposed": 1.0, "dp_overlap": False, "flash": False, "p2p_exposed": 1.0, "te_ce": False},
    "paxml": {"tp_exposed": 0.5, "dp_overlap": True, "flash": False, "p2p_exposed": 0.5, "te_ce": False},
    # A stack other than Megatron or Paxml (DeepSpeed, PyTorch FSDP, torchtitan, MaxText, ...): flash attention
    # and overlapped data-parallel reduction are taken as given, but not Transformer Engine's userbuffer
    # overlap of tensor-parallel collectives with the GEMMs or Megatron's interleaved p2p overlap, which are
    # Megatron features (Megatron-LM --tp-comm-overlap, --overlap-p2p-communication), nor its fused
    # cross-entropy.
    "other": {"tp_exposed": 1.0, "dp_overlap": True, "flash": True, "p2p_exposed": 1.0, "te_ce": False},
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
# Per chunk and micro-batch fixed cost of a pipeline hop (p2p launch, synchronisation).
P2P_FIXED_S = 60e-6


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
    even = pipeline.stage_split_even(model.layers, pp, max_pp)
    sl = a.stage_layers
    if sl.shape[1] < max_pp:
        sl = np.pad(sl, ((0, 0), (0, max_pp - sl.shape[1])))
    layers = np.where(np.isnan(sl[:, :1]), even, sl[:, :max_pp])
    i = np.arange(max_pp)[None, :]
    w = (i < pp[:, None]).astype(float)
    start = np.cumsum(layers, axis=1) - layers
    return Stages(layers, w, np.broadcast_to(i, layers.shape).astype(float), np.broadcast_to(i == 0, layers.shape),
                  i == (pp[:, None] - 1), start)


def estimate_arrays(model: ModelSpec, cluster: ClusterSpec, a: PlanArrays, *,
                    profile: HardwareProfile | None = None, framework: str = "megatron-core",
                    moe_imbalance: float = 1.0,
                    grad_compression: GradCompression | None = None) -> dict[str, np.ndarray]:
    """Score every plan in ``a``. Returns arrays keyed by quantity (per plan, or per plan and stage).

    ``grad_compression`` (costmodel/compression.py) quantises the data-parallel gradient collective: its
    bytes shrink, the compress/decompress kernels add HBM-bound time to the step (reported within
    ``dp_comm_exposed_s``) and the error-feedback residual adds to the gradient memory. None: uncompressed.
    """
    prof = profile or load_profile(cluster.gpu)
    fw = FRAMEWORK[framework]
    if prof.kind == "host":
        # CPU processes on gloo: collectives run synchronously on the calling thread (no side streams), so
        # no TP, pipeline or data-parallel communication overlaps compute.
        fw = dict(fw, tp_exposed=1.0, p2p_exposed=1.0, dp_overlap=False, flash=False)
    cal = prof.calibration
    dtype = compute.gemm_dtype(model.precision)
    fp8 = dtype in ("fp8", "fp4")
    # Quantisation traffic per GEMM-input element, in units of bf16 elements (2 bytes): fp8 reads 2 B
    # and writes a row-wise and a column-wise (transposed) 1 B copy; MXFP8 adds 1/32 scales; NVFP4
    # writes two 0.5 B copies plus scales and runs a Hadamard transform pass on the wgrad inputs
    # (NVIDIA NVFP4 recipe, arXiv:2509.25149).
    q = {"fp8": 2.0, "mxfp8": 2.1, "nvfp4": 3.5}.get(model.precision, 0.0)
    # Bytes per activation element: 2 (bf16/fp16 and the fp8 recipes' high-precision tensors), 4 for fp32
    # training (the executor on CPUs without bf16 arithmetic).
    eb = memory.activation_element_bytes(model.precision)
    D = cluster.domain_gpus
    h, s = model.hidden, model.seq_len
    tp, pp, vpp, dp, cp = a.tp, a.pp, a.vpp, a.dp, a.cp
    ep, etp, sp, mbs = a.ep, a.etp, a.sp & (a.tp > 1), a.micro_batch
    n = len(a)
    m = np.maximum(np.floor(a.global_batch / (dp * mbs)), 1.0)
    tokens = mbs * s / cp                      # tokens of this rank's sequence shard per micro-batch
    dims = attention_proj_dims(model)

    # ---- group placement (rank order tp-cp-ep-dp-pp; experts etp-ep-edp) -------------------
    tp_k, tp_N = comm.group_span(1, tp, D)
    cp_k, cp_N = comm.group_span(tp, cp, D)
    dp_size = dp * cp                           # gradients reduce over dp x cp
    dp_k, dp_N = comm.group_span(tp, dp_size, D)
    ep_k, ep_N = comm.group_span(etp, ep, D)
    edp = np.maximum(tp * cp * dp / (ep * etp), 1.0)
    edp_k, edp_N = comm.group_span(ep * etp, edp, D)
    pp_k, pp_N = comm.group_span(tp * cp * dp, pp, D)

    # ---- one dense layer, forward, per micro-batch ------------------------------------------
    def gemm(flops, min_dim):
        return compute.gemm_time_s(prof, dtype, flops, min_dim)

    attn_proj_flops = 2.0 * tokens * dims["params"] / tp
    attn_min = np.minimum.reduce([tokens, np.full(n, float(h)), dims["qkv_out"] / tp, dims["o_in"] / tp])
    t_attn_proj = gemm(attn_proj_flops, attn_min)
    core_flops = 2.0 * tokens * s * model.heads * (dims["qk_head_dim"] + dims["v_head_dim"]) * 0.5 / tp
    wide = "fp32" if model.precision == "fp32" else "bf16"    # attention core and LM head dtype
    t_core_f, t_core_b = compute.attention_time_s(prof, core_flops, s / cp, dims["qk_head_dim"], wide)
    if not fw["flash"]:
        # Unfused attention (2020-2022 Megatron): batched GEMMs plus softmax/dropout over the
        # a*s*s score matrix in fp16, read and written about five times forward, twice that backward.
        score_bytes = 10.0 * model.heads * tokens * s / tp
        t_core_f = gemm(core_flops * 2, np.minimum(s / cp, dims["qk_head_dim"]) * 8) + \
            compute.memory_bound_time_s(prof, score_bytes)
        t_core_b = 2 * gemm(core_flops * 2, np.minimum(s / cp, dims["qk_head_dim"]) * 8) + \
            compute.memory_bound_time_s(prof, 2 * score_bytes)

    ln_tokens = np.where(sp, tokens / tp, tokens)          # LN / residual run on the SP shard
    gpt_dropout = 0.0 if model.gated_mlp else 1.0
    elem_attn = ln_tokens * (4 * h + 6 * h + gpt_dropout * 5 * h) + tokens * (2 * dims["qkv_out"]) / tp
    if fp8:
        elem_attn = elem_attn + tokens * q * (h + dims["o_in"] / tp)

    def mlp_block(ffn, tok, width_div):
        flops = 2.0 * tok * mlp_params(model, ffn) / width_div
        mn = np.minimum.reduce([tok, np.full(n, float(h)), np.full(n, float(ffn)) / width_div])
        elems = tok * ((3 if model.gated_mlp else 2) * ffn) / width_div
        if fp8:
            elems = elems + tok * q * (h + ffn / width_div)
        return gemm(flops, mn), elems

    t_mlp_dense, elem_mlp_dense = mlp_block(model.ffn_hidden, tokens, tp)
    mb_bytes_dense = eb * (elem_attn + elem_mlp_dense)

    # TP collectives: with SP 2 all-gathers + 2 reduce-scatters per pass, else 2 all-reduces.
    act_bytes = tokens * h * eb
    t_ag = comm.collective_time_s(prof, cluster, "all_gather", act_bytes, tp, tp_k, tp_N)
    t_rs = comm.collective_time_s(prof, cluster, "reduce_scatter", act_bytes, tp, tp_k, tp_N)
    t_ar = comm.collective_time_s(prof, cluster, "all_reduce", act_bytes, tp, tp_k, tp_N)
    t_tp = np.where(sp, 2 * (t_ag + t_rs), 2 * t_ar)
    t_tp_exposed = t_tp * fw["tp_exposed"] * cal.comm_exposed

    # CP: ring exchange of K and V, (cp-1) steps, overlapped with the attention chunks.
    kv_bytes = tokens * 2 * model.kv_head_count * dims["qk_head_dim"] * eb / tp
    if model.mla_kv_lora_rank:
        kv_bytes = tokens * 2 * model.heads * dims["qk_head_dim"] * eb / tp
    t_cp_f = (cp - 1) * comm.collective_time_s(prof, cluster, "send_recv", kv_bytes, cp, cp_k, cp_N)
    cp_exp_f = np.where(cp > 1, np.maximum(t_cp_f - t_core_f, 0.0) + 0.1 * t_cp_f, 0.0)
    cp_exp_b = np.where(cp > 1, np.maximum(2 * t_cp_f - t_core_b, 0.0) + 0.1 * t_cp_f, 0.0)

    mb_f = compute.memory_bound_time_s(prof, mb_bytes_dense)
    # Fixed host time per layer and micro-batch (kernel launches, Python): zero unless a profile's
    # calibration measured it (executor runs on CPU hosts, where it dominates small models).
    t_host = cal.layer_overhead_s
    dense_f = t_attn_proj + t_mlp_dense + t_core_f + mb_f + t_tp_exposed + cp_exp_f + t_host
    dense_b = 2 * (t_attn_proj + t_mlp_dense) + t_core_b + 2 * mb_f + t_tp_exposed + cp_exp_b + 2 * t_host
    dense_comm_f = t_tp + t_cp_f
    dense_comm_b = t_tp + 2 * t_cp_f

    # ---- one MoE layer ------------------------------------------------------------------------
    if model.is_moe:
        k_top, E = model.moe_topk, model.num_experts
        shared_ffn = model.shared_experts * model.expert_ffn
        t_shared, elem_shared = (mlp_block(shared_ffn, tokens, tp) if shared_ffn else (0.0, 0.0))
        router_flops = 2.0 * tokens * h * E / tp
        t_router = gemm(router_flops, np.minimum(E, h))
        # Routed experts: tokens owned by the rank (tokens/tp with SP) go to k experts; balanced,
        # each expert holds tokens*k*ep/(tp*E) of them; the hottest rank sets the pace. With expert tensor
        # parallelism the etp ranks of an expert all-gather the tokens it received and each computes 1/etp
        # of its width (megatron-core alltoall dispatcher), reduce-scattering the outputs.
        own = tokens / tp
        gathered = own * etp
        per_expert = gathered * k_top * ep / E * moe_imbalance
        exp_flops = 2.0 * gathered * k_top * mlp_params(model, model.expert_ffn) / etp * moe_imbalance
        mn = np.minimum.reduce([per_expert, np.full(n, float(h)), model.expert_ffn / etp])
        t_experts = gemm(exp_flops, mn)
        elem_exp = gathered * k_top * moe_imbalance * ((3 if model.gated_mlp else 2) * model.expert_ffn / etp
                                                       + 4 * h)  # activation + permute/unpermute copies
        if fp8:
            elem_exp = elem_exp + gathered * k_top * q * (h + model.expert_ffn / etp)
        etp_k, etp_N = comm.group_span(1, etp, D)
        etp_bytes = gathered * k_top * h * eb * moe_imbalance
        t_etp = (comm.collective_time_s(prof, cluster, "all_gather", etp_bytes, etp, etp_k, etp_N)
                 + comm.collective_time_s(prof, cluster, "reduce_scatter", etp_bytes, etp, etp_k, etp_N))
        # Routing work (permute/unpermute copies, expert activation, router softmax/top-k) is scaled by the
        # profile's moe_overhead: it runs as many small kernels that reach less than streaming bandwidth.
        mb_moe = compute.memory_bound_time_s(prof, eb * (elem_attn + elem_shared
                                                          + cal.moe_overhead * (elem_exp + own * E * 3)))
        t_a2a = 2 * cal.a2a_time * comm.moe_dispatch_time_s(prof, cluster, own * h * eb * moe_imbalance, k_top, ep, ep_k, ep_N)
        t_a2a = t_a2a + t_etp   # expert-parallel communication of the layer (zero with etp = 1)
        t_moe_fixed = MOE_LAYER_OVERHEAD_S * cal.moe_overhead
        moe_gemm = t_attn_proj + t_shared + t_router + t_experts
        moe_f = moe_gemm + t_core_f + mb_moe + t_tp_exposed + cp_exp_f + t_a2a + t_moe_fixed + t_host
        moe_b = 2 * moe_gemm + t_core_b + 2 * mb_moe + t_tp_exposed + cp_exp_b + t_a2a + 2 * t_moe_fixed + 2 * t_host
        # Host floor (GPU profiles; a CPU-host profile's layer_overhead_s already is its host time): the layer
        # cannot finish before the host has issued it. Scaled by moe_overhead: the system's host CPU sets it.
        t_moe_host = (MOE_HOST_FIXED_S + E / ep * MOE_HOST_PER_EXPERT_S) * cal.moe_overhead * (prof.kind == "gpu")
        moe_f = np.maximum(moe_f, t_moe_host)
        moe_b = np.maximum(moe_b, 2 * t_moe_host)
    else:
        moe_f = moe_b = mb_moe = np.zeros(n)
        t_a2a = np.zeros(n)

    # ---- recompute ------------------------------------------------------------------------------
    rc = a.recompute
    # Selective: the attention core, plus (flash era) the LayerNorms and MLP activation, which are
    # memory-bound: about a third of the layer's element-wise traffic.
    sel_dense = t_core_f + (mb_f / 3.0 if fw["flash"] else 0.0)
    sel_moe = t_core_f + (mb_moe / 3.0 if (fw["flash"] and model.is_moe) else 0.0)
    rec_dense = np.where(rc == 2, dense_f, np.where(rc == 1, sel_dense, 0.0))
    rec_moe = np.where(rc == 2, moe_f, np.where(rc == 1, sel_moe, 0.0))

    # ---- stages -----------------------------------------------------------------------------------
    st = _stages(model, a)
    SL = st.layers
    valid = st.valid
    n_dense = np.clip(model.dense_layers - st.start, 0, SL) if model.is_moe else SL
    n_moe = SL - n_dense
    rl = np.where(a.recompute_layers[:, None] < 0, SL, np.minimum(a.recompute_layers[:, None], SL))
    rec_frac = np.where(SL > 0, rl / np.maximum(SL, 1), 0.0)
    col = lambda x: np.asarray(x, dtype=float)[:, None]  # noqa: E731
    stage_f = n_dense * col(dense_f) + n_moe * col(moe_f)
    stage_b = n_dense * col(dense_b) + n_moe * col(moe_b)
    stage_rec = rec_frac * (n_dense * col(rec_dense) + n_moe * col(rec_moe))

    # Edge stages: embedding on the first, LM head + cross-entropy on the last.
    logit_flops = 2.0 * tokens * h * model.vocab / tp
    # The output layer runs outside the fp8 autocast region in megatron-core: always bf16.
    t_logit = compute.gemm_time_s(prof, wide, logit_flops,
                                  np.minimum.reduce([tokens, np.full(n, float(h)), model.vocab / tp]))
    t_ce = compute.memory_bound_time_s(prof, tokens * model.vocab / tp * 4.0 * 3)
    t_emb = compute.memory_bound_time_s(prof, ln_tokens * h * eb * 3)
    first, last = st.first, st.last
    stage_f = stage_f + first * col(t_emb) + last * col(t_logit + t_ce)
    stage_b = stage_b + first * col(t_emb) + last * col(2 * t_logit + t_ce)
    # Multi-token prediction (megatron-core: on the last stage): per module a layer of the last kind, the
    # 2h->h projection of [norm(h); norm(embedding)] and the shared output layer and loss once more.
    mtp = model.mtp_layers
    mtp_moe = model.moe_layers > 0          # the module repeats the last layer: MoE unless all layers are dense
    if mtp:
        t_eh = gemm(2.0 * tokens * 2 * h * h / tp, np.minimum(tokens, float(h)))
        mtp_f = (moe_f if mtp_moe else dense_f) + t_eh + t_logit + t_ce
        mtp_b = (moe_b if mtp_moe else dense_b) + 2 * t_eh + 2 * t_logit + t_ce
        stage_f = stage_f + last * col(mtp * mtp_f)
        stage_b = stage_b + last * col(mtp * mtp_b)
        stage_rec = stage_rec + last * rec_frac * col(mtp * (rec_moe if mtp_moe else rec_dense))

    # Pipeline hops: activation send/recv per chunk and micro-batch, forward and backward.
    p2p_bytes = tokens * h * eb / np.where(sp, tp, 1.0)
    t_p2p = comm.collective_time_s(prof, cluster, "send_recv", p2p_bytes, 2 * np.ones(n), np.ones(n),
                                   np.where(pp_N > 1, 2.0, 1.0)) + P2P_FIXED_S
    # Megatron overlaps pipeline send/recv with compute only in the interleaved schedule: without virtual
    # stages it turns overlap_p2p_comm off (megatron/training/arguments.py: "non-interleaved schedule does
    # not support overlapping p2p communication") and each hop waits on its blocking batched send/recv.
    p2p_exposed = np.where(vpp > 1, fw["p2p_exposed"], 1.0)
    p2p_stage = np.where(pp > 1, 2 * vpp * t_p2p * p2p_exposed * cal.comm_exposed, 0.0)
    stage_time = stage_f + stage_b + stage_rec + col(p2p_stage)
    pipe_s, bubble_s = pipeline.pipeline_time_s(stage_time, st.weight, m, vpp)

    # ---- data-parallel gradients / parameters ------------------------------------------------
    lp_dense = layer_params(model, False)
    lp_moe = layer_params(model, True) if model.is_moe else {"dense": 0.0, "expert": 0.0}
    emb = embedding_params(model)
    edge_params = first * emb["embedding"] + last * emb["lm_head"]
    lp_mtp = lp_moe if mtp_moe else lp_dense
    mtp_dense = mtp * (lp_mtp["dense"] + 2.0 * h * h + 2.0 * h)    # layer, eh projection, two norms
    p_dense_stage = (n_dense * lp_dense["dense"] + n_moe * lp_moe["dense"] + edge_params
                     + last * mtp_dense) / col(tp)
    p_exp_stage = (n_moe + last * mtp) * lp_moe["expert"] / col(ep * etp)
    zero = a.zero_stage
    distopt = a.distributed_optimizer | (zero >= 1)
    grad_b = memory.GRAD_BYTES_CORE if framework in ("megatron-core", "other") else memory.GRAD_BYTES
    grad_b = max(grad_b, eb)
    wire_b = grad_b if grad_compression is None else grad_compression.wire_bytes_per_element
    rs_d = comm.collective_time_s(prof, cluster, "reduce_scatter", p_dense_stage * wire_b,
                                  col(dp_size), col(dp_k), col(dp_N))
    ar_d = comm.collective_time_s(prof, cluster, "all_reduce", p_dense_stage * wire_b,
                                  col(dp_size), col(dp_k), col(dp_N))
    ag_d = comm.collective_time_s(prof, cluster, "all_gather", p_dense_stage * eb,
                                  col(dp_size), col(dp_k), col(dp_N))
    rs_e = comm.collective_time_s(prof, cluster, "reduce_scatter", p_exp_stage * wire_b,
                                  col(edp), col(edp_k), col(edp_N))
    ar_e = comm.collective_time_s(prof, cluster, "all_reduce", p_exp_stage * wire_b,
                                  col(edp), col(edp_k), col(edp_N))
    ag_e = comm.collective_time_s(prof, cluster, "all_gather", p_exp_stage * eb,
                                  col(edp), col(edp_k), col(edp_N))
    # Latency over many nodes (costmodel/scale.py): every gradient bucket (megatron-core DDP) and every FSDP
    # layer is one NCCL collective whose latency grows with the ring (NCCL's tuning model); collective_time_s
    # counted one small-message latency for the whole stage, so only the rest is added here.
    def bucket_latency(collective, params, size, k_dom, n_dom, count):
        once = prof.latency_s(collective) * np.where(n_dom > 1, 2.0, 1.0)
        each = np.where(n_dom > 1, scale.nccl_latency_s(collective, size, n_dom), prof.latency_s(collective))
        return np.where((size > 1) & (params > 0), np.maximum(count * each - once, 0.0), 0.0)

    nb_d = scale.ddp_buckets(p_dense_stage, col(dp_size))
    nb_e = scale.ddp_buckets(p_exp_stage, col(edp))
    lat = {c: bucket_latency(c, p_dense_stage, col(dp_size), col(dp_k), col(dp_N), nb_d)
           + bucket_latency(c, p_exp_stage, col(edp), col(edp_k), col(edp_N), nb_e)
           for c in ("reduce_scatter", "all_reduce", "all_gather")}
    # Megatron-FSDP: one gather / reduce per layer (its unit) and micro-batch, dense and expert groups apart.
    lat_fsdp = {c: bucket_latency(c, p_dense_stage, col(dp_size), col(dp_k), col(dp_N), SL)
                + bucket_latency(c, p_exp_stage, col(edp), col(edp_k), col(edp_N), SL)
                for c in ("reduce_scatter", "all_gather")}
    dist = col(distopt)
    grad_sync = np.where(dist, rs_d + rs_e + lat["reduce_scatter"], ar_d + ar_e + lat["all_reduce"])
    param_sync = np.where(dist, ag_d + ag_e + lat["all_gather"], 0.0)
    fsdp = col(zero >= 3)
    # FSDP gathers weights for every micro-batch forward and backward and reduce-scatters grads.
    fsdp_comm = col(m) * (2 * (ag_d + ag_e + lat_fsdp["all_gather"]) + rs_d + rs_e + lat_fsdp["reduce_scatter"])
    if fw["dp_overlap"]:
        # Overlapped with the last micro-batch's backward / the first one's forward; the last bucket
        # (~1/8 of a stage's gradients, Megatron's bucket size relative to a layer stack) stays exposed.
        last_b = stage_b / col(vpp) + stage_rec / col(vpp)
        first_f = stage_f / col(vpp)
        dp_exposed = (np.maximum(grad_sync - last_b, 0.0) + 0.125 * grad_sync
                      + np.maximum(param_sync - first_f, 0.0) + 0.125 * param_sync) * cal.comm_exposed
        fsdp_exposed = np.maximum(fsdp_comm - col(m) * (stage_f + stage_b), 0.0) + 0.05 * fsdp_comm
    else:
        dp_exposed = grad_sync + param_sync
        fsdp_exposed = fsdp_comm
    dp_exposed = np.where(fsdp > 0, fsdp_exposed, dp_exposed)
    dp_exposed = np.where(valid, dp_exposed, 0.0)
    if grad_compression is not None:
        # Compress/decompress kernels over the local gradients (per micro-batch with FSDP): they occupy the
        # GPU, so nothing hides them.
        t_compress = compute.memory_bound_time_s(
            prof, (p_dense_stage + p_exp_stage) * grad_compression.kernel_bytes_per_element(grad_b))
        t_compress = np.where(valid, t_compress * np.where(fsdp > 0, col(m), 1.0), 0.0)
    else:
        t_compress = np.zeros_like(dp_exposed)

    # Optimizer (Adam, memory-bound): read param, grad, m, v (fp32); write param, m, v and the bf16 copy.
    shard = np.where(dist, col(dp_size), 1.0)
    shard_e = np.where(dist, col(edp), 1.0)
    opt_params = p_dense_stage / shard + p_exp_stage / shard_e
    t_opt = compute.memory_bound_time_s(prof, opt_params * 34.0)
    t_opt = np.where(valid, t_opt, 0.0)

    tail = (dp_exposed + t_compress + t_opt).max(axis=1)
    # Stragglers (costmodel/scale.py): the pipeline runs at the pace of the slowest of the world's GPUs.
    world = tp * pp * dp * cp
    t_strag = scale.straggler_fraction(world) * pipe_s * (prof.kind == "gpu")
    step = pipe_s + t_strag + tail + STEP_OVERHEAD_S

    # Bounds: all overlappable comm hidden vs none hidden.
    overl_layer = n_dense * col(dense_comm_f + dense_comm_b - 2 * t_tp_exposed) + \
        n_moe * col(2 * t_tp - 2 * t_tp_exposed)
    upper = step + (col(m) * np.where(valid, overl_layer, 0.0)).max(axis=1) + \
        np.where(valid, np.where(fsdp > 0, fsdp_comm, grad_sync + param_sync) - dp_exposed, 0.0).max(axis=1)
    hidden_now = (col(m) * np.where(valid, n_dense * col(2 * t_tp_exposed) + n_moe * col(2 * t_tp_exposed),
                                    0.0)).max(axis=1)
    lower = np.maximum(step - hidden_now - dp_exposed.max(axis=1), 0.0)

    # ---- memory ---------------------------------------------------------------------------------
    rc_arr = a.recompute
    act_dense = memory.layer_activation_bytes(model, tokens, tp, sp, rc_arr, fw["flash"], False, fp8)
    act_moe = (memory.layer_activation_bytes(model, tokens * moe_imbalance, tp, sp, rc_arr, fw["flash"], True, fp8)
               if model.is_moe else np.zeros(n))
    act_none_dense = memory.layer_activation_bytes(model, tokens, tp, sp, np.zeros(n), fw["flash"], False, fp8)
    act_none_moe = (memory.layer_activation_bytes(model, tokens * moe_imbalance, tp, sp, np.zeros(n),
                                                  fw["flash"], True, fp8) if model.is_moe else np.zeros(n))
    # Partial full-recompute: recomputed layers keep their input only, the rest keep everything.
    full = col(rc_arr == 2)
    per_mb = np.where(full,
                      rl * (n_dense / np.maximum(SL, 1) * col(act_dense) + n_moe / np.maximum(SL, 1) * col(act_moe))
                      + (SL - rl) * (n_dense / np.maximum(SL, 1) * col(act_none_dense)
                                     + n_moe / np.maximum(SL, 1) * col(act_none_moe)),
                      n_dense * col(act_dense) + n_moe * col(act_moe))
    inflight = pipeline.in_flight_microbatches(pp, vpp, m, st.index)
    # Working set of the layer being recomputed / computed (one layer's full activations).
    working = np.where(full, col(np.maximum(act_none_dense, act_none_moe)), 0.0)
    if mtp:   # the module's layer (recomputed like the stage's layers) and its logits
        a_rc, a_none = (act_moe, act_none_moe) if mtp_moe else (act_dense, act_none_dense)
        per_mb = per_mb + last * mtp * np.where(full, rec_frac * col(a_rc) + (1 - rec_frac) * col(a_none), col(a_rc))
    # The last stage's logits are live from its loss forward to the output layer's backward; a fully
    # recomputed layer is rebuilt only inside its own backward (megatron-core tensor_parallel/random.py
    # CheckpointFunction.backward), after the logits gradient is consumed: the peak holds one or the other.
    logit_b = eb if fw["te_ce"] else memory.LOGITS_BYTES_UNFUSED
    logits = col((1 + mtp) * memory.logits_bytes(model, tokens, tp, logit_b))
    work_b = working * (eb / 2.0)
    act_bytes_stage = per_mb * inflight * (eb / 2.0) + np.where(last, np.maximum(work_b, logits), work_b)
    w_bytes = max(memory.WEIGHT_BYTES, eb) + (memory.FP8_WEIGHT_EXTRA_BYTES if fp8 else 0.0)
    p_stage = p_dense_stage + p_exp_stage
    weights = np.where(fsdp > 0, p_dense_stage * w_bytes / col(dp_size) + p_exp_stage * w_bytes / col(edp),
                       p_stage * w_bytes)
    grads = np.where(col(zero >= 2), p_dense_stage * grad_b / col(dp_size) + p_exp_stage * grad_b / col(edp),
                     p_stage * grad_b)
    if grad_compression is not None:
        grads = grads + p_stage * grad_compression.residual_bytes_per_element
    optim = memory.optimizer_state_bytes(model.precision) * (p_dense_stage / shard + p_exp_stage / shard_e)
    # Megatron-FSDP materialises layers' weights (all-gathered: the one at work and the prefetch) and, in the
    # backward, their gradients before the reduce-scatter (the one reduced and the queue): memory.py
    # fsdp_unsharded_elements. An FSDP unit is one TransformerLayer on this rank: its expert part holds the
    # local experts only (E/ep, sharded over the expert data-parallel group; megatron-core
    # distributed/fsdp/mcore_fsdp_adapter.py:221-282 builds the expert mesh from expt_dp and expt_tp).
    layer_p = np.maximum((n_dense > 0) * lp_dense["dense"] / col(tp),
                         (n_moe > 0) * (lp_moe["dense"] / col(tp) + lp_moe["expert"] / col(ep * etp)))
    w_unsh, g_unsh = memory.fsdp_unsharded_elements(layer_p, SL)
    unsharded = np.where(fsdp > 0, w_unsh * w_bytes, 0.0) + np.where(col(zero >= 2), g_unsh * grad_b, 0.0)
    live = weights + grads + optim + act_bytes_stage + unsharded
    buffers = memory.WORKSPACE_BYTES + memory.FRAGMENTATION * live
    peak = np.where(valid, live + buffers, 0.0)
    capacity = prof.memory_bytes.value * prof.usable_memory_fraction
    fits = (peak <= capacity).all(axis=1)

    mflops = model_flops_per_step(model, a.global_batch)
    peak_flops = prof.peak(dtype)
    i_max = np.argmax(np.where(valid, stage_time, -1.0), axis=1)
    rows = np.arange(n)
    details = {"attn_proj_s": t_attn_proj, "attn_core_fwd_s": t_core_f, "attn_core_bwd_s": t_core_b,
               "mlp_dense_s": t_mlp_dense, "memory_bound_dense_s": mb_f, "tp_comm_s": t_tp,
               "layer_dense_fwd_s": dense_f, "layer_dense_bwd_s": dense_b, "layer_moe_fwd_s": moe_f,
               "layer_moe_bwd_s": moe_b, "a2a_s": t_a2a, "logits_s": t_logit, "p2p_s": t_p2p}
    if grad_compression is not None:
        details["grad_compression_s"] = t_compress.max(axis=1)
    if model.is_moe:
        details.update({"experts_s": t_experts, "shared_s": t_shared, "router_s": t_router,
                        "memory_bound_moe_s": mb_moe, "moe_fixed_s": np.full(n, t_moe_fixed),
                        "moe_host_s": t_moe_host})
    return {
        "details": details,
        "step_time_s": step,
        "step_time_lower_s": np.minimum(lower, step),
        "step_time_upper_s": np.maximum(upper, step),
        "pipeline_s": pipe_s,
        "bubble_s": bubble_s,
        "compute_s": col(m)[:, 0] * (stage_f + stage_b)[rows, i_max] - col(m)[:, 0] * (
            n_dense * col(2 * t_tp_exposed + cp_exp_f + cp_exp_b) + n_moe * col(2 * t_tp_exposed + 2 * t_a2a)
        )[rows, i_max],
        "recompute_s": col(m)[:, 0] * stage_rec[rows, i_max],
        "tp_comm_exposed_s": col(m)[:, 0] * (SL * col(2 * t_tp_exposed))[rows, i_max],
        "cp_comm_exposed_s": col(m)[:, 0] * (SL * col(cp_exp_f + cp_exp_b))[rows, i_max],
        "ep_comm_exposed_s": col(m)[:, 0] * (n_moe * col(2 * t_a2a))[rows, i_max],
        "pp_comm_exposed_s": m * p2p_stage,
        "dp_comm_exposed_s": (dp_exposed + t_compress).max(axis=1),
        "optimizer_s": t_opt.max(axis=1),
        "straggler_s": t_strag,
        "stage_tail_s": np.where(valid, dp_exposed + t_compress + t_opt, np.nan),  # after the last micro-batch
        "stage_time_s": np.where(valid, stage_time, np.nan),
        "peak_memory_bytes": np.where(valid, peak, np.nan),
        "weights_bytes": weights[rows, 0],
        "grads_bytes": grads[rows, 0],
        "optimizer_bytes": optim[rows, 0],
        "activations_bytes": act_bytes_stage[rows, 0],
        "buffers_bytes": buffers[rows, 0],
        "memory_capacity_bytes": np.full(n, capacity),
        "fits": fits,
        "model_flops_per_step": mflops,
        "tokens_per_s_per_gpu": a.global_batch * s / (step * world),
        "mfu": mflops / (step * world * peak_flops),
    }


BREAKDOWN_KEYS = ("compute_s", "recompute_s", "bubble_s", "tp_comm_exposed_s", "cp_comm_exposed_s",
                  "ep_comm_exposed_s", "pp_comm_exposed_s", "dp_comm_exposed_s", "optimizer_s", "straggler_s")


def to_step_estimate(out: dict[str, np.ndarray], i: int = 0) -> StepEstimate:
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
                                 "buffers_bytes")},
    )


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
             profile: HardwareProfile | None = None, moe_imbalance: float = 1.0,
             grad_compression: GradCompression | None = None) -> StepEstimate:
    """Step time and memory of one plan, with every pipeline stage reported."""
    plan = plan.with_even_split(model.layers)
    out = estimate_arrays(model, cluster, PlanArrays.from_plans([plan]), profile=profile,
                          framework=plan.framework, moe_imbalance=moe_imbalance,
                          grad_compression=grad_compression)
    return to_step_estimate(out, 0)
