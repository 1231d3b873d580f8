"""Optuna search (planner.search.optuna_search): it returns only valid plans; on 70b/h100x512 TPE lands within
1% of the exhaustive best with at most 10% of its evaluations; CMA-ES and NSGA-II run; multi-objective
searches return a Pareto front; invalid layouts are never scored and no layout is scored twice; a study in
SQLite survives SIGINT and SIGKILL of the process running it and resumes where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from costmodel.catalog import get_model
from costmodel.profiles import InputError, load_cluster
from costmodel.rules import check_plan
from planner.search import (POLISH_FRACTION, OptunaResult, default_budget, default_cost, exhaustive, expert_seeds,
                            optuna_search, polish_budget, search_space)
from planner.search._keys import cfg_of_key, knob_keys
from planner.search._objective import Objective
from planner.search._polish import polish
from planner.search._trials import optimize

ROOT = Path(__file__).resolve().parent.parent
GB = 512


@pytest.fixture(scope="module")
def m70():
    return get_model("70b"), load_cluster("h100x512")


@pytest.fixture(scope="module")
def ex70(m70):
    return exhaustive(*m70, GB)


def assert_all_valid(res: OptunaResult, model) -> None:
    assert res.evaluated == len(res.plans) == len(res.order) > 0
    for r in range(len(res.order)):
        plan = res.plan(r)
        check_plan(model, plan, plan.world_size)


def dominates(a, b) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def test_tpe_within_one_percent_of_exhaustive_with_a_tenth_of_the_evaluations(m70, ex70):
    model, cluster = m70
    best = float(ex70.scores["step_time_s"][ex70.order[0]])
    res = optuna_search(model, cluster, GB, sampler="tpe", seed=0)
    assert res.n_trials == default_budget(ex70.evaluated)
    assert res.total_trials <= 0.10 * ex70.evaluated
    assert res.evaluations <= 0.10 * ex70.evaluated
    assert res.evaluated <= 0.10 * ex70.evaluated
    assert res.any_fits and not res.interrupted
    found = float(res.scores["step_time_s"][res.order[0]])
    assert found <= 1.01 * best, (found, best)
    # Same cost model, same plan arrays: the predicted time of a plan is the exhaustive one.
    assert found >= best - 1e-12
    assert_all_valid(res, model)
    # Ranked like exhaustive: fitting plans by step time, then the rest.
    fits = res.scores["fits"][res.order]
    assert not np.any(fits[1:] & ~fits[:-1])
    t = res.scores["step_time_s"][res.order][fits]
    assert np.all(np.diff(t) >= 0)


@pytest.mark.parametrize("sampler", ["cmaes", "nsga2"])
def test_other_samplers_return_valid_plans(m70, sampler):
    if sampler == "cmaes":
        pytest.importorskip("cmaes", reason="Optuna's CmaEsSampler needs the cmaes package")
    model, cluster = m70
    res = optuna_search(model, cluster, GB, sampler=sampler, n_trials=60, seed=1)
    assert res.sampler == sampler and res.n_trials == 60
    assert res.any_fits
    assert_all_valid(res, model)


def test_invalid_layouts_are_not_scored_and_repeats_are_not_rescored(m70):
    model, cluster = m70
    seen: list[tuple] = []

    def cost(model_, cluster_, plans):
        if len(plans) == 1:  # one trial's scoring (the result is re-scored in one batch at the end)
            seen.append((int(plans.tp[0]), int(plans.cp[0]), int(plans.pp[0]), int(plans.vpp[0]),
                         int(plans.micro_batch[0]), int(plans.recompute[0]), int(plans.zero_stage[0])))
            check_plan(model_, _plan(plans), cluster_.num_gpus)
        return default_cost(model_, cluster_, plans)

    res = optuna_search(model, cluster, GB, cost=cost, sampler="nsga2", n_trials=80, seed=2)
    assert len(seen) == len(set(seen)) == res.evaluations
    trials = res.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    keys = [tuple(sorted(t.params.items())) for t in trials]
    valid = [t for t in trials if t.user_attrs["eval"]["valid"]]
    assert res.evaluations == len({tuple(sorted(t.params.items())) for t in valid})
    assert len(set(keys)) == len(keys)   # the sampler wrapper proposes each configuration once
    # Plans over memory are kept, with the memory constraint peak / capacity - 1 > 0.
    for t in valid:
        ev = t.user_attrs["eval"]
        assert t.constraints["memory"] == pytest.approx(ev["peak_memory_bytes"] / ev["memory_capacity_bytes"] - 1)
        assert (t.constraints["memory"] <= 0) == ev["fits"]
        assert t.constraints["rules"] == 0


def _plan(plans):
    from planner.search import plan_at

    return plan_at(plans, 0)


def test_expert_seeds_are_valid_and_tried_first(m70):
    model, cluster = m70
    space = search_space(model, cluster, GB)
    seeds = expert_seeds(space)
    assert 3 <= len(seeds) <= 12
    # no selective for a dense Transformer Engine model (planner.space.recompute_modes): the seeds run without
    assert seeds[0]["tp"] == 8 and seeds[0]["micro_batch"] == 1 and seeds[0]["recompute"] == "none"
    assert any(s["tp"] < 8 for s in seeds)
    res = optuna_search(model, cluster, GB, n_trials=20, seed=0)
    first = res.study.trials[0].params
    assert {k: first[k] for k in seeds[0]} == seeds[0]


def test_time_memory_pareto_front(m70):
    model, cluster = m70
    res = optuna_search(model, cluster, GB, objectives=("time", "memory"), n_trials=120, seed=0)
    assert res.sampler == "nsga2"
    front = [res.objective_values(int(i)) for i in res.pareto]
    assert len(front) >= 2
    for a in front:
        for b in front:
            assert not dominates(a, b)
    # Nothing the study evaluated that fits dominates a front point, and every front plan fits.
    fit = np.flatnonzero(res.scores["fits"])
    allv = [res.objective_values(int(i)) for i in fit]
    for a in front:
        assert not any(dominates(b, a) for b in allv)
    assert all(res.scores["fits"][res.pareto])
    for p in res.pareto_plans():
        check_plan(model, p, cluster.num_gpus)
    # The Pareto front comes first in the ranking.
    assert list(res.order[: len(res.pareto)]) == list(res.pareto)


def test_gpus_objective_samples_the_node_count(m70):
    model, cluster = m70
    res = optuna_search(model, cluster, GB, objectives="time,gpus", n_trials=80, seed=0)
    gpus = {int(p) for p in res.plans.tp * res.plans.pp * res.plans.dp * res.plans.cp}
    assert len(gpus) > 1 and max(gpus) <= cluster.num_gpus
    assert all(g & (g - 1) == 0 for g in gpus)
    front = [res.objective_values(int(i)) for i in res.pareto]
    assert front and all(not dominates(a, b) for a in front for b in front)
    assert_all_valid(res, model)


def test_bad_arguments_are_one_line_input_errors(m70, tmp_path):
    model, cluster = m70
    with pytest.raises(InputError, match="valid samplers"):
        optuna_search(model, cluster, GB, sampler="bogus")
    with pytest.raises(InputError, match="valid objectives"):
        optuna_search(model, cluster, GB, objectives=("speed",))
    with pytest.raises(InputError, match="single-objective"):
        optuna_search(model, cluster, GB, sampler="cmaes", objectives=("time", "memory"))
    with pytest.raises(InputError, match="RDB storage"):
        optuna_search(model, cluster, GB, workers=2)
    # A study made for another search is not resumed with a different space.
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    optuna_search(model, cluster, GB, n_trials=3, storage=url, study_name="s")
    with pytest.raises(InputError, match="another search"):
        optuna_search(model, cluster, 2 * GB, n_trials=3, storage=url, study_name="s")


def test_choose_strategy_builds_the_space_once_and_hands_it_on(m70, ex70, monkeypatch):
    """The valid plans counted to choose exhaustive vs Optuna are the ones the chosen strategy searches: built
    once (not again inside exhaustive or optuna_search), and the result is the same as a fresh search's."""
    import planner.search._keys as keys
    import planner.search._strategy as strategy
    from planner.search import choose_strategy

    model, cluster = m70
    built = []
    real = strategy.valid_plans

    def counting(*a, **kw):
        built.append(a[1].nodes)
        return real(*a, **kw)

    monkeypatch.setattr(strategy, "valid_plans", counting)
    monkeypatch.setattr(keys, "valid_plans", counting)
    chosen = choose_strategy(model, cluster, GB)
    assert chosen.name == "exhaustive" and chosen.n_valid == ex70.evaluated
    res = chosen.search(model, cluster, GB)
    assert built == [cluster.nodes]
    assert np.array_equal(res.order, ex70.order) and np.allclose(res.scores["step_time_s"], ex70.scores["step_time_s"])
    # Over the limit, Optuna gets the same plans: its study space is not built again.
    chosen = choose_strategy(model, cluster, GB, limit=ex70.evaluated - 1)
    assert chosen.name == "optuna" and chosen.n_valid == ex70.evaluated and len(built) == 2
    res = chosen.search(model, cluster, GB, n_trials=12, seed=0)
    assert len(built) == 2 and res.n_trials == 12
    assert_all_valid(res, model)
    # Asked to sample: nothing is counted, Optuna builds its own space; asked for exhaustive: exhaustive.
    assert choose_strategy(model, cluster, GB, sample=True).name == "optuna" and len(built) == 2
    assert choose_strategy(model, cluster, GB, sample=True, exhaustive_only=True, limit=0).name == "exhaustive"


def test_default_budget():
    assert default_budget(3153) == 315
    assert default_budget(120) == 50


def test_neighbours_are_valid_single_steps_and_repairs_two(m70):
    model, cluster = m70
    space = search_space(model, cluster, GB)
    obj = Objective(space, default_cost, ("time",), "categorical", penalise=False)
    ords = obj._ordinals()
    key = (cluster.nodes, 8, 1, 4, 5, 1, 1, 0, 1)   # tp8 pp4 vpp5, no recompute, ZeRO-1
    assert key[1:] in space.index[cluster.nodes]
    steps = obj.neighbours(key)
    # recompute none -> full is one step: the space has no selective for a dense Transformer Engine model
    assert (cluster.nodes, 8, 1, 4, 5, 1, 1, 2, 1) in steps and (cluster.nodes, 4, 1, 4, 5, 1, 1, 0, 1) in steps
    for n in steps:
        assert n[1:] in space.index[n[0]]
        (i,) = [j for j in range(len(key)) if n[j] != key[j]]
        assert abs(ords[i].index(n[i]) - ords[i].index(key[i])) == 1
    repairs = obj.neighbours(key, repair=True)
    assert repairs and not set(repairs) & set(steps) and key not in repairs
    for n in repairs:
        assert n[1:] in space.index[n[0]]
        assert sum(a != b for a, b in zip(n, key)) == 2
    # vpp 5 -> 8 (the next vpp any plan takes) breaks vpp | 20 layers per stage; pp 4 -> 2 repairs it.
    assert (cluster.nodes, 8, 1, 2, 8, 1, 1, 0, 1) in repairs


def test_polish_climbs_from_two_steps_away_to_the_exhaustive_optimum():
    """405B on 16,384 H100: from every plan two single-knob steps from the exhaustive optimum (vpp 2 where 4
    is best, cp 8 with micro-batch 2, ...), the polish sweep reaches the optimum within 20 trials."""
    model, cluster = get_model("405b"), load_cluster("h100x16384")
    ex = exhaustive(model, cluster, GB)
    best = (cluster.nodes, *knob_keys(ex.plans)[ex.order[0]])
    space = search_space(model, cluster, GB)
    probe = Objective(space, default_cost, ("time",), "categorical", penalise=False)
    near = set(probe.neighbours(best))
    starts = sorted({n2 for n in near for n2 in probe.neighbours(n)} - near - {best})
    assert len(starts) >= 6
    for start in starts:
        obj = Objective(space, default_cost, ("time",), "categorical", penalise=False)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.enqueue_trial(obj.params_of({"nodes": start[0], **cfg_of_key(start[1:])}))
        optimize(study, obj, 1, None, None)
        done, interrupted = polish(study, obj, 20, None, None)
        assert not interrupted and 1 <= done <= 20
        assert obj.ranked_keys()[0] == best, start


def test_polish_share_of_the_budget():
    assert POLISH_FRACTION == 0.2
    assert polish_budget(98, ("time",)) == 20 and polish_budget(50, ("memory",)) == 10
    assert polish_budget(120, ("time", "memory")) == 0


def test_keyboard_interrupt_returns_best_so_far(m70):
    model, cluster = m70

    def progress(done, total):
        if done == 12:
            raise KeyboardInterrupt

    res = optuna_search(model, cluster, GB, n_trials=100, seed=0, progress=progress)
    assert res.interrupted and res.n_trials == 12
    assert res.total_trials == 12 and res.any_fits


CHILD = textwrap.dedent("""
    import json, sys
    from costmodel.catalog import get_model
    from costmodel.profiles import load_cluster
    from planner.search import optuna_search
    res = optuna_search(get_model("70b"), load_cluster("h100x512"), 512, n_trials=100000,
                        storage=sys.argv[1], study_name="resume", seed=int(sys.argv[2]))
    print(json.dumps({"interrupted": res.interrupted, "n_trials": res.n_trials}))
""")


def _complete(url: str) -> list:
    try:
        study = optuna.load_study(study_name="resume", storage=url)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def _run_until(url: str, seed: int, n_complete: int, sig: int):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, url, str(seed)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_complete(url)) < n_complete:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "child made no progress"
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_sqlite_study_survives_sigint_and_sigkill_and_resumes(m70, tmp_path, monkeypatch):
    model, cluster = m70
    url = f"sqlite:///{tmp_path / 'study.db'}"
    rc, out, err = _run_until(url, 0, 10, signal.SIGINT)
    assert rc == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] is True and summary["n_trials"] >= 10
    after_int = {t.number: t.params for t in _complete(url)}
    assert len(after_int) >= 10

    rc, out, err = _run_until(url, 1, len(after_int) + 8, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    before = {t.number: t.params for t in _complete(url)}
    assert len(before) >= len(after_int) + 8
    assert all(before[n] == p for n, p in after_int.items())   # the SIGKILLed run lost nothing older

    study = optuna.load_study(study_name="resume", storage=url)
    stale = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.RUNNING]
    assert len(stale) <= 1                                       # at most the trial in flight at the kill
    # --trials N means N finished trials in the study: the resumed run completes to len(before) + 15. The
    # killed process's heartbeat stopped; with a 1 s grace the first trial of the resumed run fails it.
    from planner.search import _storage

    monkeypatch.setattr(_storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(_storage, "GRACE_S", 1)
    time.sleep(1.5)
    res = optuna_search(model, cluster, GB, storage=url, study_name="resume", n_trials=len(before) + 15, seed=2)
    assert res.n_trials == 15 and not res.interrupted
    trials = optuna.load_study(study_name="resume", storage=url).get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    for t in stale:   # failed by the heartbeat and its configuration tried again
        assert trials[t.number].state == optuna.trial.TrialState.FAIL
        retried = [u for u in trials if u.system_attrs.get("failed_trial") == t.number]
        assert len(retried) == 1 and retried[0].state == optuna.trial.TrialState.COMPLETE
    now = {t.number: t.params for t in _complete(url)}
    assert all(now[n] == p for n, p in before.items())          # every finished trial is still there
    assert len(now) == len(before) + 15                         # and the resumed run added its own
    assert min(set(now) - set(before)) > max(before)
    assert res.total_trials == len(now)
    # Repeats of configurations scored before the kill are answered from the study, not re-scored.
    assert res.evaluations <= 15
    assert_all_valid(res, model)
    again = optuna_search(model, cluster, GB, storage=url, study_name="resume", n_trials=len(now), seed=3)
    assert again.n_trials == 0 and again.total_trials == len(now)   # already complete: nothing more to run


def test_workers_share_one_sqlite_study(m70, tmp_path):
    model, cluster = m70
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    res = optuna_search(model, cluster, GB, storage=url, n_trials=24, workers=2, seed=0)
    assert res.n_trials == 24 and res.total_trials == 24 and not res.interrupted
    states = {t.state for t in res.study.get_trials()}
    assert states == {optuna.trial.TrialState.COMPLETE}
    assert_all_valid(res, model)


def test_request_that_cannot_fit_names_the_smallest_change(tmp_path, capsys):
    """405B on 16 H100s cannot fit; the planner says why and how many GPUs would do."""
    from planner.cli import main

    cluster = tmp_path / "tiny.yaml"
    cluster.write_text("name: tiny\ngpu: H100\nnodes: 2\ngpus_per_node: 8\n"
                       "inter_node: {nic_bandwidth_bytes_per_s: 50.0e+9}\n")
    assert main(["--model", "405b", "--cluster", str(cluster), "--top", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "no layout fits" in out and "GB usable" in out
    assert "smallest change that fits:" in out and "GPUs" in out


def test_a_trial_killed_before_its_first_heartbeat_is_failed_and_retried(tmp_path, monkeypatch):
    """A process killed between creating a trial and sampling it leaves a RUNNING trial with no heartbeat and
    no parameters; the next process fails it and enqueues it again, with an enqueued seed's parameters."""
    from planner.search import _storage

    storage = _storage.open_storage(f"sqlite:///{tmp_path / 'dead.db'}")
    monkeypatch.setattr(_storage, "GRACE_S", 0)   # (after opening: the storage's own grace must be positive)
    study = optuna.create_study(storage=storage, study_name="dead")
    study.enqueue_trial({"x": 3})
    seed = study.ask()                      # popped, no heartbeat recorded: the process dies here
    fresh = study.ask()
    time.sleep(0.05)
    _storage.fail_unsampled_dead_trials(study)
    trials = study.get_trials()
    assert [trials[t.number].state for t in (seed, fresh)] == [optuna.trial.TrialState.FAIL] * 2
    retried = {t.system_attrs["failed_trial"]: t for t in trials if "failed_trial" in t.system_attrs}
    assert set(retried) == {seed.number, fresh.number}
    assert all(t.state == optuna.trial.TrialState.WAITING for t in retried.values())
    assert retried[seed.number].system_attrs["fixed_params"] == {"x": 3}
    _storage.fail_unsampled_dead_trials(study)   # a second process finds nothing more to fail
    assert len(study.get_trials()) == len(trials)
