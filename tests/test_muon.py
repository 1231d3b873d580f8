"""The Muon optimizer (ModelSpec.optimizer = "muon") as megatron-core 0.16.1 runs it: Newton-Schulz GEMMs on
each matrix a rank owns, one fp32 moment, gradients all-reduced and weights all-gathered after the step under
the layer-wise distributed optimizer; its rules, arguments, logs, published rows and checkpoints."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from costmodel import compute, muon
from costmodel.catalog import get_model
from costmodel.estimate import estimate_arrays
from costmodel.flops import embedding_params, total_params
from costmodel.goodput import checkpoint_bytes
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import InputError, load_cluster, load_profile
from costmodel.rules import valid_mask, violations
from costmodel.runlog import parse_megatron_log
from costmodel.validate import load_cases, optimizer_of
from csv_rows import write_rows
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log"


def _pair(name="llama3-70b", **plan):
    """Adam's and Muon's estimates of one layout on 512 H100, and the two models."""
    arrays = PlanArrays.from_columns(**{"tp": 8, "pp": 4, "vpp": 1, "dp": 16, "micro_batch": 1, "global_batch": 512,
                                        "recompute": 0, **plan})
    models = [get_model(name).model_copy(update={"optimizer": o}) for o in ("adam", "muon")]
    outs = [estimate_arrays(m, load_cluster("h100x512"), arrays) for m in models]
    return (*outs, *models)


def test_newton_schulz_is_five_iterations_of_three_gemms_at_the_smaller_side():
    prof = load_profile("H100")
    # A Kimi-K2-sized expert fc1 (2 x 2048 gated rows, 7168 columns): m = 4096, n = 7168.
    flops = 5 * (2 * 4096**2 * 7168 + 2 * 4096**3 + 2 * 4096**2 * 7168)
    rate = prof.peak("bf16") * compute.gemm_efficiency(prof, "bf16", 4096)
    assert muon._ns_time_s(prof, 4096, 7168, 1.0) == pytest.approx(flops / rate, rel=1e-12)
    # Transposed, the same matrix; three of them, three times the time.
    assert muon._ns_time_s(prof, 7168, 4096, 3.0) == pytest.approx(3 * flops / rate, rel=1e-12)


def test_a_gqa_layer_orthogonalises_q_k_v_apart_and_each_tensor_parallel_shard_alone():
    prof = load_profile("H100")
    m = get_model("llama3-70b")          # h 8192, 64 query / 8 KV heads of 128, SwiGLU 28672
    ns = muon.newton_schulz_layer_s(m, prof, np.array([1.0, 8.0]), 1.0, 1.0)["dense"]
    t = lambda r, c: muon._ns_time_s(prof, r, c, 1.0)   # noqa: E731
    for i, tp in enumerate((1, 8)):
        want = (t(8192 / tp, 8192) + 2 * t(1024 / tp, 8192) + t(8192, 8192 / tp)
                + t(2 * 28672 / tp, 8192) + t(8192, 28672 / tp))
        assert ns[i] == pytest.approx(want, rel=1e-12)
    # An eighth of each matrix on each rank, and where the split side is the smaller one, a smaller m too: an
    # iteration costs about m per parameter, so more than 8x less.
    assert ns[0] / ns[1] > 8


def test_muon_adds_its_iterations_to_the_optimizer_step_dealt_over_the_data_parallel_ranks():
    adam, mu, _, _ = _pair(dp=16)
    _, mu32, _, _ = _pair(dp=32, global_batch=1024)
    adam32, _, _, _ = _pair(dp=32, global_batch=1024)
    extra16 = mu["optimizer_s"][0] - adam["optimizer_s"][0]
    extra32 = mu32["optimizer_s"][0] - adam32["optimizer_s"][0]
    assert extra16 > 0 and extra32 == pytest.approx(extra16 / 2, rel=1e-9)
    # Without the distributed optimizer every rank orthogonalises all of its stage's matrices.
    _, whole, _, _ = _pair(dp=16, zero_stage=0, distributed_optimizer=False)
    adam0, _, _, _ = _pair(dp=16, zero_stage=0, distributed_optimizer=False)
    assert whole["optimizer_s"][0] - adam0["optimizer_s"][0] == pytest.approx(16 * extra16, rel=1e-9)


def test_muon_keeps_one_moment_and_gathers_the_weights_outside_the_overlap():
    adam, mu, am, _ = _pair(pp=1, dp=64)
    # State per parameter: 12 bytes (master, two moments) for Adam; for Muon 8 on the matrices and 12 on the
    # embedding and the output layer (one stage holds both here), over the 64 ranks sharing it.
    e = embedding_params(am)
    edge = (e["embedding"] + e["lm_head"]) / 8
    assert mu["optimizer_bytes"][0] == pytest.approx(adam["optimizer_bytes"][0] * 8 / 12 + edge * 4 / 64, rel=1e-9)
    # The gradients all-reduce (twice a reduce-scatter's traffic) and the weights' all-gather runs inside
    # the step, so more data-parallel communication is left exposed.
    adam, mu, _, _ = _pair(dp=16)
    assert mu["dp_comm_exposed_s"][0] > adam["dp_comm_exposed_s"][0]
    assert mu["step_time_s"][0] > adam["step_time_s"][0]


def test_moe_experts_are_matrices_of_their_own_on_each_expert_rank():
    prof = load_profile("GB300")
    k2 = get_model("kimi-k2")            # 384 experts of 2048, h 7168
    ns = muon.newton_schulz_layer_s(k2, prof, np.array([1.0]), np.array([1.0]), np.array([64.0]))
    per_expert = muon._ns_time_s(prof, 4096, 7168, 1.0) + muon._ns_time_s(prof, 7168, 2048, 1.0)
    assert ns["expert"][0] == pytest.approx(6 * per_expert, rel=1e-12)
    assert ns["moe_dense"][0] > 0 and ns["dense"][0] > ns["moe_dense"][0] - muon._ns_time_s(prof, 384, 7168, 1.0)


def test_rules_refuse_what_megatron_core_refuses_for_muon():
    m = get_model("llama3-70b").model_copy(update={"optimizer": "muon"})
    fsdp = ParallelPlan(tp=8, pp=1, dp=64, global_batch=512, zero_stage=3, distributed_optimizer=True)
    assert any("optimizer=muon with zero_stage=3" in v for v in violations(m, fsdp, 512))
    mask = valid_mask(m, {"tp": np.array([8, 8]), "dp": np.array([64, 64]), "global_batch": np.array([512, 512]),
                          "zero_stage": np.array([1, 3])}, 512)
    assert mask.tolist() == [True, False]
    off = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, optimizer_offload=0.5)
    assert any("optimizer_offload=0.5" in v for v in violations(m, off, 512))
    fp16 = m.model_copy(update={"precision": "fp16"})
    assert any("muon with fp16 is not supported" in v for v in violations(fp16, ParallelPlan(tp=8, pp=4, dp=16,
                                                                                             global_batch=512), 512))
    assert violations(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512), 512) == []


def test_megatron_arguments_name_dist_muon_and_read_back():
    m = get_model("llama3-70b").model_copy(update={"optimizer": "muon"})
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)
    args = megatron_args(m, plan)
    assert "--optimizer dist_muon" in args
    assert "--use-distributed-optimizer" not in args and "--overlap-param-gather" not in args
    back = parse_megatron_args(args, num_gpus=512)
    assert back["distributed_optimizer"] and back["zero_stage"] == 1
    plain = megatron_args(m, plan.model_copy(update={"zero_stage": 0, "distributed_optimizer": False}))
    assert "--optimizer muon" in plain
    assert "--optimizer" not in " ".join(megatron_args(get_model("llama3-70b"), plan))


def test_a_training_log_of_a_dist_muon_run_reads_the_optimizer_and_its_sharding():
    text = LOG.read_text()
    opt, dist = ("  optimizer ....................................... adam\n",
                 "  use_distributed_optimizer ....................... True\n")
    assert opt in text and dist in text
    patched = text.replace(opt, opt.replace("adam", "muon")).replace(dist, dist.replace("True", "False") +
                                                                     "  use_layer_wise_distributed_optimizer ... True\n")
    got = parse_megatron_log(patched, "muon.log", gpu="H100").measurement
    assert got.model.optimizer == "muon" and got.plan.zero_stage == 1 and got.plan.distributed_optimizer
    assert parse_megatron_log(text, "adam.log", gpu="H100").measurement.model.optimizer == "adam"


def test_published_rows_naming_muon_are_priced_with_it(tmp_path):
    said: list[str] = []
    assert optimizer_of({"notes": "table note: Muon optimizer was used for pre-training Kimi-K2."}, said) == "muon"
    assert said == ["optimizer=muon (from 'Muon' in notes)"]
    assert optimizer_of({"optimizer": "AdamW", "notes": "Llama 3 recipe"}, []) == "adam"
    assert optimizer_of({"notes": "muonclip, qk-clip on"}, []) == "muon"
    # The shared data's Kimi K2 rows (unscored) say so; no scored row does, so the fit is unchanged.
    rows = list(csv.DictReader((ROOT / "data" / "validation" / "published_runs.csv").open()))
    said_muon = [r for r in rows if optimizer_of(r, []) == "muon"]
    assert {r["model_name"] for r in said_muon} == {"Kimi-K2"} and {r["scored"] for r in said_muon} == {"false"}
    cases, _ = load_cases(write_rows(tmp_path / "k2.csv", [{**said_muon[0], "scored": "true"}]))
    assert cases[0].model.optimizer == "muon" and "optimizer=muon (from 'Muon' in notes)" in cases[0].assumed


def test_checkpoints_of_a_muon_model_save_one_moment_on_its_matrices():
    m = get_model("llama3-70b")
    mu = m.model_copy(update={"optimizer": "muon"})
    e = embedding_params(m)
    adam_part = e["embedding"] + e["lm_head"]
    assert checkpoint_bytes(m) == pytest.approx(14 * total_params(m))
    assert checkpoint_bytes(mu) == pytest.approx(14 * adam_part + 10 * (total_params(m) - adam_part))


def test_plan_takes_optimizer_muon_and_says_what_it_cannot_do(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["--model", "70b", "--cluster", "h100x512", "--optimizer", "muon", "--top", "1", "--out", str(out),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["plans"][0]["plan"]["zero_stage"] <= 1
    assert json.loads((out / "plan.json").read_text())["model"]["optimizer"] == "muon"
    assert "--optimizer dist_muon" in (out / "megatron_args.txt").read_text()
    for argv, words in ((["--optimizer", "lion"], "--optimizer lion: expected one of adam, muon"),
                        (["--optimizer", "muon", "--optimizer-offload", "0.5"], "optimizer CPU offload is Adam's")):
        assert main(["--model", "70b", "--cluster", "h100x512", *argv]) == 2
        assert words in capsys.readouterr().err


def test_the_executor_and_autotune_refuse_muon_in_one_line(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["--model", "8b", "--cluster", "h100x512", "--optimizer", "muon", "--top", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    for argv, needle in ((["autotune", "--model", "8b", "--cluster", "h100x512", "--optimizer", "muon"],
                          "the executor steps with Adam"),
                         (["run", str(out / "plan.json"), "--run-dir", str(tmp_path / "r")], "model.optimizer is 'muon'")):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_whatif_varies_the_optimizer(capsys):
    rc = main(["whatif", "--model", "8b", "--tokens", "1B", "--cluster", "h100x512", "--vary", "optimizer=adam,muon",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    points = {p["optimizer"]: p for p in out["points"]}
    assert set(points) == {"adam", "muon"}
    assert points["muon"]["step_time_s"] >= points["adam"]["step_time_s"]


def test_plan_check_finds_a_long_muon_step_and_deals_it_out():
    from planner.check import diagnose, format_findings

    m = get_model("llama3-70b").model_copy(update={"optimizer": "muon"})
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, zero_stage=0, distributed_optimizer=False)
    found = [f for f in diagnose(m, load_cluster("h100x512"), plan) if f.kind == "optimizer"]
    assert len(found) == 1
    f = found[0]
    assert f.alternative is not None and f.alternative.zero_stage == 1 and f.alternative.distributed_optimizer
    before, after = f.predicted["optimizer_fraction"]
    assert before > 0.04 and after < before / 4 and f.gain < 0
    assert "Muon's Newton-Schulz" in format_findings([f])[0] and "zero_stage 0 -> 1" in format_findings([f])[0]
    # Adam's step on the same layout is under the band: no finding.
    adam = [f for f in diagnose(get_model("llama3-70b"), load_cluster("h100x512"), plan) if f.kind == "optimizer"]
    assert adam == []


def test_fp8_weights_stay_bf16_with_fp8_copies_under_muon():
    # --fp8-param-gather needs Megatron's distributed optimizer, which Muon's layer-wise one is not: each weight is
    # bf16 plus Transformer Engine's FP8 copies, 4 bytes where a sharded Adam FP8 run holds 2.
    fp8 = get_model("llama3-70b", precision="fp8")
    arrays = PlanArrays.from_columns(tp=8, pp=4, vpp=1, dp=16, micro_batch=1, global_batch=512, recompute=0)
    cluster = load_cluster("h100x512")
    adam = estimate_arrays(fp8, cluster, arrays)
    mu = estimate_arrays(fp8.model_copy(update={"optimizer": "muon"}), cluster, arrays)
    assert mu["weights_bytes"][0] == pytest.approx(2 * adam["weights_bytes"][0], rel=1e-12)
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)
    assert "--fp8-param-gather" in megatron_args(fp8, plan)
    args = megatron_args(fp8.model_copy(update={"optimizer": "muon"}), plan)
    assert "--fp8-param-gather" not in args and any("not Muon's layer-wise one" in a for a in args)
