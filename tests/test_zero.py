"""ZeRO / Megatron-FSDP as a search knob (planner.space.ZERO_STAGES): the space holds ZeRO-3 only where
megatron-core runs it (pp = 1) and where it shards something (dp*cp > 1); FSDP wins where memory binds
(405B on 128 H100) and loses where it only adds weight gathers (8B on 64 H100); Optuna samples the knob,
stores it in the study and scores it like the exhaustive search; Megatron flags round-trip; ``plan check
--zero-stage 3`` and the ranked table show it."""

from __future__ import annotations

import json

import numpy as np
import optuna
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.profiles import load_cluster
from costmodel.rules import check_plan, valid_mask, violations
from costmodel.plan import ParallelPlan
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args
from planner.search import exhaustive, expert_seeds, optuna_search, search_space
from planner.search._objective import Objective
from planner.space import valid_plans

H100 = load_cluster("h100x512")


@pytest.fixture(scope="module")
def m70():
    return get_model("70b")


@pytest.fixture(scope="module")
def space70(m70):
    return valid_plans(m70, H100, 512)


@pytest.fixture(scope="module")
def big405():
    """Llama 3.1 405B on 128 H100 (16 nodes), 64 sequences per step: memory binds (the layout Megatron
    published on 128 GB200 is FSDP tp2 pp1 dp64)."""
    model, cluster = get_model("405b"), H100.model_copy(update={"nodes": 16})
    return model, cluster, exhaustive(model, cluster, 64), exhaustive(model, cluster, 64, zero_stages=(1,))


# ---- the space -------------------------------------------------------------------------------------------


def test_fsdp_rows_only_where_megatron_runs_them(space70):
    z = space70.zero_stage
    assert set(np.unique(z).astype(int)) == {1, 3}             # no ZeRO-0 / ZeRO-2 (planner.space docstring)
    fsdp = z == 3
    assert fsdp.sum() > 0
    assert (space70.pp[fsdp] == 1).all() and (space70.vpp[fsdp] == 1).all()
    assert (space70.dp[fsdp] * space70.cp[fsdp] > 1).all()
    assert space70.distributed_optimizer.all()
    # Every pp=1 ZeRO-1 layout with something to shard has its FSDP twin, and nothing else has one.
    key = lambda i: (int(space70.tp[i]), int(space70.cp[i]), int(space70.micro_batch[i]),  # noqa: E731
                     int(space70.recompute[i]))
    one = {key(i) for i in np.flatnonzero((z == 1) & (space70.pp == 1) & (space70.dp * space70.cp > 1))}
    three = {key(i) for i in np.flatnonzero(fsdp)}
    assert one == three


def test_zero1_rows_are_the_old_space(m70, space70):
    z1 = valid_plans(m70, H100, 512, zero_stages=(1,))
    assert len(z1) == int((space70.zero_stage == 1).sum())
    assert len(space70) - len(z1) == int((space70.zero_stage == 3).sum())
    # The knob adds few rows: the pp=1 layouts only.
    assert len(space70) < 1.1 * len(z1)


def test_fsdp_pipeline_rule_scalar_and_vectorised(m70):
    bad = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, zero_stage=3)
    msgs = violations(m70, bad, 512)
    assert len(msgs) == 1 and "zero_stage=3" in msgs[0] and "pp=4" in msgs[0] and "dp=64" in msgs[0]
    assert any("zero_stage=2" in m for m in violations(m70, bad.model_copy(update={"zero_stage": 2}), 512))
    assert not violations(m70, bad.model_copy(update={"pp": 1, "dp": 64}), 512)
    assert not violations(m70, bad.model_copy(update={"zero_stage": 1}), 512)
    cols = dict(tp=np.array([8, 8, 8, 8]), pp=np.array([4, 1, 4, 4]), dp=np.array([16, 64, 16, 16]),
                global_batch=512, zero_stage=np.array([3, 3, 1, 2]))
    assert valid_mask(m70, cols, 512).tolist() == [False, True, True, False]
    assert valid_mask(m70, {k: v for k, v in cols.items() if k != "zero_stage"}, 512).all()   # default 1


# ---- where FSDP wins and where it does not ---------------------------------------------------------------


def test_fsdp_wins_when_memory_binds(big405):
    model, cluster, full, zero1 = big405
    assert full.any_fits and zero1.any_fits
    best = full.plan(0)
    assert best.zero_stage == 3 and best.pp == 1 and best.world_size == cluster.num_gpus
    t_best = float(full.scores["step_time_s"][full.order[0]])
    t_zero1 = float(zero1.scores["step_time_s"][zero1.order[0]])
    assert t_best < t_zero1                      # faster than every ZeRO-1 layout that fits
    assert zero1.plan(0).pp > 1                  # which must pipeline the model to fit it
    # The same layout with the distributed optimizer keeps whole weights and gradients per tp rank: no fit.
    twin = estimate(model, cluster, best.model_copy(update={"zero_stage": 1}))
    assert not twin.fits
    fsdp = estimate(model, cluster, best)
    assert fsdp.fits
    shard = best.dp * best.cp
    assert fsdp.memory_breakdown_bytes["weights"] == pytest.approx(twin.memory_breakdown_bytes["weights"] / shard,
                                                                    rel=1e-6)
    assert fsdp.memory_breakdown_bytes["grads"] < twin.memory_breakdown_bytes["grads"] / 8


def test_fsdp_loses_when_memory_is_plentiful():
    model, cluster = get_model("8b"), H100.model_copy(update={"nodes": 8})
    res = exhaustive(model, cluster, 512)
    best = res.plan(0)
    assert best.zero_stage == 1 and best.pp == 1
    # Its FSDP twin is in the space, fits, and is slower: it only adds per-micro-batch weight gathers.
    p = res.plans
    twin = np.flatnonzero((p.zero_stage == 3) & (p.tp == best.tp) & (p.cp == best.cp) & (p.pp == 1)
                          & (p.micro_batch == best.micro_batch) & (p.recompute == p.recompute[res.order[0]]))
    assert len(twin) == 1
    j = int(twin[0])
    assert res.scores["fits"][j]
    assert res.scores["step_time_s"][j] > res.scores["step_time_s"][res.order[0]]
    assert res.scores["dp_comm_exposed_s"][j] > res.scores["dp_comm_exposed_s"][res.order[0]]


# ---- Optuna ----------------------------------------------------------------------------------------------


def test_search_space_and_seeds_carry_the_knob(m70):
    space = search_space(m70, H100, 512)
    assert space.choices["zero_stage"] == [1, 3]
    assert "zero_stage" in space.signature("categorical", ("time",))["choices"]
    seeds = expert_seeds(space)
    assert seeds[0]["zero_stage"] == 1 and seeds[0]["tp"] == 8          # the recipe's best guess first
    fsdp = [s for s in seeds if s["zero_stage"] == 3]
    assert len(fsdp) == 2 and seeds[1] == fsdp[0]
    assert all(s["pp"] == 1 and s["cp"] == 1 for s in fsdp)
    for s in seeds:
        key = Objective.key_of({**s, "nodes": H100.nodes})
        assert key[1:] in space.index[H100.nodes]


def test_nearest_unseen_moves_an_invalid_fsdp_proposal_to_a_valid_one(m70):
    space = search_space(m70, H100, 512)
    obj = Objective(space, None, ("time",), "categorical", penalise=False)
    bad = {"nodes": H100.nodes, "tp": 8, "cp": 1, "pp": 4, "vpp": 1, "ep": 1, "micro_batch": 1,
           "recompute": "none", "zero_stage": 3}
    key = obj.key_of(bad)
    assert key[1:] not in space.index[H100.nodes]
    cfg = obj.nearest_unseen(key, set(), np.random.default_rng(0))
    assert sum(cfg[k] != bad[k] for k in bad) == 1                     # one knob changed
    assert obj.key_of(cfg)[1:] in space.index[H100.nodes]
    assert cfg["zero_stage"] == 1 or cfg["pp"] == 1


def test_optuna_scores_fsdp_like_exhaustive_and_resumes(m70, tmp_path):
    ex = exhaustive(m70, H100, 512)
    url = f"sqlite:///{tmp_path / 'zero.db'}"
    res = optuna_search(m70, H100, 512, n_trials=30, seed=3, storage=url, study_name="z")
    assert set(np.unique(res.plans.zero_stage).astype(int)) == {1, 3}
    exact = {tuple(int(getattr(ex.plans, k)[i]) for k in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute",
                                                            "zero_stage")): float(ex.scores["step_time_s"][i])
             for i in range(len(ex.plans))}
    for i in range(len(res.plans)):
        k = tuple(int(getattr(res.plans, c)[i]) for c in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute",
                                                         "zero_stage"))
        assert res.scores["step_time_s"][i] == pytest.approx(exact[k], rel=1e-12)
        check_plan(m70, res.plan(i), 512)
    trials = res.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert all("zero_stage" in t.params for t in trials)
    assert optuna.load_study(study_name="z", storage=url).user_attrs["planner_space"]["choices"]["zero_stage"] == [1, 3]
    # Resumed: the stored study (with the knob) is accepted and grows.
    more = optuna_search(m70, H100, 512, n_trials=35, seed=4, storage=url, study_name="z")
    assert more.total_trials == 35 and more.n_trials == 5


def test_cmaes_index_encoding_has_the_knob(m70):
    pytest.importorskip("cmaes", reason="Optuna's CmaEsSampler needs the cmaes package")
    res = optuna_search(m70, H100, 512, sampler="cmaes", n_trials=20, seed=0)
    trials = res.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert all("zero_stage_index" in t.params for t in trials)
    for r in range(len(res.order)):
        check_plan(m70, res.plan(r), 512)


def test_invalid_fsdp_trial_is_not_scored(m70):
    calls = []

    def cost(model, cluster, plans):
        calls.append(len(plans))
        from planner.search import default_cost

        return default_cost(model, cluster, plans)

    space = search_space(m70, H100, 512)
    obj = Objective(space, cost, ("time",), "categorical", penalise=False)
    ev = obj.evaluate({"nodes": H100.nodes, "tp": 8, "cp": 1, "pp": 4, "vpp": 1, "ep": 1, "micro_batch": 1,
                       "recompute": "none", "zero_stage": 3})
    assert not ev["valid"] and not calls
    assert any("Megatron-FSDP" in m and "pp=4" in m for m in ev["violations"])


# ---- flags, plan check, ranked table ---------------------------------------------------------------------


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_flags_round_trip(big405, zero):
    model, cluster, full, _ = big405
    plan = full.plan(0).model_copy(update={"zero_stage": zero})
    check_plan(model, plan, cluster.num_gpus)
    args = megatron_args(model, plan)
    assert ParallelPlan(**parse_megatron_args(args, num_gpus=cluster.num_gpus)) == plan
    flags = [a for a in args if not a.startswith("#")]
    strategy = "optim_grads_params" if zero == 3 else "optim_grads"
    for f in ("--use-distributed-optimizer", "--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
              "--ckpt-format fsdp_dtensor", "--no-gradient-accumulation-fusion", "--overlap-param-gather"):
        assert f in flags
    assert ("--init-model-with-meta-device" in flags) == (zero == 3)
    # The tp-pp-dp rank order (not supported with Megatron-FSDP) is the default one at pp = 1: no flag.
    ordered = plan.model_copy(update={"rank_order": "tp-cp-ep-pp-dp"})
    assert "--use-tp-pp-dp-mapping" not in megatron_args(model, ordered)
    # An FSDP plan without the distributed_optimizer field set still gets the optimizer FSDP runs on.
    loose = plan.model_copy(update={"distributed_optimizer": False})
    back = parse_megatron_args(megatron_args(model, loose), num_gpus=cluster.num_gpus)
    assert back["distributed_optimizer"] and back["zero_stage"] == zero


def test_plan_check_zero_stage(capsys):
    argv = ["check", "--model", "70b", "--cluster", "h100x512.yaml", "--tp", "2", "--pp", "1", "--zero-stage", "3",
            "--recompute", "full", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["zero_stage"] == 3 and out["plan"]["distributed_optimizer"] and out["plan"]["dp"] == 256
    zero1 = estimate(get_model("70b"), H100, ParallelPlan(**{**out["plan"], "zero_stage": 1}))
    assert out["estimate"]["memory_breakdown_bytes"]["weights"] == pytest.approx(
        zero1.memory_breakdown_bytes["weights"] / 256, rel=1e-6)
    # Human output names the sharding.
    assert main(argv[:-1]) == 0
    assert "Megatron-FSDP (ZeRO-3)" in " ".join(capsys.readouterr().out.split())
    # FSDP with pipeline stages, and FSDP without the distributed optimizer: one-line errors, exit 2.
    assert main(["check", "--model", "70b", "--cluster", "h100x512.yaml", "--tp", "8", "--pp", "4",
                 "--zero-stage", "3"]) == 2
    err = capsys.readouterr().err
    assert "needs pp=1 but pp=4" in err and len(err.strip().splitlines()) == 1
    assert main(["check", "--model", "70b", "--cluster", "h100x512.yaml", "--tp", "2", "--zero-stage", "3",
                 "--no-distributed-optimizer"]) == 2
    assert "--zero-stage 0" in capsys.readouterr().err


def test_ranked_table_and_json_show_fsdp(capsys, big405):
    argv = ["--model", "405b", "--cluster", "h100x512.yaml", "--global-batch", "64", "--top", "5"]
    # 405B on all 512 GPUs: the ranked rows carry zero_stage; the text table tags FSDP layouts.
    assert main([*argv, "--json"]) in (0, 1)
    rows = json.loads(capsys.readouterr().out)["plans"]
    assert all(r["plan"]["zero_stage"] in (1, 3) for r in rows)
    from planner.space import layout

    assert layout({**rows[0]["plan"], "zero_stage": 3}).endswith(" fsdp")
    assert layout({**rows[0]["plan"], "zero_stage": 1}).split()[-1] != "fsdp"
    model, cluster, full, _ = big405
    from planner.report import plan_row, ranked_table

    table = ranked_table([plan_row(full, r) for r in range(3)], "405b")
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(table)
    # Memory binds on 128 H100: the best layouts shard weights with FSDP and offload activations to host memory
    # (tp4 pp1 dp32). tp2 dp64, the layout published on 128 GB200 with 186 GB each, does not fit 80 GB with full
    # recompute once two unsharded layers are counted, nor with all but one layer offloaded: 266 GB of
    # activations would have to wait in the 256 GiB of host memory a DGX H100 has per GPU (80% usable).
    text = con.export_text()
    assert "tp4 pp1 dp32 fsdp" in text and "offload" in text
    best = full.plan(0)
    assert (best.tp, best.dp, best.zero_stage, best.recompute) == (4, 32, 3, "offload")
    from costmodel.estimate import estimate

    assert estimate(model, cluster, best).fits
    for rc in ("full", "offload"):
        tp2 = best.model_copy(update={"tp": 2, "dp": 64, "recompute": rc, "recompute_layers": None})
        assert not estimate(model, cluster, tp2).fits


def test_fsdp_unsharded_buffers_follow_megatron_core(monkeypatch):
    """Megatron-FSDP (megatron-core 0.16.1 megatron_fsdp.py:375-399) sizes its communication unit as
    max(1e9, 2 x the mean TransformerLayer) elements, prefetches whole layers until unit // 2 elements are
    gathered ahead and keeps reduce-scatter buckets queued up to the unit.
    70B at tp2: a layer is 855.6M / 2 = 427.8M elements here; unit 1e9 -> prefetch ceil(5e8 / 427.8M) = 2 layers
    and a queue of floor(1e9 / 427.8M) = 2 layers: 3 layers of bf16 weights and 3 of bf16 gradients unsharded.
    Qwen3-30B-A3B at ep8: a layer is attention 18,874,368 (q 2048x4096, k and v 2048x512, o 4096x2048) + router
    262,144 + norms 4,096 + 128/8 local experts x 3 x 2048 x 768 = 75,497,472 -> 94,638,080 elements: prefetch
    ceil(5e8 / 94.64M) = 6 layers, queue floor(1e9 / 94.64M) = 10 layers."""
    from costmodel import memory
    from costmodel.flops import layer_params

    model = get_model("70b")
    lp = layer_params(model, False)["dense"]
    assert lp == pytest.approx(855.6e6, rel=1e-3)
    w, g = memory.fsdp_unsharded_elements(lp / 2, 80)
    assert (float(w), float(g)) == (3 * lp / 2, 3 * lp / 2)
    w, g = memory.fsdp_unsharded_elements(94_638_080.0, 48)
    assert (float(w), float(g)) == (7 * 94_638_080.0, 11 * 94_638_080.0)
    # Capped by the layers there are (a 4-layer model prefetches and queues 3), and a unit above the floor
    # (a 6e8-element layer: unit 1.2e9, prefetch 1 layer, queue 2).
    assert tuple(map(float, memory.fsdp_unsharded_elements(94_638_080.0, 4))) == (4 * 94_638_080.0,) * 2
    assert tuple(map(float, memory.fsdp_unsharded_elements(6e8, 80))) == (2 * 6e8, 3 * 6e8)

    plan = ParallelPlan(tp=2, pp=1, dp=256, micro_batch=1, global_batch=512, recompute="selective",
                        sequence_parallel=True, zero_stage=3, distributed_optimizer=True)
    with_buffers = max(estimate(model, H100, plan).peak_memory_bytes)
    z1 = plan.model_copy(update={"zero_stage": 1})
    z1_peak = max(estimate(model, H100, z1).peak_memory_bytes)
    monkeypatch.setattr(memory, "fsdp_unsharded_elements", lambda lp, sl: (0.0 * lp, 0.0 * lp))
    without = max(estimate(model, H100, plan).peak_memory_bytes)
    assert with_buffers - without == pytest.approx((3 + 3) * lp / 2 * 2.0 * (1 + memory.FRAGMENTATION), rel=1e-6)
    # ZeRO-1 keeps whole weights and gradients anyway: nothing extra.
    assert max(estimate(model, H100, z1).peak_memory_bytes) == z1_peak


def test_fsdp_moe_on_8_h100_fits():
    """Megatron-FSDP Qwen3-30B-A3B on one 8-H100 node: tp1 ep8 dp8, micro-batch 4 at seq 4096, full recompute.
    Per GPU, by hand (bf16 weights and gradients, Adam 12 B/param; experts sharded over ep, their expert
    data-parallel group has 1 rank):
      dense params 48 x 19,140,608 + 2 x 151,936 x 2,048 (untied embedding, LM head) = 1,541,079,040 / 8
        = 192,634,880; experts 48 x 603,979,776 / 8 = 3,623,878,656; local 3,816,513,536
      weights 2 B and gradients 2 B each 7,633,027,072; optimizer 12 B 45,798,162,432
      activations: 48 layer inputs x 16,384 tokens x 2,048 x 2 B = 3,221,225,472 plus the larger of one
        recomputed layer (1.79 GB) and the logits kept by TE's fused cross-entropy, 16,384 x 151,936 x 2 B =
        4,978,638,848 -> 8,199,864,320
      FSDP buffers (previous test): (7 + 11) x 94,638,080 x 2 B = 3,406,970,880
      live 72,671,051,776; buffers 1 GiB + 5% = 4,707,293,413; peak 77,378,345,189 of 0.95 x 80 GiB = 81.6 GB.
    Before (6 B fp32 logits added on top of the recomputed layer, 2 layers of FSDP buffers) it read 86.9 GB and
    did not fit."""
    model = get_model("qwen3-30b-a3b")
    node = H100.model_copy(update={"nodes": 1, "name": "h100x8"})
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch=4, global_batch=256, recompute="full",
                        zero_stage=3, distributed_optimizer=True)
    est = estimate(model, node, plan)
    mem = est.memory_breakdown_bytes
    assert mem["weights"] == pytest.approx(7_633_027_072, rel=1e-9)
    assert mem["grads"] == pytest.approx(7_633_027_072, rel=1e-9)
    assert mem["optimizer"] == pytest.approx(45_798_162_432, rel=1e-9)
    assert mem["activations"] == pytest.approx(8_199_864_320, rel=1e-9)
    assert mem["buffers"] == pytest.approx(4_707_293_413, rel=1e-6)
    assert max(est.peak_memory_bytes) == pytest.approx(77_378_345_189, rel=1e-6)
    assert est.fits and est.memory_capacity_bytes == pytest.approx(0.95 * 80 * 2**30)
    # Selective recompute keeps the 48 MoE layers' activations (74.6 GB): that does not fit, as it should not.
    assert not estimate(model, node, plan.model_copy(update={"recompute": "selective"})).fits


def test_zero2_reduces_gradients_in_every_backward():
    # Megatron-FSDP optim_grads (and DeepSpeed stage 2) keep only a gradient shard, so each micro-batch's
    # backward reduce-scatters (megatron_fsdp.py grad_reduce_every_bprop); the distributed optimizer reduces on
    # the last one. One micro-batch: the same step; m of them: m - 1 more reduce-scatters in the no-overlap bound.
    model = get_model("8b")

    def upper_gap(m):
        plans = [ParallelPlan(tp=1, pp=1, dp=512, global_batch=512 * m, zero_stage=z, recompute="full") for z in (1, 2)]
        zero1, zero2 = (estimate(model, H100, p) for p in plans)
        assert zero2.step_time_s == pytest.approx(zero1.step_time_s)   # hidden under the backward passes
        return zero2.step_time_upper_s - zero1.step_time_upper_s

    assert upper_gap(1) == pytest.approx(0.0, abs=1e-12)
    assert upper_gap(8) > 0.05
    assert upper_gap(16) == pytest.approx(upper_gap(8) * 15 / 7, rel=1e-6)


def test_the_executor_and_calibration_reports_label_a_plan_as_the_planner_tables_do():
    """costmodel.plan.plan_label (executor, autotune and calibration reports) is the planner's layout label plus
    micro-batch and recompute: context and expert-tensor parallelism, the sharding and the optimizer offload
    show, so a cp2 run on 8 GPUs no longer reads as dp4 alone."""
    from costmodel.plan import layout_label, plan_label
    from planner.space import layout

    cp = ParallelPlan(tp=1, pp=1, dp=4, cp=2, global_batch=64)
    assert plan_label(cp) == "tp1 pp1 dp4 cp2 mb1 selective"
    moe = ParallelPlan(tp=2, pp=2, vpp=3, dp=8, ep=8, etp=2, zero_stage=3, optimizer_offload=0.5, global_batch=64,
                       micro_batch=2, recompute="full")
    assert plan_label(moe) == "tp2 pp2 vpp3 dp8 ep8 etp2 fsdp optim-cpu50% mb2 full"
    assert layout(moe.model_dump()) == layout_label(moe.model_dump()) == "tp2 pp2 vpp3 dp8 ep8 etp2 fsdp optim-cpu50%"
    assert layout_label({**cp.model_dump(), "zero_stage": 2}) == "tp1 pp1 dp4 cp2 zero2"


def test_a_pipeline_outside_megatron_reduces_gradients_after_its_schedule(monkeypatch):
    """DeepSpeed's PipelineEngine and PyTorch's pipelining (torchtitan) start the data-parallel gradient
    reduction after the last backward (estimate.py FRAMEWORK pp_grad_overlap); megatron-core runs it under that
    backward. With a pipeline the other stacks' exposed data-parallel time is then more than twice what the
    overlap would leave (and than megatron-core's); without one the switch changes nothing."""
    from costmodel.estimate import FRAMEWORK
    from costmodel.plan import ParallelPlan

    m, cl = get_model("70b"), load_cluster("h100x512")

    def dp_s(fw, pp):
        plan = ParallelPlan(tp=8, pp=pp, dp=512 // (8 * pp), global_batch=512, micro_batch=1, framework=fw,
                            distributed_optimizer=True, zero_stage=1, sequence_parallel=True)
        return estimate(m, cl, plan).breakdown_s["dp_comm_exposed"]

    after = {pp: dp_s("other", pp) for pp in (1, 4)}
    core = dp_s("megatron-core", 4)
    monkeypatch.setitem(FRAMEWORK, "other", {**FRAMEWORK["other"], "pp_grad_overlap": True})
    under = {pp: dp_s("other", pp) for pp in (1, 4)}
    assert after[1] == under[1]
    assert after[4] > 2.0 * under[4]
    assert after[4] > 2.0 * core
