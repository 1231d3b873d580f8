"""The launched run is the planned model: megatron_args.txt, parsed back the way Megatron-LM parses it, states every
architectural fact of every catalog model and of every examples/configs/*/config.json, field by field.

The parser below repeats the argparse definitions of Megatron-LM core_v0.16 ``megatron/training/arguments.py``
(names, types, defaults, dests) for the flags that shape the model, and ``megatron_facts`` reads the namespace as
``validate_args`` / ``core_transformer_config_from_args`` / ``pretrain_gpt.py`` do (e.g. ``--add-qkv-bias`` is
implied by linear biases, MLA takes YaRN unless ``--rope-type rope``). Facts come back in ModelSpec's vocabulary and
are compared with the spec, and, for the shipped configs, with the config.json keys read independently here.

A model the planner does not fully express fails: the '# not expressed:' line must be empty, except for the one
documented gap below (gpt-oss-120b).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from costmodel.catalog import GPT_OSS_UNEXPRESSED, GROK_1_UNEXPRESSED, catalog, catalog_names, from_hf_config
from costmodel.profiles import InputError, load_cluster
from costmodel.specs import ModelSpec
from costmodel.plan import ParallelPlan
from planner.outputs import megatron_args, write_outputs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "configs"
CONFIGS = sorted(EXAMPLES.glob("*/config.json"))

# The documented gaps: facts of a shipped model Megatron-LM core_v0.16 has no flag for. gpt-oss-120b's attention
# sinks, sliding window, router bias and untruncated YaRN (costmodel.catalog.GPT_OSS_UNEXPRESSED), and YaRN itself,
# which Megatron-LM applies only with multi-latent attention ("Common attention only support rope_type='rope'").
KNOWN_LOST = {
    "gpt-oss-120b": [*GPT_OSS_UNEXPRESSED,
                     "YaRN rope scaling (factor 32): Megatron-LM applies YaRN only with --multi-latent-attention"],
    "kimi-k2": ["YaRN beta_fast=1.0 (Megatron fixes 32.0)"],
    # Megatron-LM has no gated GELU flag for a GPT model: the planner writes the gated MLP and names the GELU.
    "grok-1": [*GROK_1_UNEXPRESSED,
               "activation geglu (Megatron-LM has --swiglu, --squared-relu, --quick-geglu and GELU)"],
    # Models of published runs: what their configs state and no field holds (catalog.py, each entry's
    # unexpressed), and OPT's ReLU, which no Megatron-LM flag selects.
    "gpt-oss-20b": [*catalog()["gpt-oss-20b"].unexpressed,
                    "YaRN rope scaling (factor 32): Megatron-LM applies YaRN only with --multi-latent-attention"],
    "mistral-7b": ["sliding-window attention of 4096 tokens on every layer"],
    "qwen2-57b-a14b": ["sigmoid gate on the shared expert (shared_expert_gate)"],
    "dbrx": ["query, key and value clipped to +-8 (clip_qkv)"],
    "falcon-7b": ["parallel attention and MLP on one LayerNorm's output (parallel_attn)"],
    "falcon-180b": ["parallel attention and MLP, each with its LayerNorm (new_decoder_architecture)"],
    "bloom-176b": ["ALiBi attention biases in place of rotary embeddings",
                   "a LayerNorm after the embedding (--embed-layernorm)"],
    "opt-175b": ["activation relu (Megatron-LM has --swiglu, --squared-relu, --quick-geglu and GELU)"],
    # Megatron-LM 2019's own tanh GELU (gelu_impl), which today's flags do not select.
    **{f"megatron-gpt2-{size}": ["activation gelu_tanh (Megatron-LM has --swiglu, --squared-relu, --quick-geglu "
                                 "and GELU)"] for size in ("1.2b", "2.5b", "4.2b", "8.3b")},
    "olmoe-1b-7b": list(catalog()["olmoe-1b-7b"].unexpressed),
    "gpt-neox-20b": ["parallel attention and MLP residual (use_parallel_residual)"],
    **{name: [*catalog()[name].unexpressed,
              "activation geglu (Megatron-LM has --swiglu, --squared-relu, --quick-geglu and GELU)"]
       for name in ("gemma-2-9b", "gemma-2-27b")},
    **{name: list(catalog()[name].unexpressed)
       for name in ("phi-3-medium", "minimax-m2", "llama4-scout", "llama4-maverick")},
}
KNOWN_MISMATCH = {"gpt-oss-120b": {"rope_scaling"}, "kimi-k2": {"rope_scaling"}, "grok-1": {"activation"},
                  "gpt-oss-20b": {"rope_scaling"}, "opt-175b": {"activation"}, "gemma-2-9b": {"activation"},
                  "gemma-2-27b": {"activation"},
                  **{f"megatron-gpt2-{size}": {"activation"} for size in ("1.2b", "2.5b", "4.2b", "8.3b")}}


# Megatron-LM's parser, restricted to the flags that shape the model ------------------------------------------
def _moe_freq(x: str):
    # arguments.py moe_freq_type: an int, or a Python list expression of digits, [ ] ( ) + * and commas.
    if "[" not in x:
        return int(x)
    assert not re.search(r"[^,\d\[\]()+*]", x), x
    return eval(x)  # noqa: S307 - the same validated eval as Megatron's _eval_pattern


def megatron_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    a = ap.add_argument
    # _add_network_size_args
    for name in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
                 "--max-position-embeddings", "--mtp-num-layers"):
        a(name, type=int, default=None)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--position-embedding-type", default="learned_absolute",
      choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    a("--rotary-base", type=int, default=10000)
    a("--rotary-percent", type=float, default=1.0)
    a("--rotary-seq-len-interpolation-factor", type=int, default=None)
    a("--use-rope-scaling", action="store_true")
    a("--rope-scaling-factor", type=float, default=8.0)
    a("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    a("--norm-epsilon", type=float, default=1e-5)
    a("--apply-layernorm-1p", action="store_true")
    a("--squared-relu", action="store_true")
    a("--swiglu", action="store_true")
    a("--quick-geglu", action="store_true")
    a("--activation-func-clamp-value", type=float, default=None)
    a("--glu-linear-offset", type=float, default=0.0)
    a("--untie-embeddings-and-output-weights", action="store_true")
    a("--multi-latent-attention", action="store_true")
    # _add_data_args
    a("--seq-length", type=int, default=None)
    # _add_regularization_args
    a("--attention-dropout", type=float, default=0.1)
    a("--hidden-dropout", type=float, default=0.1)
    # _add_training_args
    a("--rope-type", default=None, choices=["rope", "yarn"])
    a("--no-rope-fusion", action="store_false", dest="apply_rope_fusion")
    a("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    a("--add-qkv-bias", action="store_true", dest="add_qkv_bias")
    # _add_vision_args (sic)
    a("--qk-layernorm", action="store_true")
    # _add_mla_args
    a("--q-lora-rank", type=int, default=None)
    a("--kv-lora-rank", type=int, default=32)
    a("--qk-head-dim", type=int, default=128)
    a("--qk-pos-emb-head-dim", type=int, default=64)
    a("--v-head-dim", type=int, default=128)
    a("--rotary-scaling-factor", type=float, default=1.0)
    a("--mscale", type=float, default=1.0)
    a("--mscale-all-dim", type=float, default=0.0)
    # _add_moe_args
    a("--num-experts", type=int, default=None)
    # _add_network_size_args (hybrid models, pretrain_mamba.py) and _add_moe_args' LatentMoE width
    a("--hybrid-override-pattern", type=str, default=None)
    a("--mamba-state-dim", type=int, default=128)
    a("--mamba-head-dim", type=int, default=64)
    a("--mamba-num-groups", type=int, default=8)
    a("--mamba-num-heads", type=int, default=None)
    a("--moe-latent-size", type=int, default=None)
    a("--moe-layer-freq", type=_moe_freq, default=1)
    a("--moe-ffn-hidden-size", type=int, default=None)
    a("--moe-shared-expert-intermediate-size", type=int, default=None)
    a("--moe-grouped-gemm", action="store_true")
    a("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"])
    a("--moe-router-topk", type=int, default=2)
    a("--moe-router-pre-softmax", action="store_true")
    a("--moe-router-num-groups", type=int, default=None)
    a("--moe-router-group-topk", type=int, default=None)
    a("--moe-router-topk-scaling-factor", type=float, default=None)
    a("--moe-router-enable-expert-bias", action="store_true")
    # _add_mixed_precision_args / _add_transformer_engine_args
    a("--fp16", action="store_true")
    a("--bf16", action="store_true")
    a("--initial-loss-scale", type=float, default=2 ** 32)
    a("--loss-scale", type=float, default=None)
    a("--fp8-format", default=None, choices=["e4m3", "hybrid"], dest="fp8")
    a("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    a("--fp4-format", default=None, choices=["e2m1"], dest="fp4")
    a("--fp4-recipe", default="nvfp4", choices=["nvfp4", "custom"])
    a("--fp8-param-gather", action="store_true")
    a("--reuse-grad-buf-for-mxfp8-param-ag", action="store_true")
    a("--transformer-impl", default="transformer_engine", choices=["local", "transformer_engine"])
    a("--tp-comm-overlap", action="store_true")
    return ap


def parse(text: str) -> tuple[argparse.Namespace, list[str]]:
    """The namespace of megatron_args.txt (flags of other groups are left unparsed) and its not-expressed items."""
    lines = text.splitlines()
    lost = [item for ln in lines if ln.startswith("# not expressed: ")
            for item in ln.removeprefix("# not expressed: ").split("; ")]
    tokens = shlex.split("\n".join(ln for ln in lines if not ln.startswith("#")))
    ns, _ = megatron_parser().parse_known_args(tokens)
    return ns, lost


def megatron_facts(ns: argparse.Namespace) -> dict:
    """What Megatron-LM builds from the namespace, in ModelSpec's vocabulary."""
    mla = ns.multi_latent_attention
    act = "swiglu" if ns.swiglu else "squared_relu" if ns.squared_relu else "quick_geglu" if ns.quick_geglu \
        else "gelu"
    f = dict(
        layers=ns.num_layers, hidden=ns.hidden_size, ffn_hidden=ns.ffn_hidden_size, heads=ns.num_attention_heads,
        seq_len=ns.seq_length, tied_embeddings=not ns.untie_embeddings_and_output_weights,
        learned_position_embeddings=ns.position_embedding_type == "learned_absolute", activation=act,
        activation_clamp=ns.activation_func_clamp_value, glu_linear_offset=ns.glu_linear_offset,
        normalization=("LayerNorm1p" if ns.apply_layernorm_1p else "LayerNorm") if ns.normalization == "LayerNorm"
        else "RMSNorm", norm_epsilon=ns.norm_epsilon, qk_norm=ns.qk_layernorm, linear_bias=ns.add_bias_linear,
        qkv_bias=ns.add_qkv_bias or ns.add_bias_linear,  # validate_args: add_bias_linear sets add_qkv_bias
        attention_dropout=ns.attention_dropout, hidden_dropout=ns.hidden_dropout,
        mtp_layers=ns.mtp_num_layers or 0,
    )
    if mla:
        f.update(head_width=ns.qk_head_dim, mla_kv_lora_rank=ns.kv_lora_rank, mla_q_lora_rank=ns.q_lora_rank,
                 mla_rope_dim=ns.qk_pos_emb_head_dim, mla_v_head_dim=ns.v_head_dim)
    else:
        f.update(head_width=ns.kv_channels or ns.hidden_size // ns.num_attention_heads,
                 kv_heads=ns.num_query_groups if ns.group_query_attention else ns.num_attention_heads,
                 mla_kv_lora_rank=None)
    if ns.hybrid_override_pattern:
        # MambaMixer: heads = expand (2) x hidden / head width unless given
        f.update(hybrid_pattern=ns.hybrid_override_pattern, mamba_state_dim=ns.mamba_state_dim,
                 mamba_head_dim=ns.mamba_head_dim, mamba_groups=ns.mamba_num_groups,
                 mamba_heads=ns.mamba_num_heads or 2 * ns.hidden_size // ns.mamba_head_dim)
    f["moe_latent"] = ns.moe_latent_size
    if ns.position_embedding_type == "rope":
        f.update(rotary_base=float(ns.rotary_base), rotary_percent=ns.rotary_percent)
        rope_type = ns.rope_type or ("yarn" if mla else "rope")  # MLATransformerConfig.rope_type = "yarn"
        if mla and rope_type == "yarn":
            # MLATransformerConfig: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1 (no flags).
            f["rope_scaling"] = ("yarn", ns.rotary_scaling_factor, ns.mscale, ns.mscale_all_dim, 4096, 32.0, 1.0)
        elif ns.use_rope_scaling:
            f["rope_scaling"] = ("llama3", ns.rope_scaling_factor, 1.0, 4.0, 8192)  # RotaryEmbedding._apply_scaling
        elif ns.rotary_seq_len_interpolation_factor:
            f["rope_scaling"] = ("linear", float(ns.rotary_seq_len_interpolation_factor))
        else:
            f["rope_scaling"] = None
    experts = ns.num_experts or 0
    f["num_experts"] = experts
    if experts:
        freq = ns.moe_layer_freq
        # megatron-core gpt_layer_specs: an integer k puts experts on layers i % k == 0, a list layer by layer
        pattern = [int(i % freq == 0) for i in range(ns.num_layers)] if isinstance(freq, int) else freq
        assert len(pattern) == ns.num_layers, pattern
        f.update(moe_topk=ns.moe_router_topk, expert_ffn=ns.moe_ffn_hidden_size or ns.ffn_hidden_size,
                 shared_experts=(ns.moe_shared_expert_intermediate_size or 0) // (ns.moe_ffn_hidden_size or 1),
                 moe_layers_at=tuple(i for i, x in enumerate(pattern) if x),
                 moe_router_score=ns.moe_router_score_function,
                 # moe_utils.topk_routing_with_score_function: softmax after top-k (renormalised) unless
                 # pre-softmax; sigmoid weights are renormalised for top-k > 1.
                 moe_router_norm_topk=not ns.moe_router_pre_softmax if ns.moe_router_score_function == "softmax"
                 else ns.moe_router_topk > 1,
                 moe_router_expert_bias=ns.moe_router_enable_expert_bias,
                 moe_router_topk_scaling=ns.moe_router_topk_scaling_factor or 1.0,
                 moe_router_groups=ns.moe_router_num_groups, moe_router_group_topk=ns.moe_router_group_topk)
    if ns.fp4:
        f["precision"] = "nvfp4" if ns.fp4_recipe == "nvfp4" else ns.fp4_recipe
    elif ns.fp8:
        f["precision"] = "mxfp8" if ns.fp8_recipe == "mxfp8" else "fp8"
    else:
        f["precision"] = "fp16" if ns.fp16 else "bf16" if ns.bf16 else "fp32"
    return f


def spec_facts(m: ModelSpec) -> dict:
    """The same facts as the spec states them."""
    mla = m.mla_kv_lora_rank is not None
    f = dict(
        layers=m.layers, hidden=m.hidden, ffn_hidden=m.ffn_hidden, heads=m.heads, seq_len=m.seq_len,
        tied_embeddings=m.tied_embeddings, learned_position_embeddings=m.learned_position_embeddings,
        activation=m.activation, activation_clamp=m.activation_clamp, glu_linear_offset=m.glu_linear_offset,
        normalization=m.normalization, norm_epsilon=m.norm_epsilon, qk_norm=m.qk_norm, linear_bias=m.linear_bias,
        qkv_bias=m.qkv_bias or m.linear_bias, attention_dropout=m.attention_dropout, hidden_dropout=m.hidden_dropout,
        mtp_layers=m.mtp_layers, head_width=m.head_width, mla_kv_lora_rank=m.mla_kv_lora_rank,
        num_experts=m.num_experts, precision=m.precision,
    )
    if mla:
        f.update(mla_q_lora_rank=m.mla_q_lora_rank, mla_rope_dim=m.mla_rope_dim,
                 mla_v_head_dim=m.mla_v_head_dim or m.head_width)
    else:
        f["kv_heads"] = m.kv_head_count
    if m.hybrid_pattern:
        f.update(hybrid_pattern=m.hybrid_pattern, mamba_state_dim=m.mamba_state_dim, mamba_head_dim=m.mamba_head_dim,
                 mamba_groups=m.mamba_groups, mamba_heads=m.mamba_heads)
    f["moe_latent"] = m.moe_latent
    if not m.learned_position_embeddings and not m.hybrid_pattern:   # a hybrid model has no position embeddings
        rs = m.rope_scaling
        f.update(rotary_base=m.rotary_base, rotary_percent=m.rotary_percent, rope_scaling=None if rs is None else {
            "yarn": lambda: ("yarn", rs.factor, rs.mscale, rs.mscale_all_dim, rs.original_max_position_embeddings,
                             rs.beta_fast, rs.beta_slow),
            "llama3": lambda: ("llama3", rs.factor, rs.low_freq_factor, rs.high_freq_factor,
                               rs.original_max_position_embeddings),
            "linear": lambda: ("linear", rs.factor)}[rs.type]())
    if m.is_moe:
        f.update(moe_topk=m.moe_topk, expert_ffn=m.expert_ffn, shared_experts=m.shared_experts,
                 moe_layers_at=tuple(i for i in range(m.layers) if m.is_moe_layer(i)),
                 moe_router_score=m.moe_router_score,
                 moe_router_norm_topk=m.moe_router_norm_topk, moe_router_expert_bias=m.moe_router_expert_bias,
                 moe_router_topk_scaling=m.moe_router_topk_scaling, moe_router_groups=m.moe_router_groups,
                 moe_router_group_topk=m.moe_router_group_topk)
    return f


def mismatches(expected: dict, got: dict) -> dict:
    return {k: (v, got.get(k, "<absent>")) for k, v in expected.items() if got.get(k, "<absent>") != v}


# The files plan --out writes -------------------------------------------------------------------------------
def _fixed_plan(model: ModelSpec, gpus: int) -> ParallelPlan:
    ep = next(e for e in (8, 4, 2, 1) if not model.num_experts or model.num_experts % e == 0) if model.is_moe else 1
    return ParallelPlan(tp=1, pp=1, dp=gpus, ep=ep, global_batch=gpus)


def written_args(tmp_path: Path, model: ModelSpec, cluster_name: str = "h100x512",
                 plan: ParallelPlan | None = None) -> str:
    cluster = load_cluster(cluster_name)
    out = tmp_path / f"{model.name}-{cluster_name}"
    write_outputs(out, model, cluster, plan or _fixed_plan(model, cluster.num_gpus), None)
    return (out / "megatron_args.txt").read_text()


@pytest.mark.parametrize("name", catalog_names())
def test_catalog_model_is_reproduced_flag_by_flag(tmp_path, name):
    model = catalog()[name]
    text = written_args(tmp_path, model)
    ns, lost = parse(text)
    assert lost == KNOWN_LOST.get(name, [])
    assert set(mismatches(spec_facts(model), megatron_facts(ns))) == KNOWN_MISMATCH.get(name, set())
    if model.is_moe:
        # The cost model prices grouped GEMMs (SequentialMLP would loop over the experts); Megatron has them in
        # bf16 only (fp8 / fp4 run with --bf16), so the fp32 CPU model gets a note instead.
        assert ns.moe_grouped_gemm == (model.precision != "fp32")
        assert ("# --moe-grouped-gemm left out: Megatron's grouped GEMM needs --bf16, the plan trains in fp32"
                in text) == (model.precision == "fp32")


@pytest.mark.parametrize("name,cluster_name", [("70b", "h100x512"), ("qwen3-30b-a3b", "h100x512"),
                                               ("mixtral-8x7b", "h100x512")])
def test_planned_plans_reproduce_the_model(tmp_path, name, cluster_name):
    from planner.search import exhaustive
    from costmodel.plan import default_global_batch

    model, cluster = catalog()[name], load_cluster(cluster_name)
    plan = exhaustive(model, cluster, default_global_batch(model.seq_len, cluster.num_gpus)).split_plan(0)
    ns, lost = parse(written_args(tmp_path, model, cluster_name, plan))
    assert lost == [] and mismatches(spec_facts(model), megatron_facts(ns)) == {}


# Hugging Face configs, read here without the planner's import ---------------------------------------------------
# Keys of the shipped configs that do not change the model a training run builds (token ids, serving settings,
# initialisation, the load-balancing loss weights passed like the learning rate, ep_size a serving hint, and
# max_position_embeddings: the trained sequence is the plan's).
HF_NOT_ARCHITECTURE = {"architectures", "bos_token_id", "eos_token_id", "initializer_range", "torch_dtype",
                       "transformers_version", "use_cache", "pretraining_tp", "output_router_logits",
                       "router_aux_loss_coef", "aux_loss_alpha", "ep_size", "max_position_embeddings"}


def hf_facts(cfg: dict) -> tuple[dict, set]:
    """(facts, keys read) of a Llama / Mixtral / DeepSeek-V3 config.json, as their modeling files define them."""
    read: set = set()

    def k(key, default=None):
        read.add(key)
        return cfg.get(key, default)

    mla = k("kv_lora_rank") is not None
    f = dict(layers=k("num_hidden_layers"), hidden=k("hidden_size"), ffn_hidden=k("intermediate_size"),
             heads=k("num_attention_heads"), tied_embeddings=k("tie_word_embeddings"),
             learned_position_embeddings=False, norm_epsilon=k("rms_norm_eps"), normalization="RMSNorm",
             activation={"silu": "swiglu"}[k("hidden_act")], linear_bias=k("attention_bias", False),
             attention_dropout=k("attention_dropout"), rotary_base=float(k("rope_theta")),
             qk_norm=mla,  # modeling_deepseek.py: q_a_layernorm and kv_a_layernorm on the latents
             mtp_layers=k("num_nextn_predict_layers", 0), model_type=k("model_type"))
    assert f["model_type"] in ("llama", "mixtral", "deepseek_v3")
    del f["model_type"]
    rs = k("rope_scaling")
    f["rope_scaling"] = None if rs is None else (rs["type"], rs["factor"], rs["mscale"], rs["mscale_all_dim"],
                                                 rs["original_max_position_embeddings"], rs["beta_fast"],
                                                 rs["beta_slow"])
    if mla:
        f.update(mla_kv_lora_rank=k("kv_lora_rank"), mla_q_lora_rank=k("q_lora_rank"),
                 head_width=k("qk_nope_head_dim"), mla_rope_dim=k("qk_rope_head_dim"), mla_v_head_dim=k("v_head_dim"))
        read.add("num_key_value_heads")  # unused by MLA
    else:
        f["kv_heads"] = k("num_key_value_heads")
    experts = k("num_local_experts") or k("n_routed_experts") or 0
    f["num_experts"] = experts
    if experts:
        freq = k("moe_layer_freq", 1)
        assert freq == 1
        method = k("topk_method", "greedy")
        f.update(moe_topk=k("num_experts_per_tok"), expert_ffn=k("moe_intermediate_size") or k("intermediate_size"),
                 shared_experts=k("n_shared_experts", 0),
                 moe_layers_at=tuple(range(k("first_k_dense_replace", 0), k("num_hidden_layers"))),
                 moe_router_score=k("scoring_func", "softmax"), moe_router_norm_topk=k("norm_topk_prob", True),
                 moe_router_expert_bias=method == "noaux_tc", moe_router_topk_scaling=k("routed_scaling_factor", 1.0),
                 moe_router_groups=k("n_group") if method == "noaux_tc" else None,
                 moe_router_group_topk=k("topk_group") if method == "noaux_tc" else None)
        assert k("sliding_window") is None
    read.add("vocab_size")  # the tokenizer's; checked below against the vocab note
    return f, read


@pytest.mark.parametrize("path", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_example_config_is_reproduced_key_by_key(tmp_path, path):
    cfg = json.loads(path.read_text())
    expected, read = hf_facts(cfg)
    # A key this test does not know is an architecture nobody checked: map it here (and in the import) first.
    assert set(cfg) - read - HF_NOT_ARCHITECTURE == set()
    model = from_hf_config(path, seq_len=4096)
    text = written_args(tmp_path, model)
    ns, lost = parse(text)
    assert lost == []
    assert mismatches(expected, megatron_facts(ns)) == {}
    assert f"--vocab-size {cfg['vocab_size']}" in text


def test_a_family_the_planner_does_not_express_fails(tmp_path):
    # Gemma-2-like under a family the import does not know (Gemma 3's text model): logit soft-capping and the rest.
    # The facts end up in the '# not expressed' line, so the assertions the shipped models pass fail for it.
    p = tmp_path / "gemma3" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps({
        "model_type": "gemma3_text", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
        "vocab_size": 256000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
        "sliding_window": 4096}))
    model = from_hf_config(p)
    ns, lost = parse(written_args(tmp_path, model))
    assert lost[0].startswith("model_type 'gemma3_text': an architecture the planner does not know")
    assert {"config key 'attn_logit_softcapping'=50.0 (no mapping)", "config key 'hidden_activation'="
            "'gelu_pytorch_tanh' (no mapping)", "sliding-window attention of 4096 tokens"} <= set(lost)
    assert lost != KNOWN_LOST.get(model.name, [])


def test_facts_no_flag_states_are_named(tmp_path):
    base = catalog()["70b"]
    odd = ModelSpec.model_validate({**base.model_dump(), "rotary_base": 12345.5, "activation": "geglu",
                                    "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                                     "original_max_position_embeddings": 8192}})
    _, lost = parse(written_args(tmp_path, odd))
    assert lost == ["rotary base 12345.5 (Megatron's --rotary-base takes an integer)",
                    "llama3 rope scaling low_freq_factor=2.0 (Megatron fixes 1.0)",
                    "activation geglu (Megatron-LM has --swiglu, --squared-relu, --quick-geglu and GELU)"]
    moe = catalog()["gpt-oss-120b"]
    args = megatron_args(moe, ParallelPlan(tp=2, pp=1, dp=4, ep=4, etp=2, global_batch=8))
    assert "--disable-bias-linear" in args
    assert "linear biases (Megatron has MoE biases only with expert-tensor-parallel-size 1, the plan has etp=2)" \
        in parse("\n".join(args))[1]


# Precision and the GPU ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision,present,absent", [
    ("fp32", [], ["--bf16", "--fp16", "--moe-grouped-gemm"]),
    ("fp16", ["--fp16", "--initial-loss-scale"], ["--bf16", "--moe-grouped-gemm"]),
    ("bf16", ["--bf16", "--moe-grouped-gemm"], ["--fp16", "--fp8-format", "--fp4-format"]),
    ("fp8", ["--bf16", "--fp8-format", "--fp8-recipe", "--moe-grouped-gemm", "--fp8-param-gather"],
     ["--fp4-format", "--reuse-grad-buf-for-mxfp8-param-ag"]),
    ("mxfp8", ["--bf16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag"],
     ["--fp4-format"]),
    ("nvfp4", ["--bf16", "--fp4-format", "--fp4-recipe"], ["--fp8-format", "--fp8-param-gather"]),
])
def test_precision_flags_follow_the_plan(precision, present, absent):
    model = catalog()["mixtral-8x7b"].model_copy(update={"precision": precision})
    args = megatron_args(model, ParallelPlan(tp=2, pp=1, dp=4, ep=4, global_batch=8))
    names = {a.split()[0] for a in args if not a.startswith("#")}
    assert set(present) <= names and not set(absent) & names
    ns, lost = parse("\n".join(args))
    assert megatron_facts(ns)["precision"] == precision and lost == []
    assert (ns.fp8_recipe, ns.fp4_recipe) == {"fp8": ("tensorwise", "nvfp4"), "mxfp8": ("mxfp8", "nvfp4")}.get(
        precision, ("delayed", "nvfp4"))
    if precision == "fp16":
        assert ns.loss_scale is None and ns.initial_loss_scale == 2 ** 32  # dynamic loss scaling


def test_pre_ampere_gpus_get_no_transformer_engine_option(tmp_path):
    model = catalog()["13b"].model_copy(update={"precision": "fp16"})
    plan = ParallelPlan(tp=2, pp=1, dp=32, global_batch=64)
    v100 = parse(written_args(tmp_path, model, "v100-dgx2x64", plan))[0]
    assert v100.transformer_impl == "local" and not v100.tp_comm_overlap and v100.fp16
    a100 = parse(written_args(tmp_path, model, "a100x1024", plan.model_copy(update={"dp": 512})))[0]
    assert a100.transformer_impl == "transformer_engine" and a100.tp_comm_overlap
    # the mixed A100 + V100 cluster runs one job: the V100 nodes decide
    from planner.outputs import transformer_engine_runs
    assert not transformer_engine_runs(load_cluster("a100-v100-mixed"))
    with pytest.raises(InputError, match="precision fp8 needs Transformer Engine"):
        megatron_args(model.model_copy(update={"precision": "fp8"}), plan, transformer_engine=False)
    moe = megatron_args(catalog()["mixtral-8x7b"], ParallelPlan(tp=2, pp=1, dp=4, ep=4, global_batch=8),
                        transformer_engine=False)
    assert "--moe-grouped-gemm" not in moe and any("grouped GEMM needs compute capability 8.0" in a for a in moe)


# megatron-core accepts the architecture as the flags state it ---------------------------------------------------
@pytest.mark.parametrize("name", ["70b", "405b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b",
                                  "gpt-oss-120b", "nemotron4-340b", "llama4-maverick"])
def test_megatron_core_builds_the_config_the_flags_state(tmp_path, name):
    pytest.importorskip("megatron.core")
    torch = pytest.importorskip("torch")
    import warnings

    from megatron.core.activations import squared_relu
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    ns, _ = parse(written_args(tmp_path, catalog()[name]))
    # core_transformer_config_from_args, for the fields the flags above set.
    kw = dict(num_layers=ns.num_layers, hidden_size=ns.hidden_size, ffn_hidden_size=ns.ffn_hidden_size,
              num_attention_heads=ns.num_attention_heads, kv_channels=ns.kv_channels,
              num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
              normalization=ns.normalization, layernorm_epsilon=ns.norm_epsilon,
              layernorm_zero_centered_gamma=ns.apply_layernorm_1p, qk_layernorm=ns.qk_layernorm,
              add_bias_linear=ns.add_bias_linear, add_qkv_bias=ns.add_qkv_bias or ns.add_bias_linear,
              hidden_dropout=ns.hidden_dropout, attention_dropout=ns.attention_dropout,
              activation_func_clamp_value=ns.activation_func_clamp_value, glu_linear_offset=ns.glu_linear_offset,
              # rope fusion needs Transformer Engine, absent on this CPU machine, except in MLA's YaRN path
              apply_rope_fusion=ns.apply_rope_fusion and bool(ns.multi_latent_attention),
              mtp_num_layers=ns.mtp_num_layers, params_dtype=torch.bfloat16)
    if ns.swiglu:
        kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    elif ns.squared_relu:
        kw.update(activation_func=squared_relu)
    elif ns.quick_geglu:
        kw.update(gated_linear_unit=True, activation_func=quick_gelu)
    if ns.num_experts:
        kw.update(num_moe_experts=ns.num_experts, moe_router_topk=ns.moe_router_topk,
                  moe_ffn_hidden_size=ns.moe_ffn_hidden_size, moe_layer_freq=ns.moe_layer_freq,
                  moe_shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
                  moe_router_score_function=ns.moe_router_score_function,
                  moe_router_pre_softmax=ns.moe_router_pre_softmax,
                  moe_router_enable_expert_bias=ns.moe_router_enable_expert_bias,
                  moe_router_topk_scaling_factor=ns.moe_router_topk_scaling_factor,
                  moe_router_num_groups=ns.moe_router_num_groups, moe_router_group_topk=ns.moe_router_group_topk,
                  moe_grouped_gemm=ns.moe_grouped_gemm, moe_token_dispatcher_type="alltoall")
    cls = TransformerConfig
    if ns.multi_latent_attention:
        cls = MLATransformerConfig
        kw.update(q_lora_rank=ns.q_lora_rank, kv_lora_rank=ns.kv_lora_rank, qk_head_dim=ns.qk_head_dim,
                  qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim,
                  rotary_base=ns.rotary_base, rotary_scaling_factor=ns.rotary_scaling_factor, mscale=ns.mscale,
                  mscale_all_dim=ns.mscale_all_dim, **({"rope_type": ns.rope_type} if ns.rope_type else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = cls(**{k: v for k, v in kw.items() if v is not None or k == "num_query_groups"})
    model = catalog()[name]
    assert (cfg.layernorm_epsilon, cfg.qk_layernorm, cfg.add_bias_linear) == (model.norm_epsilon, model.qk_norm,
                                                                               model.linear_bias)
    if model.is_moe:
        assert cfg.moe_router_score_function == model.moe_router_score and cfg.moe_grouped_gemm
