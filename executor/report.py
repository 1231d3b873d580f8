"""Tables and plots of executor results: calibration before/after, autotune trials, predicted vs measured."""

from __future__ import annotations

import math

from rich.table import Table


def _ms(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.1f}"


def calibration_table(report: dict, console) -> None:
    """What `plan calibrate` prints, through the command's rich ``console``."""
    t = Table(title=f"calibration of {report['profile']} on {report['measurements']} run(s)")
    for col in ("model", "plan", "GPUs", "measured ms", "before ms", "after ms"):
        t.add_column(col, justify="left" if col in ("model", "plan") else "right")
    for r in report["runs"]:
        t.add_row(r.get("model", ""), r["plan"], str(r.get("gpus", "")), _ms(r["measured_s"]), _ms(r["before_s"]),
                  _ms(r["after_s"]))
    console.print(t)
    prev = report.get("previous", {})
    values = ", ".join(f"{k}={prev[k]:g} -> {v:g}" if k in prev else f"{k}={v:g}" for k, v in report["values"].items())
    console.print((f"{report['scheme']}: " if report.get("scheme") else "fitted ") + values)
    sens, support = report.get("sensitivity", {}), report.get("support", {})
    if len(report["values"]) == 1 and report.get("ranked"):
        console.print("chosen by how far a factor moves the run over how many fitted runs pin it down: "
                      + "; ".join(f"{n} {sens[n]:.3f} / {support[n]:g} runs" for n in report["ranked"][:3]))
    console.print(f"step-time MAPE {report['mape_before']:.1f}% -> {report['mape_after']:.1f}%"
                  + (f"; written to {report['out']}" if report.get("out") else ""))
    mem = report.get("memory") or {}
    if mem:
        console.print(f"activation_memory={mem['previous']:g} -> {mem['value']:g} from the peak memory of "
                      f"{mem['runs']} run(s): peak-memory MAPE {mem['mape_before']:.1f}% -> {mem['mape_after']:.1f}%")
    for name, vals in report.get("per_model", {}).items():
        console.print(f"{name}: its own runs give " + ", ".join(f"{k}={v:g}" for k, v in vals.items()))
    if report.get("measured_models") and report.get("other_models_weight", 1.0) < 1.0:
        n = len(report["measured_models"])
        mine = ("each measured architecture gets its own factors (above)" if report.get("per_model") else
                f"the update applies in full to the measured architecture{'s' if n > 1 else ''} ({n})")
        console.print(f"{mine}; other models get {report['other_models_weight']:.0%} of "
                      f"{'the pooled update' if report.get('per_model') else 'it'} (other_models_weight in the YAML; "
                      f"1 carries all of it)")
    if report.get("calibrated_width_factor", 1.0) < 1.0:
        console.print(f"predictions of the measured architecture(s) get P10-P90 intervals "
                      f"{report['calibrated_width_factor']:g}x as wide (calibrated_width_factor: the spread of "
                      f"one-run calibrated predictions on held-out sources)")
    for note in report.get("inputs", []):
        if note.get("other_gpu_rows"):
            console.print(f"{note['path']}: {note['other_gpu_rows']} scored row(s) on other GPU types left out")
        if note.get("rows_without_step_time"):
            console.print(f"{note['path']}: row(s) {', '.join(map(str, note['rows_without_step_time']))} give no "
                          f"step time (a TFLOP/s or MFU figure only) and were left out")
        for bad in note.get("rows_not_read", []):
            console.print(f"left out (cannot be read): {bad['error']}")
        if note.get("kind") == "Megatron log":
            console.print(f"{note['path']}: median of {note['iterations_used']} logged iteration(s), warm-up "
                          f"iteration(s) {note['iterations_skipped'] or 'none'} skipped")


def autotune_table(res, console) -> None:
    """What `plan autotune` prints, through the command's rich ``console``."""
    from costmodel.plan import plan_label

    t = Table(title="autotune: predicted, measured, re-predicted after calibration")
    for col in ("#", "plan", "predicted ms", "measured ms", "calibrated ms", "note"):
        t.add_column(col, justify="left" if col in ("plan", "note") else "right")
    for i, tr in enumerate(res.trials, 1):
        note = "winner" if tr is res.winner else (tr.error[:60] if tr.error else "")
        t.add_row(str(i), plan_label(tr.plan), _ms(tr.predicted_s), _ms(tr.measured_s if not tr.error else None),
                  _ms(tr.calibrated_s), note)
    console.print(t)
    console.print(f"winner: {plan_label(res.winner.plan)}: {res.reason}")
    if res.final:
        f = res.final
        console.print(f"full run: {f['steps']} steps, {_ms(f['step_time_s'])} ms/step, loss {f['first_loss']:.4f} -> "
                      f"{f['final_loss']:.4f}")


def scatter_png(path: str, measured_s, predicted_s, labels, *, fitted_mask=None, title: str = "") -> None:
    """Predicted against measured step time (log-log), runs used for the fit drawn apart from held-out ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m, p = np.asarray(measured_s) * 1e3, np.asarray(predicted_s) * 1e3
    fit = np.zeros(len(m), bool) if fitted_mask is None else np.asarray(fitted_mask, bool)
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    lo, hi = min(m.min(), p.min()) * 0.8, max(m.max(), p.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey", alpha=0.12, label="±20%")
    ax.scatter(m[fit], p[fit], marker="o", facecolors="none", edgecolors="C0", label="calibration runs")
    ax.scatter(m[~fit], p[~fit], marker="o", color="C1", label="held-out runs")
    if len(m) <= 8:   # more labels than that only overlap; the benchmark's table names every point
        for x, y, lab in zip(m, p, labels):
            ax.annotate(lab, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
