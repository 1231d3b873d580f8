"""planner.check.diagnose on real plans: each check fires where it should, proposes a valid plan that
fits and improves the figure it is about, and its predicted figures are what estimate() says."""

from __future__ import annotations

import time

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.compute import gemm_dtype
from costmodel.estimate import estimate
from costmodel.profiles import load_cluster, load_profile
from costmodel.rules import violations
from costmodel.plan import ParallelPlan
from planner.check import MAX_CANDIDATES, THRESHOLDS, Finding, diagnose, format_findings, neighbours, predict
from planner.search import exhaustive, to_plan


@pytest.fixture(scope="module")
def llama70b():
    return get_model("70b")


@pytest.fixture(scope="module")
def h100x512():
    return load_cluster("h100x512")


@pytest.fixture(scope="module")
def search70b(llama70b, h100x512):
    return exhaustive(llama70b, h100x512, 512)


def _one(findings: list[Finding], kind: str) -> Finding:
    hits = [f for f in findings if f.kind == kind]
    assert len(hits) == 1, f"expected one {kind} finding, got {[f.kind for f in findings]}"
    return hits[0]


def _figures(model, cluster, plan, moe_imbalance=1.0) -> dict[str, float]:
    """The diagnosed figures recomputed from a single estimate() call."""
    est = estimate(model, cluster, plan, moe_imbalance=moe_imbalance)
    b, step = est.breakdown_s, est.step_time_s
    peak = load_profile(cluster.gpu).peak(gemm_dtype(model.precision))
    world = plan.tp * plan.pp * plan.dp * plan.cp
    return {
        "step_time_s": step,
        "fits": est.fits,
        "bubble_fraction": b["bubble"] / step,
        "comm_fraction": sum(b[k] for k in b if k.endswith("_comm_exposed")) / step,
        "stage_imbalance": max(est.stage_time_s) / min(est.stage_time_s),
        "memory_fraction": max(est.peak_memory_bytes) / est.memory_capacity_bytes,
        "compute_efficiency": est.model_flops_per_step / world / b["compute"] / peak,
    }


def _check_alternatives(model, cluster, plan, findings, moe_imbalance=1.0) -> int:
    """(f) Every suggested plan is valid, fits, and its predicted figures are estimate()'s."""
    base = _figures(model, cluster, plan, moe_imbalance)
    checked = 0
    for f in findings:
        assert f.severity in ("info", "warn")
        assert "\n" not in f.message and f.message
        for name, (before, after) in f.predicted.items():
            if name in base:
                assert before == pytest.approx(base[name], rel=1e-9), (f.kind, name)
        if f.alternative is None:
            continue
        alt = f.alternative
        assert violations(model, alt, cluster.num_gpus) == [], (f.kind, f.suggestion)
        assert alt.world_size == cluster.num_gpus
        assert alt.global_batch == plan.global_batch
        got = _figures(model, cluster, alt, moe_imbalance)
        assert got["fits"], (f.kind, f.suggestion)
        for name, (before, after) in f.predicted.items():
            assert after == pytest.approx(got[name], rel=1e-9), (f.kind, name, f.suggestion)
        assert f.gain == pytest.approx(got["step_time_s"] / base["step_time_s"] - 1, rel=1e-9)
        checked += 1
    return checked


# (a) ---------------------------------------------------------------------------------------------


def test_diagnose_takes_the_estimate_it_is_given(llama70b, h100x512):
    """plan check hands diagnose the estimate it printed: the same findings as diagnose's own, and a different
    estimate is what the findings then measure (the plan's figures are not computed a second time)."""
    plan = ParallelPlan(tp=8, pp=16, vpp=1, dp=4, micro_batch=1, global_batch=512)
    est = predict(llama70b, h100x512, plan)
    assert diagnose(llama70b, h100x512, plan, est=est) == diagnose(llama70b, h100x512, plan)
    slower = est.model_copy(update={"step_time_s": 2 * est.step_time_s})
    before = [f.predicted["step_time_s"][0] for f in diagnose(llama70b, h100x512, plan, est=slower)
              if "step_time_s" in f.predicted]
    assert before and all(s == slower.step_time_s for s in before)


def test_bubble_warning_70b_pp16(llama70b, h100x512):
    """70B on 512 H100, tp8 pp16 vpp1, 128 micro-batches: 15 stages of fill/drain are ~9% of the step,
    and halving pp with two virtual stages removes about half of it for a faster step."""
    plan = ParallelPlan(tp=8, pp=16, vpp=1, dp=4, micro_batch=1, global_batch=512)
    t0 = time.perf_counter()
    findings = diagnose(llama70b, h100x512, plan)
    assert time.perf_counter() - t0 < 2.0
    f = _one(findings, "bubble")
    assert f.severity == "warn"
    before, after = f.predicted["bubble_fraction"]
    assert before == pytest.approx(0.0915, abs=0.01)   # (16-1) stage times over a ~9.7 s step
    assert after < 0.7 * before
    s0, s1 = f.predicted["step_time_s"]
    assert s1 < s0 and f.gain < -0.03
    assert f.gain == pytest.approx(s1 / s0 - 1)
    alt = f.alternative
    assert alt is not None and (alt.pp < plan.pp or alt.vpp > plan.vpp)
    assert f.suggestion.startswith("pp 16 -> ") or f.suggestion.startswith("vpp 1 -> ")
    line = format_findings([f])[0]
    assert line.startswith("bubble 9% of the step")
    assert f": {f.suggestion}: bubble 9% -> " in line and line.endswith(f"step {100 * f.gain:+.0f}%")
    assert _check_alternatives(llama70b, h100x512, plan, findings) >= 1
    # The plan has no memory pressure: the other findings say so, nothing about memory_high.
    assert not [x for x in findings if x.kind == "memory_high"]


# (b) ---------------------------------------------------------------------------------------------


def test_memory_high_warning(llama70b, h100x512, search70b):
    """The fastest 70B plan with its peak in 85-100% of capacity (found in the search space) warns, and the
    suggestion brings memory down into the band, at a predicted step-time cost."""
    s = search70b.scores
    frac = np.nanmax(s["peak_memory_bytes"], axis=1) / s["memory_capacity_bytes"]
    pick = next(i for i in search70b.order if THRESHOLDS["memory_high"] < frac[i] <= 1.0)
    plan = to_plan(search70b.plans, int(pick))
    findings = diagnose(llama70b, h100x512, plan)
    f = _one(findings, "memory_high")
    assert f.severity == "warn" and findings[0] is f
    before, after = f.predicted["memory_fraction"]
    assert before == pytest.approx(frac[pick], rel=1e-9)
    assert 0.85 < before <= 1.0 and "risk of OOM" in f.message
    assert after <= THRESHOLDS["memory_high"]
    assert f.alternative is not None
    _check_alternatives(llama70b, h100x512, plan, findings)


def test_memory_high_when_it_does_not_fit(llama70b, h100x512):
    """70B tp2 pp4 without recompute needs more than the GPU: the warning says so and proposes a plan that fits."""
    plan = ParallelPlan(tp=2, pp=4, dp=64, micro_batch=2, global_batch=512, recompute="none")
    assert not estimate(llama70b, h100x512, plan).fits
    findings = diagnose(llama70b, h100x512, plan)
    f = _one(findings, "memory_high")
    assert "does not fit" in f.message and f.predicted["memory_fraction"][0] > 1.0
    assert f.alternative is not None and f.predicted["memory_fraction"][1] <= 1.0
    _check_alternatives(llama70b, h100x512, plan, findings)


# (c) ---------------------------------------------------------------------------------------------


def test_memory_low_info(llama70b, h100x512):
    """70B tp8 pp8 with full recompute uses ~12% of memory: an info that lighter recompute (or a larger
    micro-batch) uses the room for a faster step."""
    plan = ParallelPlan(tp=8, pp=8, dp=8, micro_batch=1, global_batch=512, recompute="full")
    findings = diagnose(llama70b, h100x512, plan)
    f = _one(findings, "memory_low")
    assert f.severity == "info"
    before, after = f.predicted["memory_fraction"]
    assert before < THRESHOLDS["memory_low"] and before == pytest.approx(0.12, abs=0.05)
    assert before < after <= THRESHOLDS["memory_high"]
    alt = f.alternative
    assert alt is not None
    rank = {"none": 0, "selective": 1, "full": 2}
    assert alt.micro_batch > plan.micro_batch or rank[alt.recompute] < rank[plan.recompute]
    assert (alt.tp, alt.pp, alt.vpp, alt.dp, alt.cp) == (plan.tp, plan.pp, plan.vpp, plan.dp, plan.cp)
    assert f.gain < -0.05
    assert "room for a larger micro-batch or less recompute" in f.message
    _check_alternatives(llama70b, h100x512, plan, findings)


# (d) ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_expert_imbalance(name, h100x512):
    """An MoE plan whose hottest expert rank gets 1.6x the mean load: a warning with the balanced step."""
    model = get_model(name)
    plan = ParallelPlan(tp=1, pp=1, dp=512, ep=8, micro_batch=1, global_batch=1024, recompute="selective")
    findings = diagnose(model, h100x512, plan, moe_imbalance=1.6)
    f = _one(findings, "expert_imbalance")
    assert f.severity == "warn" and "1.60x" in f.message
    assert f.predicted["moe_imbalance"] == [1.6, 1.0]
    s0, s1 = f.predicted["step_time_s"]
    assert s0 == pytest.approx(estimate(model, h100x512, plan, moe_imbalance=1.6).step_time_s)
    assert s1 == pytest.approx(estimate(model, h100x512, plan).step_time_s)
    # Balancing saves 3.5-24% here (Qwen3 about 3.9% after the refits with the scale terms, 2-byte FP8 weights and
    # the clamped-GLU passes: the balanced step also carries 512 GPUs' straggler share and ~57 expert-gradient
    # buckets' NCCL latency, which routing does not move).
    assert f.gain < -0.035
    assert "expert load 1.60x -> 1.00x" in format_findings([f])[0]
    _check_alternatives(model, h100x512, plan, findings, moe_imbalance=1.6)
    # Balanced routing, a mild imbalance or a dense model: no expert finding.
    for imb in (1.0, 1.15):
        assert not [x for x in diagnose(model, h100x512, plan, moe_imbalance=imb) if x.kind == "expert_imbalance"]


def test_no_expert_finding_for_dense(llama70b, h100x512):
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)
    assert not [x for x in diagnose(llama70b, h100x512, plan, moe_imbalance=1.6) if x.kind == "expert_imbalance"]


# (e) ---------------------------------------------------------------------------------------------


def test_stage_imbalance_proposes_balanced_split(llama70b, h100x512):
    """70B pp4 with 26/18/18/18 layers: the first stage is ~44% slower, and the even split is proposed."""
    plan = ParallelPlan(tp=8, pp=4, dp=16, micro_batch=1, global_batch=512, layers_per_stage=(26, 18, 18, 18))
    assert violations(llama70b, plan, h100x512.num_gpus) == []
    findings = diagnose(llama70b, h100x512, plan)
    f = _one(findings, "stage_imbalance")
    assert f.severity == "warn" and "26/18/18/18" in f.message
    before, after = f.predicted["stage_imbalance"]
    assert before == pytest.approx(1.44, abs=0.05)
    assert after < THRESHOLDS["stage_imbalance"]
    alt = f.alternative
    assert alt is not None
    # Only the split changes, and it is balanced: no stage more than one layer off 80/4.
    same = ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "recompute")
    assert all(getattr(alt, k) == getattr(plan, k) for k in same)
    split = alt.layers_per_stage or (20, 20, 20, 20)
    assert sum(split) == 80 and max(split) - min(split) <= 2
    assert f.suggestion.startswith("layers per stage 26/18/18/18 -> ")
    assert f.gain < -0.1
    _check_alternatives(llama70b, h100x512, plan, findings)


def test_lm_head_stage_gets_a_lighter_split(h100x512):
    """8B pp8 (4 layers a stage): the last stage also runs the 128k-vocab LM head; one layer moves off it."""
    model = get_model("8b")
    plan = ParallelPlan(tp=1, pp=8, dp=64, micro_batch=1, global_batch=512)
    findings = diagnose(model, h100x512, plan)
    f = _one(findings, "stage_imbalance")
    assert f.alternative is not None and f.alternative.layers_per_stage is not None
    assert f.alternative.layers_per_stage[-1] < 4
    assert f.predicted["stage_imbalance"][1] < f.predicted["stage_imbalance"][0] and f.gain < 0
    _check_alternatives(model, h100x512, plan, findings)


# (f) and the healthy plan ---------------------------------------------------------------------------


PLANS = [
    ("70b", "h100x512", ParallelPlan(tp=8, pp=16, dp=4, global_batch=512), 1.0),
    ("70b", "h100x512", ParallelPlan(tp=4, pp=4, vpp=5, dp=32, global_batch=512, recompute="none"), 1.0),
    ("70b", "h100x512", ParallelPlan(tp=2, pp=8, dp=32, global_batch=512, recompute="full", recompute_layers=5), 1.0),
    ("70b", "h100x512", ParallelPlan(tp=8, pp=2, vpp=4, dp=32, global_batch=512, layers_per_stage=(36, 44)), 1.0),
    ("8b", "h100x512", ParallelPlan(tp=1, pp=1, dp=256, cp=2, micro_batch=2, global_batch=512), 1.0),
    ("mixtral-8x7b", "h100x512", ParallelPlan(tp=2, pp=4, dp=64, ep=8, global_batch=1024), 1.3),
    ("qwen3-30b-a3b", "h100x512", ParallelPlan(tp=1, pp=2, dp=256, ep=16, global_batch=1024), 1.0),
    ("70b", "b200x1024", ParallelPlan(tp=4, pp=4, vpp=2, dp=64, micro_batch=1, global_batch=512), 1.0),
]


@pytest.mark.parametrize("name,cluster,plan,imb", PLANS, ids=[f"{m}-{i}" for i, (m, *_) in enumerate(PLANS)])
def test_every_alternative_is_valid_and_fits(name, cluster, plan, imb):
    model, cl = get_model(name), load_cluster(cluster)
    assert violations(model, plan, cl.num_gpus) == []
    cands = neighbours(model, cl, plan)
    assert 0 < len(cands) <= MAX_CANDIDATES
    for c in cands:
        assert violations(model, c.plan, cl.num_gpus) == [], c
        assert c.plan != plan
    findings = diagnose(model, cl, plan, moe_imbalance=imb)
    _check_alternatives(model, cl, plan, findings, moe_imbalance=imb)
    lines = format_findings(findings)
    assert len(lines) == len(findings) and all("\n" not in ln for ln in lines)
    # Warnings come first.
    sev = [f.severity for f in findings]
    assert sev == sorted(sev, key=lambda s: s != "warn")
    # A suggestion for a performance finding is faster and improves its figure.
    for f in findings:
        if f.alternative is not None and f.kind in ("bubble", "communication", "compute_efficiency",
                                                    "stage_imbalance", "memory_low"):
            assert f.gain < 0
            key = next(k for k in f.predicted if k != "step_time_s")
            a, b = f.predicted[key]
            assert (b > a) if key in ("compute_efficiency", "memory_fraction") else (b < a)


def test_rule_note_is_info(llama70b, h100x512):
    plan = ParallelPlan(tp=8, pp=2, vpp=4, dp=32, global_batch=512)
    notes = [f for f in diagnose(llama70b, h100x512, plan) if f.kind == "rule_note"]
    assert len(notes) == 1 and notes[0].severity == "info" and "overlap_p2p_comm" in notes[0].suggestion


def test_healthy_plan_has_no_warnings(llama70b, h100x512, search70b):
    """The fastest 70B plan whose figures are all inside their bands gets infos only."""
    s = search70b.scores
    step = s["step_time_s"]
    mem = np.nanmax(s["peak_memory_bytes"], axis=1) / s["memory_capacity_bytes"]
    comm = sum(s[k] for k in ("tp_comm_exposed_s", "cp_comm_exposed_s", "ep_comm_exposed_s", "pp_comm_exposed_s",
                              "dp_comm_exposed_s")) / step
    st = s["stage_time_s"]
    ok = ((mem >= THRESHOLDS["memory_low"]) & (mem <= THRESHOLDS["memory_high"]) & (s["bubble_s"] / step <= 0.05)
          & (comm <= THRESHOLDS["communication"]) & (np.nanmax(st, 1) / np.nanmin(st, 1) <= 1.2) & s["fits"])
    pick = next(i for i in search70b.order if ok[i])
    plan = to_plan(search70b.plans, int(pick))
    findings = diagnose(llama70b, h100x512, plan)
    assert all(f.severity == "info" for f in findings), format_findings(findings)
    assert not [f for f in findings if f.kind in ("memory_high", "memory_low", "bubble", "communication",
                                                  "stage_imbalance")]


def test_one_f_one_b_timeline_matches_closed_form():
    """Narayanan et al. 2021 Sec. 2.2.1: with equal stages 1F1B takes (m + p - 1) x (t_f + t_b)."""
    from planner.report import one_f_one_b_timeline

    for p, m in ((1, 4), (4, 8), (8, 3)):
        tl = one_f_one_b_timeline([1.0] * p, [2.0] * p, m)
        assert max(op[3] for ops in tl for op in ops) == (m + p - 1) * 3.0
        assert all(len(ops) == 2 * m for ops in tl)


# plan check with an explicit split / Megatron layout -----------------------------------------------------------
# Full recompute: at 8k tokens the layout holds 81.9 of 81.6 GB without (megatron-core's selective frees nothing
# on a dense Transformer Engine model, costmodel.rules.selective_runs_as_priced).
LLAMA3_405B = ["check", "--model", "405b", "--cluster", "h100x16384", "--tp", "8", "--pp", "16", "--micro-batch", "1",
               "--global-batch", "2048", "--seq-len", "8192", "--recompute", "full"]
LLAMA3_SPLIT = (7,) + (8,) * 14 + (7,)


def _check_json(capsys, *extra: str) -> dict:
    import json

    from planner.cli import main

    assert main([*LLAMA3_405B, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_check_takes_the_published_405b_layout(capsys):
    """Llama 3 405B at tp8 pp16 (126 layers, lighter edge stages): 16 does not divide 126, yet it is predicted and
    diagnosed, with the split the cost model prices and the layout Megatron would be given."""
    from planner.cli import main

    out = _check_json(capsys, "--layers-per-stage", ",".join(map(str, LLAMA3_SPLIT)))
    assert tuple(out["plan"]["layers_per_stage"]) == LLAMA3_SPLIT and out["plan"]["dp"] == 128
    assert out["pipeline_layout"] == "Et*7|(t*8|)*14,t*7L"
    model, cluster = get_model("405b").model_copy(update={"seq_len": 8192}), load_cluster("h100x16384")
    plan = ParallelPlan(**out["plan"])
    ref = estimate(model, cluster, plan)
    assert out["estimate"]["step_time_s"] == pytest.approx(ref.step_time_s, rel=1e-12)
    stage_s = out["estimate"]["stage_time_s"]
    assert stage_s[0] < stage_s[1] and stage_s[-1] < stage_s[1]   # 7-layer edge stages are lighter
    # 16 micro-batches over 16 stages: the bubble dominates, and diagnose says so
    assert "bubble" in [f["kind"] for f in out["findings"]]
    # the same split given as Megatron's layout string is the same plan and estimate
    same = _check_json(capsys, "--pipeline-layout", out["pipeline_layout"])
    assert same["plan"] == out["plan"] and same["estimate"]["step_time_s"] == out["estimate"]["step_time_s"]
    # text output names the split and layout
    assert main([*LLAMA3_405B, "--layers-per-stage", ",".join(map(str, LLAMA3_SPLIT))]) == 0
    text = capsys.readouterr().out
    assert "Megatron layout: Et*7|(t*8|)*14,t*7L" in text and "bubble" in text


def test_check_interleaved_layout_sets_vpp(capsys):
    # 32 virtual stages over pp 16: vpp 2, ranks 0 and 15 with 3 + 4 layers, the rest 4 + 4
    out = _check_json(capsys, "--pipeline-layout", "Et*3|(t*4|)*30,t*3L")
    assert out["plan"]["vpp"] == 2
    assert tuple(out["plan"]["layers_per_stage"]) == (7,) + (8,) * 14 + (7,)
    flat = _check_json(capsys, "--layers-per-stage", ",".join(map(str, LLAMA3_SPLIT)))
    assert out["estimate"]["breakdown_s"]["bubble"] < 0.6 * flat["estimate"]["breakdown_s"]["bubble"]


@pytest.mark.parametrize("extra, message", [
    (["--layers-per-stage", "7" + ",8" * 14], "has 15 counts but --pp is 16; give 16 comma-separated counts"),
    (["--layers-per-stage", "8" + ",8" * 15], "sums to 128 but 405b has 126 layers; give 16"),
    (["--layers-per-stage", "0,8,8,8,8,8,8,8,8,8,8,8,8,8,8,14"], "stage(s) 0 hold 0 layers"),
    (["--layers-per-stage", "7,8,x"], "is not a list of integers"),
    (["--pipeline-layout", "Et*3|(t*8|)*14,t*3L"], "places 118 decoder layers"),
    (["--pipeline-layout", "Et*7|(t*8|)*13,t*7L"], "not a multiple of pp=16"),
    (["--pipeline-layout", "Et*7|(t*8|)*14,t*7L", "--vpp", "2"], "drop --vpp"),
    (["--pipeline-layout", "Et*7|(t*8|)*14,t*7mL"], "MTP layers"),
    (["--pipeline-layout", "Et*7|(t*8|)*14,t*7X"], "unknown layer characters"),
    # A repeat count beyond any model was unrolled in memory (OverflowError, or gigabytes for t*1000000000).
    (["--pipeline-layout", "Et*99999999999999999999L"], "repeats 't' 99999999999999999999 times: more than 1,000,000"),
    (["--pipeline-layout", "E(t|)*600000(t|)*600000L"], "more than 1,000,000 layers"),
])
def test_check_bad_split_is_one_line_exit_2(capsys, extra, message):
    from planner.cli import main

    assert main([*LLAMA3_405B, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_check_layout_with_empty_edge_stages(capsys):
    # Megatron lets the first stage hold only the embedding and the last only the loss: both are priced, and the
    # idle edge stages are diagnosed
    out = _check_json(capsys, "--pipeline-layout", "E|(t*9|)*14,L")
    assert tuple(out["plan"]["layers_per_stage"]) == (0,) + (9,) * 14 + (0,)
    stage_s = out["estimate"]["stage_time_s"]
    assert stage_s[0] < 0.05 * stage_s[1] and stage_s[-1] < 0.1 * stage_s[1]
    assert "stage_imbalance" in [f["kind"] for f in out["findings"]]


def test_selective_on_a_dense_transformer_engine_model_warns_with_the_memory_it_holds(llama70b, h100x512):
    # megatron-core's selective on a dense model's Transformer Engine layers is core_attn alone (the LayerNorms
    # are fused into the GEMMs): the run holds recompute none's memory, which the warning names.
    plan = ParallelPlan(tp=2, pp=1, dp=256, global_batch=512, zero_stage=3, recompute="selective")
    priced = max(estimate(llama70b, h100x512, plan).peak_memory_bytes)
    holds = max(estimate(llama70b, h100x512, plan.model_copy(update={"recompute": "none"})).peak_memory_bytes)
    assert holds > 1.3 * priced   # 104 GB against the 73 GB the op-level selective prices
    gap = _one(diagnose(llama70b, h100x512, plan), "recompute_gap")
    assert gap.severity == "warn" and f"holds {holds / 1e9:.1f} GB" in gap.message
    assert gap.predicted["peak_memory_bytes"] == [priced, holds]
    # a MoE model (layernorm / moe_act modules) and a GPU without Transformer Engine get no such finding
    moe = get_model("mixtral-8x7b")
    moe_plan = ParallelPlan(tp=2, pp=1, dp=256, ep=8, etp=1, global_batch=512, recompute="selective")
    assert not [f for f in diagnose(moe, h100x512, moe_plan) if f.kind == "recompute_gap"]
    v100 = load_cluster("v100-dgx2x64")
    small = get_model("7b", precision="fp16")
    v_plan = ParallelPlan(tp=8, pp=1, dp=v100.num_gpus // 8, global_batch=v100.num_gpus // 8, recompute="selective")
    assert not [f for f in diagnose(small, v100, v_plan) if f.kind == "recompute_gap"]


def test_the_search_offers_selective_only_where_megatron_core_runs_it(llama70b, h100x512, search70b):
    from planner.space import recompute_modes

    assert recompute_modes(llama70b, h100x512) == ("none", "full")
    assert recompute_modes(get_model("mixtral-8x7b"), h100x512) == ("none", "selective", "full")
    assert recompute_modes(llama70b, load_cluster("v100-dgx2x64")) == ("none", "selective", "full")
    assert {to_plan(search70b.plans, int(i)).recompute for i in search70b.order[:50]} <= {"none", "full", "offload"}
