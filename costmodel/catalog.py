"""Named model architectures, and import of Hugging Face ``config.json`` files.

``get_model`` takes a catalog name (case and punctuation ignored, common aliases accepted)
or the path of a Hugging Face ``config.json`` (or of a directory holding one) and returns a
frozen :class:`~costmodel.specs.ModelSpec`. The catalog below is plain data; the specs are
built on first use by :func:`catalog` and cached.

Each entry cites where its numbers come from. Parameter counts computed from these shapes
are checked against the published sizes in ``tests/test_catalog.py``.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from costmodel.profiles import InputError, parse_json, read_text, validation_line
from costmodel.specs import ModelSpec, moe_layout

__all__ = ["catalog", "catalog_names", "aliases", "matching", "get_model", "from_hf_config", "CATALOG"]

# Catalog ----------------------------------------------------------------------------------
# name -> (aliases, ModelSpec fields). Plain data: nothing is built at import time.
# The architectural facts (rotary base and scaling, normalisation and epsilon, qk-norm, activation, biases,
# router) are those of the cited config.json: rope_theta, rope_scaling, rms_norm_eps, hidden_act,
# attention_bias, scoring_func, topk_method, routed_scaling_factor, n_group, topk_group, norm_topk_prob.
_LLAMA = dict(activation="swiglu", normalization="RMSNorm", linear_bias=False, attention_dropout=0.0,
              hidden_dropout=0.0)
_LLAMA31_ROPE = dict(rotary_base=500000.0, rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0,
                     high_freq_factor=4.0, original_max_position_embeddings=8192))
# gpt-oss facts no ModelSpec field holds (HF openai/gpt-oss-120b config.json and modeling_gpt_oss.py).
GPT_OSS_UNEXPRESSED = (
    "YaRN without truncation of the correction range (rope_scaling.truncate false)",
    "sliding-window attention of 128 tokens on 18 of 36 layers",
    "router bias (the router's linear layer has a bias)",
    "attention sinks (a learned per-head logit in every attention softmax)",
)
# gpt-oss's fields but its depth and expert count (the gpt-oss-120b entry below cites them; gpt-oss-20b shares them).
_GPT_OSS = dict(hidden=2880, ffn_hidden=2880, heads=64, kv_heads=8, head_dim=64, vocab=201088, seq_len=4096,
                moe_topk=4, moe_ffn_hidden=2880, activation="quick_geglu", activation_clamp=7.0, glu_linear_offset=1.0,
                normalization="RMSNorm", norm_epsilon=1e-5, linear_bias=True, attention_dropout=0.0,
                hidden_dropout=0.0, rotary_base=150000.0,
                rope_scaling=dict(type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0,
                                  beta_slow=1.0))
# Gemma 2 facts no ModelSpec field holds (its entries below cite them); a gemma2 config.json states the window and
# the soft-caps with their values (_position_fields, _gemma2_facts) and implies the rest.
_GEMMA_2_IMPLIED = (
    "a norm after attention and after the MLP as well as before each (four per layer), scaled by (1 + w)",
    "embeddings scaled by sqrt(hidden) and queries by 1 / sqrt(query_pre_attn_scalar)",
)
_GEMMA_2_UNEXPRESSED = (
    "sliding-window attention of 4096 tokens on every other layer",
    "attention logits soft-capped at 50 and final logits at 30",
    *_GEMMA_2_IMPLIED,
)
# Llama 4's text model (Scout and Maverick; their entries below say where from).
_LLAMA_4 = dict(layers=48, hidden=5120, ffn_hidden=16384, heads=40, kv_heads=8, head_dim=128, vocab=202048,
                seq_len=8192, moe_topk=1, moe_ffn_hidden=8192, shared_experts=1, **_LLAMA, norm_epsilon=1e-5,
                rotary_base=500000.0, moe_router_score="sigmoid", moe_router_norm_topk=False)
# What neither Llama 4 text model's fields hold; Scout's L2 QK norm and the multimodal wrapper's vision encoder are
# added where they apply (as from_hf_config words them).
_LLAMA_4_UNEXPRESSED = ("no rotary embedding on every 4th layer (NoPE) and chunked attention of 8192 tokens on "
                        "the others", "router scores applied to the expert input (moe_apply_probs_on_input)")
_VISION_ENCODER = "the vision encoder"
# Grok-1 facts no ModelSpec field holds (xai-org/grok-1 model.py).
GROK_1_UNEXPRESSED = (
    "attention logits soft-capped at 30 (30 tanh(x / 30)) and scaled by attn_output_multiplier 0.0884",
    "an RMSNorm after attention and after the MoE block as well as before each (four per layer)",
    "embedding and output multipliers (78.38 and 0.577)",
)
# Nemotron-H / Nemotron 3 (hybrid Mamba) facts shared by the entries below (they cite them).
_NEMOTRON_H = dict(vocab=131072, gated_mlp=False, activation="squared_relu", normalization="RMSNorm",
                   norm_epsilon=1e-5, linear_bias=False, attention_dropout=0.0, hidden_dropout=0.0)
# DeepSeek-V3's fields (its entry below cites them); Kimi K2 is the same architecture with other sizes.
_DEEPSEEK_V3 = dict(layers=61, hidden=7168, ffn_hidden=18432, heads=128, head_dim=128, vocab=129280,
                    seq_len=4096, num_experts=256, moe_topk=8, moe_ffn_hidden=2048, shared_experts=1,
                    dense_layers=3, mla_kv_lora_rank=512, mla_q_lora_rank=1536, mla_rope_dim=64,
                    mla_v_head_dim=128, mtp_layers=1, **_LLAMA, norm_epsilon=1e-6, qk_norm=True,
                    rotary_base=10000.0, rope_scaling=dict(type="yarn", factor=40.0,
                                                           original_max_position_embeddings=4096, beta_fast=32.0,
                                                           beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                    moe_router_score="sigmoid", moe_router_expert_bias=True, moe_router_topk_scaling=2.5,
                    moe_router_groups=8, moe_router_group_topk=4, moe_router_norm_topk=True)
# DeepSeek-V2's YaRN (its entries below cite it).
_DEEPSEEK_V2_YARN = dict(type="yarn", factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0,
                         beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707)
_ENTRIES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    # Llama 2 7B. Touvron et al. 2023, "Llama 2", Table 1 / HF meta-llama/Llama-2-7b-hf
    # config.json (32 layers, 4096, intermediate 11008, 32 heads MHA, vocab 32000, 4k context;
    # rms_norm_eps 1e-05, no rope_theta key = LlamaConfig's 10000, silu, no biases, untied).
    "7b": (
        ("llama2-7b", "llama-2-7b", "meta-llama/Llama-2-7b-hf"),
        dict(layers=32, hidden=4096, ffn_hidden=11008, heads=32, vocab=32000, seq_len=4096, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=10000.0),
    ),
    # Llama 3 8B. Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 / HF
    # meta-llama/Meta-Llama-3-8B config.json (32 layers, 4096, 14336, 32 heads, 8 KV heads;
    # rope_theta 500000, rms_norm_eps 1e-05, rope_scaling null, silu, attention_bias false, untied).
    "8b": (
        ("llama3-8b", "llama-3-8b", "meta-llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
        dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
             seq_len=8192, **_LLAMA, norm_epsilon=1e-5, rotary_base=500000.0),
    ),
    # Llama 3.1 8B: the Llama 3 8B shape; HF meta-llama/Llama-3.1-8B config.json adds rope_scaling
    # {rope_type llama3, factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0,
    # original_max_position_embeddings 8192}.
    "llama3.1-8b": (
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
             seq_len=8192, **_LLAMA, norm_epsilon=1e-5, **_LLAMA31_ROPE),
    ),
    # Llama 3.2 1B and 3B (Meta 2024, "Llama 3.2" model card: 1.23B and 3.21B) / HF meta-llama/Llama-3.2-1B and
    # meta-llama/Llama-3.2-3B config.json (16 / 28 layers, hidden 2048 / 3072, intermediate 8192, 32 / 24 Q heads,
    # 8 KV heads, head_dim 64 / 128, vocab 128256, tie_word_embeddings true, rope_theta 500000, rope_scaling llama3
    # factor 32, low 1, high 4, original 8192, rms_norm_eps 1e-05).
    "llama3.2-1b": (
        ("llama-3.2-1b", "meta-llama/Llama-3.2-1B"),
        dict(layers=16, hidden=2048, ffn_hidden=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256,
             seq_len=8192, tied_embeddings=True, **_LLAMA, norm_epsilon=1e-5,
             **{**_LLAMA31_ROPE, "rope_scaling": {**_LLAMA31_ROPE["rope_scaling"], "factor": 32.0}}),
    ),
    "llama3.2-3b": (
        ("llama-3.2-3b", "meta-llama/Llama-3.2-3B"),
        dict(layers=28, hidden=3072, ffn_hidden=8192, heads=24, kv_heads=8, head_dim=128, vocab=128256,
             seq_len=8192, tied_embeddings=True, **_LLAMA, norm_epsilon=1e-5,
             **{**_LLAMA31_ROPE, "rope_scaling": {**_LLAMA31_ROPE["rope_scaling"], "factor": 32.0}}),
    ),
    # Llama 2 13B. "Llama 2" paper / HF meta-llama/Llama-2-13b-hf config.json
    # (40 layers, 5120, intermediate 13824, 40 heads MHA, vocab 32000, 4k context; as 7B: rms_norm_eps
    # 1e-05, rope_theta 10000).
    "13b": (
        ("llama2-13b", "llama-2-13b", "meta-llama/Llama-2-13b-hf"),
        dict(layers=40, hidden=5120, ffn_hidden=13824, heads=40, vocab=32000, seq_len=4096, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=10000.0),
    ),
    # Llama 3 70B. "The Llama 3 Herd of Models", Table 3 / HF meta-llama/Meta-Llama-3-70B
    # config.json (80 layers, 8192, 28672, 64 heads, 8 KV heads, vocab 128256, 8k pretraining;
    # rope_theta 500000, rms_norm_eps 1e-05, rope_scaling null).
    "70b": (
        ("llama3-70b", "llama-3-70b", "meta-llama-3-70b", "meta-llama/Meta-Llama-3-70B"),
        dict(layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=128256,
             seq_len=8192, **_LLAMA, norm_epsilon=1e-5, rotary_base=500000.0),
    ),
    # Llama 3.1 70B: the Llama 3 70B shape; HF meta-llama/Llama-3.1-70B config.json adds the llama3
    # rope_scaling of Llama 3.1 8B (factor 8, low 1, high 4, original 8192). Llama 3.3 70B is the same network
    # (HF meta-llama/Llama-3.3-70B-Instruct config.json: the same shape, rope_theta and rope_scaling).
    "llama3.1-70b": (
        ("llama-3.1-70b", "meta-llama/Llama-3.1-70B", "llama3.3-70b", "llama-3.3-70b",
         "meta-llama/Llama-3.3-70B-Instruct"),
        dict(layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=128256,
             seq_len=8192, **_LLAMA, norm_epsilon=1e-5, **_LLAMA31_ROPE),
    ),
    # Llama 3.1 405B. "The Llama 3 Herd of Models", Table 3 (126 layers, model dim 16384,
    # FFN dim 53248, 128 heads, 8 KV heads, vocab 128000+256 special = 128256, 8k pretraining) /
    # HF meta-llama/Llama-3.1-405B config.json (rope_theta 500000, rms_norm_eps 1e-05, rope_scaling llama3
    # factor 8, low 1, high 4, original 8192).
    "405b": (
        ("llama3.1-405b", "llama-3.1-405b", "llama3-405b", "llama-3-405b",
         "meta-llama/Llama-3.1-405B"),
        dict(layers=126, hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8, vocab=128256,
             seq_len=8192, **_LLAMA, norm_epsilon=1e-5, **_LLAMA31_ROPE),
    ),
    # GPT-3 175B. Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads x 128,
    # context 2048; FFN = 4 d_model); vocab 51200 = GPT-2 BPE 50257 padded as in Narayanan
    # et al. 2021 (Megatron-LM) / NeMo GPTConfig175B. Learned positions, tied embeddings. Brown et al.:
    # "the same model and architecture as GPT-2": HF openai-community/gpt2 config.json (biases,
    # layer_norm_epsilon 1e-05, resid_pdrop / attn_pdrop 0.1); GELU as Megatron-LM computes it.
    "gpt3-175b": (
        ("gpt-3-175b", "gpt3", "gpt-3", "175b"),
        dict(layers=96, hidden=12288, ffn_hidden=49152, heads=96, vocab=51200, seq_len=2048,
             gated_mlp=False, learned_position_embeddings=True, tied_embeddings=True, activation="gelu",
             normalization="LayerNorm", norm_epsilon=1e-5, linear_bias=True, attention_dropout=0.1,
             hidden_dropout=0.1),
    ),
    # Mixtral 8x7B. Jiang et al. 2024, "Mixtral of Experts", Table 1 / HF
    # mistralai/Mixtral-8x7B-v0.1 config.json (32 layers, 4096, 14336, 32 heads, 8 KV heads,
    # 8 experts top-2, vocab 32000; rope_theta 1e6, rms_norm_eps 1e-05, sliding_window null, softmax
    # router renormalised over the top-2). seq_len 4096 is a training choice, not the 32k context.
    "mixtral-8x7b": (
        ("mixtral", "mixtral8x7b", "mistralai/Mixtral-8x7B-v0.1"),
        dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000,
             seq_len=4096, num_experts=8, moe_topk=2, moe_ffn_hidden=14336, **_LLAMA, norm_epsilon=1e-5,
             rotary_base=1000000.0, moe_router_score="softmax", moe_router_norm_topk=True),
    ),
    # Mixtral 8x22B (141B total / 39B active, Mistral AI 2024, "Cheaper, Better, Faster, Stronger" announcement).
    # NeMo MixtralConfig8x22B (56 layers, 6144, ffn 16384, 48 heads, MixtralConfig's 8 query groups and
    # rotary_base 1e6, 8 experts top-2, seq_length 4096) / HF mistralai/Mixtral-8x22B-v0.1 config.json (the same,
    # vocab_size 32000, rms_norm_eps 1e-05, max_position_embeddings 65536); router as Mixtral 8x7B's.
    "mixtral-8x22b": (
        ("mixtral8x22b", "mistralai/Mixtral-8x22B-v0.1"),
        dict(layers=56, hidden=6144, ffn_hidden=16384, heads=48, kv_heads=8, vocab=32000,
             seq_len=4096, num_experts=8, moe_topk=2, moe_ffn_hidden=16384, **_LLAMA, norm_epsilon=1e-5,
             rotary_base=1000000.0, moe_router_score="softmax", moe_router_norm_topk=True),
    ),
    # Grok-1 (314B total; xAI 2024, "Open Release of Grok-1": 25% of the weights active on a token). xai-org/grok-1
    # run.py (64 layers, emb_size 48 x 128 = 6144, 48 Q / 8 KV heads, key_size 128, widening_factor 8, 8 experts of
    # which 2 selected, vocab 128 x 1024, sequence_len 8192) and model.py (ffn_size: int(8 x 6144) x 2 // 3 = 32768;
    # the expert MLP gelu(linear(x)) x linear_v(x), a gated GELU; softmax router, the top-2 probabilities not
    # renormalised; RMSNorm eps 1e-05; rotary base 1e4; no biases).
    "grok-1": (
        ("grok1", "grok-1-314b", "xai-org/grok-1"),
        dict(layers=64, hidden=6144, ffn_hidden=32768, heads=48, kv_heads=8, head_dim=128, vocab=131072,
             seq_len=8192, num_experts=8, moe_topk=2, moe_ffn_hidden=32768, **{**_LLAMA, "activation": "geglu"},
             norm_epsilon=1e-5, rotary_base=10000.0, moe_router_score="softmax", moe_router_norm_topk=False,
             unexpressed=GROK_1_UNEXPRESSED),
    ),
    # DeepSeek-V3 (671B total / 37B active). DeepSeek-AI 2024, "DeepSeek-V3 Technical
    # Report", section 4.2 / HF deepseek-ai/DeepSeek-V3 config.json (61 layers, 7168,
    # intermediate 18432, moe_intermediate 2048, 128 heads, kv_lora_rank 512, q_lora_rank 1536,
    # qk_nope 128, qk_rope 64, v_head 128, 256 routed + 1 shared experts, top-8,
    # first_k_dense_replace 3, vocab 129280, num_nextn_predict_layers 1: one MTP module; pretraining at 4k;
    # rope_theta 10000, rope_scaling yarn factor 40 / original 4096 / beta_fast 32 / beta_slow 1 / mscale 1.0 /
    # mscale_all_dim 1.0, rms_norm_eps 1e-06, scoring_func sigmoid, topk_method noaux_tc (expert bias),
    # routed_scaling_factor 2.5, n_group 8, topk_group 4, norm_topk_prob true; modeling_deepseek.py normalises
    # the q and kv latents (q_a_layernorm, kv_a_layernorm): Megatron's --qk-layernorm with MLA).
    "deepseek-v3": (("deepseekv3", "deepseek-v3-671b", "deepseek-ai/DeepSeek-V3"), _DEEPSEEK_V3),
    # DeepSeek-V2 (236B total / 21B active) and DeepSeek-V2-Lite (15.7B / 2.4B). DeepSeek-AI 2024, "DeepSeek-V2",
    # arXiv:2405.04434 / HF deepseek-ai/DeepSeek-V2 and deepseek-ai/DeepSeek-V2-Lite config.json: 60 / 27 layers,
    # hidden 5120 / 2048, intermediate 12288 / 10944 (the first_k_dense_replace 1 dense layer), moe_intermediate
    # 1536 / 1408, 128 / 16 heads, q_lora_rank 1536 / null, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128,
    # 160 / 64 routed + 2 shared experts, top-6, vocab 102400, scoring_func softmax, norm_topk_prob false,
    # routed_scaling_factor 16.0 / 1.0, group_limited_greedy over n_group 8, topk_group 3 (V2; Lite greedy),
    # rope_theta 10000, yarn factor 40 / original 4096 / beta_fast 32 / beta_slow 1 / mscale 0.707 / mscale_all_dim
    # 0.707, rms_norm_eps 1e-06, no MTP, untied.
    "deepseek-v2": (
        ("deepseekv2", "deepseek-v2-236b", "deepseek-ai/DeepSeek-V2"),
        {**_DEEPSEEK_V3, **dict(layers=60, hidden=5120, ffn_hidden=12288, vocab=102400, num_experts=160, moe_topk=6,
                                moe_ffn_hidden=1536, shared_experts=2, dense_layers=1, mtp_layers=0,
                                rope_scaling=_DEEPSEEK_V2_YARN, moe_router_score="softmax",
                                moe_router_expert_bias=False, moe_router_topk_scaling=16.0, moe_router_groups=8,
                                moe_router_group_topk=3, moe_router_norm_topk=False)},
    ),
    "deepseek-v2-lite": (
        ("deepseekv2lite", "deepseek-ai/DeepSeek-V2-Lite"),
        {**_DEEPSEEK_V3, **dict(layers=27, hidden=2048, ffn_hidden=10944, heads=16, vocab=102400, num_experts=64,
                                moe_topk=6, moe_ffn_hidden=1408, shared_experts=2, dense_layers=1, mtp_layers=0,
                                mla_q_lora_rank=None, rope_scaling=_DEEPSEEK_V2_YARN, moe_router_score="softmax",
                                moe_router_expert_bias=False, moe_router_topk_scaling=1.0, moe_router_groups=None,
                                moe_router_group_topk=None, moe_router_norm_topk=False)},
    ),
    # Kimi K2 (1.04T total / 32B active). Moonshot AI 2025, "Kimi K2: Open Agentic Intelligence" / HF
    # moonshotai/Kimi-K2-Instruct config.json, DeepSeek-V3's architecture (DeepseekV3ForCausalLM) with 61 layers,
    # 7168, intermediate 18432, moe_intermediate 2048, 64 heads, kv_lora_rank 512, q_lora_rank 1536, qk_nope 128,
    # qk_rope 64, v_head 128, 384 routed + 1 shared experts, top-8, first_k_dense_replace 1, n_group 1 / topk_group 1
    # (no group-limited routing), vocab 163840, num_nextn_predict_layers 0, untied; rope_theta 50000, rope_scaling
    # yarn factor 32 / original 4096 / beta_fast 1 / beta_slow 1 / mscale 1.0 / mscale_all_dim 1.0, rms_norm_eps
    # 1e-06, scoring_func sigmoid, topk_method noaux_tc (expert bias), routed_scaling_factor 2.827, norm_topk_prob
    # true. Pretrained with the Muon optimizer (MuonClip): the catalog entry keeps the default, Adam; plan it with
    # Muon by --optimizer muon (ModelSpec.optimizer).
    "kimi-k2": (
        ("kimik2", "kimi-k2-1t", "moonshotai/Kimi-K2-Base", "moonshotai/Kimi-K2-Instruct"),
        {**_DEEPSEEK_V3, **dict(heads=64, vocab=163840, num_experts=384, dense_layers=1, mtp_layers=0,
                                rotary_base=50000.0, rope_scaling=dict(type="yarn", factor=32.0,
                                                                       original_max_position_embeddings=4096,
                                                                       beta_fast=1.0, beta_slow=1.0, mscale=1.0,
                                                                       mscale_all_dim=1.0),
                                moe_router_topk_scaling=2.827, moe_router_groups=None,
                                moe_router_group_topk=None)},
    ),
    # Qwen3-30B-A3B. Qwen Team 2025, "Qwen3 Technical Report", Table 2 / HF Qwen/Qwen3-30B-A3B
    # config.json (48 layers, 2048, 32 Q / 4 KV heads x 128, 128 experts top-8,
    # moe_intermediate 768, intermediate 6144 unused, vocab 151936, untied; rope_theta 1e6, rms_norm_eps
    # 1e-06, attention_bias false, norm_topk_prob true; modeling_qwen3_moe.py: q_norm / k_norm per head).
    "qwen3-30b-a3b": (
        ("qwen3-30b", "qwen3-30ba3b", "Qwen/Qwen3-30B-A3B"),
        dict(layers=48, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=4, head_dim=128,
             vocab=151936, seq_len=4096, num_experts=128, moe_topk=8, moe_ffn_hidden=768, **_LLAMA,
             norm_epsilon=1e-6, qk_norm=True, rotary_base=1000000.0, moe_router_norm_topk=True),
    ),
    # Qwen3-235B-A22B. "Qwen3 Technical Report", Table 2 / HF Qwen/Qwen3-235B-A22B config.json
    # (94 layers, 4096, 64 Q / 4 KV heads x 128, 128 experts top-8, moe_intermediate 1536,
    # intermediate 12288 unused, vocab 151936; rope_theta 1e6, rms_norm_eps 1e-06, norm_topk_prob true, qk-norm
    # as Qwen3-30B-A3B). seq 4096 = pretraining stages S1/S2.
    "qwen3-235b-a22b": (
        ("qwen3-235b", "qwen3-235ba22b", "Qwen/Qwen3-235B-A22B"),
        dict(layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, head_dim=128,
             vocab=151936, seq_len=4096, num_experts=128, moe_topk=8, moe_ffn_hidden=1536, **_LLAMA,
             norm_epsilon=1e-6, qk_norm=True, rotary_base=1000000.0, moe_router_norm_topk=True),
    ),
    # Qwen3 dense models. "Qwen3 Technical Report", Table 1 (Qwen3-8B 36 layers, 32 Q / 8 KV heads; -14B 40, 40 / 8;
    # -32B 64, 64 / 8; tie_embedding no) / HF Qwen/Qwen3-8B, Qwen/Qwen3-14B and Qwen/Qwen3-32B config.json (hidden
    # 4096 / 5120 / 5120, intermediate 12288 / 17408 / 25600, head_dim 128, vocab 151936, rope_theta 1e6,
    # rms_norm_eps 1e-06, attention_bias false, tie_word_embeddings false; modeling_qwen3.py: q_norm / k_norm per
    # head). seq 4096 as the Qwen3 MoE entries (pretraining stages S1/S2).
    "qwen3-8b": (
        ("qwen3-8b-base", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
        dict(layers=36, hidden=4096, ffn_hidden=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936,
             seq_len=4096, **_LLAMA, norm_epsilon=1e-6, qk_norm=True, rotary_base=1000000.0),
    ),
    "qwen3-14b": (
        ("qwen3-14b-base", "Qwen/Qwen3-14B", "Qwen/Qwen3-14B-Base"),
        dict(layers=40, hidden=5120, ffn_hidden=17408, heads=40, kv_heads=8, head_dim=128, vocab=151936,
             seq_len=4096, **_LLAMA, norm_epsilon=1e-6, qk_norm=True, rotary_base=1000000.0),
    ),
    "qwen3-32b": (
        ("Qwen/Qwen3-32B",),
        dict(layers=64, hidden=5120, ffn_hidden=25600, heads=64, kv_heads=8, head_dim=128, vocab=151936,
             seq_len=4096, **_LLAMA, norm_epsilon=1e-6, qk_norm=True, rotary_base=1000000.0),
    ),
    # gpt-oss-120b. OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card" / HF
    # openai/gpt-oss-120b config.json (36 layers, 2880, 64 Q / 8 KV heads x 64, 128 experts
    # top-4, intermediate 2880, vocab 201088, initial_context_length 4096, untied; rope_theta 150000,
    # rope_scaling yarn factor 32 / original 4096 / beta_fast 32 / beta_slow 1, rms_norm_eps 1e-05,
    # attention_bias true, swiglu_limit 7.0; modeling_gpt_oss.py: experts compute
    # (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g) with g = clamp(gate, max=7) = Megatron's quick-GeGLU with
    # clamp 7 and linear offset 1, expert and router biases, softmax over the top-4 router logits).
    # Attention sinks, the router bias, the alternating 128-token sliding window and YaRN's untruncated correction
    # range have no field (unexpressed, in the words from_hf_config uses for the same config).
    "gpt-oss-120b": (
        ("gptoss-120b", "gpt-oss", "openai/gpt-oss-120b"),
        dict(layers=36, num_experts=128, **_GPT_OSS, unexpressed=GPT_OSS_UNEXPRESSED),
    ),
    # Nemotron-4 340B. NVIDIA 2024, "Nemotron-4 340B Technical Report", Table 1 / NeMo
    # Nemotron4Config340B (96 layers, 18432, ffn 73728, 96 heads, 8 query groups, seq 4096,
    # vocab 256000, squared-ReLU 2-matrix MLP, untied embeddings; NeMo NemotronConfig: LayerNorm with
    # zero-centred gamma (HF NemotronLayerNorm1P, norm_eps 1e-05), no biases, dropout 0, rotary_percent 0.5
    # (HF partial_rotary_factor 0.5), rope_theta 10000).
    "nemotron4-340b": (
        ("nemotron-4-340b", "nemotron4", "nvidia/Nemotron-4-340B-Base"),
        dict(layers=96, hidden=18432, ffn_hidden=73728, heads=96, kv_heads=8, vocab=256000,
             seq_len=4096, gated_mlp=False, activation="squared_relu", normalization="LayerNorm1p",
             norm_epsilon=1e-5, linear_bias=False, attention_dropout=0.0, hidden_dropout=0.0,
             rotary_base=10000.0, rotary_percent=0.5),
    ),
    # Hybrid Mamba-2 / Transformer models, as Megatron-Bridge builds them (src/megatron/bridge/models/nemotronh/
    # nemotron_h_provider.py: NemotronHModelProvider and its sizes; mamba/mamba_provider.py: no position
    # embeddings, which planner/outputs.py writes for any hybrid model; RMSNorm 1e-5, no biases, no dropout, untied
    # output layer), vocabulary 131,072 (the models' config.json vocab_size). Non-gated squared-ReLU MLPs, GQA with 8
    # key-value groups unless given.
    # Nemotron-H 8B / 47B / 56B (NVIDIA 2025, "Nemotron-H", arXiv:2504.03624): 52 / 98 / 118 layers, 4 / 5 / 10 of
    # them attention.
    "nemotron-h-8b": (
        ("nemotronh8b", "nvidia/Nemotron-H-8B-Base-8K", "Nemotron-H-8B-Base-8K"),
        dict(layers=52, hidden=4096, ffn_hidden=21504, heads=32, kv_heads=8, head_dim=128, seq_len=8192,
             hybrid_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", mamba_heads=128,
             mamba_state_dim=128, **_NEMOTRON_H),
    ),
    "nemotron-h-56b": (
        ("nemotronh56b", "nvidia/Nemotron-H-56B-Base-8K", "Nemotron-H-56B-Base-8K"),
        dict(layers=118, hidden=8192, ffn_hidden=32768, heads=64, kv_heads=8, head_dim=128, seq_len=8192,
             hybrid_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                            "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", mamba_heads=256, mamba_state_dim=256,
             **_NEMOTRON_H),
    ),
    "nemotron-h-47b": (
        ("nemotronh47b", "nvidia/Nemotron-H-47B-Base-8K", "Nemotron-H-47B-Base-8K"),
        dict(layers=98, hidden=8192, ffn_hidden=30720, heads=64, kv_heads=8, head_dim=128, seq_len=8192,
             hybrid_pattern="M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-"
                            "M-M-M-M-M-", mamba_heads=256, mamba_state_dim=256, **_NEMOTRON_H),
    ),
    # Nemotron Nano 2 (NVIDIA 2025, "NVIDIA Nemotron Nano 2", arXiv:2508.14444; NemotronNanoModelProvider9Bv2 /
    # 12Bv2): Mamba heads of 80, 40 attention heads of 128; 8,192 tokens here (the providers' default is 131,072).
    "nemotron-nano-9b-v2": (
        ("nemotronnano9bv2", "nemotron-nano-2-9b", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "NVIDIA-Nemotron-Nano-9B-v2"),
        dict(layers=56, hidden=4480, ffn_hidden=15680, heads=40, kv_heads=8, head_dim=128, seq_len=8192,
             hybrid_pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", mamba_heads=128,
             mamba_head_dim=80, mamba_state_dim=128, **_NEMOTRON_H),
    ),
    "nemotron-nano-12b-v2": (
        ("nemotronnano12bv2", "nemotron-nano-2-12b", "nvidia/NVIDIA-Nemotron-Nano-12B-v2",
         "NVIDIA-Nemotron-Nano-12B-v2"),
        dict(layers=62, hidden=5120, ffn_hidden=20480, heads=40, kv_heads=8, head_dim=128, seq_len=8192,
             hybrid_pattern="M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-", mamba_heads=128,
             mamba_head_dim=80, mamba_state_dim=128, **_NEMOTRON_H),
    ),
    # Nemotron 3 Nano (31.6B total; Nemotron3NanoProvider): 23 Mamba-2, 23 MoE and 6 attention layers, 32 heads of
    # 128 over 2 key-value groups, 64 Mamba heads, 128 experts of 1,856 and a shared one of 3,712 (two of 1,856
    # here), top-6, sigmoid router with expert bias, scaling 2.5.
    "nemotron-3-nano": (
        ("nemotron3nano", "nemotron-3-nano-30b-a3b", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
         "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-3-Nano-30B-A3B"),
        dict(layers=52, hidden=2688, ffn_hidden=1856, heads=32, kv_heads=2, head_dim=128, seq_len=8192,
             hybrid_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", mamba_heads=64,
             mamba_state_dim=128, num_experts=128, moe_topk=6, moe_ffn_hidden=1856, shared_experts=2,
             moe_router_score="sigmoid", moe_router_expert_bias=True, moe_router_topk_scaling=2.5, **_NEMOTRON_H),
    ),
    # Nemotron 3 Super (120B total; Nemotron3SuperProvider): 88 layers (40 Mamba-2, 40 MoE, 8 attention), 4,096
    # wide, 128 Mamba heads, 512 experts of 2,688 in a LatentMoE of width 1,024 and a shared one of 5,376, top-22,
    # scaling 5.0, two multi-token-prediction modules (attention and MoE each).
    "nemotron-3-super": (
        ("nemotron3super", "nemotron-3-super-120b-a12b", "NVIDIA-Nemotron-3-Super-120B-A12B"),
        dict(layers=88, hidden=4096, ffn_hidden=2688, heads=32, kv_heads=2, head_dim=128, seq_len=8192,
             hybrid_pattern="MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME",
             mamba_heads=128, mamba_state_dim=128, num_experts=512, moe_topk=22, moe_ffn_hidden=2688,
             shared_experts=2, moe_latent=1024, mtp_layers=2, moe_router_score="sigmoid",
             moe_router_expert_bias=True, moe_router_topk_scaling=5.0, **_NEMOTRON_H),
    ),
    # Models of published training runs a CSV row may name without its architecture columns (2026-12-07). Each
    # is what its cited config states; what no ModelSpec field holds is in ``unexpressed``.
    # LLaMA (v1) 33B and 65B. Touvron et al. 2023, "LLaMA", arXiv:2302.13971, Table 2 (32.5B: 6656 wide, 52 heads,
    # 60 layers; 65.2B: 8192, 64, 80) / meta-llama/llama llama/model.py (SwiGLU of int(2/3 x 4d) rounded up to a
    # multiple of 256: 17920 and 22016; MHA; RMSNorm; rope base 10000; no biases; untied output) and the released
    # params.json (norm_eps 1e-06 for 33B, 1e-05 for 65B); vocab 32000; 2,048-token context ("Llama 2", Table 1).
    "llama-33b": (
        ("llama1-33b", "llama-1-33b", "llama-30b", "llama1-30b"),
        dict(layers=60, hidden=6656, ffn_hidden=17920, heads=52, vocab=32000, seq_len=2048, **_LLAMA,
             norm_epsilon=1e-6, rotary_base=10000.0),
    ),
    "llama-65b": (
        ("llama1-65b", "llama-1-65b"),
        dict(layers=80, hidden=8192, ffn_hidden=22016, heads=64, vocab=32000, seq_len=2048, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=10000.0),
    ),
    # Mistral 7B (v0.1). Jiang et al. 2023, arXiv:2310.06825, Table 1 (32 layers, dim 4096, hidden_dim 14336, 32
    # heads, 8 KV heads, window 4096, context_len 8192, vocab 32000) / HF mistralai/Mistral-7B-v0.1 config.json
    # (rms_norm_eps 1e-05, rope_theta 10000, silu, untied) and NeMo MistralConfig7B (no biases).
    "mistral-7b": (
        ("mistral-7b-v0.1", "mistral7b", "mistralai/Mistral-7B-v0.1"),
        dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000, seq_len=8192, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=10000.0,
             unexpressed=("sliding-window attention of 4096 tokens on every layer",)),
    ),
    # Qwen2.5-32B and -72B (base). HF Qwen/Qwen2.5-32B and Qwen/Qwen2.5-72B config.json (64 / 80 layers, 5120 /
    # 8192 wide, intermediate 27648 / 29568, 40 / 64 heads, 8 KV heads, vocab 152064, rms_norm_eps 1e-05,
    # rope_theta 1e6, no sliding window, untied) and Megatron-Bridge Qwen2ModelProvider (SwiGLU, QKV bias only).
    # The model cards: 32.5B and 72.7B parameters. seq 4096 as the Qwen3 entries (a planning default).
    "qwen2.5-32b": (
        ("qwen2.5-32b-base", "Qwen/Qwen2.5-32B"),
        dict(layers=64, hidden=5120, ffn_hidden=27648, heads=40, kv_heads=8, vocab=152064, seq_len=4096, **_LLAMA,
             qkv_bias=True, norm_epsilon=1e-5, rotary_base=1000000.0),
    ),
    "qwen2.5-72b": (
        ("qwen2.5-72b-base", "Qwen/Qwen2.5-72B"),
        dict(layers=80, hidden=8192, ffn_hidden=29568, heads=64, kv_heads=8, vocab=152064, seq_len=4096, **_LLAMA,
             qkv_bias=True, norm_epsilon=1e-5, rotary_base=1000000.0),
    ),
    # Qwen2-57B-A14B. HF Qwen/Qwen2-57B-A14B config.json (28 layers, 3584, 28 Q / 4 KV heads, 64 experts top-8 of
    # moe_intermediate 2560, a shared expert of 20480 = 8 x 2560, decoder_sparse_step 1: every layer MoE, vocab
    # 151936, rms_norm_eps 1e-06, rope_theta 1e6, norm_topk_prob false, untied; modeling_qwen2_moe.py: QKV bias,
    # a sigmoid gate on the shared expert). The name: 57B total, 14B active.
    "qwen2-57b-a14b": (
        ("qwen2-57b", "Qwen/Qwen2-57B-A14B"),
        dict(layers=28, hidden=3584, ffn_hidden=18944, heads=28, kv_heads=4, vocab=151936, seq_len=4096,
             num_experts=64, moe_topk=8, moe_ffn_hidden=2560, shared_experts=8, **_LLAMA, qkv_bias=True,
             norm_epsilon=1e-6, rotary_base=1000000.0, moe_router_norm_topk=False,
             unexpressed=("sigmoid gate on the shared expert (shared_expert_gate)",)),
    ),
    # gpt-oss-20b: gpt-oss-120b's architecture (below) at 24 layers and 32 experts. HF openai/gpt-oss-20b
    # config.json (24 layers, 2880, 64 Q / 8 KV heads x 64, 32 experts top-4, intermediate 2880, vocab 201088, the
    # 120b's rope, norm, biases and swiglu_limit; layer_types: sliding on 12 of 24). openai/gpt-oss README: 21B
    # parameters, 3.6B active.
    "gpt-oss-20b": (
        ("gptoss-20b", "openai/gpt-oss-20b"),
        dict(layers=24, num_experts=32, **_GPT_OSS,
             unexpressed=tuple(f.replace("18 of 36", "12 of 24") for f in GPT_OSS_UNEXPRESSED)),
    ),
    # DBRX (132B total / 36B active; databricks/dbrx MODEL_CARD_dbrx_base.md: 16 experts, 4 chosen, RoPE, GLU,
    # GQA, 32K context). Its config.json (d_model 6144, n_layers 40, n_heads 48, kv_n_heads 8, ffn_hidden_size
    # 10752, silu GLU experts, rope_theta 500000, clip_qkv 8, vocab 100352, untied) and transformers
    # modeling_dbrx.py (LayerNorm without bias, eps 1e-05; no linear biases; softmax router, top-4 weights
    # renormalised). seq 4096 is a planning default, not the 32K context.
    "dbrx": (
        ("dbrx-base", "dbrx-132b", "databricks/dbrx-base"),
        dict(layers=40, hidden=6144, ffn_hidden=10752, heads=48, kv_heads=8, vocab=100352, seq_len=4096,
             num_experts=16, moe_topk=4, moe_ffn_hidden=10752, **{**_LLAMA, "normalization": "LayerNorm"},
             norm_epsilon=1e-5, rotary_base=500000.0, moe_router_score="softmax", moe_router_norm_topk=True,
             unexpressed=("query, key and value clipped to +-8 (clip_qkv)",)),
    ),
    # Nemotron-4 15B. Parmar et al. 2024, arXiv:2402.16819 (32 layers, 6144, 48 heads, 8 KV heads, 4,096 tokens,
    # 256k vocabulary; 3.2B embedding + 12.5B non-embedding parameters) / NeMo Nemotron4Config15B (ffn 24576) on
    # NemotronConfig (as nemotron4-340b's).
    "nemotron-4-15b": (
        ("nemotron4-15b", "nemotron-15b"),
        dict(layers=32, hidden=6144, ffn_hidden=24576, heads=48, kv_heads=8, vocab=256000,
             seq_len=4096, gated_mlp=False, activation="squared_relu", normalization="LayerNorm1p",
             norm_epsilon=1e-5, linear_bias=False, attention_dropout=0.0, hidden_dropout=0.0,
             rotary_base=10000.0, rotary_percent=0.5),
    ),
    # Yi-34B. 01.AI 2024, "Yi: Open Foundation Models", arXiv:2403.04652, Table 1 (7168 wide, 56 Q / 8 KV heads,
    # 60 layers, 4,096 tokens; vocabulary 64,000; SwiGLU of 8/3 h) / its config.json as huggingface/candle
    # yi.rs config_34b restates it (intermediate 20480, rms_norm_eps 1e-05, rope_theta 5e6, no biases, untied).
    "yi-34b": (
        ("01-ai/Yi-34B",),
        dict(layers=60, hidden=7168, ffn_hidden=20480, heads=56, kv_heads=8, vocab=64000, seq_len=4096, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=5000000.0),
    ),
    # Code Llama 34B. Roziere et al. 2023, arXiv:2308.12950 (trained on 16k-token sequences; the 34B without
    # infilling) / HF codellama/CodeLlama-34b-hf config.json (48 layers, 8192, intermediate 22016, 64 Q / 8 KV
    # heads, vocab 32000, rms_norm_eps 1e-05, rope_theta 1e6, silu).
    "codellama-34b": (
        ("code-llama-34b", "codellama/CodeLlama-34b-hf"),
        dict(layers=48, hidden=8192, ffn_hidden=22016, heads=64, kv_heads=8, vocab=32000, seq_len=16384, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=1000000.0),
    ),
    # Gemma 2 9B and 27B. Gemma Team 2024, arXiv:2408.00118, Tables 1-2 (42 / 46 layers, 3584 / 4608 wide, 16 / 32
    # heads, 8 / 16 KV heads, head width 256 / 128, 8,192 tokens, GeGLU, tied embeddings, local sliding window
    # and global attention alternating, 9,242,164,736 / 27,227,718,144 parameters) / HF google/gemma-2-9b and
    # -27b config.json (intermediate 14336 / 36864, vocab 256000, rms_norm_eps 1e-06, rope_theta 10000,
    # attention_bias false, sliding_window 4096 on even layers, attn_logit_softcapping 50, final 30).
    "gemma-2-9b": (
        ("gemma2-9b", "google/gemma-2-9b"),
        dict(layers=42, hidden=3584, ffn_hidden=14336, heads=16, kv_heads=8, head_dim=256, vocab=256000,
             seq_len=8192, tied_embeddings=True, **{**_LLAMA, "activation": "geglu"}, norm_epsilon=1e-6,
             rotary_base=10000.0, unexpressed=_GEMMA_2_UNEXPRESSED),
    ),
    "gemma-2-27b": (
        ("gemma2-27b", "google/gemma-2-27b"),
        dict(layers=46, hidden=4608, ffn_hidden=36864, heads=32, kv_heads=16, head_dim=128, vocab=256000,
             seq_len=8192, tied_embeddings=True, **{**_LLAMA, "activation": "geglu"}, norm_epsilon=1e-6,
             rotary_base=10000.0, unexpressed=_GEMMA_2_UNEXPRESSED),
    ),
    # Phi-3-medium (14B; Abdin et al. 2024, "Phi-3 Technical Report", arXiv:2404.14219: 40 heads, 40 layers,
    # embedding dimension 5120) / HF microsoft/Phi-3-medium-4k-instruct config.json (intermediate 17920, 10 KV
    # heads, vocab 32064, 4,096 positions, rms_norm_eps 1e-05, rope_theta 10000, silu, no biases, untied;
    # sliding_window 2047).
    "phi-3-medium": (
        ("phi3-medium", "phi-3-medium-14b", "phi-3-medium-4k", "microsoft/Phi-3-medium-4k-instruct"),
        dict(layers=40, hidden=5120, ffn_hidden=17920, heads=40, kv_heads=10, vocab=32064, seq_len=4096, **_LLAMA,
             norm_epsilon=1e-5, rotary_base=10000.0,
             unexpressed=("sliding_window 2047 in the released config.json",)),
    ),
    # GLM-4.5 (355B total / 32B active) and GLM-4.5-Air (106B / 12B; zai-org/GLM-4.5 README), as Megatron-Bridge
    # builds them (src/megatron/bridge/models/glm/glm45_provider.py: 92 / 46 layers, 5120 / 4096 wide, the first 3 / 1
    # dense of ffn 12288 / 10944, 160 / 128 experts of 1536 / 1408 and one shared, top-8, 96 heads of 128 over 8 KV
    # groups, vocab 151552, RMSNorm 1e-05, QKV bias only, rotary base 1e6 on half of each head, qk-layernorm on the
    # 355B only, untied, one MTP layer, sigmoid router with expert bias and renormalised top-k, scaling 2.5 / 1.0).
    "glm-4.5": (
        ("glm4.5", "glm-4.5-355b", "zai-org/GLM-4.5"),
        dict(layers=92, hidden=5120, ffn_hidden=12288, heads=96, kv_heads=8, head_dim=128, vocab=151552,
             seq_len=4096, num_experts=160, moe_topk=8, moe_ffn_hidden=1536, shared_experts=1, dense_layers=3,
             mtp_layers=1, **_LLAMA, qkv_bias=True, qk_norm=True, norm_epsilon=1e-5, rotary_base=1000000.0,
             rotary_percent=0.5, moe_router_score="sigmoid", moe_router_expert_bias=True, moe_router_norm_topk=True,
             moe_router_topk_scaling=2.5),
    ),
    "glm-4.5-air": (
        ("glm4.5-air", "glm-4.5-air-106b", "zai-org/GLM-4.5-Air"),
        dict(layers=46, hidden=4096, ffn_hidden=10944, heads=96, kv_heads=8, head_dim=128, vocab=151552,
             seq_len=4096, num_experts=128, moe_topk=8, moe_ffn_hidden=1408, shared_experts=1, dense_layers=1,
             mtp_layers=1, **_LLAMA, qkv_bias=True, norm_epsilon=1e-5, rotary_base=1000000.0, rotary_percent=0.5,
             moe_router_score="sigmoid", moe_router_expert_bias=True, moe_router_norm_topk=True),
    ),
    # Qwen3-Coder-480B-A35B (QwenLM/Qwen3-Coder README: 480B total, 35B active) / its config.json (62 layers, 6144,
    # 160 experts of 2560, top-8, every layer MoE, no shared expert, 96 Q / 8 KV heads of 128, vocab 151936,
    # rms_norm_eps 1e-06, rope_theta 1e7, qk-norm per head, no biases, untied, softmax router renormalised).
    "qwen3-coder-480b-a35b": (
        ("qwen3-coder-480b", "Qwen/Qwen3-Coder-480B-A35B", "Qwen/Qwen3-Coder-480B-A35B-Instruct"),
        dict(layers=62, hidden=6144, ffn_hidden=8192, heads=96, kv_heads=8, head_dim=128, vocab=151936,
             seq_len=4096, num_experts=160, moe_topk=8, moe_ffn_hidden=2560, **_LLAMA, norm_epsilon=1e-6,
             qk_norm=True, rotary_base=10000000.0, moe_router_norm_topk=True),
    ),
    # MiniMax-M2 (MiniMaxAI/MiniMax-M2 README: 230B total, 10B active) / its config.json (62 layers, 3072, every
    # layer MoE: 256 experts of 1536, top-8, no shared expert; 48 Q / 8 KV heads of 128, vocab 200064, rms_norm_eps
    # 1e-06, rope_theta 5e6 on 64 of 128 dims, untied, sigmoid router with expert bias, top-k renormalised; full
    # attention on every layer) and vLLM's minimax_m2.py (no biases; the QK norm over all heads' width).
    "minimax-m2": (
        ("minimaxm2", "MiniMaxAI/MiniMax-M2"),
        dict(layers=62, hidden=3072, ffn_hidden=1536, heads=48, kv_heads=8, head_dim=128, vocab=200064,
             seq_len=4096, num_experts=256, moe_topk=8, moe_ffn_hidden=1536, **_LLAMA, norm_epsilon=1e-6,
             qk_norm=True, rotary_base=5000000.0, rotary_percent=0.5, moe_router_score="sigmoid",
             moe_router_expert_bias=True, moe_router_norm_topk=True,
             unexpressed=("QK norm over all heads' width (qk_norm_type per_layer), not per head",
                          "three multi-token-prediction modules in the released checkpoint (num_mtp_modules)")),
    ),
    # Llama 4 Scout (109B total with its vision encoder, 17B active; meta-llama/llama-models models/llama4/
    # MODEL_CARD.md) / args.py, moe.py, model.py and the HF Llama4 text config: 48 layers, 5120, every layer MoE
    # (interleave_moe_layer_step 1) with 16 experts of 8192, top-1, and one shared expert of 8192; 40 Q / 8 KV heads
    # of 128, vocab 202048, RMSNorm 1e-05, rope_theta 500000, no biases, untied; the router takes the top-1 logit
    # and a sigmoid of it, not renormalised. The text model only. Megatron-Bridge's Llama4Experts16ModelProvider
    # (llama_provider.py): Llama 3.1 rope scaling of factor 8 (apply_rope_scaling's low 1, high 4, 8192 positions).
    "llama4-scout": (
        ("llama-4-scout", "llama4-scout-17b-16e", "llama-4-scout-17b-16e", "meta-llama/Llama-4-Scout-17B-16E"),
        dict(**_LLAMA_4, num_experts=16,
             rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=8192),
             unexpressed=(*_LLAMA_4_UNEXPRESSED, "a weightless L2 QK norm on the rotary layers", _VISION_ENCODER)),
    ),
    # Llama 4 Maverick (400B total, 17B active; the same model card). Megatron-Bridge's
    # Llama4Experts128ModelProvider (llama_provider.py): Scout's Llama4ModelProvider with 128 experts,
    # moe_layer_freq [0, 1] * 24 (MoE on every other layer, the first dense), no rope scaling and no QK norm; the HF
    # text config as TensorRT-LLM's test_modeling_llama_min_latency.py restates it: intermediate_size 8192 (an
    # expert), intermediate_size_mlp 16384 (a dense layer), interleave_moe_layer_step 2, use_qk_norm false.
    "llama4-maverick": (
        ("llama-4-maverick", "llama4-maverick-17b-128e", "llama-4-maverick-17b-128e",
         "meta-llama/Llama-4-Maverick-17B-128E"),
        dict(**_LLAMA_4, num_experts=128, moe_layer_step=2, unexpressed=(*_LLAMA_4_UNEXPRESSED, _VISION_ENCODER)),
    ),
    # Megatron-LM's GPT-2 scaling models. Shoeybi et al. 2019, arXiv:1909.08053, Table 1 (hidden, heads, layers; 96
    # per head) and Sec. 4.2 / 5.1 (1,024 tokens; GPT-2's 50,257 tokens padded to 51,200); the code of that release
    # (NVIDIA/Megatron-LM mpu/transformer.py, model/gpt2_modeling.py): pre-LayerNorm, a 4h MLP with biases and the
    # tanh GELU, learned positions, the output layer tied to the input embedding; arguments.py's defaults for
    # LayerNorm epsilon (1e-05) and dropout (0.1). The 8.3B model the paper trained (Table 2) has 24 heads of 128
    # instead of Table 1's 32 of 96: the scaling runs are Table 1's.
    **{f"megatron-gpt2-{size}": (
        (f"megatron-lm-{size}", f"megatron-{size}", f"megatron-lm-gpt2-{size}"),
        dict(layers=layers, hidden=hidden, ffn_hidden=4 * hidden, heads=heads, vocab=51200, seq_len=1024,
             gated_mlp=False, activation="gelu_tanh", normalization="LayerNorm", norm_epsilon=1e-5,
             linear_bias=True, tied_embeddings=True, learned_position_embeddings=True, attention_dropout=0.1,
             hidden_dropout=0.1),
    ) for size, layers, hidden, heads in (("1.2b", 40, 1536, 16), ("2.5b", 54, 1920, 20), ("4.2b", 64, 2304, 24),
                                          ("8.3b", 72, 3072, 32))},
    # OLMoE-1B-7B (Muennighoff et al. 2024, arXiv:2409.02060; allenai/OLMoE README: 6.9B total, 1.3B active). HF
    # allenai/OLMoE-1B-7B-0924-SFT config.json (the base model's architecture): 16 layers, 2048, 16 heads of 128
    # (no GQA), every layer MoE with 64 experts of 1024, top-8 softmax not renormalised (norm_topk_prob false),
    # vocab 50304, 4,096 positions, rope_theta 10000, RMSNorm 1e-05, no biases, untied; transformers'
    # modular_olmoe.py: RMSNorm on the whole q and k projections before the heads are split.
    "olmoe-1b-7b": (
        ("olmoe", "olmoe-1b-7b-0924", "allenai/OLMoE-1B-7B-0924"),
        dict(layers=16, hidden=2048, ffn_hidden=1024, heads=16, kv_heads=16, head_dim=128, vocab=50304,
             seq_len=4096, num_experts=64, moe_topk=8, moe_ffn_hidden=1024, **_LLAMA, norm_epsilon=1e-5,
             rotary_base=10000.0, qk_norm=True, moe_router_norm_topk=False,
             unexpressed=("QK norm over all heads' width (q_norm / k_norm on the whole projection), not per head",)),
    ),
    # Falcon-7B and Falcon-180B (TII 2023). HF tiiuae/falcon-7b / falcon-180B config.json as the Cerebras model
    # zoo's params_falcon_7b / 180b.yaml restate them (32 / 80 layers, 4544 / 14848 wide, 71 / 232 heads of 64,
    # 1 / 8 KV heads, 4h GELU MLP, vocab 65024, 2,048 positions, LayerNorm 1e-05, no biases, rope 10000 on the
    # whole head, tied embeddings, parallel attention and MLP).
    "falcon-7b": (
        ("tiiuae/falcon-7b",),
        dict(layers=32, hidden=4544, ffn_hidden=18176, heads=71, kv_heads=1, head_dim=64, vocab=65024, seq_len=2048,
             gated_mlp=False, activation="gelu", normalization="LayerNorm", norm_epsilon=1e-5, linear_bias=False,
             tied_embeddings=True, rotary_base=10000.0,
             unexpressed=("parallel attention and MLP on one LayerNorm's output (parallel_attn)",)),
    ),
    "falcon-180b": (
        ("tiiuae/falcon-180B",),
        dict(layers=80, hidden=14848, ffn_hidden=59392, heads=232, kv_heads=8, head_dim=64, vocab=65024,
             seq_len=2048, gated_mlp=False, activation="gelu", normalization="LayerNorm", norm_epsilon=1e-5,
             linear_bias=False, tied_embeddings=True, rotary_base=10000.0,
             unexpressed=("parallel attention and MLP, each with its LayerNorm (new_decoder_architecture)",)),
    ),
    # BLOOM (176B). bigscience-workshop/bigscience train/tr11-176B-ml (NLAYERS=70, NHIDDEN=14336, NHEADS=112,
    # SEQ_LEN=2048, --pad-vocab-size-to 250880, --position-embedding-type alibi, --embed-layernorm; README: GELU,
    # tied embeddings, 12h^2 + 13h per layer: 4h MLP with biases) / HF bigscience/bloom (layer_norm_epsilon 1e-05);
    # model card: 176,247,271,424 parameters.
    "bloom-176b": (
        ("bloom", "bloom176b", "bigscience/bloom"),
        dict(layers=70, hidden=14336, ffn_hidden=57344, heads=112, vocab=250880, seq_len=2048, gated_mlp=False,
             activation="gelu", normalization="LayerNorm", norm_epsilon=1e-5, linear_bias=True, tied_embeddings=True,
             unexpressed=("ALiBi attention biases in place of rotary embeddings",
                          "a LayerNorm after the embedding (--embed-layernorm)")),
    ),
    # OPT-175B. Zhang et al. 2022, arXiv:2205.01068 / facebookresearch/metaseq launcher/opt_job_constants.py (96
    # layers, 12288, 96 heads, 4h FFN, 2,048 tokens) and opt_baselines.py (ReLU, learned positions, biases,
    # shared input and output embeddings, pre-LayerNorm); HF OPTConfig vocab_size 50272.
    "opt-175b": (
        ("opt175b", "facebook/opt-175b"),
        dict(layers=96, hidden=12288, ffn_hidden=49152, heads=96, vocab=50272, seq_len=2048, gated_mlp=False,
             activation="relu", normalization="LayerNorm", norm_epsilon=1e-5, linear_bias=True,
             tied_embeddings=True, learned_position_embeddings=True),
    ),
    # GPT-NeoX-20B. Black et al. 2022, arXiv:2204.06745 / EleutherAI/gpt-neox configs/20B.yml (44 layers, 6144,
    # 64 heads, seq 2048, rotary_pct 0.25, untied, gpt_j_residual: parallel attention and MLP) and the model card
    # (vocab 50257 padded to 50432; 20,554,567,680 parameters); HF GPTNeoXConfig (intermediate 24576, LayerNorm
    # 1e-05, biases, rotary base 10000).
    "gpt-neox-20b": (
        ("gptneox-20b", "neox-20b", "EleutherAI/gpt-neox-20b"),
        dict(layers=44, hidden=6144, ffn_hidden=24576, heads=64, vocab=50432, seq_len=2048, gated_mlp=False,
             activation="gelu", normalization="LayerNorm", norm_epsilon=1e-5, linear_bias=True,
             rotary_base=10000.0, rotary_percent=0.25,
             unexpressed=("parallel attention and MLP residual (use_parallel_residual)",)),
    ),
    # Megatron-Turing NLG 530B. Smith et al. 2022, arXiv:2201.11990 (105 layers, hidden 20480, 128 heads, 2,048
    # tokens, the GPT-2 tokenizer), built as Megatron's GPT: 4h GELU MLP, LayerNorm, biases, learned positions,
    # tied embeddings, vocab padded to 51200 (as this repo's KORTHIKANTI2022 rows of the same model give it).
    "mt-nlg-530b": (
        ("mtnlg-530b", "megatron-turing-nlg-530b", "mt-nlg"),
        dict(layers=105, hidden=20480, ffn_hidden=81920, heads=128, vocab=51200, seq_len=2048, gated_mlp=False,
             learned_position_embeddings=True, tied_embeddings=True, activation="gelu", normalization="LayerNorm",
             norm_epsilon=1e-5, linear_bias=True),
    ),
    # Llama 2 70B. "Llama 2" paper (GQA for 70B) / HF meta-llama/Llama-2-70b-hf config.json
    # (80 layers, 8192, 28672, 64 heads, 8 KV heads, vocab 32000, 4k context; rms_norm_eps 1e-05,
    # rope_theta 10000).
    "llama2-70b": (
        ("llama-2-70b", "meta-llama/Llama-2-70b-hf"),
        dict(layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=32000,
             seq_len=4096, **_LLAMA, norm_epsilon=1e-5, rotary_base=10000.0),
    ),
    # Tiny models for the executor's CPU runs (tests, the closed-loop benchmark, the README demo); not
    # published models. GELU MLP, MHA, untied embeddings, rope: exactly what executor/model.py builds (megatron-core's
    # TransformerConfig defaults: LayerNorm 1e-5, linear biases, dropout 0.1, rotary base 10000).
    # fp32: CPUs without bf16 arithmetic run bf16 GEMMs ~50x slower (measured by `plan profile`).
    "tiny-gpt": (
        ("tiny",),
        dict(layers=4, hidden=64, ffn_hidden=256, heads=4, kv_heads=4, vocab=512, seq_len=32, gated_mlp=False,
             precision="fp32"),
    ),
    "tiny-moe": (
        (),
        dict(layers=4, hidden=64, ffn_hidden=256, heads=4, kv_heads=4, vocab=512, seq_len=32, gated_mlp=False,
             num_experts=4, moe_topk=2, moe_ffn_hidden=128, precision="fp32"),
    ),
    # A larger CPU model (8 layers, so pp 4 with vpp 2 is a layout) for the closed-loop benchmark.
    "small-gpt": (
        (),
        dict(layers=8, hidden=128, ffn_hidden=512, heads=4, kv_heads=4, vocab=1024, seq_len=64, gated_mlp=False,
             precision="fp32"),
    ),
}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@lru_cache(maxsize=1)
def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for name, (aliases, _) in _ENTRIES.items():
        for key in (name, *aliases):
            k = _norm(key)
            if table.get(k, name) != name:  # pragma: no cover - guards edits to _ENTRIES
                raise RuntimeError(f"catalog alias {key!r} is ambiguous")
            table[k] = name
    return table


@lru_cache(maxsize=1)
def _catalog() -> dict[str, ModelSpec]:
    return {name: ModelSpec(name=name, **fields) for name, (_, fields) in _ENTRIES.items()}


def catalog() -> dict[str, ModelSpec]:
    """All catalog models by canonical name (a fresh dict; the specs are frozen and cached)."""
    return dict(_catalog())


def named_in(text: str) -> list[str]:
    """Catalog names whose name or an alias that names a family (letters beside the size: 'llama2-70b', 'gpt3',
    not '70b') occurs in ``text`` (case and punctuation ignored), the longest match first: 'LLAMA2-70B (SFT)' ->
    ['llama2-70b']."""
    t = _norm(text)
    hits = sorted(((len(k), name) for k, name in _alias_table().items()
                   if len(re.sub(r"[^a-z]", "", k)) >= 3 and k in t), reverse=True)
    return list(dict.fromkeys(name for _, name in hits))


def catalog_names() -> list[str]:
    """Canonical catalog names, in catalog order."""
    return list(_ENTRIES)


def aliases(name: str) -> tuple[str, ...]:
    """The other names a catalog model answers to (``get_model`` takes each), as the catalog lists them."""
    return _ENTRIES[name][0]


def matching(text: str) -> list[str]:
    """Catalog names whose name or an alias contains ``text`` (case and punctuation ignored), in catalog order."""
    want = _norm(text)
    return [name for name, (al, _) in _ENTRIES.items() if any(want in _norm(k) for k in (name, *al))]


def __getattr__(name: str) -> Any:
    # ``from costmodel.catalog import CATALOG`` builds the catalog lazily on first access.
    if name == "CATALOG":
        return catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_overrides(
    spec: ModelSpec, where: str, seq_len: int | None, precision: str | None
) -> ModelSpec:
    updates: dict[str, Any] = {}
    if seq_len is not None:
        updates["seq_len"] = seq_len
    if precision is not None:
        updates["precision"] = precision
    if not updates:
        return spec
    try:
        return ModelSpec.model_validate({**spec.model_dump(), **updates})
    except ValidationError as err:
        raise InputError(f"{where}: {validation_line(err)}") from None


def get_model(
    name_or_path: str | Path, *, seq_len: int | None = None, precision: str | None = None
) -> ModelSpec:
    """A model by catalog name or alias, or from a Hugging Face ``config.json`` path.

    ``seq_len`` and ``precision`` override the catalog's (or the config's) values.
    """
    text = str(name_or_path)
    p = Path(text).expanduser()
    if p.exists() or p.suffix == ".json":
        return from_hf_config(p, seq_len=seq_len, precision=precision)
    name = _alias_table().get(_norm(text)) or _alias_table().get(_norm(_variant_free(text)))
    if name is None:
        near = _near_names(_variant_free(text))
        raise InputError(
            f"unknown model {text!r}{f' (did you mean {near}?)' if near else ''}; catalog: "
            f"{', '.join(catalog_names())} (or pass the path of a Hugging Face config.json)"
        )
    return with_overrides(_catalog()[name], f"model {name!r}", seq_len, precision)


def _near_names(text: str) -> str:
    """Catalog names whose name or an alias is spelled nearly as ``text`` (difflib's ratio 0.8 or more), or ''."""
    table = _alias_table()
    keys = difflib.get_close_matches(_norm(text), list(table), n=6, cutoff=0.8)
    return " or ".join(dict.fromkeys(table[k] for k in keys))


# Words a release appends to a model's name that do not change its network: the Hugging Face organisation
# ('meta-llama/'), the tuning ('-Instruct', '-Base', '-Chat', '-it'), the checkpoint format ('-hf', '-FP8', '-BF16'),
# a version with a dot ('-v0.1') or a release date ('-2507').
_VARIANT = re.compile(r"[-_. ]+(base|instruct|chat|hf|it|fp8|bf16|v\d+\.\d+|\d{4})$", re.I)


def _variant_free(text: str) -> str:
    """``text`` without its organisation prefix and trailing variant words (_VARIANT): 'Qwen/Qwen3-30B-A3B-Instruct-2507'
    -> 'Qwen3-30B-A3B'."""
    t = text.strip().rsplit("/", 1)[-1]
    while True:
        shorter = _VARIANT.sub("", t)
        if shorter == t:
            return t
        t = shorter


# Hugging Face import ------------------------------------------------------------------------
_MISSING = object()

# model_type values whose MLP is the two-matrix GPT/NeoX/Nemotron kind (no gate).
_UNGATED_TYPES = {"gpt2", "gpt_neox", "gpt_bigcode", "gptj", "opt", "falcon", "nemotron",
                  "starcoder2", "phi", "bloom", "mpt"}
_UNGATED_ACTS = {"relu2", "squared_relu"}
# model_type values with a learned absolute position table.
_LEARNED_POS_TYPES = {"gpt2", "gpt_bigcode", "opt"}
# model_type values whose transformers config ties embeddings by default.
_TIED_BY_DEFAULT = {"gpt2", "gpt_bigcode", "gptj", "opt", "bloom", "mpt", "phi", "gemma2"}


class _Config:
    """Field look-up over one HF config, remembering which key each value came from."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.source: dict[str, str] = {}

    def get(self, field: str, *keys: str, default: Any = _MISSING) -> Any:
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                self.source[field] = key
                return value
        if default is _MISSING:
            names = " / ".join(repr(k) for k in keys)
            raise InputError(f"{self.path}: missing required field {names}")
        self.source[field] = keys[0] if keys else field
        return default

    def int_(self, field: str, *keys: str, default: Any = _MISSING) -> Any:
        value = self.get(field, *keys, default=default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(
                f"{self.path}: field '{self.source[field]}': expected an integer, got {value!r}"
            )
        return value


def _read_json(path: Path) -> dict[str, Any]:
    data = parse_json(read_text(path, "config.json"), path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object of config fields at the top level")
    return data


def _resolve_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.exists():
            raise InputError(f"{p}: file not found (the directory holds no config.json)")
    return p


def from_hf_config(
    path: str | Path, *, seq_len: int | None = None, precision: str | None = None
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (or a directory holding one).

    Understands Llama / Mistral / Mixtral / Qwen2 / Qwen2-MoE / Qwen3 / Qwen3-MoE /
    DeepSeek-V2/V3 / GPT-OSS / GPT-2 / GPT-NeoX / Nemotron / Nemotron-H / Gemma 2 / GLM-4.5 / MiniMax-M2 field names. ``seq_len`` defaults to
    ``min(max_position_embeddings, 8192)``.
    """
    p = _resolve_path(path)
    raw = _read_json(p)
    # Multimodal wrappers (Llava, Qwen-VL, Gemma 3, ...) nest the language model.
    data = raw
    if "num_hidden_layers" not in raw and "n_layer" not in raw and isinstance(
        raw.get("text_config"), dict
    ):
        data = {"model_type": raw.get("model_type"), **raw["text_config"]}
    cfg = _Config(p, data)
    model_type = str(data.get("model_type") or "").lower()
    pattern = _nemotron_h_pattern(cfg) if model_type == "nemotron_h" else None
    if pattern is None:
        _refuse_non_attention_mixers(cfg, model_type)

    fields: dict[str, Any] = {}
    fields["layers"] = cfg.int_("layers", "num_hidden_layers", "n_layer", "num_layers")
    hidden = fields["hidden"] = cfg.int_("hidden", "hidden_size", "n_embd", "d_model")
    fields["heads"] = cfg.int_("heads", "num_attention_heads", "n_head")
    fields["vocab"] = cfg.int_("vocab", "vocab_size", "padded_vocab_size")
    num_experts = cfg.int_(
        "num_experts", "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
        default=0,
    )
    if num_experts:
        fields.update(_moe_fields(cfg, num_experts))
    mtp = cfg.int_("mtp_layers", "num_nextn_predict_layers", "mtp_num_layers", default=0)
    if mtp:
        fields["mtp_layers"] = mtp

    # Dense FFN width (for MoE models: the leading dense layers; may be absent or 0).
    ffn = cfg.get("ffn_hidden", *(("intermediate_size_mlp",) if model_type == "llama4_text" else ()),
                  "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", default=None)
    if not ffn:
        if model_type == "gpt2" or "n_embd" in data:
            ffn = 4 * hidden  # GPT-2: n_inner null means 4 * n_embd
            cfg.source["ffn_hidden"] = "n_inner"
        elif num_experts:
            ffn = fields["moe_ffn_hidden"]
        else:
            raise InputError(f"{p}: missing required field 'intermediate_size'")
    fields["ffn_hidden"] = ffn
    fields.update(_attention_fields(cfg))
    fields["seq_len"] = _seq_len(cfg, seq_len)

    tied = cfg.get("tied_embeddings", "tie_word_embeddings",
                   default=model_type in _TIED_BY_DEFAULT)
    if not isinstance(tied, bool):
        raise InputError(f"{p}: field 'tie_word_embeddings': expected true or false, got {tied!r}")
    fields["tied_embeddings"] = tied
    act = str(data.get("hidden_act") or data.get("activation_function") or "").lower()
    fields["gated_mlp"] = not (model_type in _UNGATED_TYPES or act in _UNGATED_ACTS)
    if model_type == "gpt_oss":
        fields["gated_mlp"] = True  # clamped SwiGLU despite its own activation name
    fields["learned_position_embeddings"] = model_type in _LEARNED_POS_TYPES
    if precision is not None:
        fields["precision"] = precision
        cfg.source["precision"] = "precision"
    parent = p.resolve().parent.name
    fields["name"] = parent if p.name == "config.json" and parent else p.stem
    fields.update(_architecture(cfg, model_type, fields))
    if data is not raw and isinstance(raw.get("vision_config"), dict):
        fields["unexpressed"] += (_VISION_ENCODER,)
    if pattern is not None:
        fields.update(_nemotron_h_fields(cfg, pattern, fields))

    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as err:
        raise InputError(f"{p}: {validation_line(err, cfg.source)}") from None


# transformers' NemotronH (configuration_nemotron_h.py): the layer kinds of layers_block_type, as the characters of
# Megatron's hybrid_override_pattern (ModelSpec.hybrid_pattern).
_NEMOTRON_H_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h_pattern(cfg: _Config) -> str:
    """A NemotronH config's layers as a pattern: hybrid_override_pattern, or layers_block_type's kinds."""
    pattern = cfg.data.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        cfg.source["hybrid_pattern"] = "hybrid_override_pattern"
        return pattern.split("/")[0]
    blocks = cfg.data.get("layers_block_type")
    if isinstance(blocks, list) and blocks and all(b in _NEMOTRON_H_BLOCKS for b in blocks):
        cfg.source["hybrid_pattern"] = "layers_block_type"
        return "".join(_NEMOTRON_H_BLOCKS[b] for b in blocks)
    raise InputError(f"{cfg.path}: field 'hybrid_override_pattern': a nemotron_h config needs its layer pattern "
                     f"(hybrid_override_pattern, or layers_block_type of {', '.join(_NEMOTRON_H_BLOCKS)})")


def _nemotron_h_fields(cfg: _Config, pattern: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A NemotronH config's hybrid fields (transformers' modeling_nemotron_h.py): the Mamba-2 widths, RMSNorm, a
    non-gated MLP of mlp_hidden_act (relu2), no position embeddings, a sigmoid router with a score-correction bias,
    one shared expert of moe_shared_expert_intermediate_size (counted here in routed-expert widths), LatentMoE."""
    get = cfg.data.get
    out: dict[str, Any] = dict(hybrid_pattern=pattern, normalization="RMSNorm", gated_mlp=False,
                               activation=_ACTS.get(str(get("mlp_hidden_act", "relu2")).lower(), "squared_relu"))
    for field, key in (("mamba_heads", "mamba_num_heads"), ("mamba_head_dim", "mamba_head_dim"),
                       ("mamba_state_dim", "ssm_state_size"), ("mamba_groups", "n_groups"),
                       ("moe_latent", "moe_latent_size")):
        value = cfg.int_(field, key, default=None)
        if value is not None:
            out[field] = value
    if fields.get("num_experts"):
        out.update(moe_router_score="sigmoid", moe_router_expert_bias=True)
        width = cfg.int_("shared_experts", "moe_shared_expert_intermediate_size", default=0)
        if width:
            if width % fields["moe_ffn_hidden"]:
                raise InputError(f"{cfg.path}: field 'moe_shared_expert_intermediate_size': {width} is not a "
                                 f"multiple of moe_intermediate_size {fields['moe_ffn_hidden']}")
            out["shared_experts"] = width // fields["moe_ffn_hidden"]
    return out


def _moe_fields(cfg: _Config, num_experts: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a config with ``num_experts`` routed experts."""
    fields: dict[str, Any] = {"num_experts": num_experts}
    fields["moe_topk"] = cfg.int_(
        "moe_topk", "num_experts_per_tok", "experts_per_token", "moe_top_k"
    )
    moe_ffn = cfg.int_("moe_ffn_hidden", "moe_intermediate_size", "intermediate_size")
    fields["moe_ffn_hidden"] = moe_ffn
    shared = cfg.int_("shared_experts", "n_shared_experts", "num_shared_experts", default=0)
    if moe_ffn < 1:
        raise InputError(f"{cfg.path}: field '{cfg.source['moe_ffn_hidden']}': expected an expert width >= 1, "
                         f"got {moe_ffn}")
    if not shared and cfg.data.get("shared_expert_intermediate_size"):
        # Qwen2-MoE: one shared expert of a given width, counted in routed-expert widths.
        width = cfg.int_("shared_experts", "shared_expert_intermediate_size")
        if width % moe_ffn:
            raise InputError(
                f"{cfg.path}: field 'shared_expert_intermediate_size': {width} is not a multiple "
                f"of moe_intermediate_size {moe_ffn}"
            )
        shared = width // moe_ffn
    if cfg.data.get("model_type") == "llama4_text":
        shared = 1   # Llama4TextMoe: one shared expert of intermediate_size beside the routed ones
        cfg.source["shared_experts"] = "model_type"
    fields["shared_experts"] = shared
    fields.update(_moe_layer_fields(cfg))
    return fields


def _attention_fields(cfg: _Config) -> dict[str, Any]:
    """Key-value heads, and multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash style) or
    the head width: the fields the config states."""
    fields: dict[str, Any] = {}
    kv_heads = cfg.int_("kv_heads", "num_key_value_heads", "num_kv_heads", default=None)
    if kv_heads is not None:
        fields["kv_heads"] = kv_heads
    kv_lora = cfg.int_("mla_kv_lora_rank", "kv_lora_rank", default=None)
    if kv_lora is not None:
        fields["mla_kv_lora_rank"] = kv_lora
        q_lora = cfg.int_("mla_q_lora_rank", "q_lora_rank", default=None)
        if q_lora is not None:
            fields["mla_q_lora_rank"] = q_lora
        fields["mla_rope_dim"] = cfg.int_("mla_rope_dim", "qk_rope_head_dim", default=64)
        fields["head_dim"] = cfg.int_("head_dim", "qk_nope_head_dim", "head_dim")
        v_head = cfg.int_("mla_v_head_dim", "v_head_dim", default=None)
        if v_head is not None:
            fields["mla_v_head_dim"] = v_head
    else:
        head_dim = cfg.int_("head_dim", "head_dim", "kv_channels", default=None)
        if head_dim is not None:
            fields["head_dim"] = head_dim
    return fields


def _seq_len(cfg: _Config, seq_len: int | None) -> int:
    """``seq_len`` when given, else min(max_position_embeddings, 8192)."""
    if seq_len is not None:
        cfg.source["seq_len"] = "seq_len"
        return seq_len
    max_pos = cfg.int_(
        "seq_len", "max_position_embeddings", "n_positions", "n_ctx", "seq_length",
        "max_sequence_length", default=None,
    )
    if max_pos is None:
        raise InputError(
            f"{cfg.path}: missing required field 'max_position_embeddings' (or pass seq_len)"
        )
    return min(max_pos, 8192)


# Keys by which a config says that some of its layers mix tokens without attention (Mamba-2 / state-space layers of
# Nemotron-H and Jamba, linear-attention or gated-DeltaNet layers of Qwen3-Next and MiniMax-01), and model types
# built so. The cost model prices attention layers only; such a model would be priced as all-attention.
_NON_ATTENTION_KEYS = ("hybrid_override_pattern", "layers_block_type", "ssm_state_size", "mamba_num_heads",
                       "mamba_d_state", "attn_type_list", "linear_num_key_heads", "full_attention_interval")
_NON_ATTENTION_TYPES = ("mamba", "mamba2", "nemotron_h", "jamba", "zamba", "zamba2", "falcon_h1", "qwen3_next",
                        "minimax_text_01", "rwkv", "recurrent_gemma", "bamba", "granitemoehybrid")


def _refuse_non_attention_mixers(cfg: _Config, model_type: str) -> None:
    """A one-line error for a config whose layers are not all attention layers (state-space, linear attention)."""
    key = next((k for k in _NON_ATTENTION_KEYS if cfg.data.get(k) not in (None, "", [], 0)), None)
    kinds = cfg.data.get("attn_type_list")
    if key == "attn_type_list" and isinstance(kinds, list) and kinds and all(k == 1 for k in kinds):
        key = None   # MiniMax's layer kinds: 1 is softmax attention, 0 lightning (linear); all 1 (MiniMax-M2) attend
    if key is None and model_type not in _NON_ATTENTION_TYPES:
        return
    what = f"field {key!r}" if key else f"model_type {model_type!r}"
    raise InputError(f"{cfg.path}: {what}: a model with state-space or linear-attention layers (Mamba hybrids such as "
                     f"Nemotron-H, Qwen3-Next) is not modelled: the cost model prices attention and MLP/MoE layers "
                     f"only, and would price every layer as attention; valid: a transformer whose every layer attends")


def _moe_layer_fields(cfg: _Config) -> dict[str, int]:
    """Where an MoE config puts its experts, as ``dense_layers`` and ``moe_layer_step``: leading dense layers
    (first_k_dense_replace, mlp_only_layers), MoE on every k-th layer counted from 1 (decoder_sparse_step,
    interleave_moe_layer_step, moe_layers: Llama 4 Maverick) or on the layers i % moe_layer_freq == 0 (DeepSeek's
    modeling code). A placement no such pair gives is refused."""
    data = cfg.data
    layers = cfg.int_("layers", "num_hidden_layers", "n_layer", "num_layers")
    dense = cfg.int_("dense_layers", "first_k_dense_replace", default=0)
    if dense > layers:
        raise InputError(f"{cfg.path}: field '{cfg.source['dense_layers']}': {dense} dense layers exceeds "
                         f"num_hidden_layers={layers}")
    mask = [i >= dense for i in range(layers)]
    keys = [cfg.source["dense_layers"]] if dense else []
    for key, moe in (("moe_layer_freq", lambda i, k: i % k == 0),
                     ("decoder_sparse_step", lambda i, k: (i + 1) % k == 0),
                     ("interleave_moe_layer_step", lambda i, k: (i + 1) % k == 0)):
        if data.get(key) is not None:
            step = cfg.int_(key, key)
            if step < 1:
                raise InputError(f"{cfg.path}: field '{key}': expected an integer >= 1, got {step}")
            mask = [x and moe(i, step) for i, x in enumerate(mask)]
            keys += [key] if step > 1 else []
    for key, keep in (("mlp_only_layers", False), ("moe_layers", True)):
        listed = data.get(key)
        if listed is None or (key == "mlp_only_layers" and not listed):
            continue
        if not (isinstance(listed, list) and all(type(x) is int and 0 <= x < layers for x in listed)):
            raise InputError(f"{cfg.path}: field '{key}': expected a list of layer indices 0..{layers - 1}, got "
                             f"{listed!r}")
        mask = [x and ((i in listed) == keep) for i, x in enumerate(mask)]
        keys.append(key)
    fields = moe_layout(mask)
    if fields is None:
        named = " and ".join(f"'{k}'" for k in keys) or "'num_hidden_layers'"
        moe = [i for i, x in enumerate(mask) if x]
        where = (f"MoE on layers {', '.join(map(str, moe[:6]))}{', ...' if len(moe) > 6 else ''}" if moe
                 else "no MoE layer")
        raise InputError(f"{cfg.path}: field {named}: {where}; valid: leading dense layers, then MoE on every layer or "
                         f"on every k-th counted from 1 (layers k-1, 2k-1, ...)")
    return fields


# Architectural facts of a Hugging Face config --------------------------------------------------
# transformers' own defaults where a config leaves a key out (the configuration_<model_type>.py classes of
# transformers 4.5x): rms_norm_eps / layer_norm_eps, rope_theta, norm_topk_prob.
_KNOWN_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                "deepseek_v3", "gpt_oss", "gpt2", "gpt_neox", "nemotron", "nemotron_h", "gemma2", "glm4_moe",
                "minimax_m2", "llama4_text")
_EPS_DEFAULT = {"llama": 1e-6, "mistral": 1e-6, "mixtral": 1e-5, "qwen2": 1e-6, "qwen2_moe": 1e-6, "qwen3": 1e-6,
                "qwen3_moe": 1e-6, "deepseek_v2": 1e-6, "deepseek_v3": 1e-6, "gpt_oss": 1e-5, "gpt2": 1e-5,
                "gpt_neox": 1e-5, "nemotron": 1e-5, "llama4_text": 1e-5}
_THETA_DEFAULT = {"llama": 10000.0, "mistral": 10000.0, "mixtral": 1e6, "qwen2": 10000.0, "qwen2_moe": 10000.0,
                  "qwen3": 10000.0, "qwen3_moe": 10000.0, "deepseek_v2": 10000.0, "deepseek_v3": 10000.0,
                  "gpt_oss": 150000.0, "gpt_neox": 10000.0, "nemotron": 10000.0, "llama4_text": 500000.0}
_NORM_TOPK_DEFAULT = {"mixtral": True, "gpt_oss": True, "minimax_m2": True, "qwen2_moe": False, "qwen3_moe": False,
                      "deepseek_v2": False, "llama4_text": False,
                      "deepseek_v3": True}
# Keys from_hf_config maps onto a field (above or in _architecture) ...
_MAPPED_KEYS = {
    # nemotron_h (_nemotron_h_fields; conv_kernel and chunk_size are the cost model's MAMBA_CONV_KERNEL / MAMBA_CHUNK)
    "hybrid_override_pattern", "layers_block_type", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
    "n_groups", "moe_latent_size", "moe_shared_expert_intermediate_size", "mlp_hidden_act", "conv_kernel",
    "chunk_size", "mamba_hidden_act", "use_bias", "use_conv_bias", "mamba_proj_bias",
    "model_type", "num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "d_model",
    "num_attention_heads", "n_head", "vocab_size", "padded_vocab_size", "num_local_experts", "num_experts",
    "n_routed_experts", "moe_num_experts", "num_experts_per_tok", "experts_per_token", "moe_top_k",
    "moe_intermediate_size", "intermediate_size", "n_shared_experts", "num_shared_experts",
    "shared_expert_intermediate_size", "num_nextn_predict_layers", "mtp_num_layers", "n_inner", "ffn_hidden_size",
    "ffn_dim", "num_key_value_heads", "num_kv_heads", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "head_dim", "kv_channels", "max_position_embeddings", "n_positions",
    "n_ctx", "seq_length", "max_sequence_length", "tie_word_embeddings", "hidden_act", "activation_function",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step",
    "mlp_only_layers", "moe_layers", "rope_theta", "rotary_emb_base", "rope_scaling", "partial_rotary_factor",
    "rotary_pct",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "attention_bias", "mlp_bias",
    "attention_dropout", "attn_pdrop", "hidden_dropout", "resid_pdrop", "embd_pdrop", "scoring_func",
    "topk_method", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "swiglu_limit",
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "use_parallel_residual",
    "router_jitter_noise", "scale_attn_by_inverse_layer_idx", "text_config",
    # MiniMax's (attn_type_list all full attention, else refused; rotary_dim: rotary_percent; use_routing_bias: the
    # expert bias)
    "attn_type_list", "rotary_dim", "use_routing_bias",
}
# Keys one model type maps (and any other type's config is told it has no mapping for): gemma2's (_gemma2_facts),
# the QK-norm switch of glm4_moe and minimax_m2, MiniMax-M2's QK-norm kind and MTP modules (said in unexpressed) and
# its unused dense width; a shared expert it does not have (shared_intermediate_size 0).
_TYPE_KEYS = {
    "gemma2": {"hidden_activation", "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"},
    "glm4_moe": {"use_qk_norm"},
    "minimax_m2": {"use_qk_norm", "qk_norm_type", "use_mtp", "num_mtp_modules", "mtp_transformer_layers",
                   "mlp_intermediate_size", "shared_intermediate_size"},
    # _llama4_facts; intermediate_size_mlp is the dense layers' width (from_hf_config); for_llm_compressor marks a
    # checkpoint layout for the llm-compressor tool, not the network.
    "llama4_text": {"intermediate_size_mlp", "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval",
                    "use_qk_norm", "attn_temperature_tuning", "floor_scale", "attn_scale", "for_llm_compressor"},
}
# ... and keys that do not change the model a training run builds: token ids, dtype and serving settings,
# initialisation, HF's tensor-parallel hint, and the load-balancing loss weights (a training objective passed
# like the learning rate: Megatron's --moe-aux-loss-coeff, outside the plan).
_NOT_ARCHITECTURE = {
    "architectures", "auto_map", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "initializer_factor", "pretraining_tp",
    "quantization_config", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux",
    "ep_size", "initial_context_length", "scale_attn_weights", "reorder_and_upcast_attn", "summary_type",
    "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "task_specific_params", "classifier_dropout", "use_return_dict", "return_dict", "cache_implementation",
}
_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_fast": "gelu_tanh", "relu2": "squared_relu", "squared_relu": "squared_relu", "relu": "relu"}


def _number(cfg: _Config, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{cfg.path}: field '{key}': expected a number, got {value!r}")
    return float(value)


def _rope_scaling(cfg: _Config, raw: Any, lost: list[str]) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(f"{cfg.path}: field 'rope_scaling': expected an object or null, got {raw!r}")
    kind = str(raw.get("rope_type") or raw.get("type") or "")
    if kind == "default":
        return None
    if kind not in ("yarn", "llama3", "linear"):
        lost.append(f"rope_scaling of type {kind!r} (the planner knows yarn, llama3 and linear)")
        return None
    out: dict[str, Any] = {"type": kind, "factor": _number(cfg, "rope_scaling.factor", raw.get("factor"))}
    names = {"yarn": ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
             "llama3": ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), "linear": ()}[kind]
    for name in names:
        if raw.get(name) is not None:
            value = _number(cfg, f"rope_scaling.{name}", raw[name])
            out[name] = int(value) if name == "original_max_position_embeddings" else value
    extra = set(raw) - set(names) - {"rope_type", "type", "factor"}
    if kind == "yarn" and raw.get("truncate") is False:
        lost.append("YaRN without truncation of the correction range (rope_scaling.truncate false)")
        extra.discard("truncate")
    if extra:
        lost.append(f"rope_scaling keys {sorted(extra)} (no mapping)")
    return out


def _architecture(cfg: _Config, model_type: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields beyond the shape: normalisation, activation, biases, rotary embeddings, router; and, as
    ``unexpressed``, every fact of the config that none of them holds (an unknown model_type, an unmapped key,
    a value no field can state)."""
    data = cfg.data
    lost: list[str] = []
    out: dict[str, Any] = {}
    if model_type not in _KNOWN_TYPES:
        lost.append(f"model_type {model_type or '(none)'!r}: an architecture the planner does not know (known: "
                    f"{', '.join(_KNOWN_TYPES)})")
    for key in sorted(set(data) - _MAPPED_KEYS - _NOT_ARCHITECTURE - _TYPE_KEYS.get(model_type, set())):
        lost.append(f"config key {key!r}={data[key]!r} (no mapping)")
    if model_type == "minimax_m2" and data.get("shared_intermediate_size"):
        lost.append(f"a shared expert of {data['shared_intermediate_size']} (shared_intermediate_size)")
    _norm_fields(cfg, model_type, fields, out, lost)
    _activation_fields(cfg, model_type, fields, out, lost)
    _bias_dropout_fields(cfg, model_type, out, lost)
    _position_fields(cfg, model_type, fields, out, lost)
    if fields.get("num_experts"):
        _router_fields(cfg, model_type, fields, out, lost)
    if model_type == "gpt_oss":
        lost.append("attention sinks (a learned per-head logit in every attention softmax)")
    if model_type == "gemma2":
        lost.extend(_gemma2_facts(cfg))
    if model_type == "llama4_text":
        lost.extend(_llama4_facts(cfg, fields))
    if model_type == "minimax_m2" and data.get("use_mtp") and data.get("num_mtp_modules"):
        lost.append(f"{_WORDS.get(data['num_mtp_modules'], data['num_mtp_modules'])} multi-token-prediction modules in "
                    f"the released checkpoint (num_mtp_modules)")
    out["unexpressed"] = tuple(lost)
    return out


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def _llama4_facts(cfg: _Config, fields: dict[str, Any]) -> list[str]:
    """What a llama4_text config states and no field holds, in the words of the catalog's Llama 4 entries
    (transformers' modeling_llama4.py): layers without rotary embeddings (no_rope_layers, 0 = NoPE; by default every
    no_rope_layer_interval-th) and chunked attention on the others, the router's scores scaling the expert input,
    the weightless L2 QK norm (use_qk_norm) and the query temperature of the NoPE layers (attn_temperature_tuning:
    1 below floor_scale tokens)."""
    get, layers = cfg.data.get, fields["layers"]
    every = cfg.int_("no_rope_layer_interval", "no_rope_layer_interval", default=4)
    if every < 1:
        raise InputError(f"{cfg.path}: field 'no_rope_layer_interval': expected an integer >= 1, got {every}")
    periodic = [int((i + 1) % every != 0) for i in range(layers)]
    rope = get("no_rope_layers") or periodic
    if not (isinstance(rope, list) and len(rope) == layers and all(type(x) is int and x in (0, 1) for x in rope)):
        raise InputError(f"{cfg.path}: field 'no_rope_layers': expected a list of 0 / 1, one a layer ({layers}), got "
                         f"{rope!r}")
    where = (f"every {every}{'nd' if every == 2 else 'rd' if every == 3 else 'th'} layer" if rope == periodic else
             "layers " + ", ".join(str(i) for i, x in enumerate(rope) if not x))
    chunk = cfg.int_("attention_chunk_size", "attention_chunk_size", default=None)
    facts = [f"no rotary embedding on {where} (NoPE)" + (f" and chunked attention of {chunk} tokens on the others"
                                                          if chunk else "")] if not all(rope) else []
    if fields.get("num_experts"):
        facts.append("router scores applied to the expert input (moe_apply_probs_on_input)")
    if get("use_qk_norm"):
        facts.append("a weightless L2 QK norm on the rotary layers")
    floor = _number(cfg, "floor_scale", get("floor_scale", 8192))
    if get("attn_temperature_tuning", True) and not all(rope) and fields["seq_len"] > floor:
        facts.append(f"query temperature tuning on the NoPE layers beyond {floor:g} tokens (attn_temperature_tuning)")
    return facts


def _gemma2_facts(cfg: _Config) -> list[str]:
    """What a gemma2 config states and no field holds beyond its window (_position_fields), in the words of the
    catalog's Gemma 2 entries (modeling_gemma2.py: both soft-caps, four (1 + w)-scaled RMSNorms a layer, the scaled
    embedding and query_pre_attn_scalar)."""
    get = cfg.data.get
    attn_cap, final_cap = get("attn_logit_softcapping"), get("final_logit_softcapping")
    facts = []
    if attn_cap or final_cap:
        facts.append(f"attention logits soft-capped at {attn_cap:g} and final logits at {final_cap:g}"
                     if attn_cap and final_cap else f"logits soft-capped at {attn_cap or final_cap:g}")
    return facts + list(_GEMMA_2_IMPLIED)


# Each of these adds its fields to ``out`` and what the config states but no field holds to ``lost``.
def _default(model_type: str, key: str, table: dict[str, Any], what: str, lost: list[str]) -> Any:
    """transformers' default of ``key`` for the model type, or None (and said in ``lost``) where unknown."""
    if model_type in table:
        return table[model_type]
    lost.append(f"{what}: no {key!r} and transformers' default for model_type {model_type!r} is not known here")
    return None


def _norm_fields(cfg: _Config, model_type: str, fields: dict[str, Any], out: dict[str, Any],
                 lost: list[str]) -> None:
    """Normalisation: its kind, epsilon, and the QK norm."""
    get = cfg.data.get
    eps_key = next((k for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
                    if get(k) is not None), None)
    eps = (_number(cfg, eps_key, get(eps_key)) if eps_key
           else _default(model_type, "rms_norm_eps", _EPS_DEFAULT, "norm epsilon", lost))
    if eps is not None:
        out["norm_epsilon"] = eps
    rms = eps_key == "rms_norm_eps" or (eps_key is None and model_type not in ("gpt2", "gpt_neox", "nemotron"))
    out["normalization"] = "LayerNorm1p" if model_type == "nemotron" else ("RMSNorm" if rms else "LayerNorm")
    out["qk_norm"] = (model_type in ("qwen3", "qwen3_moe") or fields.get("mla_kv_lora_rank") is not None
                      or (model_type in ("glm4_moe", "minimax_m2") and bool(get("use_qk_norm", False))))
    if out["qk_norm"] and get("qk_norm_type") == "per_layer":
        lost.append("QK norm over all heads' width (qk_norm_type per_layer), not per head")


def _activation_fields(cfg: _Config, model_type: str, fields: dict[str, Any], out: dict[str, Any],
                       lost: list[str]) -> None:
    """The MLP activation (gated when the MLP has a gate projection, as fields['gated_mlp'] was decided)."""
    get = cfg.data.get
    act_name = str((get("hidden_activation") if model_type == "gemma2" else None) or get("hidden_act")
                   or get("activation_function") or ("gelu_new" if model_type == "gpt2" else "silu"))
    act = _ACTS.get(act_name.lower())
    gated = fields.get("gated_mlp", True)
    if model_type == "gpt_oss":
        act = "quick_geglu"  # modeling_gpt_oss.py: (up + 1) * gate * sigmoid(1.702 gate), both clamped
        out["activation_clamp"] = _number(cfg, "swiglu_limit", get("swiglu_limit", 7.0))
        out["glu_linear_offset"] = 1.0
    elif act is None:
        lost.append(f"activation {act_name!r} (hidden_act)")
        act = "swiglu" if gated else "gelu"
    elif gated and act != "swiglu":
        act = {"gelu": "geglu", "gelu_tanh": "geglu"}.get(act)
        if act is None:
            lost.append(f"gated MLP with activation {act_name!r}")
            act = "swiglu"
    elif not gated and act == "swiglu":
        act = "silu"
    out["activation"] = act
    out["gated_mlp"] = act in ("swiglu", "geglu", "quick_geglu")


def _bias_dropout_fields(cfg: _Config, model_type: str, out: dict[str, Any], lost: list[str]) -> None:
    """Biases of the linear layers, and the dropouts."""
    get = cfg.data.get
    attn_bias, mlp_bias = bool(get("attention_bias", False)), bool(get("mlp_bias", False))
    if model_type in ("gpt2", "gpt_neox"):
        out["linear_bias"] = True
    elif model_type == "gpt_oss":
        out["linear_bias"] = attn_bias  # attention and expert biases alike
    elif model_type in ("qwen2", "qwen2_moe"):
        out["linear_bias"], out["qkv_bias"] = False, True  # modeling_qwen2.py: q/k/v projections with bias=True
    elif model_type == "glm4_moe":
        # modeling_glm4_moe.py: q/k/v projections with bias=attention_bias, o_proj and the MLPs without
        out["linear_bias"], out["qkv_bias"] = False, attn_bias
    else:
        out["linear_bias"] = attn_bias and mlp_bias
        if attn_bias != mlp_bias:
            lost.append(f"biases on the {'attention' if attn_bias else 'MLP'} projections only "
                        f"(attention_bias={attn_bias}, mlp_bias={mlp_bias})")
    drop = 0.1 if model_type == "gpt2" else 0.0
    out["attention_dropout"] = _number(cfg, "attention_dropout", get("attention_dropout", get("attn_pdrop", drop)))
    out["hidden_dropout"] = _number(cfg, "hidden_dropout", get("hidden_dropout", get("resid_pdrop", drop)))
    if get("embd_pdrop") is not None and get("embd_pdrop") != out["hidden_dropout"]:
        lost.append(f"embedding dropout {get('embd_pdrop')} differing from the hidden dropout")


def _position_fields(cfg: _Config, model_type: str, fields: dict[str, Any], out: dict[str, Any],
                     lost: list[str]) -> None:
    """Rotary embeddings; and the attention and residual variants no field states."""
    get = cfg.data.get
    # NemotronH has no position embeddings (its Mamba layers order the tokens): no rotary fields to read.
    if not fields.get("learned_position_embeddings") and model_type != "nemotron_h":
        theta = get("rope_theta", get("rotary_emb_base"))
        theta = (_number(cfg, "rope_theta", theta) if theta is not None
                 else _default(model_type, "rope_theta", _THETA_DEFAULT, "rotary base", lost))
        if theta is not None:
            out["rotary_base"] = theta
        pct = get("partial_rotary_factor", get("rotary_pct", 0.25 if model_type == "gpt_neox" else None))
        if pct is None and isinstance(get("rotary_dim"), int) and fields.get("head_dim"):
            pct = get("rotary_dim") / fields["head_dim"]   # MiniMax: the rotated dimensions of a head
        if pct is not None:
            out["rotary_percent"] = _number(cfg, "partial_rotary_factor", pct)
        scaling = _rope_scaling(cfg, get("rope_scaling"), lost)
        if scaling is not None:
            out["rope_scaling"] = scaling
    window = get("sliding_window")
    if window is not None and get("use_sliding_window", True) is not False and window < fields["seq_len"]:
        layers = get("layer_types")
        where = f" on {sum(t == 'sliding_attention' for t in layers)} of {len(layers)} layers" \
            if isinstance(layers, list) else (" on every other layer" if model_type == "gemma2" else "")
        lost.append(f"sliding-window attention of {window} tokens{where}")
    if model_type == "gpt_neox" and get("use_parallel_residual", True):
        lost.append("parallel attention and MLP residual (use_parallel_residual)")
    if get("scale_attn_by_inverse_layer_idx"):
        lost.append("attention scores scaled by 1 / layer index (scale_attn_by_inverse_layer_idx)")
    if get("router_jitter_noise"):
        lost.append(f"router input jitter {get('router_jitter_noise')} (router_jitter_noise)")


def _router_fields(cfg: _Config, model_type: str, fields: dict[str, Any], out: dict[str, Any],
                   lost: list[str]) -> None:
    """The MoE router: score function, top-k renormalisation and method, groups, scaling."""
    get = cfg.data.get
    # Glm4MoeTopkRouter: a sigmoid score with e_score_correction_bias, whatever the config says (it has no key)
    # Llama4Router: a sigmoid of the top-k logits, not renormalised
    score = str(get("scoring_func", "sigmoid" if model_type in ("glm4_moe", "llama4_text") else "softmax"))
    if score not in ("softmax", "sigmoid"):
        lost.append(f"router score function {score!r} (scoring_func)")
        score = "softmax"
    out["moe_router_score"] = score
    norm = get("norm_topk_prob")
    norm = bool(norm) if norm is not None else _default(model_type, "norm_topk_prob", _NORM_TOPK_DEFAULT,
                                                        "top-k weight renormalisation", lost)
    out["moe_router_norm_topk"] = True if norm is None else norm
    method = str(get("topk_method", "greedy"))
    if method not in ("greedy", "noaux_tc", "group_limited_greedy"):
        lost.append(f"router top-k method {method!r} (topk_method)")
    if method == "noaux_tc" or model_type == "glm4_moe" or get("use_routing_bias"):
        out["moe_router_expert_bias"] = True  # e_score_correction_bias, updated outside the loss
    groups, group_topk = get("n_group"), get("topk_group")
    if method in ("noaux_tc", "group_limited_greedy") and isinstance(groups, int) and groups > 1:
        out["moe_router_groups"], out["moe_router_group_topk"] = groups, group_topk
        # Megatron scores a group by the sum of its top (topk / group_topk) experts; DeepSeek-V3 (noaux_tc)
        # by its top 2, DeepSeek-V2 (group_limited_greedy) by its best one.
        per = 2 if method == "noaux_tc" else 1
        if isinstance(group_topk, int) and group_topk and fields["moe_topk"] // group_topk != per:
            lost.append(f"group score of the top {per} expert(s) per group ({method}); Megatron sums the top "
                        f"moe_topk / topk_group = {fields['moe_topk'] // group_topk}")
    factor = get("routed_scaling_factor")
    if factor is not None and not (model_type == "deepseek_v2" and norm):
        out["moe_router_topk_scaling"] = _number(cfg, "routed_scaling_factor", factor)
    if model_type == "qwen2_moe" and fields.get("shared_experts"):
        lost.append("sigmoid gate on the shared expert (shared_expert_gate)")
    if model_type == "gpt_oss":
        lost.append("router bias (the router's linear layer has a bias)")
