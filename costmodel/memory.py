"""Memory per pipeline stage: weights, gradients, optimizer state, activations, buffers.

Activations follow Korthikanti et al. 2022 (arXiv:2205.05198), Table 2, generalised to GQA, gated
MLPs and MoE. Per layer and micro-batch, in bytes, with s*b tokens, hidden h, t = tp:
  attention: 2h (LN input) + 2h (QKV input) + 2*(q + 2kv) (Q, K, V) + 2*o (attention output)
             + h (dropout mask, models trained with dropout) + 5*a*s (softmax/dropout of the scores, only
             without flash attention)
  MLP:       2h (LN input) + 2h (FC1 input) + 2*f*(2 if gated else 1) (FC1 output)
             + 2f (activation output) + h (dropout mask, with dropout)
For GPT-3 shapes this is the paper's 34*s*b*h + 5*a*s^2*b. Without sequence parallelism the
LN inputs, GEMM inputs and dropout masks (10*s*b*h) are replicated on each tp rank; with it every
term is divided by t. Full recomputation keeps only each layer's input (2*s*b*h/t with SP).

Model state per parameter (Megatron mixed precision, Narayanan et al. 2021 / Megatron distributed
optimizer docs): bf16/fp16 weight 2 bytes, fp32 main gradient 4 bytes, fp32 master weight and two
Adam moments 12 bytes; the distributed optimizer shards the 12 bytes over dp x cp (experts: over the
expert data-parallel group), ZeRO-2 also the gradients, ZeRO-3/FSDP also the weights.
"""

from __future__ import annotations

import numpy as np

from costmodel.flops import attention_proj_dims, mamba_dims
from costmodel.specs import ModelSpec

GIB = float(2**30)
# Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO, Sec. 3.1): 2-byte weights, and fp32 master weights,
# momentum and variance, 12 bytes, in the optimizer state.
WEIGHT_BYTES = 2.0
GRAD_BYTES = 4.0        # fp32 main gradients (Megatron-LM; megatron-core with grad_reduce_in_fp32)
# Megatron-LM of 2019-2020 (v1, the README's GPT-2 tables) trained fp16 with its gradients in fp16 on the
# parameters and all-reduced them so (LocalDDP.allreduce_params casts to fp32 only with --fp32-allreduce,
# default off). From v2 (2021) gradients accumulate in an fp32 main_grad buffer: Korthikanti et al. 2022 Fig. 1
# count 18 bytes per parameter, fp16 weights, fp32 gradients and fp32 Adam state (tests/test_memory.py).
GRAD_BYTES_FP16_MEGATRON_LM_2020 = 2.0
GRAD_BYTES_CORE = 2.0   # megatron-core DistributedDataParallelConfig default: grads in the param dtype
OPTIMIZER_BYTES = 12.0
# fp8 recipes (Transformer Engine). With the optimizer state sharded, megatron-core keeps the weights themselves in
# FP8 (--fp8-param-gather, which Megatron-Bridge's and NeMo 2.0's mixed-precision recipes set and the planner writes;
# DistributedDataParallelConfig.fp8_param_gather: "keep the compute param in fp8 (do not use any other intermediate
# dtype)"): 1 byte plus the transposed copy Transformer Engine makes for the backward GEMMs, 2 in all, as bf16
# weights. Megatron-LM refuses FP8 parameters without a sharded state ("--fp8-param-gather only supported with
# distributed optimizer, torch fsdp2, megatron fsdp"): there a bf16 weight is kept and Transformer Engine caches an
# FP8 workspace of it, row- and column-wise, across micro-batches: this much more per parameter.
FP8_WEIGHT_EXTRA_BYTES_UNSHARDED = 2.0
# NCCL, cuBLAS and Transformer Engine workspaces, CUDA context outside the allocator.
WORKSPACE_BYTES = 1.0 * GIB
# Megatron-FSDP's communication unit, in parameter elements (megatron-core 0.16.1
# distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:375-399): with optim_grads_params it is twice the mean
# FSDP unit (a TransformerLayer's local parameters), then `max(1_000_000_000, ...)` (commented "Cap to 1B
# elements", a floor in fact); without a bucket size (optim_grads) it is 1e9. The all-gather prefetch reaches
# half of it beyond the buckets at work (suggested_AG_prefetch_size = unit // 2; param_and_grad_buffer.py
# AllGatherPipeline.all_gather_params:3530-3560 adds whole buckets while less than that is prefetched), and
# unsharded gradient buckets wait in the reduce-scatter queue until it holds more than the unit
# (GradReducePipeline.wait_for_previous_grad_reduce:3093-3115 pops them only then and frees their storage).
FSDP_COMM_UNIT_FLOOR_ELEMENTS = 1.0e9
# Logits bytes per element of the last stage at its peak. megatron-core with Transformer Engine's fused
# cross-entropy (cross_entropy_loss_fusion=True, cross_entropy_fusion_impl='te', which the Megatron-Bridge
# performance recipes set and planner/outputs.py emits): TE's CrossEntropyFunction saves the bf16 logits and
# writes the gradient into them in place (transformer_engine/pytorch/cross_entropy.py: forward
# `ctx.save_for_backward(_input.detach(), ...)`, backward returns `_input`), so one logits-dtype copy
# (megatron-core models/common/language_module/language_module.py:140-162 calls te_parallel_cross_entropy on
# the logits as they are). Megatron's own cross-entropy (tensor_parallel/cross_entropy.py:28
# `vocab_parallel_logits.float()`, softmax saved in fp32 at :187; the native fused one likewise) holds the fp32
# copy beside the bf16 logits in the forward and the fp32 gradient beside its bf16 cast in the backward: 6.
LOGITS_BYTES_TE_FUSED = 2.0
LOGITS_BYTES_UNFUSED = 6.0
# Caching-allocator fragmentation on top of the live tensors.
FRAGMENTATION = 0.05
# Share of a GPU's host memory (HardwareProfile.host_memory_bytes) that offloaded activations may take: the
# rest holds the OS, the data loader workers, pinned staging buffers and the checkpoint copies (an assumption,
# not measured; Megatron-Bridge's Llama 3 70B GB200 recipe offloads 40 layers, about 60% of the 240 GB).
HOST_USABLE_FRACTION = 0.8


# Precisions whose weights and activations are fp32 (TF32 changes only the GEMMs' tensor-core format).
FULL_PRECISION = ("fp32", "tf32")


def activation_element_bytes(precision: str) -> float:
    """Bytes per activation / communicated element: 4 when training in fp32 (TF32 GEMMs keep fp32 tensors), else 2
    (bf16, fp16 and the high-precision tensors of the fp8/fp4 recipes)."""
    return 4.0 if precision in FULL_PRECISION else 2.0


def muon_state_bytes(precision: str) -> float:
    """Muon bytes per parameter: the fp32 master weight and one fp32 momentum (megatron-core 0.16.1
    optimizer/muon.py muon_init_state_fn: ``momentum_buffer`` like the fp32 master), 8; fp32 training keeps
    no master copy, 4."""
    return 4.0 if precision in FULL_PRECISION else 8.0


def optimizer_state_bytes(precision: str) -> float:
    """Adam bytes per parameter: fp32 master weight and two moments (12) with mixed precision; fp32
    training keeps no separate master copy (8)."""
    return 8.0 if precision in FULL_PRECISION else OPTIMIZER_BYTES


def layer_activation_bytes(model: ModelSpec, tokens, tp, sp, recompute, flash: bool, moe: bool,
                           fp8: bool = False, te_moe_modules: bool = False,
                           grouped_gemm: bool = True) -> np.ndarray:
    """Activation bytes one layer keeps for backward, per micro-batch, on one rank.

    ``tokens`` = micro_batch * seq_len / cp (the rank's share of the sequence); ``recompute`` codes:
    0 none, 1 selective, 2 full, 3 offload (a layer keeps what it keeps without recompute; what offloading
    moves to the host is costmodel.estimate.stage_memory's business). With flash attention, selective
    recomputation recomputes the LayerNorm outputs (the GEMM inputs) and the activation-function output
    instead of storing them, as an op-level selective checkpoint does (torchtitan's "op" mode saves the matmul
    outputs and recomputes the element-wise ops). megatron-core's Transformer Engine layers do part of it
    (``--recompute-modules``): a MoE layer's pre-MLP LayerNorm ("layernorm") and its experts' activation
    ("moe_act"), priced so with ``te_moe_modules``, not the LayerNorms fused into the dense GEMMs nor a dense
    MLP's activation; so the planner does not offer selective to a dense model there (planner/space.py) and
    ``plan check`` says so (planner/check.py). Without flash attention selective recompute removes the
    5*a*s^2*b score terms (Korthikanti Sec. 4.2). Dropout masks (1 byte an element, after the attention and MLP blocks) only where
    the model trains with ``hidden_dropout``. With fp8 (Transformer Engine) the GEMM inputs are kept as fp8
    copies, 1 byte per element.

    ``te_moe_modules``: a MoE model's selective runs as megatron-core 0.16.1 runs ``--recompute-modules
    core_attn layernorm moe_act`` on Transformer Engine layers (costmodel.rules.moe_recompute_modules), not op
    by op. transformer_layer.py recomputes a LayerNorm only where it is a module of its own: the pre-MLP one of
    a MoE layer (gpt_layer_specs.py: ``backend.layer_norm() if num_experts``) and, with multi-latent attention,
    the input one (MLASelfAttention's projections take no fused LayerNorm); elsewhere it is fused into the QKV or
    FC1 GEMM (IdentityOp), which keeps its input. moe_act recomputes the routed experts' activation, only with
    the grouped GEMM (``grouped_gemm``; megatron-core needs --bf16 for it); the shared experts' activation is
    kept ("shared_experts" recomputes the whole shared MLP, not written). A dense layer of such a model (the
    first layers of DeepSeek-V3) has only the MLA input LayerNorm to recompute.
    """
    if model.hybrid_pattern:
        return _hybrid_activation_bytes(model, tokens, tp, sp, recompute, flash, fp8, te_moe_modules, grouped_gemm)
    tokens = np.asarray(tokens, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp = np.asarray(sp, dtype=bool)
    rc = np.asarray(recompute)
    h = model.hidden
    dims = attention_proj_dims(model)
    gin = 1.0 if fp8 else 2.0                        # bytes per element of a saved GEMM input
    sel = (rc == 1) & flash                          # modern selective: LN outputs, activation recomputed
    mask = 1.0 if model.hidden_dropout > 0 else 0.0
    gate = 2 if model.gated_mlp else 1
    ln_in = 2 * h + 2 * h                            # inputs of the two LayerNorms (residual stream)
    te = te_moe_modules and model.is_moe
    # QKV input and FC1 (router) input, each freed where selective recomputes its LayerNorm
    qkv_ln = np.where(sel & (not te or bool(model.mla_kv_lora_rank)), 0.0, gin * h)
    mlp_ln = np.where(sel & (not te or moe), 0.0, gin * h)
    ln_out = qkv_ln + mlp_ln
    repl = ln_in + ln_out + 2 * mask * h
    split = 2 * dims["qkv_out"] + gin * dims["o_in"]
    if moe:
        k = model.moe_topk
        fe = model.expert_ffn
        routed_act = np.where(sel & (not te or grouped_gemm), 0.0, gin * fe)
        shared_act = np.where(sel & (not te), 0.0, gin * fe)
        routed = k * (gin * h + 2 * fe * gate + routed_act)
        shared = model.shared_experts * (2 * fe * gate + shared_act)
        split_moe = routed + shared + 2 * h + 4 * model.num_experts
        per_token = np.where(sp, (repl + split) / t, repl + split / t) + split_moe / t
    else:
        f = model.ffn_hidden
        act_out = np.where(sel & (not te), 0.0, gin * f)
        split = split + 2 * f * gate + act_out
        per_token = np.where(sp, (repl + split) / t, repl + split / t)
    act = tokens * per_token
    if not flash:
        # Korthikanti Table 2: 5*a*s^2*b/t for the materialised scores (softmax output, dropout mask
        # and output); selective recomputation removes exactly this term.
        scores = 5.0 * model.heads * tokens * model.seq_len / t
        act = act + np.where((rc == 1) | (rc == 2), 0.0, scores)
    full_input = tokens * 2 * h / np.where(sp, t, 1.0)
    return np.where(rc == 2, full_input, act)


def _hybrid_activation_bytes(model: ModelSpec, tokens, tp, sp, recompute, flash: bool, fp8: bool,
                             te_moe_modules: bool, grouped_gemm: bool) -> np.ndarray:
    """The mean over a hybrid model's pattern (ModelSpec.hybrid_pattern) of what its layers keep. An attention,
    MLP or MoE layer keeps its half of a transformer layer's (one norm input, one residual); a Mamba-2 layer
    (megatron-core MambaMixer with mamba_ssm's chunked scan, which saves its inputs and recomputes the chunk
    states in the backward) its norm's input and output, in_proj's output (z, x, B, C, dt), the conv1d's output,
    the scan's output and out_proj's input."""
    tokens = np.asarray(tokens, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp = np.asarray(sp, dtype=bool)
    rc = np.asarray(recompute)
    plain = model.model_copy(update={"hybrid_pattern": None, "dense_layers": 0, "num_experts": 0, "moe_topk": 0})
    h, gin = model.hidden, (1.0 if fp8 else 2.0)
    counts = model.hybrid_counts
    full_input = layer_activation_bytes(plain, tokens, tp, sp, 2, flash, False, fp8)   # what full recompute keeps
    # a transformer layer less its MLP (an MLP of width 1), and one norm's input and output
    attn = layer_activation_bytes(plain.model_copy(update={"ffn_hidden": 1}), tokens, tp, sp, rc, flash, False, fp8)
    norm = tokens * (2 * h + gin * h) / np.where(sp, t, 1.0)
    total = counts["*"] * (attn - norm)
    if counts["-"]:
        total = total + counts["-"] * (layer_activation_bytes(plain, tokens, tp, sp, rc, flash, False, fp8) - attn
                                       + norm)
    if counts["E"]:
        moe = layer_activation_bytes(model.model_copy(update={"hybrid_pattern": None, "dense_layers": 0}), tokens,
                                     tp, sp, rc, flash, True, fp8, te_moe_modules, grouped_gemm)
        if model.moe_latent:   # the routed experts' inputs are latent-wide
            moe = moe - tokens * model.moe_topk * gin * (h - model.moe_latent) / t
        total = total + counts["E"] * (moe - attn + norm)
    if counts["M"]:
        md = mamba_dims(model)
        split = 2 * md["d_in_proj"] + 2 * md["conv_dim"] + 2 * md["d_inner"] + gin * md["d_inner"]
        total = total + counts["M"] * tokens * np.where(sp, (2 * h + gin * h + split) / t, 2 * h + gin * h + split / t)
    return np.where(rc == 2, full_input, total / model.layers)


def logits_bytes(model: ModelSpec, tokens, tp, bytes_per_element: float = LOGITS_BYTES_UNFUSED) -> np.ndarray:
    """Last stage: the logits of one micro-batch and what the cross-entropy keeps of them at the peak (vocab
    split over tp); ``bytes_per_element`` per logit (LOGITS_BYTES_TE_FUSED / LOGITS_BYTES_UNFUSED)."""
    return np.asarray(tokens, dtype=float) * model.vocab / np.asarray(tp, dtype=float) * bytes_per_element


def fsdp_unsharded_elements(layer_params, stage_layers) -> tuple[np.ndarray, np.ndarray]:
    """Parameter elements Megatron-FSDP holds unsharded at once: (weights, gradients).

    ``layer_params``: one FSDP unit's (TransformerLayer's) parameters on this rank (tp- and ep-local);
    ``stage_layers``: the units on the rank. Weights: the unit at work plus the all-gather prefetch, whole units
    until unit // 2 elements are prefetched. Gradients: the unit being reduced plus the reduce-scatter queue,
    whole units up to the unit size. Both are capped by the units there are (constants above).
    """
    lp = np.maximum(np.asarray(layer_params, dtype=float), 1.0)
    others = np.maximum(np.asarray(stage_layers, dtype=float) - 1.0, 0.0)
    unit = np.maximum(FSDP_COMM_UNIT_FLOOR_ELEMENTS, 2.0 * lp)
    prefetched = np.minimum(np.ceil(np.floor(unit / 2.0) / lp), others)
    queued = np.minimum(np.floor(unit / lp), others)
    return lp * (1.0 + prefetched), lp * (1.0 + queued)
