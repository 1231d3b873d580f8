"""Pipeline send/recv exposure: Megatron overlaps it with compute only in the interleaved schedule."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import FRAMEWORK, estimate_arrays
from costmodel.plan import PlanArrays
from costmodel.profiles import load_cluster, load_profile

MODEL = get_model("llama3-70b")
CLUSTER = load_cluster("b200x1024")
PROF = load_profile(CLUSTER.gpu)


def _run(vpp, framework="megatron-core"):
    plans = PlanArrays.from_columns(tp=8, pp=8, vpp=np.asarray(vpp, dtype=float), dp=4, micro_batch=1,
                                    global_batch=256, recompute=0)
    return estimate_arrays(MODEL, CLUSTER, plans, profile=PROF, framework=framework)


def test_non_interleaved_hops_are_fully_exposed():
    out = _run([1.0, 2.0])
    hop = out["details"]["p2p_s"]
    m = 256 / 4
    ce = PROF.calibration.comm_exposed
    # vpp 1: both hops per micro-batch wait on the blocking send/recv ...
    assert out["pp_comm_exposed_s"][0] == pytest.approx(m * 2 * hop[0] * ce, rel=1e-12)
    # ... with virtual stages overlap_p2p_comm hides the framework's share of 2*vpp hops.
    share = FRAMEWORK["megatron-core"]["p2p_exposed"]
    assert share < 1.0
    assert out["pp_comm_exposed_s"][1] == pytest.approx(m * 2 * 2 * hop[1] * share * ce, rel=1e-12)
    # Per chunk an interleaved hop costs the share, a non-interleaved one all of it.
    assert out["pp_comm_exposed_s"][0] / 1 > out["pp_comm_exposed_s"][1] / 2


def test_hops_cross_the_network_on_hgx():
    # tp8 x dp4 puts the next stage 32 ranks away: 4 nodes on, over InfiniBand, so the hop is the NIC time of
    # one 8k x 8192 bf16 activation (tensor-parallel shard with SP) at about 46 GB/s plus fixed costs.
    out = _run([1.0])
    act_bytes = MODEL.seq_len * MODEL.hidden * 2 / 8
    assert out["details"]["p2p_s"][0] > act_bytes / CLUSTER.inter_node.nic_bandwidth_bytes_per_s


def test_tp_overlap_cannot_hide_more_than_the_gemms_last():
    """megatron-core hides tensor-parallel collectives behind the layer's GEMMs, leaving its share showing;
    with GEMMs 4x faster (same links) the forward's collectives outlast its GEMMs and the rest shows too."""
    model, cluster = get_model("llama3-8b"), load_cluster("h100x512")
    prof = load_profile("H100")
    fast = prof.model_copy(update={"peak_flops": {k: v.model_copy(update={"value": v.value * 4})
                                                  for k, v in prof.peak_flops.items()}})
    plans = PlanArrays.from_columns(tp=8, pp=1, vpp=1, dp=64, micro_batch=1, global_batch=64, recompute=0)
    share = FRAMEWORK["megatron-core"]["tp_exposed"]
    for p, grows in ((prof, False), (fast, True)):
        out = estimate_arrays(model, cluster, plans, profile=p)
        d = out["details"]
        t_tp, gemm_f = d["tp_comm_s"][0], d["attn_proj_s"][0] + d["mlp_dense_s"][0]
        ce = p.calibration.comm_exposed
        per_layer = share * t_tp * ce
        expected_f = max(share * t_tp, t_tp - gemm_f) * ce
        expected_b = max(share * t_tp, t_tp - 2 * gemm_f) * ce
        assert bool(t_tp > gemm_f) == grows
        assert out["tp_comm_exposed_s"][0] == pytest.approx(model.layers * (expected_f + expected_b), rel=1e-9)
        if grows:
            assert out["tp_comm_exposed_s"][0] > 1.5 * model.layers * 2 * per_layer
