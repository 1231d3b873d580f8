"""Heterogeneous clusters: device groups in cluster files, the composed estimate (costmodel/hetero.py), the
exact layer split and the stage-to-group search (planner/hetero.py) against brute force, and plan on the
shipped mixed A100/V100 cluster."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import yaml

from costmodel.catalog import get_model
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import RECOMPUTE_NAMES, ParallelPlan, PlanArrays, parse_megatron_layout
from costmodel.hetero import HeteroPlan, estimate_hetero, group_cluster, group_clusters
from costmodel.profiles import PROFILE_DIR, InputError, load_cluster
from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.split import optimal_split, stage_coefficients
from planner.cli import main
from planner.hetero import _mixed_layouts, _valid_layouts, comparison, hetero_search, lower_bounds, write_hetero_outputs
from planner.search import exhaustive

MIXED = "a100-v100-mixed"
TINY = ModelSpec(name="tiny", layers=6, hidden=2048, ffn_hidden=5504, heads=16, vocab=32000, seq_len=2048)
TINY_MOE = ModelSpec(name="tiny-moe", layers=6, hidden=1024, ffn_hidden=4096, heads=8, vocab=32000, seq_len=2048,
                     num_experts=8, moe_topk=2, moe_ffn_hidden=1024, dense_layers=2)


def tiny_cluster(**link) -> ClusterSpec:
    return ClusterSpec.model_validate({
        "name": "tiny-mixed", "inter_node": {"nic_bandwidth_bytes_per_s": 12.5e9},
        "device_groups": [{"name": "fast", "gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 2},
                          {"name": "slow", "gpu": "V100-32GB", "nodes": 1, "gpus_per_node": 2}],
        "inter_group_link": link or {"bandwidth_gbps": 50}})


@pytest.fixture(scope="module")
def mixed():
    return load_cluster(MIXED)


# Cluster files ---------------------------------------------------------------------------------------


def test_homogeneous_cluster_files_load_as_before():
    for path in sorted((PROFILE_DIR / "clusters").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "device_groups" in raw:
            continue
        c = load_cluster(path)
        assert c.device_groups == () and c.inter_group_link is None
        assert c.num_gpus == raw["nodes"] * raw.get("gpus_per_node", 8)
        assert (c.gpu, c.nodes) == (raw["gpu"], raw["nodes"])


def test_mixed_cluster_file(mixed):
    a100, v100 = mixed.device_groups
    assert (a100.gpu, a100.num_gpus, v100.gpu, v100.num_gpus) == ("A100-80GB", 16, "V100-32GB", 32)
    assert mixed.num_gpus == 48 and mixed.nodes == 6 and mixed.gpu == "A100-80GB"
    assert mixed.inter_group_link.bandwidth_bytes_per_s == 100e9 / 8
    g = group_cluster(mixed, v100)
    assert (g.gpu, g.num_gpus, g.domain_gpus, g.inter_node.nic_bandwidth_bytes_per_s) == ("V100-32GB", 32, 8, 6.25e9)
    assert group_clusters(mixed)["a100"].inter_node.nic_bandwidth_bytes_per_s == 25e9
    assert "# " in (PROFILE_DIR / "clusters" / f"{MIXED}.yaml").read_text()   # commented and sourced


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["device_groups"][1].update(gpu="Z100"), "device_groups.1.gpu"),
    (lambda d: d["device_groups"][1].update(name="a100"), "not unique"),
    (lambda d: d["inter_group_link"].update(bandwidth_bytes_per_s=1e9), "not both"),
    (lambda d: d["inter_group_link"].update(bandwidth_gbps=-1), "positive"),
])
def test_bad_mixed_cluster_files(tmp_path, edit, message):
    data = yaml.safe_load((PROFILE_DIR / "clusters" / f"{MIXED}.yaml").read_text())
    edit(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=message) as err:
        load_cluster(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# The composed estimate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("group, plan", [
    ("a100", ParallelPlan(tp=2, pp=2, dp=4, global_batch=64, micro_batch=2)),
    ("v100", ParallelPlan(tp=4, pp=4, vpp=2, dp=2, global_batch=64, recompute="full", layers_per_stage=(9, 10, 11, 10))),
])
def test_one_group_is_estimated_as_a_homogeneous_cluster(mixed, group, plan):
    model = get_model("13b")
    ref = estimate(model, group_clusters(mixed)[group], plan)
    got = estimate_hetero(model, mixed, [HeteroPlan.from_plan(plan, group, model.layers)])[0]
    assert got.step_time_s == pytest.approx(ref.step_time_s, rel=1e-12)
    assert got.stage_time_s == pytest.approx(ref.stage_time_s, rel=1e-12)
    assert got.peak_memory_bytes == pytest.approx(ref.peak_memory_bytes, rel=1e-12)
    assert got.mfu == pytest.approx(ref.mfu, rel=1e-9)
    assert got.tokens_per_s_per_gpu == pytest.approx(ref.tokens_per_s_per_gpu, rel=1e-12)
    assert got.fits == ref.fits and got.inter_group_s == 0.0



@pytest.mark.parametrize("name, cluster, plan", [
    # Llama-3-8B with one MTP layer (issue 15: the heterogeneous MFU left the MTP module's FLOPs out).
    ("8b+mtp", "h100x512", ParallelPlan(tp=8, pp=2, dp=32, global_batch=512)),
    # DeepSeek-V3 has an MTP module of its own (MoE), over an uneven split of 61 layers.
    ("deepseek-v3", "b200x1024", ParallelPlan(tp=1, pp=8, dp=128, ep=8, global_batch=1024)),
])
def test_one_group_with_mtp_scores_exactly_like_estimate(name, cluster, plan):
    model = get_model(name.removesuffix("+mtp"))
    if name.endswith("+mtp"):
        model = model.model_copy(update={"mtp_layers": 1})
    assert model.mtp_layers == 1
    homogeneous = load_cluster(cluster)
    ref = estimate(model, homogeneous, plan)
    got = estimate_hetero(model, homogeneous, [HeteroPlan.from_plan(plan, homogeneous.name, model.layers)])[0]
    assert got.step_time_s == ref.step_time_s
    assert got.mfu == ref.mfu
    assert got.tokens_per_s_per_gpu == ref.tokens_per_s_per_gpu
    assert got.stage_time_s == ref.stage_time_s
    # The one group's MFU counts the same FLOPs (MTP on the last stage), summed per stage.
    assert got.groups[homogeneous.name]["mfu"] == pytest.approx(ref.mfu, rel=1e-12)

def test_stage_costs_are_linear_in_layers():
    """The probe coefficients reproduce estimate_arrays' stage times and memory for arbitrary splits (MoE model
    with leading dense layers)."""
    cluster = group_clusters(tiny_cluster())["fast"]
    plans = PlanArrays.from_columns(2, tp=[1, 2], pp=[3, 3], dp=[2, 1], ep=[2, 1], micro_batch=[1, 2],
                                    recompute=[0, 2], global_batch=16, sp=[False, True])
    coef = stage_coefficients(TINY_MOE, cluster, plans)
    for split in [(1, 3, 2), (3, 1, 2), (0, 4, 2), (2, 2, 2)]:
        plans.stage_layers = np.array([split, split], dtype=float)
        out = estimate_arrays(TINY_MOE, cluster, plans)
        start = np.cumsum((0,) + split[:-1])
        nd = np.clip(TINY_MOE.dense_layers - start, 0, split)
        nm = np.asarray(split) - nd
        for key, base in (("stage_time_s", "time"), ("peak_memory_bytes", "mem")):
            lin = coef[f"{base}0"] + coef[f"{base}_dense"] * nd + coef[f"{base}_moe"] * nm
            assert np.allclose(out[key], lin, rtol=1e-9), (key, split)


def test_hops_between_groups_cost_what_the_link_gives():
    plan = HeteroPlan(stage_groups=("fast", "slow"), stage_tp=(1, 1), stage_dp=(2, 2), layers_per_stage=(4, 2),
                      micro_batch_sequences=2, global_batch=16)
    fast_link, slow_link, shared = (estimate_hetero(TINY, tiny_cluster(**link), [plan])[0] for link in
                                    ({"bandwidth_gbps": 400}, {"bandwidth_gbps": 10},
                                     {"bandwidth_gbps": 10, "shared": True}))
    assert fast_link.inter_group_s >= 0.0
    assert slow_link.inter_group_s > fast_link.inter_group_s
    assert shared.inter_group_s > slow_link.inter_group_s          # one 10 Gb/s link for both crossing ranks
    assert shared.step_time_s > slow_link.step_time_s > fast_link.step_time_s - 1e-12


def test_launchability():
    same = HeteroPlan(stage_groups=("a100", "v100", "v100"), stage_tp=(2, 2, 2), stage_dp=(8, 8, 8),
                      layers_per_stage=(20, 10, 10), micro_batch_sequences=8, global_batch=768)
    assert same.launch_issue is None
    assert same.megatron_plan().layers_per_stage == (20, 10, 10) and same.megatron_plan().pp == 3
    tp = same.model_copy(update={"stage_tp": (1, 2, 2)})
    assert "tp differs" in tp.launch_issue and "1 on a100" in tp.launch_issue
    dp = HeteroPlan(stage_groups=("a100", "v100"), stage_tp=(2, 2), stage_dp=(8, 16), layers_per_stage=(20, 20),
                    micro_batch_sequences=16, global_batch=768)
    assert "dp differs" in dp.launch_issue
    assert dp.stage_micro_batch == (2, 1)
    with pytest.raises(ValueError, match="multiple of dp"):
        HeteroPlan(stage_groups=("a100",), stage_tp=(1,), stage_dp=(3,), layers_per_stage=(40,),
                   micro_batch_sequences=4, global_batch=768)


# The exact split and the search against brute force -----------------------------------------------------


def _compositions(layers: int, pp: int):
    for cuts in itertools.combinations_with_replacement(range(layers + 1), pp - 1):
        split = tuple(b - a for a, b in zip((0,) + cuts, cuts + (layers,)))
        if pp == 1 or all(x >= 1 for x in split[1:-1]):
            yield split


def test_optimal_split_matches_brute_force():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(200):
        pp, layers = int(rng.integers(1, 5)), int(rng.integers(2, 10))
        if layers < pp - 2:
            continue
        # any placement of the dense and MoE layers (leading dense, interleaved, ...)
        dense_before = np.concatenate([[0], np.cumsum(rng.random(layers) < rng.uniform())])
        m, vpp = int(rng.integers(1, 12)), int(rng.integers(1, 3))
        t0, td, tm = rng.uniform(0, 2, pp), rng.uniform(0.5, 2, pp), rng.uniform(0.5, 3, pp)
        m0, md, mm, cap = rng.uniform(0, 2, pp), rng.uniform(0.1, 1, pp), rng.uniform(0.1, 2, pp), rng.uniform(3, 12, pp)
        best = np.inf
        for split in _compositions(layers, pp):
            start = np.cumsum((0,) + split[:-1])
            nd = dense_before[start + np.asarray(split)] - dense_before[start]
            nm = np.asarray(split) - nd
            if (m0 + md * nd + mm * nm > cap).any():
                continue
            t = t0 + td * nd + tm * nm
            best = min(best, m * t.max() + (t.sum() - t.max()) / vpp)
        got = optimal_split(t0, td, tm, m0, md, mm, cap, dense_before=dense_before, microbatches=m, vpp=vpp)
        assert sum(got.layers_per_stage) == layers
        if np.isfinite(best):
            assert got.fits and got.exact and got.pipeline_s == pytest.approx(best, rel=1e-12)
            checked += 1
        else:
            assert not got.fits
    assert checked > 100


def test_lower_bounds_never_rule_out_a_split_that_fits_nor_beat_it():
    """The search splits layouts in lower-bound order and never splits one whose bound is inf: on random stage
    tables (stages padded with NaN, dense and MoE layers placed at random, capacities from roomy to too small) a
    layout with a split that fits has a finite bound no larger than that split's step."""
    from costmodel.estimate import STEP_OVERHEAD_S

    rng = np.random.default_rng(1)
    checked = pruned = 0
    for _ in range(150):
        layers, width, n = int(rng.integers(2, 12)), int(rng.integers(1, 5)), 6
        dense_before = np.concatenate([[0], np.cumsum(rng.random(layers) < rng.uniform())])
        pp = rng.integers(1, width + 1, n)
        on = np.arange(width)[None, :] < pp[:, None]
        tab = {k: np.where(on, rng.uniform(lo, hi, (n, width)), np.nan) for k, lo, hi in (
            ("time0", 0, 2), ("time_dense", 0.5, 2), ("time_moe", 0.5, 3), ("mem0", 0, 2), ("mem_dense", 0.1, 1),
            ("mem_moe", 0.1, 3))}
        tab["capacity"] = np.where(on, rng.uniform(1, 14, (n, 1)), np.nan)
        m, vpp = rng.integers(1, 12, n).astype(float), np.ones(n)
        lb = lower_bounds(tab, layers, int(dense_before[-1]), m, vpp)
        for i in range(n):
            k = int(pp[i])
            if layers < max(k - 2, 0):
                continue
            got = optimal_split(*(tab[key][i, :k] for key in ("time0", "time_dense", "time_moe", "mem0", "mem_dense",
                                                               "mem_moe", "capacity")),
                                dense_before=dense_before, microbatches=int(m[i]), vpp=1)
            if got.fits:
                assert lb[i] <= got.pipeline_s + STEP_OVERHEAD_S + 1e-9
                checked += 1
            elif not np.isfinite(lb[i]):
                pruned += 1
    assert checked > 150 and pruned > 50


def test_search_matches_brute_force_on_a_small_cluster():
    """Every mixed layout with every split, scored exactly: the search's best mixed plan is the brute-force
    best, and its overall best is no slower than any single group or the uniform split."""
    cluster, gbs = tiny_cluster(), 16
    res = hetero_search(TINY, cluster, gbs, top=1)
    plans = []
    for order, combo, B, vpp, rc, cp, ep in _valid_layouts(TINY, _mixed_layouts(TINY, group_clusters(cluster), gbs), gbs):
        pp = sum(k for _, _, k in combo)
        stages = [(g, tp, dp) for g, (tp, dp, k) in zip(order, combo) for _ in range(k)]
        for split in _compositions(TINY.layers, pp):
            plans.append(HeteroPlan(stage_groups=tuple(s[0] for s in stages), stage_tp=tuple(s[1] for s in stages),
                                    stage_dp=tuple(s[2] for s in stages), layers_per_stage=split,
                                    micro_batch_sequences=B, global_batch=gbs, vpp=vpp, cp=cp, ep=ep,
                                    recompute=RECOMPUTE_NAMES[rc]))
    brute = min(e.step_time_s for e in estimate_hetero(TINY, cluster, plans) if e.fits)
    mixed_best = min(s.est.step_time_s for s in res.ranked if s.kind == "mixed" and s.est.fits)
    assert len(plans) > 1000
    assert mixed_best == pytest.approx(brute, rel=1e-12)
    best = res.ranked[0].est.step_time_s
    assert best <= brute and best <= res.uniform.est.step_time_s
    assert all(best <= s.est.step_time_s for s in res.alone.values() if s)


# The shipped mixed cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def search13b(mixed):
    return hetero_search(get_model("13b"), mixed, 768)


def test_mixed_plan_beats_a100_alone_and_uniform(mixed, search13b):
    model = get_model("13b")
    best = search13b.ranked[0]
    assert best.est.fits
    # The best A100-only plan, searched on its own by the homogeneous planner.
    a100 = exhaustive(model, group_clusters(mixed)["a100"], 768)
    assert best.est.step_time_s <= float(a100.scores["step_time_s"][a100.order[0]])
    # A uniform split over all 48 GPUs (one tp/dp, the even split, stages in the groups' order).
    for tp, dp in ((2, 8), (1, 16), (4, 4)):
        k = {"a100": 16 // (tp * dp), "v100": 32 // (tp * dp)}
        groups = ("a100",) * k["a100"] + ("v100",) * k["v100"]
        pp = len(groups)
        split = tuple(40 // pp + (1 if 1 <= i <= 40 % pp else 0) for i in range(pp))
        uni = HeteroPlan(stage_groups=groups, stage_tp=(tp,) * pp, stage_dp=(dp,) * pp, layers_per_stage=split,
                         micro_batch_sequences=dp, global_batch=768, recompute="selective")
        assert best.est.step_time_s <= estimate_hetero(model, mixed, [uni])[0].step_time_s
    # The faster GPUs take more layers: per GPU of their stage, and (same degrees) per stage; stage times balance.
    def layers_per_gpu(s, group):
        p = s.plan
        return [n / g for grp, n, g in zip(p.stage_groups, p.layers_per_stage, p.stage_gpus) if grp == group]

    assert min(layers_per_gpu(best, "a100")) > 1.5 * max(layers_per_gpu(best, "v100"))
    assert max(best.est.stage_time_s) / min(best.est.stage_time_s) < 1.1
    launch = search13b.best_launchable()
    assert launch.plan.launch_issue is None and len(set(launch.plan.stage_groups)) == 2
    assert min(layers_per_gpu(launch, "a100")) > 1.5 * max(layers_per_gpu(launch, "v100"))
    assert launch.est.step_time_s <= float(a100.scores["step_time_s"][a100.order[0]])


def test_group_figures_and_comparison(mixed, search13b):
    best = search13b.ranked[0]
    groups = best.est.groups
    assert set(groups) == {"a100", "v100"}
    assert sum(g["gpus_used"] for g in groups.values()) == sum(best.plan.stage_gpus)
    assert sum(g["layers"] for g in groups.values()) == 40
    for g in groups.values():
        assert 0 < g["busy_fraction"] <= 1 and 0 < g["mfu"] < 1
    cmp = comparison(search13b, get_model("13b"), mixed)
    assert cmp["fast_group"] == "a100"
    assert cmp["speedup_vs_fast_alone"] >= 1 and cmp["speedup_vs_uniform"] >= 1
    assert cmp["alone"]["a100"]["gpus"] == 16


def test_outputs_for_a_launchable_plan(tmp_path, mixed, search13b):
    model = get_model("13b")
    launch = search13b.best_launchable()
    write_hetero_outputs(str(tmp_path / "out"), model, mixed, launch)
    args = (tmp_path / "out" / "megatron_args.txt").read_text().split("\n")
    plan = launch.plan.megatron_plan()
    if plan.layers_per_stage and len(set(plan.layers_per_stage)) > 1:
        layout = next(a.split(None, 1)[1] for a in args if a.startswith("--pipeline-model-parallel-layout "))
        assert parse_megatron_layout(layout, plan.pp, plan.vpp) == plan.layers_per_stage
    saved = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert saved["heterogeneous"]["stages"][0]["group"] == launch.plan.stage_groups[0]
    assert saved["heterogeneous"]["node_order"][0].startswith(launch.plan.stage_groups[0])
    not_launchable = next(s for s in search13b.ranked if s.plan.launch_issue)
    with pytest.raises(InputError, match="cannot run as one Megatron job"):
        write_hetero_outputs(str(tmp_path / "no"), model, mixed, not_launchable)
    assert not (tmp_path / "no").exists()


def test_plan_cli_on_the_mixed_cluster(capsys):
    rc = main(["--model", "13b", "--cluster", MIXED, "--global-batch", "768", "--top", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["search"] == "heterogeneous" and len(out["plans"]) == 3
    best = out["plans"][0]
    assert best["estimate"]["step_time_s"] <= out["comparison"]["alone"]["a100"]["step_time_s"]
    assert [s["layers"] for s in best["stages"]] == best["plan"]["layers_per_stage"]
    assert out["best_launchable"]["launchable"] is True
    rc = main(["check", "--model", "13b", "--cluster", MIXED, "--tp", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--group" in err and err.count("\n") == 1
    assert main(["check", "--model", "13b", "--cluster", MIXED, "--tp", "2", "--group", "a100", "--json"]) == 0


def test_routing_histogram_in_the_heterogeneous_estimate():
    from costmodel.routing import expert_fractions
    from planner.routing import Routing

    plan = HeteroPlan(stage_groups=("fast", "slow"), stage_tp=(1, 1), stage_dp=(2, 2), layers_per_stage=(4, 2),
                      micro_batch_sequences=2, global_batch=16, ep=2)
    routing = Routing("test", expert_fractions([[8, 1, 1, 1, 1, 1, 1, 1]]))
    bal = estimate_hetero(TINY_MOE, tiny_cluster(), [plan])[0]
    skew = estimate_hetero(TINY_MOE, tiny_cluster(), [plan], scorer=routing.scorer())[0]
    # The hot expert's rank holds it and 3 others: 11 of 15 routed tokens, 2 x 11/15 of the mean; LPT cannot do
    # better (4 experts per rank), so Megatron's contiguous placement is kept.
    assert routing.load(2).time_factor == pytest.approx(2 * 11 / 15)
    assert routing.load(2).placement == "contiguous"
    assert skew.step_time_s > bal.step_time_s
    assert all(s > b for s, b in zip(skew.stage_time_s, bal.stage_time_s))
    assert max(skew.peak_memory_bytes) > max(bal.peak_memory_bytes)


def test_price_per_million_tokens(mixed, search13b):
    priced = mixed.model_copy(update={"device_groups": tuple(
        g.model_copy(update={"price_per_gpu_hour_usd": p}) for g, p in zip(mixed.device_groups, (2.0, 0.5)))})
    cmp = comparison(search13b, get_model("13b"), priced)
    a100 = search13b.alone["a100"]
    tokens = 768 * 4096
    assert cmp["alone"]["a100"]["usd_per_million_tokens"] == pytest.approx(
        16 * 2.0 * a100.est.step_time_s / 3600 / tokens * 1e6)
    used = search13b.ranked[0].plan.gpus_used()
    assert cmp["best"]["usd_per_million_tokens"] == pytest.approx(
        (used["a100"] * 2.0 + used["v100"] * 0.5) * search13b.ranked[0].est.step_time_s / 3600 / tokens * 1e6)
