"""FLOP and parameter counts per transformer layer, with the derivation beside each term.

Conventions: a matmul of (m x k) by (k x n) costs 2*m*k*n FLOPs. ``tokens`` is the number of tokens
a rank processes in one micro-batch before any tensor split. Everything broadcasts over numpy arrays.

Sources:
- Narayanan et al. 2021 (arXiv:2104.04473), Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) for a GPT
  layer stack *with* full recompute (4 passes of 24*B*s*h^2 ...).
- Korthikanti et al. 2022 (arXiv:2205.05198), Appendix A, Eq. 7: model FLOPs per iteration
  72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L)) for a GPT (no recompute; 3x forward).
"""

from __future__ import annotations

import numpy as np

from costmodel.specs import ModelSpec


def attention_proj_dims(model: ModelSpec) -> dict[str, float]:
    """Widths of the attention projections (per token), GQA and MLA aware.

    Returns q, kv (the K plus V output width), o (the output-projection input width), the
    parameter count of all attention projections and the head widths used by the core.
    """
    h, a, d = model.hidden, model.heads, model.head_width
    if model.mla_kv_lora_rank:
        # DeepSeek-V2/V3 multi-head latent attention (Megatron MLASelfAttention):
        #   q:  h -> q_lora (down) -> a*(d + rope)       (or h -> a*(d+rope) without q_lora)
        #   kv: h -> kv_lora + rope (down), kv_lora -> a*(d + v_dim) (up)
        #   o:  a*v_dim -> h
        r = model.mla_rope_dim
        v = model.mla_v_head_dim or d
        ql, kl = model.mla_q_lora_rank, model.mla_kv_lora_rank
        q_params = (h * ql + ql * a * (d + r)) if ql else h * a * (d + r)
        kv_params = h * (kl + r) + kl * a * (d + v)
        o_params = a * v * h
        return {
            "params": q_params + kv_params + o_params,
            "qk_head_dim": d + r,
            "v_head_dim": v,
            "qkv_out": a * (d + r) + a * (d + v),
            "o_in": a * v,
        }
    kv = model.kv_head_count
    return {
        "params": h * a * d + 2 * h * kv * d + a * d * h,  # Wq, Wk, Wv, Wo
        "qk_head_dim": d,
        "v_head_dim": d,
        "qkv_out": (a + 2 * kv) * d,
        "o_in": a * d,
    }


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """Parameters of one MLP of width ffn: 3 matrices when gated (SwiGLU), else 2."""
    return (3 if model.gated_mlp else 2) * model.hidden * ffn


def expert_mlp_params(model: ModelSpec) -> int:
    """Parameters of one routed expert: its MLP from the model width, or from the latent width of a LatentMoE
    (ModelSpec.moe_latent)."""
    return (3 if model.gated_mlp else 2) * (model.moe_latent or model.hidden) * model.expert_ffn


# Mamba-2 mixer (megatron-core ssm/mamba_mixer.py MambaMixer; Dao & Gu 2024, "Transformers are SSMs",
# arXiv:2405.21060): in_proj h -> [z, x, B, C, dt] (2 d_inner + 2 G N + heads), a depthwise causal conv1d of width
# MAMBA_CONV_KERNEL over [x, B, C], the chunked SSD scan (chunk MAMBA_CHUNK tokens), a gated RMSNorm and out_proj
# d_inner -> h. d_conv 4 and chunk_size 128 are MambaMixer's defaults and the Nemotron-H config.json values.
MAMBA_CONV_KERNEL = 4
MAMBA_CHUNK = 128


def mamba_dims(model: ModelSpec) -> dict[str, float]:
    """Widths per token of a hybrid model's Mamba-2 mixer and its parameter count."""
    nh, P, N, G, h = (model.mamba_heads or 0), model.mamba_head_dim, model.mamba_state_dim, model.mamba_groups, \
        model.hidden
    d_inner = nh * P
    d_in_proj = 2 * d_inner + 2 * G * N + nh
    conv_dim = d_inner + 2 * G * N
    # in_proj, conv1d weight and bias, A_log / D / dt_bias, the gated norm, out_proj
    params = h * d_in_proj + conv_dim * (MAMBA_CONV_KERNEL + 1) + 3 * nh + d_inner + d_inner * h
    return {"d_inner": d_inner, "d_in_proj": d_in_proj, "conv_dim": conv_dim, "params": params, "heads": nh}


def ssd_forward_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the SSD scan (arXiv:2405.21060 Sec. 6, the chunked algorithm): per chunk of Q
    tokens C B^T (Q x Q x N per group), its masked product with X (Q x Q x P per head), the chunk states B^T X and
    their contribution to the output C S (N x P per token and head each). The intra-chunk products are causal:
    the kernels skip the blocks above the diagonal, half of them."""
    nh, P, N, G, Q = (model.mamba_heads or 0), model.mamba_head_dim, model.mamba_state_dim, model.mamba_groups, \
        MAMBA_CHUNK
    return 2.0 * nh * P * (Q / 2 + 2 * N) + 2.0 * G * (Q / 2) * N


def _pattern_mean(model: ModelSpec, per_kind, keys: tuple[str, ...]) -> dict:
    """The mean over a hybrid model's layers of ``per_kind(kind)``'s ``keys``, each kind weighted by its share of
    the layers (ModelSpec.hybrid_counts)."""
    w = {k: n / model.layers for k, n in model.hybrid_counts.items()}
    parts = [per_kind(k) for k in w]
    return {key: sum(wk * pk[key] for wk, pk in zip(w.values(), parts)) for key in keys}


def sublayer_params(model: ModelSpec, kind: str) -> dict[str, float]:
    """Parameters of one layer of a hybrid model's kind (M, *, -, E), its norm included, split into the part tensor
    parallelism shards and the expert part."""
    h = model.hidden
    if kind == "M":
        return {"dense": mamba_dims(model)["params"] + h, "expert": 0.0}
    if kind == "*":
        return {"dense": attention_proj_dims(model)["params"] + h, "expert": 0.0}
    if kind == "-":
        return {"dense": mlp_params(model, model.ffn_hidden) + h, "expert": 0.0}
    latent = 2 * h * model.moe_latent if model.moe_latent else 0.0
    shared = model.shared_experts * mlp_params(model, model.expert_ffn)
    return {"dense": shared + h * model.num_experts + latent + h,
            "expert": model.num_experts * expert_mlp_params(model)}


def layer_params(model: ModelSpec, moe: bool) -> dict[str, float]:
    """Parameters of one layer, split into the part tensor parallelism shards and the expert part. A hybrid
    model's layer is the mean of its pattern's (every layer counts as one of its kind; ``moe`` aside)."""
    if model.hybrid_pattern:
        return _pattern_mean(model, lambda k: sublayer_params(model, k), ("dense", "expert"))
    attn = attention_proj_dims(model)["params"]
    norms = 2 * model.hidden
    if not moe:
        return {"dense": attn + mlp_params(model, model.ffn_hidden) + norms, "expert": 0.0}
    shared = model.shared_experts * mlp_params(model, model.expert_ffn)
    router = model.hidden * model.num_experts
    expert = model.num_experts * expert_mlp_params(model)
    return {"dense": attn + shared + router + norms, "expert": expert}


def mtp_layer_params(model: ModelSpec) -> dict[str, float]:
    """Parameters of a multi-token-prediction module's layer (mtp_layer_forward_flops's layer)."""
    if not model.hybrid_pattern:
        return layer_params(model, model.is_moe_layer(model.layers - 1))
    a, b = sublayer_params(model, "*"), sublayer_params(model, "E" if model.is_moe else "-")
    return {key: a[key] + b[key] for key in a}


def embedding_params(model: ModelSpec) -> dict[str, float]:
    emb = model.vocab * model.hidden
    pos = model.seq_len * model.hidden if model.learned_position_embeddings else 0
    head = 0 if model.tied_embeddings else model.vocab * model.hidden
    return {"embedding": emb + pos, "lm_head": head}


def total_params(model: ModelSpec) -> float:
    dense = layer_params(model, False)
    moe = layer_params(model, True) if model.is_moe else {"dense": 0.0, "expert": 0.0}
    n_dense = model.layers - model.moe_layers
    e = embedding_params(model)
    return (n_dense * (dense["dense"] + dense["expert"])
            + model.moe_layers * (moe["dense"] + moe["expert"])
            + e["embedding"] + e["lm_head"] + model.hidden)


def active_params(model: ModelSpec) -> float:
    """Parameters a token passes through (routed experts counted top-k times, embeddings excluded)."""
    if model.hybrid_pattern:
        counts = model.hybrid_counts
        act = sum(n * sublayer_params(model, k)["dense"] for k, n in counts.items())
        return act + counts["E"] * model.moe_topk * expert_mlp_params(model)
    dense = layer_params(model, False)["dense"]
    n_dense = model.layers - model.moe_layers
    act = n_dense * dense
    if model.is_moe:
        moe = layer_params(model, True)
        act += model.moe_layers * (moe["dense"] + model.moe_topk * expert_mlp_params(model))
    return act


def layer_forward_flops(model: ModelSpec, tokens, seq_len, moe: bool, causal: bool = True) -> dict:
    """Forward FLOPs of one layer for ``tokens`` tokens of sequences of length ``seq_len``.

    Terms (2 FLOPs per multiply-add):
    - ``gemm``: attention projections 2*T*params_attn + MLP 2*T*params_mlp (dense or shared experts)
    - ``expert``: routed experts 2*T*k*params_expert_mlp (+ router 2*T*h*E)
    - ``attn``: the attention core QK^T and PV: 2*T*s*a*(d_qk + d_v), halved when causal
      (flash attention skips the masked half; Megatron's model-FLOP formula counts it whole).
    """
    tokens = np.asarray(tokens, dtype=float)
    if model.hybrid_pattern:
        return _pattern_mean(model, lambda k: sublayer_forward_flops(model, tokens, seq_len, k, causal),
                             ("gemm", "expert", "attn"))
    dims = attention_proj_dims(model)
    attn_proj = 2.0 * tokens * dims["params"]
    core = 2.0 * tokens * np.asarray(seq_len, dtype=float) * model.heads * (
        dims["qk_head_dim"] + dims["v_head_dim"])
    if causal:
        core = core * 0.5
    if moe:
        shared = 2.0 * tokens * model.shared_experts * mlp_params(model, model.expert_ffn)
        expert = 2.0 * tokens * model.moe_topk * expert_mlp_params(model)
        router = 2.0 * tokens * model.hidden * model.num_experts
        return {"gemm": attn_proj + shared + router, "expert": expert, "attn": core}
    mlp = 2.0 * tokens * mlp_params(model, model.ffn_hidden)
    return {"gemm": attn_proj + mlp, "expert": np.zeros_like(tokens), "attn": core}


def sublayer_forward_flops(model: ModelSpec, tokens, seq_len, kind: str, causal: bool = True) -> dict:
    """Forward FLOPs of one layer of a hybrid model's kind (M, *, -, E), in layer_forward_flops's terms; the
    Mamba mixer's projections are ``gemm``, its SSD scan ``attn`` (the sequence-mixing core)."""
    tokens = np.asarray(tokens, dtype=float)
    zero = np.zeros_like(tokens)
    if kind == "M":
        d = mamba_dims(model)
        return {"gemm": 2.0 * tokens * model.hidden * (d["d_in_proj"] + d["d_inner"]), "expert": zero,
                "attn": tokens * ssd_forward_flops_per_token(model)}
    if kind == "-":
        return {"gemm": 2.0 * tokens * mlp_params(model, model.ffn_hidden), "expert": zero, "attn": zero}
    plain = model.model_copy(update={"hybrid_pattern": None, "dense_layers": 0})
    f = layer_forward_flops(plain, tokens, seq_len, moe=(kind == "E"), causal=causal)
    attn_proj = 2.0 * tokens * attention_proj_dims(model)["params"]
    if kind == "*":
        return {"gemm": attn_proj + zero, "expert": zero, "attn": f["attn"]}
    latent = 2.0 * tokens * 2 * model.hidden * model.moe_latent if model.moe_latent else 0.0
    return {"gemm": f["gemm"] - attn_proj + latent, "expert": f["expert"], "attn": zero}


def mtp_layer_forward_flops(model: ModelSpec, tokens, seq_len, causal: bool = True) -> dict:
    """Forward FLOPs of a multi-token-prediction module's layer: one of the model's last kind, or for a hybrid
    model attention plus its MLP or MoE (megatron-core's hybrid MTP pattern ``*E``)."""
    if not model.hybrid_pattern:
        return layer_forward_flops(model, tokens, seq_len, moe=model.is_moe_layer(model.layers - 1), causal=causal)
    a = sublayer_forward_flops(model, tokens, seq_len, "*", causal)
    b = sublayer_forward_flops(model, tokens, seq_len, "E" if model.is_moe else "-", causal)
    return {key: a[key] + b[key] for key in a}


def model_flops_per_step(model: ModelSpec, global_batch) -> np.ndarray:
    """Model FLOPs of one optimizer step: 3x forward (fwd + 2x bwd), attention counted non-causal,
    logits included, no recompute. For a GPT this is exactly Korthikanti Eq. 7. Each multi-token-prediction
    module adds a layer of the last kind, its 2h->h projection and the logits once more. LoRA on frozen
    weights (ModelSpec.finetune): the weight GEMMs run forward and data-gradient only (2x their forward),
    the attention core still 3x."""
    tokens = np.asarray(global_batch, dtype=float) * model.seq_len
    n_dense = model.layers - model.moe_layers
    linear, attn = 0.0, 0.0
    f = layer_forward_flops(model, tokens, model.seq_len, moe=False, causal=False)
    linear, attn = linear + n_dense * (f["gemm"] + f["expert"]), attn + n_dense * f["attn"]
    if model.is_moe:
        f = layer_forward_flops(model, tokens, model.seq_len, moe=True, causal=False)
        linear, attn = linear + model.moe_layers * (f["gemm"] + f["expert"]), attn + model.moe_layers * f["attn"]
    logits = 2.0 * tokens * model.hidden * model.vocab
    linear = linear + logits
    if model.mtp_layers:
        f = mtp_layer_forward_flops(model, tokens, model.seq_len, causal=False)
        eh_proj = 2.0 * tokens * 2 * model.hidden * model.hidden
        linear = linear + model.mtp_layers * (f["gemm"] + f["expert"] + eh_proj + logits)
        attn = attn + model.mtp_layers * f["attn"]
    return (2.0 if model.finetune == "lora" else 3.0) * linear + 3.0 * attn


def korthikanti_eq7(global_batch, layers, seq_len, hidden, vocab) -> float:
    """Korthikanti et al. 2022, Appendix A, Eq. 7: 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL))."""
    B, L, s, h, V = global_batch, layers, seq_len, hidden, vocab
    return 72.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def narayanan_eq3(global_batch, layers, seq_len, hidden, vocab) -> float:
    """Narayanan et al. 2021, Eq. 3 (counts the recompute forward): 96*B*s*l*h^2*(1 + s/(6h) + V/(16lh))."""
    B, L, s, h, V = global_batch, layers, seq_len, hidden, vocab
    return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
