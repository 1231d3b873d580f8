"""MoE routing imbalance from a histogram: per-rank load for ep and placement (costmodel/routing.py), its
effect on the step and the memory, the planner's choice of ep / placement under it (planner/routing.py),
the file formats, and plan check --routing."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import yaml

from costmodel.catalog import get_model
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import InputError, load_cluster
from costmodel.routing import (capacity_to_drop_none, contiguous_placement, dropped_fraction, estimate_one_routed,
                               estimate_routed, expert_fractions, expert_load, lpt_placement, rank_loads, top_share)
from costmodel.rules import violations
from planner.check import diagnose
from planner.cli import main
from planner.routing import expert_space, load_routing, routed_search

SKEW = [0.4, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]


def skewed(E: int, hot: int, share: float = 0.4) -> np.ndarray:
    """``share`` of the routed tokens on the first ``hot`` experts, the rest spread evenly."""
    f = np.full(E, (1 - share) / (E - hot))
    f[:hot] = share / hot
    return f


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen3-30b-a3b")


@pytest.fixture(scope="module")
def h100():
    return load_cluster("h100x512")


def write_hist(path, rows, key=True):
    data = {"moe_routing_histogram": rows, "steps": 10} if key else rows
    path.write_text(json.dumps(data))
    return path


# Load model ------------------------------------------------------------------------------------------


def test_fractions_normalise_counts_and_fractions():
    f = expert_fractions([[4, 2, 2, 0], [1, 1, 1, 1]])
    assert f.tolist() == [[0.5, 0.25, 0.25, 0.0], [0.25] * 4]
    # Fractions of tokens (summing to top-k = 2) mean the same as counts.
    assert np.allclose(expert_fractions([0.8, 0.4, 0.4, 0.4]), [[0.4, 0.2, 0.2, 0.2]])
    for bad, what in (([[1, 2], [1]], "list"), ([1, -1, 2], ">= 0"), ([[1, 1], [0, 0]], "layer 1"),
                      ([], "shape")):
        with pytest.raises(ValueError, match=what):
            expert_fractions(bad)


def test_contiguous_and_lpt_placements():
    assert contiguous_placement(8, 4).tolist() == [[0, 0, 1, 1, 2, 2, 3, 3]]
    f = expert_fractions(SKEW)
    lpt = lpt_placement(f, 2)
    assert np.bincount(lpt[0], minlength=2).tolist() == [4, 4]      # E/ep experts on every rank
    # Hand-computed: contiguous puts 0.4+0.1+0.1+0.1 = 0.7 on rank 0 -> 1.4x the mean of 0.5.
    assert rank_loads(f, contiguous_placement(8, 2), 2)[0].tolist() == pytest.approx([1.4, 0.6])
    # LPT: 0.4 -> r0, 0.1 -> r1, 0.1 -> r1, 0.1 -> r1, 0.1 -> r1 (r1 full at 4), then r0 takes 0.1, 0.05, 0.05.
    assert rank_loads(f, lpt, 2)[0].tolist() == pytest.approx([1.2, 0.8])


def test_lpt_never_worse_than_contiguous_and_close_to_optimal():
    rng = np.random.default_rng(1)
    for _ in range(30):
        f = expert_fractions(rng.dirichlet(np.full(8, 0.4), size=1))
        for ep in (2, 4):
            lpt = expert_load(f, ep, "lpt").time_factor
            cont = expert_load(f, ep, "contiguous").time_factor
            # The best balanced placement, by brute force over every assignment of E/ep experts per rank.
            best = min(rank_loads(f, np.array([a]), ep).max()
                       for a in itertools.product(range(ep), repeat=8) if np.bincount(a, minlength=ep).max() == 8 // ep)
            assert best - 1e-12 <= lpt <= cont + 1e-12
            assert lpt <= best * 4 / 3 + 1e-9   # Graham's LPT bound


def test_time_and_memory_factors_differ_across_layers():
    # Two layers whose hot expert sits on different ranks (ep=2, contiguous): each layer's hottest rank gets
    # 1.4x, but over the layers every rank averages 1.0x.
    f = [SKEW, SKEW[::-1]]
    load = expert_load(expert_fractions(f), 2)
    assert load.time_factor == pytest.approx(1.4)
    assert load.memory_factor == pytest.approx(1.0)
    assert expert_load(expert_fractions(f), 1).time_factor == pytest.approx(1.0)   # one rank holds everything


def test_capacity_factor_bounds_the_load_and_drops_tokens():
    f = expert_fractions(skewed(16, 2))
    c_none = capacity_to_drop_none(f)
    assert c_none == pytest.approx(0.2 * 16)
    assert dropped_fraction(f, c_none) == 0.0 and dropped_fraction(f, c_none * 0.9) > 0.0
    for cap in (1.0, 1.25, 2.0):
        load = expert_load(f, 8, "contiguous", cap)
        assert load.time_factor <= cap + 1e-12
        # Hot experts each give up 0.2 - cap/16 of the slots.
        assert load.dropped_fraction == pytest.approx(2 * (0.2 - cap / 16))
    assert top_share(f, 2) == pytest.approx(0.4)


# Effect on the estimate --------------------------------------------------------------------------------


def test_skewed_routing_raises_step_and_peak_memory(qwen, h100):
    plan = ParallelPlan(tp=1, pp=2, dp=256, ep=8, global_batch=1024, recompute="selective")
    f = expert_fractions(skewed(qwen.num_experts, 4))     # 40% of the tokens on 4 of 128 experts
    load = expert_load(f, plan.ep)
    assert load.time_factor == pytest.approx(0.4 * 8 + 0.6 * 8 * 12 / 124)   # rank 0: the 4 hot + 12 others
    skew = estimate_one_routed(qwen, h100, plan, load)
    bal = estimate(qwen, h100, plan)
    assert skew.step_time_s > 1.2 * bal.step_time_s
    assert max(skew.peak_memory_bytes) > max(bal.peak_memory_bytes)
    assert skew.breakdown_s["ep_comm_exposed"] > bal.breakdown_s["ep_comm_exposed"]
    # Time at the time factor, memory at the memory factor (equal here: every layer alike).
    assert skew == estimate(qwen, h100, plan, moe_imbalance=load.time_factor)
    # Vectorised: one factor per plan row.
    plans = PlanArrays.from_plans([plan, plan.model_copy(update={"ep": 4})])
    out = estimate_routed(qwen, h100, plans, np.array([load.time_factor, 1.0]), np.array([1.0, 1.0]))
    assert out["step_time_s"][0] == pytest.approx(skew.step_time_s)
    assert np.nanmax(out["peak_memory_bytes"][0]) == pytest.approx(max(bal.peak_memory_bytes))


def test_expert_tensor_parallelism_is_costed():
    """etp ranks all-gather their experts' tokens: the expert GEMM per rank does not shrink, and the gather
    and reduce-scatter add communication (etp = 1 is what it was)."""
    model, cluster = get_model("mixtral-8x7b"), load_cluster("h100x512")
    plans = PlanArrays.from_plans([ParallelPlan(tp=2, pp=1, dp=256, ep=4, etp=e, global_batch=1024) for e in (1, 2)])
    d = estimate_arrays(model, cluster, plans)["details"]
    # Same FLOPs per rank (only the GEMM shape changes: twice the tokens, half the width); counting 1/etp of
    # the FLOPs, as before expert TP was costed, would halve it exactly.
    assert 0.75 * d["experts_s"][0] < d["experts_s"][1] < 1.05 * d["experts_s"][0]
    assert d["a2a_s"][1] > d["a2a_s"][0]


# The planner's choice ----------------------------------------------------------------------------------


def test_skew_changes_the_planners_choice(qwen, h100, tmp_path):
    hist = [[int(x * 1e6) for x in skewed(qwen.num_experts, 4)]] * qwen.moe_layers
    routing = load_routing(str(write_hist(tmp_path / "summary.json", hist)), qwen)
    # Distributed optimizer only: Megatron-FSDP layouts at ep=1 keep every expert local and can sidestep the
    # skew altogether, which is not what this test is about.
    rs = routed_search(qwen, h100, 1024, routing, zero_stages=(1,))
    res = rs.result
    best, bal = int(res.order[0]), rs.balanced_best
    p_best, p_bal = res.plan(0), res.split_plan(0)
    assert p_best == p_bal.model_copy(update={"layers_per_stage": None})
    chosen = rs.load_of(best)
    q = res.plans
    # Balanced routing picks ep=8 with Megatron's placement; under the skew the planner moves to a smaller ep with
    # the balanced (LPT) placement, which is predicted faster under the skew than the balanced choice.
    assert (int(q.ep[bal]), routing.load(int(q.ep[bal])).placement) != (int(q.ep[best]), chosen.placement)
    assert chosen.placement == "lpt" and chosen.time_factor < routing.load(int(q.ep[best]), "contiguous").time_factor
    assert res.scores["step_time_s"][best] < res.scores["step_time_s"][bal]
    assert rs.balanced_step_s(bal) <= rs.balanced_step_s(best)
    assert not violations(qwen, res.plan(0), h100.num_gpus)


def test_expert_space_adds_valid_etp(qwen, h100):
    space = expert_space(qwen, h100, 1024)
    assert set(np.unique(space.etp).astype(int)) == {1, 2, 4, 8}
    for i in np.random.default_rng(0).choice(len(space), 40, replace=False):
        p = ParallelPlan(tp=int(space.tp[i]), pp=int(space.pp[i]), vpp=int(space.vpp[i]), dp=int(space.dp[i]),
                         cp=int(space.cp[i]), ep=int(space.ep[i]), etp=int(space.etp[i]), global_batch=1024,
                         micro_batch=int(space.micro_batch[i]), sequence_parallel=bool(space.sp[i]))
        if space.stage_layers is not None and not np.isnan(space.stage_layers[i, 0]):
            p = p.model_copy(update={"layers_per_stage": tuple(int(x) for x in space.stage_layers[i, : p.pp])})
        assert not violations(qwen, p, h100.num_gpus)


# Files -------------------------------------------------------------------------------------------------


def test_file_formats(tmp_path, qwen):
    E, L = qwen.num_experts, qwen.moe_layers
    counts = [[round(x * 1e6) for x in skewed(E, 4)]] * L
    run = tmp_path / "run"
    run.mkdir()
    write_hist(run / "summary.json", counts)
    by_key = load_routing(str(run / "summary.json"), qwen)
    assert by_key.fractions.shape == (L, E)
    assert load_routing(str(run), qwen).fractions.tolist() == by_key.fractions.tolist()   # a run directory
    bare = load_routing(str(write_hist(tmp_path / "bare.json", counts[0], key=False)), qwen)
    assert bare.fractions.shape == (1, E)
    assert bare.load(8).time_factor == pytest.approx(by_key.load(8).time_factor)
    lists = load_routing(str(write_hist(tmp_path / "lists.json", counts, key=False)), qwen)
    assert lists.fractions.shape == (L, E)
    frac = tmp_path / "frac.yaml"
    frac.write_text(yaml.safe_dump({"moe_routing_histogram": [skewed(E, 4).tolist()]}))
    assert np.allclose(load_routing(str(frac), qwen).fractions[0], by_key.fractions[0], rtol=1e-4)


@pytest.mark.parametrize("content, message", [
    ({"moe_routing_histogram": [[1] * 64]}, "64 experts per layer but qwen3-30b-a3b has 128 routed experts"),
    ({"moe_routing_histogram": [[1] * 128] * 3}, "3 layers but qwen3-30b-a3b has 48 MoE layers"),
    ({"counts": [1] * 128}, "no field 'moe_routing_histogram'"),
    # A key with a line break (found by fuzzing) is quoted with the break escaped: the error stays one line.
    ({"a\nb": None}, "(keys: 'a\\nb')"),
    ({"moe_routing_histogram": [[1] * 128, [1] * 127]}, "field 'moe_routing_histogram'"),
])
def test_bad_histograms_are_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "h.json"
    path.write_text(json.dumps(content))
    rc = main(["check", "--model", "qwen3-30b-a3b", "--cluster", "h100x512", "--ep", "8", "--routing", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and str(path) in err and err.count("\n") == 1


def test_dense_model_and_missing_file(tmp_path):
    path = write_hist(tmp_path / "h.json", [[1] * 8])
    with pytest.raises(InputError, match="no routed experts"):
        load_routing(str(path), get_model("70b"))
    with pytest.raises(InputError, match="not found"):
        load_routing(str(tmp_path / "nope.json"), get_model("mixtral-8x7b"))
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(InputError, match="malformed JSON"):
        load_routing(str(tmp_path / "bad.json"), get_model("mixtral-8x7b"))


# plan check --routing ----------------------------------------------------------------------------------


def test_diagnose_reports_measured_imbalance(qwen, h100, tmp_path):
    hist = [[int(x * 1e6) for x in skewed(qwen.num_experts, 4)]] * qwen.moe_layers
    routing = load_routing(str(write_hist(tmp_path / "summary.json", hist)), qwen)
    plan = ParallelPlan(tp=1, pp=2, dp=256, ep=8, global_batch=1024, recompute="selective")
    found = [f for f in diagnose(qwen, h100, plan, routing=routing) if f.kind == "expert_imbalance"]
    assert len(found) == 1
    f = found[0]
    cont, lpt = routing.load(8, "contiguous"), routing.load(8, "lpt")
    assert f.severity == "warn" and f"{cont.time_factor:.2f}x" in f.message
    step0 = estimate_one_routed(qwen, h100, plan, cont).step_time_s
    assert f.predicted["step_time_s"][0] == pytest.approx(step0)
    after = f.predicted["step_time_s"][1]
    assert after < step0 and f.gain == pytest.approx(after / step0 - 1)
    if f.alternative is None:     # the placement is the fix: same plan, LPT load
        assert "lpt" in f.suggestion
        assert after == pytest.approx(estimate_one_routed(qwen, h100, plan, lpt).step_time_s)
    else:
        assert f.alternative.ep != plan.ep and not violations(qwen, f.alternative, h100.num_gpus)
    # A balanced histogram: reported as info, nothing to fix.
    flat = load_routing(str(write_hist(tmp_path / "flat.json", [[5] * qwen.num_experts])), qwen)
    g = [f for f in diagnose(qwen, h100, plan, routing=flat) if f.kind == "expert_imbalance"][0]
    assert g.severity == "info" and g.predicted["moe_imbalance"] == pytest.approx([1.0, 1.0])


def test_plan_check_routing_json(tmp_path, capsys, qwen):
    run = tmp_path / "run"
    run.mkdir()
    hist = [[int(x * 1e6) for x in skewed(qwen.num_experts, 4)]] * qwen.moe_layers
    write_hist(run / "summary.json", hist)
    rc = main(["check", "--model", "qwen3-30b-a3b", "--cluster", "h100x512", "--global-batch", "1024", "--ep", "8",
               "--routing", str(run / "summary.json"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["estimate"]["fits"] else 1)   # plan check exits 1 on a layout that does not fit
    assert out["routing"]["experts"] == 128 and out["routing"]["load"]["placement"] == "contiguous"
    assert out["routing"]["load"]["time_factor"] > 3
    assert any(f["kind"] == "expert_imbalance" for f in out["findings"])


def test_plan_routing_out_records_placement(tmp_path, capsys, qwen):
    hist = [[int(x * 1e6) for x in skewed(qwen.num_experts, 4)]] * qwen.moe_layers
    path = write_hist(tmp_path / "h.json", hist)
    rc = main(["--model", "qwen3-30b-a3b", "--cluster", "h100x512", "--global-batch", "1024", "--routing", str(path),
               "--out", str(tmp_path / "out"), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "out" / "plan.json").read_text())
    load = saved["routing"]["load"]
    assert load["placement"] == printed["plans"][0]["expert_load"]["placement"]
    ep = saved["plan"]["ep"]
    # Every expert on exactly one rank, E/ep per rank, per layer.
    for layer in load["experts_by_rank"]:
        assert len(layer) == ep and sorted(sum(layer, [])) == list(range(128))
        assert {len(r) for r in layer} == {128 // ep}


def test_overflowing_histogram_is_refused_without_a_numpy_warning():
    """A histogram whose layer total overflows float64 gets the one-line error, not a RuntimeWarning first
    (the fuzz test of the routing reader runs under any warning filter)."""
    import warnings

    from costmodel.routing import expert_fractions

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="overflows float64"):
            expert_fractions([[1e308] * 128])
