"""Auto-tuned launch: plan, run the top plans for a few steps, calibrate on what was measured, re-plan,
and launch the best measured plan for the full run.

    plan autotune --model tiny-gpt --cluster cpu.yaml --trial-steps 4 --top-k 4 --steps 50

The executor never imports the planner: the command that wires this up passes in the planner's ranking as
``rank_plans`` (as the cost function is passed into the search), and this module runs, measures and
calibrates the plans it yields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from costmodel.estimate import estimate
from costmodel.fit import Measurement, host_factors, relevant_factors
from costmodel.plan import ParallelPlan, plan_label
from costmodel.profiles import HardwareProfile, InputError, load_profile
from costmodel.specs import ClusterSpec, ModelSpec
from executor.calibrate import calibrate
from executor.launch import launch, preflight

# The planner's ranking under a hardware profile: the plans that fit, fastest predicted first, each with its
# predicted step time in seconds. Called once for the candidates and once to re-plan after calibration.
RankPlans = Callable[[HardwareProfile], Iterable[tuple[ParallelPlan, float]]]

# A re-planned plan that was not tried is run as an extra trial when the calibrated model predicts it at
# least this much faster than the best measured trial.
RETRY_GAIN = 0.03


@dataclass
class Trial:
    plan: ParallelPlan
    predicted_s: float                 # before calibration
    measured_s: float = float("nan")
    calibrated_s: float = float("nan")  # after calibration
    run_dir: str = ""
    error: str = ""


@dataclass
class AutotuneResult:
    trials: list[Trial]
    calibration: dict | None
    winner: Trial
    reason: str
    final: dict = field(default_factory=dict)


def ranked_runnable(rank_plans: RankPlans, model: ModelSpec, profile: HardwareProfile,
                    limit: int) -> list[tuple[ParallelPlan, float]]:
    """The best plans that fit and that the executor can run here, with their predicted step times."""
    out = []
    for plan, predicted_s in rank_plans(profile):
        try:
            preflight(model, plan)
        except InputError:
            continue
        out.append((plan, float(predicted_s)))
        if len(out) >= limit:
            break
    return out


def write_plan_json(path: Path, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                    profile: HardwareProfile) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    est = estimate(model, cluster, plan, profile=profile)
    data = {"model": model.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"), "estimate": est.model_dump(mode="json")}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return str(path)


def _measured(summary: dict) -> float:
    return float(summary["step_time_s"])


def autotune(model: ModelSpec, cluster: ClusterSpec, *, global_batch: int, rank_plans: RankPlans,
             run_dir: str | Path, trial_steps: int = 4, top_k: int = 4, steps: int = 20, dtype: str | None = None,
             profile: HardwareProfile | None = None, data: str | None = None,
             say: Callable[[str], None] = print, trial_timeout_s: float | None = 900.0) -> AutotuneResult:
    """Plan -> trial runs -> calibrate -> re-plan -> full launch of the best measured plan.

    ``rank_plans(profile)`` is the planner's ranking of the plans of ``model`` on ``cluster`` at ``global_batch``
    (see RankPlans); the global batch is only quoted in errors here."""
    if trial_steps < 2:
        raise InputError(f"--trial-steps {trial_steps}: need at least 2 (the first step is warm-up)")
    prof = profile or load_profile(cluster.gpu)
    root = Path(run_dir)
    candidates = ranked_runnable(rank_plans, model, prof, top_k)
    if not candidates:
        raise InputError(f"{cluster.name}: no plan of {model.name} fits and runs here (global batch {global_batch})")
    trials: list[Trial] = []

    def run_trial(plan: ParallelPlan, predicted: float) -> Trial:
        t = Trial(plan=plan, predicted_s=predicted, run_dir=str(root / f"trial_{len(trials) + 1}"))
        say(f"trial {len(trials) + 1}: {plan_label(plan)} (predicted {predicted * 1e3:.1f} ms/step)")
        plan_path = write_plan_json(Path(t.run_dir) / "plan.json", model, cluster, plan, prof)
        try:
            res = launch(plan_path, t.run_dir, steps=trial_steps, dtype=dtype, data=data, timeout_s=trial_timeout_s)
            t.measured_s = _measured(res.summary)
            say(f"  measured {t.measured_s * 1e3:.1f} ms/step")
        except Exception as e:   # a failed trial is reported and ranked last, not fatal
            t.error = str(e)
            say(f"  failed: {e}")
        trials.append(t)
        return t

    for plan, predicted in candidates:
        run_trial(plan, predicted)
    ok = [t for t in trials if t.error == ""]
    if not ok:
        raise InputError(f"every trial failed; first error: {trials[0].error}")

    measurements = [Measurement(model=model, cluster=cluster, plan=t.plan, step_time_s=t.measured_s) for t in ok]
    names = host_factors(measurements) if prof.kind == "host" else relevant_factors(measurements)
    names = names[:len(measurements)]
    fitted, report = calibrate(measurements, prof, factors=names, fitted_by=f"plan autotune, {len(ok)} trials")
    say(f"calibrated {', '.join(names)}: trial MAPE {report['mape_before']:.1f}% -> {report['mape_after']:.1f}%")

    # Re-plan with the calibrated profile; try its best plan if it is new and promising.
    best_measured = min(ok, key=lambda t: t.measured_s)
    replanned = ranked_runnable(rank_plans, model, fitted, 1)
    tried = {t.plan for t in trials}
    if replanned and replanned[0][0] not in tried and replanned[0][1] < best_measured.measured_s * (1 - RETRY_GAIN):
        say("re-planned best is new:")
        run_trial(*replanned[0])
    for t in trials:
        t.calibrated_s = float(estimate(model, cluster, t.plan, profile=fitted).step_time_s)
    ok = [t for t in trials if t.error == ""]
    winner = min(ok, key=lambda t: t.measured_s)
    predicted_first = trials[0]
    if winner is predicted_first:
        reason = "the planner's first choice was also the fastest measured"
    else:
        gain = predicted_first.measured_s / winner.measured_s - 1 if predicted_first.error == "" else float("nan")
        reason = (f"fastest measured: {gain * 100:.0f}% faster than the planner's first choice"
                  if np.isfinite(gain) else "the planner's first choice failed; fastest measured of the rest")
    say(f"winner: {plan_label(winner.plan)} ({reason})")
    result = AutotuneResult(trials=trials, calibration=report, winner=winner, reason=reason)
    if steps > 0:
        final_dir = root / "final"
        plan_path = write_plan_json(final_dir / "plan.json", model, cluster, winner.plan, fitted)
        say(f"full run: {steps} steps in {final_dir}")
        result.final = launch(plan_path, final_dir, steps=steps, dtype=dtype, data=data).summary
    return result


def result_json(r: AutotuneResult) -> dict:
    def trial(t: Trial) -> dict:
        return {"plan": t.plan.model_dump(mode="json"), "label": plan_label(t.plan), "predicted_s": t.predicted_s,
                "measured_s": t.measured_s if t.error == "" else None, "calibrated_s": t.calibrated_s,
                "run_dir": t.run_dir, "error": t.error or None}

    final = {k: v for k, v in r.final.items() if k not in ("model", "plan", "cluster")}
    return {"trials": [trial(t) for t in r.trials], "calibration": r.calibration, "winner": trial(r.winner),
            "reason": r.reason, "final": final}
