"""The host (CPU) floor of dropless MoE layers: a layer cannot finish before the host has issued it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import MOE_HOST_FIXED_S, MOE_HOST_PER_EXPERT_S, estimate_arrays
from costmodel.plan import PlanArrays
from costmodel.profiles import load_cluster, load_profile
from csv_rows import write_rows

CLUSTER_DIR = Path(__file__).resolve().parents[1] / "hardware_profiles" / "clusters"

MODEL = get_model("qwen3-30b-a3b")          # 128 small experts (ffn 768): little GPU work per layer
CLUSTER = load_cluster("b200x1024")
PROF = load_profile(CLUSTER.gpu)


def _details(**cols) -> dict:
    plans = PlanArrays.from_columns(**{"tp": 1, "pp": 1, "global_batch": 512, "recompute": 0, **cols})
    return estimate_arrays(MODEL, CLUSTER, plans, profile=PROF)["details"]


def test_host_floor_is_fixed_plus_per_local_expert():
    d = _details(dp=8, ep=np.array([8.0, 32.0]), micro_batch=1)
    want = [(MOE_HOST_FIXED_S + MODEL.num_experts / ep * MOE_HOST_PER_EXPERT_S) * PROF.calibration.moe_overhead
            for ep in (8, 32)]
    assert d["moe_host_s"] == pytest.approx(want, rel=1e-12)
    assert d["moe_host_s"][1] < d["moe_host_s"][0]          # fewer local experts, less to issue


def test_small_micro_batch_is_host_bound_large_is_not():
    d = _details(dp=8, ep=8, micro_batch=np.array([1.0, 16.0]))
    host = d["moe_host_s"]
    # One 4k-token micro-batch: the layer's GPU work is shorter than its host time, so the layer takes the
    # host time (forward) and twice it (backward) ...
    assert d["layer_moe_fwd_s"][0] == pytest.approx(host[0])
    assert d["layer_moe_bwd_s"][0] == pytest.approx(2 * host[0])
    # ... while 16 sequences per micro-batch are GPU-bound, and 16x the tokens cost less than 16x the time.
    assert d["layer_moe_fwd_s"][1] > host[1]
    assert d["layer_moe_fwd_s"][1] < 16 * d["layer_moe_fwd_s"][0]


def test_cpu_host_profile_has_no_separate_floor():
    host_prof = PROF.model_copy(update={"kind": "host"})
    plans = PlanArrays.from_columns(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=512, recompute=0)
    d = estimate_arrays(MODEL, CLUSTER, plans, profile=host_prof)["details"]
    assert d["moe_host_s"][0] == 0.0


def test_dense_model_unaffected():
    dense = get_model("llama3-8b")
    plans = PlanArrays.from_columns(tp=1, pp=1, dp=8, micro_batch=1, global_batch=128, recompute=0)
    d = estimate_arrays(dense, CLUSTER, plans, profile=PROF)["details"]
    assert "moe_host_s" not in d


def test_grouped_gemm_fixed_time_per_local_expert(monkeypatch):
    """Each local expert's GEMMs pay GROUPED_GEMM_FIXED_S beyond the shape curve: two forward, four backward."""
    from costmodel import estimate

    fixed = estimate.GROUPED_GEMM_FIXED_S
    ep = np.array([8.0, 32.0])
    on = _details(dp=8, ep=ep, micro_batch=16)           # GPU-bound: above the host floor
    monkeypatch.setattr(estimate, "GROUPED_GEMM_FIXED_S", 0.0)
    off = _details(dp=8, ep=ep, micro_batch=16)
    local = MODEL.num_experts / ep
    assert np.all(off["layer_moe_fwd_s"] > off["moe_host_s"])
    assert on["layer_moe_fwd_s"] - off["layer_moe_fwd_s"] == pytest.approx(2 * local * fixed, rel=1e-6)
    assert on["layer_moe_bwd_s"] - off["layer_moe_bwd_s"] == pytest.approx(4 * local * fixed, rel=1e-6)


def test_a_token_drop_moe_padded_to_capacity_has_no_host_floor():
    """Static shapes (capacity factor and padding): no token counts go to the host and the layers can be
    CUDA-graphed, so the host-bound micro-batch-1 layer takes its GPU time, below the dropless floor."""
    plans = PlanArrays.from_columns(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=512, recompute=0)
    drop = estimate_arrays(MODEL.model_copy(update={"moe_token_drop": True}), CLUSTER, plans, profile=PROF)
    dropless = estimate_arrays(MODEL, CLUSTER, plans, profile=PROF)
    assert drop["details"]["moe_host_s"][0] == 0.0 and dropless["details"]["moe_host_s"][0] > 0.0
    assert dropless["details"]["layer_moe_fwd_s"][0] == pytest.approx(dropless["details"]["moe_host_s"][0])
    assert drop["details"]["layer_moe_fwd_s"][0] < 0.7 * dropless["details"]["layer_moe_fwd_s"][0]
    assert drop["step_time_s"][0] < 0.7 * dropless["step_time_s"][0]


def test_the_csv_names_a_token_drop_run_and_not_a_dropless_one(tmp_path):
    """'(token-drop)', 'drop-and-pad' or a capacity factor in the name or notes read as a token-drop MoE;
    'token-dropless' does not."""
    import csv
    from pathlib import Path

    from costmodel.validate import load_cases

    data = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"
    base = next(r for r in csv.DictReader(data.open()) if r["scored"] == "true" and r["model_name"] == "Qwen3-30B-A3B")
    assert "token-dropless" in base["notes"]
    rows = [base, {**base, "model_name": "Qwen3-30B-A3B (token-drop)"},
            {**base, "notes": base["notes"] + "; drop-and-pad"}, {**base, "notes": "capacity factor 1.0"}]
    path = write_rows(tmp_path / "drop.csv", rows)
    cases, errors = load_cases(path)
    assert errors == [] and [c.model.moe_token_drop for c in cases] == [False, True, True, True]


def test_plan_check_takes_moe_token_drop(capsys, tmp_path):
    """`--moe-token-drop` reaches the cost model (no host floor: the host-bound 8-GPU micro-batch-1 layout gets
    faster), the emitted Megatron flags (capacity factor 1.0, padded) and plan capacity; a dense model is a
    one-line exit-2 error."""
    import json

    import yaml

    from planner.cli import main

    cluster = yaml.safe_load((CLUSTER_DIR / "b200x1024.yaml").read_text())
    cluster["nodes"] = 1
    path = tmp_path / "b200x8.yaml"
    path.write_text(yaml.safe_dump(cluster))
    argv = ["check", "--model", "qwen3-30b-a3b", "--cluster", str(path), "--tp", "1", "--pp", "1", "--ep", "8",
            "--dp", "8", "--micro-batch", "1", "--global-batch", "512", "--json"]
    times = []
    for extra in ([], ["--moe-token-drop"]):
        rc = main(argv + extra)
        assert rc == 0
        times.append(json.loads(capsys.readouterr().out)["estimate"]["step_time_s"])
    assert times[1] < 0.9 * times[0]
    out = tmp_path / "plan"
    assert main(["--model", "qwen3-30b-a3b", "--cluster", str(path), "--global-batch", "512", "--moe-token-drop",
                 "--top", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert "--moe-expert-capacity-factor 1.0" in (out / "megatron_args.txt").read_text()
    assert json.loads((out / "plan.json").read_text())["model"]["moe_token_drop"] is True
    assert main(["capacity", "--model", "qwen3-30b-a3b", "--cluster", str(path), "--tokens", "1B",
                 "--moe-token-drop", "--json"]) in (0, 1)
    capsys.readouterr()
    rc = main(["check", "--model", "70b", "--cluster", str(path), "--tp", "8", "--moe-token-drop"])
    err = capsys.readouterr().err
    assert rc == 2 and "--moe-token-drop" in err and len(err.strip().splitlines()) == 1
