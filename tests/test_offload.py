"""Activation offloading to host memory (recompute='offload', megatron-core --cpu-offloading): the offloaded
layers' activations leave the GPU, and each layer's copy shows where it outlasts the layer it hides behind."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.plan import ParallelPlan
from costmodel.profiles import Sourced, load_profile
from costmodel.rules import violations
from costmodel.runlog import parse_megatron_log
from costmodel.validate import load_cases, recompute_named
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args
from planner.space import valid_plans
from csv_rows import write_rows

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "validation" / "published_runs.csv"


def test_host_links_are_the_datasheet_rates_each_way_per_gpu():
    assert load_profile("H100").host_link_bandwidth_bytes_per_s.value == 64e9      # PCIe Gen5 x16
    assert load_profile("A100-80GB").host_link_bandwidth_bytes_per_s.value == 32e9  # PCIe Gen4 x16
    assert load_profile("GH200").host_link_bandwidth_bytes_per_s.value == 450e9    # NVLink-C2C, one GPU
    assert load_profile("GB200").host_link_bandwidth_bytes_per_s.value == 225e9    # C2C shared by two GPUs


def _fsdp_70b_gb200():
    """Llama 3 70B as Megatron-Bridge's FSDP recipe runs it on 64 GB200 (tp1 pp1, micro-batch 2, 8k)."""
    case = next(c for c in load_cases(CSV)[0] if c.gpu_type == "GB200" and c.model.name == "Llama3-70B"
                and c.plan.zero_stage == 3)
    return case.model, case.cluster, case.plan


def _est(model, cluster, plan, bw=None, **upd):
    prof = load_profile("GB200")
    if bw is not None:
        prof = prof.model_copy(update={"host_link_bandwidth_bytes_per_s": Sourced(value=bw, source="GB200_C2C")})
    return estimate(model, cluster, plan.model_copy(update=upd), profile=prof)


def _layer_bytes(model, cluster, plan):
    from costmodel.estimate import _context, _layer_activation_bytes
    from costmodel.plan import PlanArrays

    c = _context(model, cluster, PlanArrays.from_plans([plan]), load_profile("GB200"), "megatron-core", 1.0, None)
    return float(_layer_activation_bytes(c)[0][0])


def test_offloaded_layers_leave_the_gpu_and_their_copies_show_where_slower_than_the_layer():
    model, cluster, plan = _fsdp_70b_gb200()
    none = _est(model, cluster, plan, recompute="none", recompute_layers=None)
    full = _est(model, cluster, plan, recompute="full", recompute_layers=None)
    off = _est(model, cluster, plan, recompute="offload", recompute_layers=50)
    layer = _layer_bytes(model, cluster, plan.model_copy(update={"recompute": "offload"}))
    assert 3e9 < layer < 4.5e9                      # one 8k x 2 micro-batch layer at tp1 with fp8 GEMM inputs
    # 50 of 80 layers' activations leave the GPU but one in transit, and wait in host memory.
    assert none.memory_breakdown_bytes["activations"] - off.memory_breakdown_bytes["activations"] == \
        pytest.approx(49 * layer, rel=1e-9)
    assert off.memory_breakdown_bytes["host_offload"] == pytest.approx(50 * layer, rel=1e-9)
    assert none.memory_breakdown_bytes["host_offload"] == 0.0
    assert not none.fits and off.fits
    # On the 225 GB/s C2C link a layer's copy outlasts its forward, not its backward.
    assert off.breakdown_s["offload"] > 0 and off.breakdown_s["recompute"] == 0
    assert none.step_time_s < off.step_time_s < full.step_time_s
    # A link fast enough hides every copy: the step of no recompute; half the link shows more than twice as much.
    fast = _est(model, cluster, plan, bw=1e15, recompute="offload", recompute_layers=50)
    assert fast.breakdown_s["offload"] == 0.0
    assert fast.step_time_s == pytest.approx(none.step_time_s, rel=1e-3)
    slow = _est(model, cluster, plan, bw=112.5e9, recompute="offload", recompute_layers=50)
    assert slow.breakdown_s["offload"] > 2 * off.breakdown_s["offload"]
    # Unset layers: all but the last (the most megatron-core offloads); exposure grows with the layers.
    most = _est(model, cluster, plan, recompute="offload", recompute_layers=None)
    assert most.breakdown_s["offload"] == pytest.approx(off.breakdown_s["offload"] * 79 / 50, rel=1e-9)


def test_offloaded_activations_must_fit_the_hosts_memory():
    """GB200: 480 GB of LPDDR5X per two GPUs, 80% of it for activations (costmodel.memory.HOST_USABLE_FRACTION)."""
    from costmodel.memory import HOST_USABLE_FRACTION

    model, cluster, plan = _fsdp_70b_gb200()
    layer = _layer_bytes(model, cluster, plan.model_copy(update={"recompute": "offload"}))
    room = int(240e9 * HOST_USABLE_FRACTION // layer)
    assert 40 < room < 60
    inside = _est(model, cluster, plan, recompute="offload", recompute_layers=room)
    over = _est(model, cluster, plan, recompute="offload", recompute_layers=room + 1)
    assert inside.fits and not over.fits
    assert max(over.peak_memory_bytes) < max(inside.peak_memory_bytes) < over.memory_capacity_bytes


def test_offloading_is_megatron_cores_rules():
    model = get_model("70b")
    ok = ParallelPlan(tp=8, pp=1, dp=8, global_batch=64, recompute="offload", recompute_layers=40)
    assert violations(model, ok, 64) == []
    bad_pp = ok.model_copy(update={"pp": 2, "dp": 4})
    assert any("needs pp=1" in v for v in violations(model, bad_pp, 64))
    too_many = ok.model_copy(update={"recompute_layers": model.layers})
    assert any("offloads 1 to 79" in v for v in violations(model, too_many, 64))
    paxml = ok.model_copy(update={"framework": "paxml"})
    assert any("--cpu-offloading" in v for v in violations(model, paxml, 64))


def test_megatron_arguments_write_and_read_offloading():
    model = get_model("70b")
    plan = ParallelPlan(tp=8, pp=1, dp=8, global_batch=64, recompute="offload", recompute_layers=40)
    args = megatron_args(model, plan)
    assert "--cpu-offloading" in args and "--cpu-offloading-num-layers 40" in args
    assert not any(a.startswith("--recompute") for a in args)
    back = parse_megatron_args(args, num_gpus=64)
    assert back["recompute"] == "offload" and back["recompute_layers"] == 40
    every = megatron_args(model, plan.model_copy(update={"recompute_layers": None}))
    assert "--cpu-offloading-num-layers 79" in every


def test_the_search_offers_offloading_at_pp1_where_the_host_link_is_known():
    model, cluster = get_model("8b"), load_cluster_64("gb200-nvl72x8")
    plans = valid_plans(model, cluster, 256)
    off = plans.recompute == 3
    assert off.any() and (plans.pp[off] == 1).all()
    host = load_profile("H100").model_copy(update={"host_link_bandwidth_bytes_per_s": None})
    from planner import space

    orig = space.offload_searched
    try:
        space.offload_searched = lambda c: host.host_link_bandwidth_bytes_per_s is not None
        assert not (valid_plans(model, cluster, 256).recompute == 3).any()
    finally:
        space.offload_searched = orig


def load_cluster_64(name):
    from costmodel.profiles import load_cluster

    c = load_cluster(name)
    return c.model_copy(update={"nodes": 64 // c.gpus_per_node})


def test_published_rows_read_offloading_and_an_unknown_setting_takes_the_fastest_that_fits(tmp_path):
    assert recompute_named("cpu offloading (40 layers)") == "offload"
    assert recompute_named("offload") == "offload"
    rows = list(csv.DictReader(CSV.open()))
    base = next(r for r in rows if r["scored"] == "true" and r["gpu_type"] == "GB200"
                and r["model_name"] == "Llama3-70B" and "fsdp" in r["zero_stage_or_distopt"].lower())
    path = write_rows(tmp_path / "off.csv", [{**base, "recompute": "cpu offloading, 40 layers"}, base])
    cases, errors = load_cases(path)
    assert errors == [] and cases[0].plan.recompute == "offload" and cases[0].plan.recompute_layers == 40
    assert cases[0].recompute_known and not cases[1].recompute_known
    from costmodel.validate import predict_case

    guess = predict_case(cases[1])
    # Megatron-Bridge's recipe offloads 40 layers (cpu_offloading_num_layers=40): so does the fastest setting
    # that fits the GPU and the host (a peak above the planner's 95% margin would count: tests/test_pooling.py).
    assert guess["plan"].recompute == "offload" and guess["plan"].recompute_layers == 40
    assert "recompute=offload:40 (fastest that fits)" in guess["assumed"]
    assert guess["predicted_peak_memory_bytes"] <= load_profile("GB200").memory_bytes.value


def test_a_training_log_with_cpu_offloading_reads_as_an_offload_plan():
    text = (ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    line = "  recompute_granularity ........................... None\n"
    assert line in text and "cpu_offloading" not in text
    patched = text.replace(line, "  cpu_offloading .................................. True\n"
                                 "  cpu_offloading_num_layers ....................... 12\n" + line)
    plan = parse_megatron_log(patched, "off.log", gpu="H100").measurement.plan
    assert plan.recompute == "offload" and plan.recompute_layers == 12
    assert parse_megatron_log(text, "on.log", gpu="H100").measurement.plan.recompute == "none"


def test_plan_check_without_a_host_link_is_a_one_line_error(tmp_path, capsys):
    prof = yaml.safe_load((ROOT / "hardware_profiles" / "gpus" / "H100.yaml").read_text())
    prof.pop("host_link_bandwidth_bytes_per_s")
    prof["name"], prof["aliases"] = "H100-nolink", []
    (tmp_path / "H100-nolink.yaml").write_text(yaml.safe_dump(prof))
    cl = yaml.safe_load((ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml").read_text())
    cl["gpu"] = str(tmp_path / "H100-nolink.yaml")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cl))
    rc = main(["check", "--model", "8b", "--cluster", str(tmp_path / "c.yaml"), "--tp", "8", "--recompute",
               "offload"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no host_link_bandwidth_bytes_per_s" in err and err.count("\n") == 1


def test_offloading_shares_a_pcie_link_with_fsdps_network_traffic_and_not_a_c2c_one():
    """On a PCIe GPU the host link also carries the GPU's GPUDirect RDMA traffic: a Megatron-FSDP plan whose shard
    group spans nodes gathers (and reduce-scatters) each layer over the NIC while the offload copies cross the same
    link, so what both need beyond the layer shows. Llama 3.1 405B at tp4 over 128 FSDP ranks on 512 H100 (the
    planner's pick before): no offload time alone, 4.6 s of a 38.5 s step together; the same plan with ZeRO-1,
    or on a profile whose host link is its own (Grace's C2C), is unchanged."""
    from costmodel.profiles import load_cluster

    model, cluster = get_model("405b"), load_cluster(ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml")
    assert [load_profile(g).host_link_shared_with_network for g in ("H100", "B200", "A100-80GB", "GB200", "GH200")] \
        == [True, True, True, False, False]
    shared = load_profile("H100")
    own = shared.model_copy(update={"host_link_shared_with_network": False})
    fsdp = ParallelPlan(tp=4, pp=1, dp=128, sequence_parallel=True, micro_batch=1, global_batch=512,
                        recompute="offload", zero_stage=3)
    alone, both = estimate(model, cluster, fsdp, profile=own), estimate(model, cluster, fsdp, profile=shared)
    assert alone.breakdown_s["offload"] == 0.0
    assert 4.0 < both.breakdown_s["offload"] < 5.5
    assert both.step_time_s - alone.step_time_s == pytest.approx(both.breakdown_s["offload"], rel=0.1)
    # Weights kept whole on each rank (the distributed optimizer): nothing crosses the NIC per layer.
    zero1 = fsdp.model_copy(update={"tp": 8, "dp": 64, "zero_stage": 1})
    assert estimate(model, cluster, zero1, profile=own).breakdown_s == \
        estimate(model, cluster, zero1, profile=shared).breakdown_s
