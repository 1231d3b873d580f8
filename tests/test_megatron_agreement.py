"""Megatron itself agrees with the planner: megatron-core 0.16.1 (CPU, no GPU needed) accepts the
TransformerConfig built from the planner's top plans, parses the emitted pipeline layout into the same stage
split, and rejects what the project rejects where megatron-core checks the rule.

Skipped where megatron-core is not installed (it comes with the `executor` extra; .ci/run installs it).
"""

from __future__ import annotations


import pytest

megatron = pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

from megatron.core.transformer.enums import LayerType  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402

from costmodel.catalog import get_model  # noqa: E402
from costmodel.profiles import load_cluster  # noqa: E402
from costmodel.rules import violations  # noqa: E402
from costmodel.plan import ParallelPlan, default_global_batch, megatron_layout  # noqa: E402
from costmodel.specs import ModelSpec  # noqa: E402
from executor.model import megatron_config  # noqa: E402  (the executor's own config builder)
from planner.outputs import megatron_args  # noqa: E402
from planner.search import exhaustive  # noqa: E402


CASES = [("70b", "h100x512"), ("gpt3-175b", "a100x1024"), ("405b", "h100x16384"), ("mixtral-8x7b", "h100x512"),
         ("qwen3-30b-a3b", "gb200-nvl72x8"), ("deepseek-v3", "gb200-nvl72x8")]


def top_plans(model_name: str, cluster_name: str, k: int = 3) -> tuple[ModelSpec, list[ParallelPlan]]:
    model, cluster = get_model(model_name), load_cluster(cluster_name)
    res = exhaustive(model, cluster, default_global_batch(model.seq_len, cluster.num_gpus))
    assert res.any_fits
    plans = []
    for rank in range(min(k, len(res.order))):
        order0 = res.order.copy()
        res.order = order0[rank:]
        plans.append(res.split_plan(0))
        res.order = order0
    return model, plans


@pytest.mark.parametrize("model_name,cluster_name", CASES)
def test_megatron_accepts_top_plans(model_name, cluster_name):
    model, plans = top_plans(model_name, cluster_name)
    for plan in plans:
        assert violations(model, plan, load_cluster(cluster_name).num_gpus) == []
        cfg = megatron_config(model, plan)  # raises if Megatron rejects the plan
        assert cfg.tensor_model_parallel_size == plan.tp and cfg.pipeline_model_parallel_size == plan.pp


def decoder_layers_per_rank(layout: PipelineParallelLayerLayout, pp: int) -> tuple[int, ...]:
    return tuple(sum(chunk.count(LayerType.decoder) for chunk in layout.layout[r]) for r in range(pp))


@pytest.mark.parametrize("split,vpp", [((7, 8, 8, 7), 1), ((3,) + (4,) * 30 + (3,), 1), ((6, 8, 8, 8, 8, 8, 8, 8, 8, 8,
                                       8, 8, 8, 8, 8, 6), 2), ((2, 4), 2), ((7,) + (8,) * 14 + (7,), 1)])
def test_megatron_parses_layout_into_the_same_split(split, vpp):
    layout = PipelineParallelLayerLayout(megatron_layout(split, vpp), len(split))
    assert decoder_layers_per_rank(layout, len(split)) == tuple(split)


def test_planner_uneven_405b_layout_round_trips_through_megatron():
    model, plans = top_plans("405b", "h100x16384", k=1)
    plan = plans[0]
    assert plan.layers_per_stage is not None and sum(plan.layers_per_stage) == 126
    cfg = megatron_config(model, plan)
    layout = cfg.pipeline_model_parallel_layout
    if isinstance(layout, str):
        layout = PipelineParallelLayerLayout(layout, plan.pp)
    assert decoder_layers_per_rank(layout, plan.pp) == tuple(plan.layers_per_stage)


@pytest.mark.parametrize("change", [dict(tp=3), dict(tp=5), dict(tp=128)])
def test_rejected_by_both(change):
    """Rules megatron-core's TransformerConfig checks: heads divisible by tp (and query groups by tp)."""
    model = get_model("70b")
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512).model_copy(update=change)
    assert violations(model, plan) != []
    with pytest.raises((ValueError, AssertionError)):
        megatron_config(model, plan)


@pytest.mark.parametrize("name", ["70b", "gpt3-175b", "nemotron4-340b", "gpt-oss-120b", "qwen3-30b-a3b", "deepseek-v3"])
def test_executor_config_has_the_architecture_the_flags_give(name):
    """What `plan run` builds is the model the emitted Megatron-LM flags describe: norm, qk-norm, activation,
    biases, dropout and the MoE router as Megatron-LM's arguments would set them."""
    model = get_model(name)
    plan = ParallelPlan(tp=8, pp=1, ep=8 if model.is_moe else 1, dp=8, global_batch=64)
    flags = " ".join(megatron_args(model, plan)) + " "
    cfg = megatron_config(model, plan)
    assert cfg.normalization == ("RMSNorm" if "--normalization RMSNorm " in flags else "LayerNorm")
    assert cfg.qk_layernorm == ("--qk-layernorm " in flags)
    assert cfg.add_bias_linear == ("--disable-bias-linear " not in flags)
    assert cfg.add_qkv_bias == ("--add-qkv-bias " in flags)
    act = {"--swiglu ": ("silu", True), "--squared-relu ": ("squared_relu", False), "--quick-geglu ": ("quick_gelu", True)}
    expected = next((v for k, v in act.items() if k in flags), ("gelu", cfg.gated_linear_unit))
    assert (cfg.activation_func.__name__, cfg.gated_linear_unit) == expected
    assert f"--norm-epsilon {cfg.layernorm_epsilon:g} " in flags
    assert f"--attention-dropout {cfg.attention_dropout:g} " in flags
    if model.is_moe:
        assert f"--moe-router-score-function {cfg.moe_router_score_function} " in flags
        assert cfg.moe_router_enable_expert_bias == ("--moe-router-enable-expert-bias " in flags)
        assert cfg.moe_router_pre_softmax == ("--moe-router-pre-softmax " in flags)
        if cfg.moe_router_num_groups:
            assert f"--moe-router-num-groups {cfg.moe_router_num_groups} " in flags


def test_token_drop_flags_and_config_agree():
    """--moe-token-drop: the emitted flags and the config `plan run` builds both set capacity factor 1.0 with
    padding to capacity; a dropless model sets neither."""
    model = get_model("qwen3-30b-a3b")
    plan = ParallelPlan(tp=1, pp=1, ep=8, dp=8, global_batch=64)
    dropless = " ".join(megatron_args(model, plan)) + " "
    assert "--moe-expert-capacity-factor" not in dropless
    assert megatron_config(model, plan).moe_expert_capacity_factor is None
    drop = model.model_copy(update={"moe_token_drop": True})
    flags = " ".join(megatron_args(drop, plan)) + " "
    assert "--moe-expert-capacity-factor 1.0 " in flags and "--moe-pad-expert-input-to-capacity " in flags
    cfg = megatron_config(drop, plan)
    assert cfg.moe_expert_capacity_factor == 1.0 and cfg.moe_pad_expert_input_to_capacity is True
