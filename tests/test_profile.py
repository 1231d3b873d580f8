"""``plan profile``: the nccl-tests importer on real logs, a real (small) measurement on this machine whose
profile loads and prices a plan, and failures that fail rather than hang."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from costmodel import comm, compute
from costmodel.estimate import estimate
from costmodel.profiles import Calibration, HardwareProfile, InputError, busbw_at, load_cluster, load_profile
from costmodel.specs import ModelSpec
from costmodel.plan import ParallelPlan
from executor import nccl_tests as nt
from executor.profile import ProfileError, launch_workers
from executor.profile_build import curve_points, fit_gemm_curve, measured_profile, merge_imported
from planner.cli import main

import profile_workers  # tests/profile_workers.py (pytest puts tests/ on sys.path)

ROOT = Path(__file__).resolve().parent.parent
H100_LOG = ROOT / "data" / "validation" / "nccl-tests" / "h100x8_all_reduce_perf.txt"
PAIR_LOG = ROOT / "tests" / "data" / "nccl-tests" / "h100_2nodes_x2_alltoall_sendrecv_perf.txt"
GIB = 2**30
# The planner installs without torch (pip install -e ".[dev]"); measuring needs the executor extra.
NO_TORCH = 'needs torch: pip install -e ".[executor]"'
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason=NO_TORCH)


def run_cli(capsys, argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *needles):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]


# ---- nccl-tests parser on the shipped logs ------------------------------------------------------------
def test_h100_all_reduce_log():
    (run,) = nt.parse_log(H100_LOG)
    assert (run.test, run.collective, run.scope, run.ranks) == ("all_reduce_perf", "all_reduce", "intra", 8)
    assert run.hosts == ("pool0-01806",) and run.devices == ("NVIDIA H100 80GB HBM3",)
    rows = run.sweep()
    assert len(rows) == 32 and rows[0].size_bytes == 8 and rows[-1].size_bytes == 16 * GIB
    assert rows[-1].busbw_bytes_per_s == pytest.approx(479.90e9)
    assert rows[-1].algbw_bytes_per_s == pytest.approx(274.23e9)
    assert rows[-1].time_s == pytest.approx(62648e-6)
    assert run.latency_s() == pytest.approx(13.67e-6)
    # nccl-tests prints 0.00 busbw below 64 B; the curve starts where it is measurable.
    assert run.points()[0] == (64, pytest.approx(0.01e9)) and len(run.points()) == 29


def test_h100_log_agrees_with_nccl_csv_and_the_shipped_curve():
    """The same sweep was transcribed into nccl.csv and built into H100.yaml by scripts/build_profile_curves.py."""
    (run,) = nt.parse_log(H100_LOG)
    with (ROOT / "data" / "validation" / "nccl.csv").open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source_id"] == "DGXC_NCCL_README"]
    assert [(int(r["bytes"]), float(r["busbw_GBps"]) * 1e9) for r in rows] == \
        [(x.size_bytes, pytest.approx(x.busbw_bytes_per_s)) for x in run.sweep()]
    times = [float(re.search(r"time_us=([\d.]+)", r["notes"]).group(1)) * 1e-6 for r in rows]
    assert times == [pytest.approx(x.time_s) for x in run.sweep()]
    shipped = load_profile("H100").curve("all_reduce", "intra")
    assert [tuple(p) for p in shipped.points] == [(b, pytest.approx(bw)) for b, bw in run.points()]


def test_multi_run_multi_host_log():
    runs = nt.parse_log(PAIR_LOG)
    assert [(r.test, r.collective, r.scope, r.ranks, len(r.sweep())) for r in runs] == [
        ("alltoall_perf", "all_to_all", "inter", 4, 10), ("sendrecv_perf", "send_recv", "inter", 4, 10)]
    a2a, sr = runs
    assert a2a.hosts == ("cnode4-006", "cnode4-012")
    assert a2a.points()[0] == (32 * 2**20, pytest.approx(44.20e9))
    assert sr.points()[-1] == (16 * GIB, pytest.approx(23.65e9))
    assert (a2a.latency_s(), sr.latency_s()) == (pytest.approx(569.3e-6), pytest.approx(1448.9e-6))
    assert a2a.sweep()[0].dtype == "double"


@pytest.mark.parametrize("path", [H100_LOG, PAIR_LOG], ids=lambda p: p.name)
def test_busbw_factor_reproduces_nccl_tests(path):
    """busbw / algbw of every printed row is nccl-tests' factor (to the print's 2-decimal rounding)."""
    for run in nt.parse_log(path):
        for r in run.sweep():
            factor = nt.busbw_factor(run.collective, run.ranks)
            if r.algbw_bytes_per_s >= 10e9:  # both printed to +-0.005 GB/s
                assert r.busbw_bytes_per_s == pytest.approx(r.algbw_bytes_per_s * factor, abs=0.0051e9 * (1 + factor))


def test_older_and_wrapped_layouts_parse_the_same():
    text = H100_LOG.read_text()
    base = nt.parse_text(text, H100_LOG)[0]
    # mpirun --tag-output prefixes, an MPI build's binary name, and no file name to go by.
    tagged = "# Collective test starting: all_reduce_perf_mpi\n" + "".join(
        f"[1,0]<stdout>:{ln}\n" for ln in text.splitlines())
    (run,) = nt.parse_text(tagged, "job-1234.out")
    assert run.test == "all_reduce_perf" and run.points() == base.points()
    # Versions without the redop/root columns and without the units line (time unit unknown).
    lines = []
    for ln in text.splitlines():
        toks = ln.split()
        if ln.lstrip("#").split()[:1] == ["size"]:
            ln = ln.replace("  redop    root", "")
        elif toks and toks[0].isdigit():
            ln = " ".join(toks[:3] + toks[5:])
        elif "(GB/s)" in ln:
            continue
        lines.append(ln)
    (old,) = nt.parse_text("\n".join(lines), "all_reduce_perf.log")
    assert old.points() == base.points() and old.latency_s() is None


@pytest.mark.parametrize("text, name, needle", [
    ("hello\n", "all_reduce_perf.log", "no nccl-tests result rows"),
    (H100_LOG.read_text(), "results.txt", "cannot tell which nccl-tests binary"),
    ("\n".join(ln for ln in H100_LOG.read_text().splitlines() if "Rank" not in ln), "all_reduce_perf.txt",
     "group size is unknown"),
    (H100_LOG.read_text().replace("13.67", "13.6x"), "all_reduce_perf.txt", ":16: column 'time'"),
])
def test_bad_logs_name_file_and_line(text, name, needle):
    with pytest.raises(InputError, match=re.escape(needle)) as err:
        nt.parse_text(text, name)
    assert name in str(err.value)


def test_import_logs_curves_sources_latency():
    imp = nt.import_logs([H100_LOG, PAIR_LOG], "2025-01-02")
    assert [(c["collective"], c["scope"], c["group_size"], len(c["points"])) for c in imp.curves] == [
        ("all_reduce", "intra", 8, 29), ("all_to_all", "inter", 4, 10), ("send_recv", "inter", 4, 10)]
    assert set(imp.sources) == {"NCCLTESTS_H100X8_ALL_REDUCE_PERF", "NCCLTESTS_H100_2NODES_X2_ALLTOALL_SENDRECV_PERF"}
    assert "2025-01-02" in imp.sources["NCCLTESTS_H100X8_ALL_REDUCE_PERF"]
    assert imp.latency_by_op_s == {"all_reduce": pytest.approx(13.67e-6)}  # inter-host runs give no intra latency
    with pytest.raises(InputError, match="already given by"):
        nt.import_logs([H100_LOG, H100_LOG], "2025-01-02")


# ---- importing into profiles through the CLI -------------------------------------------------------
def test_import_with_base_makes_a_loadable_profile(capsys, tmp_path):
    out = tmp_path / "h100-mine.yaml"
    rc, _, err = run_cli(capsys, ["profile", "--import-nccl-tests", H100_LOG, PAIR_LOG, "--base", "H100", "--out", out])
    assert rc == 0, err
    prof, h100 = load_profile(str(out)), load_profile("H100")
    assert prof.name == "h100-mine" and prof.aliases == ()
    assert prof.peak_flops == h100.peak_flops and prof.calibration == h100.calibration
    assert prof.curve("all_to_all", "inter").group_size == 4
    assert prof.curve("all_reduce", "inter") == h100.curve("all_reduce", "inter")  # kept from the base
    assert prof.latency_s("all_reduce") == pytest.approx(13.67e-6)
    assert prof.latency_s("send_recv") == pytest.approx(0.5 * h100.collective_latency_s)  # not measured intra
    cluster = tmp_path / "c.yaml"
    cluster.write_text(Path(ROOT / "hardware_profiles" / "clusters" / "h100x512.yaml").read_text()
                       .replace("gpu: H100 ", "gpu: h100-mine.yaml "))
    c = load_cluster(cluster)
    t = comm.collective_time_s(prof, c, "all_reduce", GIB, 8, 8, 1)
    assert t == pytest.approx(GIB * 2 * 7 / 8 / busbw_at(prof.curve("all_reduce", "intra"), GIB) + 13.67e-6)


def test_import_into_replaces_same_curve_and_keeps_others(capsys, tmp_path):
    target = tmp_path / "mine.yaml"
    rc, _, _ = run_cli(capsys, ["profile", "--import-nccl-tests", PAIR_LOG, "--base", "H100", "--out", target])
    assert rc == 0
    load_profile(str(target))  # cached, then rewritten: the new version must be read
    rc, _, err = run_cli(capsys, ["profile", "--import-nccl-tests", H100_LOG, "--into", target])
    assert rc == 0, err
    prof = load_profile(str(target))
    assert {(c.collective, c.scope) for c in prof.curves} == {
        ("all_reduce", "intra"), ("all_reduce", "inter"), ("all_to_all", "inter"), ("send_recv", "inter")}
    assert prof.curve("all_reduce", "intra").source == "NCCLTESTS_H100X8_ALL_REDUCE_PERF"
    assert "NCCLTESTS_H100_2NODES_X2_ALLTOALL_SENDRECV_PERF" in prof.sources


def test_merge_replaces_by_collective_scope_and_group_size():
    base = yaml.safe_load((ROOT / "hardware_profiles" / "gpus" / "H100.yaml").read_text())
    merged = merge_imported(base, nt.import_logs([H100_LOG], "d"))
    assert len(merged["curves"]) == len(base["curves"])
    assert [c["source"] for c in merged["curves"]] == ["A3MEGA_NCCL", "NCCLTESTS_H100X8_ALL_REDUCE_PERF"]


@pytest.mark.parametrize("argv, needles", [
    (["profile"], ["exactly one of --out"]),
    (["profile", "--into", "x.yaml"], ["--import-nccl-tests"]),
    (["profile", "--import-nccl-tests", "missing.log", "--base", "H100", "--out", "{tmp}/p.yaml"],
     ["missing.log", "file not found"]),
    (["profile", "--import-nccl-tests", str(H100_LOG), "--base", "H100", "--out", "{tmp}/p.txt"], ["p.txt", ".yaml"]),
    (["profile", "--import-nccl-tests", str(H100_LOG), "--base", "H100", "--out", "{tmp}/no/p.yaml"],
     ["does not exist"]),
    pytest.param(["profile", "--out", "{tmp}/p.yaml", "--world-size", "1"], ["--world-size 1"], marks=needs_torch),
])
def test_bad_profile_arguments(capsys, tmp_path, argv, needles):
    rc, _, err = run_cli(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    one_line_error(rc, err, *needles)
    assert not list(tmp_path.iterdir())


def test_into_a_generated_profile_is_refused(capsys, tmp_path):
    target = tmp_path / "H100.yaml"
    shutil.copy(ROOT / "hardware_profiles" / "gpus" / "H100.yaml", target)
    before = target.read_text()
    rc, _, err = run_cli(capsys, ["profile", "--import-nccl-tests", H100_LOG, "--into", target])
    one_line_error(rc, err, "build_profile_curves.py", "--base")
    assert target.read_text() == before


def test_schema_additions_leave_shipped_profiles_as_they_were():
    h100 = load_profile("H100")
    assert h100.kind == "gpu" and h100.gemm_efficiency_cap is None and h100.gemm_points == ()
    assert h100.latency_s("all_reduce") == h100.latency_s("all_to_all") == h100.collective_latency_s == 15e-6
    assert h100.latency_s("send_recv") == 7.5e-6
    pushed = h100.model_copy(update={"calibration": Calibration(gemm_efficiency=1.2)})  # 0.80 x 1.2 > 0.92
    assert compute.gemm_efficiency(pushed, "bf16", np.array([1e6]))[0] == compute.MAX_GEMM_EFFICIENCY
    measured = pushed.model_copy(update={"gemm_efficiency_cap": 1.0})
    assert compute.gemm_efficiency(measured, "bf16", np.array([1e6]))[0] == pytest.approx(0.8033 * 1.2)


# ---- the measurement ----------------------------------------------------------------------------
def test_gemm_curve_fit_recovers_the_model():
    dh, eff = 300.0, {"fp32": 0.9, "bf16": 0.6}
    peaks = {"fp32": 1e11, "bf16": 3e11}
    pts = [{"dtype": dt, "m": d, "n": 4 * d, "k": 2 * d,
            "flops_per_s": peaks[dt] * e * (d / (d + dh)) / (8192 / (8192 + dh))}
           for dt, e in eff.items() for d in (64, 128, 256, 512, 1024, 2048)]
    got_dh, got_eff, err = fit_gemm_curve(pts, peaks)
    assert got_dh == pytest.approx(dh, rel=1e-3) and err < 1e-3
    assert got_eff == {dt: pytest.approx(e, rel=1e-3) for dt, e in eff.items()}


H200_SWEEPS = [Path(__file__).resolve().parent.parent / "examples" / "gpu_check_h200" / run / "gpu.yaml"
               for run in ("1_local_attention", "2_flash_attention", "3_fitted_curve")]


def test_gemm_curve_leaves_out_sub_wave_gemms_on_three_real_h200_sweeps(tmp_path):
    """Three `plan profile` sweeps of one H200 (examples/gpu_check_h200): 256^3-1024^3 GEMMs have fewer
    128x128 output tiles than the 132 SMs and their rates moved 1.5-2.1x between sweeps (launch time). With
    them the fitted half-efficiency dimension went 2,422 / 3,551 / 3,028; without them 194 / 194 / 193, and
    the curve gives the measured 2048^3 bf16 rate."""
    fits, all_fits = [], []
    for path in H200_SWEEPS:
        pts = yaml.safe_load(path.read_text())["gemm_points"]
        peaks = {}
        for q in pts:
            peaks[q["dtype"]] = max(peaks.get(q["dtype"], 0.0), q["flops_per_s"])
        kept, left_out = curve_points({"gemm": pts, "sm_count": 132})
        assert {(q["m"], q["n"], q["k"]) for q in left_out} == {(256,) * 3, (512,) * 3, (1024,) * 3}
        assert len(kept) == 25 and len(left_out) == 15
        dh, eff, _ = fit_gemm_curve(kept, peaks)
        fits.append((dh, eff["bf16"]))
        all_fits.append(fit_gemm_curve(pts, peaks)[0])
        refit = yaml.safe_load(path.read_text())
        refit["gemm_max_efficiency"]["bf16"]["value"] = eff["bf16"]
        refit["gemm_half_efficiency_dim"] = dh
        (tmp_path / path.parent.name).mkdir()
        (tmp_path / path.parent.name / "gpu.yaml").write_text(yaml.safe_dump(refit))
        prof = load_profile(str(tmp_path / path.parent.name / "gpu.yaml"))
        assert prof.peak("bf16") == pytest.approx(peaks["bf16"], rel=1e-3)
        measured_2048 = next(q["flops_per_s"] for q in pts if q["dtype"] == "bf16" and q["m"] == q["k"] == 2048)
        predicted_2048 = peaks["bf16"] * compute.gemm_efficiency(prof, "bf16", np.array([2048.0]))[0]
        assert predicted_2048 == pytest.approx(measured_2048, rel=0.03)
    dhs = [f[0] for f in fits]
    assert max(dhs) / min(dhs) < 1.02 and 185 < min(dhs) < 200
    assert max(f[1] for f in fits) - min(f[1] for f in fits) < 0.02
    assert max(all_fits) / min(all_fits) > 1.4 and min(all_fits) > 2000
    # a host (CPU) sweep has no SM count: every point stays
    assert curve_points({"gemm": pts})[1] == []


def _raw(ws=8):
    """What executor.profile.measure returns, for a GPU node (figures of the shape the sweep produces)."""
    gemm = [{"dtype": dt, "m": d, "n": d, "k": d, "time_s": 2 * d**3 / r, "flops_per_s": r}
            for dt, base in (("bf16", 700e12), ("fp32", 50e12)) for d, r in ((1024, 0.6 * base), (8192, base))]
    return {"config": {"world_size": ws, "backend": "nccl", "threads": 1, "copy_bytes": 2**30},
            "gemm": gemm, "gemm_skipped": [], "copy": {"bytes_per_s": 3.0e12}, "device_name": "NVIDIA H100 80GB HBM3",
            "device_memory_bytes": 80 * GIB, "host": "node1", "platform": "Linux", "cpu_model": "x", "cpu_count": 64,
            "memory_total_bytes": 2048 * GIB, "memory_available_bytes": 2000 * GIB, "torch_version": "2.13.0",
            "date": "2025-01-02T03:04:05Z", "wall_s": 100.0, "elapsed_s": 90.0,
            "load_average_before": [0.1, 0.1, 0.1], "load_average_after": [1.0, 0.5, 0.2]}


def test_measured_gemms_with_imported_collectives():
    """`plan profile --out P --import-nccl-tests ...` on a GPU node: GEMMs measured, curves from the logs."""
    prof = HardwareProfile.model_validate(
        measured_profile(_raw(), "node", "plan profile --out node.yaml", nt.import_logs([H100_LOG, PAIR_LOG], "d")))
    assert prof.kind == "gpu" and prof.memory_bytes.value == 80 * GIB and prof.nvlink_domain_gpus == 8
    assert prof.peak_flops["bf16"].value == 700e12 and prof.peak_flops["fp32"].value == 50e12
    assert prof.gemm_max_efficiency["bf16"].value == pytest.approx(1.0, abs=1e-3)  # 8192 is the reference dim
    assert prof.gemm_half_efficiency_dim == pytest.approx(0.4 * 1024 * 8192 / (0.6 * 8192 - 1024), rel=1e-3)
    assert prof.nvlink_bandwidth_bytes_per_s.value == pytest.approx(480.16e9)  # best intra busbw of the logs
    assert prof.latency_s("all_reduce") == pytest.approx(13.67e-6)
    assert {"PLAN_PROFILE", "NCCLTESTS_H100X8_ALL_REDUCE_PERF"} <= set(prof.sources)
    assert "node1" in prof.sources["PLAN_PROFILE"] and "8 GPU(s) (NVIDIA H100 80GB HBM3)" in prof.sources["PLAN_PROFILE"]


def test_a_gpu_profile_measures_its_host_side_so_offloaded_plans_are_priced_from_it(tmp_path):
    """plan profile on GPUs also times pinned copies to and from each GPU and a CPU Adam step on each GPU's share
    of the cores (executor.profile._host_rates): the profile gets the host link (the slower direction), the host
    DRAM rate as that step streams it (host_stream_fraction 1.0: measured, not a datasheet peak) and the host
    memory per GPU, so plan --optimizer-offload and --recompute offload accept it, and a CPU step over N
    parameters costs N x 28 bytes at the measured rate."""
    from executor.profile import default_config
    from planner.space import missing_host_fields

    assert default_config(world_size=8, backend="nccl").host_rates and not default_config(backend="gloo").host_rates
    raw = _raw()
    raw["config"]["host_rates"] = True
    raw["host_rates"] = {"h2d_bytes_per_s": 26e9, "d2h_bytes_per_s": 24e9, "adam_params": 64 * 2**20,
                         "adam_threads": 14, "adam_step_s": 0.06, "adam_bytes_per_s": 50e9}
    data = measured_profile(raw, "node", "plan profile --out node.yaml", nt.import_logs([H100_LOG], "d"))
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    prof = load_profile(str(path))
    assert prof.host_link_bandwidth_bytes_per_s.value == 24e9 and prof.host_stream_fraction == 1.0
    # 24 GB/s is a PCIe link, which the GPU's network traffic crosses too; a Grace host's C2C rate is its own.
    assert prof.host_link_shared_with_network
    grace = dict(raw, host_rates={**raw["host_rates"], "h2d_bytes_per_s": 210e9, "d2h_bytes_per_s": 205e9})
    assert measured_profile(grace, "gb", "c", nt.import_logs([H100_LOG], "d"))["host_link_shared_with_network"] is False
    assert prof.host_memory_bandwidth_bytes_per_s.value == 50e9 and prof.host_memory_bytes.value == 256 * GIB
    assert "CPU Adam step over 64M fp32 parameters" in prof.gap_model and "node1" in prof.sources["HOST_MEMORY"]
    assert missing_host_fields(str(path)) == []
    # 1e9 parameters: 28 GB at 50 GB/s (0.56 s) outlasts their gradient's 4 GB over the 24 GB/s link.
    assert compute.cpu_optimizer_time_s(prof, 1e9) == pytest.approx(0.56)
    from executor.profile_report import headline, summary

    said = summary({"profile": data, "profile_path": str(path)})
    assert said["host_memory_bandwidth_bytes_per_s"] == 50e9 and "host link 24 GB/s, CPU Adam 50 GB/s" in headline(said)
    # A torch without the fused CPU AdamW: the host link and memory stand, the optimizer is not offloaded.
    raw["host_rates"] = {"h2d_bytes_per_s": 26e9, "d2h_bytes_per_s": 24e9, "adam_skipped": "RuntimeError: fused"}
    old = measured_profile(raw, "node", "c", nt.import_logs([H100_LOG], "d"))
    assert old["host_link_bandwidth_bytes_per_s"]["value"] == 24e9 and "host_memory_bandwidth_bytes_per_s" not in old
    assert "no CPU Adam step (RuntimeError: fused)" in old["gap_model"]
    # Without the measurement (a host sweep, or a GPU profile from an older plan profile) nothing changes.
    assert "host_link_bandwidth_bytes_per_s" not in measured_profile(_raw(), "n", "c", nt.import_logs([H100_LOG], "d"))


@needs_torch
def test_the_cpu_adam_step_timed_is_the_fused_step_megatron_offloads_to():
    """executor.profile.cpu_adam_step: a fused torch AdamW step on the host that moves the weight (it ran), at a
    streaming rate this machine's cores reach (tens of GB/s on two cores here; not asserted beyond > 0.5)."""
    import torch

    from executor.profile import cpu_adam_step

    step = cpu_adam_step(1 << 20)
    weight = step.__self__.param_groups[0]["params"][0]
    step()
    assert weight.abs().max().item() > 0 and weight.dtype == torch.float32
    started = time.perf_counter()
    for _ in range(5):
        step()
    rate = 5 * (1 << 20) * compute.CPU_ADAM_BYTES_PER_PARAM / (time.perf_counter() - started)
    assert rate > 0.5e9


@needs_torch
def test_the_host_measurement_runs_its_steps_and_reports_the_rates(tmp_path, monkeypatch):
    """executor.profile._host_rates end to end in one gloo rank, the GPU stood in for by host memory (pinning needs
    CUDA, so it is a no-op here): both copies and the Adam step are timed, the threads are restored, and the
    figures are the ones measured_profile reads."""
    import torch
    import torch.distributed as dist

    from executor.profile import _Ctx, _host_rates, default_config, host_cores

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    cfg = default_config(world_size=1, backend="gloo", collectives=False)
    cfg = type(cfg)(**{**cfg.__dict__, "copy_bytes": 4 * 2**20, "adam_params": 1 << 20, "target_s": 0.01})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        said = []
        ctx = _Ctx(0, cfg, torch.device("cpu"), dist.group.WORLD, lambda: None, said.append)
        threads = torch.get_num_threads()
        _host_rates(ctx)
        hr = ctx.results["host_rates"]
        # A torch whose AdamW has no fused CPU step (before 2.4): the copies stand, the step is named as skipped.
        import executor.profile as profile_mod

        def no_fused(params):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               "devices: ['cuda']")

        monkeypatch.setattr(profile_mod, "cpu_adam_step", no_fused)
        _host_rates(ctx)
        skipped = ctx.results["host_rates"]
    finally:
        dist.destroy_process_group()
    assert skipped["adam_skipped"].startswith("RuntimeError: `fused=True`") and "adam_bytes_per_s" not in skipped
    assert skipped["h2d_bytes_per_s"] > 0 and torch.get_num_threads() == threads and "not measured" in said[-1]
    assert torch.get_num_threads() == threads and hr["adam_threads"] == host_cores()
    assert min(hr["h2d_bytes_per_s"], hr["d2h_bytes_per_s"], hr["adam_bytes_per_s"]) > 0
    assert hr["adam_bytes_per_s"] == pytest.approx((1 << 20) * compute.CPU_ADAM_BYTES_PER_PARAM / hr["adam_step_s"])
    assert said and said[0].startswith("host link ") and "CPU Adam" in said[0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """`plan profile --quick` at world size 2, run as a user would (a fresh process)."""
    pytest.importorskip("torch", reason=NO_TORCH)
    d = tmp_path_factory.mktemp("profile")
    out = d / "cpu-ws2.yaml"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "profile", "--out", str(out), "--world-size", "2",
                           "--quick", "--json", "--timeout", "120"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    return {"dir": d, "out": out, "summary": json.loads(proc.stdout), "wall_s": time.perf_counter() - started}


def test_measured_profile_loads_and_says_where_it_came_from(measured):
    import torch

    prof = load_profile(str(measured["out"]))
    assert prof.kind == "host" and prof.name == "cpu-ws2" and prof.nvlink_domain_gpus == 2
    cite = prof.sources["PLAN_PROFILE"]
    for needle in ("plan profile --out", "--world-size 2", socket.gethostname(), torch.__version__, "gloo"):
        assert needle in cite
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", cite)
    total = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    assert prof.memory_bytes.value == total // 2 and 0 < prof.usable_memory_fraction <= 0.9
    assert measured["summary"]["wall_s"] > 0   # its speed is a benchmark figure (README), not a test


def test_measured_figures_are_consistent(measured):
    prof = load_profile(str(measured["out"]))
    s = measured["summary"]
    # Peak per dtype = the best GEMM measured; the efficiency curve never exceeds it.
    for dt in ("fp32", "bf16"):
        rates = [p.flops_per_s for p in prof.gemm_points if p.dtype == dt]
        assert len(rates) == 2 and prof.peak_flops[dt].value == max(rates)
        eff = compute.gemm_efficiency(prof, dt, np.array([64.0, 256.0, 8192.0]))
        assert np.all(eff <= 1.0) and np.all(eff > 0)
    assert prof.gemm_efficiency_cap == 1.0
    assert {(c.collective, c.group_size, c.scope) for c in prof.curves} == {
        (c, 2, "intra") for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")}
    for c in prof.curves:
        assert [p[0] for p in c.points] == [1024, 65536, 1048576] and all(p[1] > 0 for p in c.points)
    # Measured busbw follows nccl-tests' definition: bytes / time x factor (time of the smallest = latency).
    for c in prof.curves:
        t = prof.latency_s(c.collective)
        assert c.points[0][1] == pytest.approx(1024 / t * nt.busbw_factor(c.collective, 2), rel=2e-3)
    assert prof.nvlink_bandwidth_bytes_per_s.value == max(p[1] for c in prof.curves for p in c.points)
    assert s["hbm_bandwidth_bytes_per_s"] == prof.hbm_bandwidth_bytes_per_s.value > 1e8


def test_measured_cluster_prices_a_plan(measured, capsys, monkeypatch, tmp_path):
    cluster_path = measured["dir"] / "cpu-ws2-cluster.yaml"
    monkeypatch.chdir(tmp_path)  # the cluster finds its profile beside it, from any directory
    cluster = load_cluster(cluster_path)
    prof = load_profile(cluster.gpu)
    assert (cluster.nodes, cluster.gpus_per_node, cluster.num_gpus) == (1, 2, 2)
    assert prof.name == "cpu-ws2"
    tiny = ModelSpec(name="tiny", layers=4, hidden=256, ffn_hidden=1024, heads=4, vocab=1024, seq_len=256,
                     gated_mlp=False)
    est_tp = estimate(tiny, cluster, ParallelPlan(tp=2, global_batch=8, recompute="none"))
    est_dp = estimate(tiny, cluster, ParallelPlan(dp=2, global_batch=8, recompute="none"))
    assert est_tp.fits and est_dp.fits and est_tp.step_time_s > 0 and est_dp.step_time_s > 0
    # The GEMM work of one rank, at the measured rate, bounds the step from below.
    assert est_dp.step_time_s > 0.5 * est_dp.model_flops_per_step / 2 / prof.peak("bf16")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1024,
                               "n_positions": 256}))
    rc, out, err = run_cli(capsys, ["--model", cfg, "--cluster", cluster_path, "--global-batch", "8", "--json"])
    assert rc == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["fits"] for p in plans if "fits" in p)


# ---- failures fail, and say which worker --------------------------------------------------------
@needs_torch
def test_a_dying_worker_fails_the_launch_with_its_error():
    started = time.perf_counter()
    with pytest.raises(ProfileError, match=r"worker 1 failed: ValueError: rank one cannot go on"):
        launch_workers(profile_workers.raise_on_rank_1, 2, (), timeout_s=50, on_message=lambda *a: None)
    assert time.perf_counter() - started < 40


@needs_torch
def test_a_hanging_worker_times_out():
    seen = []
    started = time.perf_counter()
    with pytest.raises(ProfileError, match=r"no result after 15 s \(last step: rank 0 waiting\)"):
        launch_workers(profile_workers.hang_on_rank_1, 2, (), timeout_s=15,
                       on_message=lambda kind, msg: seen.append(msg))
    assert time.perf_counter() - started < 30 and seen == ["rank 0 waiting"]


@needs_torch
def test_profile_error_is_one_line_exit_1(capsys, tmp_path):
    rc, _, err = run_cli(capsys, ["profile", "--out", tmp_path / "p.yaml", "--backend", "nccl", "--world-size", "4096"])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("plan profile: error:") and "GPUs" in lines[0]
    assert not list(tmp_path.iterdir())


def test_no_torch_in_the_parser():
    code = "import sys, executor.nccl_tests, executor.profile, executor.profile_build; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.strip() == "False", proc.stderr
