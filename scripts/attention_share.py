"""The cost model's attention-core rate beside the stored kernel microbenchmarks.

    python scripts/attention_share.py [--json OUT]

For every full-attention row of data/validation/attention.csv (cuDNN on GB200, B200 and GB300,
FlashAttention-3 on H100), the forward and backward TFLOP/s the shipped profile of that GPU prices the same
call at (costmodel.compute.attention_time_s: causal, bf16, the row's length and head dimension) and its share of
the measured rate. The model's rate is what end-to-end runs fitted (the attention factor and the GEMM curve it
rides on), so a share below 1 says how far training's attention stays from the kernel alone; the README's
long-context paragraph quotes the 64k figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from costmodel.compute import attention_time_s  # noqa: E402
from costmodel.profiles import load_profile  # noqa: E402

DATA = ROOT / "data" / "validation" / "attention.csv"


def causal_fwd_flops(batch: float, kv_tokens: float, q_heads: float, head_dim: float) -> float:
    """Forward FLOPs of causal attention as the benchmarks count them: QK^T and PV, half the square."""
    return 4.0 * batch * kv_tokens * kv_tokens * q_heads * head_dim / 2.0


def shares(path: Path = DATA) -> list[dict]:
    """One dict per full-attention benchmark row: measured and modelled TFLOP/s, forward and backward."""
    out = []
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r["sliding_window"].strip()]
    for r in rows:
        prof = load_profile(r["gpu_type"])
        kv, hd = float(r["kv_tokens"]), float(r["head_dim"])
        flops = causal_fwd_flops(float(r["batch"]), kv, float(r["q_heads"]), hd)
        t_f, t_b = attention_time_s(prof, flops, kv, hd)
        model_f, model_b = flops / float(t_f) / 1e12, 2.5 * flops / float(t_b) / 1e12
        bwd = float(r["bwd_tflops"]) if r["bwd_tflops"].strip() else None
        out.append({"source_id": r["source_id"], "gpu_type": r["gpu_type"], "kv_tokens": int(kv),
                    "head_dim": int(hd), "measured_fwd_tflops": float(r["fwd_tflops"]),
                    "model_fwd_tflops": model_f, "fwd_share": model_f / float(r["fwd_tflops"]),
                    "measured_bwd_tflops": bwd, "model_bwd_tflops": model_b,
                    "bwd_share": model_b / bwd if bwd else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = shares()
    print(f"{'GPU':6} {'source':28} {'kv':>7} {'hd':>4}  {'fwd meas':>8} {'model':>6} {'share':>5}  "
          f"{'bwd meas':>8} {'model':>6} {'share':>5}")
    for x in rows:
        bwd = (f"{x['measured_bwd_tflops']:8.0f} {x['model_bwd_tflops']:6.0f} {x['bwd_share']:5.2f}"
               if x["measured_bwd_tflops"] else f"{'-':>8} {x['model_bwd_tflops']:6.0f} {'-':>5}")
        print(f"{x['gpu_type']:6} {x['source_id']:28} {x['kv_tokens']:7d} {x['head_dim']:4d}  "
              f"{x['measured_fwd_tflops']:8.0f} {x['model_fwd_tflops']:6.0f} {x['fwd_share']:5.2f}  {bwd}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
