"""The parity figure of ``plan validate --plot``: each published run's predicted step time against its
published one, on log axes, with its P10-P90 as a bar, coloured by GPU generation, dense runs as circles and
MoE runs as triangles; the diagonal and the 10% and 25% bands around it. With ``--cross-validate`` a second
panel shows the leave-one-source-out predictions (each row predicted by profiles fitted without its source),
the figure that says how the model does on runs it has not seen."""

from __future__ import annotations

import numpy as np

from costmodel.validate import abs_percent_error, interval_coverage
from planner.report import scored_rows

BANDS = (0.10, 0.25)
"""Relative errors the figure draws bands for, and parity_stats counts rows within."""
GENERATION_COLOURS = {"volta": "tab:gray", "ampere": "tab:green", "hopper": "tab:blue", "blackwell": "tab:purple"}


def parity_stats(rows: list[dict]) -> dict:
    """What a panel says of its rows: how many are scored, their MAPE and median absolute error (%), how many
    lie within each of BANDS of their published time, and how many published times fall inside their
    P10-P90 (of the rows that have one)."""
    sel = scored_rows(rows)
    ape = np.array([abs_percent_error(r["predicted_step_time_s"], r["published_step_time_s"]) for r in sel])
    cov = interval_coverage(sel)
    return {"rows": len(sel),
            "mape": round(float(ape.mean()), 2) if len(sel) else None,
            "median_ape": round(float(np.median(ape)), 2) if len(sel) else None,
            "within": {f"{b:.0%}": int((ape <= 100 * b + 1e-9).sum()) for b in BANDS},
            "interval_rows": cov["rows"], "inside": cov["inside"]}


def _generation(gpu_type: str, cache: dict) -> str | None:
    if gpu_type not in cache:
        from costmodel.profiles import InputError, load_profile

        try:
            cache[gpu_type] = load_profile(gpu_type).generation
        except InputError:
            cache[gpu_type] = None
    return cache[gpu_type]


def _panel(ax, label: str, rows: list[dict], generations: dict) -> None:
    sel = scored_rows(rows)
    st = parity_stats(sel)
    if not sel:
        ax.text(0.5, 0.5, "no row has both a predicted and a published step time", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_title(label)
        return
    pub = np.array([r["published_step_time_s"] for r in sel])
    pred = np.array([r["predicted_step_time_s"] for r in sel])
    lo_all, hi_all = min(pub.min(), pred.min()) / 1.5, max(pub.max(), pred.max()) * 1.5
    line = np.geomspace(lo_all, hi_all, 50)
    ax.plot(line, line, color="black", lw=1)
    for b, ls in zip(BANDS, ("--", ":")):
        ax.plot(line, line * (1 + b), color="black", lw=0.7, ls=ls, label=f"±{b:.0%}")
        ax.plot(line, line * (1 - b), color="black", lw=0.7, ls=ls)
    bars = [(r["published_step_time_s"], r["predicted_step_time_s"], r["predicted_p10_step_time_s"],
             r["predicted_p90_step_time_s"]) for r in sel if r.get("predicted_p10_step_time_s") is not None]
    if bars:
        x, y, p10, p90 = (np.array(v) for v in zip(*bars))
        ax.errorbar(x, y, yerr=[y - p10, p90 - y], fmt="none", ecolor="0.75", elinewidth=0.8, zorder=1)
    for gen, colour in [*GENERATION_COLOURS.items(), (None, "tab:orange")]:
        for moe, marker in ((False, "o"), (True, "^")):
            pts = [(r["published_step_time_s"], r["predicted_step_time_s"]) for r in sel
                   if _generation(str(r.get("gpu_type")), generations) == gen and bool(r.get("moe")) == moe]
            if pts:
                x, y = zip(*pts)
                name = (gen or "other GPU") + (" MoE" if moe else " dense")
                ax.scatter(x, y, s=16, c=colour, marker=marker, label=f"{name} ({len(pts)})", zorder=2,
                           edgecolors="white", linewidths=0.3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo_all, hi_all)
    ax.set_ylim(lo_all, hi_all)
    ax.set_xlabel("published step time (s)")
    ax.set_ylabel("predicted step time (s)")
    inside = (f", P10-P90 holds {st['inside']} of {st['interval_rows']}" if st["interval_rows"] else "")
    ax.set_title(f"{label}\n{st['rows']} runs: MAPE {st['mape']:.1f}%, median {st['median_ape']:.1f}%"
                 f", within 10% {st['within']['10%']}{inside}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)


def save_parity_png(path, panels: list[tuple[str, list[dict]]], title: str) -> None:
    """The figure at ``path``: one panel per (label, rows), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 6.5), constrained_layout=True,
                             squeeze=False)
    generations: dict = {}
    for ax, (label, rows) in zip(axes[0], panels):
        _panel(ax, label, rows, generations)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
