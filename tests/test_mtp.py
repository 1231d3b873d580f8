"""Multi-token prediction (DeepSeek-V3's MTP module): FLOPs, last-stage time and memory, Megatron flags and
layouts, the stage split the planner solves, and how `plan validate` fills it for published runs."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays, megatron_layout
from costmodel.flops import layer_forward_flops, model_flops_per_step
from costmodel.profiles import InputError, load_cluster
from costmodel.validate import framework_split, row_model
from planner.outputs import megatron_args
from costmodel.split import best_split

DSV3 = get_model("deepseek-v3")
NO_MTP = DSV3.model_copy(update={"mtp_layers": 0})
B200 = load_cluster("b200x1024.yaml")


def test_catalog_deepseek_v3_has_one_mtp_module():
    assert DSV3.mtp_layers == 1
    assert get_model("70b").mtp_layers == 0


def test_flops_add_one_moe_layer_projection_and_logits():
    gbs = 1024
    tokens = gbs * DSV3.seq_len
    f = layer_forward_flops(DSV3, tokens, DSV3.seq_len, moe=True, causal=False)
    extra = 3.0 * (f["gemm"] + f["expert"] + f["attn"] + 2.0 * tokens * 2 * DSV3.hidden ** 2
                   + 2.0 * tokens * DSV3.hidden * DSV3.vocab)
    diff = float(model_flops_per_step(DSV3, gbs) - model_flops_per_step(NO_MTP, gbs))
    assert diff == pytest.approx(extra, rel=1e-12)
    # One more MoE layer (of 61) and a second pass through the 129k-vocab LM head: 3.8% more model FLOPs
    # for DeepSeek-V3 at 4k.
    assert diff / float(model_flops_per_step(NO_MTP, gbs)) == pytest.approx(0.038, abs=0.001)


def test_mtp_lands_on_the_last_stage_only():
    plan = ParallelPlan(pp=16, dp=8, ep=8, global_batch=1024, layers_per_stage=(4,) * 15 + (1,))
    with_mtp, without = estimate(DSV3, B200, plan), estimate(NO_MTP, B200, plan)
    t1, t0 = with_mtp.stage_time_s, without.stage_time_s
    assert t1[:-1] == pytest.approx(t0[:-1], rel=1e-12)
    # The module is one more MoE layer, a 2h->h GEMM and a second LM head + loss: more than one MoE
    # layer of a middle stage (4 layers there), less than the whole middle stage.
    one_layer = t0[1] / 4
    assert one_layer < t1[-1] - t0[-1] < 4 * one_layer
    m1, m0 = with_mtp.peak_memory_bytes, without.peak_memory_bytes
    assert m1[:-1] == pytest.approx(m0[:-1], rel=1e-12)
    assert m1[-1] > m0[-1] + 1e9      # the module's weights, optimizer state, activations, logits


def test_planner_split_moves_layers_off_the_mtp_stage():
    plan = ParallelPlan(pp=16, dp=8, ep=8, global_batch=1024, recompute="selective")
    with_mtp = best_split(DSV3, B200, plan, memory=False).layers_per_stage
    without = best_split(NO_MTP, B200, plan, memory=False).layers_per_stage
    assert sum(with_mtp) == sum(without) == 61
    assert with_mtp[-1] < without[-1]


def test_megatron_flags_and_layout_carry_the_mtp_module():
    plan = ParallelPlan(pp=16, dp=8, ep=8, global_batch=1024, layers_per_stage=(4,) * 15 + (1,))
    args = megatron_args(DSV3, plan)
    assert "--mtp-num-layers 1" in args
    layout = next(a for a in args if a.startswith("--pipeline-model-parallel-layout"))
    assert layout.endswith("tmL")
    assert megatron_layout((2, 4), vpp=2, mtp=1) == "Et|t*2|t|t*2mL"
    assert "--mtp-num-layers 1" not in megatron_args(NO_MTP, plan.model_copy(update={"layers_per_stage": None,
                                                                                       "pp": 1, "dp": 128}))
    with pytest.raises(InputError, match="MTP"):
        megatron_args(NO_MTP, plan, layout="Et*4|(t*4|)*14,tmL")


def test_framework_split_follows_megatron_bridge_deepseek_layouts():
    # recipes/deepseek/deepseek_v3.py: pp16 -> 4 x 15 and 1; pp8 -> 8 x 7 and 5; pp4 -> 16, 16, 16, 13.
    assert framework_split(61, 16, 1) == (4,) * 15 + (1,)
    assert framework_split(61, 8, 1) == (8,) * 7 + (5,)
    assert framework_split(61, 4, 1) == (16, 16, 16, 13)
    # (8, 2) and (4, 4) are the pp16 virtual stages folded onto the ranks.
    assert framework_split(61, 8, 2) == (8,) * 7 + (5,)
    assert framework_split(61, 4, 4) == (16, 16, 16, 13)
    # Counting the embedding and loss as layers divides: Megatron's even split, nothing to fill.
    assert framework_split(126, 8, 4) is None
    assert framework_split(80, 4, 5) is None and framework_split(61, 1, 1) is None


def test_validate_reads_mtp_from_the_row_name():
    row = {"model_name": "DeepSeek-V3 (w/o MTP)", "layers": "61", "hidden": "7168", "heads": "128",
           "seq_len": "4096", "moe_experts": "256", "moe_topk": "8", "ffn_hidden": "2048", "kv_heads": "",
           "vocab": "129280", "precision": "mxfp8", "notes": ""}
    assumed: list[str] = []
    assert row_model(row, assumed).mtp_layers == 0
    row["model_name"] = "DeepSeek-V3"
    assumed = []
    assert row_model(row, assumed).mtp_layers == 1
    assert "mtp_layers=1 (the model's default)" in assumed


def test_vectorised_and_single_estimates_agree_with_mtp():
    plans = [ParallelPlan(pp=16, dp=8, ep=8, global_batch=1024, layers_per_stage=(4,) * 15 + (1,)),
             ParallelPlan(pp=8, vpp=2, dp=4, ep=32, global_batch=1024, layers_per_stage=(8,) * 7 + (5,))]
    out = estimate_arrays(DSV3, B200, PlanArrays.from_plans(plans))
    for i, p in enumerate(plans):
        assert out["step_time_s"][i] == pytest.approx(estimate(DSV3, B200, p).step_time_s, rel=1e-12)
        assert np.nanmax(out["peak_memory_bytes"][i]) == pytest.approx(
            max(estimate(DSV3, B200, p).peak_memory_bytes), rel=1e-12)


def test_executor_refuses_to_build_mtp_modules():
    from executor.model import build_chunks

    with pytest.raises(InputError, match="mtp_layers=1"):
        build_chunks(DSV3, ParallelPlan(pp=1, dp=1, global_batch=8), None, vocab_size=DSV3.vocab)
