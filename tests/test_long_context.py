"""NeMo's long-context tables (scripts/long_context_check.py): rows the cost model is never fitted to."""

from __future__ import annotations

import pytest

from tests.script_module import load_script

lc = load_script("long_context_check")


def test_nemo_formula_counts_attention_without_the_causal_half():
    # Llama 2 7B at 4,096 tokens, one sequence: the terms of nemo/utils/flops_formulas.py llama2, by hand.
    s, L, h, ffn, heads, kv, v = 4096, 32, 4096, 11008, 32, 32, 32000
    dense = 2 * 3 * L * (4 * h * h + 3 * h * ffn) * s        # QKV + O and the three MLP matrices, x3 for backward
    attention = 3 * L * 4 * s * s * h                         # QK^T and AV over all s x s scores, x3
    head = 6 * s * h * v                                      # the output layer
    assert lc.nemo_llama_flops(1, s, L, h, ffn, heads, kv, v) == pytest.approx(dense + attention + head, rel=1e-12)


def test_rows_become_step_times_on_their_layouts_gpus():
    rows = lc.scored_rows(lc.DEFAULT_CSV)
    assert len(rows) == 17 and all(r["scored"] == "true" for r in rows)
    h100_1m = next(r for r in rows if r["gpu_type"] == "H100" and r["seq_len"] == "1048576")
    assert h100_1m["num_gpus"] == "1024"                      # tp8 x cp32 x dp4
    flops = lc.nemo_llama_flops(4, 1048576, 32, 4096, 11008, 32, 32, 32000)
    assert float(h100_1m["step_time_s"]) == pytest.approx(flops / (536e12 * 1024), rel=1e-5)
    with pytest.raises(ValueError, match="Llama"):
        lc.family("Mixtral-8x7B")


def test_hopper_long_context_runs_are_predicted_within_8_percent():
    res = lc.check(lc.DEFAULT_CSV)
    h100 = [r for r in res["rows"] if r["gpu_type"] == "H100"]
    assert len(h100) == 9 and max(r["seq_len"] for r in h100) == 1048576 and max(r["cp"] for r in h100) == 32
    assert all(abs(r["predicted_over_published"] - 1) < 0.08 for r in h100)
    assert res["by_gpu"]["H100"]["mape"] < 5.0
