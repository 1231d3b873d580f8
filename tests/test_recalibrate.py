"""One-run calibration from real measurements: Megatron logs read field by field, published-runs CSVs as
measurements, the profile update (one factor from one run, more from more, shrunk to the profile's values),
its cross-validation, and --profile FILE on plan, check, capacity, whatif and validate."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml

from costmodel.fit import Measurement, predict
from costmodel.profiles import InputError, load_profile
from costmodel.crossval import one_run_calibration_cv
from costmodel.recalibrate import recalibrate
from costmodel.runlog import gpu_in_log, parse_arguments, parse_iterations, parse_megatron_log
from costmodel.validate import load_cases, predict_case
from planner.cli import main
from csv_rows import write_rows

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log"
CSV = ROOT / "data" / "validation" / "published_runs.csv"
# elapsed time per iteration (ms) of iterations 1..30 as the log prints them
LOGGED_MS = [31417.9, 9212.4, 8377.0, 8088.7, 8046.0, 8107.6, 8071.2, 8161.3, 8110.0, 8108.3, 8079.9, 8110.5,
             8085.5, 8069.4, 8113.8, 8064.7, 8197.2, 8124.9, 8121.7, 8072.9, 8119.9, 8064.6, 8141.8, 8094.1,
             8038.4, 8093.1, 8135.7, 8108.4, 8116.8, 8109.2]


def log_text() -> str:
    return LOG.read_text()


def edit(text: str, name: str, value: str | None) -> str:
    """The log with one argument's printed value replaced or added (None: the line removed)."""
    out, line = [], "  {} {} {}".format(name, "." * (48 - len(name)), value)
    found = False
    for ln in text.splitlines():
        if ln.startswith(f"  {name} ."):
            found = True
            if value is None:
                continue
            ln = line
        elif "end of arguments" in ln and not found and value is not None:
            out.append(line)
        out.append(ln)
    return "\n".join(out) + "\n"


# ---- the log parser --------------------------------------------------------------------------------------

def test_argument_dump_is_read_as_printed():
    args = parse_arguments(log_text())
    assert len(args) == 126
    assert args["tensor_model_parallel_size"] == "2"
    assert args["data_path"] == "['/lustre/data/fineweb-edu/llama3_text_document']"
    assert args["recompute_granularity"] == "None"
    assert args["account_for_embedding_in_pipeline_split"] == "False"   # 39 characters: 9 dots


def test_log_model_and_layout_field_by_field():
    run = parse_megatron_log(log_text(), "train.log", gpu="H100")
    m, p, c = run.measurement.model, run.measurement.plan, run.measurement.cluster
    assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.seq_len) == (32, 4096, 14336, 32, 8, 8192)
    assert m.vocab == 128256                       # the tokenizer's padded vocabulary line
    assert m.head_dim is None                      # kv_channels 128 = 4096 / 32
    assert (m.gated_mlp, m.tied_embeddings, m.learned_position_embeddings) == (True, False, False)
    assert (m.precision, m.num_experts, m.mtp_layers) == ("bf16", 0, 0)
    assert (p.tp, p.pp, p.vpp, p.dp, p.cp, p.ep, p.etp) == (2, 2, 1, 4, 1, 1, 1)
    assert (p.micro_batch, p.global_batch, p.sequence_parallel) == (1, 128, True)
    assert (p.recompute, p.recompute_layers, p.distributed_optimizer, p.zero_stage) == ("none", None, True, 1)
    assert p.framework == "megatron-core"
    assert (c.gpu, c.num_gpus, c.nodes, c.gpus_per_node) == ("H100", 16, 2, 8)


def test_log_step_time_is_the_median_after_warm_up():
    run = parse_megatron_log(log_text(), "train.log", gpu="H100")
    assert run.skipped == [1, 2, 3]
    assert run.iterations == list(range(4, 31))
    assert run.measurement.step_time_s == pytest.approx(statistics.median(LOGGED_MS[3:]) / 1e3)
    assert run.tflops_per_gpu == pytest.approx(467.9)
    lines = parse_iterations(log_text())
    assert [x[0] for x in lines] == list(range(1, 31))
    assert [x[1] for x in lines] == LOGGED_MS
    assert {x[3] for x in lines} == {128}
    none_skipped = parse_megatron_log(log_text(), "train.log", gpu="H100", warmup_iterations=0)
    assert none_skipped.skipped == []
    assert none_skipped.measurement.step_time_s == pytest.approx(statistics.median(LOGGED_MS) / 1e3)


def test_a_line_averaging_warm_up_iterations_is_skipped():
    """With --log-interval 10 the line at iteration 10 averages iterations 1-10: it is left out."""
    text = edit(log_text(), "log_interval", "10")
    body = [ln for ln in text.splitlines() if " iteration " not in ln or "/      30 |" not in ln]
    lines = [ln for ln in text.splitlines() if "/      30 |" in ln]
    kept = [ln for ln in lines if any(f"iteration {i:8d}/" in ln for i in (10, 20, 30))]
    run = parse_megatron_log("\n".join(body + kept), "x.log", gpu="H100")
    assert run.skipped == [10]
    assert run.measurement.step_time_s == pytest.approx(statistics.median([LOGGED_MS[19], LOGGED_MS[29]]) / 1e3)


def test_ramp_up_lines_are_skipped():
    text = log_text().replace("global batch size:   128 |", "global batch size:    64 |", 6)
    run = parse_megatron_log(text, "x.log", gpu="H100")
    assert run.skipped == [1, 2, 3, 4, 5, 6]
    assert run.measurement.plan.global_batch == 128


def test_precision_recompute_vpp_fsdp_and_moe_arguments():
    text = log_text()
    for name, value in (("fp8", "hybrid"), ("fp8_recipe", "mxfp8"), ("recompute_granularity", "full"),
                        ("recompute_method", "block"), ("recompute_num_layers", "2"),
                        ("virtual_pipeline_model_parallel_size", "4"), ("use_megatron_fsdp", "True"),
                        ("data_parallel_sharding_strategy", "optim_grads_params"), ("num_experts", "16"),
                        ("moe_ffn_hidden_size", "2048"), ("moe_layer_freq", "([0]*3+[1]*29)"),
                        ("expert_model_parallel_size", "4")):
        text = edit(text, name, value)
    run = parse_megatron_log(text, "x.log", gpu="B200")
    m, p = run.measurement.model, run.measurement.plan
    assert m.precision == "mxfp8"
    assert (m.num_experts, m.moe_topk, m.moe_ffn_hidden, m.dense_layers) == (16, 2, 2048, 3)
    assert (p.recompute, p.recompute_layers, p.vpp) == ("full", 8, 4)
    assert (p.zero_stage, p.ep, p.etp) == (3, 4, 2)
    assert run.measurement.cluster.gpu == "B200"
    assert parse_megatron_log(edit(text, "fp8_recipe", "delayed"), "x.log", gpu="B200").measurement.model.precision \
        == "fp8"


@pytest.mark.parametrize("freq, at", [
    ("1", list(range(32))),
    ("[0, 0, 0] + [1] * 29", list(range(3, 32))),
    ("[0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]",
     list(range(1, 32, 2))),
    ("([0,1]*16)", list(range(1, 32, 2))),
])
def test_moe_layer_freq_patterns(freq, at):
    text = log_text()
    for name, value in (("num_experts", "16"), ("moe_ffn_hidden_size", "2048"), ("moe_layer_freq", freq)):
        text = edit(text, name, value)
    m = parse_megatron_log(text, "x.log", gpu="H100").measurement.model
    assert [i for i in range(m.layers) if m.is_moe_layer(i)] == at


@pytest.mark.parametrize("freq, why", [("2", "the cost model places MoE layers"),
                                       ("[1, 0] * 16", "the cost model places MoE layers"),
                                       ("[0, 1] * 8", r"expected an integer or a list of 0 / 1, one a layer \(32"),
                                       ("__import__('os')", "expected an integer or a list")])
def test_moe_layer_freq_the_model_cannot_hold_is_refused(freq, why):
    text = log_text()
    for name, value in (("num_experts", "16"), ("moe_ffn_hidden_size", "2048"), ("moe_layer_freq", freq)):
        text = edit(text, name, value)
    with pytest.raises(InputError, match=rf"^x\.log: field 'moe_layer_freq' = .*: {why}"):
        parse_megatron_log(text, "x.log", gpu="H100")


def test_a_shared_expert_width_that_is_not_whole_experts_is_refused():
    text = log_text()
    for name, value in (("num_experts", "16"), ("moe_ffn_hidden_size", "2048"),
                        ("moe_shared_expert_intermediate_size", "3072")):
        text = edit(text, name, value)
    with pytest.raises(InputError,
                       match=r"^x\.log: field 'moe_shared_expert_intermediate_size' = 3072: not a multiple"):
        parse_megatron_log(text, "x.log", gpu="H100")
    text = edit(text, "moe_shared_expert_intermediate_size", "4096")
    assert parse_megatron_log(text, "x.log", gpu="H100").measurement.model.shared_experts == 2


def test_configuration_as_yaml_without_an_argument_dump():
    """Megatron-Bridge / NeMo 2 print their configuration as YAML; the same names are read from it."""
    yaml_cfg = ["model:", "  num_layers: 32", "  hidden_size: 4096", "  ffn_hidden_size: 14336",
                "  num_attention_heads: 32", "  num_query_groups: 8", "  seq_length: 8192", "  vocab_size: 128256",
                "  tensor_model_parallel_size: 4", "  pipeline_model_parallel_size: 1", "  sequence_parallel: true",
                "  gated_linear_unit: true", "  bf16: true", "train:", "  micro_batch_size: 2",
                "  global_batch_size: 64", "world_size: 8"]
    iters = [ln for ln in log_text().splitlines() if "elapsed time per iteration" in ln]
    run = parse_megatron_log("\n".join(yaml_cfg + iters), "bridge.log", gpu="H100")
    m, p = run.measurement.model, run.measurement.plan
    assert (m.layers, m.kv_heads, m.vocab, m.gated_mlp) == (32, 8, 128256, True)
    assert (p.tp, p.pp, p.dp, p.micro_batch, p.global_batch, p.sequence_parallel) == (4, 1, 2, 2, 128, True)


def test_nemo_progress_bar_step_timing():
    args = [ln for ln in log_text().splitlines() if " iteration " not in ln or "elapsed time" not in ln]
    bar = [f"Epoch 0: : {i:3d}/30 [00:{i:02d}<01:00, reduced_train_loss=9.{i:02d}, global_step={i - 1}.000, "
           f"consumed_samples={128 * i}.0, train_step_timing in s={ms / 1e3:.4f}]" for i, ms in enumerate(LOGGED_MS, 1)]
    run = parse_megatron_log("\n".join(args + bar), "nemo.log", gpu="H100")
    assert run.skipped == [1, 2, 3] and run.iterations == list(range(4, 31))
    assert run.measurement.step_time_s == pytest.approx(statistics.median(LOGGED_MS[3:]) / 1e3, rel=1e-4)


def test_bad_logs_are_one_line_errors_naming_file_and_field():
    with pytest.raises(InputError, match=r"^x\.log: field 'num_layers' is not in the log's argument dump"):
        parse_megatron_log(edit(log_text(), "num_layers", None), "x.log", gpu="H100")
    with pytest.raises(InputError, match=r"^x\.log: field 'hidden_size' = 'big': expected an integer"):
        parse_megatron_log(edit(log_text(), "hidden_size", "big"), "x.log", gpu="H100")
    with pytest.raises(InputError, match=r"^x\.log: field 'gpu': the log does not name the GPU type; pass --gpu"):
        parse_megatron_log(log_text(), "x.log")
    no_iters = "\n".join(ln for ln in log_text().splitlines() if "elapsed time per iteration" not in ln)
    with pytest.raises(InputError, match=r"field 'elapsed time per iteration \(ms\)': no iteration lines"):
        parse_megatron_log(no_iters, "x.log", gpu="H100")
    with pytest.raises(InputError, match=r"no Megatron argument dump"):
        parse_megatron_log("hello\nworld\n", "x.log", gpu="H100")
    with pytest.raises(InputError, match=r"all 30 logged iteration\(s\) fall in the first 40"):
        parse_megatron_log(log_text(), "x.log", gpu="H100", warmup_iterations=40)


@pytest.mark.parametrize("name, value, low", [("num_layers", "nan", 1), ("num_layers", "inf", 1),
                                              ("num_attention_heads", "0", 1), ("tensor_model_parallel_size", "-2", 1),
                                              ("num_experts", "-1", 0)])
def test_a_size_that_is_not_a_whole_number_in_range_is_a_one_line_error(name, value, low):
    # Found by fuzzing the log reader: NaN and inf raised ValueError / OverflowError, 0 heads ZeroDivisionError.
    with pytest.raises(InputError, match=rf"^x\.log: field '{name}' = '{value}': expected an integer >= {low}$"):
        parse_megatron_log(edit(log_text(), name, value), "x.log", gpu="H100")


def test_a_world_beyond_any_cluster_and_an_absurd_iteration_time_are_one_line_errors():
    # Found by fuzzing: 8,000,016 GPUs raised pydantic's ValidationError; two iteration times near the float limit
    # made a median of inf.
    no_world = "\n".join(ln for ln in log_text().splitlines() if not ln.startswith("  world_size "))
    with pytest.raises(InputError, match=r"^x\.log: the run's 8,000,016 GPUs .* make no cluster of H100: "):
        parse_megatron_log(edit(no_world, "context_parallel_size", "500001"), "x.log", gpu="H100")
    huge = re.sub(r"elapsed time per iteration \(ms\): [0-9.]+", "elapsed time per iteration (ms): 8.9e+307",
                  log_text())
    with pytest.raises(InputError, match=r"iteration 4: field 'elapsed time per iteration \(ms\)' = 8\.9e\+307: "
                                         r"expected a positive time under 1e\+12 ms"):
        parse_megatron_log(huge, "x.log", gpu="H100")


def test_iteration_fields_that_are_not_numbers_are_no_iteration_lines():
    # "elapsed time per iteration (ms): ." raised ValueError; a NeMo global_step of 1e400 OverflowError.
    dots = log_text().replace("elapsed time per iteration (ms): ", "elapsed time per iteration (ms): .")
    run = parse_megatron_log(dots, "x.log", gpu="H100")   # ".8377.0" reads as 0.8377 ms: a number
    assert run.measurement.step_time_s < 0.01
    lone = re.sub(r"elapsed time per iteration \(ms\): [0-9.]+", "elapsed time per iteration (ms): .", log_text())
    with pytest.raises(InputError, match=r"no iteration lines"):
        parse_megatron_log(lone, "x.log", gpu="H100")
    assert parse_iterations("global_step=1e400 train_step_timing in s=2.5\nglobal_step=3 train_step_timing in s=2.5") \
        == [(4, 2500.0, None, None)]


def test_device_names_in_a_log_resolve_to_shipped_profiles():
    assert gpu_in_log("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)") == "H100"
    assert gpu_in_log("device: NVIDIA B200") == "B200"
    assert gpu_in_log("nothing here") is None


# ---- the profile update ----------------------------------------------------------------------------------

def shifted(m: Measurement, prof, factor: float) -> Measurement:
    return dataclasses.replace(m, step_time_s=float(predict([m], prof)[0]) * factor)


def test_one_run_fits_one_factor_and_meets_the_run():
    prof = load_profile("H100")
    m = shifted(parse_megatron_log(log_text(), "x.log", gpu="H100").measurement, prof, 1.15)
    cal, rep = recalibrate([m], prof, fitted_by="test")
    assert rep["factors"] == ["gemm_efficiency"]            # a dense bf16 run is GEMM-bound
    assert rep["previous"]["gemm_efficiency"] == pytest.approx(prof.calibration.gemm_efficiency, abs=1e-4)
    assert rep["values"]["gemm_efficiency"] < 0.9 * prof.calibration.gemm_efficiency
    assert rep["mape_before"] == pytest.approx(100 * (1 - 1 / 1.15), abs=0.01) and rep["mape_after"] < 1.5
    # everything else is the profile's
    for name in ("comm_exposed", "moe_overhead", "attention_efficiency", "gemm_shape"):
        assert getattr(cal, name) == getattr(prof.calibration, name)


def test_one_run_moves_the_factor_the_fewest_fitted_runs_pin_down():
    """An NVFP4 run of Llama 3.1 405B on GB300, 10% slower than predicted. The shipped fp4 factor rests on 9 of the
    GPU's runs, the GEMM efficiency every precision shares on 63: the update goes to the fp4 factor, and an FP8 run
    of the same model keeps its prediction. Were the fp4 factor pinned down as firmly as the GEMM efficiency, the
    update would go to the GEMM efficiency, the factor the run moves most. Calibrating adds the run to the counts."""
    from costmodel.recalibrate import factor_support
    from costmodel.validate import measurements_for

    cases, _ = load_cases(CSV)
    pick = [c for c in cases if c.gpu_type == "GB300" and c.model.name == "Llama3.1-405B" and c.release == "26.02"]
    fp4 = next(c for c in pick if c.model.precision == "nvfp4")
    fp8 = next(c for c in pick if c.model.precision != "nvfp4")
    prof = load_profile("GB300")
    rows, pooled = prof.calibration.fitted_rows, prof.calibration.fitted_rows_pooled
    assert rows["fp4_gemm_efficiency"] == 9 and rows["gemm_efficiency"] == 63
    assert factor_support(prof, "fp4_gemm_efficiency") == pytest.approx(9 + 0.1 * 18)
    m = shifted(measurements_for([fp4])[0], prof, 1.1)
    cal, rep = recalibrate([m], prof, fitted_by="test")
    assert rep["factors"] == ["fp4_gemm_efficiency"] and rep["mape_after"] < 0.5
    assert rep["sensitivity"]["gemm_efficiency"] > rep["sensitivity"]["fp4_gemm_efficiency"]
    assert rep["support"]["fp4_gemm_efficiency"] == 10.8 and rep["support"]["gemm_efficiency"] == 97.2
    assert cal.gemm_efficiency == prof.calibration.gemm_efficiency
    after = prof.model_copy(update={"calibration": cal})
    assert predict_case(fp8, after)["predicted_step_time_s"] == predict_case(fp8, prof)["predicted_step_time_s"]
    assert cal.fitted_rows["fp4_gemm_efficiency"] == 10 and cal.fitted_rows["gemm_efficiency"] == 64
    assert cal.fitted_rows_pooled["gemm_efficiency"] == pooled["gemm_efficiency"] + 1
    pinned = prof.model_copy(update={"calibration": prof.calibration.model_copy(update={
        "fitted_rows": {**rows, "fp4_gemm_efficiency": rows["gemm_efficiency"]},
        "fitted_rows_pooled": {**pooled, "fp4_gemm_efficiency": pooled["gemm_efficiency"]}})})
    cal, rep = recalibrate([m], pinned, fitted_by="test")
    assert rep["factors"] == ["gemm_efficiency"] and rep["mape_after"] < 0.5


def test_shipped_profiles_count_the_runs_they_were_fitted_to():
    """Every shipped profile's run counts are those of data/validation/published_runs.csv (a profile without runs
    of its own, H200, counts none), so scripts/fit_profiles.py was rerun after the data last changed."""
    from costmodel.validate import factor_rows, measurements_for

    cases, _ = load_cases(CSV)
    own, pooled = factor_rows(measurements_for(cases))
    assert pooled["gemm_efficiency"] == len(cases) and pooled["a2a_time"] == sum(c.model.is_moe for c in cases)
    for gpu in ("H100", "GB200", "GB300", "B200", "A100-80GB", "H200"):
        cal = load_profile(gpu).calibration
        assert cal.fitted_rows == own.get(gpu, {}) and cal.fitted_rows_pooled == pooled
    assert load_profile("H200").calibration.fitted_rows == {}


def test_a_calibrated_profile_carries_part_of_its_update_to_other_models(tmp_path):
    """The measured architecture gets the fitted factor; another model of its kind OTHER_MODELS_WEIGHT of the update
    in log space, at any sequence length the measured one keeps all of it; a shipped profile is never moved; the
    calibrated YAML round-trips; calibrating again keeps what the first calibration started from."""
    from costmodel.recalibrate import OTHER_MODELS_WEIGHT
    from costmodel.specs import ModelSpec
    from executor.calibrate import write_calibrated_profile

    prof = load_profile("H100")
    m = shifted(parse_megatron_log(log_text(), "x.log", gpu="H100").measurement, prof, 1.15)
    cal, _ = recalibrate([m], prof, fitted_by="test")
    fitted = prof.model_copy(update={"calibration": cal})
    g0, g1 = prof.calibration.gemm_efficiency, cal.gemm_efficiency
    assert cal.measured_models == (m.model.architecture_key(),) and cal.uncalibrated == {"gemm_efficiency": g0}
    assert OTHER_MODELS_WEIGHT == cal.other_models_weight == 0.3
    assert cal.measured_kinds == (f"dense/{m.model.precision}",)
    other = ModelSpec.model_validate({**m.model.model_dump(), "layers": m.model.layers + 2, "name": "other"})
    longer = m.model.model_copy(update={"seq_len": 2 * m.model.seq_len, "name": "renamed"})
    assert fitted.for_model(m.model) is fitted and fitted.for_model(longer) is fitted
    moved = fitted.for_model(other)
    assert moved.calibration.gemm_efficiency == pytest.approx(g0 * (g1 / g0) ** 0.3, rel=1e-12)
    assert moved.for_model(other) is moved and prof.for_model(other) is prof
    p_other = predict([Measurement(other, m.cluster, m.plan, 1.0)], fitted)[0]
    p_base = predict([Measurement(other, m.cluster, m.plan, 1.0)], prof)[0]
    p_moved = predict([Measurement(other, m.cluster, m.plan, 1.0)], moved)[0]
    assert p_other == p_moved and p_base < p_other < predict([Measurement(other, m.cluster, m.plan, 1.0)],
                                                             prof.model_copy(update={"calibration": cal.model_copy(
                                                                 update={"measured_models": ()})}))[0]
    out = tmp_path / "cal.yaml"
    write_calibrated_profile(Path("hardware_profiles/gpus/H100.yaml"), cal, out)
    assert load_profile(str(out)).calibration == cal
    again, _ = recalibrate([shifted(m, fitted, 1.05)], fitted, fitted_by="again")
    assert again.uncalibrated["gemm_efficiency"] == g0 and again.measured_models == cal.measured_models


def test_a_model_of_another_kind_gets_less_of_a_calibration(tmp_path):
    """A dense bf16 run's update carries OTHER_MODELS_WEIGHT of the way to another dense bf16 model and only
    OTHER_KIND_WEIGHT to an MoE model or to the same model in fp8 (the kinds are dense or MoE, and precision);
    a profile calibrated before the kinds were recorded gives every model not measured OTHER_MODELS_WEIGHT; the
    kinds round-trip through the calibrated YAML and plan calibrate again adds the new runs' kinds."""
    from costmodel.catalog import get_model
    from costmodel.profiles import model_kind
    from costmodel.recalibrate import OTHER_KIND_WEIGHT, OTHER_MODELS_WEIGHT
    from costmodel.specs import ModelSpec
    from executor.calibrate import write_calibrated_profile

    assert (OTHER_MODELS_WEIGHT, OTHER_KIND_WEIGHT) == (0.3, 0.1)
    prof = load_profile("H100")
    m = shifted(parse_megatron_log(log_text(), "x.log", gpu="H100").measurement, prof, 1.15)
    assert model_kind(m.model) == "dense/bf16"
    cal, report = recalibrate([m], prof, fitted_by="test")
    assert report["measured_kinds"] == ["dense/bf16"] and report["other_kind_weight"] == 0.1
    fitted = prof.model_copy(update={"calibration": cal})
    g0, g1 = prof.calibration.gemm_efficiency, cal.gemm_efficiency
    dense = ModelSpec.model_validate({**m.model.model_dump(), "layers": m.model.layers + 2, "name": "other"})
    fp8 = dense.model_copy(update={"precision": "fp8"})
    moe = get_model("mixtral-8x7b")
    assert model_kind(fp8) == "dense/fp8" and model_kind(moe) == "moe/bf16"
    assert fitted.for_model(dense).calibration.gemm_efficiency == pytest.approx(g0 * (g1 / g0) ** 0.3, rel=1e-12)
    for other in (fp8, moe):
        assert fitted.for_model(other).calibration.gemm_efficiency == pytest.approx(g0 * (g1 / g0) ** 0.1, rel=1e-12)
        assert "none of its kind" in fitted.calibration_scope(other) and "gets 10% of that update" in \
            fitted.calibration_scope(other)
    assert "gets 30% of that update" in fitted.calibration_scope(dense)
    legacy = prof.model_copy(update={"calibration": cal.model_copy(update={"measured_kinds": ()})})
    assert legacy.for_model(moe).calibration.gemm_efficiency == pytest.approx(g0 * (g1 / g0) ** 0.3, rel=1e-12)
    out = tmp_path / "cal.yaml"
    write_calibrated_profile(Path("hardware_profiles/gpus/H100.yaml"), cal, out)
    assert load_profile(str(out)).calibration == cal
    again, _ = recalibrate([Measurement(fp8, m.cluster, m.plan, m.step_time_s)], fitted, fitted_by="again")
    assert again.measured_kinds == ("dense/bf16", "dense/fp8")


def test_runs_of_several_models_calibrate_each_model_on_its_own_runs(tmp_path):
    """One calibration on a run of Llama 3.1 8B (its stack 20% slower than predicted) and one of Llama 3.1 70B
    (10% faster): each model's other layouts get its own offset back (a pooled update alone would leave both
    near the 5% average), a third architecture the pooled update at OTHER_MODELS_WEIGHT; the YAML round-trips;
    calibrating again on the 8B alone keeps the 70B's factors."""
    from costmodel.specs import ModelSpec
    from costmodel.validate import measurements_for
    from executor.calibrate import write_calibrated_profile

    prof = load_profile("H100")
    cases, _ = load_cases(CSV)
    rows = [c for c in cases if c.source_id.startswith("DGXC") and c.gpu_type == "H100"]
    small = measurements_for([c for c in rows if c.model.name == "Llama3.1-8B"])
    big = measurements_for([c for c in rows if c.model.name == "Llama3.1-70B"])
    assert len(small) >= 2 and len(big) >= 2 and small[0].model.architecture_key() != big[0].model.architecture_key()
    slow = [shifted(m, prof, 1.2) for m in small]
    fast = [shifted(m, prof, 0.9) for m in big]
    cal, rep = recalibrate([slow[0], fast[0]], prof, fitted_by="test")
    assert set(cal.per_model) == {slow[0].model.architecture_key(), fast[0].model.architecture_key()}
    assert set(rep["per_model"]) == {"Llama3.1-8B", "Llama3.1-70B"} and rep["mape_after"] < 0.5
    fitted = prof.model_copy(update={"calibration": cal})
    for runs in (slow, fast):
        err = [abs(p / m.step_time_s - 1) for p, m in zip(predict(runs, fitted), runs)]
        assert max(err) < 0.03, err
    # each architecture's factors are the ones a calibration on its run alone gives
    alone, _ = recalibrate([slow[0]], prof, fitted_by="test")
    own = cal.per_model[slow[0].model.architecture_key()]
    assert all(own[n] == pytest.approx(getattr(alone, n), rel=1e-6) for n in own)
    other = ModelSpec.model_validate({**small[0].model.model_dump(), "layers": 40, "name": "other"})
    moved = fitted.for_model(other).calibration
    for n, before in cal.uncalibrated.items():
        assert getattr(moved, n) == pytest.approx(before * (getattr(cal, n) / before) ** 0.3, rel=1e-9)
    assert "its own runs" in fitted.calibration_scope(small[0].model)
    out = tmp_path / "cal.yaml"
    write_calibrated_profile(Path("hardware_profiles/gpus/H100.yaml"), cal, out)
    assert load_profile(str(out)).calibration == cal
    again, _ = recalibrate([shifted(slow[1], fitted, 1.05)], fitted, fitted_by="again")
    assert again.per_model[fast[0].model.architecture_key()] == cal.per_model[fast[0].model.architecture_key()]
    twice = prof.model_copy(update={"calibration": again})
    err = abs(predict([slow[1]], twice)[0] / (slow[1].step_time_s * 1.0) - 1)
    assert 0.02 < err < 0.08   # the 8B now meets the 5% slower run, its other layouts follow


def test_more_runs_fit_more_factors_shrunk_towards_the_profile():
    prof = load_profile("H100")
    cases, _ = load_cases(CSV)
    rows = [c for c in cases if c.source_id.startswith("DGXC") and c.gpu_type == "H100"][:5]
    from costmodel.validate import measurements_for

    ms = measurements_for(rows)
    exact = [dataclasses.replace(m, step_time_s=float(predict([m], prof)[0])) for m in ms]
    cal, rep = recalibrate(exact, prof, fitted_by="test")
    assert len(rep["factors"]) == 3
    # runs the profile already predicts exactly leave its factors where they are
    for n in rep["factors"]:
        assert getattr(cal, n) == pytest.approx(getattr(prof.calibration, n), rel=0.02)
    slow = [shifted(m, prof, 1.25) for m in ms]
    cal, rep = recalibrate(slow, prof, fitted_by="test")
    assert rep["mape_before"] == pytest.approx(20.0, abs=0.1) and rep["mape_after"] < 4.0


def test_one_run_cv_recovers_a_level_shift():
    """Rows whose published time is the shipped prediction x 1.2 (a stack 20% slower): calibrating on the first
    run of each group predicts the others to within a few percent; before, every row is 16.7% off. Another
    model gets 20% of the update (OTHER_MODELS_WEIGHT, in log space: x 1.2^0.2, 13.6% off), all of it with
    weight 1."""
    cases, _ = load_cases(CSV)
    pick = [c for c in cases if c.source_id.startswith("DGXC") and c.model.name in ("Llama3.1-8B", "Llama3.1-70B")]
    slow = [dataclasses.replace(c, published_step_time_s=predict_case(c)["predicted_step_time_s"] * 1.2) for c in pick]
    r = one_run_calibration_cv(slow)
    assert r["same_model"]["count"] == len(pick) - 2
    assert r["same_model"]["before"]["mape"] == pytest.approx(100 / 6, abs=0.05)
    assert r["same_model"]["mape"] < 3.0
    assert r["other_models"]["count"] == len(pick)     # each model's first run predicts the other model's rows
    assert 12.5 < r["other_models"]["mape"] < 15.0
    assert {g["model"] for g in r["same_model"]["groups"]} == {"Llama3.1-8B", "Llama3.1-70B"}
    # Per release: the 70B rows split over two releases make three groups, with one more anchor.
    assert r["same_release"]["count"] == r["same_model"]["count"] and r["same_release"]["mape"] < 3.0
    big = [i for i, c in enumerate(slow) if c.model.name == "Llama3.1-70B"]
    assert len(big) >= 4
    split = [dataclasses.replace(c, release="other") if i in big[-2:] else c for i, c in enumerate(slow)]
    by_release = one_run_calibration_cv(split)["same_release"]
    assert by_release["count"] == len(pick) - 3
    assert sorted((g["release"], g["model"]) for g in by_release["groups"]) == sorted(
        {(c.release, c.model.name) for c in split})
    # Other models inside one release: each (source, release, GPU) with both models pairs every model's first
    # run with the other model's rows there; the release holding only moved 70B rows drops out.
    stacks: dict = {}
    for c in split:
        stacks.setdefault((c.source_id, c.release, c.gpu_type), []).append(c.model.name)
    pairs = sum(len(names) for names in stacks.values() if len(set(names)) == 2)
    in_release = one_run_calibration_cv(split)["other_models_same_release"]
    assert in_release["count"] == pairs > 0
    assert {g["release"] for g in in_release["groups"]} == {k[1] for k, v in stacks.items() if len(set(v)) == 2}
    assert "other" not in {g["release"] for g in in_release["groups"]}
    assert 12.5 < in_release["mape"] < 15.0
    # One calibration on both models' first runs predicts each model's other runs as well as one per model.
    assert r["same_model_one_file"]["count"] == r["same_model"]["count"]
    assert r["same_model_one_file"]["mape"] == pytest.approx(r["same_model"]["mape"], abs=0.05)
    whole = one_run_calibration_cv(slow, other_models_weight=1.0)
    assert whole["other_models"]["mape"] < 5.0 and whole["same_model"]["mape"] == r["same_model"]["mape"]


# ---- plan calibrate and --profile end to end ------------------------------------------------------------

def one_row_csv(tmp_path: Path, match) -> tuple[Path, int]:
    """The published-runs CSV header and the first scored row that ``match(row)`` accepts, and that row's
    index in the full file (``plan validate``'s row number)."""
    reader = csv.DictReader(io.StringIO(CSV.read_text()))
    i, row = next((i, r) for i, r in enumerate(reader) if r["scored"] == "true" and match(r))
    return write_rows(tmp_path / "RUNS.csv", [row]), i


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_calibrate_on_one_csv_row_then_validate_with_the_profile(tmp_path, capsys):
    runs, row = one_row_csv(tmp_path, lambda r: r["source_id"].startswith("DGXC") and r["gpu_type"] == "H100")
    cal = tmp_path / "CAL.yaml"
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", str(runs), "--profile", "H100", "--out", str(cal),
                                  "--json"])
    assert rc == 0
    rep = json.loads(out)
    assert rep["measurements"] == 1 and len(rep["factors"]) == 1
    assert rep["inputs"][0]["kind"] == "published-runs CSV"
    assert rep["mape_after"] < 1.5
    from costmodel.trust import CALIBRATED_KEY, intervals_data

    assert rep[CALIBRATED_KEY] == intervals_data()[CALIBRATED_KEY] < 1.0   # what the measured model's intervals get
    prof = load_profile(str(cal))
    assert prof.name == "H100" and "plan calibrate on 1 measured run" in prof.calibration.fitted_by
    base, after = tmp_path / "base.json", tmp_path / "after.json"
    assert main(["validate", str(CSV), "--json", str(base)]) == 0
    assert main(["validate", str(CSV), "--profile", str(cal), "--json", str(after)]) == 0
    capsys.readouterr()
    b, a = json.loads(base.read_text()), json.loads(after.read_text())
    changed = {r0["gpu_type"] for r0, r1 in zip(b["rows"], a["rows"])
               if r0["predicted_step_time_s"] != r1["predicted_step_time_s"]}
    assert changed == {"H100"}
    anchor0 = next(r for r in b["rows"] if r["row"] == row)
    anchor = next(r for r in a["rows"] if r["row"] == row)
    err = lambda r: abs(r["predicted_step_time_s"] / r["published_step_time_s"] - 1)  # noqa: E731
    assert err(anchor) < 0.01 and err(anchor) < err(anchor0)   # the run calibrated on is met
    assert anchor["predicted_step_time_s"] == pytest.approx(rep["runs"][0]["after_s"], rel=1e-6)
    assert a["profile"] == {"H100": str(cal)}
    # The calibrated model's rows get the interval of a calibrated prediction: the shipped widths times
    # intervals.json's calibrated_width_factor (0.7); other models' rows keep theirs.
    from costmodel.trust import CALIBRATED_KEY, intervals_data

    width = lambda r: math.log(r["predicted_p90_step_time_s"] / r["predicted_p10_step_time_s"])  # noqa: E731
    cases = {c.row: c for c in load_cases(CSV)[0]}
    key = cases[row].model.architecture_key()
    measured = {r["row"] for r in a["rows"]
                if r["gpu_type"] == "H100" and cases[r["row"]].model.architecture_key() == key}
    assert 2 <= len(measured) < sum(r["gpu_type"] == "H100" for r in a["rows"])
    for r0, r1 in zip(b["rows"], a["rows"]):
        if r1["predicted_p10_step_time_s"] is None:
            continue
        k = intervals_data()[CALIBRATED_KEY] if r1["row"] in measured else 1.0
        assert width(r1) == pytest.approx(k * width(r0), rel=1e-9), r1["row"]


def test_calibrate_on_a_log_and_plan_with_the_profile(tmp_path, capsys):
    cal = tmp_path / "h100_mine.yaml"
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", str(LOG), "--profile", "H100", "--out", str(cal),
                                  "--json"])
    assert rc == 0
    rep = json.loads(out)
    from costmodel.catalog import catalog

    # The logged model is the catalog's 8b, so the plans below get the update in full.
    assert rep["measured_models"] == [catalog()["8b"].architecture_key()] and rep["other_models_weight"] == 0.3
    assert catalog()["8b"].model_copy(update={"vocab": 128512}).architecture_key() == rep["measured_models"][0]
    assert rep["inputs"][0]["iterations_skipped"] == [1, 2, 3]
    assert rep["runs"][0]["measured_s"] == pytest.approx(statistics.median(LOGGED_MS[3:]) / 1e3)
    assert rep["runs"][0]["after_s"] == pytest.approx(rep["runs"][0]["measured_s"], rel=0.015)
    args = ["check", "--model", "8b", "--cluster", "h100x512", "--tp", "2", "--json"]
    rc, shipped, _ = run_cli(capsys, args)
    rc2, mine, _ = run_cli(capsys, args + ["--profile", str(cal)])
    assert rc == rc2 == 0
    t0, t1 = (json.loads(x)["estimate"]["step_time_s"] for x in (shipped, mine))
    assert "calibration" not in json.loads(shipped)
    assert json.loads(mine)["calibration"].endswith("the update applies in full to 8b")
    rc, other, _ = run_cli(capsys, ["check", "--model", "70b", "--cluster", "h100x512", "--tp", "8", "--pp", "4",
                                    "--json", "--profile", str(cal)])
    assert json.loads(other)["calibration"].endswith("70b gets 30% of that update")
    shift = rep["runs"][0]["after_s"] / rep["runs"][0]["before_s"]   # what calibration did to the logged run
    assert abs(shift - 1) > 0.02
    assert t1 / t0 == pytest.approx(shift, abs=0.5 * abs(shift - 1))   # ... it does to a similar layout
    rc, out, _ = run_cli(capsys, ["whatif", "--model", "8b", "--cluster", "h100x512", "--vary", "gpu=H100,B200",
                                  "--profile", str(cal), "--json"])
    rc0, out0, _ = run_cli(capsys, ["whatif", "--model", "8b", "--cluster", "h100x512", "--vary", "gpu=H100,B200",
                                    "--json"])
    p1, p0 = json.loads(out)["points"], json.loads(out0)["points"]
    assert p1[0]["wall_time_days"] / p0[0]["wall_time_days"] == pytest.approx(shift, abs=0.5 * abs(shift - 1))
    assert p1[1]["wall_time_days"] == pytest.approx(p0[1]["wall_time_days"])   # B200: shipped

    # Tables name the calibrated GPU by its profile and file, not the file's whole path.
    rc, table, _ = run_cli(capsys, ["--model", "8b", "--cluster", "h100x512", "--top", "1", "--profile", str(cal)])
    assert rc == 0 and "(512 x H100 (h100_mine.yaml))" in " ".join(table.split()) and str(tmp_path) not in table
    rc, table, _ = run_cli(capsys, ["whatif", "--model", "8b", "--cluster", "h100x512", "--vary", "gpus=256,512",
                                    "--profile", str(cal)])
    assert rc == 0 and "H100 (h100_mine.yaml)" in table and str(tmp_path) not in table

def test_calibrate_leaves_out_rows_that_publish_no_step_time(tmp_path, capsys):
    """A CSV row with only a TFLOP/s figure measures nothing to fit to: plan calibrate leaves it out and says
    so; a CSV with no other row of the GPU is a one-line error naming step_time_s, and nothing is written."""
    reader = csv.DictReader(io.StringIO(CSV.read_text()))
    row = next(r for r in reader if r["scored"] == "true" and r["source_id"].startswith("DGXC")
               and r["gpu_type"] == "H100")
    timeless = {**row, "step_time_s": "", "measured_metric": "model_tflops_per_gpu", "measured_value": "500"}
    both = write_rows(tmp_path / "both.csv", [row, timeless])
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", str(both), "--profile", "H100", "--out",
                                  str(tmp_path / "cal.yaml"), "--json"])
    rep = json.loads(out)
    assert rc == 0 and rep["measurements"] == 1 and rep["inputs"][0]["rows_without_step_time"] == [1]
    only = write_rows(tmp_path / "only.csv", [timeless])
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(only), "--profile", "H100", "--out",
                                  str(tmp_path / "none.yaml")])
    assert rc == 2 and err.count("\n") == 1 and "field 'step_time_s': no row on H100 gives a step time" in err
    assert not (tmp_path / "none.yaml").exists()


def test_calibrate_leaves_out_rows_of_its_gpu_that_cannot_be_read(tmp_path, capsys):
    """One unreadable row of the profile's GPU used to fail the whole file (the blind harness's RUNS.csv then
    left no calibrated profile at all): it is left out and named, the other rows calibrate; a file with no
    readable row of the GPU is the first row's one-line error, and nothing is written."""
    reader = csv.DictReader(io.StringIO(CSV.read_text()))
    row = next(r for r in reader if r["scored"] == "true" and r["source_id"].startswith("DGXC")
               and r["gpu_type"] == "H100")
    broken = {**row, "tp": "x"}
    both = write_rows(tmp_path / "both.csv", [row, broken])
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", str(both), "--profile", "H100", "--out",
                                  str(tmp_path / "cal.yaml"), "--json"])
    rep = json.loads(out)
    assert rc == 0 and rep["measurements"] == 1 and rep["inputs"][0]["other_gpu_rows"] == 0
    assert rep["inputs"][0]["rows_not_read"] == [
        {"row": 1, "error": f"{both}: row 1: column 'tp': expected a positive integer, got 'x'"}]
    only = write_rows(tmp_path / "only.csv", [broken, {**broken, "pp": "y"}])
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(only), "--profile", "H100", "--out",
                                  str(tmp_path / "none.yaml")])
    assert rc == 2 and err.count("\n") == 1, err
    assert "row 0: column 'tp': expected a positive integer, got 'x' (and 1 more row(s) on H100)" in err
    assert not (tmp_path / "none.yaml").exists()


def test_bad_profiles_and_measurements_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: H100\nsources: [\n")
    rc, _, err = run_cli(capsys, ["validate", str(CSV), "--profile", str(bad)])
    assert rc == 2 and err.count("\n") == 1 and "bad.yaml: line" in err and "malformed YAML" in err
    other = tmp_path / "mygpu.yaml"
    data = yaml.safe_load((ROOT / "hardware_profiles" / "gpus" / "H100.yaml").read_text())
    other.write_text(yaml.safe_dump({**data, "name": "MyGPU", "aliases": []}))
    rc, _, err = run_cli(capsys, ["validate", str(CSV), "--profile", str(other)])
    assert rc == 2 and err.count("\n") == 1 and "profile MyGPU is not a shipped GPU type" in err
    cal = tmp_path / "cal.yaml"
    assert main(["calibrate", "--measurements", str(LOG), "--profile", "H100", "--out", str(cal), "--json"]) == 0
    capsys.readouterr()
    rc, _, err = run_cli(capsys, ["--model", "8b", "--cluster", "b200x1024", "--profile", str(cal)])
    assert rc == 2 and err.count("\n") == 1 and "profile H100 is not a GPU type of the cluster (B200)" in err
    runs, _ = one_row_csv(tmp_path, lambda r: r["gpu_type"] == "B200")
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(runs), "--profile", "H100", "--out",
                                  str(tmp_path / "x.yaml")])
    assert rc == 2 and err.count("\n") == 1 and "field 'gpu_type': no scored row on H100" in err
    assert "GPU types there: B200" in err
    assert not (tmp_path / "x.yaml").exists()
    # A scored row that cannot be read (a GPU type no profile has) is named as the reason, not "no scored rows".
    lone = write_rows(tmp_path / "L40S.csv", [{**next(csv.DictReader(io.StringIO(CSV.read_text()))),
                                               "gpu_type": "L40S", "scored": "true"}])
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(lone), "--profile", "H100", "--out",
                                  str(tmp_path / "x.yaml")])
    assert rc == 2 and err.count("\n") == 1 and "GPU types there: none readable (1 scored row(s) could not be " \
        "read; the first: " in err and "unknown GPU type 'L40S'" in err
    broken = tmp_path / "broken.log"
    broken.write_text(edit(log_text(), "seq_length", None))
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(broken), "--profile", "H100", "--out",
                                  str(tmp_path / "y.yaml")])
    assert rc == 2 and err.count("\n") == 1 and "broken.log: field 'seq_length'" in err
    rc, _, err = run_cli(capsys, ["calibrate", "--measurements", str(LOG), "--profile", "B200", "--out",
                                  str(tmp_path / "z.yaml"), "--gpu", "H100"])
    assert rc == 2 and "the run is on H100 but --profile is B200" in err


def test_choose_one_run_support_prints_a_dash_for_a_figure_without_pairs():
    """scripts/choose_one_run_support.py on a subset of sources where a figure has no pairs (no release groups,
    no second model) prints a dash for it instead of failing on the missing MAPE."""
    from script_module import load_script

    mod = load_script("choose_one_run_support")
    assert mod._cell({"count": 0, "mape": None, "median_ape": None}) == "- (0)"
    assert mod._cell({"count": 12, "mape": 7.754, "median_ape": 4.5}) == "  7.75 /  4.50 (12)"


def test_one_run_cv_scores_repeats_of_the_anchor_and_their_drift_floor():
    """A group whose later rows repeat the anchor's configuration, published 10% slower by another release:
    same_config holds exactly those pairs, and its floor (the anchor's own step time as their prediction) is
    the 9.09% drift (1 - 1/1.1), which no one-run calibration removes; the pooled figure keeps the floor."""
    from costmodel.crossval import pool_one_run

    cases, _ = load_cases(CSV)
    a = next(c for c in cases if c.source_id.startswith("DGXC") and c.model.name == "Llama3.1-70B")
    t = predict_case(a)["predicted_step_time_s"]
    other = next(c for c in cases if c.source_id == a.source_id and c.model.name == a.model.name and c.plan != a.plan)
    rows = [dataclasses.replace(a, published_step_time_s=t),
            dataclasses.replace(a, row=10_001, release="later", published_step_time_s=t * 1.1),
            dataclasses.replace(a, row=10_002, release="later", published_step_time_s=t * 1.1),
            dataclasses.replace(other, published_step_time_s=predict_case(other)["predicted_step_time_s"])]
    r = one_run_calibration_cv(rows)
    assert r["same_model"]["count"] == 3 and r["same_config"]["count"] == 2
    assert r["same_config"]["floor"]["mape"] == pytest.approx(100 / 11, abs=0.01)
    # Calibrated on the anchor (met exactly), the repeats are off by the same drift.
    assert r["same_config"]["mape"] == pytest.approx(100 / 11, abs=0.2)
    pooled = pool_one_run([r, r])
    assert pooled["same_config"]["count"] == 4 and pooled["same_config"]["floor"]["mape"] == pytest.approx(100 / 11,
                                                                                                            abs=0.01)
    assert "groups" not in pooled["same_config"] and pooled["same_model"]["count"] == 6


def test_pooled_one_run_figures_split_by_held_out_source_and_average_the_sources_alike():
    """With the held-out source of each result named, every figure carries each source's own MAPE and their
    mean, which weighs a source with few pairs like one with many (the pooled MAPE weighs the pairs); a source
    without pairs in a figure is left out of it, and the by-source table prints one row a source and the mean."""
    from costmodel.crossval import pool_one_run
    from planner.report import one_run_source_table

    def result(apes: list[float]) -> dict:
        fig = {"ape": apes, "ape_before": apes, "groups": []}
        return {key: dict(fig) for key in ("same_model", "same_model_one_file", "same_release", "other_models",
                                            "other_models_same_release")} | {
            "same_config": {"ape": [], "ape_before": [], "floor": {"ape": []}}}

    pooled = pool_one_run([result([2.0, 4.0]), result([10.0] * 8), result([])], sources=["A", "B", "C"])
    sm = pooled["same_model"]
    assert sm["mape"] == pytest.approx(8.6) and sm["count"] == 10          # 86 / 10 pairs
    assert sm["per_source"] == {"A": {"count": 2, "mape": 3.0, "median_ape": 3.0},
                                "B": {"count": 8, "mape": 10.0, "median_ape": 10.0}}
    assert sm["source_mean_mape"] == pytest.approx(6.5)                    # (3 + 10) / 2, C has no pairs
    assert pooled["same_config"]["per_source"] == {} and pooled["same_config"]["source_mean_mape"] is None
    assert "per_source" not in pool_one_run([result([1.0])])["same_model"]  # sources not named: no split
    with pytest.raises(ValueError):
        pool_one_run([result([1.0])], sources=["A", "B"])
    table = one_run_source_table(pooled)
    cells = {c.header: list(c.cells) for c in table.columns}
    assert cells["source"] == ["A", "B", "mean of sources"]
    assert cells["same model"] == ["3.0 (2)", "10.0 (8)", "6.5"]
    assert cells["repeats"] == ["-", "-", "-"]
    assert one_run_source_table(pool_one_run([result([1.0])])) is None


H200 = ROOT / "examples" / "gpu_check_h200"


def test_two_micro_batch_sizes_of_one_layout_pin_down_the_host_time(tmp_path, capsys):
    """examples/gpu_check_h200: one H200 ran the 1.1B plan at micro-batch 1 (2.15 s) and 4 (1.19 s); the
    freshly measured profile predicts 0.93 s for both. The pair fits layer_overhead_s beside one token-scaled
    factor, both runs come within 1%, and the re-plan moves off micro-batch 1. One of the runs alone fits one
    factor and no host time."""
    cal = tmp_path / "h200-cal.yaml"
    runs = [str(H200 / "3_fitted_curve" / f"run_mb{mb}") for mb in (1, 4)]
    common = ["--profile", str(H200 / "3_fitted_curve" / "gpu.yaml"),
              "--cluster", str(H200 / "3_fitted_curve" / "cluster.yaml"), "--json"]
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", *runs, "--out", str(cal), *common])
    assert rc == 0
    rep = json.loads(out)
    assert rep["factors"] == ["gemm_efficiency", "layer_overhead_s"]
    assert 0.5e-3 < rep["values"]["layer_overhead_s"] < 1.2e-3
    assert [r["before_s"] for r in rep["runs"]] == [pytest.approx(0.928, abs=0.005)] * 2
    for r in rep["runs"]:
        assert r["after_s"] == pytest.approx(r["measured_s"], rel=0.01)
    rc, out, _ = run_cli(capsys, ["--model", str(H200 / "model_config.json"), "--cluster",
                                  str(H200 / "3_fitted_curve" / "cluster.yaml"), "--profile", str(cal),
                                  "--global-batch", "32", "--json"])
    assert rc == 0 and json.loads(out)["plans"][0]["plan"]["micro_batch"] >= 4
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", runs[0], "--out", str(tmp_path / "one.yaml"),
                                  *common])
    assert rc == 0 and json.loads(out)["factors"] == ["gemm_efficiency"]


def test_measured_peak_memory_calibrates_the_activations(tmp_path, capsys):
    """The same two H200 runs measured 23.2 and 37.1 GiB at their peak (CUDA allocator); the model counts
    20.8 and 28.5 GiB, 2% off in weights and optimizer state and 1.9x off in the activations of the local
    layer spec. plan calibrate fits activation_memory to them, and the calibrated profile predicts both
    peaks within 2%; a synthetic run set made with a known multiplier gets it back."""
    from costmodel.recalibrate import fit_activation_memory
    from executor.calibrate import load_measurement

    runs = [str(H200 / "3_fitted_curve" / f"run_mb{mb}") for mb in (1, 4)]
    cal = tmp_path / "h200-cal.yaml"
    rc, out, _ = run_cli(capsys, ["calibrate", "--measurements", *runs, "--out", str(cal), "--profile",
                                  str(H200 / "3_fitted_curve" / "gpu.yaml"), "--cluster",
                                  str(H200 / "3_fitted_curve" / "cluster.yaml"), "--json"])
    assert rc == 0
    mem = json.loads(out)["memory"]
    assert mem["runs"] == 2 and 1.7 < mem["value"] < 2.0
    assert mem["mape_before"] > 10 and mem["mape_after"] < 2
    prof = load_profile(str(cal))
    assert prof.calibration.activation_memory == pytest.approx(mem["value"], rel=1e-3)
    cluster_file = H200 / "3_fitted_curve" / "cluster.yaml"
    from costmodel.profiles import load_cluster

    ms = [load_measurement(r, load_cluster(cluster_file)) for r in runs]
    assert [m.peak_memory_bytes / 2**30 for m in ms] == [pytest.approx(23.23, abs=0.01), pytest.approx(37.13, abs=0.01)]
    peaks = predict(ms, prof, what="peak_memory_bytes")
    assert list(peaks / [m.peak_memory_bytes for m in ms]) == [pytest.approx(1.0, abs=0.02)] * 2
    # a known multiplier comes back; runs without a measured peak leave the profile as it is
    base = load_profile(str(H200 / "3_fitted_curve" / "gpu.yaml"))
    truth = base.model_copy(update={"calibration": base.calibration.model_copy(update={"activation_memory": 1.5})})
    synthetic = [dataclasses.replace(m, peak_memory_bytes=float(p))
                 for m, p in zip(ms, predict(ms, truth, what="peak_memory_bytes"))]
    fitted, rep = fit_activation_memory(synthetic, base)
    assert fitted.calibration.activation_memory == pytest.approx(1.5, rel=1e-3) and rep["mape_after"] < 0.1
    same, empty = fit_activation_memory([dataclasses.replace(m, peak_memory_bytes=None) for m in ms], base)
    assert same is base and empty == {}
