"""Scale terms (costmodel/scale.py): the slowest of N GPUs, NCCL's latency over many nodes, DDP buckets, and
how estimate_arrays and the heterogeneous estimate charge them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from costmodel import scale
from costmodel.catalog import get_model
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import load_cluster

H100 = load_cluster("h100x512")


def _expected_max(n: int) -> float:
    """E[max of n standard normals] = integral of x n Phi(x)^(n-1) phi(x) dx."""
    x = np.linspace(-12.0, 12.0, 400_001)
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    return float(np.trapezoid(x * n * ndtr(x) ** (n - 1) * pdf, x))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 12, 100, 512, 3000, 8192, 10000, 16384, 2**20])
def test_expected_max_matches_the_integral(n):
    assert float(scale.expected_max_std_normal(n)) == pytest.approx(_expected_max(n), abs=0.012)


def test_expected_max_grows_like_sqrt_2_ln_n():
    n = np.array([2.0**20, 2.0**21, 2.0**24])
    got = scale.expected_max_std_normal(n)
    assert np.all(np.diff(got) > 0)
    # Beyond the table it follows sqrt(2 ln n), continuous at 2^20 (4.8723).
    assert float(got[0]) == pytest.approx(4.8723, abs=1e-9)
    assert float(got[2] - got[0]) == pytest.approx(np.sqrt(2 * np.log(2.0**24)) - np.sqrt(2 * np.log(2.0**20)))


def test_straggler_fraction_by_hand():
    """sigma 1.5% (Sinha et al. 2022: 8% spread over non-outlier GPUs = 5.4 sigma) times E[max]: 2.14% at 8 GPUs
    (1.4236), 4.57% at 512 (3.0439), 5.70% at 8,192 (3.8023), 5.96% at 16,384 (3.9714); none on one GPU."""
    got = scale.straggler_fraction(np.array([1, 8, 512, 8192, 16384]))
    assert got == pytest.approx([0.0, 0.015 * 1.4236, 0.015 * 3.0439, 0.015 * 3.8023, 0.015 * 3.9714], rel=1e-9)


def test_nccl_latency_by_hand():
    """NCCL tuning model, Ring/Simple: 8.4 us + 3.4 us per NVLink step + 9.6 us per network step."""
    # Reduce-scatter over one 8-GPU node: 7 NVLink steps.
    assert float(scale.nccl_latency_s("reduce_scatter", 8, 1)) == pytest.approx((8.4 + 7 * 3.4) * 1e-6)
    # Over 64 nodes, one rank each: 63 network steps = 613.2 us.
    assert float(scale.nccl_latency_s("all_gather", 64, 64)) == pytest.approx((8.4 + 63 * 9.6) * 1e-6)
    # Over 16 nodes of 8: 127 steps, 15 across the network.
    assert float(scale.nccl_latency_s("reduce_scatter", 128, 16)) == pytest.approx((8.4 + 112 * 3.4 + 15 * 9.6) * 1e-6)
    # All-reduce over 64 nodes: ring 8.4 + 126 x 9.6 = 1218 us, tree 2 x log2(64) x 50 = 600 us -> the tree.
    assert float(scale.nccl_latency_s("all_reduce", 64, 64)) == pytest.approx(600e-6)
    # Inside one node the all-reduce stays on the ring: 8.4 + 14 x 3.4 us.
    assert float(scale.nccl_latency_s("all_reduce", 8, 1)) == pytest.approx((8.4 + 14 * 3.4) * 1e-6)
    assert float(scale.nccl_latency_s("all_gather", 1, 1)) == 0.0


def test_ddp_buckets_by_hand():
    # megatron-core: max(40M, 1M x dp) parameters per bucket. 405B at tp8 pp16: 3.17e9 parameters per rank.
    assert scale.ddp_buckets(np.array([3.17e9, 3.17e9, 1e6]), np.array([64, 8, 8])) == pytest.approx([50, 80, 1])


def test_estimate_charges_the_straggler_on_the_pipeline():
    model = get_model("70b")
    plans = [ParallelPlan(tp=4, pp=4, vpp=5, dp=32, micro_batch=1, global_batch=512),
             ParallelPlan(tp=8, pp=1, dp=8, micro_batch=1, global_batch=64, recompute="full")]
    cluster = [H100, H100.model_copy(update={"nodes": 8})]
    for plan, cl in zip(plans, cluster):
        out = estimate_arrays(model, cl, PlanArrays.from_plans([plan]))
        world = plan.tp * plan.pp * plan.dp * plan.cp
        assert out["straggler_s"][0] == pytest.approx(float(scale.straggler_fraction(world)) * out["pipeline_s"][0])
        est = estimate(model, cl, plan)
        assert est.breakdown_s["straggler"] == pytest.approx(out["straggler_s"][0], rel=1e-12)


def test_dp_bucket_latency_grows_with_the_ring(monkeypatch):
    """The gradient buckets' NCCL latency is charged once per bucket: taking it out leaves the step shorter by
    at most (buckets x latency) of the reduce-scatter plus the all-gather, and not at all inside one node."""
    model = get_model("70b")
    plan = ParallelPlan(tp=8, pp=1, dp=64, micro_batch=1, global_batch=512, recompute="full")
    with_lat = estimate(model, H100, plan)
    monkeypatch.setattr(scale, "nccl_latency_s", lambda c, size, n: 0.0 * np.asarray(size, dtype=float))
    without = estimate(model, H100, plan)
    p_rank = 70.55e9 / 8     # parameters per rank (tp8), about
    bound = float(scale.ddp_buckets(p_rank, 64)) * 2 * (8.4 + 63 * 9.6) * 1e-6
    diff = with_lat.step_time_s - without.step_time_s
    assert 0.0 < diff <= bound * 1.05


def test_llama3_published_layout_example_predicts_every_row():
    """examples/scale_405b/llama3_layout.csv (the README's scale section): Meta's 405B layout at 8,192 and 16,384
    H100 with vpp 1, 2, 4 on a non-Megatron stack and on megatron-core. Every row is predicted and fits; no row
    has a step time (nothing is scored). Deeper interleaving shortens the bubble, and megatron-core's overlaps
    make each layout faster than the same layout on the other stack."""
    from pathlib import Path

    from costmodel.validate import load_cases, predict_case

    cases, errors = load_cases(Path(__file__).parent.parent / "examples" / "scale_405b" / "llama3_layout.csv",
                               unpublished=True)
    assert not errors and len(cases) == 12
    step = {}
    for c in cases:
        out = predict_case(c)
        assert out["fits"] and np.isnan(c.published_step_time_s)
        step[(c.cluster.num_gpus, c.plan.framework, c.plan.vpp)] = out["predicted_step_time_s"]
    for gpus in (8192, 16384):
        for fw in ("other", "megatron-core"):
            assert step[(gpus, fw, 1)] > step[(gpus, fw, 2)] > step[(gpus, fw, 4)]
        for vpp in (1, 2, 4):
            assert 1.05 < step[(gpus, "other", vpp)] / step[(gpus, "megatron-core", vpp)] < 1.2
    assert step[(8192, "megatron-core", 4)] == pytest.approx(10.44, rel=0.01)
