"""Capacity planning and what-if sweeps (planner/capacity.py, `plan capacity`, `plan whatif`): each point is a
full re-plan with the planner's exhaustive search; each varied quantity moves the prediction the expected way;
gradient compression is a real cost-model knob; deadlines and budgets pick the right cluster, and one that
cannot be met is reported with the closest option; bad values are one-line exit-2 errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.compression import COMPRESSORS, get_compression
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays, default_global_batch
from costmodel.profiles import InputError, load_cluster
from planner.capacity import (DAY_S, Assumptions, Scenario, decide, parse_bandwidth, parse_duration, parse_money,
                              parse_tokens, parse_vary, pareto, refine_sizes, resize, size_range, sweep, vary,
                              whatif_scenarios)
from planner.cli import main
from planner.search import exhaustive
from test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "capacity_405b" / "clusters"
A = Assumptions(tokens=15e12)
SIZES = [256, 512, 1024, 2048, 4096]


@pytest.fixture(scope="module")
def base70():
    return Scenario(get_model("70b"), load_cluster("h100x512"), source="h100x512")


def _sweep(base, dim, values):
    return sweep(whatif_scenarios(base, [(dim, values)]), A)


@pytest.fixture(scope="module")
def by_gpus(base70):
    return _sweep(base70, "gpus", SIZES)


# ---- parsing -----------------------------------------------------------------------------------------------

def test_parse_suffixes():
    assert parse_tokens("15T") == 15e12 and parse_tokens("300B") == 300e9 and parse_tokens("2.5e12") == 2.5e12
    assert parse_duration("30d") == 30 * DAY_S and parse_duration("12h") == 43_200 and parse_duration("90m") == 5400
    assert parse_money("$2.5M") == 2.5e6 and parse_money("800k") == 8e5 and parse_money("$1,000,000") == 1e6
    assert parse_bandwidth("400Gbps") == 50e9 and parse_bandwidth("50GB/s") == 50e9 and parse_bandwidth("5e10") == 5e10
    assert parse_vary("seq=4k,8192") == ("seq_len", [4096, 8192])
    assert parse_vary("gpu=h100,b200") == ("gpu", ["H100", "B200"])
    assert parse_vary("precision=bf16,fp8-mixed") == ("precision", ["bf16", "fp8"])
    assert parse_vary("taper=1,2:1,7") == ("oversubscription", [1.0, 2.0, 7.0])
    for bad, fn in (("15X", parse_tokens), ("-3T", parse_tokens), ("soon", parse_duration), ("0d", parse_duration),
                    ("lots", parse_money), ("fast", parse_bandwidth), ("400G", parse_bandwidth)):
        with pytest.raises(InputError):
            fn(bad)
    for bad in ("gpus", "colour=red", "gpus=", "gpus=8,8", "gpu=TPU", "precision=fp2", "compression=zip",
                "oversubscription=0.5", "oversubscription=1:2", "oversubscription=high", "oversubscription=2:0"):
        with pytest.raises(InputError):
            parse_vary(bad)


def test_resize_whole_nodes_and_domains():
    h = load_cluster("h100x512")
    assert resize(h, 2048).num_gpus == 2048 and resize(h, 2048).nodes == 256
    with pytest.raises(InputError, match="multiples of 8"):
        resize(h, 100)
    nvl = load_cluster("gb200-nvl72x8")
    assert resize(nvl, 144).nodes == 36
    with pytest.raises(InputError, match="multiples of 72"):
        resize(nvl, 128)
    assert size_range(h, 256, 4096) == SIZES
    assert size_range(nvl, 72, 600) == [72, 144, 288, 576]


# ---- each point is a full re-plan ---------------------------------------------------------------------------

def test_points_are_the_planners_best_plan(by_gpus):
    m = get_model("70b")
    layouts = set()
    for p in by_gpus:
        cl = p.scenario.cluster
        assert cl.num_gpus == p.gpus and cl.num_gpus == p.plan.world_size
        res = exhaustive(m, cl, default_global_batch(m.seq_len, cl.num_gpus))
        assert p.plan.model_dump() == res.plan(0).model_dump()
        assert p.step_time_s == pytest.approx(float(res.scores["step_time_s"][res.order[0]]), rel=1e-12)
        assert p.train_time_s == pytest.approx(15e12 / (p.tokens_per_s_per_gpu * p.gpus), rel=1e-12)
        assert p.wall_time_s == pytest.approx(p.train_time_s / p.goodput.goodput, rel=1e-12)
        assert p.cost_usd == pytest.approx(p.wall_time_s / 3600 * p.gpus * 2.5, rel=1e-12)
        layouts.add((p.plan.tp, p.plan.pp, p.plan.vpp))
    assert len(layouts) > 1       # the layout changes with the size: not a rescaled plan


# ---- directions ---------------------------------------------------------------------------------------------

def test_more_gpus_train_faster_with_lower_goodput_and_more_gpu_hours(by_gpus):
    wall = [p.wall_time_s for p in by_gpus]
    good = [p.goodput.goodput for p in by_gpus]
    hours = [p.gpu_hours for p in by_gpus]
    assert all(a > b for a, b in zip(wall, wall[1:])), wall
    assert all(a > b for a, b in zip(good, good[1:])), good
    assert all(a < b for a, b in zip(hours, hours[1:])), hours


def test_more_bandwidth_never_slower(base70):
    pts = _sweep(base70, "bandwidth", [3.125e9, 6.25e9, 12.5e9, 25e9, 50e9, 100e9, 200e9])
    step = [p.step_time_s for p in pts]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(step, step[1:])), step
    assert step[0] > step[-1] * 1.2


def test_a_thinner_core_never_helps_and_slows_rings_with_few_domains_per_block(base70):
    """With one node per full-bisection block every data-parallel ring crosses the core out of each node
    (costmodel/comm.py core_share): the best plan slows as the core thins; with 32-node blocks (the cluster as
    shipped) a 1:16 core leaves the 70B plan as it was."""
    cl = base70.cluster
    per_node = replace(base70, cluster=cl.model_copy(update={"inter_node": cl.inter_node.model_copy(
        update={"full_bisection_nodes": 1})}))
    step = [p.step_time_s for p in _sweep(per_node, "oversubscription", [1.0, 4.0, 16.0])]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(step, step[1:])), step
    assert step[-1] > step[0] * 1.01, step
    shipped = [p.step_time_s for p in _sweep(base70, "oversubscription", [1.0, 16.0])]
    assert shipped[0] == shipped[1]
    assert vary(base70, "oversubscription", 7.0).cluster.inter_node.oversubscription == 7.0


def test_faster_gpu_types_train_faster(base70):
    pts = {p.gpu_type: p for p in _sweep(base70, "gpu", ["A100-80GB", "H100", "H200", "B200"])}
    assert pts["A100-80GB"].wall_time_s > pts["H100"].wall_time_s >= pts["H200"].wall_time_s > pts["B200"].wall_time_s


@pytest.mark.parametrize("cluster", ["h100x512", "h200x256", "b200x1024"])
def test_fp8_never_slower_than_bf16_on_fp8_hardware(cluster):
    base = Scenario(get_model("70b"), load_cluster(cluster))
    bf16, fp8 = _sweep(base, "precision", ["bf16", "fp8"])
    assert fp8.step_time_s <= bf16.step_time_s
    assert fp8.tokens_per_s_per_gpu >= bf16.tokens_per_s_per_gpu


def test_fp8_gains_nothing_without_fp8_hardware():
    base = Scenario(get_model("70b"), load_cluster("a100x1024"))
    bf16, fp8 = _sweep(base, "precision", ["bf16", "fp8"])
    assert fp8.step_time_s >= bf16.step_time_s


def test_longer_sequences_cost_more_per_token(base70):
    pts = _sweep(base70, "seq_len", [2048, 4096, 8192, 16384, 32768])
    tps = [p.tokens_per_s_per_gpu for p in pts]
    assert all(a > b for a, b in zip(tps, tps[1:])), tps
    # The default global batch keeps ~4M tokens per step as the sequence grows.
    assert [p.global_batch * p.scenario.model.seq_len for p in pts] == [4 * 2**20] * 5


def test_larger_global_batch_never_slower_per_token(base70):
    pts = _sweep(base70, "global_batch", [128, 256, 512, 1024, 2048])
    wall = [p.train_time_s for p in pts]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(wall, wall[1:])), wall


def test_compression_helps_on_a_slow_network_and_costs_on_a_fast_one(base70):
    slow = vary(base70, "bandwidth", 6.25e9)
    none, int8 = _sweep(slow, "compression", ["none", "int8"])
    assert int8.step_time_s < none.step_time_s
    small = Scenario(get_model("8b"), load_cluster("h100x512"))
    none, int8 = _sweep(small, "compression", ["none", "int8"])
    assert int8.step_time_s > none.step_time_s        # 400 Gb/s hides the traffic; the kernels remain


# ---- gradient compression in the cost model -----------------------------------------------------------------

PLAN = ParallelPlan(tp=4, pp=4, vpp=10, dp=32, global_batch=512, recompute="selective")


def test_compression_moves_fewer_dp_bytes_and_adds_kernels_and_memory():
    m, cl = get_model("70b"), load_cluster("h100x512")
    slow = cl.model_copy(update={"inter_node": cl.inter_node.model_copy(update={"nic_bandwidth_bytes_per_s": 2e9})})
    base = estimate(m, slow, PLAN)
    for name in ("int8", "int4"):
        comp = get_compression(name)
        est = estimate(m, slow, PLAN, grad_compression=comp)
        assert est.breakdown_s["dp_comm_exposed"] < base.breakdown_s["dp_comm_exposed"]
        assert est.step_time_s < base.step_time_s
        p_stage = base.memory_breakdown_bytes["grads"] / 2.0       # bf16 gradients in megatron-core
        assert est.memory_breakdown_bytes["grads"] == pytest.approx(base.memory_breakdown_bytes["grads"]
                                                                    + 4.0 * p_stage, rel=1e-12)
        for k in ("compute", "bubble", "optimizer", "tp_comm_exposed"):
            assert est.breakdown_s[k] == base.breakdown_s[k]
    assert COMPRESSORS["int4"].wire_bytes_per_element < COMPRESSORS["int8"].wire_bytes_per_element < 2.0


def test_compression_without_dp_traffic_only_adds_time():
    m, cl = get_model("8b"), load_cluster("h100x512").model_copy(update={"nodes": 1})
    plan = ParallelPlan(tp=8, dp=1, global_batch=64)
    a = PlanArrays.from_plans([plan])
    base = estimate_arrays(m, cl, a)
    comp = estimate_arrays(m, cl, a, grad_compression=get_compression("int8"))
    assert base["dp_comm_exposed_s"][0] == 0.0
    added = comp["details"]["grad_compression_s"][0]
    assert added > 0 and comp["step_time_s"][0] == pytest.approx(base["step_time_s"][0] + added, rel=1e-12)


def test_no_compression_leaves_estimates_unchanged():
    m, cl = get_model("70b"), load_cluster("h100x512")
    a = PlanArrays.from_plans([PLAN, PLAN.model_copy(update={"dp": 16, "pp": 8, "vpp": 5})])
    x, y = estimate_arrays(m, cl, a), estimate_arrays(m, cl, a, grad_compression=get_compression("none"))
    for k in ("step_time_s", "step_time_lower_s", "step_time_upper_s", "peak_memory_bytes", "dp_comm_exposed_s"):
        assert np.array_equal(x[k], y[k])


# ---- deadline, budget, Pareto -------------------------------------------------------------------------------

def test_deadline_picks_the_cheapest_that_meets_it(by_gpus):
    d = decide(by_gpus, deadline_s=100 * DAY_S)
    meeting = [p for p in by_gpus if p.wall_time_s <= 100 * DAY_S]
    assert d.met and d.best is min(meeting, key=lambda p: p.cost_usd)
    assert d.best.gpus == 2048 and "cheapest meeting the deadline" in d.message


def test_budget_picks_the_fastest_within_it(by_gpus):
    d = decide(by_gpus, budget_usd=10e6)
    within = [p for p in by_gpus if p.cost_usd <= 10e6]
    # 2048 GPUs cost $10.7M since the scale terms (stragglers, NCCL bucket latency) and Megatron-FSDP's real
    # prefetch / reduce-scatter buffers (which push 70B at 2048 from FSDP tp4 to tp8): 1024 is the fastest within.
    assert d.met and d.best is min(within, key=lambda p: p.wall_time_s) and d.best.gpus == 1024


def test_unreachable_deadline_reports_the_closest(by_gpus):
    d = decide(by_gpus, deadline_s=20 * DAY_S)
    assert d.best is None and not d.met
    assert d.closest is min(by_gpus, key=lambda p: p.wall_time_s) and d.closest.gpus == 4096
    assert "no cluster in range" in d.message and "closest: 4096 x H100" in d.message
    d = decide(by_gpus, budget_usd=1e6)
    assert d.best is None and d.closest is min(by_gpus, key=lambda p: p.cost_usd)


def test_refinement_bisects_where_the_deadline_flips(by_gpus):
    extra = refine_sizes(by_gpus, 60 * DAY_S, None)          # 2048 misses, 4096 meets
    assert [sc.cluster.num_gpus for sc in extra] == [3072]
    assert refine_sizes(by_gpus, None, None) == []


def test_pareto_front(by_gpus):
    front = pareto(by_gpus)
    assert front == sorted(by_gpus, key=lambda p: p.wall_time_s)    # bigger is faster and dearer: all on the front
    slow = by_gpus[-1]
    worse = [p for p in by_gpus if p is not slow]
    assert slow in pareto(worse + [slow])


# ---- the commands -------------------------------------------------------------------------------------------

def test_capacity_json_several_gpu_types(capsys):
    rc, out, _ = run_cli(capsys, ["capacity", "--model", "70b", "--tokens", "15T", "--cluster", EXAMPLE / "h100.yaml",
                                  EXAMPLE / "b200.yaml", "--gpus", "1024,2048", "--deadline", "120d", "--json"])
    assert rc == 0
    d = json.loads(out)
    assert [(p["gpu"], p["gpus"]) for p in d["points"]] == [("H100", 1024), ("H100", 2048), ("B200", 1024),
                                                              ("B200", 2048)]
    best = d["points"][d["best"]]
    meeting = [p for p in d["points"] if p["wall_time_s"] <= 120 * DAY_S]
    assert d["met"] and best["cost_usd"] == min(p["cost_usd"] for p in meeting)
    assert all(0 < p["goodput"]["goodput"] < 1 for p in d["points"])


def test_capacity_of_several_clusters_at_their_own_sizes_names_each(capsys):
    """Each cluster's points carry the cluster they were sized from, in the JSON and the table's first column."""
    args = ["capacity", "--model", "8b", "--tokens", "1T", "--cluster", "h100x512", "b200x1024"]
    rc, out, _ = run_cli(capsys, args + ["--json"])
    assert rc == 0
    assert [p["varied"] for p in json.loads(out)["points"]] == [{"cluster": "h100x512", "gpus": 512},
                                                                 {"cluster": "b200x1024", "gpus": 1024}]
    rc, out, _ = run_cli(capsys, args)
    rows = [line.split("\u2502")[1].strip() for line in out.splitlines() if "\u2502" in line]
    assert rows == ["h100x512", "b200x1024"]


def test_capacity_unmet_deadline_exit_1_with_closest(capsys, tmp_path):
    png = tmp_path / "c.png"
    rc, out, _ = run_cli(capsys, ["capacity", "--model", "70b", "--tokens", "15T", "--cluster", "h100x512",
                                  "--min-gpus", "256", "--max-gpus", "1024", "--deadline", "30d", "--plot", png])
    assert rc == 1
    assert "no cluster in range (256-1024 GPUs, H100) meets the deadline of 30.0 d; closest: 1024 x H100" in \
        " ".join(out.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_whatif_two_dimensions_json_and_plot(capsys, tmp_path):
    png = tmp_path / "w.png"
    rc, out, _ = run_cli(capsys, ["whatif", "--model", "8b", "--tokens", "1T", "--cluster", "h100x512",
                                  "--vary", "gpus=64,128", "--vary", "compression=none,int8", "--json", "--plot", png])
    assert rc == 0
    d = json.loads(out)
    assert [(p["gpus"], p["compression"]) for p in d["points"]] == [(64, "none"), (64, "int8"), (128, "none"),
                                                                    (128, "int8")]
    assert png.exists() and d["plot"] == str(png)


@pytest.mark.parametrize("argv,needles", [
    (["capacity", "--model", "70b", "--tokens", "15X", "--cluster", "h100x512"], ["--tokens", "15T"]),
    (["capacity", "--model", "70b", "--cluster", "h100x512", "--deadline", "soon"], ["--deadline", "30d"]),
    (["capacity", "--model", "70b", "--cluster", "h100x512", "--budget", "lots"], ["--budget", "$2.5M"]),
    (["capacity", "--model", "70b", "--cluster", "h100x512", "--gpus", "100"], ["gpus=100", "multiples of 8"]),
    (["whatif", "--model", "70b", "--cluster", "h100x512", "--vary", "colour=red"], ["colour", "valid"]),
    (["whatif", "--model", "70b", "--cluster", "h100x512"], ["--vary"]),
    (["whatif", "--model", "70b", "--cluster", "h100x512", "--vary", "compression=zip"], ["compression", "int8"]),
    (["whatif", "--model", "70b", "--cluster", "h100x512", "--vary", "gpus=256", "--plot", "/nonexistent/x.png"],
     ["/nonexistent"]),
])
def test_bad_values_one_line_exit_2(capsys, argv, needles):
    rc, _, err = run_cli(capsys, argv)
    assert_one_line_error(rc, err, *needles)


def test_budget_needs_a_price(capsys, tmp_path):
    """Every shipped cluster has an (illustrative) price; a file without one cannot answer --budget."""
    from costmodel.profiles import PROFILE_DIR

    text = (PROFILE_DIR / "clusters" / "h200x256.yaml").read_text()
    unpriced = tmp_path / "unpriced.yaml"
    unpriced.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("price_per_gpu_hour_usd")))
    rc, _, err = run_cli(capsys, ["capacity", "--model", "70b", "--cluster", unpriced, "--budget", "$1M"])
    assert_one_line_error(rc, err, "unpriced", "price_per_gpu_hour_usd")


def test_every_shipped_cluster_has_an_illustrative_price():
    from costmodel.profiles import PROFILE_DIR, load_cluster

    for path in sorted((PROFILE_DIR / "clusters").glob("*.yaml")):
        c = load_cluster(path)
        prices = [g.price_per_gpu_hour_usd for g in c.device_groups] or [c.price_per_gpu_hour_usd]
        assert all(p is not None and 0.5 < p < 20 for p in prices), path.name
        assert "Illustrative on-demand price" in path.read_text(), path.name


def test_main_lists_the_subcommands():
    from planner.cli import SUBCOMMANDS

    assert {"capacity", "whatif"} <= set(SUBCOMMANDS)
    assert main(["whatif", "--model", "8b", "--tokens", "1T", "--cluster", "h100x512", "--vary", "gpus=64",
                 "--json"]) == 0


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_costed_as_bf16():
    """A100 has no fp8 peak: an fp8 model there runs (and is costed) as its bf16 fallback, step time and memory
    alike, with no fp8 calibration factor or quantisation traffic; on H100 the same plans are faster in fp8."""
    plans = PlanArrays.from_plans([
        ParallelPlan(tp=2, pp=1, dp=512, micro_batch=1, global_batch=512, recompute="offload", zero_stage=3,
                     distributed_optimizer=True),
        ParallelPlan(tp=8, pp=2, dp=64, micro_batch=1, global_batch=512, recompute="selective")])
    out = {}
    for prec in ("bf16", "fp8"):
        m = get_model("70b").model_copy(update={"precision": prec})
        out[prec] = estimate_arrays(m, load_cluster("a100x1024"), plans)
    assert np.array_equal(out["fp8"]["step_time_s"], out["bf16"]["step_time_s"])
    np.testing.assert_array_equal(np.asarray(out["fp8"]["peak_memory_bytes"]),   # NaN pads unused stages
                                  np.asarray(out["bf16"]["peak_memory_bytes"]))
    h100 = {p: estimate_arrays(get_model("70b").model_copy(update={"precision": p}), load_cluster("h100x512"),
                               PlanArrays.from_plans([ParallelPlan(tp=8, pp=2, dp=32, micro_batch=1,
                                                                   global_batch=512, recompute="selective")]))
            for p in ("bf16", "fp8")}
    assert h100["fp8"]["step_time_s"][0] < 0.85 * h100["bf16"]["step_time_s"][0]


def test_restarts_that_outlast_the_time_between_failures_are_no_progress_not_a_crash(capsys):
    # A restart of 1e20 s per failure made goodput 0 and plan_point divided by it (ZeroDivisionError).
    rc, out, err = run_cli(capsys, ["capacity", "--model", "8b", "--cluster", "h100x512", "--restart", "1e20",
                                    "--json"])
    assert "Traceback" not in err
    point = json.loads(out)["points"][0]
    assert not point["fits"] and point["reason"].startswith("failures leave no progress: ")
    assert "goodput 0" in point["reason"]


@pytest.mark.parametrize("option", ["--budget", "--deadline", "--gpus", "--tokens", "--checkpoint-interval",
                                    "--price-per-gpu-hour"])
def test_an_empty_value_is_an_error_not_an_option_left_out(capsys, option):
    # '--budget ""' (a script's unset variable) planned as if no budget had been asked for.
    rc, _, err = run_cli(capsys, ["capacity", "--model", "8b", "--cluster", "h100x512", option, ""])
    assert_one_line_error(rc, err, f"{option} ''", "expected")


def test_varying_the_gpu_to_a_pcie_board_takes_its_bridged_pair_as_the_nvlink_domain(base70):
    """An 8-GPU-per-node H100 cluster varied to H100 PCIe (bridged pairs) or H200 NVL (bridged fours) gets the
    board's NVLink domain; to another SXM part it keeps the node-wide one."""
    from planner.capacity import vary

    sc = base70
    assert sc.cluster.domain_gpus == 8
    assert vary(sc, "gpu", "H100-PCIe").cluster.domain_gpus == 2
    assert vary(sc, "gpu", "H200-NVL").cluster.domain_gpus == 4
    assert vary(sc, "gpu", "B200").cluster.domain_gpus == 8


def test_a_point_that_fits_nowhere_names_the_layout_that_fits_with_the_optimizer_in_host_memory():
    from planner.capacity import plan_point

    one_node = load_cluster("h100x512").model_copy(update={"nodes": 1})
    point = plan_point(Scenario(get_model("70b"), one_node, global_batch=64), Assumptions(tokens=1e12))
    assert not point.fits
    assert point.reason.startswith("no layout fits in memory: the closest needs")
    assert "with the optimizer state in host memory (optimizer_offload 1" in point.reason
    # (no selective: on a dense model's Transformer Engine layers megatron-core's selective frees nothing)
    assert "tp4 pp1 dp1 cp2 fsdp optim-cpu, none recompute, micro-batch 1 fits at 58.6 s per step" in point.reason


def test_whatif_varies_the_share_of_the_optimizer_state_in_host_memory(capsys, tmp_path):
    """plan whatif --vary optimizer_offload=0,0.5,1: each point re-plans over the layouts that offload that share.
    70B on one 8-H100 node at global batch 64 fits only with all of it on the host (tp4 dp2 FSDP, 57.0 s, the
    layout plan --optimizer-offload 1 finds); a GPU whose host is unknown gets a reason, not a price; a share
    outside 0-1 is a one-line error."""
    import yaml

    cl = yaml.safe_load((Path(__file__).resolve().parent.parent / "hardware_profiles" / "clusters" /
                         "h100x512.yaml").read_text())
    cl["nodes"] = 1
    (tmp_path / "h100x8.yaml").write_text(yaml.safe_dump(cl))
    argv = ["whatif", "--model", "70b", "--tokens", "100B", "--cluster", tmp_path / "h100x8.yaml", "--global-batch",
            "64", "--vary", "optimizer_offload=0,0.5,1", "--json"]
    rc, out, _ = run_cli(capsys, argv)
    points = json.loads(out)["points"]
    assert rc == 0 and [p["varied"]["optimizer_offload"] for p in points] == [0.0, 0.5, 1.0]
    assert [p["fits"] for p in points] == [False, False, True]
    assert points[0]["reason"].startswith("no layout fits in memory: the closest needs 150 GB")
    best = points[2]["plan"]
    assert (best["tp"], best["cp"], best["dp"], best["zero_stage"], best["optimizer_offload"]) == (4, 2, 1, 3, 1.0)
    assert points[2]["step_time_s"] == pytest.approx(58.6, abs=0.05)
    cl["gpu"] = "H100-PCIe"
    (tmp_path / "pcie.yaml").write_text(yaml.safe_dump(cl))
    rc, out, _ = run_cli(capsys, [*argv[:6], tmp_path / "pcie.yaml", *argv[7:10], "optimizer_offload=1", "--json"])
    point = json.loads(out)["points"][0]
    assert rc in (0, 1) and not point["fits"]
    assert point["reason"] == ("optimizer offload needs the host of a H100-PCIe, and its profile has no "
                               "host_memory_bandwidth_bytes_per_s")
    rc, _, err = run_cli(capsys, [*argv[:10], "optimizer_offload=1.5"])
    assert_one_line_error(rc, err, "--vary optimizer_offload: '1.5' is not a share from 0 to 1")
