"""Sharding inside replicas (ParallelPlan.dist_opt_instances: megatron-core's --num-distributed-optimizer-instances,
PyTorch's HSDP / HYBRID_SHARD): the sharded state is divided over dp x cp / R ranks instead of dp x cp, its gathers
and reduce-scatters run inside those ranks (one node: NVLink) and the R replicas all-reduce their gradient shards.
Priced, checked against megatron-core's rules, written as Megatron flags and read from published-run rows."""

from __future__ import annotations

import json

import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.plan import ParallelPlan
from costmodel.profiles import InputError, load_cluster
from costmodel.rules import check_plan, violations
from costmodel.validate import load_cases, predict_case
from executor.launch import preflight
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args
from tests.csv_rows import write_rows

H100 = load_cluster("h100x512")


def _plan(**upd) -> ParallelPlan:
    base = dict(tp=1, pp=1, dp=512, global_batch=512, micro_batch=1, zero_stage=3, recompute="full")
    return ParallelPlan(**{**base, **upd})


def test_shards_inside_replicas_hold_that_much_more_state():
    model = get_model("8b")
    full, hybrid = estimate(model, H100, _plan()), estimate(model, H100, _plan(dist_opt_instances=64))
    for part in ("weights", "grads", "optimizer"):
        # 8-rank shards instead of 512-rank ones: 64x the state on every rank.
        assert hybrid.memory_breakdown_bytes[part] == pytest.approx(64 * full.memory_breakdown_bytes[part])
    # One replica is the plain plan, to the bit.
    assert estimate(model, H100, _plan(dist_opt_instances=1)) == full


def test_gathers_inside_a_node_cost_less_than_over_the_whole_cluster():
    # 405B FSDP over 1,024 tp-8 ranks gathers every layer over the network from 1,024 nodes; HSDP with 2-node
    # shards (R = 512) gathers from one other node and all-reduces a 1/2 shard over 512 replicas.
    model, cluster = get_model("405b"), load_cluster("h100x8192")
    plan = _plan(tp=8, dp=1024, global_batch=2048)
    full, hybrid = estimate(model, cluster, plan), estimate(model, cluster, plan.model_copy(
        update={"dist_opt_instances": 512}))
    assert hybrid.breakdown_s["dp_comm_exposed"] < 0.3 * full.breakdown_s["dp_comm_exposed"]
    assert hybrid.step_time_s < 0.7 * full.step_time_s
    # The distributed optimizer inside replicas: each rank updates a bigger shard, so the optimizer step grows.
    zero1 = plan.model_copy(update={"zero_stage": 1, "tp": 8, "pp": 16, "dp": 64, "vpp": 1})
    a, b = estimate(model, cluster, zero1), estimate(model, cluster, zero1.model_copy(
        update={"dist_opt_instances": 8}))
    assert b.breakdown_s["optimizer"] == pytest.approx(8 * a.breakdown_s["optimizer"], rel=0.05)


def test_replicas_follow_megatron_core_rules():
    model, moe = get_model("8b"), get_model("mixtral-8x7b")
    assert violations(model, _plan(dist_opt_instances=3)) == [
        "dist_opt_instances=3 does not divide dp=512 * cp=1 = 512; valid dist_opt_instances: 1, 2, 4, 8, 16, 32, "
        "64, 128, 256, 512"]
    nothing = _plan(zero_stage=0, distributed_optimizer=False, dist_opt_instances=2)
    assert "nothing is sharded" in violations(model, nothing)[0]
    # MoE: the expert data-parallel size (tp x cp x dp / (ep x etp) = 8 here) must divide too.
    plan = ParallelPlan(tp=2, pp=1, dp=32, ep=8, global_batch=256, zero_stage=1, dist_opt_instances=16)
    assert "the expert data-parallel size 8" in violations(moe, plan)[0]
    check_plan(moe, plan.model_copy(update={"dist_opt_instances": 8}), 64)
    fsdp = plan.model_copy(update={"dist_opt_instances": 8, "zero_stage": 3})
    assert "builds no expert mesh for HSDP" in violations(moe, fsdp)[0]


def test_flags_round_trip_and_the_executor_refuses():
    model = get_model("8b")
    for zero in (1, 3):
        plan = _plan(zero_stage=zero, dist_opt_instances=64)
        args = megatron_args(model, plan)
        assert "--num-distributed-optimizer-instances 64" in args
        assert ("--outer-dp-sharding-strategy no_shard" in args) == (zero == 3)
        assert ParallelPlan(**parse_megatron_args(args, num_gpus=512)) == plan
    with pytest.raises(InputError, match="dist_opt_instances=64 .* not run by the executor"):
        preflight(model, _plan(zero_stage=1, dist_opt_instances=64))


def test_plan_check_takes_replicas(capsys):
    argv = ["check", "--model", "8b", "--cluster", "h100x512.yaml", "--tp", "1", "--pp", "1", "--zero-stage", "3",
            "--dist-opt-instances", "64"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["dist_opt_instances"] == 64
    assert main(argv) == 0
    assert "64 replicas of 8-rank shards" in " ".join(capsys.readouterr().out.split())
    assert main([*argv[:-1], "5"]) == 2
    err = capsys.readouterr().err
    assert "dist_opt_instances=5 does not divide dp=512" in err and len(err.strip().splitlines()) == 1


ROW = dict(source_id="HSDP_TEST", model_name="Llama-3-8B", params_b="8", layers="32", hidden="4096",
           ffn_hidden="14336", heads="32", kv_heads="8", vocab="128256", seq_len="8192", gpu_type="H100",
           num_gpus="256", gpus_per_node="8", tp="1", pp="1", cp="1", global_batch="256", micro_batch="1", notes="",
           recompute="full", zero_stage_or_distopt="FSDP", framework="torchtitan", step_time_s="4.0",
           scored="true")


@pytest.mark.parametrize("upd, replicas, said", [
    (dict(), 1, None),
    (dict(zero_stage_or_distopt="HSDP"), 32, "HSDP shards within a node of 8 GPUs, 8 dp ranks"),
    (dict(zero_stage_or_distopt="HYBRID_SHARD", tp="2"), 32, "4 dp ranks"),
    (dict(notes="FSDP2 with dp_shard=64, dp_replicate=4"), 4, "named"),
    (dict(notes="dp_shard=16"), 16, "over the named shard group"),
    (dict(zero_stage_or_distopt="distributed optimizer", framework="Megatron-LM core_r0.13",
          notes="--num-distributed-optimizer-instances 2"), 2, "named"),
    (dict(notes="dp_replicate=3"), 2, "3 does not divide dp x cp = 256")])
def test_published_rows_name_replicas(tmp_path, upd, replicas, said):
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", [{**ROW, **upd}]))
    assert not errors, errors
    case = cases[0]
    assert case.plan.dist_opt_instances == replicas
    notes = [a for a in case.assumed if a.startswith("dist_opt_instances=")]
    assert (notes == []) if said is None else (said in notes[0]), case.assumed


def test_a_training_log_with_optimizer_instances_reads_them():
    from pathlib import Path

    from costmodel.runlog import parse_megatron_log

    text = (Path(__file__).parent / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    line = "  use_distributed_optimizer ....................... True\n"
    assert line in text
    patched = text.replace(line, line + "  num_distributed_optimizer_instances ............. 2\n")
    assert parse_megatron_log(patched, "hsdp.log", gpu="H100").measurement.plan.dist_opt_instances == 2
    assert parse_megatron_log(text, "dp.log", gpu="H100").measurement.plan.dist_opt_instances == 1


def test_a_published_hsdp_run_whose_node_cannot_hold_its_shard_had_larger_groups(tmp_path):
    # Llama-3-70B with its 16 bytes of state per parameter cannot shard inside one 8-GPU node (140 GB a GPU); the
    # run ran, so its shard groups were larger: the fastest replica count that fits, said in assumed.
    row = {**ROW, "model_name": "Llama-3-70B", "params_b": "70", "layers": "80", "hidden": "8192", "ffn_hidden": "28672",
           "heads": "64", "num_gpus": "512", "global_batch": "512", "zero_stage_or_distopt": "HSDP"}
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", [row]))
    assert not errors and cases[0].plan.dist_opt_instances == 64
    got = predict_case(cases[0])
    assert got["fits"] and got["plan"].dist_opt_instances < 64
    assert 512 % got["plan"].dist_opt_instances == 0
    assert any(a.startswith(f"dist_opt_instances={got['plan'].dist_opt_instances} (shard groups of")
               for a in got["assumed"]), got["assumed"]


def test_plan_check_suggests_sharding_inside_replicas(capsys):
    # 405B FSDP over 1,024 tp-8 ranks spends 60% of the step gathering over the network; shard groups of 16
    # nodes (64 replicas) keep the gathers on fewer hops.
    argv = ["check", "--model", "405b", "--cluster", "h100x8192", "--tp", "8", "--pp", "1", "--zero-stage", "3",
            "--global-batch", "2048", "--json"]
    assert main(argv) == 0
    comm = next(f for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "communication")
    assert comm["suggestion"].startswith("dist_opt_instances 1 -> ") and comm["alternative"]["dist_opt_instances"] > 1
    assert comm["gain"] < -0.4
    # Moves that change dp keep the shard group's size where they can.
    from costmodel.catalog import get_model as model_of
    from planner.check import neighbours

    hsdp = _plan(tp=8, dp=1024, global_batch=2048, dist_opt_instances=64)
    tp4 = next(c.plan for c in neighbours(model_of("405b"), load_cluster("h100x8192"), hsdp) if c.family == "tp"
               and c.plan.tp == 4)
    assert tp4.dp == 2048 and tp4.dist_opt_instances == 128
