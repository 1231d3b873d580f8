"""Scoring the cost model against published training runs (``plan validate``).

Reads any CSV with the columns of ``data/validation/published_runs.csv``; every ``scored=true`` row
is turned into (model, cluster, plan, framework) and predicted. Fields the source did not publish are
filled the way the row's framework fills them by default, and each row says what was assumed.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from costmodel.catalog import catalog
from costmodel.estimate import PlanArrays, estimate_arrays
from costmodel.profiles import HardwareProfile, InputError, load_profile
from costmodel.specs import ClusterSpec, InterNodeFabric, ModelSpec, ParallelPlan

REQUIRED_COLUMNS = ("source_id", "model_name", "layers", "hidden", "heads", "seq_len", "gpu_type", "num_gpus",
                    "tp", "pp", "global_batch", "scored", "step_time_s")

# Catalog entries whose architecture details (MLA, head width, leading dense layers, shared experts,
# vocabulary) fill what a row leaves out, matched on the row's model name.
_FAMILY = (("deepseek-v3", "deepseek-v3"), ("qwen3-30b", "qwen3-30b-a3b"), ("qwen3-235b", "qwen3-235b-a22b"),
           ("gpt-oss-120b", "gpt-oss-120b"), ("mixtral", "mixtral-8x7b"), ("nemotron4-340b", "nemotron4-340b"),
           ("nemotron-340b", "nemotron4-340b"))
_GATED = ("llama", "qwen", "mixtral", "deepseek", "gpt-oss", "mistral")


@dataclass
class Case:
    """One scored row as the cost model sees it."""

    row: int
    source_id: str
    gpu_type: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    published_step_time_s: float
    recompute_known: bool
    assumed: list[str] = field(default_factory=list)


def _num(v: str) -> float | None:
    v = (v or "").strip()
    if v == "" or v.lower() in ("unknown", "n/a", "na", "-"):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _int(v: str) -> int | None:
    x = _num(v)
    return None if x is None else int(round(x))


def framework_of(row: dict) -> str:
    text = " ".join([row.get("notes", ""), row.get("model_name", ""), row.get("zero_stage_or_distopt", "")]).lower()
    if "paxml" in text:
        return "paxml"
    if "tables.tex" in text or "2020" in row.get("source_id", ""):
        return "megatron-lm-2020"
    if "ddp-impl" in text or "narayanan" in text or "paper table 1" in text or "table 3 config" in text \
            or "korthikanti" in row.get("source_id", "").lower():
        return "megatron-lm-2021"
    return "megatron-core"


def _family(name: str) -> ModelSpec | None:
    key = re.sub(r"[^a-z0-9.-]", "", name.lower().replace(" ", "-"))
    for pat, cat in _FAMILY:
        if pat in key:
            return catalog()[cat]
    return None


def row_model(row: dict, assumed: list[str]) -> ModelSpec:
    name = row["model_name"]
    fam = _family(name)
    hidden, heads = _int(row["hidden"]), _int(row["heads"])
    experts = _int(row.get("moe_experts", "")) or 0
    spec: dict = {}
    if fam is not None:
        spec.update(fam.model_dump())
    lname = name.lower()
    gated = any(g in lname for g in _GATED) if fam is None else fam.gated_mlp
    spec.update(name=name, layers=_int(row["layers"]), hidden=hidden, heads=heads,
                seq_len=_int(row["seq_len"]), gated_mlp=gated)
    kv = _int(row.get("kv_heads", ""))
    if kv:
        spec["kv_heads"] = kv
    elif fam is None:
        spec["kv_heads"] = None
    vocab = _int(row.get("vocab", ""))
    if vocab:
        spec["vocab"] = vocab
    elif fam is None:
        spec["vocab"] = 51200
        assumed.append("vocab=51200 (Megatron GPT default)")
    ffn = _int(row.get("ffn_hidden", ""))
    notes = row.get("notes", "")
    if experts:
        spec.update(num_experts=experts, moe_topk=_int(row.get("moe_topk", "")) or spec.get("moe_topk", 2))
        if ffn:
            spec["moe_ffn_hidden"] = ffn
        m = re.search(r"dense-layer ffn (\d+)", notes)
        spec["ffn_hidden"] = int(m.group(1)) if m else spec.get("ffn_hidden", ffn or 4 * hidden)
        m = re.search(r"(\d+) shared expert", notes)
        if m:
            spec["shared_experts"] = int(m.group(1))
    else:
        spec.update(num_experts=0, moe_topk=0, moe_ffn_hidden=None, shared_experts=0, dense_layers=0)
        if ffn:
            spec["ffn_hidden"] = ffn
        elif fam is None or spec.get("num_experts"):
            spec["ffn_hidden"] = 4 * hidden
            assumed.append("ffn_hidden=4h")
    if not spec.get("moe_ffn_hidden") and experts:
        spec["moe_ffn_hidden"] = spec["ffn_hidden"]
    if fam is None:
        spec["learned_position_embeddings"] = not gated
        spec["tied_embeddings"] = not gated
    if spec.get("mtp_layers"):
        # The model trains with multi-token prediction (Megatron-Bridge's DeepSeek-V3 recipe: mtp_num_layers
        # 1) unless the row says it ran without.
        if re.search(r"w/o mtp|without mtp|no mtp", lname):
            spec["mtp_layers"] = 0
        elif "mtp" not in lname:
            assumed.append(f"mtp_layers={spec['mtp_layers']} (the model's default)")
    precision = (row.get("precision") or "").strip()
    if not precision:
        precision = "bf16"
        assumed.append("precision=bf16")
    spec["precision"] = precision
    return ModelSpec.model_validate(spec)


def row_cluster(row: dict, profile: HardwareProfile) -> ClusterSpec:
    num_gpus = _int(row["num_gpus"])
    gpn = _int(row.get("gpus_per_node", "")) or min(profile.nvlink_domain_gpus, 8)
    if profile.nvlink_domain_gpus > 8:  # NVL racks: 4-GPU trays inside a 72-GPU NVLink domain
        gpn = 4
    domain = max(gpn, min(profile.nvlink_domain_gpus, num_gpus))
    nodes = max(1, math.ceil(num_gpus / gpn))
    return ClusterSpec(name=f"{row['gpu_type']}x{num_gpus}", gpu=profile.name, nodes=nodes, gpus_per_node=gpn,
                       nvlink_domain_gpus=domain,
                       inter_node=InterNodeFabric(nic_bandwidth_bytes_per_s=profile.nic_bandwidth_bytes_per_s.value))


def row_plan(row: dict, model: ModelSpec, framework: str, assumed: list[str]) -> tuple[ParallelPlan, bool]:
    tp, pp = _int(row["tp"]), _int(row["pp"])
    cp = _int(row.get("cp", "")) or 1
    num_gpus = _int(row["num_gpus"])
    dp = _int(row.get("dp", "")) or max(1, num_gpus // (tp * pp * cp))
    gbs = _int(row["global_batch"])
    vp = _int(row.get("vp", ""))
    if vp is None:
        vp = 1
        if pp > 1:
            assumed.append("vpp=1 (not published)")
    if pp == 1:
        vp = 1
    ep = _int(row.get("ep", "")) or 1
    mbs = _int(row.get("micro_batch", ""))
    if mbs is None:
        if framework == "megatron-lm-2020":
            mbs = max(1, gbs // dp)
            assumed.append(f"micro_batch={mbs} (whole per-rank batch, no pipeline)")
        else:
            mbs = 1
            assumed.append("micro_batch=1 (Megatron default)")
    sp_raw = (row.get("sp") or "").strip().lower()
    if sp_raw in ("true", "false"):
        sp = sp_raw == "true"
    else:
        sp = framework == "megatron-core" and tp > 1
        assumed.append(f"sequence_parallel={sp}")
    rc_raw = (row.get("recompute") or "").strip().lower()
    known = rc_raw in ("none", "selective", "full")
    recompute = rc_raw if known else ("full" if framework == "megatron-lm-2020" else "none")
    if framework == "megatron-lm-2020" and not known:
        known = True
        assumed.append("recompute=full (Megatron-LM 2020 examples checkpoint activations)")
    z = (row.get("zero_stage_or_distopt") or "").lower()
    fsdp = "fsdp" in z and "fsdp=0" not in z
    distopt = framework in ("megatron-core", "paxml")
    split = framework_split(model.layers, pp, vp)
    if split is not None:
        assumed.append(f"layers_per_stage={'/'.join(map(str, split))} (virtual stages filled first, "
                       f"the last takes the remainder with the loss)")
    plan = ParallelPlan(tp=tp, pp=pp, vpp=vp, dp=dp, cp=cp, ep=ep, etp=1, sequence_parallel=sp, micro_batch=mbs,
                        global_batch=gbs, recompute=recompute, distributed_optimizer=distopt or fsdp,
                        zero_stage=3 if fsdp else (1 if distopt else 0), framework=framework, layers_per_stage=split)
    return plan, known


def framework_split(layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Layers per pipeline rank where a published run's layer count does not divide its pp x vpp virtual
    stages (Megatron then needs an explicit split). With the embedding and loss counted as a layer each
    it divides (Llama-3.1-405B: 126 + 2 over 32), the even split of Megatron's
    account_for_embedding/loss_in_pipeline_split applies: None. Otherwise the virtual stages hold
    ceil(layers / (pp*vpp)) layers each and the last the remainder, beside the loss (and any MTP modules):
    Megatron-Bridge's DeepSeek-V3 layouts (61 layers, pp16: 4 x 15 and 1; pp8: 8 x 7 and 5; pp4: 16 x 3 and
    13; recipes/deepseek/deepseek_v3.py, set_deepseek_v3_pipeline_model_parallel_layout)."""
    stages = pp * vpp
    if pp <= 1 or layers % stages == 0 or (layers + 2) % stages == 0:
        return None
    per = -(-layers // stages)
    virt, left = [], layers
    for _ in range(stages):
        virt.append(min(per, left))
        left -= virt[-1]
    return tuple(sum(virt[v * pp + r] for v in range(vpp)) for r in range(pp))


def load_cases(path: str | Path) -> tuple[list[Case], list[dict]]:
    """Scored rows as cases; rows that cannot be turned into a case come back as errors."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"{p}: file not found") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise InputError(f"{p}: missing column(s) {', '.join(missing)}; expected the columns of "
                         f"data/validation/published_runs.csv")
    cases, errors = [], []
    for i, row in enumerate(reader):
        if (row.get("scored") or "").strip().lower() != "true":
            continue
        assumed: list[str] = []
        try:
            framework = framework_of(row)
            profile = load_profile(row["gpu_type"])
            model = row_model(row, assumed)
            cluster = row_cluster(row, profile)
            plan, known = row_plan(row, model, framework, assumed)
            published = float(row["step_time_s"])
        except ValidationError as exc:
            e = exc.errors()[0]
            loc = ".".join(str(x) for x in e["loc"]) or "(row)"
            msg = f"{p}: row {i}: {exc.title} field '{loc}': {e['msg']} (got {e.get('input')!r})"
            errors.append({"row": i, "source_id": row.get("source_id"), "gpu_type": row.get("gpu_type"),
                           "published_step_time_s": _num(row.get("step_time_s", "")), "error": msg})
            continue
        except (InputError, ValueError, TypeError, KeyError) as exc:
            msg = f"{p}: row {i}: {str(exc).splitlines()[0]}"
            errors.append({"row": i, "source_id": row.get("source_id"), "gpu_type": row.get("gpu_type"),
                           "published_step_time_s": _num(row.get("step_time_s", "")), "error": msg})
            continue
        cases.append(Case(i, row["source_id"], profile.name, model, cluster, plan, published, known, assumed))
    return cases, errors


def recompute_options(plan: ParallelPlan, model: ModelSpec) -> list[ParallelPlan]:
    """What a framework user tries, in order, until the run fits: no recompute, selective, then full
    recompute of a growing number of layers per stage (Megatron --recompute-num-layers), then all."""
    per_stage = max(1, model.layers // plan.pp)
    chunk = max(1, per_stage // plan.vpp)
    opts = [plan.model_copy(update={"recompute": "none", "recompute_layers": None}),
            plan.model_copy(update={"recompute": "selective", "recompute_layers": None})]
    for frac in (0.125, 0.25, 0.5, 0.75):
        k = max(1, int(round(chunk * frac)))
        if k < chunk:
            opts.append(plan.model_copy(update={"recompute": "full", "recompute_layers": k * plan.vpp}))
    opts.append(plan.model_copy(update={"recompute": "full", "recompute_layers": None}))
    return opts


def sharding_fallbacks(plan: ParallelPlan) -> list[ParallelPlan]:
    """A published run that cannot fit as described must have sharded more than the row says: try the
    same plan with gradients (ZeRO-2) and then weights (ZeRO-3 / FSDP) sharded over data parallelism.
    Not with pipeline parallelism: megatron-core's Megatron-FSDP (either stage) needs pp 1 (rules.py,
    fsdp_pipeline), so the estimate would refuse those plans anyway."""
    if plan.dp * plan.cp <= 1 or plan.zero_stage >= 3 or plan.pp > 1:
        return []
    return [plan.model_copy(update={"zero_stage": z, "distributed_optimizer": True}) for z in (2, 3)
            if z > plan.zero_stage]


def _describe_recompute(plan: ParallelPlan) -> str:
    if plan.recompute == "full" and plan.recompute_layers is not None:
        return f"full:{plan.recompute_layers}"
    return plan.recompute


def predict_case(case: Case, profile: HardwareProfile | None = None) -> dict:
    """Predict one case; an unknown recompute setting takes the least recompute that fits."""
    prof = profile or load_profile(case.cluster.gpu)
    base = [case.plan] if case.recompute_known else recompute_options(case.plan, case.model)
    plans = base + [q for p in sharding_fallbacks(case.plan)
                    for q in ([p] if case.recompute_known else recompute_options(p, case.model))]
    out = estimate_arrays(case.model, case.cluster, PlanArrays.from_plans(plans), profile=prof,
                          framework=case.plan.framework)
    fits = out["fits"]
    idx = int(np.argmax(fits)) if fits.any() else len(base) - 1
    assumed = list(case.assumed)
    if not case.recompute_known:
        assumed.append(f"recompute={_describe_recompute(plans[idx])} (least that fits)")
    if plans[idx].zero_stage != case.plan.zero_stage:
        assumed.append(f"zero_stage={plans[idx].zero_stage} (the published layout does not fit otherwise)")
    peak = out["peak_memory_bytes"][idx]
    return {
        "predicted_step_time_s": float(out["step_time_s"][idx]),
        "predicted_peak_memory_bytes": float(np.nanmax(peak)),
        "fits": bool(fits[idx]),
        "assumed": assumed,
        "plan": plans[idx],
    }


def _ape(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub * 100.0


def summarize(rows: list[dict]) -> dict:
    def stats(sel: list[dict]) -> dict:
        errs = [r["ape"] for r in sel if r.get("ape") is not None]
        misses = sum(1 for r in sel if r.get("error"))
        if not errs:
            return {"count": len(sel), "predicted": 0, "misses": misses, "mape": None, "median_ape": None,
                    "p90_ape": None}
        e = np.array(errs)
        return {"count": len(sel), "predicted": len(errs), "misses": misses, "mape": round(float(e.mean()), 2),
                "median_ape": round(float(np.median(e)), 2), "p90_ape": round(float(np.percentile(e, 90)), 2)}

    by_source = {s: stats([r for r in rows if r["source_id"] == s]) for s in sorted({r["source_id"] for r in rows})}
    by_gpu = {g: stats([r for r in rows if r["gpu_type"] == g]) for g in sorted({str(r["gpu_type"]) for r in rows})}
    return {"overall": stats(rows), "by_source": by_source, "by_gpu": by_gpu}


def validate(path: str | Path, profiles: dict[str, HardwareProfile] | None = None) -> dict:
    """Predict every scored row; returns {"rows": [...], "summary": {...}}."""
    cases, errors = load_cases(path)
    rows = []
    for c in cases:
        prof = (profiles or {}).get(c.cluster.gpu)
        try:
            pred = predict_case(c, prof)
        except (ValueError, FloatingPointError) as exc:
            rows.append({"row": c.row, "source_id": c.source_id, "gpu_type": c.gpu_type,
                         "predicted_step_time_s": None, "published_step_time_s": c.published_step_time_s,
                         "predicted_peak_memory_bytes": None, "fits": None, "error": str(exc), "ape": None})
            continue
        ok = math.isfinite(pred["predicted_step_time_s"])
        pred.pop("plan")
        rows.append({"row": c.row, "source_id": c.source_id, "gpu_type": c.gpu_type,
                     "model_name": c.model.name, **pred, "published_step_time_s": c.published_step_time_s,
                     "error": None if ok else "non-finite prediction",
                     "ape": _ape(pred["predicted_step_time_s"], c.published_step_time_s) if ok else None})
    for e in errors:
        rows.append({**e, "predicted_step_time_s": None, "predicted_peak_memory_bytes": None, "fits": None,
                     "ape": None})
    rows.sort(key=lambda r: r["row"])
    return {"rows": rows, "summary": summarize(rows)}


def measurements_for(cases: list[Case]) -> list:
    """Cases as fit measurements, with unknown recompute resolved the way predict_case resolves it."""
    from costmodel.fit import Measurement

    out = []
    for c in cases:
        plan = c.plan if c.recompute_known else predict_case(c)["plan"]
        out.append(Measurement(c.model, c.cluster, plan, c.published_step_time_s))
    return out


def fit_profiles(cases: list[Case], *, fitted_by: str, exclude_source: str | None = None) -> tuple[dict, list]:
    """Fit every profile's calibration on the cases (optionally without one source).

    Profiles with fewer cases than factors keep their defaults. Returns ({profile: HardwareProfile}, reports).
    """
    from costmodel.fit import fit_calibration, relevant_factors
    from costmodel.profiles import Calibration

    train = [c for c in cases if c.source_id != exclude_source]
    by_gpu: dict[str, list[Case]] = {}
    for c in train:
        by_gpu.setdefault(c.cluster.gpu, []).append(c)
    fitted, reports = {}, []
    for gpu in sorted({c.cluster.gpu for c in cases}):
        prof = load_profile(gpu).model_copy(update={"calibration": Calibration()})
        rows = by_gpu.get(gpu, [])
        ms = measurements_for(rows)
        # Fewer measurements than factors: fit only the most important ones (one fewer than the rows).
        names = relevant_factors(ms)[:max(1, len(ms) - 1)]
        try:
            cal, rep = fit_calibration(ms, prof, fitted_by=fitted_by, factors=names)
            prof = prof.model_copy(update={"calibration": cal})
        except ValueError as exc:
            rep = {"profile": gpu, "measurements": len(rows), "skipped": str(exc)}
        fitted[gpu] = prof
        reports.append(rep)
    return fitted, reports


def _fold(path: str, src: str) -> tuple[dict, list]:
    cases, _ = load_cases(path)
    profiles, _ = fit_profiles(cases, fitted_by=f"cross-validation fold without {src}", exclude_source=src)
    rows = []
    for c in (c for c in cases if c.source_id == src):
        pred = predict_case(c, profiles[c.cluster.gpu])
        rows.append({"row": c.row, "source_id": src, "gpu_type": c.gpu_type,
                     "predicted_step_time_s": pred["predicted_step_time_s"],
                     "published_step_time_s": c.published_step_time_s, "error": None,
                     "ape": _ape(pred["predicted_step_time_s"], c.published_step_time_s)})
    return {"left_out": src, **summarize(rows)["overall"]}, rows


def cross_validate(path: str | Path, progress=None, workers: int | None = None) -> dict:
    """Leave-one-source-out: refit every profile without a source, predict that source.

    Folds run in parallel processes (one per core by default)."""
    from concurrent.futures import ProcessPoolExecutor

    cases, errors = load_cases(path)
    sources = sorted({c.source_id for c in cases})
    workers = workers or min(len(sources), os.cpu_count() or 1)
    results: dict[str, tuple[dict, list]] = {}
    if workers <= 1:
        for src in sources:
            results[src] = _fold(str(path), src)
            if progress:
                progress(src)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_fold, str(path), src): src for src in sources}
            from concurrent.futures import as_completed

            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(futures[fut])
    folds = [results[s][0] for s in sources]
    all_rows = [r for s in sources for r in results[s][1]]
    for e in errors:
        all_rows.append({**e, "ape": None})
    return {"folds": folds, "summary": summarize(all_rows)}
