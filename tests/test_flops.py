"""FLOP counts against Megatron's published formulas.

- Korthikanti et al. 2022 (arXiv:2205.05198), Appendix A, Eq. 7: model FLOPs per iteration
  ``72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L))`` (no recompute, attention counted whole).
- Narayanan et al. 2021 (arXiv:2104.04473), Eq. 3: ``96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h))``, the
  same count plus the recompute forward of every layer (full activation recomputation); the LM head
  is not recomputed, so only the layer part scales by 4/3 (data/validation/SOURCES.md).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from costmodel.flops import korthikanti_eq7, layer_forward_flops, model_flops_per_step, narayanan_eq3
from costmodel.specs import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "data" / "validation" / "published_runs.csv"
REL = 1e-9


def gpt(layers: int, hidden: int, heads: int, *, vocab: int = 51200, seq_len: int = 2048,
        ffn_hidden: int | None = None, name: str = "gpt") -> ModelSpec:
    """A Megatron GPT as the papers count it: two-matrix MLP of width 4h, multi-head attention,
    tied input/output embedding."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, ffn_hidden=ffn_hidden or 4 * hidden, heads=heads,
                     kv_heads=None, vocab=vocab, seq_len=seq_len, gated_mlp=False, tied_embeddings=True,
                     learned_position_embeddings=True, precision="fp16")


# (name, layers, hidden, heads, global batch B)
KORTHIKANTI_TABLE3 = [
    ("22B", 48, 6144, 64, 4),
    ("GPT-3 175B", 96, 12288, 96, 64),
    ("MT-NLG 530B", 105, 20480, 128, 280),
    ("1T", 128, 25600, 160, 512),
]


@pytest.mark.parametrize("name,layers,hidden,heads,batch", KORTHIKANTI_TABLE3,
                         ids=[r[0] for r in KORTHIKANTI_TABLE3])
def test_model_flops_match_korthikanti_eq7_table3(name, layers, hidden, heads, batch):
    """Korthikanti et al. 2022, Table 3 models (s=2048, V=51200): model FLOPs per step are Eq. 7."""
    model = gpt(layers, hidden, heads, name=name)
    got = float(model_flops_per_step(model, batch))
    want = korthikanti_eq7(batch, layers, 2048, hidden, 51200)
    assert got == pytest.approx(want, rel=REL)
    # The literal formula, written out here rather than trusted from costmodel.flops.
    B, L, s, h, V = batch, layers, 2048, hidden, 51200
    assert want == pytest.approx(72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L)), rel=1e-12)


def _mlm_paper_t1_rows() -> list[dict[str, str]]:
    with PUBLISHED.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source_id"] == "MLM_PAPER_T1"]
    return [r for r in rows if r["model_name"].startswith("GPT")]


MLM_ROWS = _mlm_paper_t1_rows()


def test_mlm_paper_t1_rows_present():
    """Narayanan et al. 2021 Table 1: 10 weak-scaling rows plus the GPT-3 175B text row."""
    assert len(MLM_ROWS) == 11


def _row_model(row: dict[str, str]) -> tuple[ModelSpec, int]:
    ffn = int(row["ffn_hidden"]) if row["ffn_hidden"].strip() else None
    model = gpt(int(row["layers"]), int(row["hidden"]), int(row["heads"]), vocab=int(row["vocab"]),
                seq_len=int(row["seq_len"]), ffn_hidden=ffn, name=row["model_name"])
    return model, int(row["global_batch"])


@pytest.mark.parametrize("row", MLM_ROWS, ids=[r["model_name"].split(" ")[0] for r in MLM_ROWS])
def test_narayanan_eq3_is_eq7_plus_recompute_forward(row):
    """Narayanan et al. 2021, Table 1 rows: Eq. 3 counts 4 passes of the layer stack (forward, backward
    = 2x forward, recompute forward) and 3 of the LM head, Eq. 7 counts 3 of each, so
    Eq. 3 = 4/3 * (Eq. 7 - 6BshV) + 6BshV, and the model's FLOPs plus one layer-stack forward is Eq. 3."""
    model, B = _row_model(row)
    L, s, h, V = model.layers, model.seq_len, model.hidden, model.vocab
    assert model.ffn_hidden == 4 * h
    eq3 = narayanan_eq3(B, L, s, h, V)
    eq7 = korthikanti_eq7(B, L, s, h, V)
    logits = 6.0 * B * s * h * V            # LM head forward + backward, never recomputed
    # Eq. 3 exactly as SOURCES.md and the row's notes print it: F = 96*B*s*l*h^2*(1 + s/6h + V/16lh).
    assert eq3 == pytest.approx(96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)
    assert eq3 == pytest.approx((eq7 - logits) * 4.0 / 3.0 + logits, rel=REL)
    assert eq3 == pytest.approx(eq7 * 4.0 / 3.0 - 2.0 * B * s * h * V, rel=REL)

    model_flops = float(model_flops_per_step(model, B))
    assert model_flops == pytest.approx(eq7, rel=REL)
    f = layer_forward_flops(model, B * s, s, moe=False, causal=False)
    recompute_forward = L * float(f["gemm"] + f["expert"] + f["attn"])
    assert model_flops + recompute_forward == pytest.approx(eq3, rel=REL)


@pytest.mark.parametrize("row", MLM_ROWS, ids=[r["model_name"].split(" ")[0] for r in MLM_ROWS])
def test_mlm_paper_t1_step_time_is_eq3_over_throughput(row):
    """The rows' step_time_s was derived as Eq. 3 / (TFLOP/s per GPU * GPUs); printed to 6 digits."""
    model, B = _row_model(row)
    eq3 = narayanan_eq3(B, model.layers, model.seq_len, model.hidden, model.vocab)
    implied = eq3 / (float(row["measured_value"]) * 1e12 * int(row["num_gpus"]))
    assert float(row["step_time_s"]) == pytest.approx(implied, rel=1e-4)


def test_gpt3_175b_layer_forward_by_hand():
    """GPT-3 175B (h=12288, a=96, s=2048), T tokens: one layer's forward GEMMs are QKV 2*T*h*3h +
    output projection 2*T*h*h + FC1 2*T*h*4h + FC2 2*T*4h*h = 24*T*h^2; the attention core
    QK^T 2*T*s*h + PV 2*T*s*h = 4*T*s*h without the causal mask, half of it with."""
    model = gpt(96, 12288, 96, name="GPT-3 175B")
    h, s = 12288, 2048
    for T in (2048, 4 * 2048, 1536 * 2048):
        f = layer_forward_flops(model, T, s, moe=False, causal=False)
        qkv, proj, fc1, fc2 = 2 * T * h * 3 * h, 2 * T * h * h, 2 * T * h * 4 * h, 2 * T * 4 * h * h
        assert qkv + proj + fc1 + fc2 == 24 * T * h**2
        assert float(f["gemm"]) == pytest.approx(24 * T * h**2, rel=REL)
        assert float(f["attn"]) == pytest.approx(4 * T * s * h, rel=REL)
        assert float(f["expert"]) == 0.0
        fc = layer_forward_flops(model, T, s, moe=False, causal=True)
        assert float(fc["attn"]) == pytest.approx(2 * T * s * h, rel=REL)
        assert float(fc["gemm"]) == pytest.approx(float(f["gemm"]), rel=REL)


def test_model_flops_broadcast_over_batches():
    """model_flops_per_step vectorises over global batches and is linear in them."""
    model = gpt(96, 12288, 96)
    batches = np.array([1, 64, 1536])
    got = model_flops_per_step(model, batches)
    want = np.array([korthikanti_eq7(b, 96, 2048, 12288, 51200) for b in batches])
    np.testing.assert_allclose(got, want, rtol=REL)
