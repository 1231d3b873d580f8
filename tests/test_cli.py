"""The ``plan`` command in-process: bad input fails with exit code 2 and one line on stderr naming the
file and/or field (never a traceback); ``plan validate`` scores the published runs; the search
returns a plan that uses the whole cluster and fits; JSON output is written atomically."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "data" / "validation" / "published_runs.csv"
ROW_KEYS = {"row", "source_id", "predicted_step_time_s", "published_step_time_s", "predicted_peak_memory_bytes",
            "fits", "error"}


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> str:
    """Exit code 2, exactly one non-empty line on stderr, no traceback, mentioning every needle."""
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert "Traceback" not in err
    line = lines[0]
    assert line.startswith("plan: error:"), line
    for n in needles:
        assert n in line, f"{n!r} not in {line!r}"
    return line


def _published_rows() -> list[dict[str, str]]:
    with PUBLISHED.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write_csv(path: Path, rows: list[dict[str, str]], fieldnames: list[str]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fieldnames, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def _good_row() -> dict[str, str]:
    """A scored row that predicts cleanly: Korthikanti 2022, 22B, SP + selective recompute."""
    return next(r for r in _published_rows()
                if r["source_id"] == "KORTHIKANTI2022" and r["scored"] == "true" and r["model_name"].startswith("22B")
                and r["recompute"] == "selective")


# ---- bad input ------------------------------------------------------------------------------------

def test_unknown_model(capsys):
    rc, _, err = run_cli(capsys, ["--model", "no-such-model-9t", "--cluster", "h100x512"])
    assert_one_line_error(rc, err, "no-such-model-9t")


def test_unknown_cluster_file(capsys, tmp_path):
    missing = tmp_path / "missing-cluster.yaml"
    rc, _, err = run_cli(capsys, ["--model", "70b", "--cluster", missing])
    assert_one_line_error(rc, err, "missing-cluster.yaml")


def test_malformed_cluster_yaml(capsys, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: broken\ngpu: [H100\nnodes: 2\n")
    rc, _, err = run_cli(capsys, ["--model", "70b", "--cluster", bad])
    line = assert_one_line_error(rc, err, "broken.yaml")
    assert "YAML" in line or "yaml" in line


def test_cluster_yaml_unknown_gpu(capsys, tmp_path):
    f = tmp_path / "strange-gpu.yaml"
    f.write_text("name: strange\ngpu: Z9000\nnodes: 2\ngpus_per_node: 8\n"
                 "inter_node:\n  nic_bandwidth_bytes_per_s: 5.0e+10\n")
    rc, _, err = run_cli(capsys, ["--model", "70b", "--cluster", f])
    assert_one_line_error(rc, err, "strange-gpu.yaml", "gpu", "Z9000")


def test_cluster_yaml_bad_field(capsys, tmp_path):
    f = tmp_path / "negative.yaml"
    f.write_text("gpu: H100\nnodes: -4\ninter_node:\n  nic_bandwidth_bytes_per_s: 5.0e+10\n")
    rc, _, err = run_cli(capsys, ["--model", "70b", "--cluster", f])
    assert_one_line_error(rc, err, "negative.yaml", "nodes")


def test_check_impossible_plan(capsys):
    rc, _, err = run_cli(capsys, ["check", "--model", "70b", "--cluster", "h100x512", "--tp", "3"])
    assert_one_line_error(rc, err, "tp=3")


def test_validate_csv_missing_columns(capsys, tmp_path):
    row = _good_row()
    cols = ["source_id", "model_name", "layers", "hidden"]
    f = _write_csv(tmp_path / "short.csv", [row], cols)
    rc, _, err = run_cli(capsys, ["validate", f])
    line = assert_one_line_error(rc, err, "short.csv", "heads", "step_time_s")
    assert "missing column" in line


def test_validate_derives_the_step_time_without_step_time_or_scored_columns(capsys, tmp_path):
    """A CSV of the published-runs schema without the derived columns: every row is scored, the step time
    comes from measured_metric / measured_value (tokens/s/GPU: global batch x sequence / (value x GPUs)), and
    a row with only a TFLOP/s figure, whose FLOP convention is the source's, is predicted (with its interval)
    but not scored, saying why; the summary counts it apart."""
    row = dict(_good_row())
    gb, seq, n = int(row["global_batch"]), int(row["seq_len"]), int(row["num_gpus"])
    by_tokens = {**row, "measured_metric": "tokens_per_sec_per_gpu", "measured_value": str(gb * seq / (2.5 * n))}
    by_tflops = {**row, "measured_metric": "tflops_per_gpu", "measured_value": "150"}
    cols = [c for c in row if c not in ("scored", "step_time_s", "step_time_derivation")]
    f = _write_csv(tmp_path / "derived.csv", [by_tokens, by_tflops], cols)
    out_json = tmp_path / "v.json"
    rc, _, _ = run_cli(capsys, ["validate", f, "--json", out_json])
    rows = json.loads(out_json.read_text())["rows"]
    assert rc == 0 and len(rows) == 2
    assert rows[0]["published_step_time_s"] == pytest.approx(2.5) and rows[0]["predicted_step_time_s"] > 0
    assert rows[1]["error"] is None and rows[1].get("ape") is None and rows[1]["published_step_time_s"] is None
    assert rows[1]["predicted_step_time_s"] == pytest.approx(rows[0]["predicted_step_time_s"], rel=1e-12)
    assert rows[1]["predicted_p10_step_time_s"] < rows[1]["predicted_step_time_s"] < rows[1]["predicted_p90_step_time_s"]
    why = next(a for a in rows[1]["assumed"] if a.startswith("not scored"))
    assert "tflops_per_gpu" in why and "step_time_s" in why
    overall = json.loads(out_json.read_text())["summary"]["overall"]
    assert (overall["count"], overall["predicted"], overall["unscored"], overall["misses"]) == (2, 1, 1, 0)


def test_validate_reads_a_file_without_source_ids_and_other_separators(capsys, tmp_path):
    """A spreadsheet export: no source_id column (the file is one source, named after it), tab- or
    semicolon-separated, with a byte-order mark; every one predicts the row as the comma-separated original."""
    row = _good_row()
    cols = [c for c in row if c != "source_id"]
    base = _write_csv(tmp_path / "lab_runs.csv", [row], cols)
    text = Path(base).read_text()
    files = {"lab_runs.csv": None, "tabs.tsv": text.replace(",", "\t"), "semi.csv": text.replace(",", ";")}
    got = {}
    for name, body in files.items():
        if body is not None:
            (tmp_path / name).write_text(body, encoding="utf-8-sig")
        out_json = tmp_path / f"{name}.json"
        rc, _, _ = run_cli(capsys, ["validate", tmp_path / name, "--json", out_json])
        r = json.loads(out_json.read_text())["rows"][0]
        assert rc == 0 and r["error"] is None
        assert r["source_id"] == Path(name).stem and f"source_id={Path(name).stem} (the file has no source_id " \
            "column: one source)" in r["assumed"]
        got[name] = r["predicted_step_time_s"]
    assert len(set(got.values())) == 1


def test_validate_csv_without_any_step_time_column(capsys, tmp_path):
    row = _good_row()
    cols = [c for c in row if c not in ("step_time_s", "measured_value")]
    f = _write_csv(tmp_path / "notime.csv", [row], cols)
    rc, _, err = run_cli(capsys, ["validate", f])
    line = assert_one_line_error(rc, err, "notime.csv", "step_time_s", "measured_value")
    assert "missing column" in line


def test_validate_missing_csv_file(capsys, tmp_path):
    rc, _, err = run_cli(capsys, ["validate", tmp_path / "nowhere.csv"])
    assert_one_line_error(rc, err, "nowhere.csv")


@pytest.fixture
def malformed_row_result(capsys, tmp_path):
    good = _good_row()
    bad = {**good, "layers": "forty-eight"}
    fieldnames = list(good)
    f = _write_csv(tmp_path / "rows.csv", [good, bad], fieldnames)
    out = tmp_path / "rows.json"
    rc, _, err = run_cli(capsys, ["validate", f, "--json", out])
    return rc, err, json.loads(out.read_text())


def test_validate_malformed_row_is_a_miss_not_a_crash(malformed_row_result):
    rc, err, data = malformed_row_result
    assert rc == 0, err
    assert "Traceback" not in err
    rows = {r["row"]: r for r in data["rows"]}
    assert set(rows) == {0, 1}
    assert rows[0]["error"] is None and rows[0]["predicted_step_time_s"] > 0 and rows[0]["fits"] is True
    assert isinstance(rows[1]["error"], str) and rows[1]["error"]
    assert rows[1]["predicted_step_time_s"] is None
    assert rows[1]["source_id"] == "KORTHIKANTI2022"
    # the row a script must find again keeps its model and size
    assert rows[1]["model_name"] == rows[0]["model_name"] == _good_row()["model_name"]
    assert rows[1]["num_gpus"] == rows[0]["num_gpus"] == int(_good_row()["num_gpus"])
    overall = data["summary"]["overall"]
    assert overall["count"] == 2
    assert overall["predicted"] == 1
    assert overall["misses"] == 1


def test_validate_malformed_row_error_names_the_field(malformed_row_result):
    _, _, data = malformed_row_result
    bad = next(r for r in data["rows"] if r["row"] == 1)
    assert "layers" in bad["error"]


def test_json_to_missing_directory_leaves_nothing(capsys, tmp_path):
    f = _write_csv(tmp_path / "one.csv", [_good_row()], list(_good_row()))
    before = sorted(p.name for p in tmp_path.iterdir())
    target = tmp_path / "no-such-dir" / "out.json"
    rc, _, err = run_cli(capsys, ["validate", f, "--json", target])
    assert_one_line_error(rc, err, "no-such-dir")
    assert not target.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_validate_row_with_more_pipeline_stages_than_layers_is_a_row_error(capsys, tmp_path):
    """pp x vp beyond the layers is a row error at once (before, a pp of 10^9 built a 10^9-entry split and ran
    out of memory)."""
    good = _good_row()
    bad = {**good, "pp": "4000000", "tp": "1", "num_gpus": "4000000"}
    f = _write_csv(tmp_path / "deep.csv", [good, bad], list(good))
    out = tmp_path / "deep.json"
    rc, _, err = run_cli(capsys, ["validate", f, "--json", out])
    rows = {r["row"]: r for r in json.loads(out.read_text())["rows"]}
    assert rc == 0, err
    assert rows[0]["error"] is None and "virtual pipeline stages" in rows[1]["error"]
    assert "4000000" in rows[1]["error"]


def test_validate_json_without_a_file_prints_json_on_stdout(capsys, tmp_path):
    """`plan validate CSV --json` (no OUT, or -) prints the JSON on stdout, the tables on stderr; the same rows
    as --json OUT. `plan validate --json CSV` reads the CSV, and an OUT that is the CSV itself is refused."""
    f = _write_csv(tmp_path / "one.csv", [_good_row()], list(_good_row()))
    out = tmp_path / "one.json"
    rc, _, _ = run_cli(capsys, ["validate", f, "--json", out])
    assert rc == 0
    written = json.loads(out.read_text())
    for argv in (["validate", f, "--json"], ["validate", f, "--json", "-"], ["validate", "--json", f]):
        rc, stdout, stderr = run_cli(capsys, argv)
        assert rc == 0, stderr
        printed = json.loads(stdout)
        assert printed["rows"] == written["rows"] and printed["rows"][0]["predicted_step_time_s"] > 0
        assert "Step-time error by source" in stderr and "P10-P90" in stderr
    before = (tmp_path / "one.csv").read_text()
    rc, _, err = run_cli(capsys, ["validate", f, "--json", f])
    assert_one_line_error(rc, err, "one.csv", "--json")
    assert (tmp_path / "one.csv").read_text() == before
    rc, _, err = run_cli(capsys, ["validate"])
    assert_one_line_error(rc, err, "csv")


# ---- plan validate on the published runs ----------------------------------------------------------

@pytest.fixture(scope="module")
def published(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate") / "published.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["validate", str(PUBLISHED), "--json", str(out)])
    assert rc == 0, stderr.getvalue()
    assert "Traceback" not in stderr.getvalue()
    return json.loads(out.read_text())


def test_validate_published_rows_and_summary(published):
    scored = [i for i, r in enumerate(_published_rows()) if r["scored"].strip().lower() == "true"]
    rows = published["rows"]
    assert len(rows) == len(scored)
    assert [r["row"] for r in rows] == scored
    for r in rows:
        assert ROW_KEYS <= set(r), sorted(ROW_KEYS - set(r))
        assert r["error"] is None, r
        assert r["predicted_step_time_s"] > 0 and r["published_step_time_s"] > 0
        assert r["predicted_peak_memory_bytes"] > 0
        assert isinstance(r["fits"], bool)
    overall = published["summary"]["overall"]
    assert overall["count"] == len(scored)
    assert overall["predicted"] == len(scored)
    assert overall["misses"] == 0


def test_validate_published_runs_all_fit(published):
    """Published runs actually ran, so every one must fit."""
    no_fit = [(r["row"], r["source_id"]) for r in published["rows"] if not r["fits"]]
    assert no_fit == []


def test_validate_published_runs_mape(published):
    """Overall step-time MAPE below 15 % (the target is 10 %)."""
    mape = published["summary"]["overall"]["mape"]
    assert mape is not None and mape < 15.0, mape


# ---- the search -----------------------------------------------------------------------------------

def test_search_json_uses_the_cluster_and_fits(capsys):
    rc, out, err = run_cli(capsys, ["--model", "70b", "--cluster", "h100x512.yaml", "--json", "--top", "3"])
    assert rc == 0, err
    data = json.loads(out)
    assert data["evaluated"] > 0
    best = data["plans"][0]
    p = best["plan"]
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == 512
    assert best["fits"] is True
    assert best["peak_memory_bytes"] <= best["memory_capacity_bytes"]
    assert best["step_time_s"] > 0 and 0 < best["mfu"] < 1
    times = [r["step_time_s"] for r in data["plans"] if r["fits"]]
    assert times == sorted(times)


def test_search_out_dir_writes_launchable_plan(tmp_path):
    """`plan --out DIR` writes the best plan's files; its Megatron flags parse back into that plan."""
    import json

    from planner.outputs import parse_megatron_args

    out = tmp_path / "plan"
    assert main(["--model", "405b", "--cluster", "h100x16384.yaml", "--top", "1", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["launch.sbatch", "launch.sh", "megatron_args.txt", "plan.json", "report.png"]
    saved = json.loads((out / "plan.json").read_text())
    plan = saved["plan"]
    assert plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"] == 16384
    parsed = parse_megatron_args((out / "megatron_args.txt").read_text(), num_gpus=16384)
    for k in ("tp", "pp", "cp", "dp", "micro_batch", "global_batch"):
        assert parsed[k] == plan[k], k
    if plan["layers_per_stage"]:
        assert sum(plan["layers_per_stage"]) == 126
        assert tuple(parsed["layers_per_stage"]) == tuple(plan["layers_per_stage"])


def test_precision_the_gpu_lacks(capsys, tmp_path):
    from costmodel.profiles import load_profile

    assert [p for p in ("fp32", "fp16", "bf16", "fp8", "mxfp8") if load_profile("V100-32GB").supports(p)] == \
        ["fp32", "fp16"]
    assert load_profile("H100").supports("fp8") and not load_profile("H100").supports("mxfp8")
    assert load_profile("B200").supports("mxfp8") and load_profile("B200").supports("nvfp4")
    assert not load_profile("A100-80GB").supports("fp8")
    # A default bf16 model on V100 is planned in fp16 (Megatron's --fp16), with a note after the table.
    rc, out, err = run_cli(capsys, ["--model", "13b", "--cluster", "v100-dgx2x64.yaml", "--top", "1",
                                    "--out", str(tmp_path / "v100")])
    assert rc == 0 and err.startswith("note: V100-32GB has no bf16") and err.count("\n") == 1
    args = (tmp_path / "v100" / "megatron_args.txt").read_text().split()
    assert "--fp16" in args and "--bf16" not in args
    assert json.loads((tmp_path / "v100" / "plan.json").read_text())["model"]["precision"] == "fp16"
    # Asked for explicitly, a precision the GPU lacks is a one-line error naming what it runs.
    rc, _, err = run_cli(capsys, ["--model", "13b", "--cluster", "v100-dgx2x64.yaml", "--precision", "bf16"])
    assert_one_line_error(rc, err, "--precision bf16", "V100-32GB", "valid there: fp16, fp32")
    rc, _, err = run_cli(capsys, ["check", "--model", "70b", "--cluster", "h100x512.yaml", "--tp", "8",
                                  "--pp", "4", "--precision", "mxfp8"])
    assert_one_line_error(rc, err, "--precision mxfp8", "H100", "fp8")
    rc, _, err = run_cli(capsys, ["--model", "13b", "--cluster", "a100-v100-mixed.yaml", "--precision", "fp8"])
    assert_one_line_error(rc, err, "A100-80GB, V100-32GB", "valid there: fp16, fp32")


def test_requests_own_the_defaults():
    """planner.request decides what the flags leave out: ~4M tokens (8 sequences per rank on CPU ranks of a
    command that trains here), dp from the GPUs left, ZeRO-1 unless the distributed optimizer is off."""
    from costmodel.profiles import load_profile
    from planner.request import CheckRequest, PlanRequest
    from costmodel.plan import default_global_batch

    t = PlanRequest(model="70b", cluster="h100x512.yaml").resolve()
    assert t.global_batch == default_global_batch(t.model.seq_len, 512) and t.profile is None
    assert PlanRequest(model="70b", cluster="h100x512.yaml", global_batch=96).resolve().global_batch == 96
    host = load_profile("H100").model_copy(update={"kind": "host"})
    trains_here = PlanRequest(model="70b", cluster="h100x512.yaml", host_batch=True)
    assert trains_here.global_batch_for(t.model, t.cluster, host) == 8 * 512
    assert trains_here.global_batch_for(t.model, t.cluster) == t.global_batch        # a GPU profile: the default
    assert PlanRequest(model="70b", cluster="h100x512.yaml").global_batch_for(t.model, t.cluster, host) == \
        t.global_batch                                                                # planning only: the default
    c = CheckRequest(model="70b", cluster="h100x512.yaml", tp=8, pp=4).resolve()
    assert (c.plan.dp, c.plan.zero_stage, c.plan.distributed_optimizer) == (16, 1, True)
    assert c.layout is None and c.load is None
    off = CheckRequest(model="70b", cluster="h100x512.yaml", tp=8, pp=4, no_distributed_optimizer=True).resolve()
    assert (off.plan.zero_stage, off.plan.distributed_optimizer) == (0, False)
    lps = CheckRequest(model="405b", cluster="h100x16384.yaml", tp=8, pp=16,
                       layers_per_stage="7," + "8," * 14 + "7").resolve()
    assert lps.plan.dp == 128 and lps.layers_per_stage == (7,) + (8,) * 14 + (7,)
    assert lps.layout == "Et*7|(t*8|)*14,t*7L"


def test_request_fields_are_flags():
    """Every field a command's request takes from the flags is a flag of that command (a renamed flag would
    silently fall back to the default otherwise)."""
    from dataclasses import fields

    from planner import cli
    from planner.request import CapacityRequest, CheckRequest, PlanRequest

    given = {"start_profile", "host_batch"}           # set by the command, not by a flag of the same dest
    cap = cli._Parser(prog="plan capacity")
    cli._capacity_args(cap)
    for cls, parser in ((PlanRequest, cli._search_parser()), (CheckRequest, cli._check_parser()),
                        (CapacityRequest, cap)):
        dests = {a.dest for a in parser._actions}
        assert {f.name for f in fields(cls)} - given <= dests, cls.__name__


def test_progress_bar_quiet_and_counting():
    from planner.terminal import progress_bar

    with progress_bar("x", quiet=True) as bar:
        assert bar is None
    with progress_bar("x", 3) as bar:
        bar.count(1)
        bar.step("two")
        bar.labelled("three", 3, 4)
        task = bar._progress.tasks[0]
        assert (task.completed, task.total, task.description) == (3, 4, "three")


# plan models ----------------------------------------------------------------------------------------------------
def test_plan_models_lists_every_catalog_model_with_its_size(capsys):
    from costmodel.catalog import catalog_names, get_model
    from costmodel.flops import total_params

    rc, out, _ = run_cli(capsys, ["models", "--json"])
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == catalog_names()
    by = {r["name"]: r for r in rows}
    assert by["405b"]["params"] == total_params(get_model("405b")) and by["405b"]["active_params"] is None
    assert abs(by["deepseek-v3"]["active_params"] - 37e9) / 37e9 < 0.05 and by["deepseek-v3"]["dense_layers"] == 3
    assert by["nemotron-3-super"]["hybrid_layers"] == {"Mamba-2": 40, "attention": 8, "MoE": 40}
    assert (by["llama4-maverick"]["moe_layer_step"], by["llama4-maverick"]["moe_layers"]) == (2, 24)
    assert (by["deepseek-v3"]["moe_layer_step"], by["deepseek-v3"]["moe_layers"]) == (None, 58)
    assert "ALiBi attention biases in place of rotary embeddings" in by["bloom-176b"]["unexpressed"]


def test_plan_models_filters_by_name_or_alias_and_shows_one_in_full(capsys):
    rc, out, _ = run_cli(capsys, ["models", "GLM"])
    assert rc == 0 and "glm-4.5-air" in out and "405b" not in out
    rc, out, _ = run_cli(capsys, ["models", "tiiuae/falcon-180B"])   # an alias
    assert rc == 0 and "falcon-180b" in out and "aliases: tiiuae/falcon-180B" in out
    assert "not in the cost model: parallel attention and MLP" in out


def test_plan_models_without_a_match_is_a_one_line_error(capsys):
    rc, _, err = run_cli(capsys, ["models", "no-such-model"])
    assert_one_line_error(rc, err, "'no-such-model'", "405b", "deepseek-v3")


def test_plans_of_a_model_with_unexpressed_facts_say_what_the_estimate_leaves_out(capsys):
    """A catalog model's facts no field holds (gpt-oss's attention sinks, Mistral's sliding window) are named
    beside every estimate: under the tables and in the JSON."""
    from costmodel.catalog import get_model

    check = ["check", "--model", "gpt-oss-120b", "--cluster", "h100x512.yaml", "--tp", "1", "--pp", "1", "--ep", "8",
             "--micro-batch", "1", "--recompute", "none"]
    rc, out, _ = run_cli(capsys, [*check, "--json"])
    assert json.loads(out)["unexpressed"] == list(get_model("gpt-oss-120b").unexpressed)
    rc, out, _ = run_cli(capsys, check)
    assert "not in the cost model for gpt-oss-120b (priced without them): " in out and "attention sinks" in out
    rc, out, _ = run_cli(capsys, ["--model", "mistral-7b", "--cluster", "h100x512.yaml", "--top", "1", "--json"])
    assert json.loads(out)["unexpressed"] == ["sliding-window attention of 4096 tokens on every layer"]
    rc, out, _ = run_cli(capsys, ["--model", "70b", "--cluster", "h100x512.yaml", "--top", "1", "--json"])
    assert "unexpressed" not in json.loads(out)


def test_validate_names_what_the_cost_model_leaves_out_of_each_rows_model(capsys, tmp_path):
    """A row whose model has facts no field holds (gpt-oss's attention sinks) carries them as unexpressed in the
    JSON, and the text says how many rows of which models are priced without them."""
    from costmodel.catalog import get_model

    good = _good_row()
    oss = next(r for r in _published_rows() if r["model_name"] == "GPT-OSS-120B" and r["scored"] == "true")
    f = _write_csv(tmp_path / "rows.csv", [good, oss], list(good))
    rc, out, _ = run_cli(capsys, ["validate", f, "--json", "-"])
    rows = json.loads(out)["rows"]
    assert rc == 0 and rows[0]["unexpressed"] == [] and rows[1]["unexpressed"] == list(
        get_model("gpt-oss-120b").unexpressed)
    rc, out, _ = run_cli(capsys, ["validate", f])
    assert "1 row(s) of GPT-OSS-120B: not in the cost model (priced without them): " in out
    assert "attention sinks" in out and out.count("not in the cost model") == 1
