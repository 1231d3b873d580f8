"""Optimizer state in host memory (optimizer_offload: megatron-core --optimizer-cpu-offload, DeepSpeed
ZeRO-Offload): the offloaded share of the Adam state leaves the GPU for the host, and its step runs on the CPU
at the host DRAM's pace, pipelined with the gradient and weight copies over the host link."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from costmodel.catalog import get_model
from costmodel.compute import CPU_ADAM_BYTES_PER_PARAM, HOST_STREAM_FRACTION, cpu_optimizer_time_s
from costmodel.estimate import estimate
from costmodel.memory import OPTIMIZER_BYTES
from costmodel.plan import ParallelPlan
from costmodel.profiles import load_cluster, load_profile
from costmodel.rules import violations
from costmodel.runlog import parse_megatron_log
from costmodel.validate import load_cases, optimizer_offload_named, predict_case
from costmodel.profiles import InputError
from executor.launch import preflight
from planner.cli import main
from planner.outputs import megatron_args, parse_megatron_args
from csv_rows import write_rows

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "validation" / "published_runs.csv"


def _one_node():
    c = load_cluster("h100x512")
    return c.model_copy(update={"nodes": 1})


def _70b_on_8(**upd):
    return ParallelPlan(tp=8, pp=1, dp=1, global_batch=64, micro_batch=1, recompute="selective").model_copy(update=upd)


def test_host_dram_bandwidth_is_the_cpus_channels_over_the_gpus_that_share_them():
    # Two sockets x channels x MT/s x 8 bytes, per GPU.
    assert load_profile("H100").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 8 * 4800e6 * 8 / 8)
    assert load_profile("A100-80GB").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 8 * 3200e6 * 8 / 8)
    assert load_profile("B200").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 8 * 5600e6 * 8 / 8)
    assert load_profile("V100-32GB").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 6 * 2666e6 * 8 / 16,
                                                                                              rel=1e-3)
    # Grace: 1 TB/s per superchip of two Grace CPUs; a GB200's Grace serves two GPUs.
    assert load_profile("GB200").host_memory_bandwidth_bytes_per_s.value == 250e9
    assert load_profile("GH200").host_memory_bandwidth_bytes_per_s.value == 500e9
    assert load_profile("H100-PCIe").host_memory_bandwidth_bytes_per_s is None     # a PCIe card: host unknown
    # An 8-GPU board whose server nobody specifies takes the DGX of its generation's (assumptions, cited as such).
    assert load_profile("B300").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 8 * 5600e6 * 8 / 8)
    assert load_profile("H20").host_memory_bandwidth_bytes_per_s.value == pytest.approx(2 * 8 * 4800e6 * 8 / 8)


def test_the_offloaded_state_leaves_the_gpu_for_the_host():
    model, cluster = get_model("70b"), _one_node()
    on = estimate(model, cluster, _70b_on_8())
    off = estimate(model, cluster, _70b_on_8(optimizer_offload=1.0))
    half = estimate(model, cluster, _70b_on_8(optimizer_offload=0.5))
    params = on.memory_breakdown_bytes["optimizer"] / OPTIMIZER_BYTES              # this rank's share of the parameters
    assert 8.0e9 < params < 9.5e9                               # 70B over tp 8
    assert off.memory_breakdown_bytes["optimizer"] == 0.0 and half.memory_breakdown_bytes["optimizer"] == pytest.approx(on.memory_breakdown_bytes["optimizer"] / 2)
    # The host holds the state and a pinned fp32 copy of its gradients: 16 bytes a parameter.
    assert off.memory_breakdown_bytes["host_offload"] == pytest.approx(params * 16.0) and on.memory_breakdown_bytes["host_offload"] == 0.0
    assert max(on.peak_memory_bytes) > on.memory_capacity_bytes and not on.fits
    assert off.fits and max(off.peak_memory_bytes) < on.memory_capacity_bytes


def test_the_cpu_step_runs_at_the_host_drams_pace_and_the_gpu_steps_the_rest_meanwhile():
    model, cluster, prof = get_model("70b"), _one_node(), load_profile("H100")
    on = estimate(model, cluster, _70b_on_8())
    off = estimate(model, cluster, _70b_on_8(optimizer_offload=1.0))
    params = on.memory_breakdown_bytes["optimizer"] / OPTIMIZER_BYTES
    cpu = params * CPU_ADAM_BYTES_PER_PARAM / (76.8e9 * HOST_STREAM_FRACTION)
    link = params * 4.0 / 64e9
    assert cpu > link                               # a DGX H100 rank's CPU step outlasts its PCIe copies
    assert off.breakdown_s["optimizer"] == pytest.approx(cpu, rel=1e-9)
    assert 3.5 < cpu < 5.0 and on.breakdown_s["optimizer"] < 0.2
    assert off.step_time_s - on.step_time_s == pytest.approx(cpu - on.breakdown_s["optimizer"], rel=1e-6)
    half = estimate(model, cluster, _70b_on_8(optimizer_offload=0.5))
    assert half.breakdown_s["optimizer"] == pytest.approx(cpu / 2, rel=1e-9)
    # The copies bound it where the host link is the slower: one GPU of a DGX-2 (PCIe Gen3) has all 16 GPUs'
    # share of the host DRAM.
    v100 = load_profile("V100-32GB")
    t = cpu_optimizer_time_s(v100, 1e9, host_share=16.0)
    assert float(t) == pytest.approx(1e9 * 4.0 / 16e9)
    assert float(cpu_optimizer_time_s(v100, 1e9)) == pytest.approx(1e9 * 28.0 / (16e9 * HOST_STREAM_FRACTION))
    assert float(cpu_optimizer_time_s(load_profile("H100-PCIe"), 1e9)) == float("inf")


def test_the_rules_and_the_megatron_arguments():
    model = get_model("70b")
    plan = _70b_on_8(optimizer_offload=0.5)
    assert violations(model, plan, 8) == []
    bad = plan.model_copy(update={"zero_stage": 0, "distributed_optimizer": False})
    assert any("nothing is sharded (zero_stage=0)" in v for v in violations(model, bad, 8))
    args = megatron_args(model, plan)
    assert "--optimizer-cpu-offload" in args and "--optimizer-offload-fraction 0.5" in args
    assert "--use-precision-aware-optimizer" in args and "--use-distributed-optimizer" in args
    assert parse_megatron_args(args, num_gpus=8)["optimizer_offload"] == 0.5
    assert "optimizer_offload" not in parse_megatron_args(megatron_args(model, _70b_on_8()), num_gpus=8)
    assert ParallelPlan(**parse_megatron_args(args, num_gpus=8)) == plan
    # megatron/training/arguments.py: --optimizer-offload-fraction defaults to 1.0.
    assert parse_megatron_args(["--optimizer-cpu-offload", "--use-distributed-optimizer"])["optimizer_offload"] == 1.0
    with pytest.raises(InputError, match="--optimizer-offload-fraction needs a number from 0 to 1"):
        parse_megatron_args(["--optimizer-cpu-offload", "--optimizer-offload-fraction", "2"])
    with pytest.raises(InputError, match="optimizer_offload=0.5 .* beside GPUs, and this machine has none"):
        preflight(model, plan)


def test_the_executor_runs_the_offload_as_the_megatron_arguments_say(monkeypatch):
    """executor.train gives megatron-core the OptimizerConfig planner/outputs.py writes as Megatron-LM flags
    (--optimizer-cpu-offload --optimizer-offload-fraction F --use-precision-aware-optimizer
    --overlap-cpu-optimizer-d2h-h2d), which megatron-core 0.16.1 accepts (its check of Transformer Engine's
    version stood in for: TE is not installed here), and a rank stepping on the CPU gets its share of the
    cores. Without GPUs or Transformer Engine preflight refuses, one line."""
    import argparse

    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.optimizer import OptimizerConfig, optimizer_config

    import executor.launch as launch
    from executor.profile import host_cores
    from executor.train import cpu_step_threads, optimizer_config_kwargs

    args = argparse.Namespace(lr=1e-3, dtype="bf16", clip_grad=1.0)
    plan = _70b_on_8(zero_stage=1, optimizer_offload=0.5)
    kw = optimizer_config_kwargs(plan, args, torch.bfloat16)
    assert (kw["optimizer_cpu_offload"], kw["optimizer_offload_fraction"]) == (True, 0.5)
    assert kw["use_precision_aware_optimizer"] and kw["overlap_cpu_optimizer_d2h_h2d"] and kw["use_distributed_optimizer"]
    plain = optimizer_config_kwargs(plan.model_copy(update={"optimizer_offload": 0.0}), args, torch.bfloat16)
    assert not {"optimizer_cpu_offload", "use_precision_aware_optimizer"} & set(plain)
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda version: True)
    cfg = OptimizerConfig(**kw)
    assert cfg.optimizer_cpu_offload and cfg.optimizer_offload_fraction == 0.5 and cfg.decoupled_weight_decay
    assert cpu_step_threads(8) == max(1, host_cores() // 8) and cpu_step_threads(0) == host_cores()
    model = get_model("70b")
    monkeypatch.setattr(launch, "available_processes", lambda: (8, "GPUs"))
    monkeypatch.setitem(__import__("sys").modules, "transformer_engine", None)   # not importable
    with pytest.raises(InputError, match="optimizer_offload=0.5 needs Transformer Engine"):
        launch.preflight(model, plan)


def test_a_training_log_with_optimizer_offload_reads_as_such():
    text = (ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    line = "  recompute_granularity ........................... None\n"
    assert line in text and "optimizer_cpu_offload" not in text and "use_distributed_optimizer ....................... True" in text
    patched = text.replace(line, "  optimizer_cpu_offload ........................... True\n"
                                 "  optimizer_offload_fraction ...................... 0.25\n" + line)
    assert parse_megatron_log(patched, "off.log", gpu="H100").measurement.plan.optimizer_offload == 0.25
    assert parse_megatron_log(text, "on.log", gpu="H100").measurement.plan.optimizer_offload == 0.0


def test_published_rows_name_zero_offload_and_a_run_that_fits_no_other_way_offloaded():
    assert optimizer_offload_named("zero-offload (zero-2 + cpu optimizer)", "") == 1.0
    assert optimizer_offload_named("distributed optimizer", "--optimizer-cpu-offload --optimizer-offload-fraction 0.5") == 0.5
    assert optimizer_offload_named("zero-2", "cpu_offloading_num_layers=40") == 0.0   # activations, not this
    assert optimizer_offload_named("zero-3 + offload", "") == 1.0
    assert optimizer_offload_named("zero stage 2 with cpu offload", "") == 1.0
    assert optimizer_offload_named("zero-3", "") == 0.0


def _gpt2_10b_row(**upd):
    """GPT-2 10B (50 layers, hidden 4,096) on one V100 32GB of a DGX-2, 8 sequences of 1,024 a step: the
    single-GPU ZeRO-Offload setting (Ren et al., arXiv:2101.06840); no step time (nothing scored)."""
    row = dict(next(csv.DictReader(CSV.open())))
    row.update(source_id="TEST", model_name="GPT-2 10B", params_b="10", layers="50", hidden="4096", ffn_hidden="",
               heads="32", kv_heads="", vocab="50257", seq_len="1024", moe_experts="", moe_topk="",
               gpu_type="V100-32GB", num_gpus="1", gpus_per_node="16", tp="1", pp="1", vp="", cp="1", ep="", dp="1",
               sp="false", recompute="full", global_batch="8", micro_batch="8",
               zero_stage_or_distopt="ZeRO-Offload", framework="DeepSpeed", measured_metric="", measured_value="",
               precision="fp16-mixed", notes="Ren et al.", step_time_s="", step_time_derivation="", scored="true")
    row.update(upd)
    return row


def test_a_zero_offload_row_fits_one_v100_and_pays_for_the_cpu_step(tmp_path):
    path = write_rows(tmp_path / "zo.csv", [_gpt2_10b_row(), _gpt2_10b_row(zero_stage_or_distopt="ZeRO-2")])
    cases, errors = load_cases(path, unpublished=True)
    assert errors == []
    named, unnamed = cases
    assert named.plan.optimizer_offload == 1.0 and named.plan.zero_stage == 2 and unnamed.plan.optimizer_offload == 0
    got = predict_case(named)
    assert got["fits"] and got["predicted_peak_memory_bytes"] < 32 * 2**30
    # Without offload the 10B parameters' 12-byte Adam state alone (120 GB) is 3.7x the GPU.
    on_gpu = estimate(named.model, named.cluster, got["plan"].model_copy(update={"optimizer_offload": 0.0}))
    assert not on_gpu.fits and max(on_gpu.peak_memory_bytes) > 120e9
    # A row that leaves offload unsaid and fits no other way ran with it (the run ran).
    guess = predict_case(unnamed)
    assert guess["fits"] and guess["plan"].optimizer_offload == 1.0
    assert guess["assumed"][-1].startswith("optimizer_offload=1 (the published layout does not fit")
    assert guess["predicted_step_time_s"] == pytest.approx(got["predicted_step_time_s"])


def test_a_run_whose_optimizer_state_does_not_fit_keeps_the_recompute_it_names(tmp_path):
    """Llama-3-70B on one 8-H100 node, tp8 with full recompute on torchtitan: the 8.75B parameters per GPU hold
    105 GB of Adam state, which no recompute setting frees. The run kept its state in host memory and recomputed
    as it says; before, the recompute fallback ran first, found the offload, and reported recompute none (the
    fastest with offload) as what the row's recompute could not fit."""
    row = _gpt2_10b_row(model_name="Llama-3-70B", params_b="70", layers="80", hidden="8192", ffn_hidden="28672",
                        heads="64", kv_heads="8", vocab="128256", seq_len="8192", gpu_type="H100", num_gpus="8",
                        gpus_per_node="8", tp="8", dp="1", sp="true", global_batch="8", micro_batch="1",
                        zero_stage_or_distopt="FSDP", framework="torchtitan", precision="bf16")
    (case,), errors = load_cases(write_rows(tmp_path / "t.csv", [row]), unpublished=True)
    assert errors == [] and case.plan.recompute == "full" and case.plan.optimizer_offload == 0
    got = predict_case(case)
    assert got["fits"] and got["plan"].optimizer_offload == 1.0
    assert (got["plan"].recompute, got["plan"].recompute_layers) == ("full", None)
    assert not any("as the row says" in a for a in got["assumed"])
    assert got["assumed"][-1].startswith("optimizer_offload=1 (the published layout does not fit")
    # Without recompute the offloaded layout fits too and is faster: the row's setting, not the fastest, is kept.
    none = estimate(case.model, case.cluster, got["plan"].model_copy(update={"recompute": "none"}))
    assert none.fits and none.step_time_s < got["predicted_step_time_s"]


def test_plan_check_offers_offload_and_refuses_it_without_a_known_host(tmp_path, capsys):
    import yaml

    cl = yaml.safe_load((ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml").read_text())
    cl["nodes"] = 1
    (tmp_path / "h100x8.yaml").write_text(yaml.safe_dump(cl))
    rc = main(["check", "--model", "70b", "--cluster", str(tmp_path / "h100x8.yaml"), "--tp", "8",
               "--global-batch", "64"])
    out = capsys.readouterr().out
    # (recompute none: plan check's default for a dense Transformer Engine model)
    assert rc == 1 and "optimizer_offload 0.0 -> 1.0: memory 212% -> 76%" in out
    cl["gpu"] = "H100-PCIe"
    (tmp_path / "pcie.yaml").write_text(yaml.safe_dump(cl))
    rc = main(["check", "--model", "8b", "--cluster", str(tmp_path / "pcie.yaml"), "--tp", "2", "--optimizer-offload", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no host_memory_bandwidth_bytes_per_s" in err and err.count("\n") == 1
    rc = main(["check", "--model", "8b", "--cluster", "h100x512.yaml", "--optimizer-offload", "1.5"])
    assert rc == 2 and "expected" in capsys.readouterr().err


def test_when_no_layout_fits_plan_names_the_fastest_with_the_optimizer_in_host_memory(tmp_path, capsys):
    import yaml

    cl = yaml.safe_load((ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml").read_text())
    cl["nodes"] = 1
    (tmp_path / "h100x8.yaml").write_text(yaml.safe_dump(cl))
    rc = main(["--model", "70b", "--cluster", str(tmp_path / "h100x8.yaml"), "--global-batch", "64"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1 and "no layout fits" in out
    assert "on these GPUs with the optimizer state in host memory (optimizer_offload 1" in out
    assert "smallest change that fits: 16 GPUs" in out
    # Where the host is unknown (a PCIe card), the message offers no offload.
    cl["gpu"] = "H100-PCIe"
    (tmp_path / "pcie.yaml").write_text(yaml.safe_dump(cl))
    main(["--model", "70b", "--cluster", str(tmp_path / "pcie.yaml"), "--global-batch", "64"])
    out = " ".join(capsys.readouterr().out.split())
    assert "no layout fits" in out and "optimizer state in host memory" not in out


def test_plan_validate_counts_the_rows_predicted_not_to_fit(tmp_path, capsys):
    import json

    big = _gpt2_10b_row(model_name="GPT-2 175B", params_b="175", layers="96", hidden="12288", heads="96")
    path = write_rows(tmp_path / "two.csv", [_gpt2_10b_row(), big])
    assert main(["validate", str(path), "--json", str(tmp_path / "v.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "predicted not to fit: 1 of 2 predicted rows (row 1 GPT-2 175B on 1 V100-32GB:" in out
    assert json.loads((tmp_path / "v.json").read_text())["predicted_not_to_fit"] == [1]
    assert main(["validate", str(write_rows(tmp_path / "one.csv", [_gpt2_10b_row()]))]) == 0
    assert "predicted to fit: all 1 predicted rows" in " ".join(capsys.readouterr().out.split())


def test_the_launch_script_gives_the_cpu_step_its_cores(tmp_path):
    import subprocess

    from planner.outputs import launch_script

    model, cluster = get_model("70b"), _one_node()
    off = launch_script(model, cluster, _70b_on_8(optimizer_offload=1.0), megatron_args(model, _70b_on_8(optimizer_offload=1.0)))
    on = launch_script(model, cluster, _70b_on_8(), megatron_args(model, _70b_on_8()))
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-' in off and "OMP_NUM_THREADS" not in on
    # The line runs under the script's set -u and gives at least one thread.
    line = "\n".join(ln for ln in off.splitlines() if ln.startswith(("_cores=", "export OMP_NUM_THREADS")))
    out = subprocess.run(["bash", "-c", f"set -euo pipefail\nGPUS_PER_NODE=8\n{line}\necho $OMP_NUM_THREADS"],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert int(out.stdout) >= 1


def test_plan_searches_layouts_with_the_optimizer_in_host_memory_when_asked(tmp_path, capsys):
    import json

    import yaml

    from costmodel.trust import support_counts
    from planner.space import valid_plans

    cl = yaml.safe_load((ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml").read_text())
    cl["nodes"] = 1
    (tmp_path / "h100x8.yaml").write_text(yaml.safe_dump(cl))
    # Every candidate offloads the share asked for and shards its optimizer state (no DDP layouts).
    model, cluster = get_model("70b"), load_cluster(str(tmp_path / "h100x8.yaml"))
    plans = valid_plans(model, cluster, 64, optimizer_offload=0.5)
    assert len(plans) > 0 and set(plans.optimizer_offload) == {0.5} and plans.zero_stage.min() >= 1
    with_ddp = valid_plans(model, cluster, 64, zero_stages=(0, 1))
    assert (with_ddp.zero_stage == 0).any()
    assert not (valid_plans(model, cluster, 64, zero_stages=(0, 1), optimizer_offload=1.0).zero_stage == 0).any()
    # No published run offloads its optimizer: such a plan has no validated support (the wider interval).
    assert set(support_counts(model, cluster, plans)) == {0}
    # The search ranks them and the best is the layout the no-fit message names (tp4 cp2 FSDP, 58.6 s; no
    # selective recompute for a dense Transformer Engine model).
    out_dir = tmp_path / "plan"
    rc = main(["--model", "70b", "--cluster", str(tmp_path / "h100x8.yaml"), "--global-batch", "64",
               "--optimizer-offload", "1", "--json", "--out", str(out_dir)])
    got = json.loads(capsys.readouterr().out)
    best = got["plans"][0]
    assert rc == 0 and best["fits"] and best["plan"]["optimizer_offload"] == 1.0
    assert (best["plan"]["tp"], best["plan"]["cp"], best["plan"]["dp"], best["plan"]["zero_stage"]) == (4, 2, 1, 3)
    assert best["step_time_s"] == pytest.approx(58.6, abs=0.05) and best["support_runs"] == 0
    assert best["breakdown_s"]["optimizer"] == pytest.approx(4.3, abs=0.05)
    assert "--optimizer-cpu-offload" in (out_dir / "megatron_args.txt").read_text()
    capsys.readouterr()
    main(["--model", "70b", "--cluster", str(tmp_path / "h100x8.yaml"), "--global-batch", "64",
          "--optimizer-offload", "1", "--top", "1"])
    assert "tp4 pp1 dp1 cp2 fsdp optim-cpu" in capsys.readouterr().out
    # Optuna searches the same narrowed space: every trial offloads, and TPE finds the exhaustive best (80 trials:
    # its seeds run without recompute here, which does not fit at tp4 and below; with selective they did, and 40
    # were enough).
    rc = main(["--model", "70b", "--cluster", str(tmp_path / "h100x8.yaml"), "--global-batch", "64",
               "--optimizer-offload", "1", "--sampler", "tpe", "--trials", "80", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and got["search"] == "optuna tpe"
    assert {p["plan"]["optimizer_offload"] for p in got["plans"]} == {1.0}
    assert got["plans"][0]["step_time_s"] == pytest.approx(best["step_time_s"])
    # Offload only on a GPU whose host is known.
    cl["gpu"] = "H100-PCIe"
    (tmp_path / "pcie.yaml").write_text(yaml.safe_dump(cl))
    rc = main(["--model", "70b", "--cluster", str(tmp_path / "pcie.yaml"), "--optimizer-offload", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "GPU profile H100-PCIe has no host_memory_bandwidth_bytes_per_s" in err


def test_a_stored_study_remembers_that_it_searched_offloaded_layouts(tmp_path, capsys):
    """The narrowed space is part of an Optuna study's signature and default name: the default names of the two
    searches differ, and resuming a study by name with the other space is a one-line error naming the
    difference, not a silent mix of offloaded and resident trials. A multi-objective search over GPU counts keeps
    the narrowing at every count."""
    import json

    from planner.search._keys import search_space
    from planner.search._study import default_study_name

    model, cluster = get_model("8b"), load_cluster("h100x512").model_copy(update={"nodes": 4})
    plain = search_space(model, cluster, 64, vary_nodes=True)
    off = search_space(model, cluster, 64, vary_nodes=True, space_kw={"optimizer_offload": 0.5})
    assert all(set(v.optimizer_offload) == {0.5} for v in off.valid.values()) and len(off.nodes) > 1
    assert "space" not in plain.signature("categorical", ("time",))
    assert off.signature("categorical", ("time",))["space"] == {"optimizer_offload": 0.5}
    assert default_study_name(off, ("time",), "categorical").endswith("-time-optim-cpu0.5")
    assert not default_study_name(plain, ("time",), "categorical").endswith("cpu0.5")
    db = f"sqlite:///{tmp_path / 'study.db'}"
    common = ["--model", "8b", "--cluster", "h100x512", "--global-batch", "64", "--storage", db,
              "--study-name", "s", "--trials", "20", "--json"]
    assert main(common) == 0
    capsys.readouterr()
    rc = main([*common, "--optimizer-offload", "0.5"])
    err = capsys.readouterr().err
    assert rc == 2 and "was made for another search" in err and "space None (now" in err and err.count("\n") == 1
    rc = main(["--model", "8b", "--cluster", "h100x512", "--global-batch", "64", "--optimizer-offload", "0.5",
               "--objectives", "time,gpus", "--trials", "30", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and {p["plan"]["optimizer_offload"] for p in got["plans"]} == {0.5}
    # Worker processes open the shared study with the same narrowed space (else its signature would refuse them).
    rc = main([*common[:7], f"sqlite:///{tmp_path / 'shared.db'}", "--study-name", "w", "--workers", "2",
               "--trials", "30", "--json", "--optimizer-offload", "0.5"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and got["trials"] == {"this_run": 30, "in_study": 30}
    assert {p["plan"]["optimizer_offload"] for p in got["plans"]} == {0.5}


def test_a_routed_search_narrows_to_offloaded_layouts(tmp_path, capsys):
    """plan --routing --optimizer-offload F: the expert space (ep, etp, placement) of the offloaded layouts only,
    each paying its CPU step."""
    import json

    import numpy as np

    from planner.routing import load_routing, routed_search

    qwen, h100 = get_model("qwen3-30b-a3b"), load_cluster("h100x512")
    frac = np.full(qwen.num_experts, 0.6 / (qwen.num_experts - 4))
    frac[:4] = 0.1
    hist = tmp_path / "summary.json"
    hist.write_text(json.dumps({"moe_routing_histogram": [(frac * 1e6).astype(int).tolist()] * qwen.moe_layers}))
    routing = load_routing(str(hist), qwen)
    rs = routed_search(qwen, h100, 1024, routing, optimizer_offload=1.0)
    res = rs.result
    assert set(res.plans.optimizer_offload) == {1.0} and res.plans.zero_stage.min() >= 1
    assert (res.scores["optimizer_s"] > 0).all()
    rc = main(["--model", "qwen3-30b-a3b", "--cluster", "h100x512", "--global-batch", "1024", "--routing",
               str(hist), "--optimizer-offload", "1", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and {p["plan"]["optimizer_offload"] for p in got["plans"]} == {1.0}


def test_a_heterogeneous_cluster_searches_offloaded_layouts_on_every_group(tmp_path, capsys):
    """plan --optimizer-offload F on a cluster of device groups: every stage of every plan (alone, uniform and
    mixed) keeps that share of its optimizer state in host memory, priced on its own group's host; 70B, which fits
    on the V100 group alone only that way, does so. The launchable plan's Megatron arguments carry the flags; a
    group whose host is unknown is a one-line error naming it."""
    import json

    import yaml

    from costmodel.hetero import HeteroPlan, estimate_hetero
    from planner.hetero import describe, hetero_search, write_hetero_outputs

    model, mixed = get_model("70b"), load_cluster("a100-v100-mixed")
    plain = hetero_search(model, mixed, 512, top=3)
    off = hetero_search(model, mixed, 512, top=3, optimizer_offload=1.0)
    assert plain.alone["v100"] is None and off.alone["v100"] is not None
    assert {s.plan.optimizer_offload for s in off.ranked} == {1.0} and "optim-cpu" in describe(off.ranked[0].plan)
    # One plan priced both ways: the state leaves the GPUs, the CPU step is added to the step.
    p = off.ranked[0].plan
    e_off, e_on = estimate_hetero(model, mixed, [p, p.model_copy(update={"optimizer_offload": 0.0})])
    assert max(e_off.peak_memory_bytes) < max(e_on.peak_memory_bytes) and e_off.step_time_s > e_on.step_time_s
    launch = off.best_launchable()
    write_hetero_outputs(str(tmp_path / "out"), model, mixed, launch)
    args = (tmp_path / "out" / "megatron_args.txt").read_text()
    assert "--optimizer-cpu-offload" in args and "--optimizer-offload-fraction 1" in args
    rc = main(["--model", "70b", "--cluster", "a100-v100-mixed", "--global-batch", "512", "--optimizer-offload", "1",
               "--top", "2", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and got["search"] == "heterogeneous"
    assert {q["plan"]["optimizer_offload"] for q in got["plans"]} == {1.0}
    data = yaml.safe_load((ROOT / "hardware_profiles" / "clusters" / "a100-v100-mixed.yaml").read_text())
    data["device_groups"][1]["gpu"] = "H100-PCIe"
    (tmp_path / "pcie-mixed.yaml").write_text(yaml.safe_dump(data))
    rc = main(["--model", "70b", "--cluster", str(tmp_path / "pcie-mixed.yaml"), "--optimizer-offload", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "GPU profile H100-PCIe has no host_memory_bandwidth_bytes_per_s" in err
    with pytest.raises(InputError, match="optimizer offload needs the host of group 'v100' \\(H100-PCIe\\)"):
        hetero_search(model, load_cluster(str(tmp_path / "pcie-mixed.yaml")), 512, optimizer_offload=1.0)
    assert isinstance(p, HeteroPlan)
