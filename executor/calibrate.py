"""Fit a hardware profile's efficiency factors to the executor's measured steps.

    plan calibrate --measurements runs/*/metrics.jsonl --profile P.yaml --out P_calibrated.yaml

A measurement is one run: the plan it ran (from the run's summary.json), the cluster it ran on (the
plan.json's cluster, or ``--cluster``) and its median step time without the first (warm-up) step. The fit is
costmodel.fit's least squares; it refuses when there are fewer runs than factors to fit. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from costmodel.fit import Measurement, fit_calibration, host_factors, predict, relevant_factors
from costmodel.profiles import Calibration, HardwareProfile, InputError, load_cluster, load_profile
from costmodel.specs import ClusterSpec, ModelSpec, ParallelPlan

def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def load_measurement(path: str | Path, cluster: ClusterSpec | None = None) -> Measurement:
    """One run (its directory, metrics.jsonl or summary.json) as a Measurement."""
    run = _run_dir(Path(path))
    summary_path = run / "summary.json"
    if not summary_path.exists():
        raise InputError(f"{path}: no summary.json beside it (give an executor run directory or its metrics.jsonl)")
    try:
        summary = json.loads(summary_path.read_text())
        model = ModelSpec.model_validate(summary["model"])
        plan = ParallelPlan.model_validate(summary["plan"])
    except (json.JSONDecodeError, KeyError) as e:
        raise InputError(f"{summary_path}: not an executor summary ({e})") from None
    if cluster is None:
        if "cluster" not in summary:
            raise InputError(f"{summary_path}: the run's plan has no cluster; pass --cluster C.yaml")
        cluster = ClusterSpec.model_validate(summary["cluster"])
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    times = [r["step_time_s"] for r in rows[1:]] or [r["step_time_s"] for r in rows]
    if not times:
        raise InputError(f"{run}/metrics.jsonl: no steps recorded")
    return Measurement(model=model, cluster=cluster, plan=plan, step_time_s=float(np.median(times)))


def load_measurements(paths: list[str], cluster: ClusterSpec | None = None) -> list[Measurement]:
    return [load_measurement(p, cluster) for p in paths]


def calibrate(measurements: list[Measurement], profile: HardwareProfile, *, factors: list[str] | None = None,
              fitted_by: str = "plan calibrate") -> tuple[HardwareProfile, dict]:
    """The profile with fitted factors, and a report: factors, values, MAPE before and after, per run."""
    if factors is None:
        factors = host_factors(measurements) if profile.kind == "host" else relevant_factors(measurements)[:3]
    try:
        cal, report = fit_calibration(measurements, profile, fitted_by=fitted_by, factors=factors)
    except ValueError as e:
        raise InputError(f"calibrate: {e}") from None
    fitted = profile.model_copy(update={"calibration": cal})
    before, after = predict(measurements, profile), predict(measurements, fitted)
    report["runs"] = [{"plan": plan_label(m.plan), "measured_s": m.step_time_s, "before_s": float(b),
                       "after_s": float(a)} for m, b, a in zip(measurements, before, after)]
    return fitted, report


def plan_label(plan: ParallelPlan) -> str:
    """A plan in one short line: degrees, micro-batch, recompute."""
    s = f"tp{plan.tp} pp{plan.pp}"
    s += f" vpp{plan.vpp}" if plan.vpp > 1 else ""
    s += f" dp{plan.dp}" + (f" ep{plan.ep}" if plan.ep > 1 else "")
    return s + f" mb{plan.micro_batch} {plan.recompute}"


def write_calibrated_profile(source_yaml: Path, calibration: Calibration, out: Path, *, name: str | None = None) -> None:
    """Copy the profile file with its calibration block replaced (atomically: nothing half-written)."""
    data = yaml.safe_load(source_yaml.read_text())
    data["calibration"] = calibration.model_dump()
    if name:
        data["name"] = name
    text = (f"# Calibrated copy of {source_yaml.name}: the calibration block below was fitted by `plan calibrate`\n"
            f"# to executor measurements ({calibration.fitted_by}).\n")
    text += yaml.safe_dump(data, sort_keys=False, width=110)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out)


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
                  factors: list[str] | None = None) -> dict:
    """What ``plan calibrate`` does: load, fit, write, report."""
    cluster = load_cluster(cluster_path) if cluster_path else None
    measurements = load_measurements(measurement_paths, cluster)
    profile, source = resolve_profile(profile_spec)
    fitted, report = calibrate(measurements, profile, factors=factors,
                               fitted_by=f"plan calibrate on {len(measurements)} executor runs")
    out_path = Path(out)
    if not out_path.parent.exists():
        raise InputError(f"{out}: directory {out_path.parent} does not exist")
    write_calibrated_profile(source, fitted.calibration, out_path)
    report["out"] = str(out_path)
    return report
