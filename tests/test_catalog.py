"""The model catalog and the Hugging Face config.json import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.catalog import catalog, catalog_names, from_hf_config, get_model
from costmodel.profiles import InputError
from costmodel.specs import ModelSpec, moe_layout

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"


# Parameter counting (test-local, independent of the cost model) ---------------------------
def _attention_params(m: ModelSpec) -> int:
    h, a, d = m.hidden, m.heads, m.head_width
    if m.mla_kv_lora_rank is not None:
        # DeepSeek-V2/V3 MLA: q down/up (or a full q projection), joint kv down + rope key,
        # kv up to per-head nope-keys and values, output projection, and the two latent norms.
        r = m.mla_rope_dim
        v = m.mla_v_head_dim or d
        kv = m.mla_kv_lora_rank
        if m.mla_q_lora_rank is not None:
            q = h * m.mla_q_lora_rank + m.mla_q_lora_rank * a * (d + r) + m.mla_q_lora_rank
        else:
            q = h * a * (d + r)
        kv_proj = h * (kv + r) + kv * a * (d + v) + kv
        return q + kv_proj + a * v * h
    kv_heads = m.kv_head_count
    return h * a * d + 2 * h * kv_heads * d + a * d * h  # q, k, v (GQA), o


def _mlp_params(h: int, ffn: int, gated: bool) -> int:
    return (3 if gated else 2) * h * ffn


def param_count(m: ModelSpec, *, active: bool = False, count_input_embedding: bool = True) -> int:
    """Weights of a decoder-only model (biases ignored): embeddings + layers + final norm.

    ``active`` counts only the experts one token goes through (top-k routed + shared).
    """
    h = m.hidden
    if m.hybrid_pattern:
        return _hybrid_param_count(m, active) + (m.vocab * h if count_input_embedding else 0) + \
            (0 if m.tied_embeddings else m.vocab * h) + h
    per_layer_common = _attention_params(m) + 2 * h  # two pre-norms per layer
    dense = _mlp_params(h, m.ffn_hidden, m.gated_mlp)
    total = m.layers * per_layer_common
    if m.is_moe:
        experts = (m.moe_topk if active else m.num_experts) + m.shared_experts
        moe = experts * _mlp_params(h, m.expert_ffn, m.gated_mlp) + h * m.num_experts  # + router
        total += (m.layers - m.moe_layers) * dense + m.moe_layers * moe
    else:
        total += m.layers * dense
    emb = m.vocab * h
    total += (emb if count_input_embedding else 0) + (0 if m.tied_embeddings else emb)
    if m.learned_position_embeddings:
        total += m.seq_len * h
    return total + h  # final norm


def _hybrid_param_count(m: ModelSpec, active: bool) -> int:
    """The layers of a hybrid Mamba model, each one block with its own pre-norm: a Mamba-2 mixer (megatron-core
    MambaMixer: in_proj to z, x, B, C and dt, a depthwise conv1d of width 4 with bias over x, B, C, A_log, D and
    dt_bias per head, a gated RMSNorm, out_proj), attention, an MLP, or a MoE whose routed experts work in the
    LatentMoE width with the two projections to and from it."""
    h, n = m.hidden, {k: m.hybrid_pattern.count(k) for k in "M*-E"}
    d_in, gn = (m.mamba_heads or 0) * m.mamba_head_dim, m.mamba_groups * m.mamba_state_dim
    mamba = h * (2 * d_in + 2 * gn + (m.mamba_heads or 0)) + (d_in + 2 * gn) * 5 + 3 * (m.mamba_heads or 0) \
        + d_in + d_in * h
    attn = _attention_params(m)
    mlp = _mlp_params(h, m.ffn_hidden, m.gated_mlp)
    width = m.moe_latent or h
    routed = (m.moe_topk if active else m.num_experts) * _mlp_params(width, m.expert_ffn, m.gated_mlp)
    moe = routed + m.shared_experts * _mlp_params(h, m.expert_ffn, m.gated_mlp) + h * m.num_experts \
        + (2 * h * m.moe_latent if m.moe_latent else 0)
    return n["M"] * mamba + n["*"] * attn + n["-"] * mlp + n["E"] * moe + m.layers * h


# Published sizes. Sources:
#   Llama 2 7B / 13B: 6.7B / 13.0B, Touvron et al. 2023 "LLaMA", Table 2 (same shapes as Llama 2).
#   Llama 3 8B / 70B / 405B: HF model cards (8.03B, 70.6B) and Dubey et al. 2024, Table 3 (405B).
#   GPT-3: 175B, Brown et al. 2020, Table 2.1.
#   Mixtral 8x7B: 46.7B total / 12.9B active, Mistral AI release post and Jiang et al. 2024.
#   DeepSeek-V3: 671B total / 37B active, DeepSeek-V3 Technical Report (MTP module excluded).
#   Qwen3-30B-A3B: 30.5B / 3.3B; Qwen3-235B-A22B: 235B / 22B; Qwen3 Technical Report, Table 2.
#   gpt-oss-120b: 116.83B total / 5.13B active, OpenAI gpt-oss model card, Table 1.
#   Nemotron-4 340B: 9.4B embedding + 331.6B non-embedding, Nemotron-4 340B Technical Report.
#   Llama 2 70B: "70B" (HF model card 69B), Touvron et al. 2023 "Llama 2".
# Not published models: small shapes the executor trains on CPU (their parameter counts are checked against
# megatron-core's own model in tests/test_executor.py).
CPU_MODELS = ("tiny-gpt", "tiny-moe", "small-gpt")

PUBLISHED_TOTAL = {
    "7b": 6.74e9,
    "8b": 8.03e9,
    "llama3.1-8b": 8.03e9,   # the Llama 3 8B shape (rope scaling only differs)
    "13b": 13.0e9,
    "70b": 70.6e9,
    "llama3.1-70b": 70.6e9,
    "405b": 405e9,
    "gpt3-175b": 175e9,
    "mixtral-8x7b": 46.7e9,
    "deepseek-v3": 671e9,
    "kimi-k2": 1.04e12,
    "qwen3-30b-a3b": 30.5e9,
    "qwen3-235b-a22b": 235e9,
    "gpt-oss-120b": 116.83e9,
    "nemotron4-340b": 341e9,  # "340B": 9.4B embedding + 331.6B non-embedding
    "llama2-70b": 70e9,
    "mixtral-8x22b": 141e9,   # Mistral AI's Mixtral 8x22B announcement: 141B total, 39B active
    "qwen3-8b": 8.2e9,        # Qwen3 model cards: 8.2B, 14.8B, 32.8B
    "qwen3-14b": 14.8e9,
    "qwen3-32b": 32.8e9,
    "grok-1": 314e9,          # xAI, "Open Release of Grok-1"
    "llama3.2-1b": 1.23e9,    # Llama 3.2 model card
    "llama3.2-3b": 3.21e9,
    "deepseek-v2": 236e9,     # DeepSeek-V2 paper: 236B total, 21B active; V2-Lite 15.7B
    "deepseek-v2-lite": 15.7e9,
    # Hybrid Mamba models: Nemotron-H 8B / 56B (arXiv:2504.03624), Nemotron 3 Nano (NVIDIA's technical report:
    # 31.6B total, 3.2B active) and Super (120B total, the model's name NVIDIA-Nemotron-3-Super-120B-A12B).
    "nemotron-h-8b": 8e9,
    "nemotron-h-47b": 47e9,
    "nemotron-h-56b": 56e9,
    "nemotron-nano-9b-v2": 8.89e9,    # the model cards: 8.89B, 12.31B
    "nemotron-nano-12b-v2": 12.31e9,
    "nemotron-3-nano": 31.6e9,
    "nemotron-3-super": 120e9,
    # Models of published runs (catalog.py cites each): LLaMA Table 2; Mistral AI's "Mistral 7B" announcement
    # (7.3B); the Qwen2.5 model cards (32.5B, 72.7B); Qwen2-57B-A14B and DBRX by name and card (57B, 132B); the
    # gpt-oss README (21B); Nemotron-4 15B's 3.2B embedding + 12.5B non-embedding; Falcon's nominal sizes; the BLOOM
    # and GPT-NeoX-20B model cards to the parameter; OPT-175B and MT-NLG 530B as named.
    "llama-33b": 32.5e9,
    "llama-65b": 65.2e9,
    "mistral-7b": 7.3e9,
    "qwen2.5-32b": 32.5e9,
    "qwen2.5-72b": 72.7e9,
    "qwen2-57b-a14b": 57e9,
    "gpt-oss-20b": 21e9,
    "dbrx": 132e9,
    "nemotron-4-15b": 15.7e9,
    "falcon-7b": 7e9,
    "falcon-180b": 180e9,
    "bloom-176b": 176.247e9,
    "opt-175b": 175e9,
    "gpt-neox-20b": 20.5546e9,
    "mt-nlg-530b": 530e9,
    # Yi-34B, Code Llama 34B and Phi-3-medium as named (34B, 34B, 14B); Gemma 2 to the parameter (its paper's
    # Table 2); GLM-4.5 / -Air, Qwen3-Coder, MiniMax-M2 by their READMEs (355B, 106B, 480B, 230B); Llama 4 Scout's
    # 109B counts its vision encoder, which the text model leaves out; Llama 4 Maverick's 400B its model card's.
    "yi-34b": 34e9,
    "codellama-34b": 34e9,
    "gemma-2-9b": 9.242164736e9,
    "gemma-2-27b": 27.227718144e9,
    "phi-3-medium": 14e9,
    "glm-4.5": 355e9,
    "glm-4.5-air": 106e9,
    "qwen3-coder-480b-a35b": 480e9,
    "minimax-m2": 230e9,
    "llama4-scout": 109e9,
    "llama4-maverick": 400e9,
    # Megatron-LM's GPT-2 scaling models as its paper names them (Shoeybi et al. 2019, Table 1); OLMoE's README.
    "megatron-gpt2-1.2b": 1.2e9,
    "megatron-gpt2-2.5b": 2.5e9,
    "megatron-gpt2-4.2b": 4.2e9,
    "megatron-gpt2-8.3b": 8.3e9,
    "olmoe-1b-7b": 6.9e9,
}

PUBLISHED_ACTIVE = {
    "mixtral-8x7b": 12.9e9,
    "deepseek-v3": 37e9,
    "kimi-k2": 32e9,
    "qwen3-30b-a3b": 3.3e9,
    "qwen3-235b-a22b": 22e9,
    "gpt-oss-120b": 5.13e9,  # the model card leaves the embedding lookup out of "active"
    "mixtral-8x22b": 39e9,
    "deepseek-v2": 21e9,
    "nemotron-3-nano": 3.2e9,   # the report's 3.2B: the input embedding counted, not the output layer
    "qwen2-57b-a14b": 14e9,
    "gpt-oss-20b": 3.6e9,       # as the 120b's: the embedding lookup left out
    "dbrx": 36e9,
    "qwen3-coder-480b-a35b": 35e9,
    "llama4-scout": 17e9,
    "llama4-maverick": 17e9,
    "olmoe-1b-7b": 1.3e9,
}


def test_every_catalog_entry_builds_and_is_covered():
    cat = catalog()
    assert list(cat) == catalog_names()
    assert set(cat) == set(PUBLISHED_TOTAL) | set(CPU_MODELS)
    for name, spec in cat.items():
        assert isinstance(spec, ModelSpec)
        assert spec.name == name
        assert get_model(name) == spec


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_parameter_count_matches_published_size(name):
    got = param_count(get_model(name))
    want = PUBLISHED_TOTAL[name]
    assert abs(got - want) / want < 0.03, f"{name}: {got / 1e9:.2f}B vs published {want / 1e9}B"


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_active_parameter_count_matches_published_size(name):
    model = get_model(name)
    got = param_count(
        model, active=True, count_input_embedding=not name.startswith("gpt-oss")
    ) - (model.vocab * model.hidden if name == "nemotron-3-nano" else 0)
    want = PUBLISHED_ACTIVE[name]
    assert abs(got - want) / want < 0.03, f"{name}: {got / 1e9:.2f}B vs published {want / 1e9}B"


def test_nemotron_embedding_split_matches_report():
    m = get_model("nemotron4-340b")
    emb = 2 * m.vocab * m.hidden
    assert abs(emb - 9.4e9) / 9.4e9 < 0.01
    assert abs(param_count(m) - emb - 331.6e9) / 331.6e9 < 0.01


def test_spot_check_architectures():
    m = get_model("70b")
    assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.vocab, m.seq_len) == (
        80, 8192, 28672, 64, 8, 128256, 8192
    )
    g = get_model("gpt3-175b")
    assert not g.gated_mlp and g.learned_position_embeddings and g.seq_len == 2048
    d = get_model("deepseek-v3")
    assert d.moe_layers == 58 and d.shared_experts == 1 and d.mla_kv_lora_rank == 512
    assert d.mla_q_lora_rank == 1536 and d.mla_rope_dim == 64 and d.head_width == 128
    q = get_model("qwen3-30b-a3b")
    assert q.dense_layers == 0 and q.moe_layers == 48 and q.expert_ffn == 768
    assert not get_model("nemotron4-340b").gated_mlp
    f = get_model("falcon-7b")   # multi-query attention, a GELU MLP, tied embeddings, rope
    assert (f.kv_heads, f.head_dim, f.gated_mlp, f.tied_embeddings, f.learned_position_embeddings) == (
        1, 64, False, True, False)
    b = get_model("bloom-176b")
    assert b.vocab == 250880 and b.linear_bias and b.tied_embeddings and any("ALiBi" in u for u in b.unexpressed)
    o = get_model("opt-175b")
    assert o.activation == "relu" and o.learned_position_embeddings and o.vocab == 50272
    n = get_model("gpt-neox-20b")
    assert n.rotary_percent == 0.25 and not n.tied_embeddings and n.vocab == 50432
    q = get_model("qwen2-57b-a14b")
    assert q.moe_layers == 28 and q.shared_experts * q.expert_ffn == 20480 and not q.moe_router_norm_topk
    assert get_model("qwen2.5-72b").qkv_bias and not get_model("qwen2.5-72b").linear_bias
    assert any("12 of 24" in u for u in get_model("gpt-oss-20b").unexpressed)
    g = get_model("glm-4.5")   # 96 heads of 128 on a 5120-wide model, the first 3 layers dense, one MTP layer
    assert (g.head_width, g.dense_layers, g.moe_layers, g.mtp_layers, g.rotary_percent) == (128, 3, 89, 1, 0.5)
    assert get_model("gemma-2-27b").head_width == 128 and get_model("gemma-2-27b").activation == "geglu"
    s = get_model("llama4-scout")
    assert s.moe_layers == 48 and s.moe_topk == 1 and s.shared_experts == 1 and not s.moe_router_norm_topk


@pytest.mark.parametrize(
    "alias, name",
    [
        ("llama3-70b", "70b"),
        ("llama-3-70b", "70b"),
        ("Llama-3-70B", "70b"),
        ("LLAMA3_70B", "70b"),
        ("llama3.1-405b", "405b"),
        ("Llama-3.1-405B", "405b"),
        ("llama3-8b", "8b"),
        ("llama2-7b", "7b"),
        ("llama-2-70b", "llama2-70b"),
        ("Mixtral-8x7B", "mixtral-8x7b"),
        ("DeepSeek-V3", "deepseek-v3"),
        ("GPT-3-175B", "gpt3-175b"),
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("Nemotron-4-340B", "nemotron4-340b"),
        ("Mixtral-8x22B", "mixtral-8x22b"),
        ("mistralai/Mixtral-8x22B-v0.1", "mixtral-8x22b"),
        ("Qwen3-32B", "qwen3-32b"),
        ("Llama-3.3-70B", "llama3.1-70b"),
        ("Grok-1 314B", "grok-1"),
        ("DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
        ("LLaMA-65B", "llama-65b"),
        ("LLaMA 30B", "llama-33b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("Qwen/Qwen2-57B-A14B", "qwen2-57b-a14b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("databricks/dbrx-base", "dbrx"),
        ("Nemotron-4 15B", "nemotron-4-15b"),
        ("tiiuae/falcon-180B", "falcon-180b"),
        ("Falcon 7B", "falcon-7b"),
        ("bigscience/bloom", "bloom-176b"),
        ("BLOOM-176B", "bloom-176b"),
        ("OPT-175B", "opt-175b"),
        ("EleutherAI/gpt-neox-20b", "gpt-neox-20b"),
        ("MT-NLG 530B", "mt-nlg-530b"),
        ("01-ai/Yi-34B", "yi-34b"),
        ("CodeLlama-34b-Instruct-hf", "codellama-34b"),
        ("google/gemma-2-27b-it", "gemma-2-27b"),
        ("Gemma-2-9B", "gemma-2-9b"),
        ("Phi-3-medium-4k-instruct", "phi-3-medium"),
        ("zai-org/GLM-4.5", "glm-4.5"),
        ("GLM-4.5-Air", "glm-4.5-air"),
        ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "qwen3-coder-480b-a35b"),
        ("MiniMaxAI/MiniMax-M2", "minimax-m2"),
        ("Llama-4-Scout-17B-16E-Instruct", "llama4-scout"),
    ],
)
def test_names_are_case_insensitive_with_aliases(alias, name):
    assert get_model(alias) == catalog()[name]


def test_overrides():
    m = get_model("70b", seq_len=4096, precision="fp8-cs")
    assert m.seq_len == 4096 and m.precision == "fp8"
    assert get_model("70b").seq_len == 8192  # the cached entry is untouched
    with pytest.raises(InputError, match="precision"):
        get_model("70b", precision="int3")
    with pytest.raises(InputError, match="seq_len"):
        get_model("70b", seq_len=0)


def test_unknown_name_lists_catalog():
    with pytest.raises(InputError) as info:
        get_model("llama-9000b")
    msg = str(info.value)
    assert "\n" not in msg
    assert "llama-9000b" in msg
    for name in catalog_names():
        assert name in msg
    assert "or pass the path of a Hugging Face config.json" in msg
    assert "did you mean" not in msg                     # nothing is spelled nearly so


@pytest.mark.parametrize("typo, near", [("mixtral-8x7", "mixtral-8x7b"), ("Qwen3-32", "qwen3-32b"),
                                        ("deepsek-v3", "deepseek-v3")])
def test_a_near_miss_names_the_catalog_models_spelled_nearly_so(typo, near):
    with pytest.raises(InputError, match=f"unknown model '{typo}' \\(did you mean [^)]*{near}"):
        get_model(typo)


def test_catalog_attribute_is_lazy_and_complete():
    import costmodel.catalog as mod

    assert set(mod.CATALOG) == set(catalog_names())


# Hugging Face import -----------------------------------------------------------------------
def test_hf_llama3_8b_matches_catalog():
    m = from_hf_config(EXAMPLES / "llama3-8b" / "config.json")
    assert m.name == "llama3-8b"
    assert m.model_copy(update={"name": "8b"}) == get_model("8b")


def test_hf_directory_and_get_model_path():
    by_dir = get_model(str(EXAMPLES / "llama3-8b"))
    by_file = get_model(str(EXAMPLES / "llama3-8b" / "config.json"))
    assert by_dir == by_file == from_hf_config(EXAMPLES / "llama3-8b")


def test_hf_mixtral():
    path = EXAMPLES / "mixtral-8x7b" / "config.json"
    m = from_hf_config(path)
    assert m.seq_len == 8192  # min(max_position_embeddings 32768, 8192)
    assert (m.num_experts, m.moe_topk, m.moe_ffn_hidden, m.shared_experts, m.dense_layers) == (
        8, 2, 14336, 0, 0
    )
    assert not m.tied_embeddings and m.gated_mlp
    m4k = get_model(str(path), seq_len=4096, precision="bf16-mixed")
    assert m4k.model_copy(update={"name": "mixtral-8x7b"}) == get_model("mixtral-8x7b")


def test_hf_deepseek_v3():
    m = from_hf_config(EXAMPLES / "deepseek-v3")
    ref = get_model("deepseek-v3")
    for field in (
        "layers", "hidden", "ffn_hidden", "heads", "head_dim", "vocab", "num_experts",
        "moe_topk", "moe_ffn_hidden", "shared_experts", "dense_layers", "mla_kv_lora_rank",
        "mla_q_lora_rank", "mla_rope_dim", "mla_v_head_dim", "gated_mlp", "tied_embeddings", "mtp_layers",
    ):
        assert getattr(m, field) == getattr(ref, field), field
    assert m.mtp_layers == 1          # num_nextn_predict_layers
    assert m.seq_len == 8192
    assert param_count(m) == param_count(ref)


def _write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(json.dumps(data))
    return p


def test_hf_gpt2_names(tmp_path):
    p = _write(tmp_path, {
        "model_type": "gpt2", "activation_function": "gelu_new", "n_layer": 12, "n_embd": 768,
        "n_head": 12, "n_positions": 1024, "n_ctx": 1024, "n_inner": None, "vocab_size": 50257,
    })
    m = from_hf_config(p)
    assert (m.layers, m.hidden, m.heads, m.ffn_hidden, m.vocab, m.seq_len) == (
        12, 768, 12, 3072, 50257, 1024
    )
    assert not m.gated_mlp and m.learned_position_embeddings and m.tied_embeddings
    assert abs(param_count(m) - 124.4e6) / 124.4e6 < 0.01  # GPT-2 small, 124M


def test_hf_gpt_neox(tmp_path):
    # EleutherAI/pythia-1b-like: rotary, untied, two-matrix GELU MLP.
    p = _write(tmp_path, {
        "model_type": "gpt_neox", "hidden_act": "gelu", "num_hidden_layers": 16,
        "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 8,
        "max_position_embeddings": 2048, "vocab_size": 50304, "tie_word_embeddings": False,
    })
    m = from_hf_config(p)
    assert not m.gated_mlp and not m.learned_position_embeddings and not m.tied_embeddings
    assert m.kv_heads is None and m.seq_len == 2048


def test_hf_qwen3_moe_matches_catalog(tmp_path):
    # HF Qwen/Qwen3-30B-A3B config.json, every key.
    p = _write(tmp_path, {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    })
    m = from_hf_config(p, seq_len=4096)
    assert m.model_copy(update={"name": "qwen3-30b-a3b"}) == get_model("qwen3-30b-a3b")
    assert m.qk_norm and m.norm_epsilon == 1e-6 and m.rotary_base == 1e6 and m.unexpressed == ()


def test_hf_gpt_oss_experts_per_token(tmp_path):
    # HF openai/gpt-oss-120b config.json, every key (quantization_config abridged: it describes the stored
    # MXFP4 weights, not the model trained).
    p = _write(tmp_path, {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
        "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 199999,
        "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
        "vocab_size": 201088,
    })
    m = from_hf_config(p, seq_len=4096)
    assert m.model_copy(update={"name": "gpt-oss-120b"}) == get_model("gpt-oss-120b")
    assert (m.activation, m.activation_clamp, m.glu_linear_offset, m.linear_bias) == ("quick_geglu", 7.0, 1.0, True)


def test_hf_unknown_family_and_keys_are_named(tmp_path):
    # A family the planner does not know, and an architectural key it has no mapping for, end up in
    # unexpressed (which megatron_args.txt prints): never silently dropped.
    p = _write(tmp_path, {
        "model_type": "new_family", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4,
        "num_attention_heads": 8, "max_position_embeddings": 2048, "vocab_size": 32000, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "attn_logit_softcapping": 50.0,
    })
    m = from_hf_config(p)
    assert m.unexpressed == ("model_type 'new_family': an architecture the planner does not know (known: "
                             "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, "
                             "gpt_oss, gpt2, gpt_neox, nemotron, nemotron_h, gemma2, glm4_moe, minimax_m2, "
                             "llama4_text)",
                             "config key 'attn_logit_softcapping'=50.0 (no mapping)")
    # A Llama whose keys are absent takes transformers' LlamaConfig defaults (rms_norm_eps 1e-6, rope_theta 1e4).
    p = _write(tmp_path, {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096,
                          "num_hidden_layers": 4, "num_attention_heads": 8, "max_position_embeddings": 2048,
                          "vocab_size": 32000, "sliding_window": 1024})
    m = from_hf_config(p)
    assert (m.norm_epsilon, m.rotary_base) == (1e-6, 10000.0)
    assert m.unexpressed == ("sliding-window attention of 1024 tokens",)


def test_hf_qwen2_moe_shared_expert_width(tmp_path):
    # Qwen2-57B-A14B: one shared expert of width 20480 = 8 routed-expert widths of 2560.
    p = _write(tmp_path, {
        "model_type": "qwen2_moe", "hidden_size": 3584, "intermediate_size": 18944,
        "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "num_experts": 64, "num_experts_per_tok": 8, "max_position_embeddings": 32768,
        "vocab_size": 151936,
    })
    assert from_hf_config(p).shared_experts == 8


def test_hf_malformed_json_names_file(tmp_path):
    p = tmp_path / "broken" / "config.json"
    p.parent.mkdir()
    p.write_text('{"hidden_size": 4096,,}')
    with pytest.raises(InputError) as info:
        get_model(str(p))
    assert str(p) in str(info.value) and "malformed JSON" in str(info.value)


def test_hf_missing_field_names_file_and_field(tmp_path):
    data = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text())
    del data["hidden_size"]
    p = _write(tmp_path, data)
    with pytest.raises(InputError) as info:
        from_hf_config(p)
    assert str(p) in str(info.value) and "hidden_size" in str(info.value)


def test_hf_bad_value_names_hf_field(tmp_path):
    data = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text())
    data["num_hidden_layers"] = 0
    p = _write(tmp_path, data)
    with pytest.raises(InputError, match="num_hidden_layers"):
        from_hf_config(p)
    data["num_hidden_layers"] = "thirty-two"
    p = _write(tmp_path, data)
    with pytest.raises(InputError, match="num_hidden_layers"):
        from_hf_config(p)


def test_hf_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(InputError, match="not found"):
        get_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(InputError, match="config.json"):
        get_model(str(tmp_path))


def test_hf_interleaved_moe_is_refused(tmp_path):
    # DeepSeek's modeling code puts experts on layers i >= first_k_dense_replace with i % moe_layer_freq == 0:
    # layers 4, 6, 8, ... then, a placement no (dense_layers, moe_layer_step) gives.
    data = json.loads((EXAMPLES / "deepseek-v3" / "config.json").read_text())
    data["moe_layer_freq"] = 2
    p = _write(tmp_path, data)
    with pytest.raises(InputError, match=r"field 'first_k_dense_replace' and 'moe_layer_freq': MoE on layers 4, 6, "):
        from_hf_config(p)


# Llama 4 Maverick's text config as TensorRT-LLM's tests/unittest/_torch/modeling/test_modeling_llama_min_latency.py
# restates it (LLAMA_4_MAVERICK_TWO_LAYER_CONFIG, there cut to 2 layers; the model's 48 here).
MAVERICK_CONFIG = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008], "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "initializer_range": 0.02, "interleave_moe_layer_step": 2, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576, "model_type": "llama4_text",
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": False, "vocab_size": 202048},
    "vision_config": {"model_type": "llama4_vision_model"},
}


def test_hf_llama4_maverick_imports_to_its_catalog_entry(tmp_path):
    m = from_hf_config(_write(tmp_path, MAVERICK_CONFIG))
    assert m.model_copy(update={"name": "llama4-maverick"}) == get_model("llama4-maverick")
    assert (m.moe_layers, m.moe_layer_step, m.ffn_hidden, m.expert_ffn, m.shared_experts) == (24, 2, 16384, 8192, 1)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    # The same placement stated layer by layer (transformers' moe_layers), and Scout's every layer.
    text = {**MAVERICK_CONFIG["text_config"], "moe_layers": list(range(1, 48, 2))}
    del text["interleave_moe_layer_step"]
    assert from_hf_config(_write(tmp_path, {**MAVERICK_CONFIG, "text_config": text})) == m
    every = from_hf_config(_write(tmp_path, {**MAVERICK_CONFIG, "text_config": {
        **MAVERICK_CONFIG["text_config"], "interleave_moe_layer_step": 1, "use_qk_norm": True}}))
    assert (every.moe_layers, every.moe_layer_step) == (48, 1)
    assert "a weightless L2 QK norm on the rotary layers" in every.unexpressed


@pytest.mark.parametrize("key, value, why", [
    ("interleave_moe_layer_step", -1, "expected an integer >= 1"),
    ("interleave_moe_layer_step", 2.5, "expected an integer"),
    ("moe_layers", [1, 99], r"expected a list of layer indices 0\.\.47"), ("moe_layers", [], "no MoE layer"),
    ("no_rope_layers", "x", "expected a list of 0 / 1, one a layer"),
    ("no_rope_layer_interval", 0, "expected an integer >= 1"),
    ("attention_chunk_size", "big", "expected an integer"), ("floor_scale", "a", "expected a number"),
])
def test_hf_llama4_bad_values_are_one_line_errors_naming_the_field(tmp_path, key, value, why):
    text = {**MAVERICK_CONFIG["text_config"], key: value}
    with pytest.raises(InputError, match=rf"config\.json: field .*'{key}'.*: {why}"):
        from_hf_config(_write(tmp_path, {**MAVERICK_CONFIG, "text_config": text}))


def test_hf_moe_placements_from_sparse_step_and_mlp_only_layers(tmp_path):
    base = {"model_type": "qwen2_moe", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
            "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 704, "max_position_embeddings": 4096}
    # Qwen2MoeDecoderLayer: experts where (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers.
    m = from_hf_config(_write(tmp_path, {**base, "decoder_sparse_step": 3}))
    assert (m.dense_layers, m.moe_layer_step, m.moe_layers) == (0, 3, 4)
    m = from_hf_config(_write(tmp_path, {**base, "decoder_sparse_step": 2, "mlp_only_layers": [0, 1, 2, 3]}))
    assert [i for i in range(12) if m.is_moe_layer(i)] == [5, 7, 9, 11]
    with pytest.raises(InputError, match=r"field 'mlp_only_layers': MoE on layers 0, 1, 2, 3, 4, 6, \.\.\.; valid"):
        from_hf_config(_write(tmp_path, {**base, "mlp_only_layers": [5]}))
    with pytest.raises(InputError, match="field 'decoder_sparse_step': expected an integer >= 1"):
        from_hf_config(_write(tmp_path, {**base, "decoder_sparse_step": 0}))


@pytest.mark.parametrize("mask, want", [
    ([1] * 6, {"dense_layers": 0, "moe_layer_step": 1}),
    ([0, 0, 0, 1, 1, 1], {"dense_layers": 3, "moe_layer_step": 1}),
    ([0, 1] * 3, {"dense_layers": 0, "moe_layer_step": 2}),
    ([0, 0, 0, 1, 0, 1], {"dense_layers": 2, "moe_layer_step": 2}),
    ([0, 0, 1, 0, 0, 1, 0], {"dense_layers": 0, "moe_layer_step": 3}),
    ([1, 0, 1, 0], None),            # Megatron's integer --moe-layer-freq 2: a first MoE layer, then dense
    ([0, 1, 1, 0], None),
    ([0, 0, 0], None),
])
def test_moe_layout_round_trips_a_layer_mask(mask, want):
    assert moe_layout(mask) == want
    if want:
        m = ModelSpec(name="x", layers=len(mask), hidden=256, ffn_hidden=512, heads=4, vocab=1000, seq_len=128,
                      num_experts=4, moe_topk=1, **want)
        assert [int(m.is_moe_layer(i)) for i in range(len(mask))] == mask
        assert m.moe_layers == sum(mask) and list(m.dense_prefix()) == [i - sum(mask[:i]) for i in range(len(mask) + 1)]
        assert m.moe_layer_freq() == (None if all(mask) else mask)


def test_moe_layer_step_needs_an_moe_transformer():
    base = dict(name="x", layers=8, hidden=256, ffn_hidden=512, heads=4, vocab=1000, seq_len=128)
    with pytest.raises(ValueError, match="moe_layer_step=2 needs an MoE transformer"):
        ModelSpec(**base, moe_layer_step=2)
    with pytest.raises(ValueError, match="leaves no MoE layer"):
        ModelSpec(**base, num_experts=4, moe_topk=1, dense_layers=5, moe_layer_step=5)


def test_named_in_finds_catalog_models_by_a_family_alias_inside_a_longer_name():
    from costmodel.catalog import named_in
    assert named_in("LLAMA2-70B (SFT)") == ["llama2-70b"]
    assert named_in("Llama3.1-405B (proxy, 7 layers)") == ["405b"]
    assert named_in("Meta-Llama-3-70B-Instruct") == ["70b"]
    # A bare size names no family: GPT-2 8B is not the catalog's 8b (Llama 3 8B).
    assert named_in("GPT-2 8B (8.67B)") == [] and named_in("175B") == []


def test_a_longer_name_finds_the_larger_mixtral_not_the_family_alias():
    """'mixtral' is 8x7B's family alias; a name that says 8x22B is 8x22B (the longest match first)."""
    from costmodel.catalog import named_in

    assert named_in("Mixtral 8x22B (MLPerf MoE)")[0] == "mixtral-8x22b"
    assert named_in("Mixtral 8x7B")[0] == "mixtral-8x7b"



@pytest.mark.parametrize("name, want", [
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"), ("meta-llama/Llama-3.1-405B-Instruct", "405b"),
    ("Llama-2-70b-chat-hf", "llama2-70b"), ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3"), ("Qwen3-32B-FP8", "qwen3-32b")])
def test_a_release_variant_of_a_catalog_model_is_that_model(name, want):
    """Tuning, checkpoint-format, version and date suffixes and the organisation prefix name the same network."""
    assert get_model(name) == catalog()[want]


def test_a_variant_suffix_does_not_shorten_a_name_into_another_model():
    with pytest.raises(InputError, match="unknown model 'DeepSeek-Coder-V2-Lite-Instruct'"):
        get_model("DeepSeek-Coder-V2-Lite-Instruct")    # not DeepSeek-V2-Lite, not any catalog model


# Configs of the catalog's Gemma 2 27B, GLM-4.5 and MiniMax-M2 as their cited sources restate them (the HF
# config.json keys of google/gemma-2-27b, zai-org/GLM-4.5 and MiniMaxAI/MiniMax-M2).
GEMMA_2_27B = {'architectures': ['Gemma2ForCausalLM'], 'model_type': 'gemma2', 'attention_bias': False, 'attention_dropout': 0.0, 'attn_logit_softcapping': 50.0, 'final_logit_softcapping': 30.0, 'head_dim': 128, 'hidden_act': 'gelu_pytorch_tanh', 'hidden_activation': 'gelu_pytorch_tanh', 'hidden_size': 4608, 'initializer_range': 0.02, 'intermediate_size': 36864, 'max_position_embeddings': 8192, 'num_attention_heads': 32, 'num_hidden_layers': 46, 'num_key_value_heads': 16, 'query_pre_attn_scalar': 144, 'rms_norm_eps': 1e-06, 'rope_theta': 10000.0, 'sliding_window': 4096, 'vocab_size': 256000, 'torch_dtype': 'float32', 'cache_implementation': 'hybrid', 'pad_token_id': 0, 'eos_token_id': 1, 'bos_token_id': 2}
GLM_4_5 = {'architectures': ['Glm4MoeForCausalLM'], 'model_type': 'glm4_moe', 'attention_bias': True, 'first_k_dense_replace': 3, 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 5120, 'intermediate_size': 12288, 'max_position_embeddings': 131072, 'moe_intermediate_size': 1536, 'n_group': 1, 'n_routed_experts': 160, 'n_shared_experts': 1, 'norm_topk_prob': True, 'num_attention_heads': 96, 'num_experts_per_tok': 8, 'num_hidden_layers': 92, 'num_key_value_heads': 8, 'num_nextn_predict_layers': 1, 'partial_rotary_factor': 0.5, 'rms_norm_eps': 1e-05, 'rope_scaling': None, 'rope_theta': 1000000, 'routed_scaling_factor': 2.5, 'tie_word_embeddings': False, 'topk_group': 1, 'use_qk_norm': True, 'vocab_size': 151552}
MINIMAX_M2 = {**{'architectures': ['MiniMaxM2ForCausalLM'], 'model_type': 'minimax_m2', 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 3072, 'intermediate_size': 1536, 'max_position_embeddings': 196608, 'num_attention_heads': 48, 'num_experts_per_tok': 8, 'num_hidden_layers': 62, 'num_key_value_heads': 8, 'num_local_experts': 256, 'rms_norm_eps': 1e-06, 'rope_theta': 5000000, 'rotary_dim': 64, 'scoring_func': 'sigmoid', 'shared_intermediate_size': 0, 'sliding_window': None, 'tie_word_embeddings': False, 'use_qk_norm': True, 'qk_norm_type': 'per_layer', 'use_routing_bias': True, 'use_mtp': True, 'num_mtp_modules': 3, 'mtp_transformer_layers': 1, 'mlp_intermediate_size': 8192, 'vocab_size': 200064}, "attn_type_list": [1] * 62}


@pytest.mark.parametrize("config, name, seq_len", [(GEMMA_2_27B, "gemma-2-27b", None), (GLM_4_5, "glm-4.5", 4096),
                                                   (MINIMAX_M2, "minimax-m2", 4096)])
def test_hf_gemma2_glm4_moe_and_minimax_m2_configs_are_their_catalog_models(tmp_path, config, name, seq_len):
    """Gemma 2 (tied embeddings, GeGLU from hidden_activation, its soft-caps and alternating windows named), GLM-4.5
    (QKV bias only, use_qk_norm, a sigmoid router with expert bias that the config does not state) and MiniMax-M2
    (all-attention attn_type_list, rotary_dim of head_dim, use_routing_bias, its QK norm and MTP modules named)."""
    m = from_hf_config(_write(tmp_path, config), seq_len=seq_len)
    assert m.model_copy(update={"name": name}) == get_model(name)


def test_hf_minimax_layer_kinds_with_linear_attention_are_refused(tmp_path):
    """MiniMax-Text-01's attn_type_list marks lightning (linear) attention layers 0: not an all-attention model."""
    data = {**MINIMAX_M2, "attn_type_list": [0] * 7 + [1] + [0] * 54}
    with pytest.raises(InputError, match="field 'attn_type_list': a model with state-space or linear-attention"):
        from_hf_config(_write(tmp_path, data))


@pytest.mark.parametrize("extra, named", [
    ({"model_type": "zamba2", "hybrid_override_pattern": "M-M*-M-"}, "field 'hybrid_override_pattern'"),
    ({"model_type": "jamba", "layers_block_type": ["mamba", "attention"]}, "field 'layers_block_type'"),
    ({"model_type": "qwen3_next", "full_attention_interval": 4}, "field 'full_attention_interval'"),
    ({"model_type": "mamba2"}, "model_type 'mamba2'")])
def test_hf_state_space_and_linear_attention_hybrids_are_refused(tmp_path, extra, named):
    """A config whose layers do not all attend would be priced as all-attention: a one-line error instead."""
    data = {**json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text()), **extra}
    with pytest.raises(InputError, match=f"{named}: a model with state-space or linear-attention layers"):
        from_hf_config(_write(tmp_path, data))


def _nemotron_h_config(**extra) -> dict:
    """The fields transformers' NemotronHConfig reads, with Nemotron 3 Nano's values (Megatron-Bridge's
    Nemotron3NanoProvider, which the catalog entry cites)."""
    nano = catalog()["nemotron-3-nano"]
    return {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 2688,
            "intermediate_size": 1856, "num_hidden_layers": 52, "hybrid_override_pattern": nano.hybrid_pattern,
            "num_attention_heads": 32, "head_dim": 128, "num_key_value_heads": 2, "mamba_num_heads": 64,
            "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
            "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
            "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
            "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "mlp_hidden_act": "relu2",
            "layer_norm_epsilon": 1e-5, "vocab_size": 131072, "tie_word_embeddings": False,
            "max_position_embeddings": 262144, "attention_bias": False, "mlp_bias": False, "use_bias": False,
            "use_conv_bias": True, "mamba_hidden_act": "silu", "hidden_dropout": 0.0, "attention_dropout": 0.0,
            **extra}


def test_a_nemotron_h_config_is_the_hybrid_model_it_describes(tmp_path):
    """A nemotron_h config.json builds the hybrid model: Nemotron 3 Nano's is the catalog entry field for field,
    and layers_block_type spells the same pattern as hybrid_override_pattern."""
    want = catalog()["nemotron-3-nano"].model_dump()
    got = from_hf_config(_write(tmp_path, _nemotron_h_config())).model_dump()
    assert {k: (got[k], want[k]) for k in got if got[k] != want[k]} == {"name": ("model", "nemotron-3-nano")}
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    blocks = [kinds[ch] for ch in want["hybrid_pattern"]]
    data = {k: v for k, v in _nemotron_h_config(layers_block_type=blocks).items() if k != "hybrid_override_pattern"}
    assert from_hf_config(_write(tmp_path, data)).hybrid_pattern == want["hybrid_pattern"]
    data.pop("layers_block_type")
    with pytest.raises(InputError, match="field 'hybrid_override_pattern': a nemotron_h config needs its layer"):
        from_hf_config(_write(tmp_path, data))


def test_a_megatron_log_of_a_hybrid_mamba_run_reads_its_pattern_and_mamba_widths():
    """pretrain_mamba.py prints hybrid_override_pattern and the Mamba-2 widths: plan calibrate reads the run as the
    hybrid model it is (the part of the pattern after '/' is the multi-token-prediction modules'), and a pattern
    whose length is not num_layers is a one-line error naming the field."""
    from costmodel.runlog import parse_megatron_log

    text = (Path(__file__).parent / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    line = "  use_distributed_optimizer ....................... True\n"
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M"     # 32 layers: 15 Mamba, 3 attention, 14 MLP
    extra = (f"  hybrid_override_pattern ......................... {pattern}/*-\n"
             "  mamba_num_heads ................................. 64\n"
             "  mamba_state_dim ................................. 128\n"
             "  squared_relu .................................... True\n")
    patched = text.replace(line, line + extra).replace("  swiglu .......................................... True",
                                                        "  swiglu .......................................... False")
    assert patched != text
    model = parse_megatron_log(patched, "hybrid.log", gpu="H100").measurement.model
    assert model.hybrid_pattern == pattern and model.mtp_layers == 1
    assert (model.mamba_heads, model.mamba_head_dim, model.mamba_state_dim, model.mamba_groups) == (64, 64, 128, 8)
    assert model.hybrid_counts == {"M": 15, "*": 3, "-": 14, "E": 0}
    assert (model.activation, model.normalization, model.linear_bias, model.hidden_dropout) == \
        ("squared_relu", "RMSNorm", False, 0.0)
    short = text.replace(line, line + "  hybrid_override_pattern ......................... M-M-M*-\n")
    want = "hybrid.log: field 'hybrid_override_pattern' = 'M-M-M\\*-': 7 layers before any '/', num_layers 32"
    with pytest.raises(InputError, match=want):
        parse_megatron_log(short, "hybrid.log", gpu="H100")
    assert parse_megatron_log(text, "plain.log", gpu="H100").measurement.model.hybrid_pattern is None
