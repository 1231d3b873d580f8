"""A megatron-core GPT built from a plan: config, model chunks, and a layout-independent initialisation.

torch and megatron-core are imported inside the functions, so importing this module stays cheap.

``canonical_init`` gives every parameter the values of the same full (unsharded) tensor, drawn from a
generator seeded by the parameter's layout-independent name, and keeps this rank's slice of it. Any
layout of the same model therefore starts from the same function, which is what lets the tests compare
the loss curves of TP, PP, VPP, DP and EP runs against a one-process run.
"""

from __future__ import annotations

import re
import warnings
import zlib
from typing import Any

from costmodel.plan import ParallelPlan
from costmodel.specs import ModelSpec

DTYPES = ("fp32", "bf16", "fp16")


def megatron_config(model: ModelSpec, plan: ParallelPlan, *, dtype: str = "bf16", **overrides: Any):
    """megatron-core's TransformerConfig for a plan, the way Megatron-LM's arguments build it.

    ``dtype`` is the training dtype (fp32, bf16, fp16); ``overrides`` set any other config field.
    """
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from costmodel.plan import megatron_layout
    from costmodel.rules import moe_recompute_modules

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kw: dict[str, Any] = dict(
        num_layers=model.layers, hidden_size=model.hidden, num_attention_heads=model.heads,
        ffn_hidden_size=model.ffn_hidden, kv_channels=model.head_width,
        num_query_groups=model.kv_heads or model.heads, gated_linear_unit=model.gated_mlp,
        tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
        context_parallel_size=plan.cp, sequence_parallel=plan.sequence_parallel and plan.tp > 1,
        bf16=dtype == "bf16", fp16=dtype == "fp16", params_dtype=torch_dtype, pipeline_dtype=torch_dtype,
    )
    kw.update(_architecture(model))
    if plan.vpp > 1:
        kw["virtual_pipeline_model_parallel_size"] = plan.vpp
    if plan.layers_per_stage is not None:
        kw["pipeline_model_parallel_layout"] = megatron_layout(plan.layers_per_stage, plan.vpp, mtp=model.mtp_layers)
    if model.mtp_layers:
        kw["mtp_num_layers"] = model.mtp_layers
    if model.is_moe:
        kw.update(num_moe_experts=model.num_experts, moe_router_topk=model.moe_topk,
                  moe_ffn_hidden_size=model.expert_ffn, expert_model_parallel_size=plan.ep,
                  expert_tensor_parallel_size=plan.etp, moe_grouped_gemm=True,
                  moe_token_dispatcher_type="alltoall")
        if model.shared_experts:
            kw["moe_shared_expert_intermediate_size"] = model.shared_experts * model.expert_ffn
        if model.moe_layer_freq():
            kw["moe_layer_freq"] = model.moe_layer_freq()
        kw.update(_router(model))
        if model.moe_token_drop:
            # As the emitted --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity.
            kw.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    if plan.recompute == "full":
        layers = plan.recompute_layers
        kw.update(recompute_granularity="full", recompute_method="uniform" if layers is None else "block",
                  recompute_num_layers=1 if layers is None else max(1, layers))
    elif plan.recompute == "selective":
        kw.update(recompute_granularity="selective")
        if model.is_moe and _transformer_engine():
            # As the planner's --recompute-modules (no fp8 here: fp8 recipes train in bf16), with the grouped GEMM
            # the run has. Without Transformer Engine (the local layers of CPU runs) megatron-core's output-
            # discarding recompute of layernorm / moe_act does not run, and selective stays core_attn.
            grouped = overrides.get("moe_grouped_gemm", kw.get("moe_grouped_gemm", False))
            kw["recompute_modules"] = moe_recompute_modules(grouped_gemm=grouped)
    elif plan.recompute == "offload":
        # megatron-core ModelParallelConfig.cpu_offloading (activations, through Transformer Engine's offload
        # context); at most all layers but the last.
        kw.update(cpu_offloading=True, cpu_offloading_num_layers=(plan.recompute_layers if plan.recompute_layers
                                                                  is not None else model.layers - 1))
    cls = TransformerConfig
    if model.mla_kv_lora_rank:
        cls = MLATransformerConfig
        kw.update(multi_latent_attention=True, q_lora_rank=model.mla_q_lora_rank, kv_lora_rank=model.mla_kv_lora_rank,
                  qk_head_dim=model.head_width, qk_pos_emb_head_dim=model.mla_rope_dim,
                  v_head_dim=model.mla_v_head_dim or model.head_width)
        kw.pop("kv_channels")
    kw.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kw)


def _transformer_engine() -> bool:
    """Whether Transformer Engine is installed (the layers are then its modules, as build_chunks picks them)."""
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _architecture(model: ModelSpec) -> dict[str, Any]:
    """The layer facts of a model as TransformerConfig fields, set the way Megatron-LM's
    ``core_transformer_config_from_args`` sets them from the flags planner/outputs.py writes (--normalization,
    --apply-layernorm-1p, --norm-epsilon, --qk-layernorm, --swiglu / --squared-relu / --quick-geglu,
    --activation-func-clamp-value, --glu-linear-offset, --disable-bias-linear, --add-qkv-bias, dropouts)."""
    import torch.nn.functional as F
    from megatron.core.activations import quick_gelu, squared_relu

    act = {"swiglu": (F.silu, True), "squared_relu": (squared_relu, False), "quick_geglu": (quick_gelu, True),
           "gelu": (F.gelu, model.gated_mlp)}
    kw: dict[str, Any] = dict(
        normalization="RMSNorm" if model.normalization == "RMSNorm" else "LayerNorm",
        layernorm_zero_centered_gamma=model.normalization == "LayerNorm1p", layernorm_epsilon=model.norm_epsilon,
        qk_layernorm=model.qk_norm, add_bias_linear=model.linear_bias,
        add_qkv_bias=model.qkv_bias and not model.linear_bias,
        attention_dropout=model.attention_dropout, hidden_dropout=model.hidden_dropout,
    )
    if model.activation in act:   # others are written as lost by the flags; the config keeps Megatron's GELU
        kw["activation_func"], kw["gated_linear_unit"] = act[model.activation]
    if model.activation_clamp is not None:
        kw["activation_func_clamp_value"] = model.activation_clamp
    if model.glu_linear_offset:
        kw["glu_linear_offset"] = model.glu_linear_offset
    return kw


def _router(model: ModelSpec) -> dict[str, Any]:
    """The MoE router as TransformerConfig fields (the flags' --moe-router-* of planner/outputs.py)."""
    kw: dict[str, Any] = dict(moe_router_score_function=model.moe_router_score,
                              moe_router_enable_expert_bias=model.moe_router_expert_bias)
    if model.moe_router_score == "softmax" and not model.moe_router_norm_topk:
        kw["moe_router_pre_softmax"] = True
    if model.moe_router_topk_scaling != 1.0:
        kw["moe_router_topk_scaling_factor"] = model.moe_router_topk_scaling
    if model.moe_router_groups is not None:
        kw.update(moe_router_num_groups=model.moe_router_groups, moe_router_group_topk=model.moe_router_group_topk)
    return kw


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron-LM's vocabulary padding (``--make-vocab-size-divisible-by 128`` times tp)."""
    step = multiple * tp
    return -(-vocab // step) * step


def sdpa_core_attention():
    """megatron-core's local core attention with torch's fused ``scaled_dot_product_attention`` (a
    FlashAttention-2 kernel on CUDA, no ``s x s`` score matrix kept) for plain causal self-attention.

    The local spec's ``DotProductAttention`` materialises the scores, their softmax and its dropout mask
    for every layer: on one H200 a 1.1B-parameter model (sequence 2,048, 32 heads) trained at 3.21 s per
    step with 36.2 GiB peak, far from the flash attention that Transformer Engine's spec and the cost model
    assume. Windowed attention, softmax offsets, explicit masks or biases, packed sequences and query-key
    layer scaling go to megatron-core's own implementation unchanged."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class SDPADotProductAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
            if (attention_mask is not None or attention_bias is not None or packed_seq_params is not None
                    or mask_type != AttnMaskType.causal or self.softmax_offset is not None
                    or self.scale_mask_softmax.window_size is not None
                    or self.config.apply_query_key_layer_scaling):
                return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                       packed_seq_params)
            # [s, b, heads, head_dim] -> [b, heads, s, head_dim]; query groups shared by enable_gqa.
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            dropout_p = self.attention_dropout.p if self.training else 0.0

            def attend():
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.softmax_scale,
                    enable_gqa=k.size(1) != q.size(1))

            if dropout_p and not self.config.sequence_parallel:
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    context = attend()
            else:
                context = attend()
            # [b, heads, s, head_dim] -> [s, b, heads * head_dim]
            return context.permute(2, 0, 1, 3).reshape(context.size(2), context.size(0), -1)

    return SDPADotProductAttention


def build_chunks(model: ModelSpec, plan: ParallelPlan, config, *, vocab_size: int) -> list:
    """The GPTModel chunks this rank holds (one per virtual pipeline stage), local layer spec
    (Transformer Engine's spec when it is installed)."""
    if model.mtp_layers:
        from costmodel.profiles import InputError

        raise InputError(f"model {model.name}: mtp_layers={model.mtp_layers}, but the executor builds no "
                         f"multi-token-prediction modules; give the model mtp_layers: 0 to run it")
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if _transformer_engine():
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(model.num_experts or None,
                                                          moe_grouped_gemm=config.moe_grouped_gemm,
                                                          qk_layernorm=config.qk_layernorm)
    else:
        spec = get_gpt_layer_local_spec(model.num_experts or None, moe_grouped_gemm=config.moe_grouped_gemm,
                                        qk_layernorm=config.qk_layernorm, normalization=config.normalization)
        spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention()
    chunks = []
    for vp in range(plan.vpp):
        vp_stage = vp if plan.vpp > 1 else None
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
            max_sequence_length=model.seq_len,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute" if model.learned_position_embeddings else "rope",
            rotary_base=int(model.rotary_base), rotary_percent=model.rotary_percent,
            vp_stage=vp_stage,
        ))
    return chunks


_LAYER = re.compile(r"(^|\.)decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def _canonical_name(chunk, name: str, ep_rank: int, local_experts: int) -> str:
    """The parameter's name in a one-process model: global layer number, global expert index."""
    m = _LAYER.search(name)
    if m:
        layer = chunk.decoder.layers[int(m.group(2))].layer_number
        name = name[:m.start(2)] + str(layer) + name[m.end(2):]
    e = _EXPERT.search(name)
    if e:
        name = name[:e.start(1)] + str(ep_rank * local_experts + int(e.group(1))) + name[e.end(1):]
    return name


def canonical_init(chunks: list, *, seed: int, std: float = 0.02, gated: bool = False) -> None:
    """Set every parameter to this rank's slice of a full tensor drawn from its canonical name."""
    import torch
    from megatron.core import parallel_state as ps

    tp_rank, tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    etp_rank, etp = ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    ep_rank = ps.get_expert_model_parallel_rank()
    with torch.no_grad():
        for chunk in chunks:
            local_experts = getattr(chunk.config, "num_moe_experts", None) or 0
            local_experts //= max(1, ps.get_expert_model_parallel_world_size())
            for name, p in chunk.named_parameters():
                cname = _canonical_name(chunk, name, ep_rank, local_experts)
                expert = ".local_experts." in name or ".experts." in name
                rank, size = (etp_rank, etp) if expert else (tp_rank, tp)
                split = getattr(p, "tensor_model_parallel", False) and size > 1
                dim = getattr(p, "partition_dim", 0) if split else 0
                shape = list(p.shape)
                if split:
                    shape[dim] *= size
                if "norm" in cname and cname.endswith("weight"):
                    full = torch.ones(shape)
                elif cname.endswith("bias"):
                    full = torch.zeros(shape)
                else:
                    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(cname.encode()))
                    full = torch.randn(shape, generator=g) * std
                if split:
                    if gated and "linear_fc1" in cname:
                        gate, up = full.chunk(2, dim=dim)
                        full = torch.cat([gate.chunk(size, dim=dim)[rank], up.chunk(size, dim=dim)[rank]], dim=dim)
                    else:
                        full = full.chunk(size, dim=dim)[rank]
                p.copy_(full.to(p.dtype))
