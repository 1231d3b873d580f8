"""Tables for people (rich) and dictionaries for scripts (--json); they print through planner.terminal.console."""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

from costmodel.estimate import BREAKDOWN_KEYS
from costmodel.specs import StepEstimate
from planner.search import SearchResult, rank_time, to_plan
from planner.space import layout

GB = 1e9


def plan_row(result: SearchResult, rank: int) -> dict:
    i = int(result.order[rank])
    s = result.scores
    plan = to_plan(result.plans, i)
    peak = float(np.nanmax(s["peak_memory_bytes"][i]))
    return {
        "rank": rank + 1,
        "plan": plan.model_dump(exclude={"rank_order", "framework", "layers_per_stage"}),
        "step_time_s": float(s["step_time_s"][i]),
        **trust_fields(s, i),
        "tokens_per_s_per_gpu": float(s["tokens_per_s_per_gpu"][i]),
        "mfu": float(s["mfu"][i]),
        "peak_memory_bytes": peak,
        "memory_capacity_bytes": float(s["memory_capacity_bytes"][i]),
        "fits": bool(s["fits"][i]),
        "breakdown_s": {k.removesuffix("_s"): float(s[k][i]) for k in BREAKDOWN_KEYS},
    }


def trust_fields(scores: dict, i: int) -> dict:
    """P10 / P90 step time and support of row i of scores that have them (costmodel.trust.with_intervals)."""
    if "step_time_p10_s" not in scores:
        return {}
    from costmodel.trust import THIN_SUPPORT

    n = int(scores["support_runs"][i])
    return {"predicted_p10_step_time_s": float(scores["step_time_p10_s"][i]),
            "predicted_p90_step_time_s": float(scores["step_time_p90_s"][i]),
            "support_runs": n, "thin_support": n < THIN_SUPPORT}


def sig(x: float, digits: int) -> str:
    """x to ``digits`` significant digits, never in exponent form (6.37, 12.4, 1234)."""
    import math

    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def fmt_interval(mid: float, lo: float | None, hi: float | None, unit: str = "") -> str:
    """'6.37 s (5.9-7.1)': the P50 to 3 significant digits and its P10-P90 to 2."""
    text = f"{sig(mid, 3)}{unit}"
    if lo is None or hi is None:
        return text
    return f"{text} ({sig(lo, 2)}-{sig(hi, 2)})"


def support_cell(r: dict) -> str:
    """Validated runs near the plan; '!' marks thin support (THIN_LEGEND)."""
    if "support_runs" not in r:
        return "-"
    return f"[yellow]{r['support_runs']} ![/yellow]" if r["thin_support"] else str(r["support_runs"])


THIN_LEGEND = ("support: validated runs near the plan (same GPU generation, sharding, pp/cp/ep/offload regime, dense/MoE, "
               "within 4x in GPUs); ! = fewer than 3, the interval is widened")


def best_supported(result: SearchResult) -> dict | None:
    """When the best plan has thin support: the best plan that has not, and how much slower it is predicted
    (by the ranking's time, P50 or P90); None when the best plan is supported or there are no intervals."""
    s = result.scores
    if "support_runs" not in s or not len(result.order):
        return None
    from costmodel.trust import THIN_SUPPORT

    order = result.order
    fits = np.asarray(s["fits"])[order]
    ok = fits & (np.asarray(s["support_runs"])[order] >= THIN_SUPPORT)
    if not fits[0] or ok[0]:
        return None
    best = plan_row(result, 0)
    if not ok.any():
        return {"rank": None, "message": f"[yellow]no plan that fits has {THIN_SUPPORT} or more validated runs near "
                                         f"it: #1 ({layout(best['plan'])}) rests on untested ground[/yellow]"}
    r = int(np.argmax(ok))
    row = plan_row(result, r)
    t = rank_time(s, result.rank_by)
    diff = float(t[order[r]] / t[order[0]] - 1.0)
    what = "P90" if result.rank_by == "p90" else "predicted"
    msg = (f"#1 has {best['support_runs']} validated runs near it; best supported: #{r + 1} {layout(row['plan'])} "
           f"mbs{row['plan']['micro_batch']} {row['plan']['recompute']}, "
           f"{fmt_interval(row['step_time_s'], row['predicted_p10_step_time_s'], row['predicted_p90_step_time_s'], ' s')}"
           f" ({diff * 100:+.0f}% {what}), {row['support_runs']} validated runs near it")
    return {"rank": r + 1, "plan": row["plan"], "step_time_s": row["step_time_s"],
            "predicted_p10_step_time_s": row["predicted_p10_step_time_s"],
            "predicted_p90_step_time_s": row["predicted_p90_step_time_s"], "support_runs": row["support_runs"],
            "difference": diff, "message": msg}


ZERO_LABELS = {0: "no ZeRO", 1: "distributed optimizer (ZeRO-1)", 2: "Megatron-FSDP optim_grads (ZeRO-2)",
               3: "Megatron-FSDP (ZeRO-3)"}


def zero_label(stage: int) -> str:
    return ZERO_LABELS[int(stage)]


PLAN_LEGEND = ("compute / bubble / exposed comm: seconds per step (exposed = not hidden behind compute); headroom: "
               "usable memory (HBM x usable fraction) left at the peak stage; fsdp: Megatron-FSDP (ZeRO-3), else the "
               "distributed optimizer (ZeRO-1)")


def ranked_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title, header_style="bold", caption=f"{PLAN_LEGEND}\n{THIN_LEGEND}", caption_justify="left")
    for col, just in (("#", "right"), ("layout", "left"), ("mbs", "right"), ("recompute", "left"),
                      ("step s (P10-P90)", "right"), ("support", "right"), ("tok/s/GPU", "right"), ("MFU", "right"),
                      ("peak GB", "right"), ("headroom", "right"), ("compute s", "right"), ("bubble s", "right"),
                      ("exposed comm s", "right")):
        t.add_column(col, justify=just, no_wrap=col in ("layout", "recompute"))
    for r in rows:
        p, b = r["plan"], r["breakdown_s"]
        comm = sum(v for k, v in b.items() if k.endswith("comm_exposed"))
        head = 1 - r["peak_memory_bytes"] / r["memory_capacity_bytes"]
        t.add_row(str(r["rank"]), layout(p), str(p["micro_batch"]), p["recompute"],
                  fmt_interval(r["step_time_s"], r.get("predicted_p10_step_time_s"), r.get("predicted_p90_step_time_s")),
                  support_cell(r),
                  f"{r['tokens_per_s_per_gpu']:.0f}", f"{r['mfu'] * 100:.1f}%", f"{r['peak_memory_bytes'] / GB:.1f}",
                  f"{head * 100:.0f}%" if r["fits"] else "[red]no fit[/red]", f"{b['compute']:.2f}",
                  f"{b['bubble']:.2f}", f"{comm:.2f}")
    return t


def estimate_table(e: StepEstimate, title: str, trust: dict | None = None) -> Table:
    """One plan's estimate; ``trust`` (costmodel.trust.plan_trust) adds its P10-P90 and support."""
    t = Table(title=title, header_style="bold")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    if trust:
        t.add_row("step time (P10-P90)", fmt_interval(e.step_time_s, trust["predicted_p10_step_time_s"],
                                                      trust["predicted_p90_step_time_s"], " s"))
        t.add_row("  interval class", trust["interval_class"])
        t.add_row("  support", f"{trust['support_runs']} validated runs near it"
                  + (" [yellow](thin: interval widened)[/yellow]" if trust["thin_support"] else ""))
        t.add_row("  overlap bounds", f"{e.step_time_lower_s:.3f} - {e.step_time_upper_s:.3f} s")
    else:
        t.add_row("step time", f"{e.step_time_s:.3f} s  (bounds {e.step_time_lower_s:.3f} - {e.step_time_upper_s:.3f})")
    t.add_row("tokens/s/GPU", f"{e.tokens_per_s_per_gpu:.0f}")
    t.add_row("MFU", f"{e.mfu * 100:.1f}%")
    for k, v in e.breakdown_s.items():
        t.add_row(f"  {k}", f"{v:.3f} s")
    t.add_row("stage times (1 micro-batch)", ", ".join(f"{x * 1e3:.1f}" for x in e.stage_time_s) + " ms")
    t.add_row("peak memory per stage", ", ".join(f"{x / GB:.1f}" for x in e.peak_memory_bytes) + " GB")
    t.add_row("capacity", f"{e.memory_capacity_bytes / GB:.1f} GB ({'fits' if e.fits else '[red]does not fit[/red]'})")
    for k, v in e.memory_breakdown_bytes.items():
        t.add_row(f"  {k} (stage 1)", f"{v / GB:.2f} GB")
    return t


def validation_tables(summary: dict) -> list[Table]:
    out = []
    for key, title in (("by_source", "by source"), ("by_gpu", "by GPU type")):
        t = Table(title=f"Step-time error {title}", header_style="bold")
        # Rows predicted without a published step time (a TFLOP/s or MFU figure only) get a column of their own.
        unscored = bool(summary["overall"].get("unscored"))
        for col in ("group", "rows", "predicted", *(("predicted, not scored",) if unscored else ()), "MAPE %",
                    "median %", "p90 %"):
            t.add_column(col, justify="left" if col == "group" else "right")
        groups = dict(summary[key])
        groups["all"] = summary["overall"]
        for name, st in groups.items():
            t.add_row(name, str(st["count"]), str(st["predicted"]),
                      *((str(st.get("unscored", 0)),) if unscored else ()), _pct(st["mape"]), _pct(st["median_ape"]),
                      _pct(st["p90_ape"]), style="bold" if name == "all" else None)
        out.append(t)
    return out


WORST_ROWS = 8
"""How many rows the largest-errors table of plan validate lists."""


def scored_rows(rows: list[dict]) -> list[dict]:
    """The plan validate rows with both a predicted and a published step time (finite, positive)."""
    return [r for r in rows if (r.get("predicted_step_time_s") or 0) > 0 and (r.get("published_step_time_s") or 0) > 0
            and np.isfinite(r["predicted_step_time_s"])]


def worst_rows_table(rows: list[dict], n: int = WORST_ROWS) -> Table | None:
    """The ``n`` scored rows the model misses most (|predicted / published - 1|), with their ratio and whether the
    published time lies inside the P10-P90; None where fewer than two rows are scored."""
    sel = scored_rows(rows)
    if len(sel) < 2:
        return None
    sel.sort(key=lambda r: -abs(r["predicted_step_time_s"] / r["published_step_time_s"] - 1.0))
    t = Table(title=f"Largest errors ({min(n, len(sel))} of {len(sel)} scored rows; ratio = predicted / published)",
              header_style="bold", caption="row: the CSV's data rows counted from 0 after the header, as in --json")
    for col in ("row", "source", "model", "GPUs", "precision", "release", "predicted s", "published s", "ratio",
                "in P10-P90"):
        t.add_column(col, justify="right" if col in ("row", "GPUs", "predicted s", "published s", "ratio") else "left")
    for r in sel[:n]:
        pred, pub, lo, hi = (r.get(k) for k in ("predicted_step_time_s", "published_step_time_s",
                                                  "predicted_p10_step_time_s", "predicted_p90_step_time_s"))
        inside = "-" if lo is None else ("yes" if lo <= pub <= hi else "below P10" if pub < lo else "above P90")
        t.add_row(str(r["row"]), escape(str(r.get("source_id") or "")), escape(str(r.get("model_name") or "")),
                  f"{r.get('num_gpus')} {escape(str(r.get('gpu_type') or ''))}", escape(str(r.get("precision") or "")),
                  escape(str(r.get("release") or "")), sig(pred, 3), sig(pub, 3), f"{pred / pub:.2f}", inside)
    return t


CV_TITLES = {"source": "Leave-one-source-out (profiles refitted without the source)",
             "release": "Leave-one-release-out (without one software release of a source that spans several)",
             "gpu": "Leave-one-GPU-type-out (the GPU type's factors from its generation or the shared level)"}


def cross_validation_tables(cv: dict) -> list[Table]:
    """One table per cross-validation scheme: each fold's error on what it left out, then all folds."""
    out = []
    for scheme, res in cv["schemes"].items():
        t = Table(title=CV_TITLES.get(scheme, scheme), header_style="bold")
        for col in ("left out", "rows", "MAPE %", "median %", "p90 %"):
            t.add_column(col, justify="left" if col == "left out" else "right")
        for f in res["folds"]:
            t.add_row(f["left_out"], str(f["count"]), _pct(f["mape"]), _pct(f["median_ape"]), _pct(f["p90_ape"]))
        o = res["summary"]["overall"]
        t.add_row("all folds", str(o["count"]), _pct(o["mape"]), _pct(o["median_ape"]), _pct(o["p90_ape"]),
                  style="bold")
        out.append(t)
    return out


def hetero_table(plans: list[dict], title: str) -> Table:
    """Ranked plans of a heterogeneous cluster (rows of planner.hetero.plan_dict)."""
    t = Table(title=title, header_style="bold")
    for col, just in (("#", "right"), ("stages (group x count (degrees))", "left"), ("layers", "left"),
                      ("B", "right"), ("recompute", "left"), ("step s", "right"), ("tok/s/GPU", "right"),
                      ("MFU", "right"), ("memory", "right"), ("one job", "left")):
        t.add_column(escape(col), justify=just)
    for i, d in enumerate(plans):
        e = d["estimate"]
        mem = max(pk / c for pk, c in zip(e["peak_memory_bytes"], e["memory_capacity_bytes"]))
        launch = "yes" if d["launchable"] else f"[yellow]no ({d['launch_issue'].split()[0]})[/yellow]"
        tag = "" if d["kind"] == "mixed" else f" [{d['kind']}]"
        t.add_row(str(i + 1), escape(d["layout"] + tag), "/".join(str(x) for x in d["plan"]["layers_per_stage"]),
                  str(d["plan"]["micro_batch_sequences"]), d["plan"]["recompute"], f"{e['step_time_s']:.3f}",
                  f"{e['tokens_per_s_per_gpu']:.0f}", f"{e['mfu'] * 100:.1f}%",
                  f"{mem * 100:.0f}%" if e["fits"] else "[red]no fit[/red]", launch)
    return t


def stage_balance_table(d: dict, title: str) -> Table:
    """Per pipeline stage of one plan: group, degrees, layers, time per micro-batch, memory."""
    t = Table(title=title, header_style="bold")
    for col in ("stage", "group", "tp", "dp", "mbs", "layers", "ms / micro-batch", "peak GB", "capacity GB"):
        t.add_column(col, justify="left" if col == "group" else "right")
    slowest = max(s["stage_time_s"] for s in d["stages"])
    for s in d["stages"]:
        style = "bold" if s["stage_time_s"] == slowest else None
        t.add_row(str(s["stage"]), s["group"], str(s["tp"]), str(s["dp"]), str(s["micro_batch"]), str(s["layers"]),
                  f"{s['stage_time_s'] * 1e3:.1f}", f"{s['peak_memory_bytes'] / GB:.1f}",
                  f"{s['memory_capacity_bytes'] / GB:.1f}", style=style)
    return t


def group_table(groups: dict[str, dict], title: str) -> Table:
    """Per device group of one plan: GPUs used, stages, layers, busy share of the step, MFU."""
    t = Table(title=title, header_style="bold")
    for col in ("group", "GPUs used", "stages", "layers", "busy", "MFU"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for g, v in groups.items():
        t.add_row(g, f"{v['gpus_used']:.0f} of {v['gpus_total']:.0f}", f"{v['stages']:.0f}", f"{v['layers']:.0f}",
                  f"{100 * v['busy_fraction']:.0f}%", f"{100 * v['mfu']:.1f}%")
    return t


def one_f_one_b_timeline(fwd_s: list[float], bwd_s: list[float], m: int) -> list[list[tuple[str, int, float, float]]]:
    """Simulate the 1F1B schedule (Narayanan et al. 2021, Fig. 4): per stage the ordered list of
    (kind, micro-batch, start_s, end_s). Stage s runs min(p-s-1, m) warm-up forwards, then alternates
    one forward and one backward, then drains the backwards; a forward waits for the previous stage's
    forward of the same micro-batch, a backward for the next stage's backward."""
    p = len(fwd_s)
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        seq = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                seq.append(("F", f))
                f += 1
            seq.append(("B", b))
            b += 1
        orders.append(seq)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    out: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                dep = ("F", i, s - 1) if kind == "F" else ("B", i, s + 1)
                if kind == "F" and s == 0:
                    ready = 0.0
                elif kind == "B" and s == p - 1:
                    ready = done.get(("F", i, s))
                else:
                    ready = done.get(dep)
                if ready is None:
                    break
                start = max(free[s], ready)
                end = start + (fwd_s[s] if kind == "F" else bwd_s[s])
                done[(kind, i, s)] = end
                free[s] = end
                out[s].append((kind, i, start, end))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("1F1B simulation deadlocked")
    return out


def save_report_png(path, e: StepEstimate, title: str, microbatches: int, trust: dict | None = None) -> None:
    """report.png: time breakdown (with the step's P10-P90 as an error bar when ``trust`` gives it), memory
    per stage against capacity, and one step's 1F1B timeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 7.5), constrained_layout=True)
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 1.3])
    ax1, ax2, ax3 = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1]), fig.add_subplot(gs[1, :])
    items = [(k.replace("_", " "), v) for k, v in e.breakdown_s.items() if v > 0]
    ax1.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax1.set_xlabel("seconds per step")
    ax1.set_title(f"step {e.step_time_s:.2f} s, MFU {e.mfu * 100:.0f}%")
    if trust:
        lo, hi = trust["predicted_p10_step_time_s"], trust["predicted_p90_step_time_s"]
        ax1.barh(["step (P10-P90)"], [e.step_time_s], color="tab:gray",
                 xerr=[[e.step_time_s - lo], [hi - e.step_time_s]], capsize=6, ecolor="black")
        ax1.set_title(f"step {fmt_interval(e.step_time_s, lo, hi, ' s')}, MFU {e.mfu * 100:.0f}%, "
                      f"{trust['support_runs']} validated runs near it" + (" (thin)" if trust["thin_support"] else ""))
    ax1.invert_yaxis()
    stages = range(len(e.peak_memory_bytes))
    ax2.bar(stages, [x / GB for x in e.peak_memory_bytes], color="tab:green")
    ax2.axhline(e.memory_capacity_bytes / GB, color="tab:red", ls="--", label="usable capacity")
    ax2.set_xticks(list(stages))
    ax2.set_xlabel("pipeline stage")
    ax2.set_ylabel("peak memory (GB)")
    ax2.legend(loc="lower right")
    ax2.set_title("memory per stage")
    # Timeline with a forward:backward time ratio of 1:2 per stage.
    m = max(1, min(microbatches, 64))
    fwd = [t / 3 for t in e.stage_time_s]
    bwd = [2 * t / 3 for t in e.stage_time_s]
    for s, ops in enumerate(one_f_one_b_timeline(fwd, bwd, m)):
        for kind, i, a, b in ops:
            ax3.barh(s, b - a, left=a, color="tab:blue" if kind == "F" else "tab:orange", edgecolor="white", lw=0.3)
    ax3.set_yticks(range(len(e.stage_time_s)))
    ax3.invert_yaxis()
    ax3.set_xlabel("seconds" + (f" (first {m} of {microbatches} micro-batches)" if microbatches > m else ""))
    ax3.set_ylabel("stage")
    ax3.set_title("1F1B timeline of one step (blue forward, orange backward)")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


ONE_RUN_ROWS = (("same_model", "1st run of a (source, GPU, model)", "its other runs"),
                ("same_model_one_file", "1st runs of all (source, GPU, model) at once", "their other runs"),
                ("same_config", "1st run of a (source, GPU, model)", "its repeats (same configuration, another release)"),
                ("same_release", "1st run of a (source, release, GPU, model)", "its other runs"),
                ("other_models", "1st run of each model of a (source, GPU)", "the other models' runs"),
                ("other_models_same_release", "1st run of each model of a (source, release, GPU)",
                 "the other models' runs"))
"""The one-run calibration figures (costmodel.crossval.one_run_calibration_cv) as the tables name them: key, what
calibrates, what is predicted."""


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def one_run_table(one: dict):
    """One-run calibration inside the held-out sources: MAPE / median before and after, and the mean of the
    sources' own MAPEs (each source weighed alike) where the figures carry it."""
    t = Table(title=f"One-run calibration inside each held-out source ({one['scheme']})", header_style="bold")
    by_source = any("source_mean_mape" in one.get(key, {}) for key, _, _ in ONE_RUN_ROWS)
    for col in ("calibrate on", "predict", "rows", "before MAPE %", "before median %", "after MAPE %",
                "after median %", *(("mean of sources %",) if by_source else ())):
        t.add_column(col, justify="left" if col in ("calibrate on", "predict") else "right")
    for key, on, what in ONE_RUN_ROWS:
        if key not in one:
            continue
        r = one[key]
        t.add_row(on, what, str(r["count"]), _pct(r["before"]["mape"]), _pct(r["before"]["median_ape"]),
                  _pct(r["mape"]), _pct(r["median_ape"]), *((_pct(r.get("source_mean_mape")),) if by_source else ()))
    floor = one.get("same_config", {}).get("floor")
    if floor and floor["count"]:
        t.caption = (f"repeats: the 1st run's own published step time as their prediction is {_pct(floor['mape'])}% "
                     f"off (median {_pct(floor['median_ape'])}%), the release-to-release drift one run cannot remove")
    return t


def one_run_source_table(one: dict):
    """The one-run calibration figures by held-out source (after calibration: MAPE % and pairs), None where the
    figures carry no per-source split."""
    keys = [(key, on, what) for key, on, what in ONE_RUN_ROWS
            if key in one and "per_source" in one[key] and key != "same_model_one_file"]
    sources = sorted({s for key, _, _ in keys for s in one[key]["per_source"]})
    if not keys or not sources:
        return None
    short = {"same_model": "same model", "same_config": "repeats", "same_release": "same model, one release",
             "other_models": "other models", "other_models_same_release": "other models, one release"}
    t = Table(title="One-run calibration by held-out source: MAPE % after calibration (pairs)", header_style="bold")
    t.add_column("source")
    for key, _, _ in keys:
        t.add_column(short[key], justify="right")
    for src in sources:
        cells = []
        for key, _, _ in keys:
            r = one[key]["per_source"].get(src)
            cells.append(f"{_pct(r['mape'])} ({r['count']})" if r else "-")
        t.add_row(src, *cells)
    t.add_row("mean of sources", *(_pct(one[key]["source_mean_mape"]) for key, _, _ in keys))
    return t
