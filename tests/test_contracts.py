"""Contracts the cost model must keep whatever its constants are.

(a) step time never rises when a bandwidth rises (NIC, NVLink, HBM);
(b) per-GPU weight memory never rises when tp or pp rises (dp shrinks to keep the world size);
(c) a plan that fits keeps fitting when GPU memory grows;
(d) step time never rises when peak FLOP/s rises;
(e) StepEstimate is consistent: lower <= step <= upper, breakdown >= 0, 0 < mfu < 1.

Checked three ways: fixed (model, cluster, plan) cases through ``estimate`` (one column per stage),
every valid plan of each case's model and cluster at once through ``estimate_arrays`` (the
three-representative-stage path the planner uses), and hypothesis draws of valid 70B plans on
h100x512 with the framework / optimizer knobs varied.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from costmodel.catalog import get_model
from costmodel.estimate import BREAKDOWN_KEYS, estimate, estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays, default_global_batch
from costmodel.profiles import HardwareProfile, load_cluster, load_profile
from costmodel.rules import violations
from costmodel.specs import ClusterSpec, StepEstimate
from planner.search import to_plan
from planner.space import valid_plans

RTOL = 1e-9   # "never rises": allow float noise only

# (id, model, cluster, global batch, plan degrees)
CASES = [
    ("70b-h100x512", "70b", "h100x512", 512,
     dict(tp=4, pp=4, vpp=5, dp=32, micro_batch=1, recompute="selective")),
    ("70b-h100x512-cp2-full", "70b", "h100x512", 512,
     dict(tp=8, pp=4, dp=8, cp=2, micro_batch=1, recompute="full")),
    ("70b-gb200", "70b", "gb200-nvl72x8", 1152,
     dict(tp=8, pp=4, vpp=2, dp=18, micro_batch=1, recompute="none")),
    ("gpt3-175b-a100x1024", "gpt3-175b", "a100x1024", 2048,
     dict(tp=8, pp=8, vpp=4, dp=16, micro_batch=2, recompute="selective")),
    ("mixtral-8x7b-gb200-ep8", "mixtral-8x7b", "gb200-nvl72x8", 1152,
     dict(tp=2, pp=4, dp=72, ep=8, micro_batch=1, recompute="selective")),
    ("qwen3-30b-a3b-h100x512-ep8", "qwen3-30b-a3b", "h100x512", 1024,
     dict(tp=2, pp=4, dp=64, ep=8, micro_batch=1, recompute="none")),
]
IDS = [c[0] for c in CASES]


@lru_cache(maxsize=None)
def _setup(model_name: str, cluster_name: str):
    model = get_model(model_name)
    cluster = load_cluster(cluster_name)
    return model, cluster, load_profile(cluster.gpu)


def case(i: int):
    _, model_name, cluster_name, gbs, degrees = CASES[i]
    model, cluster, prof = _setup(model_name, cluster_name)
    plan = ParallelPlan(global_batch=gbs, **degrees)
    return model, cluster, prof, plan


@lru_cache(maxsize=None)
def _all_valid(model_name: str, cluster_name: str, gbs: int) -> PlanArrays:
    model, cluster, _ = _setup(model_name, cluster_name)
    return valid_plans(model, cluster, gbs)


# ---- perturbations ----------------------------------------------------------------------------------

def _scaled(sourced, f: float):
    return sourced.model_copy(update={"value": sourced.value * f})


def scale_profile(prof: HardwareProfile, *, hbm: float = 1.0, flops: float = 1.0, memory: float = 1.0):
    upd = {}
    if hbm != 1.0:
        upd["hbm_bandwidth_bytes_per_s"] = _scaled(prof.hbm_bandwidth_bytes_per_s, hbm)
    if flops != 1.0:
        upd["peak_flops"] = {k: _scaled(v, flops) for k, v in prof.peak_flops.items()}
    if memory != 1.0:
        upd["memory_bytes"] = _scaled(prof.memory_bytes, memory)
    return prof.model_copy(update=upd)


def scale_cluster(cluster: ClusterSpec, prof: HardwareProfile, *, nic: float = 1.0, nvlink: float = 1.0):
    upd = {}
    if nic != 1.0:
        upd["inter_node"] = cluster.inter_node.model_copy(
            update={"nic_bandwidth_bytes_per_s": cluster.inter_node.nic_bandwidth_bytes_per_s * nic})
    if nvlink != 1.0:
        base = cluster.intra_node.bandwidth_bytes_per_s or prof.nvlink_bandwidth_bytes_per_s.value
        upd["intra_node"] = cluster.intra_node.model_copy(update={"bandwidth_bytes_per_s": base * nvlink})
    return cluster.model_copy(update=upd)


# (name, cluster scaling, profile scaling): every one a faster machine
FASTER = [
    ("nic2x", dict(nic=2.0), {}),
    ("nvlink2x", dict(nvlink=2.0), {}),
    ("hbm2x", {}, dict(hbm=2.0)),
    ("all-bandwidths2x", dict(nic=2.0, nvlink=2.0), dict(hbm=2.0)),
    ("flops2x", {}, dict(flops=2.0)),
    ("flops1.05x", {}, dict(flops=1.05)),
    ("everything2x", dict(nic=2.0, nvlink=2.0), dict(hbm=2.0, flops=2.0)),
]
FASTER_IDS = [f[0] for f in FASTER]


def check_estimate(est: StepEstimate, label: str = "") -> None:
    """Contract (e) for one StepEstimate."""
    assert est.step_time_lower_s <= est.step_time_s * (1 + RTOL), label
    assert est.step_time_s <= est.step_time_upper_s * (1 + RTOL), label
    assert est.step_time_lower_s >= 0.0, label
    assert np.isfinite([est.step_time_s, est.step_time_lower_s, est.step_time_upper_s]).all(), label
    bad = {k: v for k, v in est.breakdown_s.items() if not (v >= 0.0)}
    assert not bad, f"{label}: negative breakdown {bad}"
    bad = {k: v for k, v in est.memory_breakdown_bytes.items() if not (v >= 0.0)}
    assert not bad, f"{label}: negative memory breakdown {bad}"
    assert 0.0 < est.mfu < 1.0, f"{label}: mfu={est.mfu}"
    assert est.tokens_per_s_per_gpu > 0, label
    assert all(t > 0 for t in est.stage_time_s), label
    assert all(m > 0 for m in est.peak_memory_bytes), label
    gpu_fits = all(m <= est.memory_capacity_bytes for m in est.peak_memory_bytes)
    # Fitting also needs the host's share of memory for what a plan offloads (activations, optimizer state).
    assert est.fits <= gpu_fits, label
    if not est.memory_breakdown_bytes.get("host_offload", 0.0):
        assert est.fits == gpu_fits, label


# ---- the fixed cases -------------------------------------------------------------------------------

@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_cases_are_valid_plans(i):
    model, cluster, _, plan = case(i)
    assert violations(model, plan, cluster.num_gpus) == []
    if model.is_moe:
        assert plan.ep > 1


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
@pytest.mark.parametrize("name,cl,pr", FASTER, ids=FASTER_IDS)
def test_faster_machine_never_slower(i, name, cl, pr):
    """(a) + (d) on the fixed cases, every stage costed."""
    model, cluster, prof, plan = case(i)
    base = estimate(model, cluster, plan, profile=prof)
    fast = estimate(model, scale_cluster(cluster, prof, **cl), plan, profile=scale_profile(prof, **pr))
    assert fast.step_time_s <= base.step_time_s * (1 + RTOL), (
        f"{IDS[i]} {name}: step {base.step_time_s:.6f} s -> {fast.step_time_s:.6f} s")


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_nvlink_at_profile_value_changes_nothing(i):
    """Writing the profile's NVLink figure into the cluster is the same as leaving it out."""
    model, cluster, prof, plan = case(i)
    same = cluster.model_copy(update={"intra_node": cluster.intra_node.model_copy(
        update={"bandwidth_bytes_per_s": prof.nvlink_bandwidth_bytes_per_s.value})})
    assert estimate(model, same, plan, profile=prof).step_time_s == pytest.approx(
        estimate(model, cluster, plan, profile=prof).step_time_s, rel=1e-9)


def _degree_ladder(model, cluster, plan: ParallelPlan, which: str) -> list[ParallelPlan]:
    """Plans like ``plan`` with ``which`` (tp or pp) rising and dp shrinking, world size kept; only
    layouts Megatron accepts."""
    world = cluster.num_gpus
    values = [1, 2, 4, 8, 16] if which == "tp" else [p for p in range(1, model.layers + 1) if model.layers % p == 0]
    out = []
    for v in values:
        deg = {"tp": plan.tp, "pp": plan.pp, which: v}
        denom = deg["tp"] * deg["pp"] * plan.cp
        if world % denom:
            continue
        upd = {**deg, "dp": world // denom}
        if which == "pp":
            upd["vpp"] = 1
        p = plan.model_copy(update=upd)
        if not violations(model, p, world):
            out.append(p)
    return out


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
@pytest.mark.parametrize("which", ["tp", "pp"])
def test_weights_never_rise_with_tp_or_pp(i, which):
    """(b) memory_breakdown 'weights' along a ladder of rising tp (or pp)."""
    model, cluster, prof, plan = case(i)
    ladder = _degree_ladder(model, cluster, plan, which)
    assert len(ladder) >= 2, f"{IDS[i]}: fewer than two valid plans with {which} varied"
    w = [estimate(model, cluster, p, profile=prof).memory_breakdown_bytes["weights"] for p in ladder]
    for a, b, pa, pb in zip(w, w[1:], ladder, ladder[1:]):
        assert b <= a * (1 + RTOL), (f"{IDS[i]}: {which} {getattr(pa, which)} -> {getattr(pb, which)}: "
                                     f"weights {a / 2**30:.3f} -> {b / 2**30:.3f} GiB")


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
@pytest.mark.parametrize("grow", [1.01, 1.5, 4.0])
def test_fitting_plan_keeps_fitting_with_more_memory(i, grow):
    """(c) on the fixed cases (grow a plan that fits, or at least does not stop fitting)."""
    model, cluster, prof, plan = case(i)
    base = estimate(model, cluster, plan, profile=prof)
    big = estimate(model, cluster, plan, profile=scale_profile(prof, memory=grow))
    assert big.memory_capacity_bytes >= base.memory_capacity_bytes
    if base.fits:
        assert big.fits
    assert big.step_time_s == pytest.approx(base.step_time_s, rel=1e-12)


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_estimate_bounds(i):
    """(e) on the fixed cases, and the fixed cases fit their GPUs."""
    model, cluster, prof, plan = case(i)
    est = estimate(model, cluster, plan, profile=prof)
    check_estimate(est, IDS[i])
    assert set(est.breakdown_s) == {k.removesuffix("_s") for k in BREAKDOWN_KEYS}
    assert len(est.stage_time_s) == plan.pp
    assert est.fits


# ---- every valid plan of each case's model and cluster, vectorised ----------------------------------

def _space(i: int):
    _, model_name, cluster_name, gbs, _ = CASES[i]
    model, cluster, prof = _setup(model_name, cluster_name)
    a = _all_valid(model_name, cluster_name, gbs)
    assert len(a) > 100
    return model, cluster, prof, a


def _plan_desc(a: PlanArrays, j: int) -> dict:
    return {k: int(getattr(a, k)[j]) for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "recompute",
                                                  "zero_stage")}


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_space_faster_machine_never_slower(i):
    """(a) + (d) over every valid plan at once."""
    model, cluster, prof, a = _space(i)
    base = estimate_arrays(model, cluster, a, profile=prof)["step_time_s"]
    for name, cl, pr in FASTER:
        fast = estimate_arrays(model, scale_cluster(cluster, prof, **cl), a,
                               profile=scale_profile(prof, **pr))["step_time_s"]
        rise = fast - base * (1 + RTOL)
        j = int(np.argmax(rise))
        assert rise[j] <= 0, (f"{IDS[i]} {name}: {int((rise > 0).sum())} plans slower, worst "
                              f"{_plan_desc(a, j)}: {base[j]:.6f} -> {fast[j]:.6f} s")


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_space_fits_keep_fitting_with_more_memory(i):
    """(c) over every valid plan."""
    model, cluster, prof, a = _space(i)
    base = estimate_arrays(model, cluster, a, profile=prof)["fits"]
    assert base.any()
    for grow in (1.01, 1.25, 2.0):
        big = estimate_arrays(model, cluster, a, profile=scale_profile(prof, memory=grow))["fits"]
        lost = base & ~big
        assert not lost.any(), f"{IDS[i]} memory x{grow}: {int(lost.sum())} plans stop fitting"
        assert big.sum() >= base.sum()


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_space_weights_never_rise_with_tp_or_pp(i):
    """(b) over every valid plan that has a valid partner with tp (or pp) doubled and dp halved."""
    model, cluster, prof, a = _space(i)
    out = estimate_arrays(model, cluster, a, profile=prof)
    w = out["weights_bytes"]
    # Partners share the data-parallel sharding (ZeRO-1 vs FSDP weights differ by design).
    keys = np.stack([a.tp, a.pp, a.vpp, a.dp, a.cp, a.ep, a.micro_batch, a.recompute, a.zero_stage],
                    axis=1).astype(int)
    index = {tuple(k): j for j, k in enumerate(keys)}
    pairs = 0
    for j, k in enumerate(keys):
        tp, pp, vpp, dp = k[:4]
        for partner in ((2 * tp, pp, vpp, dp // 2), (tp, 2 * pp, 1, dp // 2)):
            if dp % 2 or (partner[1] != pp and vpp != 1):
                continue
            jj = index.get((*partner, *k[4:]))
            if jj is None:
                continue
            pairs += 1
            assert w[jj] <= w[j] * (1 + RTOL), (f"{IDS[i]}: {_plan_desc(a, j)} -> {_plan_desc(a, jj)}: weights "
                                                f"{w[j] / 2**30:.3f} -> {w[jj] / 2**30:.3f} GiB")
    assert pairs > 10


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_space_bounds(i):
    """(e) over every valid plan."""
    model, cluster, prof, a = _space(i)
    out = estimate_arrays(model, cluster, a, profile=prof)
    step, lo, up = out["step_time_s"], out["step_time_lower_s"], out["step_time_upper_s"]
    assert np.isfinite(step).all() and np.isfinite(lo).all() and np.isfinite(up).all()
    assert (lo >= 0).all()
    assert (lo <= step * (1 + RTOL)).all()
    assert (step <= up * (1 + RTOL)).all()
    for k in BREAKDOWN_KEYS:
        v = out[k]
        j = int(np.argmin(v))
        assert v[j] >= 0, f"{IDS[i]}: {k}={v[j]} for {_plan_desc(a, j)}"
    mfu = out["mfu"]
    assert (mfu > 0).all() and (mfu < 1).all(), (float(mfu.min()), float(mfu.max()))


# ---- hypothesis: random valid 70B plans on h100x512, knobs varied --------------------------------

H_MODEL, H_CLUSTER = "70b", "h100x512"
H_GBS = default_global_batch(get_model(H_MODEL).seq_len, load_cluster(H_CLUSTER).num_gpus)
OPTIMIZERS = [dict(distributed_optimizer=True, zero_stage=1), dict(distributed_optimizer=False, zero_stage=0),
              dict(distributed_optimizer=True, zero_stage=2), dict(distributed_optimizer=True, zero_stage=3)]
HSETTINGS = settings(max_examples=50, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def h_plans(draw):
    model, cluster, prof = _setup(H_MODEL, H_CLUSTER)
    a = _all_valid(H_MODEL, H_CLUSTER, H_GBS)
    j = draw(st.integers(0, len(a) - 1))
    plan = to_plan(a, j)
    upd = dict(draw(st.sampled_from(OPTIMIZERS)))
    upd["framework"] = draw(st.sampled_from(["megatron-core", "megatron-lm-2021", "paxml"]))
    if plan.recompute == "full":
        per_chunk = model.layers // plan.pp // plan.vpp
        k = draw(st.integers(1, per_chunk))
        upd["recompute_layers"] = draw(st.sampled_from([None, k * plan.vpp]))
    return model, cluster, prof, plan.model_copy(update=upd)


@HSETTINGS
@given(h_plans(), st.sampled_from(FASTER), st.floats(1.01, 4.0))
def test_h_faster_machine_never_slower(mcp, faster, f):
    """(a) + (d) for random valid plans, with the speed-up factor drawn too."""
    model, cluster, prof, plan = mcp
    name, cl, pr = faster
    cl = {k: f for k in cl}
    pr = {k: f for k in pr}
    base = estimate(model, cluster, plan, profile=prof)
    fast = estimate(model, scale_cluster(cluster, prof, **cl), plan, profile=scale_profile(prof, **pr))
    assert fast.step_time_s <= base.step_time_s * (1 + RTOL), (
        f"{name} x{f:.3f} {plan}: {base.step_time_s:.6f} -> {fast.step_time_s:.6f} s")


@HSETTINGS
@given(h_plans(), st.floats(1.0, 4.0))
def test_h_fits_keep_fitting_and_bounds(mcp, grow):
    """(c) + (e) for random valid plans."""
    model, cluster, prof, plan = mcp
    base = estimate(model, cluster, plan, profile=prof)
    check_estimate(base, str(plan))
    big = estimate(model, cluster, plan, profile=scale_profile(prof, memory=grow))
    if base.fits:
        assert big.fits, f"x{grow:.3f} memory: {plan}"


@HSETTINGS
@given(h_plans(), st.sampled_from(["tp", "pp"]))
def test_h_weights_never_rise(mcp, which):
    """(b) for random valid plans: double tp (or pp), halve dp, when Megatron accepts the result.

    Not for pp under ZeRO-3/FSDP: there the weights are sharded over dp, so halving dp to double pp
    doubles the first stage's share of the embedding (stage 0 holds (L/pp + E) / dp parameters, i.e.
    (L + E*pp) / (world/tp)); the layer part stays equal. That rise is real, not a model error.
    """
    model, cluster, prof, plan = mcp
    assume(not (which == "pp" and plan.zero_stage >= 3))
    upd = {which: getattr(plan, which) * 2, "dp": plan.dp // 2}
    if which == "pp":
        upd["vpp"] = 1
    bigger = plan.model_copy(update=upd)
    assume(plan.dp % 2 == 0 and not violations(model, bigger, cluster.num_gpus))
    a = estimate(model, cluster, plan, profile=prof).memory_breakdown_bytes["weights"]
    b = estimate(model, cluster, bigger, profile=prof).memory_breakdown_bytes["weights"]
    assert b <= a * (1 + RTOL), f"{plan} -> {which}x2: {a / 2**30:.3f} -> {b / 2**30:.3f} GiB"
