"""Score the cost model on published runs the shared CSV leaves unscored, completed from public facts.

data/validation/published_runs.csv marks a row ``scored=false`` where its step time or core configuration is not
in the source. Four groups of such rows can be completed without a guess, and the cost model is never fitted to
them, so they test it where the fitted runs say least:

- ``long-context``: NeMo's long-sequence tables (source NEMO_LONGSEQ: Llama 2 7B on DGX-H100, NeMo 24.03.01,
  4K-1M tokens; Llama 3 8B on DGX-B200, NeMo 25.04.rc2, 8K-1M tokens; FP8, context parallelism up to 32). They
  publish model TFLOP/s per GPU, which is a step time under the source's own FLOP formula, NeMo's
  (``nemo/utils/flops_formulas.py``, llama2 / llama3), per step

      gbs * s * L * h^2 * (12 + 12 * kv_heads / heads + 18 * ffn / h + 12 * s / h + 6 * V / (L * h))

  with attention counted without the causal half and V from NeMo's LLM_VOCAB_SIZE_MAP (Llama 2: 32,000; Llama 3:
  128,256), on TP x PP x CP x DP GPUs. The "without CP" rows publish no layout and are left out. At these lengths
  the attention core is most of the step: the rows test the attention and context-parallel terms.
- ``grok-1``: DGX Cloud benchmarking's Grok-1 314B on H100 (NeMo, bf16 and FP8, 32 to 2,048 GPUs, reduced layer
  counts below 512 GPUs), with published step times but no widths in the CSV. They come from the architecture
  xAI published (github.com/xai-org/grok-1 run.py: emb_size 48 x 128 = 6,144, 48 query / 8 key-value heads of
  128, widening_factor 8 -> expert width 32,768 by model.py ffn_size, 8 experts top-2, vocabulary 128 x 1,024;
  a gated GeLU MLP). The 8- and 16-GPU rows are left out: their global batch disagrees with DP x micro-batch x
  gradient accumulation (data/validation/SOURCES.md, inconsistency 6). These are the only MoE runs outside the
  Megatron-Bridge archive: they test the MoE terms on another source.
- ``kimi-k2``: the Megatron-Bridge archive's Kimi K2 on 256 GB300 (MXFP8, four releases), with published step
  times and layouts but no widths in the CSV; the catalog's kimi-k2 (Moonshot AI's published config, the
  DeepSeek-V3 architecture with 384 experts and 64 heads) gives them by the row's name. A model the fit has not
  seen, on the source the MoE factors are fitted to. The table notes that the runs used the Muon optimizer; the
  rows are priced with it (costmodel/validate.py optimizer_of, costmodel/muon.py).
- ``nemotron-3``: the archive's Nemotron 3 Nano (8-16 GPUs) and Super (64 GPUs) on H100, B200, B300, GB200 and
  GB300 (FP8, MXFP8, NVFP4, releases 26.02.01-26.06.01), hybrid Mamba-2 / attention / MoE models with step times
  and layouts but no widths in the CSV; the catalog's nemotron-3-nano and nemotron-3-super (Megatron-Bridge's
  Nemotron3NanoProvider / Nemotron3SuperProvider: layer patterns, Mamba widths, LatentMoE) give them by name. The
  only runs of Mamba layers in the data: they test the hybrid model's pricing (costmodel/estimate.py
  _hybrid_means), which no fit has seen.

For each row: the published and the predicted step time (shipped profiles) with its P10-P90 and their ratio, then
per GPU type and precision the MAPE and how many published step times fall inside their P10-P90.

    python scripts/unscored_runs.py [data/validation/published_runs.csv] [--json OUT]
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

from costmodel.validate import interval_fields, load_cases, predict_case  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "validation" / "published_runs.csv"
LONG_CONTEXT_SOURCE = "NEMO_LONGSEQ"
# NeMo's vocabulary sizes in its FLOP formulas (nemo/collections/common/parts/perf_metrics_utils.py
# LLM_VOCAB_SIZE_MAP), by the model family the row's name gives.
NEMO_VOCAB = {"llama2": 32000, "llama3": 128256}
# Grok-1's widths come from the catalog's grok-1 (costmodel/catalog.py: xai-org/grok-1 run.py grok_1_model and
# model.py ffn_size), which the CSV reader takes by the rows' name; the name gives the gated MLP
# (costmodel.validate row_model).
GROK1_MIN_GPUS = 32


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


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def long_context_rows(rows: list[dict]) -> list[dict]:
    """NEMO_LONGSEQ's rows with a published layout, as scored rows with the step time NeMo's formula gives."""
    out = []
    for r in rows:
        if r["source_id"] != LONG_CONTEXT_SOURCE or not r["tp"].strip():
            continue
        deg = {k: int(r[k] or 1) for k in ("tp", "pp", "cp", "dp")}
        gpus = deg["tp"] * deg["pp"] * deg["cp"] * deg["dp"]
        flops = nemo_llama_flops(int(r["global_batch"]), int(r["seq_len"]), int(r["layers"]), int(r["hidden"]),
                                 int(r["ffn_hidden"]), int(r["heads"]), int(r["kv_heads"]),
                                 NEMO_VOCAB[family(r["model_name"])])
        step = flops / (float(r["measured_value"]) * 1e12 * gpus)
        out.append({**r, "num_gpus": str(gpus), "step_time_s": f"{step:.6g}", "scored": "true",
                    "step_time_derivation": "NeMo llama FLOPs / (model_tflops_per_gpu x tp x pp x cp x dp)"})
    return out


def grok1_rows(rows: list[dict]) -> list[dict]:
    """The Grok-1 rows on GROK1_MIN_GPUS or more GPUs as scored rows (the catalog's grok-1 gives their widths)."""
    return [{**r, "scored": "true"} for r in rows
            if r["model_name"].lower().startswith("grok-1") and r["step_time_s"].strip()
            and int(r["num_gpus"]) >= GROK1_MIN_GPUS]


def kimi_k2_rows(rows: list[dict]) -> list[dict]:
    """The Kimi K2 rows with a step time, as scored rows (their widths come from the catalog by name)."""
    return [{**r, "scored": "true"} for r in rows
            if r["model_name"].lower().startswith("kimi-k2") and r["step_time_s"].strip()]


def nemotron3_rows(rows: list[dict]) -> list[dict]:
    """The Nemotron 3 Nano and Super rows with a step time, as scored rows (hybrid Mamba models: the catalog gives
    their layer patterns and widths by name)."""
    return [{**r, "scored": "true"} for r in rows
            if r["model_name"].lower().startswith("nemotron-3-") and r["step_time_s"].strip()]


GROUPS = {"long-context": long_context_rows, "grok-1": grok1_rows, "kimi-k2": kimi_k2_rows,
          "nemotron-3": nemotron3_rows}


def cases_of(rows: list[dict], fields: list[str]) -> list:
    """The completed rows read as ``plan validate`` reads a CSV's scored rows (costmodel.validate.Case)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "unscored.csv"
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        cases, errors = load_cases(tmp)
    if errors:
        raise SystemExit(errors[0]["error"])
    return cases


def predict_rows(rows: list[dict], fields: list[str]) -> list[dict]:
    """Each completed row predicted as ``plan validate`` predicts a scored row (shipped profiles)."""
    out = []
    for c, r in zip(cases_of(rows, fields), rows, strict=True):
        pred = predict_case(c)
        p = pred["plan"]
        iv = interval_fields(c, p, pred["predicted_step_time_s"])
        lo, hi = iv["predicted_p10_step_time_s"], iv["predicted_p90_step_time_s"]
        out.append({"gpu_type": c.gpu_type, "model": c.model.name, "precision": c.model.precision,
                    "gpus": int(r["num_gpus"]), "seq_len": c.model.seq_len, "layers": c.model.layers,
                    "tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "dp": p.dp, "fits": pred["fits"],
                    "published_step_time_s": c.published_step_time_s,
                    "predicted_step_time_s": pred["predicted_step_time_s"],
                    "predicted_over_published": pred["predicted_step_time_s"] / c.published_step_time_s,
                    "predicted_p10_step_time_s": lo, "predicted_p90_step_time_s": hi,
                    "inside_p10_p90": lo is not None and lo <= c.published_step_time_s <= hi})
    return out


def _summary(rows: list[dict], key) -> dict:
    out = {}
    for k in sorted({key(r) for r in rows}):
        ape = [abs(r["predicted_over_published"] - 1) * 100 for r in rows if key(r) == k]
        out[k] = {"rows": len(ape), "mape": round(float(np.mean(ape)), 2), "max_ape": round(float(np.max(ape)), 2),
                  "inside_p10_p90": sum(r["inside_p10_p90"] for r in rows if key(r) == k)}
    return out


def check(path: Path) -> dict:
    """{group: {"rows": [...], "by_gpu": {...}, "by_precision": {...}}} for every group of GROUPS with rows in
    the CSV."""
    fields, csv_rows = _read(path)
    out = {}
    for name, rows_of in GROUPS.items():
        rows = rows_of(csv_rows)
        if not rows:
            continue   # a CSV without this group's rows
        scored = predict_rows(rows, fields)
        out[name] = {"rows": scored, "by_gpu": _summary(scored, lambda r: r["gpu_type"]),
                     "by_precision": _summary(scored, lambda r: r["precision"])}
    return out


def _interval(r: dict) -> str:
    lo, hi = r["predicted_p10_step_time_s"], r["predicted_p90_step_time_s"]
    band = f" ({lo:.2f}-{hi:.2f})" if lo is not None else ""
    return f"{r['predicted_step_time_s']:.2f}{band}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    ap.add_argument("--json", help="write the rows and the summaries to this file")
    args = ap.parse_args()
    res = check(Path(args.csv))
    if not res:
        print(f"{args.csv}: no rows of any group ({', '.join(GROUPS)}); expected the unscored rows of "
              f"data/validation/published_runs.csv", file=sys.stderr)
        return 2
    for name, g in res.items():
        print(f"{name}:")
        print(f"  {'GPU':<6} {'prec':<5} {'GPUs':>5} {'layers':>6} {'seq':>8} {'tp':>3} {'pp':>3} {'cp':>3} {'ep':>3} "
              f"{'dp':>3} {'published s':>12} {'predicted s (P10-P90)':>24} {'pred / pub':>10}")
        for r in g["rows"]:
            print(f"  {r['gpu_type']:<6} {r['precision']:<5} {r['gpus']:>5} {r['layers']:>6} {r['seq_len']:>8} "
                  f"{r['tp']:>3} {r['pp']:>3} {r['cp']:>3} {r['ep']:>3} {r['dp']:>3} "
                  f"{r['published_step_time_s']:>12.2f} {_interval(r):>24} {r['predicted_over_published']:>10.2f}")
        for by in ("by_gpu", "by_precision"):
            for k, s in g[by].items():
                print(f"  {k}: {s['rows']} rows, MAPE {s['mape']:.1f}% (largest {s['max_ape']:.1f}%), "
                      f"{s['inside_p10_p90']} inside their P10-P90")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
