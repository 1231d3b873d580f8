"""Fit a hardware profile's efficiency factors to measured runs and write a calibrated copy.

    plan calibrate --measurements runs/*/metrics.jsonl --profile P.yaml --out P_calibrated.yaml
    plan calibrate --measurements RUNS.csv --profile H100 --out h100_mine.yaml
    plan calibrate --measurements train.log --profile H100 --out h100_mine.yaml

A measurement is one run, read from

- an executor run directory (or its metrics.jsonl / summary.json): the plan it ran, the cluster it ran on (the
  plan.json's cluster, or ``--cluster``) and its median step time without the first (warm-up) step;
- a CSV in the schema of data/validation/published_runs.csv: every scored row of the profile's GPU type
  (costmodel.validate turns rows into model, cluster and plan as ``plan validate`` does);
- any other file: a Megatron-LM / Megatron-Bridge / NeMo training log (costmodel.runlog).

GPU profiles are updated by costmodel.recalibrate (one factor from one or two runs, more from more, the prior
centred on the profile's values); CPU-host profiles (``plan profile`` on gloo) by costmodel.fit's least squares
on the host factors, which refuses fewer runs than factors. No torch here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml
from pydantic import ValidationError

from costmodel.files import write_file_atomic
from costmodel.fit import Measurement, fit_calibration, host_factors, predict
from costmodel.plan import ParallelPlan, plan_label
from costmodel.profiles import (Calibration, HardwareProfile, InputError, load_cluster, load_profile, same_gpu,
                                validation_line)
from costmodel.recalibrate import fit_activation_memory, recalibrate
from costmodel.specs import ClusterSpec, ModelSpec

def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def load_measurement(path: str | Path, cluster: ClusterSpec | None = None) -> Measurement:
    """One run (its directory, metrics.jsonl or summary.json) as a Measurement."""
    run = _run_dir(Path(path))
    summary_path = run / "summary.json"
    if not summary_path.exists():
        raise InputError(f"{path}: no summary.json beside it (give an executor run directory or its metrics.jsonl)")
    try:
        summary = json.loads(summary_path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{summary_path}: not an executor summary (malformed JSON: {e})") from None
    if not isinstance(summary, dict) or not {"model", "plan"} <= set(summary):
        raise InputError(f"{summary_path}: not an executor summary; expected a JSON object with fields 'model' and "
                         f"'plan' (as plan run writes it)")
    if cluster is None and "cluster" not in summary:
        raise InputError(f"{summary_path}: the run's plan has no cluster; pass --cluster C.yaml")
    parts = {}
    for key, spec in (("model", ModelSpec), ("plan", ParallelPlan), ("cluster", ClusterSpec)):
        if key == "cluster" and cluster is not None:
            continue
        try:
            parts[key] = spec.model_validate(summary[key])
        except ValidationError as err:
            raise InputError(f"{summary_path}: '{key}': {validation_line(err)}") from None
    model, plan, cluster = parts["model"], parts["plan"], cluster or parts["cluster"]
    # The CUDA allocator's peak is the tensors the cost model counts; a CPU run's process RSS is not.
    peak = summary.get("peak_memory_bytes") if summary.get("device") == "cuda" else None
    return Measurement(model=model, cluster=cluster, plan=plan, step_time_s=_median_step_s(run / "metrics.jsonl"),
                       peak_memory_bytes=float(peak) if isinstance(peak, (int, float)) and peak > 0 else None)


def _median_step_s(metrics: Path) -> float:
    """The median ``step_time_s`` of a run's metrics.jsonl, the first step (warm-up) left out when there are
    others; a one-line error naming the line for anything that is not a positive step time."""
    if not metrics.exists():
        raise InputError(f"{metrics}: not found (plan run writes one line per step there)")
    times = []
    for i, ln in enumerate(metrics.read_bytes().decode("utf-8", "replace").splitlines(), 1):
        if not ln.strip():
            continue
        try:
            t = float(json.loads(ln)["step_time_s"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InputError(f"{metrics}: line {i}: field 'step_time_s': expected a JSON object with a step time "
                             f"in seconds") from None
        if not (math.isfinite(t) and t > 0):
            raise InputError(f"{metrics}: line {i}: field 'step_time_s' = {t}: expected a time in seconds > 0")
        times.append(t)
    if not times:
        raise InputError(f"{metrics}: no steps recorded")
    return float(np.median(times[1:] or times))


def load_measurements(paths: list[str], cluster: ClusterSpec | None = None) -> list[Measurement]:
    return [load_measurement(p, cluster) for p in paths]


def _is_executor_run(p: Path) -> bool:
    return p.is_dir() or p.name in ("metrics.jsonl", "summary.json")


def read_measurements(paths: list[str], profile: HardwareProfile, *, cluster: ClusterSpec | None = None,
                      gpu: str | None = None, warmup_iterations: int = 3) -> tuple[list[Measurement], list[dict]]:
    """The runs in executor run directories, published-runs CSVs and Megatron logs, for ``profile``'s GPU.

    A CSV contributes its scored rows of that GPU type (the others are counted, not used); a log is on
    ``gpu`` (or the cluster's GPU), else on the device it names, else on the profile's GPU. Returns the
    measurements and one line of provenance per file."""
    from costmodel.runlog import gpu_in_log, parse_megatron_log
    from costmodel.validate import load_cases, measurements_for

    out, notes = [], []
    for spec in paths:
        p = Path(spec)
        if _is_executor_run(p):
            out.append(load_measurement(p, cluster))
            notes.append({"path": spec, "kind": "executor run", "runs": 1})
            continue
        if not p.exists():
            raise InputError(f"{spec}: file not found")
        if p.suffix.lower() in (".csv", ".tsv"):   # published-runs tables (a .tsv: tab-separated export)
            cases, errors = load_cases(p, unpublished=True)
            # A row of this GPU type that cannot be read is left out and named (as plan validate reports it);
            # rows of other (or unknown) GPUs are not used.
            unread = [e for e in errors if _on_profile_gpu(e.get("gpu_type"), profile)]
            on_gpu = [c for c in cases if same_gpu(load_profile(c.cluster.gpu), profile)]
            # A row that publishes no step time (a TFLOP/s or MFU figure only) measures nothing to fit to.
            mine = [c for c in on_gpu if math.isfinite(c.published_step_time_s)]
            mine_timeless = [c.row for c in on_gpu if not math.isfinite(c.published_step_time_s)]
            if not mine and unread:
                raise InputError(unread[0]["error"] + (f" (and {len(unread) - 1} more row(s) on {profile.name})"
                                                       if len(unread) > 1 else ""))
            if not mine:
                if mine_timeless:
                    raise InputError(f"{spec}: field 'step_time_s': no row on {profile.name} gives a step time "
                                     f"(rows {', '.join(map(str, mine_timeless[:5]))} publish none); valid: a step "
                                     f"time, or a measured_metric that gives one (tokens_per_sec_per_gpu, ...)")
                types = sorted({c.gpu_type for c in cases})
                if not types and errors:   # scored rows none of which could be read: say why the first could not
                    types = [f"none readable ({len(errors)} scored row(s) could not be read; the first: "
                             f"{errors[0]['error']})"]
                types = types or ["none (no scored=true rows)"]
                raise InputError(f"{spec}: field 'gpu_type': no scored row on {profile.name} (the --profile GPU); "
                                 f"GPU types there: {', '.join(types)}")
            out += measurements_for(mine, {c.cluster.gpu: profile for c in mine})
            notes.append({"path": spec, "kind": "published-runs CSV", "runs": len(mine), "rows": [c.row for c in mine],
                          "other_gpu_rows": len(cases) + len(errors) - len(on_gpu) - len(unread),
                          "rows_without_step_time": mine_timeless,
                          "rows_not_read": [{"row": e["row"], "error": e["error"]} for e in unread]})
            continue
        try:
            text = p.read_text(errors="replace")
        except OSError as e:
            raise InputError(f"{spec}: cannot read ({e.strerror})") from None
        on = gpu or (cluster.gpu if cluster is not None else None) or gpu_in_log(text) or profile.name
        run = parse_megatron_log(text, spec, gpu=None if cluster is not None else on, cluster=cluster,
                                 warmup_iterations=warmup_iterations)
        if not same_gpu(load_profile(run.measurement.cluster.gpu), profile):
            raise InputError(f"{spec}: field 'gpu': the run is on {load_profile(on).name} but --profile is "
                             f"{profile.name}; calibrate the profile of the GPU the run used")
        out.append(run.measurement)
        notes.append({"path": spec, "kind": "Megatron log", "runs": 1, "iterations_used": len(run.iterations),
                      "iterations_skipped": run.skipped, "step_time_s": run.measurement.step_time_s,
                      "logged_tflops_per_gpu": run.tflops_per_gpu})
    return out, notes


def _on_profile_gpu(gpu_type: str | None, profile: HardwareProfile) -> bool:
    """Whether a CSV row's gpu_type names ``profile``'s GPU (False for a type no profile has)."""
    try:
        return same_gpu(load_profile(str(gpu_type or "")), profile)
    except InputError:
        return False


def calibrate(measurements: list[Measurement], profile: HardwareProfile, *, factors: list[str] | None = None,
              fitted_by: str = "plan calibrate") -> tuple[HardwareProfile, dict]:
    """The profile with fitted factors, and a report: factors, values, MAPE before and after, per run.

    GPU profiles: costmodel.recalibrate (as many factors as the runs determine, the prior on the profile's own
    values). CPU-host profiles: least squares on the host factors from their defaults, as many of them as there
    are runs (GEMM rate first, then the host time per layer and micro-batch: two runs at two micro-batch sizes
    fit both); factors named explicitly need a run each."""
    try:
        if profile.kind == "host":
            cal, report = fit_calibration(measurements, profile, fitted_by=fitted_by,
                                          factors=factors or host_factors(measurements)[:len(measurements)])
        else:
            cal, report = recalibrate(measurements, profile, fitted_by=fitted_by, factors=factors)
    except ValueError as e:
        raise InputError(f"calibrate: {e}") from None
    fitted = profile.model_copy(update={"calibration": cal})
    fitted, report["memory"] = fit_activation_memory(measurements, fitted)
    before, after = predict(measurements, profile), predict(measurements, fitted)
    report["runs"] = [{"model": m.model.name, "plan": plan_label(m.plan), "gpus": m.cluster.num_gpus,
                       "measured_s": m.step_time_s, "before_s": float(b), "after_s": float(a)}
                      for m, b, a in zip(measurements, before, after)]
    return fitted, report


def write_calibrated_profile(source_yaml: Path, calibration: Calibration, out: Path, *, name: str | None = None) -> None:
    """Copy the profile file with its calibration block replaced (atomically: nothing half-written)."""
    data = yaml.safe_load(source_yaml.read_text())
    data["calibration"] = calibration.model_dump()
    if name:
        data["name"] = name
    text = (f"# Calibrated copy of {source_yaml.name}: the calibration block below was fitted by `plan calibrate`\n"
            f"# to measured runs ({calibration.fitted_by}).\n")
    text += yaml.safe_dump(data, sort_keys=False, width=110)
    write_file_atomic(out, text)


def resolve_profile(spec: str) -> tuple[HardwareProfile, Path]:
    """A profile by path or name, and the file it came from."""
    from costmodel.profiles import PROFILE_DIR

    p = Path(spec)
    prof = load_profile(spec)
    if p.exists():
        return prof, p
    path = PROFILE_DIR / "gpus" / f"{prof.name}.yaml"
    return prof, path


def run_calibrate(measurement_paths: list[str], profile_spec: str, out: str, *, cluster_path: str | None = None,
                  factors: list[str] | None = None, gpu: str | None = None, warmup_iterations: int = 3) -> dict:
    """What ``plan calibrate`` does: load, fit, write, report."""
    out_path = Path(out)
    if not out_path.parent.exists():
        raise InputError(f"{out}: directory {out_path.parent} does not exist")
    if gpu is not None:
        load_profile(gpu)   # an unknown --gpu is a one-line error before any file is read
    cluster = load_cluster(cluster_path) if cluster_path else None
    profile, source = resolve_profile(profile_spec)
    measurements, inputs = read_measurements(measurement_paths, profile, cluster=cluster, gpu=gpu,
                                             warmup_iterations=warmup_iterations)
    names = ", ".join(Path(p).name for p in measurement_paths[:3]) + (" ..." if len(measurement_paths) > 3 else "")
    fitted, report = calibrate(measurements, profile, factors=factors,
                               fitted_by=f"plan calibrate on {len(measurements)} measured run(s) ({names}) "
                                         f"from {source.name}")
    write_calibrated_profile(source, fitted.calibration, out_path)
    report["inputs"] = inputs
    report["out"] = str(out_path)
    if report.get("measured_models"):
        from costmodel.trust import CALIBRATED_KEY, intervals_data

        report[CALIBRATED_KEY] = intervals_data().get(CALIBRATED_KEY, 1.0)
    return report
