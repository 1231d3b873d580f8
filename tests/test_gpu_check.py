"""scripts/gpu_check.sh --dry-run: the GPU check's whole path (plan profile on one rank with a base profile's
collective curves, plan on the measured cluster, plan run in bf16, the predicted-vs-measured table) on the CPU
with gloo, so that the script a GPU machine runs cannot rot."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel.estimate import estimate
from costmodel.profiles import load_cluster, load_profile
from costmodel.specs import ModelSpec
from costmodel.plan import ParallelPlan

ROOT = Path(__file__).resolve().parent.parent
BASH = shutil.which("bash")
# The planner installs without torch (pip install -e ".[dev]"); measuring and training need the executor extra.
needs_executor = pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron")
                                    is None, reason='needs torch and megatron-core: pip install -e ".[executor]"')


@pytest.mark.skipif(BASH is None, reason="bash not installed")
@needs_executor
def test_gpu_check_dry_run_writes_profile_metrics_and_table(tmp_path):
    out = tmp_path / "gpu_check_out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    res = subprocess.run([BASH, str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env, capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    for rel in ("environment.json", "profile/gpu.yaml", "profile/cluster.yaml", "plan/plan.json",
                "run/metrics.jsonl", "run/summary.json", "predicted_vs_measured.json", "predicted_vs_measured.md"):
        assert (out / rel).is_file(), rel
    assert json.loads((out / "environment.json").read_text())["backend"] == "gloo"
    # step 6, the optimizer-offload run, needs GPUs and Transformer Engine: the dry run says it skipped it
    assert "optimizer offload skipped: megatron-core steps it beside GPUs, with Transformer Engine (dry run on CPU)" \
        in res.stdout and "offload" not in json.loads((out / "predicted_vs_measured.json").read_text())

    # the profile was measured here: one rank, the base profile's collective curves
    prof = load_profile(str(out / "profile" / "gpu.yaml"))
    assert prof.kind == "host" and prof.peak("bf16") > 0 and prof.hbm_bandwidth_bytes_per_s.value > 0
    assert prof.curves and all("via base profile H100" in prof.sources[c.source] for c in prof.curves)
    cluster = load_cluster(out / "profile" / "cluster.yaml")
    assert cluster.num_gpus == 1

    # three bf16 steps of the planned model, recorded
    rows = [json.loads(ln) for ln in (out / "run" / "metrics.jsonl").read_text().splitlines() if ln]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["step_time_s"] == pytest.approx(
        float(np.median([r["step_time_s"] for r in rows[1:]])))

    # the table: the cost model on the fresh profile against the run, every figure finite and positive
    table = json.loads((out / "predicted_vs_measured.json").read_text())
    assert table["finite"] is True
    by = {r["quantity"]: r for r in table["table"]}
    assert list(by) == ["step time (s)", "tokens/s", "MFU vs measured bf16 peak", "peak memory (GiB)"]
    for r in by.values():
        for k in ("predicted", "measured", "measured_over_predicted"):
            assert math.isfinite(r[k]) and r[k] > 0, (r, k)
    plan_data = json.loads((out / "plan" / "plan.json").read_text())
    model, plan = ModelSpec.model_validate(plan_data["model"]), ParallelPlan.model_validate(plan_data["plan"])
    assert model.precision == "bf16" and plan.world_size == 1 and plan.global_batch == 4
    assert by["step time (s)"]["predicted"] == pytest.approx(estimate(model, cluster, plan).step_time_s, rel=1e-9)
    assert by["step time (s)"]["measured"] == pytest.approx(summary["step_time_s"])
    assert by["tokens/s"]["measured"] == pytest.approx(4 * model.seq_len / summary["step_time_s"])
    md = (out / "predicted_vs_measured.md").read_text()
    assert "| quantity | predicted | measured | measured / predicted |" in md
    assert "measured HBM copy bandwidth" in res.stdout and "measured GEMM peaks" in res.stdout

    # the loop: the layout at micro-batch 4 (twice the plan's 2: 4x does not divide the batch), calibration on both
    # runs, the re-plan on the calibrated profile; every run predicted before and after
    loop = table["loop"]
    assert plan.micro_batch == 2 and [r["micro_batch"] for r in loop["runs"][:2]] == [2, 4]
    assert [r["run"] for r in loop["runs"][:2]] == ["run", "run_mb4"] and len(loop["runs"]) in (2, 3)
    second = json.loads((out / "run_mb4" / "summary.json").read_text())
    assert second["plan"]["micro_batch"] == 4 and second["steps"] == 3
    assert loop["runs"][1]["measured_s"] == pytest.approx(second["step_time_s"])
    assert loop["runs"][0]["predicted_before_s"] == pytest.approx(by["step time (s)"]["predicted"], rel=1e-9)
    assert loop["calibration"]["factors"] == ["gemm_efficiency", "layer_overhead_s"]
    calibrated = load_profile(str(out / "profile" / "calibrated.yaml"))
    assert calibrated.calibration.fitted_by.startswith("plan calibrate")
    for r in loop["runs"]:
        ran = plan.model_copy(update={"micro_batch": r["micro_batch"]})
        assert r["predicted_after_s"] == pytest.approx(
            estimate(model, cluster, ran, profile=calibrated.for_model(model)).step_time_s, rel=1e-9)
    pick = json.loads((out / "plan_calibrated" / "plan.json").read_text())["plan"]
    assert loop["replan"]["plan"] == pick and (out / loop["replan"]["run"] / "summary.json").is_file()
    assert "## Calibrated on the runs: gemm_efficiency" in md and md.count("\n| run") == 1 + len(loop["runs"])


def test_profile_base_errors_are_one_line(tmp_path, capsys):
    from planner.cli import main

    assert main(["profile", "--out", str(tmp_path / "p.yaml"), "--world-size", "1", "--base", "NoSuchGPU"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU type 'NoSuchGPU'" in err and err.count("\n") == 1
    assert not (tmp_path / "p.yaml").exists()
    assert main(["profile", "--into", str(tmp_path / "p.yaml")]) == 2
    assert "--into takes its curves from --import-nccl-tests" in capsys.readouterr().err
    # one rank measures no collectives: without --base (or logs) the profile has no curves to give
    pytest.importorskip("torch", reason='needs torch: pip install -e ".[executor]"')
    assert main(["profile", "--out", str(tmp_path / "p.yaml"), "--world-size", "1"]) == 2
    assert "at least 2 ranks" in capsys.readouterr().err


@pytest.mark.skipif(BASH is None, reason="bash not installed")
@needs_executor
def test_gpu_check_without_a_gpu_refuses(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the real check would run")
    env = {**os.environ, "OUT": str(tmp_path / "o"), "PYTHON": sys.executable}
    res = subprocess.run([BASH, str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 2 and "no CUDA GPU visible to torch; run with --dry-run" in res.stderr
    assert not (tmp_path / "o" / "profile").exists()
