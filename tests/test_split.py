"""The exact pipeline stage split (costmodel.split) and its Megatron strings (costmodel.plan): DP vs brute force, real
models."""

from __future__ import annotations

import itertools
import random

import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate, estimate_arrays
from costmodel.plan import FIRST_FLAG, LAST_FLAG, ParallelPlan, PlanArrays, megatron_layout, parse_megatron_layout, uneven_flags
from costmodel.profiles import load_cluster
from costmodel.rules import violations
from costmodel.split import best_split, layer_costs, min_max_split, stage_memory_table

# Brute force ---------------------------------------------------------------------------------------


def _compositions(L: int, pp: int):
    """Every way to write L as pp ordered non-negative parts."""
    for cuts in itertools.combinations_with_replacement(range(L + 1), pp - 1):
        bounds = (0, *cuts, L)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(pp))


def _brute(costs, pp, fe=0.0, le=0.0, m=1, mem=None, cap=None):
    L = len(costs)
    scale = sum(abs(x) for x in costs) + abs(fe) + abs(le)
    tol, tol_sq = 1e-9 * scale, 1e-9 * scale * scale
    cands = []
    for split in _compositions(L, pp):
        if any(n % m for n in split):
            continue
        if pp == 1 and split[0] == 0:
            continue
        if any(n == 0 for n in split[1:-1]):
            continue
        stage, start = [], 0
        ok = True
        for j, n in enumerate(split):
            c = sum(costs[start:start + n]) + (fe if j == 0 else 0.0) + (le if j == pp - 1 else 0.0)
            if mem is not None and mem(j, start, n) > cap:
                ok = False
            stage.append(c)
            start += n
        if ok:
            cands.append((split, stage))
    if not cands:
        return None
    best_max = min(max(st) for _, st in cands)
    cands = [(sp, st) for sp, st in cands if max(st) <= best_max + tol]
    mean = (sum(costs) + fe + le) / pp
    sq = {sp: sum((c - mean) ** 2 for c in st) for sp, st in cands}
    best_sq = min(sq.values())
    split = min(sp for sp in sq if sq[sp] <= best_sq + tol_sq)
    return split, max(dict(cands)[split])


def _random_case(rng: random.Random, integer: bool):
    L = rng.randint(0, 12)
    pp = rng.randint(1, 4)
    m = rng.choice([1, 1, 2, 3])
    if integer:
        costs = [float(rng.randint(1, 4)) for _ in range(L)]
        fe = float(rng.choice([0, 0, 1, 3]))
        le = float(rng.choice([0, 0, 2, 5]))
    else:
        costs = [rng.uniform(0.5, 2.0) for _ in range(L)]
        fe = rng.choice([0.0, rng.uniform(0, 3)])
        le = rng.choice([0.0, rng.uniform(0, 3)])
    return costs, pp, fe, le, m


@pytest.mark.parametrize("integer", [True, False], ids=["integer-ties", "float"])
def test_dp_matches_brute_force(integer):
    rng = random.Random(1234 + integer)
    feasible = infeasible = 0
    for _ in range(400):
        costs, pp, fe, le, m = _random_case(rng, integer)
        want = _brute(costs, pp, fe, le, m)
        if want is None:
            infeasible += 1
            with pytest.raises(ValueError):
                min_max_split(costs, pp, fe, le, multiple_of=m)
            continue
        feasible += 1
        split, worst = min_max_split(costs, pp, fe, le, multiple_of=m)
        assert split == want[0], (costs, pp, fe, le, m)
        assert worst == pytest.approx(want[1])
        assert sum(split) == len(costs) and len(split) == pp
    assert feasible > 100 and infeasible > 10


def test_dp_matches_brute_force_with_memory():
    rng = random.Random(99)
    feasible = infeasible = 0
    for case in range(300):
        costs, pp, fe, le, m = _random_case(rng, integer=case % 2 == 0)
        L = len(costs)
        base = [rng.uniform(0, 3) for _ in range(pp)]      # e.g. embedding / LM head weights
        per = [rng.uniform(0.5, 2) for _ in range(L)]
        inflight = [pp - j for j in range(pp)]               # 1F1B: stage j holds pp - j batches

        def mem(j, u, n, base=base, per=per, inflight=inflight):
            return base[j] + inflight[j] * sum(per[u:u + n])

        cap = rng.uniform(2, 20)
        want = _brute(costs, pp, fe, le, m, mem, cap)
        if want is None:
            infeasible += 1
            with pytest.raises(ValueError):
                min_max_split(costs, pp, fe, le, m, stage_memory=mem, memory_capacity=cap)
            continue
        feasible += 1
        split, worst = min_max_split(costs, pp, fe, le, m, stage_memory=mem, memory_capacity=cap)
        assert split == want[0]
        assert worst == pytest.approx(want[1])
        start = 0
        for j, n in enumerate(split):
            assert mem(j, start, n) <= cap
            start += n
    assert feasible > 50 and infeasible > 50


def test_ties_prefer_balance_then_lexicographic():
    # Max 2 either way; (1, 1, 2, 2) and its permutations beat (0, 2, 2, 2) on balance.
    assert min_max_split([1.0] * 6, 4) == ((1, 1, 2, 2), 2.0)
    # An LM head worth one layer: the last stage takes one layer fewer.
    # 8 layers + a head worth one: costs {3, 2, 2, 2} in any order; lexicographically (2, 2, 2, 2).
    assert min_max_split([1.0] * 8, 4, last_extra=1.0) == ((2, 2, 2, 2), 3.0)
    # 9 layers + head: {3, 3, 2, 2} beats {3, 3, 3, 1}; the smallest such split is (2, 2, 3, 2).
    assert min_max_split([1.0] * 9, 4, last_extra=1.0) == ((2, 2, 3, 2), 3.0)
    # Edge stages may be empty; the max is then the middle stages'.
    assert min_max_split([1.0, 1.0], 4, first_extra=5.0, last_extra=5.0) == ((0, 1, 1, 0), 5.0)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (([1.0] * 2, 5), {}),                        # 3 middle stages need 3 layers
        (([1.0] * 5, 2), {"multiple_of": 2}),         # 5 layers in multiples of 2
        (([], 1), {}),                                # the only stage cannot be empty
        (([1.0] * 4, 0), {}),
        (([1.0] * 4, 2), {"multiple_of": 0}),
        (([1.0, float("nan")], 2), {}),
        (([1.0] * 4, 2), {"stage_memory": lambda j, u, n: n}),        # capacity missing
        (([1.0] * 4, 2), {"stage_memory": lambda j, u, n: n, "memory_capacity": 1.0}),
    ],
)
def test_infeasible_raises(args, kwargs):
    with pytest.raises(ValueError):
        min_max_split(*args, **kwargs)


def test_pp1_takes_everything():
    assert min_max_split([1.0, 2.0, 3.0], 1, 0.5, 0.25) == ((3,), 6.75)


# Real models -------------------------------------------------------------------------------------

CLUSTER = load_cluster("h100x16384")
LLAMA_405B = get_model("405b")
DSV3 = get_model("deepseek-v3")
PLAN_405B = ParallelPlan(tp=8, pp=16, dp=128, global_batch=2048)
PLAN_DSV3 = ParallelPlan(tp=2, pp=16, ep=64, dp=512, global_batch=8192)
MAVERICK = get_model("llama4-maverick")     # MoE on every other layer, the first dense
PLAN_MAVERICK = ParallelPlan(tp=4, pp=4, ep=64, dp=1024, global_batch=4096)


def test_405b_pp16_split_has_lighter_edges():
    costs, fe, le = layer_costs(LLAMA_405B, CLUSTER, PLAN_405B)
    assert len(costs) == 126 and len(set(costs)) == 1
    assert 0 <= fe < costs[0] < le + costs[0]
    plan = best_split(LLAMA_405B, CLUSTER, PLAN_405B)
    split = plan.layers_per_stage
    assert len(split) == 16 and sum(split) == 126
    assert all(n > 0 for n in split[1:-1])
    assert split[0] < max(split[1:-1]) and split[-1] < max(split[1:-1])
    assert violations(LLAMA_405B, plan, CLUSTER.num_gpus) == []
    # The cost model agrees: the split's slowest stage is no slower than any other contiguous split
    # with the same stage count that only moves the edge layers, and the pipeline is balanced.
    est = estimate(LLAMA_405B, CLUSTER, plan)
    assert est.fits
    naive = estimate(LLAMA_405B, CLUSTER, PLAN_405B.model_copy(
        update={"layers_per_stage": (8,) * 14 + (7, 7)}))
    assert max(est.stage_time_s) <= max(naive.stage_time_s) + 1e-12
    assert est.step_time_s <= naive.step_time_s
    _, worst = min_max_split(costs, 16, fe, le)
    hop = max(est.stage_time_s) - worst       # the per-stage p2p term the split does not see
    assert 0 <= hop < 0.01 * worst


def test_405b_interleaved_split_is_balanced_and_round_trips():
    # Layout strings allow virtual stages of different sizes, so the split need not be multiples of vpp.
    plan = best_split(LLAMA_405B, CLUSTER, PLAN_405B.model_copy(update={"vpp": 3}))
    split = plan.layers_per_stage
    assert sum(split) == 126 and all(n > 0 for n in split)
    assert split[-1] < max(split) and max(split) - min(split[1:-1]) <= 1
    assert parse_megatron_layout(megatron_layout(split, 3), 16, 3) == split


def test_layer_costs_match_details():
    plan = PLAN_405B.model_copy(update={"recompute": "none"})
    costs, fe, le = layer_costs(LLAMA_405B, CLUSTER, plan)
    d = estimate_arrays(LLAMA_405B, CLUSTER, PlanArrays.from_plans([plan]))["details"]
    assert costs[0] == pytest.approx(float(d["layer_dense_fwd_s"][0] + d["layer_dense_bwd_s"][0]))
    assert le >= 3 * float(d["logits_s"][0])       # LM head fwd + 2x bwd, plus the loss
    # Selective recompute adds to every layer; full recompute of some layers adds a fraction.
    sel = layer_costs(LLAMA_405B, CLUSTER, PLAN_405B)[0][0]
    full = layer_costs(LLAMA_405B, CLUSTER, plan.model_copy(update={"recompute": "full"}))[0][0]
    part = layer_costs(LLAMA_405B, CLUSTER, plan.model_copy(
        update={"recompute": "full", "recompute_layers": 4}))[0][0]
    assert costs[0] < sel < full and costs[0] < part < full


def test_moe_layer_costs_and_split():
    plan = PLAN_DSV3.model_copy(update={"recompute": "none"})
    costs, fe, le = layer_costs(DSV3, CLUSTER, plan)
    d = estimate_arrays(DSV3, CLUSTER, PlanArrays.from_plans([plan]))["details"]
    D = DSV3.dense_layers
    assert costs[:D] == [pytest.approx(float(d["layer_dense_fwd_s"][0] + d["layer_dense_bwd_s"][0]))] * D
    assert costs[D:] == [pytest.approx(float(d["layer_moe_fwd_s"][0] + d["layer_moe_bwd_s"][0]))] * (
        DSV3.layers - D)
    best = best_split(DSV3, CLUSTER, PLAN_DSV3)
    split = best.layers_per_stage
    assert sum(split) == DSV3.layers and all(n > 0 for n in split[1:-1])
    # The three cheap dense layers sit on the first stage, so it takes more layers than the last.
    assert split[0] > split[-1]
    est = estimate(DSV3, CLUSTER, best)
    default = estimate(DSV3, CLUSTER, PLAN_DSV3)      # Megatron's split, remainder in the middle
    assert max(est.stage_time_s) <= max(default.stage_time_s) + 1e-12


def test_interleaved_moe_layer_costs_alternate_and_stages_balance():
    plan = PLAN_MAVERICK.model_copy(update={"recompute": "none"})
    costs, fe, le = layer_costs(MAVERICK, CLUSTER, plan)
    d = estimate_arrays(MAVERICK, CLUSTER, PlanArrays.from_plans([plan]))["details"]
    dense = float(d["layer_dense_fwd_s"][0] + d["layer_dense_bwd_s"][0])
    moe = float(d["layer_moe_fwd_s"][0] + d["layer_moe_bwd_s"][0])
    assert dense != pytest.approx(moe)
    assert costs == [pytest.approx(moe if i % 2 else dense) for i in range(48)]
    # Megatron's even split: every middle stage holds 6 dense and 6 MoE layers, so they take the same time; with
    # the same 24 MoE layers after 24 leading dense ones, stage 1 is all dense and stage 2 all MoE.
    even = estimate(MAVERICK, CLUSTER, plan).stage_time_s
    assert even[1] == pytest.approx(even[2], rel=1e-12)
    lead = estimate(MAVERICK.model_copy(update={"dense_layers": 24, "moe_layer_step": 1}), CLUSTER, plan).stage_time_s
    assert lead[1] < even[1] < lead[2]
    assert lead[2] - lead[1] == pytest.approx(12 * (moe - dense), rel=1e-6)
    assert even[1] - lead[1] == pytest.approx(6 * (moe - dense), rel=1e-6)


@pytest.mark.parametrize("model, plan", [(LLAMA_405B, PLAN_405B), (DSV3, PLAN_DSV3), (MAVERICK, PLAN_MAVERICK)],
                         ids=["405b", "deepseek-v3", "llama4-maverick"])
def test_stage_memory_table_matches_estimate(model, plan):
    best = best_split(model, CLUSTER, plan)
    mem, cap = stage_memory_table(model, CLUSTER, best)
    est = estimate(model, CLUSTER, best)
    start = 0
    for j, n in enumerate(best.layers_per_stage):
        assert mem(j, start, n) == pytest.approx(est.peak_memory_bytes[j], rel=1e-12)
        start += n
    assert cap == pytest.approx(est.memory_capacity_bytes)


def test_memory_constraint_moves_layers_off_the_first_stage():
    costs, fe, le = layer_costs(LLAMA_405B, CLUSTER, PLAN_405B)
    mem, _ = stage_memory_table(LLAMA_405B, CLUSTER, PLAN_405B)
    free, _ = min_max_split(costs, 16, fe, le)
    cap = mem(0, 0, free[0]) - 1.0              # the first stage (most in flight) must shrink
    split, _ = min_max_split(costs, 16, fe, le, stage_memory=mem, memory_capacity=cap)
    assert split[0] < free[0] and sum(split) == 126
    start = 0
    for j, n in enumerate(split):
        assert mem(j, start, n) <= cap
        start += n


def test_pp1_plan_unchanged():
    plan = ParallelPlan(tp=8, pp=1, dp=2048, global_batch=2048)
    assert best_split(LLAMA_405B, CLUSTER, plan) is plan


# Megatron strings ----------------------------------------------------------------------------------


def _megatron_2d(layout_str: str, pp: int) -> list[list[str]]:
    """Megatron's PipelineParallelLayerLayout.__init__: 1-d list -> layout[pp_rank][vpp_rank]."""
    import re

    s = layout_str.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    flat = s.split("|")
    vpp = len(flat) // pp
    assert len(flat) == pp * vpp
    return [[flat[v * pp + r] for v in range(vpp)] for r in range(pp)]


def test_layout_strings():
    assert megatron_layout((7, 8, 8, 7)) == "Et*7|t*8|t*8|t*7L"
    assert megatron_layout((7, 8, 8, 7), compact=False) == "Ettttttt|tttttttt|tttttttt|tttttttL"
    assert megatron_layout((7,) + (8,) * 14 + (7,)) == "Et*7|(t*8|)*14,t*7L"
    assert megatron_layout((2, 4), vpp=2) == "Et|t*2|t|t*2L"
    assert megatron_layout((0, 4, 4, 0)) == "E|t*4|t*4|L"
    assert megatron_layout((1,)) == "EtL"
    assert megatron_layout((8,) * 5) == "Et*8|(t*8|)*3,t*8L"
    # Unequal virtual stages: the later chunk of a rank takes the remainder.
    assert megatron_layout((3, 4), vpp=2) == "Et|t*2|t*2|t*2L"
    with pytest.raises(ValueError):
        megatron_layout((3, -1), vpp=2)


def test_layout_follows_megatron_virtual_stage_order():
    split, vpp = (4, 6, 6, 2), 2
    layout = _megatron_2d(megatron_layout(split, vpp), len(split))
    for r, n in enumerate(split):
        assert [chunk.count("t") for chunk in layout[r]] == [n // vpp] * vpp
    assert layout[0][0].startswith("E") and layout[-1][-1].endswith("L")
    # Megatron's own docstring example (DeepSeek-V3: 61 layers, pp=16, vpp=2, one MTP layer).
    assert parse_megatron_layout("Ettt|(tt|)*29,m|L", 16, 2) == (5,) + (4,) * 13 + (2, 2)


def test_layout_round_trip():
    rng = random.Random(7)
    for _ in range(200):
        pp, vpp = rng.randint(1, 8), rng.choice([1, 1, 2, 3])
        split = [vpp * rng.randint(1, 5) for _ in range(pp)]
        if pp > 1 and rng.random() < 0.3:
            split[0] = 0
        if pp > 1 and rng.random() < 0.3:
            split[-1] = 0
        for compact in (True, False):
            s = megatron_layout(split, vpp, compact=compact)
            assert parse_megatron_layout(s, pp, vpp) == tuple(split)
            assert [sum(c.count("t") for c in row) for row in _megatron_2d(s, pp)] == split


@pytest.mark.parametrize("bad, pp, vpp", [
    ("Et*4|t*4L", 3, 1),          # 2 stages, pp=3
    ("t*4|Et*4L", 2, 1),          # embedding not first
    ("Et*4L|t*4", 2, 1),          # loss not last
    ("Et*4|t*4|", 3, 1),          # no loss
    ("Et*4|x*4L", 2, 1),          # unknown layer type
])
def test_parse_rejects_bad_layouts(bad, pp, vpp):
    with pytest.raises(ValueError):
        parse_megatron_layout(bad, pp, vpp)


@pytest.mark.parametrize("split, flags", [
    ((8, 8, 8, 8), []),
    ((5,), []),
    ((7, 8, 8, 7), [FIRST_FLAG, "7", LAST_FLAG, "7"]),
    ((6, 8, 8, 8), [FIRST_FLAG, "6"]),
    ((8, 8, 8, 6), [LAST_FLAG, "6"]),
    ((3, 5), [FIRST_FLAG, "3"]),
    ((0, 8, 8, 8), None),          # Megatron's flags must be > 0: use the layout
    ((0, 5), None),
    ((7, 8, 9, 7), None),          # middle stages differ
])
def test_uneven_flags(split, flags):
    assert uneven_flags(split) == flags
    assert FIRST_FLAG == "--decoder-first-pipeline-num-layers"
    assert LAST_FLAG == "--decoder-last-pipeline-num-layers"


def test_uneven_flags_of_best_405b_split():
    split = best_split(LLAMA_405B, CLUSTER, PLAN_405B).layers_per_stage
    flags = uneven_flags(split)
    assert flags is not None
    first = int(flags[flags.index(FIRST_FLAG) + 1]) if FIRST_FLAG in flags else None
    last = int(flags[flags.index(LAST_FLAG) + 1]) if LAST_FLAG in flags else None
    # Megatron's rule: the middle stages share the rest evenly.
    rest = 126 - (first or 0) - (last or 0)
    middles = 16 - (first is not None) - (last is not None)
    assert rest % middles == 0
    rebuilt = ((first,) if first else ()) + (rest // middles,) * middles + ((last,) if last else ())
    assert rebuilt == split
