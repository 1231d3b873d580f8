"""The MoE all-to-all hidden behind another micro-batch's compute (ParallelPlan.moe_a2a_overlap: megatron-core's
--overlap-moe-expert-parallel-comm, the combined 1F1B schedule). Priced in the steady phase only, checked against
megatron-core's rules, written as a Megatron flag, read from training logs and published-run notes, proposed by
plan check, refused by the executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.catalog import get_model
from costmodel.estimate import EP_OVERLAP_SM_SHARE, estimate
from costmodel.plan import ParallelPlan
from costmodel.profiles import InputError, load_cluster
from costmodel.rules import violations
from costmodel.validate import a2a_overlap_named, load_cases, predict_case
from executor.launch import preflight
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args
from tests.csv_rows import write_rows

QWEN = get_model("qwen3-30b-a3b")
H100 = load_cluster("h100x512")


def _plan(**upd) -> ParallelPlan:
    # ep 16 spans two H100 nodes: the dispatch crosses the network.
    base = dict(tp=1, pp=2, vpp=2, dp=256, ep=16, global_batch=2048, micro_batch=1, recompute="selective")
    return ParallelPlan(**{**base, **upd})


def _both(plan: ParallelPlan):
    return estimate(QWEN, H100, plan), estimate(QWEN, H100, plan.model_copy(update={"moe_a2a_overlap": True}))


def test_the_steady_phase_hides_the_all_to_all_behind_the_other_micro_batch():
    plain, overlapped = _both(_plan())
    # 8 micro-batches x 2 chunks = 16 chunk passes a rank; the warm-up runs (pp - 1) + (vpp - 1) pp = 3 of them and the
    # overlap one more alone, so 12 of 16 merge. Merged, compute outlasts the all-to-all: all of it hides but the SM
    # share its kernels take from the compute.
    steady = 12 / 16
    assert overlapped.breakdown_s["ep_comm_exposed"] == pytest.approx(
        plain.breakdown_s["ep_comm_exposed"] * (1 - steady + steady * EP_OVERLAP_SM_SHARE), rel=1e-9)
    assert plain.breakdown_s["ep_comm_exposed"] > 0.3
    assert overlapped.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"])
    assert overlapped.step_time_s < plain.step_time_s - 0.2
    # One chunk's activations more on every stage (the extra forward in flight).
    assert all(b > a for a, b in zip(plain.peak_memory_bytes, overlapped.peak_memory_bytes))


def test_without_a_steady_phase_nothing_merges():
    # pp 1 with one micro-batch a step: no forward runs beside another micro-batch's backward.
    plain, overlapped = _both(_plan(pp=1, vpp=1, dp=512, global_batch=512))
    assert overlapped.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)
    # pp 1 with two: one of the two pairs merges.
    plain, overlapped = _both(_plan(pp=1, vpp=1, dp=512, global_batch=1024))
    assert overlapped.breakdown_s["ep_comm_exposed"] == pytest.approx(
        plain.breakdown_s["ep_comm_exposed"] * (0.5 + 0.5 * EP_OVERLAP_SM_SHARE), rel=1e-9)


def test_megatron_core_rules():
    on = dict(moe_a2a_overlap=True)
    assert violations(QWEN, _plan(**on)) == []
    assert violations(QWEN, _plan(pp=1, vpp=1, dp=512, **on)) == []
    assert violations(QWEN, _plan(vpp=1, **on)) == [
        "moe_a2a_overlap=True with pp=2 needs the interleaved schedule (megatron-core: "
        "virtual_pipeline_model_parallel_size must be set); valid: vpp > 1, pp=1, or moe_a2a_overlap=False"]
    assert "recompute=full" in violations(QWEN, _plan(recompute="full", **on))[0]
    assert "ep=1" in violations(QWEN, _plan(ep=1, **on))[0]
    assert "precision=fp32" in violations(QWEN.model_copy(update={"precision": "fp32"}), _plan(**on))[0]
    dsv3 = get_model("deepseek-v3")    # one MTP layer: pp > 1 only
    plan = ParallelPlan(tp=1, pp=1, dp=256, ep=64, global_batch=256, moe_a2a_overlap=True)
    assert any("MTP" in v for v in violations(dsv3, plan))


def test_flag_round_trips_log_reads_it_and_the_executor_refuses():
    plan = _plan(moe_a2a_overlap=True)
    args = megatron_args(QWEN, plan)
    assert "--overlap-moe-expert-parallel-comm" in args
    assert ParallelPlan(**parse_megatron_args(args, num_gpus=512)) == plan
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(QWEN, _plan())
    with pytest.raises(InputError, match="moe_a2a_overlap .* not run by the executor"):
        preflight(QWEN, plan)

    from costmodel.runlog import parse_megatron_log

    text = (Path(__file__).parent / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    line = "  use_distributed_optimizer ....................... True\n"
    patched = text.replace(line, line + "  overlap_moe_expert_parallel_comm ................ True\n")
    assert parse_megatron_log(patched, "ov.log", gpu="H100").measurement.plan.moe_a2a_overlap
    assert not parse_megatron_log(text, "plain.log", gpu="H100").measurement.plan.moe_a2a_overlap


def test_plan_check_takes_it_and_suggests_it(capsys):
    # DeepSeek-V3 on B200 nodes with ep 32 over four of them (Megatron-Bridge's B200 MXFP8 layout): 40% of the
    # step is exposed communication, most of it the all-to-all.
    dsv3 = ["check", "--model", "deepseek-v3", "--cluster", "b200x1024", "--global-batch", "4096", "--tp", "1",
            "--pp", "8", "--ep", "32", "--pipeline-layout", "Et*4|(t*4|)*14tmL", "--json"]
    assert main(dsv3) == 0
    comm = next(f for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "communication")
    assert comm["suggestion"].startswith("moe_a2a_overlap False -> True") and comm["gain"] < -0.2
    argv = ["check", "--model", "qwen3-30b-a3b", "--cluster", "h100x512.yaml", "--tp", "1", "--pp", "2", "--vpp", "2",
            "--ep", "16", "--global-batch", "2048"]
    assert main([*argv, "--moe-a2a-overlap"]) == 0
    assert "all-to-all overlapped" in " ".join(capsys.readouterr().out.split())
    assert main([*argv, "--moe-a2a-overlap", "--recompute", "full"]) == 2
    err = capsys.readouterr().err
    assert "moe_a2a_overlap=True with recompute=full" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, named", [
    ("moe_a2a_overlap=True", True), ("moe_a2a_overlap=False", False), ("--overlap-moe-expert-parallel-comm", True),
    ("EP A2A overlap, DeepEP", True), ("no a2a overlap", False), ("without EP all-to-all overlap", False),
    ("a2a_1f1b=True", True), ("MoE A2A 1F1B communication overlap", True), ("a2a_1f1b=False", False),
    ("1F1B schedule", None), ("tp comm overlap", None), ("", None)])
def test_notes_name_the_overlap(text, named):
    assert a2a_overlap_named(text) is named


ROW = dict(source_id="A2A_TEST", model_name="Qwen3-30B-A3B", params_b="30", layers="48", hidden="2048",
           ffn_hidden="768", heads="32", kv_heads="4", vocab="151936", seq_len="4096", moe_experts="128", moe_topk="8",
           gpu_type="H100", num_gpus="512", gpus_per_node="8", tp="1", pp="2", vp="2", cp="1", ep="16",
           global_batch="2048", micro_batch="1", recompute="selective", zero_stage_or_distopt="distributed optimizer",
           framework="megatron-core", notes="", step_time_s="2.0", scored="true")


def test_published_rows_take_the_overlap_their_notes_name(tmp_path):
    rows = [ROW, {**ROW, "notes": "moe_a2a_overlap=True (recipe)"}, {**ROW, "vp": "", "notes": "EP A2A overlap"}]
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", rows))
    assert not errors, errors
    plain, named, no_vp = cases
    assert not plain.plan.moe_a2a_overlap and named.plan.moe_a2a_overlap
    assert "moe_a2a_overlap=True (from the notes)" in named.assumed
    assert predict_case(named)["predicted_step_time_s"] < predict_case(plain)["predicted_step_time_s"] - 0.2
    # vp blank: megatron-core runs the overlap only interleaved, so it waits for the interleaving predict_case picks
    assert no_vp.a2a_overlap_open and not no_vp.plan.moe_a2a_overlap
    assert not any(a.startswith("moe_a2a_overlap") for a in no_vp.assumed)
    got = predict_case(no_vp)
    assert got["plan"].vpp > 1 and got["plan"].moe_a2a_overlap
    assert f"moe_a2a_overlap=True (from the notes, with the interleaving chosen: vpp={got['plan'].vpp})" \
        in got["assumed"]


def test_a_named_overlap_without_an_interleaving_is_dropped_and_said(tmp_path):
    # A stack that does not interleave keeps vp 1 where vp is blank (interleaving_options): no overlap, said why.
    rows = [{**ROW, "vp": "", "framework": "torchtitan", "notes": "a2a_1f1b=True"},
            {**ROW, "vp": "", "framework": "torchtitan"}]
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", rows))
    assert not errors, errors
    named, plain = (predict_case(c) for c in cases)
    assert cases[0].a2a_overlap_open and named["plan"].vpp == 1 and not named["plan"].moe_a2a_overlap
    assert any(a.startswith("moe_a2a_overlap=False (the notes name the all-to-all overlap, which megatron-core runs "
                            "only with an interleaved pipeline") for a in named["assumed"])
    assert named["predicted_step_time_s"] == plain["predicted_step_time_s"]


def test_no_validated_run_supports_an_overlapped_plan():
    # Support keys on the overlap too: the shared runs ran without it, so the overlapped plan is thin (the wider
    # interval) where the same plan without it has its neighbours.
    from costmodel.trust import plan_trust

    plain, overlapped = _plan(), _plan(moe_a2a_overlap=True)
    a, b = plan_trust(QWEN, H100, plain, 2.0), plan_trust(QWEN, H100, overlapped, 2.0)
    assert a["support_runs"] > 0 and not a["thin_support"]
    assert b["support_runs"] == 0 and b["thin_support"] and b["nearest_validated_runs"] == []
    assert b["predicted_p90_step_time_s"] - b["predicted_p10_step_time_s"] > \
        a["predicted_p90_step_time_s"] - a["predicted_p10_step_time_s"]
