"""Partial pooling of calibration factors and the grouped cross-validation schemes (costmodel/validate.py):
releases read from notes, which groups a scheme holds out, a GPU type without rows taking its generation's
factors, and a strong prior holding a level at its parent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodel.profiles import load_profile
from costmodel.crossval import SCHEMES, fold_keys, held_out
from costmodel.validate import fit_profiles, load_cases, release_of
from csv_rows import write_rows

DATA = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"
FIELDS = ("gemm_efficiency", "comm_exposed", "memory_bound_efficiency")


@pytest.fixture(scope="module")
def cases():
    return load_cases(DATA)[0]


def test_release_is_read_from_the_notes():
    assert release_of("MBRIDGE_PERF_ARCHIVE", "Megatron-Bridge docs/..., container 26.06.01, pretrain") == "26.06.01"
    assert release_of("NEMO_PERF_24.07", "NeMo 24.07 container, DGX-H100, pretraining") == "24.07"
    assert release_of("MLM_README_H100_2024", "MFU=41%; Megatron-Core r0.8.0; overlap-grad-reduce") == "r0.8.0"
    assert release_of("X", "paper Table 1, Selene") == ""


def test_schemes_hold_out_whole_groups(cases):
    assert SCHEMES == ("source", "release", "gpu")
    releases = fold_keys(cases, "release")
    # Only sources that span several releases are split by release: the Megatron-Bridge archive's eight.
    mb = [k for k in releases if k.startswith("MBRIDGE_PERF_ARCHIVE@")]
    assert sorted(k.split("@")[1] for k in mb) == ["25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01",
                                                  "26.06", "26.06.01"]
    assert not any(k.startswith("NEMO_PERF_24.07@") for k in releases)   # one release only
    assert fold_keys(cases, "gpu") == sorted({c.cluster.gpu for c in cases})
    key = "MBRIDGE_PERF_ARCHIVE@26.06"
    out = [c for c in cases if held_out(c, "release", key)]
    assert len(out) == 25 and all(c.release == "26.06" and c.source_id == "MBRIDGE_PERF_ARCHIVE" for c in out)
    with pytest.raises(ValueError, match="valid: source, release, gpu"):
        fold_keys(cases, "model")


def _subset(cases, gpus, per_gpu):
    out = []
    for g in gpus:
        out += [c for c in cases if c.cluster.gpu == g and not c.model.is_moe][:per_gpu]
    return out


def test_a_gpu_without_rows_takes_its_generations_factors(cases):
    sub = _subset(cases, ["H100", "A100-80GB"], 5)
    fitted, reports = fit_profiles(sub, fitted_by="test", gpus=["H100", "H200", "A100-80GB", "B200"])
    h100, h200 = fitted["H100"].calibration, fitted["H200"].calibration
    # Hopper is backed by H100 alone: H100 is the generation level, and H200 (no rows) takes it.
    for f in FIELDS:
        assert getattr(h200, f) == pytest.approx(getattr(h100, f), rel=1e-9)
    # No Blackwell rows at all: B200 takes the shared level, which differs from Hopper's.
    shared = next(r for r in reports if r["level"] == "shared")["values"]
    for f in FIELDS:
        assert getattr(fitted["B200"].calibration, f) == pytest.approx(shared[f], abs=1e-4)
    assert any(abs(getattr(h100, f) - shared[f]) > 1e-3 for f in FIELDS)
    assert {r["level"] for r in reports} == {"shared", "generation hopper", "generation ampere"}


def test_a_strong_prior_holds_a_level_at_its_parent(cases):
    sub = _subset(cases, ["H100", "A100-80GB"], 5)
    weak, rw = fit_profiles(sub, fitted_by="test", pool_prior_rows={"generation": 0.01})
    strong, rs = fit_profiles(sub, fitted_by="test", pool_prior_rows={"generation": 1e6})
    shared = next(r for r in rs if r["level"] == "shared")["values"]
    dev = lambda fitted: max(abs(np.log(getattr(fitted["A100-80GB"].calibration, f) / shared[f]))  # noqa: E731
                             for f in FIELDS)
    assert dev(strong) < 0.01
    assert dev(weak) > 5 * dev(strong)


def test_rows_are_weighted_by_source(cases):
    from costmodel.validate import _source_weights

    sub = [c for c in cases if c.source_id == "MBRIDGE_PERF_ARCHIVE"][:16] + \
        [c for c in cases if c.source_id == "KORTHIKANTI2022"][:4]
    w = _source_weights(sub, 0.5)
    # 16 rows of one source and 4 of another: each row weighs n^-0.5, so the sources weigh 4 : 2.
    assert w[:16].sum() / w[16:].sum() == pytest.approx(2.0)
    assert np.all(_source_weights(sub, 0.0) == 1.0)


def test_every_shipped_gpu_names_its_generation():
    for g in ("V100-32GB", "A100-80GB", "A800-80GB", "H100", "H200", "H800", "GH200", "GH200-96GB", "B200", "B300",
              "GB200", "GB300"):
        assert load_profile(g).generation in ("volta", "ampere", "hopper", "blackwell")


def test_framework_column_or_the_notes_name_the_stack(tmp_path):
    """The framework column is read as given; a CSV without it (the schema other sources are published in)
    gets the framework its notes name, the same for every shared row, and says it assumed so."""
    import csv

    from costmodel.validate import framework_from_notes, framework_of

    rows = list(csv.DictReader(DATA.open()))
    assert {r["framework"] for r in rows} == {"megatron-core", "megatron-lm-2021", "megatron-lm-2020", "paxml"}
    assert all(framework_from_notes(r) == r["framework"] for r in rows)
    assumed: list[str] = []
    row = {**rows[0], "framework": ""}
    assert framework_of(row, assumed) == "megatron-lm-2021" and assumed == [
        "framework=megatron-lm-2021 (from the row's notes and source)"]
    assert framework_of({"notes": "torchtitan FSDP2, 8 nodes", "source_id": "X"}, []) == "other"
    assert framework_of({"notes": "NeMo 24.07 with DeepSpeed-style ZeRO", "source_id": "X"}, []) == "megatron-core"
    # Notes are read as a framework column naming the same stack would be: Megatron-DeepSpeed is DeepSpeed's
    # stack; a Megatron-LM tag, a NeMo container release or (naming nothing newer) a year gives the generation;
    # a run naming no stack, only a year up to 2022, ran on some stack of its time.
    notes = {"BLOOM-176B, Megatron-DeepSpeed, 384 A100": "other",
             "Megatron-DeepSpeed fork, BigScience 2022": "other-2022",
             "Megatron-LM v2.5, 3072 A100": "megatron-lm-2021",
             "NeMo Megatron 22.09 container, DGX A100": "megatron-lm-2021",
             "NeMo 23.11 container, DGX H100": "megatron-core",
             "Megatron-LM, MT-NLG 530B, 2022": "megatron-lm-2021",
             "Megatron-LM, 2019 paper, 512 V100": "megatron-lm-2020",
             "Megatron-LM with Transformer Engine, 2022 and 2024 runs": "megatron-core",
             "175B on 1024 A100, 2021 paper": "other-2022",
             "HuggingFace accelerate with FSDP, 2023": "other",
             "Megatron-FSDP, mcore 0.14": "megatron-core",
             "NeMo AutoModel, FSDP2, 8 H100": "other",
             "MegaScale, 175B on 12,288 GPUs, 2024": "megatron-core",
             "Llama 3 405B, 2024": "megatron-core"}
    for text, key in notes.items():
        assert framework_of({"notes": text, "source_id": "X"}, []) == key, text
    # Other spellings of a known stack are read as it; a stack the model does not know is modelled as "other"
    # (no Megatron overlaps), and the row says so.
    spelled = {"NeMo 2.0": "megatron-core", "Megatron-Bridge": "megatron-core", "mcore": "megatron-core",
               "Megatron Core": "megatron-core", "Megatron-LM v0.9": "megatron-core", "DeepSpeed": "other",
               "Megatron-DeepSpeed": "other", "torchtitan": "other", "MaxText": "other", "Pax": "paxml",
               "JAX/Paxml": "paxml", "Pax/Praxis": "paxml", "Praxis": "paxml",
               "NeMo AutoModel": "other", "NeMo Automodel 25.09": "other", "MegaScale": "megatron-core",
               "Megatron-LM (2020)": "megatron-lm-2020", "megatron-lm 2021": "megatron-lm-2021"}
    for text, key in spelled.items():
        said: list[str] = []
        assert (framework_of({"framework": text, "source_id": "X"}, said), said) == (
            key, [f"framework={key} (from {text!r})"]), text
    # A bare "Megatron-LM" takes the generation the notes name.
    assert framework_of({**rows[0], "framework": "Megatron-LM"}, []) == "megatron-lm-2021"
    assert framework_of({"framework": "Megatron-LM", "source_id": "X", "notes": "mcore 0.12"}, []) == "megatron-core"
    # A year in the column or, for a bare Megatron-LM, in the notes names the generation: 2019 is the 2020 kind
    # (before interleaving and sequence parallelism), not megatron-core.
    assert framework_of({"framework": "megatron-lm-2019", "source_id": "X"}, []) == "megatron-lm-2020"
    assert framework_of({"framework": "Megatron-LM", "source_id": "SHOEYBI2019", "notes": "8.3B, 512 V100"},
                        []) == "megatron-lm-2020"
    assert framework_of({"framework": "Megatron-LM", "source_id": "X", "notes": "MT-NLG, 2022"},
                        []) == "megatron-lm-2021"
    assert framework_of({"framework": "Megatron-LM", "source_id": "X", "notes": "run of 2024"}, []) == "megatron-core"
    said = []
    assert framework_of({"framework": "JAX"}, said) == "other" and said == [
        "framework=other ('JAX' is none of megatron-core, megatron-lm-2021, megatron-lm-2020, paxml, other, "
        "other-async-tp, other-2022: modelled as a stack without Megatron's overlaps)"]
    # A column that says it does not know ('unknown', 'n/a') is read as blank: the notes name the stack.
    for text in ("unknown", "N/A", "-"):
        said = []
        assert framework_of({**rows[0], "framework": text}, said) == "megatron-lm-2021" and said == [
            "framework=megatron-lm-2021 (from the row's notes and source)"], text
    # A copy of the data without the column predicts every row the same.
    head = [c for c in rows[0] if c != "framework"]
    path = tmp_path / "no_framework.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, head, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    a, b = load_cases(DATA)[0], load_cases(path)[0]
    assert [c.plan for c in a] == [c.plan for c in b] and len(a) > 300


def test_cross_validate_predicts_every_row_of_each_held_out_source_once(tmp_path):
    import csv

    from costmodel.crossval import cross_validate

    rows = list(csv.DictReader(DATA.open()))
    keep = ("MLM_PAPER_T1", "KORTHIKANTI2022", "MLM_README_H100_2024")
    sub = [r for r in rows if r["source_id"] in keep]
    path = write_rows(tmp_path / "three_sources.csv", sub)
    cv = cross_validate(path, workers=1, schemes=("source",))
    folds = cv["schemes"]["source"]["folds"]
    assert sorted(f["left_out"] for f in folds) == sorted(keep)
    scored = [r for r in sub if r["scored"].strip().lower() == "true"]
    held = cv["schemes"]["source"]["rows"]
    assert sorted(r["row"] for r in held) == sorted({r["row"] for r in held}) and len(held) == len(scored)
    assert all(r["source_id"] == f["left_out"] for f in folds for r in held if r["fold"] == f["left_out"])
    assert 0 < cv["summary"]["overall"]["mape"] < 30
    # One-run calibration inside each held-out source, split by source: only these three have other-model pairs.
    other = cv["one_run_calibration"]["other_models"]
    assert set(other["per_source"]) == set(keep)
    assert sum(v["count"] for v in other["per_source"].values()) == other["count"]
    assert other["source_mean_mape"] == pytest.approx(np.mean([v["mape"] for v in other["per_source"].values()]),
                                                      abs=0.01)


def test_columns_spelled_other_ways_read_as_the_schema_values(tmp_path):
    """Precision, recompute, sequence-parallel, sharding and scored columns written the ways papers write them
    give the plan the schema's own spellings give; an unreadable recompute stays unknown (least that fits)."""
    import csv

    from costmodel.validate import precision_of, recompute_named

    for text, want in {"FP8 (delayed scaling)": "fp8", "FP8-hybrid": "fp8", "fp8_e4m3": "fp8",
                       "fp8-blockwise": "fp8", "FP8 current scaling": "fp8", "fp8-mx": "mxfp8",
                       "bf16 mixed": "bf16", "bfloat16": "bf16", "AMP fp16": "fp16", "float16": "fp16",
                       "NV-FP4": "nvfp4", "fp4": "nvfp4", "16-mixed": "fp16", "16": "fp16", "32-true": "fp32",
                       "bf16-true": "bf16"}.items():
        said: list[str] = []
        assert precision_of(text, said) == want and said == [f"precision={want} (from {text.strip()!r})"], text
    said = []
    assert precision_of("fp8-cs", said) == "fp8-cs" and precision_of(" MXFP8", said) == "mxfp8" and said == []
    assert precision_of("tf32", said) == "tf32" and said == []            # a precision of its own (ModelSpec)
    # Formats without a price of their own take the tensor-core rate they run at, and say so.
    for text, want, why in (("MXFP4", "nvfp4", "FP4 tensor cores"), ("mxfp6", "mxfp8", "FP8 tensor-core rate"),
                            ("INT8 (SwitchBack)", "fp8", "8-bit tensor-core rate"), ("8-bit", "fp8", "8-bit")):
        said = []
        assert precision_of(text, said) == want and why in said[0] and said[0].startswith(f"precision={want} "), text
    # Notes that mention an 8-bit optimizer or int8 gradient compression say nothing of the GEMMs.
    said = []
    assert precision_of("", said, "8-bit Adam, int8 gradient all-reduce") == "bf16" and said == ["precision=bf16"]
    for text, want in {"yes": "full", "true": "full", "activation checkpointing": "full", "full (uniform, 1 layer)":
                       "full", "block": "full", "selective (core attn)": "selective", "Selective".lower(): "selective",
                       "no": "none", "off": "none", "false": "none", "unknown": "unknown", "": "",
                       "partial (4 layers)": "full", "recompute_num_layers=2": "full", "none (no AC)": "none",
                       "no activation checkpointing": "none", "w/o recompute": "none", "disabled": "none",
                       "non-uniform (4 layers)": "full"}.items():
        assert recompute_named(text) == want, text

    rows = [r for r in csv.DictReader(DATA.open()) if r["scored"] == "true" and r["framework"] == "megatron-core"
            and int(r["tp"]) > 1 and r["precision"] == "bf16"][:1]
    assert rows
    base = {**rows[0], "recompute": "full", "sp": "true"}
    variants = [dict(base), {**base, "precision": "BFloat16 mixed", "recompute": "activation checkpointing",
                             "sp": "yes", "scored": "1", "framework": "NeMo 2.0"}]
    off = {**base, "sp": "0", "scored": "YES"}
    sharded = [{**base, "zero_stage_or_distopt": z, "pp": "1"}
               for z in ("HSDP", "ZeRO-3 (FSDP)", "3", "FULL_SHARD", "shard_grad_op")]
    # Megatron's block method: that many layers of each model chunk; the uniform method's number is its chunk
    block = [{**base, "pp": "2", "vp": vp, "recompute": rc} for vp, rc in
             (("2", "full (block, 3 layers)"), ("none", "partial, 2 layers"), ("1", "full (uniform, 1 layer)"))]
    path = write_rows(tmp_path / "spelled.csv", variants + [off] + sharded + block + [{**base, "scored": "no"}])
    cases, errors = load_cases(path)
    assert errors == [] and len(cases) == 11                             # "no" is not scored
    a, b, c = cases[0].plan, cases[1].plan, cases[2].plan
    assert b == a and cases[1].model.precision == cases[0].model.precision == "bf16"
    assert a.sequence_parallel and not c.sequence_parallel and c.recompute == a.recompute == "full"
    assert a.recompute_layers is None
    assert [x.plan.zero_stage for x in cases[3:8]] == [3, 3, 3, 3, 2]
    assert [(x.plan.vpp, x.plan.recompute, x.plan.recompute_layers) for x in cases[8:]] == [
        (2, "full", 6), (1, "full", 2), (1, "full", None)]


def test_a_precision_column_that_names_no_format_is_bf16_or_fp16_without_bf16(tmp_path):
    """'mixed precision' / 'unknown' say no format: bf16, and fp16 on V100 (no bf16 arithmetic); the row is
    predicted as the blank column is, and says what was assumed."""
    import csv

    rows = list(csv.DictReader(DATA.open()))
    v100 = next(r for r in rows if r["scored"] == "true" and r["gpu_type"].startswith("V100"))
    h100 = next(r for r in rows if r["scored"] == "true" and r["gpu_type"] == "H100" and r["precision"] == "bf16")
    out = [{**r, "precision": p} for r in (v100, h100) for p in ("", "mixed precision", "Unknown")]
    path = write_rows(tmp_path / "vague.csv", out)
    cases, errors = load_cases(path)
    assert errors == [] and [c.model.precision for c in cases] == ["fp16"] * 3 + ["bf16"] * 3
    assert any("precision=fp16 (the row says 'mixed precision')" in a for a in cases[1].assumed)
    assert any("precision=bf16 (the row says 'Unknown')" in a for a in cases[5].assumed)


def test_a_published_run_over_the_usable_margin_but_within_the_gpu_fits():
    """A run that ran needs only the GPU's memory, not the planner's usable 95% of it: GPT-3 175B of NeMo
    24.07 at sequence 2,816 (recompute as published) peaks at 96.6% of an H100's 80 GiB."""
    import dataclasses

    from costmodel.validate import predict_case

    case = next(c for c in load_cases(DATA)[0] if c.row == 52)
    assert case.model.name == "GPT3-175B" and case.cluster.gpu == "H100"
    longer = dataclasses.replace(case, model=case.model.model_copy(update={"seq_len": 2816}), recompute_known=True)
    r = predict_case(longer)
    cap = load_profile("H100").memory_bytes.value
    assert r["fits"] and 0.95 < r["predicted_peak_memory_bytes"] / cap < 1.0
    assert r["assumed"][-1] == "peak memory 83.0 GB is above the planner's usable 95% of 85.9 GB, within all of it"
    # Beyond the GPU's memory with the recompute the row names, the run saved its activations another way: the
    # fastest recompute that fits (6 layers of each stage in full at sequence 4,096).
    r = predict_case(dataclasses.replace(longer, model=case.model.model_copy(update={"seq_len": 4096})))
    assert r["fits"] and (r["plan"].recompute, r["plan"].recompute_layers) == ("full", 6)
    assert r["assumed"][-1] == "recompute=full:6 (the published layout does not fit with recompute=none as the row says)"
    # Beyond it with every recompute setting, the optimizer state went to host memory (at sequence 36,864).
    r = predict_case(dataclasses.replace(longer, model=case.model.model_copy(update={"seq_len": 36864})))
    assert r["fits"] and r["plan"].optimizer_offload == 1.0 and r["plan"].recompute == "full"
    assert "optimizer_offload=1 (the published layout does not fit with its optimizer state on the GPU)" in r["assumed"]
    # Beyond it with every setting, it does not fit.
    r = predict_case(dataclasses.replace(longer, model=case.model.model_copy(update={"seq_len": 65536})))
    assert not r["fits"] and r["predicted_peak_memory_bytes"] > cap


def test_a_dp_that_does_not_multiply_out_gives_way_to_the_gpu_count_and_an_optional_zero_is_unset(tmp_path):
    import csv

    base = next(r for r in csv.DictReader(DATA.open()) if r["scored"] == "true" and r["cp"] == "2"
                and r["dp"] and int(r["vp"] or 1) > 1 and r["micro_batch"])
    n, tp, pp, cp = (int(base[k]) for k in ("num_gpus", "tp", "pp", "cp"))
    assert int(base["dp"]) * tp * pp * cp == n
    rows = [base, {**base, "dp": str(n // (tp * pp))},                  # dp counted without cp
            {**base, "vp": "0", "cp": "0", "micro_batch": "0", "kv_heads": "0"}, {**base, "vp": "", "cp": "1"}]
    path = write_rows(tmp_path / "dp.csv", rows)
    cases, errors = load_cases(path)
    assert errors == [] and len(cases) == 4
    assert cases[1].plan == cases[0].plan and f"dp={base['dp']} (num_gpus / (tp x pp x cp); the row's " \
        f"dp={n // (tp * pp)} does not multiply out)" in cases[1].assumed
    zero, blank = cases[2].plan, cases[3].plan
    assert (zero.vpp, zero.cp, zero.micro_batch) == (1, 1, 1) and zero.dp == blank.dp == n // (tp * pp)
    assert zero.model_copy(update={"micro_batch": blank.micro_batch}) == blank


def test_header_names_with_capitals_or_spaces_read_as_the_schema(tmp_path):
    lines = DATA.read_text().splitlines()
    head = ",".join(f" {c.upper()} " if c in ("source_id", "gpu_type", "tp") else c for c in lines[0].split(","))
    path = tmp_path / "header.csv"
    path.write_text("\n".join([head] + lines[1:40]) + "\n")
    a, b = load_cases(path)[0], [c for c in load_cases(DATA)[0] if c.row < 39]
    assert len(a) == len(b) > 10 and [(c.source_id, c.plan) for c in a] == [(c.source_id, c.plan) for c in b]


def test_a_moe_row_giving_its_familys_dense_ffn_keeps_the_expert_width(tmp_path):
    """The schema's ffn_hidden of a MoE row is the expert width (data/validation/SOURCES.md); a row that writes
    the family's dense-layer width instead (DeepSeek-V3's 18432) keeps the catalog's 2048-wide experts and says
    so, where a width the family does not have is taken as the experts'."""
    import csv

    base = next(r for r in csv.DictReader(DATA.open()) if r["scored"] == "true" and r["model_name"] == "DeepSeek-V3")
    assert base["ffn_hidden"] == "2048"
    path = write_rows(tmp_path / "ffn.csv", [base, {**base, "ffn_hidden": "18432"}, {**base, "ffn_hidden": "4096"}])
    (a, dense, other), errors = load_cases(path)
    assert errors == []
    assert a.model.moe_ffn_hidden == dense.model.moe_ffn_hidden == 2048 and other.model.moe_ffn_hidden == 4096
    assert a.model.ffn_hidden == dense.model.ffn_hidden == other.model.ffn_hidden == 18432
    assert any(s.startswith("moe_ffn_hidden=2048 (ffn_hidden 18432 is deepseek-v3's dense-layer width")
               for s in dense.assumed) and not any(s.startswith("moe_ffn_hidden") for s in a.assumed)


def test_an_unpublished_interleaving_of_a_megatron_core_run_is_the_fastest_that_fits(tmp_path):
    """A megatron-core row with pp > 1 and vp blank is predicted at the fastest interleaving that splits its
    layers evenly and that megatron-core accepts, as an unknown recompute is; a published vp, a Megatron-LM
    2021 row and pp 1 keep theirs."""
    import csv

    from costmodel.validate import interleaving_options, predict_case

    base = next(r for r in csv.DictReader(DATA.open()) if r["scored"] == "true" and r["model_name"] == "Llama3-70B"
                and r["pp"] == "4" and r["vp"] == "5")
    rows = [{**base, "vp": ""}, base, {**base, "vp": "", "framework": "megatron-lm-2021"}]
    path = write_rows(tmp_path / "vp.csv", rows)
    (blank, given, old), errors = load_cases(path)
    assert errors == [] and not blank.vpp_known and given.vpp_known and not old.vpp_known
    # 80 layers over pp 4: chunks of 20 / v layers (v dividing 20, or 82 / 4v), each accepted by the rules.
    assert [p.vpp for p in interleaving_options(blank.plan, blank.model, blank.cluster.num_gpus)] == [1, 2, 4, 5, 10, 20]
    assert [p.vpp for p in interleaving_options(old.plan, old.model, old.cluster.num_gpus)] == [1]
    got = predict_case(blank)
    times = {v: predict_case(given.__class__(**{**given.__dict__, "plan": given.plan.model_copy(
        update={"vpp": v})}))["predicted_step_time_s"] for v in (1, 2, 4, 5, 10, 20)}
    assert got["predicted_step_time_s"] == pytest.approx(min(times.values()), rel=1e-9)
    assert got["plan"].vpp == min(times, key=times.get) and got["plan"].vpp > 1
    assert f"vpp={got['plan'].vpp} (not published; the fastest interleaving that fits)" in got["assumed"]
    assert "vpp=1 (not published)" not in got["assumed"]
    assert predict_case(given)["plan"].vpp == 5 and predict_case(old)["plan"].vpp == 1


def test_an_unpublished_interleaving_counts_the_embedding_and_loss_where_the_layers_need_them(tmp_path):
    """Qwen3-235B's 94 layers do not divide pp 8, but 94 + 2 (the embedding and the loss counted as a layer each)
    do divide 8 x v for v = 2, 3, 4, 6 (12 would leave the first chunk the embedding alone, and the search stops
    at a layer a chunk); those interleavings are offered with the split written out (the first and last ranks a
    layer short), which megatron-core's account_for_embedding/loss_in_pipeline_split runs and the rules accept.
    Before, the rules judged them as an even split of 94 over 8 and none was offered."""
    import csv

    from costmodel.rules import violations
    from costmodel.validate import interleaving_options

    base = next(r for r in csv.DictReader(DATA.open()) if r["scored"] == "true"
                and r["model_name"] == "Qwen3-235B-A22B" and r["pp"] == "8" and r["vp"] in ("", "n/a"))
    (case,), errors = load_cases(write_rows(tmp_path / "qwen.csv", [base]))
    assert errors == [] and not case.vpp_known and case.model.layers == 94
    opts = interleaving_options(case.plan, case.model, case.cluster.num_gpus)
    assert [p.vpp for p in opts] == [1, 2, 3, 4, 6]
    assert opts[0] is case.plan
    for p in opts[1:]:
        assert p.layers_per_stage == (11, 12, 12, 12, 12, 12, 12, 11)
        assert violations(case.model, p, case.cluster.num_gpus) == []


def test_a_stack_documented_to_interleave_reads_an_unpublished_vp_as_megatron_core_does(tmp_path):
    """A non-Megatron row with pp > 1 and vp blank keeps vp 1 (DeepSpeed's pipeline, torchtitan's default 1F1B),
    unless its framework column names Meta or its notes cite the Llama 3 paper, whose stack loops model chunks
    over the pipeline ranks (Sec. 3.3.2): then the fastest interleaving that fits, with the citation in the
    note. A Hugging Face id such as meta-llama/... in the notes names no stack."""
    import csv

    from costmodel.validate import interleaving_options, predict_case

    base = next(r for r in csv.DictReader(DATA.open()) if r["source_id"] == "DGXC_BENCH_24.11.1"
                and r["model_name"] == "Llama3.1-70B" and r["num_gpus"] == "512" and r["precision"] == "bf16")
    assert (base["pp"], base["vp"]) == ("4", "5")
    base = {**base, "vp": "", "notes": ""}
    rows = [{**base, "framework": "other", "notes": "Llama 3 paper (arXiv:2407.21783), Table 4 layout"},
            {**base, "framework": "Meta internal"},
            {**base, "framework": "DeepSpeed"},
            {**base, "framework": "torchtitan", "notes": "meta-llama/Llama-3.1-70B weights"},
            {**base, "framework": "other"}]
    cases, errors = load_cases(write_rows(tmp_path / "stacks.csv", rows))
    assert errors == [] and all(c.plan.framework == "other" and not c.vpp_known for c in cases)
    cited, meta, deepspeed, titan, other = cases
    assert "arXiv:2407.21783" in cited.stack_interleaves and meta.stack_interleaves == cited.stack_interleaves
    assert deepspeed.stack_interleaves == titan.stack_interleaves == other.stack_interleaves == ""
    for c in (cited, meta):
        assert [p.vpp for p in interleaving_options(c.plan, c.model, c.cluster.num_gpus, True)] == [1, 2, 4, 5, 10, 20]
        got = predict_case(c)
        assert got["plan"].vpp > 1 and got["plan"].framework == "other"
        assert any(a.startswith(f"vpp={got['plan'].vpp} (not published; the fastest interleaving that fits: "
                                "Meta's Llama 3 stack") for a in got["assumed"])
    for c in (deepspeed, titan, other):
        got = predict_case(c)
        assert got["plan"].vpp == 1 and "vpp=1 (not published)" in got["assumed"]
    # 64 micro-batches a pipeline of 4: the 1F1B bubble is 3 / 64 of the step, the most interleaving can save.
    ratio = predict_case(cited)["predicted_step_time_s"] / predict_case(other)["predicted_step_time_s"]
    assert 1 - 3 / 64 < ratio < 0.995


def test_a_schedule_named_instead_of_a_chunk_count(tmp_path):
    """A vp cell naming a one-chunk schedule (1F1B, GPipe) is vp 1; one naming an interleaved schedule without its
    chunk count ('Interleaved1F1B', 'interleaved', ZBV) is a blank vp searched for the fastest interleaving, on
    any stack, as is a pp cell '4 (Interleaved1F1B)' (which was read as vp 1 before: the 1 of 1F1B); a count
    beside the word is the count. A non-Megatron row's notes naming an interleaved schedule (torchtitan's
    Interleaved1F1B) let its blank vp be searched too; a Megatron-LM 2021 row's notes do not (the 2021 paper's
    'interleaved schedule' names the paper's method, not every run's)."""
    import csv

    from costmodel.validate import predict_case

    base = next(r for r in csv.DictReader(DATA.open()) if r["source_id"] == "DGXC_BENCH_24.11.1"
                and r["model_name"] == "Llama3.1-70B" and r["num_gpus"] == "512" and r["precision"] == "bf16")
    rows = [{**base, "vp": v} for v in ("1F1B", "GPipe", "Interleaved1F1B", "interleaved", "ZBV", "interleaved (5)")]
    rows += [{**base, "vp": "", "pp": "4 (Interleaved1F1B)"},
             {**base, "vp": "", "framework": "torchtitan", "notes": "pipeline schedule Interleaved1F1B"},
             {**base, "vp": "", "framework": "torchtitan", "notes": ""},
             {**base, "vp": "", "framework": "megatron-lm-2021", "notes": "interleaved schedule (paper Sec. 2.2)"}]
    cases, errors = load_cases(write_rows(tmp_path / "schedules.csv", rows))
    assert errors == [] and len(cases) == 10
    one_f_one_b, gpipe, torch_name, word, zbv, counted, pp_cell, titan_named, titan, old = cases
    for c in (one_f_one_b, gpipe):
        assert c.vpp_known and c.plan.vpp == 1 and any(a.startswith("vp=1 (from ") for a in c.assumed)
    assert counted.vpp_known and counted.plan.vpp == 5
    for c in (torch_name, word, zbv, pp_cell, titan_named):
        assert not c.vpp_known and c.plan.pp == 4 and "interleaved schedule" in c.stack_interleaves
        got = predict_case(c)
        assert got["plan"].vpp > 1
        assert any(a.startswith(f"vpp={got['plan'].vpp} (not published; the fastest interleaving that fits: the ")
                   for a in got["assumed"])
    assert titan.stack_interleaves == old.stack_interleaves == ""
    assert predict_case(titan)["plan"].vpp == predict_case(old)["plan"].vpp == 1
    assert predict_case(titan_named)["predicted_step_time_s"] < predict_case(titan)["predicted_step_time_s"]


def test_a_family_the_name_gives_fills_the_fields_a_row_leaves_blank(tmp_path):
    """A Llama 2 row without a vocab column gets Llama 2's 32,000 tokens, a Nemotron row Nemotron's 256,000 and its
    architecture (squared-ReLU, LayerNorm1p, no biases or dropout, half rope, untied); a GPT row keeps Megatron's
    51,200 and a given vocab is used as given."""
    import csv

    rows = {r["model_name"]: r for r in csv.DictReader(DATA.open()) if r["source_id"] == "NEMO_PERF_24.07"}
    # A Llama 2 shape the catalog does not hold (a 5,120-wide 7B) takes the family's tokenizer by name; the
    # catalog's own Llama 2 7B takes the catalog's (costmodel/validate.py _fill_named_widths).
    odd = {**rows["LLAMA2-7B"], "hidden": "5120", "heads": "40", "kv_heads": "40"}
    picked = [odd, rows["Nemotron-8B"], rows["GPT3-5B"], {**rows["Nemotron-8B"], "vocab": "32000"}, rows["LLAMA2-7B"]]
    assert all(r["vocab"] == "" for r in picked[:3])
    path = write_rows(tmp_path / "named.csv", picked)
    (llama, nemo, gpt, given, catalogued), errors = load_cases(path)
    assert errors == []
    assert (llama.model.vocab, nemo.model.vocab, gpt.model.vocab, given.model.vocab) == (32000, 256000, 51200, 32000)
    assert "vocab=32000 (Llama 2's tokenizer)" in llama.assumed and "vocab=256000 (Nemotron's tokenizer)" in nemo.assumed
    assert catalogued.model.vocab == 32000
    assert "vocab=32000 (not in the row; the catalog's 7b, whose hidden and heads the row gives)" in catalogued.assumed
    m = nemo.model
    assert (m.activation, m.normalization, m.linear_bias, m.hidden_dropout, m.attention_dropout, m.rotary_percent,
            m.tied_embeddings, m.learned_position_embeddings, m.gated_mlp) == (
        "squared_relu", "LayerNorm1p", False, 0.0, 0.0, 0.5, False, False, False)
    assert gpt.model.activation == "gelu" and gpt.model.hidden_dropout == 0.1 and gpt.model.tied_embeddings


def test_a_factor_said_not_to_move_a_run_leaves_its_prediction_unchanged(cases):
    """fit_factors estimates a group of runs again only when a factor that moves it changed
    (costmodel.fit.factor_moves): on every shared run, a factor set near its lower bound changes nothing where it
    is said not to move the run, and each of them changes some run it moves."""
    from costmodel.fit import FACTORS, factor_moves, predict
    from costmodel.profiles import Calibration
    from costmodel.validate import measurements_for

    ms = measurements_for(cases)
    gpus = {m.cluster.gpu for m in ms}
    base = {g: load_profile(g) for g in gpus}
    before = predict(ms, base)
    moved_somewhere = set()
    for name in ("fp8_gemm_efficiency", "fp4_gemm_efficiency", "moe_overhead", "a2a_time", "gemm_efficiency"):
        value = FACTORS[name][2][0] * 1.05     # near the lower bound: far from every fitted value
        changed = {g: p.model_copy(update={"calibration": Calibration(**{**p.calibration.model_dump(), name: value})})
                   for g, p in base.items()}
        after = predict(ms, changed)
        moves = np.array([factor_moves(name, m) for m in ms])
        assert np.array_equal(after[~moves], before[~moves]), name
        if np.any(after[moves] != before[moves]):
            moved_somewhere.add(name)
        assert (~moves).sum() > 0 or name == "gemm_efficiency"
    assert moved_somewhere == {"fp8_gemm_efficiency", "fp4_gemm_efficiency", "moe_overhead", "a2a_time",
                               "gemm_efficiency"}


def test_a_stack_running_async_tensor_parallelism_hides_its_tp_collectives_as_megatron_core_does(tmp_path):
    """A non-Megatron row whose notes name asynchronous tensor parallelism (torchtitan's AsyncTP, XLA's collective
    matmul) is framework other-async-tp: its tensor-parallel collectives are priced with megatron-core's exposed
    share (0.25) instead of in full, everything else as any other stack; said off, or at tp 1, nothing changes."""
    import csv

    from costmodel.estimate import FRAMEWORK
    from costmodel.validate import predict_case

    assert {k: v for k, v in FRAMEWORK["other-async-tp"].items() if k != "tp_exposed"} == \
        {k: v for k, v in FRAMEWORK["other"].items() if k != "tp_exposed"}
    assert FRAMEWORK["other-async-tp"]["tp_exposed"] == FRAMEWORK["megatron-core"]["tp_exposed"] == 0.25
    base = next(r for r in csv.DictReader(DATA.open()) if r["source_id"] == "DGXC_BENCH_24.11.1"
                and r["model_name"] == "Llama3.1-70B" and r["num_gpus"] == "512" and r["precision"] == "bf16")
    base = {**base, "framework": "torchtitan", "pp": "1", "vp": "", "tp": "8", "dp": "64",
            "zero_stage_or_distopt": "FSDP", "recompute": "full", "notes": "2024"}
    rows = [{**base, "notes": "FSDP + TP + AsyncTP, 2024"}, base,
            {**base, "notes": "FSDP + TP without AsyncTP, 2024"},
            {**base, "framework": "MaxText", "notes": "XLA collective matmul on, 2024"},
            {**base, "tp": "1", "dp": "512", "notes": "FSDP + AsyncTP, 2024"},
            {**base, "tp": "1", "dp": "512"}]
    cases, errors = load_cases(write_rows(tmp_path / "async_tp.csv", rows))
    assert errors == []
    assert [c.plan.framework for c in cases] == ["other-async-tp", "other", "other", "other-async-tp",
                                                 "other-async-tp", "other"]
    assert any(a.startswith("framework=other-async-tp ('torchtitan' with asynchronous tensor parallelism named")
               for a in cases[0].assumed)
    assert all(c.plan.sequence_parallel == (c.plan.tp > 1) for c in cases)
    t = [predict_case(c)["predicted_step_time_s"] for c in cases]
    assert t[1] == t[2] and t[0] == t[3]
    # tp 8 inside an NVLink domain: the hidden collectives are a few percent of a fully recomputed 70B step
    assert 0.85 < t[0] / t[1] < 0.99
    assert t[4] == t[5]
