"""Score the cost model on NeMo's long-context tables, which it is never fitted to.

data/validation/published_runs.csv holds NeMo's long-sequence performance tables (source NEMO_LONGSEQ: Llama 2 7B
on DGX-H100, NeMo 24.03.01, 4K-1M tokens; Llama 3 8B on DGX-B200, NeMo 25.04.rc2, 8K-1M tokens; FP8, context
parallelism up to 32). Their rows are not scored (``scored=false``) because they publish model TFLOP/s per GPU,
not a step time, and a FLOP figure means a step time only under the source's own FLOP formula. For these tables
that formula is NeMo's (``nemo/utils/flops_formulas.py``, llama2 / llama3): per step

    gbs * s * L * h^2 * (12 + 12 * kv_heads / heads + 18 * ffn / h + 12 * s / h + 6 * V / (L * h))

with attention counted without the causal half and V from NeMo's LLM_VOCAB_SIZE_MAP (Llama 2: 32,000; Llama 3:
128,256). This script turns each row with a published layout (TP, CP, DP; the "without CP" rows publish none)
into a step time on TP x PP x CP x DP GPUs, predicts it with the shipped profiles, and prints predicted /
published per row and the MAPE per GPU type. At these lengths the attention core is most of the step, so the
rows test the attention and context-parallel terms where the fitted runs (2K-8K tokens) say least.

    python scripts/long_context_check.py [data/validation/published_runs.csv] [--json OUT]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.validate import load_cases, predict_case  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "validation" / "published_runs.csv"
SOURCE = "NEMO_LONGSEQ"
# NeMo's vocabulary sizes in its FLOP formulas (nemo/collections/common/parts/perf_metrics_utils.py
# LLM_VOCAB_SIZE_MAP), by the model family the row's name gives.
NEMO_VOCAB = {"llama2": 32000, "llama3": 128256}


def nemo_llama_flops(gbs: int, seq_len: int, layers: int, hidden: int, ffn_hidden: int, heads: int, kv_heads: int,
                     vocab: int) -> float:
    """Model FLOPs of one step as NeMo counts them for the Llama families (flops_formulas.py llama2 / llama3)."""
    return float(gbs) * seq_len * layers * hidden * hidden * (
        12 + 12 * kv_heads / heads + 18 * ffn_hidden / hidden + 12 * seq_len / hidden + 6 * vocab / (layers * hidden))


def family(model_name: str) -> str:
    name = model_name.lower().replace(" ", "").replace("-", "")
    for key in NEMO_VOCAB:
        if key in name:
            return key
    raise ValueError(f"{model_name!r}: not a Llama 2 / Llama 3 row (NeMo's formula is known for those only)")


def scored_rows(path: Path) -> list[dict]:
    """The source's rows with a published layout, as scored rows with the step time NeMo's formula gives."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["source_id"] == SOURCE and r["tp"].strip()]
    out = []
    for r in rows:
        deg = {k: int(r[k] or 1) for k in ("tp", "pp", "cp", "dp")}
        gpus = deg["tp"] * deg["pp"] * deg["cp"] * deg["dp"]
        flops = nemo_llama_flops(int(r["global_batch"]), int(r["seq_len"]), int(r["layers"]), int(r["hidden"]),
                                 int(r["ffn_hidden"]), int(r["heads"]), int(r["kv_heads"]),
                                 NEMO_VOCAB[family(r["model_name"])])
        step = flops / (float(r["measured_value"]) * 1e12 * gpus)
        out.append({**r, "num_gpus": str(gpus), "step_time_s": f"{step:.6g}", "scored": "true",
                    "step_time_derivation": "NeMo llama FLOPs / (model_tflops_per_gpu x tp x pp x cp x dp)"})
    return out


def check(path: Path) -> dict:
    rows = scored_rows(path)
    if not rows:
        raise SystemExit(f"{path}: no {SOURCE} rows with a published layout")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "long_context.csv"
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        cases, errors = load_cases(tmp)
    if errors:
        raise SystemExit(errors[0]["error"])
    out = []
    for c, r in zip(cases, rows, strict=True):
        pred = predict_case(c)
        p = pred["plan"]
        out.append({"gpu_type": c.gpu_type, "model": c.model.name, "gpus": int(r["num_gpus"]),
                    "seq_len": c.model.seq_len, "tp": p.tp, "pp": p.pp, "cp": p.cp, "dp": p.dp,
                    "published_tflops_per_gpu": float(r["measured_value"]),
                    "published_step_time_s": c.published_step_time_s,
                    "predicted_step_time_s": pred["predicted_step_time_s"],
                    "predicted_over_published": pred["predicted_step_time_s"] / c.published_step_time_s})
    by_gpu = {}
    for g in sorted({r["gpu_type"] for r in out}):
        ape = [abs(r["predicted_over_published"] - 1) * 100 for r in out if r["gpu_type"] == g]
        by_gpu[g] = {"rows": len(ape), "mape": round(float(np.mean(ape)), 2), "max_ape": round(float(np.max(ape)), 2)}
    return {"rows": out, "by_gpu": by_gpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    ap.add_argument("--json", help="write the rows and the summary to this file")
    args = ap.parse_args()
    res = check(Path(args.csv))
    print(f"{'GPU':<6} {'GPUs':>5} {'seq':>8} {'tp':>3} {'pp':>3} {'cp':>3} {'dp':>3} {'TFLOP/s':>8} "
          f"{'published s':>12} {'predicted s':>12} {'pred / pub':>10}")
    for r in res["rows"]:
        print(f"{r['gpu_type']:<6} {r['gpus']:>5} {r['seq_len']:>8} {r['tp']:>3} {r['pp']:>3} {r['cp']:>3} "
              f"{r['dp']:>3} {r['published_tflops_per_gpu']:>8.0f} {r['published_step_time_s']:>12.2f} "
              f"{r['predicted_step_time_s']:>12.2f} {r['predicted_over_published']:>10.2f}")
    for g, s in res["by_gpu"].items():
        print(f"{g}: {s['rows']} rows, MAPE {s['mape']:.1f}% (largest {s['max_ape']:.1f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
