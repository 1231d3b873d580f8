"""Property-based tests of the readers of user files: the cluster loader, the Hugging Face import, the
validation CSV reader, the routing-histogram reader, the Megatron training-log reader and the plan.json reader. Whatever the file holds, the
reader returns a spec or raises the project's own one-line InputError (the CLI's exit 2) -- never another
exception. A spec that loads is then used (a rule check and an estimate, or a validation run), which must not
raise anything else either.

The test suite draws the same examples on every run (derandomized: CI passes or fails on the code, not on the
draw). To search further, draw new ones and more of them:

    FUZZ_RANDOM=1 FUZZ_EXAMPLES=12000 python -m pytest -q tests/test_fuzz_inputs.py

and keep what that finds as a regression test (two CSV-reader and routing-reader failures were found so).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.profiles import InputError, load_cluster
from costmodel.rules import check_plan
from costmodel.specs import ModelSpec
from costmodel.validate import UNEXPECTED
from costmodel.plan import ParallelPlan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Values of every kind a hand-edited file might hold where a number belongs.
scalars = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 7, 8, 64, 72, 2**31, 2**62, 2**63, 2**64, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-30, 1e30, 0.5, 4.0, 50e9, float("inf"), float("nan")]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2))
raw_bytes = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-16")))


def _one_line(exc: InputError) -> None:
    # A plan error lists every violation with its valid values (tests/test_rules.py: 7 of them, 1,104
    # characters); 2,000 still catches a message that quotes a whole file.
    msg = str(exc)
    assert msg and "\n" not in msg and len(msg) < 2000, msg
    assert UNEXPECTED not in msg, msg   # plan validate reports a row it could not read, never a crash of ours


def _read(fn, *args):
    """fn(*args), or None when it raises the project's one-line InputError (anything else fails the test)."""
    try:
        return fn(*args)
    except InputError as exc:
        _one_line(exc)
        return None


def _write(d: Path, name: str, content: str | bytes) -> Path:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    return p


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


_COUNTER = iter(range(10**9))


def _fresh(workdir: Path) -> Path:
    d = workdir / str(next(_COUNTER))
    d.mkdir()
    return d


# Cluster YAML ------------------------------------------------------------------------------------

BASE_CLUSTER = {"gpu": "H100", "nodes": 4, "gpus_per_node": 8, "nvlink_domain_gpus": 8,
                "inter_node": {"nic_bandwidth_bytes_per_s": 50e9, "rails": 8, "latency_s": 5e-6,
                               "oversubscription": 1.0},
                "intra_node": {"bandwidth_bytes_per_s": 450e9},
                "price_per_gpu_hour_usd": 2.5, "storage_bandwidth_bytes_per_s": 100e9}
CLUSTER_FIELDS = ["gpu", "nodes", "gpus_per_node", "nvlink_domain_gpus", "inter_node.nic_bandwidth_bytes_per_s",
                  "inter_node.rails", "inter_node.latency_s", "inter_node.oversubscription",
                  "inter_node.full_bisection_nodes", "intra_node.bandwidth_bytes_per_s", "price_per_gpu_hour_usd", "storage_bandwidth_bytes_per_s",
                  "topology", "device_groups"]
SMALL = ModelSpec(name="fuzz", layers=4, hidden=256, ffn_hidden=1024, heads=4, vocab=1000, seq_len=128)


def _mutate(base: dict, edits: list[tuple[str, object]]) -> dict:
    data = json.loads(json.dumps(base))
    for field, value in edits:
        *path, last = field.split(".")
        node = data
        for k in path:
            node = node.setdefault(k, {}) if isinstance(node.get(k), dict) else node
        if isinstance(node, dict):
            node[last] = value
    return data


def _use_cluster(cluster) -> None:
    """A cluster that loads must price a plain data-parallel plan without a foreign exception."""
    n = cluster.num_gpus
    if cluster.device_groups or n > 2**20:
        return
    _price(SMALL, cluster, ParallelPlan(dp=n, global_batch=n))


def _price(model: ModelSpec, cluster, plan: ParallelPlan) -> None:
    """A plan the rules accept (a refusal must be one line) gets a finite, positive step time."""
    try:
        check_plan(model, plan, cluster.num_gpus)
    except InputError as exc:
        _one_line(exc)
        return
    est = estimate(model, cluster, plan)
    assert math.isfinite(est.step_time_s) and est.step_time_s > 0


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(CLUSTER_FIELDS), values), min_size=1, max_size=4),
       duplicate=st.booleans())
def test_cluster_loader_fields(workdir, edits, duplicate):
    text = yaml.safe_dump(_mutate(BASE_CLUSTER, edits), sort_keys=False)
    if duplicate:
        text += f"nodes: {edits[0][1] if isinstance(edits[0][1], int) else 2}\n"
    p = _write(_fresh(workdir), "c.yaml", text)
    cluster = _read(load_cluster, p)
    if cluster is None:
        return
    assert not duplicate, "a duplicate key was accepted"
    _use_cluster(cluster)


@FUZZ
@given(content=st.one_of(raw_bytes, st.text(max_size=300)))
def test_cluster_loader_any_text(workdir, content):
    p = _write(_fresh(workdir), "c.yaml", content)
    cluster = _read(load_cluster, p)
    if cluster is None:
        return
    _use_cluster(cluster)


# Hugging Face config.json -------------------------------------------------------------------------

LLAMA = json.loads((ROOT / "examples" / "configs" / "llama3-8b" / "config.json").read_text())
MOE = {**LLAMA, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 2048}
HF_FIELDS = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "num_experts",
             "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_only_layers",
             "first_k_dense_replace", "num_nextn_predict_layers", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
             "v_head_dim", "decoder_sparse_step", "text_config", "model_type", "hidden_act"]


def _use_model(model: ModelSpec) -> None:
    from costmodel.profiles import load_cluster as lc

    _price(model, lc("h100x512"), ParallelPlan(dp=512, global_batch=512))


@FUZZ
@given(base=st.sampled_from([LLAMA, MOE]),
       edits=st.lists(st.tuples(st.sampled_from(HF_FIELDS), values), min_size=1, max_size=4))
def test_hf_import_fields(workdir, base, edits):
    data = {**base, **dict(edits)}
    p = _write(_fresh(workdir), "m/config.json", json.dumps(data))
    model = _read(get_model, str(p))
    if model is None:
        return
    _use_model(model)


@FUZZ
@given(content=st.one_of(raw_bytes, st.text(max_size=300), st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                                                                         | st.dictionaries(st.text(max_size=5), c,
                                                                                           max_size=3)).map(json.dumps)))
def test_hf_import_any_text(workdir, content):
    p = _write(_fresh(workdir), "m/config.json", content)
    model = _read(get_model, str(p))
    if model is None:
        return
    _use_model(model)


# Validation CSV ---------------------------------------------------------------------------------

with (ROOT / "data" / "validation" / "published_runs.csv").open(newline="") as _fh:
    _reader = csv.DictReader(_fh)
    CSV_COLUMNS = list(_reader.fieldnames)
    GOOD_ROW = next(r for r in _reader if r["source_id"] == "KORTHIKANTI2022" and r["scored"] == "true")
NUMERIC = ["layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len", "moe_experts", "moe_topk",
           "num_gpus", "gpus_per_node", "tp", "pp", "vp", "cp", "ep", "dp", "global_batch", "micro_batch",
           "step_time_s", "gpu_type", "precision", "recompute", "scored", "params_b", "measured_metric",
           "measured_value", "zero_stage_or_distopt", "framework", "sp"]
cells = st.one_of(st.text(max_size=6), scalars.map(str), st.sampled_from(["", "0", "-1", "nan", "inf", "1e400",
                                                                           "4.5", "unknown", "true", "  8 ",
                                                                           "tokens/s/GPU", "it/s", "step time (ms)",
                                                                           "ZeRO-3", "FSDP", "megatron-lm-2020",
                                                                           "DeepSpeed", "V100", "fp16"]))


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(NUMERIC), cells), min_size=1, max_size=4),
       drop=st.lists(st.sampled_from(CSV_COLUMNS), max_size=2))
def test_csv_reader(workdir, edits, drop):
    from costmodel.validate import validate

    cols = [c for c in CSV_COLUMNS if c not in drop]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerow({**GOOD_ROW, **dict(edits)})
    p = _write(_fresh(workdir), "runs.csv", buf.getvalue())
    result = _read(validate, p)
    if result is None:
        return
    assert not [r["error"] for r in result["rows"] if UNEXPECTED in (r.get("error") or "")]
    overall = result["summary"]["overall"]
    if overall["predicted"] == 0:   # a row without a step time is predicted, not scored
        assert overall["unscored"] == 1 and overall["mape"] is None, overall
        return
    assert overall["predicted"] == 1 and math.isfinite(overall["mape"]), overall


@pytest.mark.parametrize("edits, error", [
    # Found by FUZZ_RANDOM=1 FUZZ_EXAMPLES=20000 (2026-12-07): each was an "unexpected" row error (an overflow in
    # the reader, an int64 overflow in the memory model, an infinite error) and is now a one-line input error or
    # a model read as its columns give it.
    ({"moe_experts": "inf"}, "column 'moe_experts': expected an integer >= 0, got 'inf'"),
    ({"step_time_s": "2.2250738585e-313"}, "column 'step_time_s': expected a step time in seconds, 1e-06 to 1e+06"),
    ({"ffn_hidden": "", "params_b": "442721857770.0"}, None)])
def test_csv_reader_found_by_fuzzing(workdir, edits, error):
    from costmodel.validate import validate

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    w.writeheader()
    w.writerow({**GOOD_ROW, **edits})
    p = _write(_fresh(workdir), "runs.csv", buf.getvalue())
    if error is None:   # a size no ffn width can give: the model as its columns read (4h), predicted
        row = validate(p)["rows"][0]
        assert row["error"] is None and math.isfinite(row["predicted_step_time_s"])
        assert "ffn_hidden=4h" in row["assumed"]
        return
    with pytest.raises(InputError) as exc:
        validate(p)
    _one_line(exc.value)
    assert error in str(exc.value)


@FUZZ
@given(content=st.one_of(raw_bytes, st.text(max_size=300)))
def test_csv_reader_any_text(workdir, content):
    from costmodel.validate import validate

    p = _write(_fresh(workdir), "runs.csv", content)
    result = _read(validate, p)
    if result is None:
        return
    assert math.isfinite(result["summary"]["overall"]["mape"])


# Routing histogram ------------------------------------------------------------------------------

QWEN = get_model("qwen3-30b-a3b")
histograms = st.one_of(
    st.lists(st.lists(scalars, min_size=0, max_size=130), max_size=3),
    st.lists(st.integers(0, 2**70), min_size=QWEN.num_experts, max_size=QWEN.num_experts),
    st.lists(st.floats(0, 1e308), min_size=QWEN.num_experts, max_size=QWEN.num_experts).map(lambda r: [r]),
    values,
)


@FUZZ
@given(hist=histograms, wrap=st.booleans(), suffix=st.sampled_from([".json", ".yaml", ".txt"]),
       raw=st.one_of(st.none(), raw_bytes))
def test_routing_reader(workdir, hist, wrap, suffix, raw):
    from planner.routing import load_routing

    body = {"moe_routing_histogram": hist} if wrap else hist
    content = raw if raw is not None else (json.dumps(body) if suffix != ".yaml" else yaml.safe_dump(body))
    p = _write(_fresh(workdir), f"summary{suffix}", content)
    routing = _read(load_routing, str(p), QWEN)
    if routing is None:
        return
    load = routing.load(8)
    assert math.isfinite(load.time_factor) and load.time_factor >= 1 - 1e-9


# plan.json --------------------------------------------------------------------------------------

TINY = get_model("tiny-gpt")
GOOD_PLAN = {"model": json.loads(TINY.model_dump_json()), "cluster": {},
             "plan": json.loads(ParallelPlan(global_batch=8).model_dump_json())}
PLAN_FIELDS = [f"plan.{k}" for k in ParallelPlan.model_fields] + [f"model.{k}" for k in ModelSpec.model_fields] + [
    "model", "plan"]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PLAN_FIELDS), values), max_size=3),
       drop=st.lists(st.sampled_from(PLAN_FIELDS), max_size=2),
       raw=st.one_of(st.none(), raw_bytes, st.text(max_size=50), values.map(json.dumps)))
def test_plan_json_reader(workdir, edits, drop, raw):
    from executor.launch import REQUIRED_PLAN_FIELDS, read_plan

    data = _mutate(GOOD_PLAN, edits)
    for field in drop:
        section, _, key = field.partition(".")
        if key and isinstance(data.get(section), dict):
            data[section].pop(key, None)
        elif not key:
            data.pop(section, None)
    p = _write(_fresh(workdir), "plan.json", raw if raw is not None else json.dumps(data))
    loaded = _read(read_plan, p)
    if loaded is None:
        return
    model, plan = loaded
    assert raw is None or isinstance(json.loads(raw), dict)
    stated = data["plan"] if raw is None else json.loads(raw)["plan"]
    assert all(k in stated for k in REQUIRED_PLAN_FIELDS)
    assert plan.tp == stated["tp"] and plan.global_batch == stated["global_batch"]


# Megatron training log (plan calibrate --measurements train.log) ----------------------------------------

LOG = (ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
LOG_LINES = LOG.splitlines()
LOG_ARGS = ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "seq_length", "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "micro_batch_size", "global_batch_size", "num_experts", "moe_router_topk", "recompute_granularity",
            "virtual_pipeline_model_parallel_size", "log_interval", "fp8", "bf16", "data_parallel_size",
            "expert_model_parallel_size", "kv_channels", "use_distributed_optimizer"]
ITER_FIELDS = ["elapsed time per iteration (ms)", "global batch size", "throughput per GPU (TFLOP/s/GPU)"]


def _log_edit(text: str, name: str, value: str) -> str:
    """The log with argument ``name``'s value (dump line) or iteration field ``name`` (every iteration line)
    replaced by ``value``; an argument the log does not print is appended to the dump."""
    import re

    if name in ITER_FIELDS:
        return re.sub(rf"({re.escape(name)}:)\s*[^|]*", lambda m: f"{m.group(1)} {value} ", text)
    line = re.compile(rf"^(\s*{name} \.+ ).*$", re.M)
    if line.search(text):
        return line.sub(lambda m: m.group(1) + value, text)
    return text.replace("-------------------- end of arguments", f"  {name} {'.' * 20} {value}\n"
                        "-------------------- end of arguments", 1)


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(LOG_ARGS + ITER_FIELDS), cells), min_size=1, max_size=4),
       drop=st.lists(st.integers(0, len(LOG_LINES) - 1), max_size=6), warmup=st.integers(-2, 40))
def test_training_log_reader(workdir, edits, drop, warmup):
    from costmodel.runlog import parse_megatron_log

    text = "\n".join(ln for i, ln in enumerate(LOG_LINES) if i not in set(drop))
    for name, value in edits:
        text = _log_edit(text, name, value.replace("\n", " "))
    run = _read(lambda: parse_megatron_log(text, "train.log", gpu="H100", warmup_iterations=warmup))
    if run is None:
        return
    m = run.measurement
    assert math.isfinite(m.step_time_s) and m.step_time_s > 0 and run.iterations
    _price(m.model, m.cluster, m.plan)


NEMO_LINES = ["Epoch 0: : 5/100 [01:02<19:40, reduced_train_loss=9.870, global_step=4.000, consumed_samples=640.0, "
              "train_step_timing in s=12.10]", "global_step=1e400 train_step_timing in s=.5",
              "global_step=7 train_step_timing in s=1e400", "global_step=. train_step_timing in s=3"]


@FUZZ
@given(content=st.one_of(st.text(max_size=400),
                         st.lists(st.sampled_from(LOG_LINES + NEMO_LINES), max_size=40).map("\n".join)))
def test_training_log_reader_any_text(content):
    from costmodel.runlog import parse_megatron_log

    run = _read(lambda: parse_megatron_log(content, "train.log", gpu="H100"))
    if run is not None:
        _price(run.measurement.model, run.measurement.cluster, run.measurement.plan)


# Calibrated profile YAML (--profile FILE) ----------------------------------------------------------------

H100_PROFILE = yaml.safe_load((ROOT / "hardware_profiles" / "gpus" / "H100.yaml").read_text())
CAL_FIELDS = ["calibration.gemm_efficiency", "calibration.fp8_gemm_efficiency", "calibration.moe_overhead",
              "calibration.comm_exposed", "calibration.memory_bound_efficiency", "calibration.attention_efficiency",
              "calibration.a2a_time", "calibration.layer_overhead_s", "calibration.other_models_weight",
              "calibration.other_kind_weight", "calibration.measured_kinds",
              "calibration.measured_models", "calibration.uncalibrated", "calibration.per_model",
              "calibration.uncalibrated.gemm_efficiency", "memory_bytes.value", "hbm_bandwidth_bytes_per_s.value",
              "peak_flops.bf16.value", "usable_memory_fraction", "nvlink_bandwidth_bytes_per_s.value", "name"]
DENSE_KEY, MOE_KEY = get_model("8b").architecture_key(), get_model("mixtral-8x7b").architecture_key()
per_model_values = st.dictionaries(st.sampled_from([DENSE_KEY, MOE_KEY, "x"]),
                                   st.dictionaries(st.sampled_from(["gemm_efficiency", "moe_overhead", "comm_exposed",
                                                                    "fitted_by", "per_model", "nope"]), scalars,
                                                   max_size=3), max_size=2)


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(CAL_FIELDS), st.one_of(values, per_model_values)), min_size=1,
                      max_size=4),
       measured=st.booleans())
def test_calibrated_profile_reader(workdir, edits, measured):
    from costmodel.profiles import load_profile

    base = json.loads(json.dumps(H100_PROFILE))
    if measured:   # as plan calibrate writes it: measured on the 8B, 30% to other dense bf16 models, 10% to others
        base["calibration"].update(measured_models=[DENSE_KEY], measured_kinds=["dense/bf16"], other_models_weight=0.3,
                                   other_kind_weight=0.1,
                                   uncalibrated={"gemm_efficiency": base["calibration"].get("gemm_efficiency", 1.0)})
    p = _write(_fresh(workdir), "cal.yaml", yaml.safe_dump(_mutate(base, edits), sort_keys=False))
    prof = _read(load_profile, str(p))
    if prof is None:
        return
    from costmodel.profiles import load_cluster as lc

    for name in ("8b", "mixtral-8x7b"):
        model = get_model(name).model_copy(update={"layers": 4})
        est = estimate(model, lc("h100x512"), ParallelPlan(tp=8, dp=64, global_batch=64), profile=prof)
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0


# plan check arguments through the CLI --------------------------------------------------------------

arg_values = st.one_of(st.integers(-3, 2**70).map(str), st.sampled_from(["0", "1", "2", "8", "-1", "1.5", "nan",
                                                                          "inf", "", "x", str(2**63)]))


@settings(max_examples=int(os.environ.get("FUZZ_CLI_EXAMPLES", "100")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(opts=st.dictionaries(st.sampled_from(["--tp", "--pp", "--vpp", "--cp", "--dp", "--ep", "--micro-batch",
                                             "--global-batch", "--seq-len", "--recompute-layers"]),
                            arg_values, min_size=1, max_size=3))
def test_plan_check_arguments(capsys, opts):
    from planner.cli import main

    argv = ["check", "--model", "8b", "--cluster", "h100x512"] + [x for kv in opts.items() for x in kv]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), (argv, rc)
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("plan: error:"), (argv, err)
