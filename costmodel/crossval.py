"""Grouped cross-validation of the cost model on published runs (``plan validate --cross-validate``): refit
every profile without a group of rows (a source, a container release, a GPU type) and predict the group; and
one-run calibration scored inside each held-out source.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from costmodel.profiles import HardwareProfile, load_profile
from costmodel.recalibrate import recalibrate
from costmodel.validate import (Case, abs_percent_error, case_features, fit_profiles, interval_fields, load_cases,
                                measurements_for, predict_case, summarize)

SCHEMES = ("source", "release", "gpu")


def fold_keys(cases: list[Case], scheme: str) -> list[str]:
    if scheme == "source":
        return sorted({c.source_id for c in cases})
    if scheme == "gpu":
        return sorted({c.cluster.gpu for c in cases})
    if scheme == "release":
        by_src: dict[str, set[str]] = {}
        for c in cases:
            by_src.setdefault(c.source_id, set()).add(c.release)
        return sorted({f"{c.source_id}@{c.release}" for c in cases if c.release and len(by_src[c.source_id]) > 1})
    raise ValueError(f"unknown cross-validation scheme {scheme!r}; valid: {', '.join(SCHEMES)}")


def held_out(case: Case, scheme: str, key: str) -> bool:
    if scheme == "source":
        return case.source_id == key
    if scheme == "gpu":
        return case.cluster.gpu == key
    return f"{case.source_id}@{case.release}" == key


def per_source(job, path: str | Path, workers: int | None = None, progress=None) -> dict:
    """``job((path, source)) -> (source, result)`` for every source of the CSV, in parallel processes (one per
    core by default): {source: result}, sources sorted. ``progress(source)`` is called as each ends. The
    scripts that choose a constant by one-run calibration inside held-out sources use it."""
    from concurrent.futures import ProcessPoolExecutor

    cases, _ = load_cases(path)
    sources = sorted({c.source_id for c in cases})
    out = {}
    with ProcessPoolExecutor(workers) as pool:
        for source, result in pool.map(job, [(str(path), s) for s in sources]):
            out[source] = result
            if progress:
                progress(source)
    return out


def _fold(path: str, scheme: str, key: str, options: dict | None = None) -> tuple[dict, list]:
    cases, _ = load_cases(path)
    profiles, _ = fit_profiles(cases, fitted_by=f"cross-validation fold without {scheme} {key}",
                               exclude=lambda c: held_out(c, scheme, key), **(options or {}))
    rows = []
    for c in (c for c in cases if held_out(c, scheme, key)):
        pred = predict_case(c, profiles[c.cluster.gpu])
        rows.append({"row": c.row, "source_id": c.source_id, "gpu_type": c.gpu_type, "model_name": c.model.name,
                     **case_features(c), "fold": key, **interval_fields(c, pred["plan"], pred["predicted_step_time_s"]),
                     "predicted_step_time_s": pred["predicted_step_time_s"],
                     "published_step_time_s": c.published_step_time_s, "fits": pred["fits"], "error": None,
                     "ape": abs_percent_error(pred["predicted_step_time_s"], c.published_step_time_s)})
    out = {"scheme": scheme, "left_out": key, **summarize(rows)["overall"]}
    if scheme == "source":   # one-run calibration inside the held-out source, from the profiles fitted without it
        out["one_run_calibration"] = one_run_calibration_cv([c for c in cases if held_out(c, scheme, key)], profiles)
    return out, rows


def cross_validate(path: str | Path, progress=None, workers: int | None = None,
                   schemes: tuple[str, ...] = SCHEMES, options: dict | None = None) -> dict:
    """Grouped cross-validation: for each scheme, refit every profile without a group, predict the group.

    Returns {"schemes": {scheme: {"folds": [...], "summary": {...}, "rows": [...]}}, and, for the first
    scheme, "folds" and "summary" at the top level (leave-one-source-out by default). Folds run in parallel
    processes (one per core by default); ``progress(label, done, total)`` is called at the start and as each
    fold ends."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    cases, errors = load_cases(path)
    jobs = [(scheme, key) for scheme in schemes for key in fold_keys(cases, scheme)]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    results: dict[tuple[str, str], tuple[dict, list]] = {}
    if progress:
        progress("starting", 0, len(jobs))
    if workers <= 1:
        for job in jobs:
            results[job] = _fold(str(path), *job, options)
            if progress:
                progress(f"left out {job[0]} {job[1]}", len(results), len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_fold, str(path), *job, options): job for job in jobs}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(f"left out {futures[fut][0]} {futures[fut][1]}", len(results), len(jobs))
    out: dict = {"schemes": {}}
    for scheme in schemes:
        keys = [k for s_, k in jobs if s_ == scheme]
        rows = [r for k in keys for r in results[(scheme, k)][1]]
        summary = summarize(rows + ([{**e, "ape": None} for e in errors] if scheme == "source" else []))
        out["schemes"][scheme] = {"folds": [results[(scheme, k)][0] for k in keys], "summary": summary,
                                  "rows": sorted(rows, key=lambda r: r["row"])}
    if "source" in out["schemes"]:
        folds = out["schemes"]["source"]["folds"]
        out["one_run_calibration"] = pool_one_run([f.pop("one_run_calibration") for f in folds],
                                                  sources=[f["left_out"] for f in folds])
    first = out["schemes"][schemes[0]]
    out["folds"], out["summary"] = first["folds"], first["summary"]
    return out


def _stats(errs: list[float]) -> dict:
    if not errs:
        return {"count": 0, "mape": None, "median_ape": None}
    e = np.array(errs)
    return {"count": len(errs), "mape": round(float(e.mean()), 2), "median_ape": round(float(np.median(e)), 2)}


def one_run_calibration_cv(cases: list, profiles: dict[str, HardwareProfile] | None = None,
                           other_models_weight: float | None = None) -> dict:
    """One-run calibration scored on published runs (``costmodel.validate.Case`` rows).

    same_model: in every (source, GPU, model) group of two or more rows, the base profile of that GPU
    (``profiles[gpu]``, default the shipped one) is calibrated on the group's first row and predicts the others.
    same_model_one_file: the same rows, but one calibration per (source, GPU) takes the first row of every
    such group at once, as ``plan calibrate --measurements RUNS.csv`` does with a CSV of one run per model.
    same_config: the same_model pairs whose target has the anchor's configuration (model, layout, GPU count),
    published by another release of the source; with ``floor``, the error of the anchor's own published step
    time as their prediction: what a model that prices configurations perfectly would get on them after one
    run, the release-to-release drift no calibration on one run removes.
    same_release: the same inside each software release of a source (source, release, GPU, model): one stack,
    as a user's cluster runs it (rows whose release is unsaid form their source's own group).
    other_models: in every (source, GPU) group with two or more models, each model's first row in turn
    calibrates the base profile, which predicts the rows of the group's other models.
    other_models_same_release: the same inside each software release of a source (source, release, GPU).
    Each figure comes with the same rows' error before calibration, and per-group details.
    ``other_models_weight`` replaces both transfer weights of the calibrated profiles (Calibration.other_models_weight
    and other_kind_weight; None: as fitted).
    """
    profiles = profiles or {}
    base_cache: dict[str, HardwareProfile] = {}

    def base(gpu: str) -> HardwareProfile:
        if gpu not in base_cache:
            base_cache[gpu] = profiles.get(gpu) or load_profile(gpu)
        return base_cache[gpu]

    pred_cache: dict[tuple[int, int], float] = {}

    def pred(case, prof: HardwareProfile) -> float:
        key = (case.row, id(prof))
        if key not in pred_cache:
            pred_cache[key] = predict_case(case, prof)["predicted_step_time_s"]
        return pred_cache[key]

    fitted: dict[tuple[int, ...], HardwareProfile] = {}

    def calibrated(anchors: tuple) -> HardwareProfile:
        """The base profile of the anchors' GPU calibrated on all of them at once (one plan calibrate)."""
        key = tuple(a.row for a in anchors)
        if key not in fitted:
            gpu = anchors[0].gpu_type
            prof = base(gpu)
            cal, _ = recalibrate(measurements_for(list(anchors), {gpu: prof}), prof,
                                 fitted_by=f"one-run calibration on row(s) {', '.join(map(str, key))}")
            if other_models_weight is not None:
                cal = cal.model_copy(update={"other_models_weight": other_models_weight,
                                             "other_kind_weight": other_models_weight})
            fitted[key] = prof.model_copy(update={"calibration": cal})
        return fitted[key]

    def score(pairs: list[tuple]) -> tuple[list[float], list[float]]:
        """(anchor, target) pairs -> errors after and before calibration; an anchor is a row, or a tuple of the
        rows one calibration takes together."""
        after = [abs_percent_error(pred(t, calibrated(a if isinstance(a, tuple) else (a,))), t.published_step_time_s)
                 for a, t in pairs]
        before = [abs_percent_error(pred(t, base(t.gpu_type)), t.published_step_time_s) for a, t in pairs]
        return after, before

    def figure(pairs_of_groups) -> dict:
        """Errors over every group's (anchor, target) pairs, with per-group details: ``pairs_of_groups``
        yields (pairs, group description)."""
        all_after, all_before, out = [], [], []
        for pairs, desc in pairs_of_groups:
            after, before = score(pairs)
            all_after += after
            all_before += before
            out.append({**desc, "after": _stats(after), "before": _stats(before)})
        return {**_stats(all_after), "before": _stats(all_before), "groups": out,
                "ape": [round(x, 3) for x in all_after], "ape_before": [round(x, 3) for x in all_before]}

    def residuals(pairs_of_groups) -> list[dict]:
        """Each target's row and log(published / calibrated prediction): what scripts/fit_intervals.py sizes
        the interval of a calibrated prediction by."""
        return [{"row": t.row, "log_residual": round(math.log(t.published_step_time_s / pred(t, calibrated((a,)))), 5)}
                for pairs, _ in pairs_of_groups for a, t in pairs]

    def same_config(pairs_of_groups) -> dict:
        """same_model's pairs whose target repeats the anchor's configuration, with the anchor's published
        step time as their prediction (``floor``)."""
        pairs = [(a, t) for group, _ in pairs_of_groups for a, t in group if _same_config(a, t)]
        out = figure([(pairs, {})])
        out.pop("groups")
        floor = [abs_percent_error(a.published_step_time_s, t.published_step_time_s) for a, t in pairs]
        return {**out, "floor": {**_stats(floor), "ape": [round(x, 3) for x in floor]}}

    by_model = _grouped(cases, lambda c: (c.source_id, c.gpu_type, c.model.name))
    same_model = list(_same_pairs(by_model, False))
    by_release = _grouped(cases, lambda c: (c.source_id, c.release, c.gpu_type, c.model.name))
    stacks, release_stacks = (_grouped(cases, lambda c: (c.source_id, c.gpu_type)),
                              _grouped(cases, lambda c: (c.source_id, c.release, c.gpu_type)))
    return {"scheme": SCHEME,
            "same_model": {**figure(same_model), "residuals": residuals(same_model)},
            "same_model_one_file": figure(_one_file_pairs(by_model)),
            "same_config": same_config(same_model),
            "same_release": figure(_same_pairs(by_release, True)),
            "other_models": figure(_other_model_pairs(stacks, False)),
            "other_models_same_release": figure(_other_model_pairs(release_stacks, True))}


def _grouped(cases: list, key) -> dict[tuple, list]:
    """The cases by ``key``, in their order."""
    groups: dict[tuple, list] = {}
    for c in cases:
        groups.setdefault(key(c), []).append(c)
    return groups


def _same_pairs(groups: dict, by_release: bool):
    """Each group's first row calibrates, its other rows are scored."""
    for rows in groups.values():
        if len(rows) >= 2:
            a = rows[0]
            yield [(a, t) for t in rows[1:]], {
                "source_id": a.source_id, **({"release": a.release} if by_release else {}),
                "gpu_type": a.gpu_type, "model": a.model.name, "anchor_row": a.row}


def _one_file_pairs(groups: dict):
    """Per (source, GPU): one calibration on the first row of every (source, GPU, model) group of two or
    more rows, the groups' other rows scored."""
    by_gpu: dict[tuple, list] = {}
    for rows in groups.values():
        if len(rows) >= 2:
            by_gpu.setdefault((rows[0].source_id, rows[0].gpu_type), []).append(rows)
    for (source, gpu), gs in by_gpu.items():
        anchors = tuple(rows[0] for rows in gs)
        yield [(anchors, t) for rows in gs for t in rows[1:]], {
            "source_id": source, "gpu_type": gpu, "models": len(gs), "anchor_rows": [a.row for a in anchors]}


def _other_model_pairs(groups: dict, by_release: bool):
    """In each group with two or more models, each model's first row calibrates, the other models' rows
    are scored."""
    for key, rows in groups.items():
        firsts = {}
        for c in rows:
            firsts.setdefault(c.model.name, c)
        if len(firsts) >= 2:
            yield [(a, t) for name, a in firsts.items() for t in rows if t.model.name != name], {
                "source_id": key[0], **({"release": key[1]} if by_release else {}), "gpu_type": key[-1],
                "models": len(firsts), "anchor_rows": [a.row for a in firsts.values()]}


def _same_config(a: Case, b: Case) -> bool:
    """The same model, layout and GPU count: a run repeated (by another release of its source)."""
    return a.model == b.model and a.plan == b.plan and a.cluster.num_gpus == b.cluster.num_gpus


ONE_RUN_FIGURES = ("same_model", "same_model_one_file", "same_config", "same_release", "other_models",
                   "other_models_same_release")
SCHEME = "one factor, the one the run moves most for how few fitted runs pin it down (costmodel/recalibrate.py)"


def pool_one_run(results: list[dict], sources: list[str] | None = None) -> dict:
    """Several one_run_calibration_cv results (one per held-out source) as one: figures over all their rows,
    groups listed together, raw errors dropped (the same-model log residuals kept).

    ``sources`` names the held-out source of each result: each figure then also has ``per_source`` (that
    source's pairs alone; sources without pairs left out) and ``source_mean_mape``, the mean of those MAPEs, which
    weighs every source (one stack, as a user's cluster runs one) alike where the pooled MAPE weighs every
    pair, and so the sources with the most pairs."""
    out: dict = {"scheme": SCHEME}
    for key in ONE_RUN_FIGURES:
        after = [x for r in results for x in r[key]["ape"]]
        before = [x for r in results for x in r[key]["ape_before"]]
        out[key] = {**_stats(after), "before": _stats(before),
                    **({"groups": [g for r in results for g in r[key]["groups"]]} if "groups" in results[0][key]
                       else {})}
        if sources is not None:
            per = {s: _stats(r[key]["ape"]) for s, r in zip(sources, results, strict=True) if r[key]["ape"]}
            out[key]["per_source"] = per
            out[key]["source_mean_mape"] = (round(float(np.mean([v["mape"] for v in per.values()])), 2)
                                            if per else None)
        if "residuals" in results[0][key]:
            out[key]["residuals"] = [x for r in results for x in r[key]["residuals"]]
        if "floor" in results[0][key]:
            out[key]["floor"] = _stats([x for r in results for x in r[key]["floor"]["ape"]])
    return out
