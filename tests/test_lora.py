"""LoRA on frozen weights (ModelSpec.finetune = "lora"): no weight-gradient GEMMs, no gradient reduction, no
optimizer state or step; checked on the published LoRA runs of data/validation, which the fit never sees."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate_arrays
from costmodel.flops import model_flops_per_step
from costmodel.plan import PlanArrays
from costmodel.profiles import InputError, load_cluster
from costmodel.validate import finetune_of, load_cases, predict_case
from planner.cli import main
from csv_rows import write_rows

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "validation" / "published_runs.csv"


def _pair(name="llama3-70b", **plan):
    full = get_model(name)
    lora = full.model_copy(update={"finetune": "lora"})
    cluster = load_cluster("h100x512")
    cols = dict(dict(tp=8, pp=4, vpp=1, dp=16, micro_batch=1, global_batch=512, recompute=0), **plan)
    arrays = PlanArrays.from_columns(**cols)
    return (estimate_arrays(full, cluster, arrays), estimate_arrays(lora, cluster, arrays), full, lora)


def test_frozen_weights_skip_weight_gradients_reduction_and_optimizer():
    full, lora, fm, lm = _pair()
    d = full["details"]
    # Backward of a layer: the data-gradient GEMMs only, so one forward's worth of GEMM time less per layer.
    gemm = d["attn_proj_s"] + d["mlp_dense_s"]
    assert lora["details"]["layer_dense_bwd_s"] == pytest.approx(d["layer_dense_bwd_s"] - gemm, rel=1e-6)
    assert lora["details"]["layer_dense_fwd_s"] == pytest.approx(d["layer_dense_fwd_s"], rel=1e-12)
    assert lora["optimizer_s"][0] == 0.0 < full["optimizer_s"][0]
    assert lora["dp_comm_exposed_s"][0] == 0.0 < full["dp_comm_exposed_s"][0]
    assert 0.6 < lora["step_time_s"][0] / full["step_time_s"][0] < 0.8
    # No gradients or optimizer state for the frozen weights; the weights and activations stay.
    assert lora["grads_bytes"][0] == 0.0 < full["grads_bytes"][0]
    assert lora["optimizer_bytes"][0] == 0.0 < full["optimizer_bytes"][0]
    assert lora["weights_bytes"][0] == full["weights_bytes"][0]
    assert lora["activations_bytes"][0] == full["activations_bytes"][0]
    assert np.nanmax(lora["peak_memory_bytes"][0]) < np.nanmax(full["peak_memory_bytes"][0])


def test_lora_model_flops_are_two_forwards_of_the_weights_and_three_of_attention():
    _, _, full, lora = _pair()
    f, lo = model_flops_per_step(full, 512), model_flops_per_step(lora, 512)
    short = full.model_copy(update={"seq_len": 16})   # attention nearly gone: the ratio tends to 2/3
    assert model_flops_per_step(short.model_copy(update={"finetune": "lora"}), 512) / \
        model_flops_per_step(short, 512) == pytest.approx(2 / 3, rel=2e-3)
    assert 2 / 3 < lo / f < 0.75


@pytest.mark.parametrize("row, expect", [
    ({"model_name": "LLAMA2-70B (LoRA)"}, "lora"), ({"model_name": "Llama3-70B", "task": "lora"}, "lora"),
    ({"model_name": "x", "notes": "QLoRA fine-tuning"}, "lora"), ({"model_name": "x", "peft": "LoRA r=16"}, "lora"),
    ({"model_name": "DeepSeek-V3", "notes": "MLA kv_lora_rank=512"}, "full"),
    ({"model_name": "Llama3-70B (SFT)", "notes": "sft"}, "full")])
def test_a_row_says_lora(row, expect):
    assumed: list[str] = []
    assert finetune_of(row, assumed) == expect
    assert bool(assumed) == (expect == "lora")


def _lora_rows_scored(tmp_path: Path) -> Path:
    """The published LoRA runs (left unscored in the shared CSV), scored."""
    reader = csv.DictReader(io.StringIO(CSV.read_text()))
    rows = [dict(r, scored="true") for r in reader if "lora" in r["model_name"].lower()]
    return write_rows(tmp_path / "lora.csv", rows)


def test_published_lora_runs_are_predicted_as_lora(tmp_path):
    """Eight LoRA runs (NeMo 24.07 Llama 2 on H100; Megatron-Bridge 26.06 Llama 3 70B on H100, GB200, GB300),
    never in any fit: within 20% each and about 5% on average; trained as full fine-tuning they would be
    predicted 1.3-1.6x slow."""
    cases, errors = load_cases(_lora_rows_scored(tmp_path))
    assert not errors and len(cases) == 8
    assert all(c.model.finetune == "lora" for c in cases)
    ratios = np.array([predict_case(c)["predicted_step_time_s"] / c.published_step_time_s for c in cases])
    assert np.all(np.abs(ratios - 1) < 0.20)
    assert np.mean(np.abs(ratios - 1)) < 0.08
    full = [predict_case(c.__class__(**{**c.__dict__, "model": c.model.model_copy(update={"finetune": "full"})}))
            for c in cases]
    as_full = np.array([p["predicted_step_time_s"] for p in full]) / np.array([c.published_step_time_s for c in cases])
    assert np.all(as_full > 1.25 * ratios)


def test_plan_takes_finetune_lora(capsys, tmp_path):
    out = tmp_path / "lora"
    rc = main(["--model", "8b", "--cluster", "h100x512", "--finetune", "lora", "--top", "2", "--json",
               "--out", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert rc == 0
    rc = main(["--model", "8b", "--cluster", "h100x512", "--top", "2", "--json"])
    full = json.loads(capsys.readouterr().out)
    assert rc == 0
    key = next(k for k in ("plans", "ranked", "results") if k in printed)
    assert printed[key][0]["step_time_s"] < full[key][0]["step_time_s"]
    assert json.loads((out / "plan.json").read_text())["model"]["finetune"] == "lora"
    assert "LoRA on frozen weights" in (out / "megatron_args.txt").read_text()
    for argv, needle in ((["--model", "8b", "--cluster", "h100x512", "--finetune", "qlora"], "--finetune"),
                         (["autotune", "--model", "8b", "--cluster", "h100x512", "--finetune", "lora"], "executor"),
                         (["run", str(out / "plan.json"), "--run-dir", str(tmp_path / "r")], "finetune")):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_with_finetune_rejects_unknown():
    from planner.request import with_finetune

    with pytest.raises(InputError, match="full, lora"):
        with_finetune(get_model("8b"), "adapters")
    assert with_finetune(get_model("8b"), " LoRA ").finetune == "lora"


def test_whatif_varies_finetune(capsys):
    rc = main(["whatif", "--model", "8b", "--tokens", "1B", "--cluster", "h100x512", "--vary", "finetune=full,lora",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    pts = out.get("points", out)
    by = {p["finetune"]: p for p in pts}
    assert set(by) == {"full", "lora"} and by["lora"]["varied"] == {"finetune": "lora"}
    assert by["lora"]["gpu_hours"] < by["full"]["gpu_hours"]
    rc = main(["whatif", "--model", "8b", "--tokens", "1B", "--cluster", "h100x512", "--vary", "finetune=full,dora"])
    err = capsys.readouterr().err
    assert rc == 2 and "full, lora" in err


def test_a_training_log_with_a_lora_peft_block_is_read_as_lora():
    """A Megatron-Bridge configuration dump's `peft:` block (or NeMo's peft_scheme: lora) marks the run LoRA; the
    shipped real-format log (full training) stays full, with the same layout and step time."""
    from costmodel.runlog import parse_megatron_log

    text = (ROOT / "tests" / "data" / "megatron" / "llama3.1-8b_tp2pp2dp4_h100x16.log").read_text()
    full = parse_megatron_log(text, "full.log", gpu="H100")
    bridge = "peft:\n  _target_: megatron.bridge.peft.lora.LoRA\n  dim: 16\n  alpha: 32\n"
    lora = parse_megatron_log(bridge + text, "lora.log", gpu="H100")
    nemo = parse_megatron_log("  peft_scheme: lora\n" + text, "nemo.log", gpu="H100")
    assert full.measurement.model.finetune == "full"
    assert lora.measurement.model.finetune == nemo.measurement.model.finetune == "lora"
    assert lora.measurement.plan == full.measurement.plan
    assert lora.measurement.step_time_s == full.measurement.step_time_s
    off = parse_megatron_log("  peft_scheme: none\n" + text, "none.log", gpu="H100")
    assert off.measurement.model.finetune == "full"
