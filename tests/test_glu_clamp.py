"""A clamped GLU (gpt-oss's swiglu_limit, ModelSpec.activation_clamp) costs the clamp and concatenation passes
megatron-core runs outside its fused activation kernel (costmodel/estimate.py GLU_CLAMP_ELEMENTS): 8 x ffn more
elements per token through HBM in the forward, twice that in the backward, in routed experts and dense MLPs alike;
an unclamped or ungated MLP pays nothing more."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import compute
from costmodel.catalog import get_model
from costmodel.estimate import GLU_CLAMP_ELEMENTS, estimate_arrays
from costmodel.plan import PlanArrays
from costmodel.profiles import load_cluster, load_profile

CLUSTER = load_cluster("b200x1024")
PROF = load_profile(CLUSTER.gpu)
BF16_BYTES = 2.0


def _details(model, **cols) -> dict:
    plans = PlanArrays.from_columns(**{"tp": 1, "pp": 1, "dp": 8, "global_batch": 512, "recompute": 0,
                                       "micro_batch": 4, **cols})
    return estimate_arrays(model, CLUSTER, plans, profile=PROF)["details"]


def _hbm_s(elements: float) -> float:
    return float(compute.memory_bound_time_s(PROF, BF16_BYTES * elements))


def test_gpt_oss_experts_pay_the_clamp_passes():
    clamped = get_model("gpt-oss-120b")
    assert clamped.activation_clamp == 7.0 and clamped.gated_mlp
    plain = clamped.model_copy(update={"activation_clamp": None})
    on, off = _details(clamped, ep=8), _details(plain, ep=8)
    assert np.all(on["layer_moe_fwd_s"] > on["moe_host_s"])       # GPU-bound, the host floor does not hide it
    tokens = 4 * clamped.seq_len
    extra = _hbm_s(tokens * clamped.moe_topk * GLU_CLAMP_ELEMENTS * clamped.expert_ffn) * PROF.calibration.moe_overhead
    assert on["layer_moe_fwd_s"] - off["layer_moe_fwd_s"] == pytest.approx(extra, rel=1e-6)
    assert on["layer_moe_bwd_s"] - off["layer_moe_bwd_s"] == pytest.approx(2 * extra, rel=1e-6)
    # About a tenth of a gpt-oss MoE layer on B200 at micro-batch 4.
    assert 0.05 < extra / off["layer_moe_fwd_s"][0] < 0.2


def test_a_dense_clamped_glu_pays_them_too_and_an_ungated_mlp_does_not():
    llama = get_model("8b")
    clamped = llama.model_copy(update={"activation_clamp": 7.0})
    on, off = _details(clamped), _details(llama)
    extra = _hbm_s(4 * llama.seq_len * GLU_CLAMP_ELEMENTS * llama.ffn_hidden)
    assert on["layer_dense_fwd_s"] - off["layer_dense_fwd_s"] == pytest.approx(extra, rel=1e-6)
    gpt = get_model("gpt3-175b")
    assert not gpt.gated_mlp
    same = _details(gpt.model_copy(update={"activation_clamp": 7.0}), tp=8, dp=1, global_batch=64, micro_batch=1)
    base = _details(gpt, tp=8, dp=1, global_batch=64, micro_batch=1)
    assert same["layer_dense_fwd_s"] == pytest.approx(base["layer_dense_fwd_s"], rel=1e-12)
