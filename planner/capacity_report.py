"""Tables (rich) and the figure (matplotlib) of ``plan capacity`` and ``plan whatif``."""

from __future__ import annotations

import math

from rich.table import Table

from planner.capacity import DAY_S, HOUR_S, NUMERIC, CapacityPoint, fmt_usd, pareto
from planner.report import layout, sig

GB = 1e9


def fmt_value(dim: str, v) -> str:
    if dim == "bandwidth":
        return f"{v * 8 / 1e9:.0f} Gb/s"
    if dim == "optimizer_offload":
        return "none" if not v else ("all" if v >= 1 else f"{v:.0%}")
    if dim == "oversubscription":
        return f"{v:g}:1"
    return str(v)


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    if s >= DAY_S:
        return f"{s / DAY_S:.1f} d"
    if s >= HOUR_S:
        return f"{s / HOUR_S:.1f} h"
    return f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def _ranged(p: CapacityPoint, value: float, fmt, unit_of) -> str:
    """'48.3 d (45-53)': the P50 value and its P10-P90 (scaled with the step time) in the P50's unit."""
    lo, hi = p.at("p10"), p.at("p90")
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(value)):
        return fmt(value)
    div = unit_of(value)
    return f"{fmt(value)} ({sig(value * lo / div, 2)}-{sig(value * hi / div, 2)})"


def _dur_unit(s: float) -> float:
    return DAY_S if s >= DAY_S else HOUR_S if s >= HOUR_S else 60.0 if s >= 60 else 1.0


def _usd_unit(x: float) -> float:
    return next((d for d in (1e9, 1e6, 1e3) if abs(x) >= d), 1.0)


def capacity_table(points: list[CapacityPoint], title: str, dims: list[str], best: CapacityPoint | None = None) -> Table:
    t = Table(title=title, header_style="bold")
    # gpus and gpu are always shown (as GPUs and GPU); other varied quantities get a column first.
    dims = [d for d in dims if d not in ("gpus", "gpu")]
    cols = [(d, "left") for d in dims] + [("GPUs", "right"), ("GPU", "left"), ("layout", "left"),
            ("tok/s/GPU", "right"), ("MFU", "right"), ("no-failure", "right"), ("MTBF", "right"),
            ("ckpt every", "right"), ("goodput", "right"), ("wall time (P10-P90)", "right"),
            ("GPU-hours (P10-P90)", "right"), ("cost (P10-P90)", "right")]
    show_meets = any(p.meets for p in points)
    if show_meets:
        cols.append(("meets", "left"))
    for name, just in cols:
        t.add_column(name, justify=just)
    for p in points:
        head = [fmt_value(d, p.scenario.label(d)) for d in dims] + [str(p.gpus), p.gpu_type]
        if not p.fits:
            t.add_row(*head, f"[red]{p.reason}[/red]", *[""] * (len(cols) - len(head) - 1))
            continue
        pl = p.plan.model_dump()
        lay = layout(pl) + f" mbs{pl['micro_batch']}" + ("" if pl["recompute"] == "none" else f" {pl['recompute']}")
        g = p.goodput
        row = head + [lay, f"{p.tokens_per_s_per_gpu:.0f}", f"{p.mfu * 100:.1f}%", _dur(p.train_time_s), _dur(g.mtbf_s),
                      _dur(g.interval_s), f"{g.goodput * 100:.1f}%", _ranged(p, p.wall_time_s, _dur, _dur_unit),
                      _ranged(p, p.gpu_hours, lambda x: f"{x / 1e6:.2f}M", lambda x: 1e6),
                      "-" if p.cost_usd is None else _ranged(p, p.cost_usd, fmt_usd, _usd_unit)]
        if show_meets:
            row.append("yes" if p.meets and all(p.meets.values()) else
                       "[red]no[/red] (" + ", ".join(k for k, v in p.meets.items() if not v) + ")")
        t.add_row(*row, style="bold green" if p is best else None)
    return t


def _x_positions(points: list[CapacityPoint], x_dim: str):
    """x value of each point and the axis setup: log2 for numeric dimensions, categories otherwise."""
    values = [p.scenario.label(x_dim) for p in points]
    if x_dim in NUMERIC:
        scale = (8 / 1e9) if x_dim == "bandwidth" else 1.0
        return [v * scale for v in values], None
    cats = list(dict.fromkeys(values))
    return [cats.index(v) for v in values], cats


def _xlabel(x_dim: str) -> str:
    return {"gpus": "GPUs", "gpu": "GPU type", "bandwidth": "inter-node bandwidth per GPU (Gb/s)",
            "oversubscription": "core oversubscription of the fat tree (x:1)",
            "seq_len": "sequence length", "global_batch": "global batch (sequences)", "precision": "precision",
            "compression": "DP gradient compression", "finetune": "what trains (full or LoRA)", "optimizer": "optimizer (Adam or Muon)",
            "optimizer_offload": "share of the optimizer state in host memory"}.get(x_dim, x_dim)


def save_capacity_png(path, points: list[CapacityPoint], x_dim: str, series_dim: str | None, title: str,
                      deadline_s: float | None = None, budget_usd: float | None = None,
                      best: CapacityPoint | None = None) -> None:
    """Six panels against the varied quantity: expected wall time (failure-free dashed), cost, goodput,
    tokens/s/GPU, MFU, and the Pareto front of cost against time; one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ok = [p for p in points if p.fits]
    use_cost = bool(ok) and all(p.cost_usd is not None for p in ok)
    series = list(dict.fromkeys(p.scenario.label(series_dim) for p in ok)) if series_dim else [None]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), constrained_layout=True)
    (a_time, a_cost, a_good), (a_tps, a_mfu, a_par) = axes
    xs_all, cats = _x_positions(ok, x_dim) if ok else ([], None)
    xmap = {id(p): x for p, x in zip(ok, xs_all)}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def cost_of(p):
        return p.cost_usd / 1e6 if use_cost else p.gpu_hours / 1e6

    for k, s in enumerate(series):
        pts = [p for p in ok if series_dim is None or p.scenario.label(series_dim) == s]
        pts.sort(key=lambda p: xmap[id(p)])
        xs = [xmap[id(p)] for p in pts]
        c = colours[k % len(colours)]
        lab = fmt_value(series_dim, s) if series_dim else None
        a_time.plot(xs, [p.wall_time_s / DAY_S for p in pts], "o-", color=c, label=lab)
        a_time.fill_between(xs, [p.wall_time_s * p.at("p10") / DAY_S for p in pts],
                            [p.wall_time_s * p.at("p90") / DAY_S for p in pts], color=c, alpha=0.15, lw=0)
        a_time.plot(xs, [p.train_time_s / DAY_S for p in pts], ":", color=c, alpha=0.7)
        a_cost.plot(xs, [cost_of(p) for p in pts], "o-", color=c, label=lab)
        a_cost.fill_between(xs, [cost_of(p) * p.at("p10") for p in pts], [cost_of(p) * p.at("p90") for p in pts],
                            color=c, alpha=0.15, lw=0)
        a_good.plot(xs, [p.goodput.goodput * 100 for p in pts], "o-", color=c, label=lab)
        a_tps.plot(xs, [p.tokens_per_s_per_gpu for p in pts], "o-", color=c, label=lab)
        a_mfu.plot(xs, [p.mfu * 100 for p in pts], "o-", color=c, label=lab)
        a_par.scatter([p.wall_time_s / DAY_S for p in pts], [cost_of(p) for p in pts], color=c, label=lab, s=25)
    front = pareto(ok)
    if front:
        a_par.plot([p.wall_time_s / DAY_S for p in front], [cost_of(p) for p in front], "k--", lw=1,
                   label="Pareto front")
        for p in front:
            a_par.annotate(f"{p.gpus}", (p.wall_time_s / DAY_S, cost_of(p)), textcoords="offset points",
                           xytext=(4, 4), fontsize=7)
    if deadline_s:
        a_time.axhline(deadline_s / DAY_S, color="tab:red", ls="--", lw=1, label="deadline")
        a_par.axvline(deadline_s / DAY_S, color="tab:red", ls="--", lw=1)
    if budget_usd and use_cost:
        a_cost.axhline(budget_usd / 1e6, color="tab:red", ls="--", lw=1, label="budget")
        a_par.axhline(budget_usd / 1e6, color="tab:red", ls="--", lw=1)
    if best is not None and best.fits and id(best) in xmap:
        a_time.plot([xmap[id(best)]], [best.wall_time_s / DAY_S], "*", ms=16, color="gold", mec="k", label="chosen")
        a_cost.plot([xmap[id(best)]], [cost_of(best)], "*", ms=16, color="gold", mec="k")
        a_par.plot([best.wall_time_s / DAY_S], [cost_of(best)], "*", ms=16, color="gold", mec="k")
    cost_label = "cost (M$)" if use_cost else "GPU-hours (M)"
    for ax, ylab, ttl in ((a_time, "days", "time to train (band: P10-P90; dotted: without failures)"),
                          (a_cost, cost_label, cost_label.split(" ")[0]),
                          (a_good, "goodput (%)", "goodput (useful share of wall time)"),
                          (a_tps, "tokens/s/GPU", "throughput per GPU"), (a_mfu, "MFU (%)", "MFU")):
        ax.set_ylabel(ylab)
        ax.set_title(ttl)
        ax.set_xlabel(_xlabel(x_dim))
        ax.grid(alpha=0.3)
        if cats is not None:
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels([fmt_value(x_dim, c) for c in cats])
        elif x_dim in ("gpus", "seq_len", "global_batch", "bandwidth"):
            ax.set_xscale("log", base=2)
            ticks = sorted(set(xs_all))
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks], rotation=45 if len(ticks) > 6 else 0)
            ax.minorticks_off()
    for axis in (a_time.yaxis, a_par.xaxis):
        (a_time.set_yscale if axis is a_time.yaxis else a_par.set_xscale)("log")
        axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a_par.set_xlabel("time to train (days)")
    a_par.set_ylabel(cost_label)
    a_par.set_title(f"{cost_label.split(' ')[0]} against time")
    a_par.grid(alpha=0.3)
    for ax in (a_time, a_par):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
