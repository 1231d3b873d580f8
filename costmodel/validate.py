"""Scoring the cost model against published training runs (``plan validate``).

Reads any CSV with the columns of ``data/validation/published_runs.csv``; every ``scored=true`` row
is turned into (model, cluster, plan, framework: the ``framework`` column) and predicted. Fields the
source did not publish are filled the way the row's framework fills them by default, and each row says
what was assumed.
"""

from __future__ import annotations

import csv
import math
import re
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from costmodel.catalog import catalog, catalog_names, get_model, named_in
from costmodel.compute import gemm_dtype
from costmodel.estimate import FRAMEWORK, estimate_arrays
from costmodel.fit import factor_rows
from costmodel.flops import total_params
from costmodel.profiles import (HardwareProfile, InputError, cluster_of, instance_named, load_profile, read_text,
                                server_gpus, with_nic)
from costmodel.plan import ParallelPlan, PlanArrays, data_parallel, even_split, node_replicas
from costmodel.specs import HYBRID_KINDS, INT64_MAX, PRECISION_ALIASES, ClusterSpec, ModelSpec

REQUIRED_COLUMNS = ("source_id", "model_name", "layers", "hidden", "heads", "seq_len", "gpu_type", "num_gpus",
                    "tp", "pp", "global_batch")
# A row's published step time: the ``step_time_s`` column, or, where that column is absent or empty, derived
# from ``measured_metric`` / ``measured_value`` for the metrics that determine it without a FLOP convention
# (a TFLOP/s or MFU figure depends on the source's FLOP formula, so it is not converted). Without a
# ``scored`` column every row with a step time is scored.
STEP_TIME_METRICS = {
    "step_time_s": lambda v, row: v,
    "step_time_ms": lambda v, row: v / 1e3,
    "elapsed_time_per_iteration_ms": lambda v, row: v / 1e3,
    "tokens_per_sec_per_gpu": lambda v, row: row["global_batch"] * row["seq_len"] / (v * row["num_gpus"]),
    "tokens_per_sec": lambda v, row: row["global_batch"] * row["seq_len"] / v,
    "samples_per_sec": lambda v, row: row["global_batch"] / v,
    "sequences_per_sec": lambda v, row: row["global_batch"] / v,
    "steps_per_sec": lambda v, row: 1.0 / v,
}
# The same metrics as tables spell them ('tokens/s/GPU', 'Tokens per second per GPU', 'iteration time (ms)',
# 'sec/iter', 'samples/s', 'it/s'): words reduced to one spelling each, then read by what they name.
_METRIC_WORDS = ((r"\b(seconds?|secs?)\b", "s"), (r"\b(milliseconds?|msecs?)\b", "ms"),
                 (r"\b(tok|tokens?)\b", "tokens"), (r"\b(samples?|sequences?|seqs?)\b", "samples"),
                 (r"\b(gpus?|devices?|accelerators?)\b", "gpu"), (r"\b(iterations?|iters?|it|steps?)\b", "step"),
                 (r"\s*\bper\b\s*", "/"))
_METRIC_FORMS = ((r"tokens.*/\s*s\b.*/\s*gpu|tokens.*/\s*gpu.*/\s*s\b", "tokens_per_sec_per_gpu"),
                 (r"tokens.*/\s*s\b", "tokens_per_sec"), (r"samples.*/\s*s\b", "samples_per_sec"),
                 (r"step\s*/\s*s\b", "steps_per_sec"), (r"\bms\b.*step|step.*\bms\b", "step_time_ms"),
                 (r"\bs\b.*step|step.*\bs\b", "step_time_s"))    # a time without its unit is not read


def metric_named(text: str) -> str:
    """The STEP_TIME_METRICS key a measured_metric spelling names ('' if none): the key itself, or a spelling
    such as 'tokens/s/GPU', 'Tokens per second per GPU', 'step time (ms)', 'sec/iter' or 'it/s'."""
    key = text.strip().lower()
    if key in STEP_TIME_METRICS or not key:
        return key
    t = key.replace("_", " ").replace("(", " ").replace(")", " ")
    if re.search(r"flop|mfu|hfu|util", t):
        return ""    # a FLOP figure depends on the source's FLOP formula (above)
    for pattern, word in _METRIC_WORDS:
        t = re.sub(pattern, word, t)
    return next((name for pattern, name in _METRIC_FORMS if re.search(pattern, t)), "")


class NoStepTime(ValueError):
    """A row that publishes no step time (nor a figure that gives one without a FLOP convention)."""


def published_step_time(row: dict) -> float:
    """The row's published step time in seconds (see STEP_TIME_METRICS); NoStepTime naming the columns when
    it has none."""
    direct = _num(row.get("step_time_s", ""))
    if direct is not None:
        return direct
    raw = (row.get("measured_metric") or "").strip().lower()
    metric = metric_named(raw) or raw
    value = _num(row.get("measured_value", ""))
    # A multiple in the metric's name: 'tokens/s/GPU (k)', 'throughput (millions of tokens/s)'.
    multiple = re.search(r"\(\s*(k|thousands?|m|millions?)(?:\s+of\b[^)]*)?\s*\)", raw)
    if value is not None and multiple:
        value *= 1e3 if multiple.group(1).startswith(("k", "t")) else 1e6
    if metric in STEP_TIME_METRICS and value and value > 0:
        nums = {k: float(row[k]) for k in ("global_batch", "seq_len", "num_gpus")}
        return float(STEP_TIME_METRICS[metric](value, nums))
    raise NoStepTime(f"column 'step_time_s' is empty and measured_metric {metric or '(empty)'!r} does not give a "
                     f"step time; valid metrics: {', '.join(STEP_TIME_METRICS)}")

# Catalog entries whose architecture details (MLA, head width, leading dense layers, shared experts,
# vocabulary) fill what a row leaves out, matched on the row's model name.
_FAMILY = (*((name, name) for name in (
               "nemotron-3-nano", "nemotron-3-super", "nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b",
               "nemotron-nano-9b-v2", "nemotron-nano-12b-v2", "deepseek-v3", "kimi-k2", "gpt-oss-120b",
               "nemotron4-340b",
               # named with their size: a family's other sizes have other widths the row may leave blank
               "llama-33b", "llama-65b", "mistral-7b", "qwen2.5-32b", "qwen2.5-72b", "gpt-oss-20b", "dbrx",
               "falcon-7b", "falcon-180b", "bloom-176b", "opt-175b", "gpt-neox-20b", "yi-34b", "codellama-34b",
               "gemma-2-9b", "gemma-2-27b", "phi-3-medium", "glm-4.5-air", "glm-4.5", "minimax-m2", "llama4-scout",
               "llama4-maverick", "mixtral-8x22b")),
           ("qwen3-30b", "qwen3-30b-a3b"), ("qwen3-235b", "qwen3-235b-a22b"), ("mixtral", "mixtral-8x7b"),
           ("nemotron-340b", "nemotron4-340b"), ("qwen2-57b", "qwen2-57b-a14b"), ("code-llama-34b", "codellama-34b"),
           ("qwen3-coder-480b", "qwen3-coder-480b-a35b"), ("llama-4-scout", "llama4-scout"),
           ("llama-4-maverick", "llama4-maverick"))
# Names of families whose MLP is gated (SwiGLU / GeGLU), for a row outside the catalog's families.
_GATED = ("llama", "qwen", "mixtral", "deepseek", "gpt-oss", "mistral", "grok", "dbrx", "gemma", "olmo", "phi-3",
          "yi-", "internlm", "baichuan", "glm-4", "chatglm", "minicpm")
# What a model name says of a row outside the catalog's families, for the fields the row leaves blank.
# Llama 2: the Llama 1 tokenizer's 32,000 tokens (Touvron et al. 2023, "Llama 2", Sec. 2.1). Nemotron-3/-4
# (NeMo nemo/collections/llm/gpt/model/nemotron.py NemotronConfig, as ARCH_nemo_configs cites): squared-ReLU
# 2-matrix MLP, LayerNorm with zero-centred gamma, no biases, no dropout, rope on half the head, untied
# embeddings; the 256,000-token vocabulary of Nemotron-4 (Parmar et al. 2024, arXiv:2402.16819, Sec. 2).
_NAMED_DEFAULTS = (
    (re.compile(r"llama[- ]?2"), "Llama 2", dict(vocab=32000)),
    (re.compile(r"nemotron"), "Nemotron", dict(vocab=256000, activation="squared_relu", normalization="LayerNorm1p",
                                   linear_bias=False, attention_dropout=0.0, hidden_dropout=0.0,
                                   rotary_percent=0.5, tied_embeddings=False, learned_position_embeddings=False)),
)
# A token-drop MoE run, as the model name or notes say it ("(token-drop)", "token drop", "drop-and-pad",
# "capacity factor 1.0"), not "token-dropless".
_TOKEN_DROP = re.compile(r"token[-_ ]drop(?!less|-less| less)|drop[-_ ]and[-_ ]pad|capacity[-_ ]factor", re.I)


@dataclass
class Case:
    """One scored row as the cost model sees it."""

    row: int
    source_id: str
    gpu_type: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    published_step_time_s: float
    recompute_known: bool
    assumed: list[str] = field(default_factory=list)
    release: str = ""
    """The software release (container or framework version) the notes name; '' if unsaid."""
    vpp_known: bool = True
    """False where a pipelined run's row leaves its interleaving (vp) blank."""
    micro_batch_known: bool = True
    """False where a row leaves its micro-batch blank and the stack has no reason to run 1 (micro_batch_open)."""
    ep_known: bool = True
    """False where a MoE row leaves its expert parallelism blank (expert_options)."""
    open_degrees: tuple[str, ...] = ()
    """"tp" / "pp" where the row leaves them (and dp) blank: read as 1 (fill_degrees) unless that does not fit
    (degree_options)."""
    alternatives: tuple = ()
    """A row that gives dp but neither tp nor pp: a case for each split of their product (the GPU count's,
    product_splits), of which predict_case takes the fastest that fits; this case is the first of them."""
    stage_named: bool = False
    """True where the sharding column names the ZeRO stage outright (stage_named): the stage the run ran, raised
    (sharding_fallbacks) only where nothing else the row leaves open makes the layout fit."""
    stack_interleaves: str = ""
    """Where a row of a stack other than Megatron names one whose pipeline schedule is documented to be
    interleaved (interleaving_stack), where that is documented: an unpublished vp is then read as a megatron-core
    row's is; '' otherwise."""
    a2a_overlap_open: bool = False
    """True where the notes name the MoE all-to-all overlap but the row leaves vp blank with pp > 1, which
    megatron-core runs the overlap only with (interleaved): predict_case turns it on for each interleaving it tries
    that allows it (_with_named_overlap)."""


# Marks a table puts after a number to point at a footnote.
_FOOTNOTE_MARKS = "*\u2020\u2021\u00a7"
# How a numeric column says "not published" (read as blank).
_ABSENT = ("unknown", "n/a", "na", "-", "none", "null")


def _num(v: str) -> float | None:
    v = (v or "").strip()
    if v == "" or v.lower() in _ABSENT:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _int(v: str) -> int | None:
    """A count; None where the cell holds none (blank, text, or not finite: 'inf' and 'nan' count nothing)."""
    x = _num(v)
    return None if x is None or not math.isfinite(x) else int(round(x))


# A number as tables print it: thousands separators ("12,288"), a k / M multiple ("8k" tokens, "16K" GPUs,
# "1.5k"), which for the counts of this schema (sequence lengths, GPUs, batches) is binary: 8k tokens are 8,192.
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_MULTIPLE = re.compile(r"(\d+(?:\.\d+)?)\s*([kKmM])(i?)")
_COUNT_COLUMNS = ("seq_len", "num_gpus", "global_batch", "micro_batch", "layers", "hidden", "ffn_hidden", "vocab",
                  "gpus_per_node", "tp", "pp", "vp", "cp", "ep", "dp", "heads", "kv_heads", "moe_experts",
                  "moe_topk")


def _tokens_to_sequences(tokens_dec: float, tokens_bin: float, seq_len: int) -> int:
    """Sequences of ``seq_len`` in a batch given in tokens ("4M tokens"): the decimal or binary reading of the
    multiple, whichever comes closer to a whole number of sequences (4M tokens of 4,096 is 1,024 sequences)."""
    off = lambda t: abs(t / seq_len - round(t / seq_len)) / max(t / seq_len, 1.0)  # noqa: E731
    return max(1, round((tokens_bin if off(tokens_bin) <= off(tokens_dec) else tokens_dec) / seq_len))


def normalise_numbers(row: dict, assumed: list[str]) -> dict:
    """The row with the numbers of its count columns written plainly: "12,288" -> 12288, "8k" -> 8192, and a
    global batch given in tokens ("4M tokens", "2,097,152 tokens", "16M") -> sequences of the row's seq_len,
    each conversion but a separator's named in ``assumed``. A cell this cannot read stays as written (and
    _check_numbers names it)."""
    out = dict(row)
    for col in _COUNT_COLUMNS:
        raw = (row.get(col) or "").strip()
        if not raw or _num(raw) is not None:
            continue
        bare = raw.rstrip(_FOOTNOTE_MARKS).strip()
        if bare != raw and (_num(bare) is not None or _GROUPED.fullmatch(bare)):
            # A footnote mark after the number ("1*", "8†"): the number.
            out[col] = bare.replace(",", "")
            assumed.append(f"{col}={out[col]} (from {raw!r}: the mark is a footnote)")
            continue
        text = _GROUPED.sub(lambda m: m.group(0).replace(",", ""), raw)
        # A multiple with its unit ("2K tokens", "16K GPUs"): the multiple alone (a global batch in tokens below).
        if col != "global_batch" and re.fullmatch(r"\S+\s+(tok(en)?s?|seq(uence)?s?|gpus?)\.?", text, re.I) \
                and _MULTIPLE.fullmatch(text.split()[0]):
            text = text.split()[0]
        # Tokens when the word follows the first number ("4M tokens"), not in a note after it ("2048 (4M tokens)").
        tokens = col == "global_batch" and re.match(r"\S+\s*tok(en)?s?\b", text, re.I)
        m = _MULTIPLE.fullmatch(text.split()[0]) if text.split() else None
        plain = _num(text.split()[0]) if text.split() and (tokens or len(text.split()) == 1) else None
        if m is None and plain is None:
            continue
        if col == "global_batch" and (tokens or (m and m.group(2) in "mM")):
            seq = _int(normalise_numbers({"seq_len": row.get("seq_len", "")}, []).get("seq_len", ""))
            if not seq:
                continue
            if m:
                x, big = float(m.group(1)), m.group(2) in "mM"
                binary = x * (2**20 if big else 2**10)
                dec = binary if m.group(3) else x * (1e6 if big else 1e3)     # "4Mi": binary, said so
            else:
                dec = binary = plain
            out[col] = str(_tokens_to_sequences(dec, binary, seq))
            assumed.append(f"global_batch={out[col]} sequences of {seq} tokens (from {raw!r})")
        elif m and len(text.split()) == 1:
            out[col] = str(round(float(m.group(1)) * (2**20 if m.group(2) in "mM" else 2**10)))
            assumed.append(f"{col}={out[col]} (from {raw!r})")
        elif plain is not None and len(text.split()) == 1:
            out[col] = text
    for col in ("step_time_s", "measured_value", "params_b"):
        raw = (row.get(col) or "").strip()
        if _num(raw) is None and _GROUPED.fullmatch(raw):
            out[col] = raw.replace(",", "")
    return _values_with_units(_annotated_counts(out, assumed), assumed)


# A count cell with words around its number: "TP=4", "PP4", "4-way", "4 (SP)", "8 GPUs", "512 seqs", "1 (GA 32)";
# the GPUs as "64x8" / "64 nodes" (of gpus_per_node, else 8); a pipeline's "4 (interleaved 5)" / "4, vpp 5" gives
# vp where that column is blank; an em dash, "auto" or "?" is a blank.
_LABEL = re.compile(r"^(?:tp|pp|cp|ep|dp|vpp?|etp|mbs|gbs|micro[-_ ]?batch|global[-_ ]?batch|gpus?)\s*[=:]?\s*", re.I)
_ANNOTATED = re.compile(r"(\d+)(?:\s*-?\s*way)?(?:\s*(?:\(.*\)|[,;]?\s*[a-z].*))?", re.I)
_BLANKS = ("\u2014", "\u2013", "auto", "?", "n.a.", "--")
_VIRTUAL = re.compile(r"(?:interleav\w*?|vpp?|virtual(?:[-_ ]stages?)?)\D{0,3}(\d+)(?![a-z\d])", re.I)
# Pipeline schedules a vp or pp cell (or, for the looped ones, the notes) may name instead of a chunk count. Looped:
# model chunks dealt round the pipeline ranks, as Megatron's interleaved 1F1B, PyTorch's Interleaved1F1B and
# looped BFS, MaxText's circular pipeline; zero-bubble V schedules (ZBV) and DeepSeek's DualPipe also run two or
# more chunks a rank with a smaller bubble still, and are priced as the interleaving that fits fastest. Flat: one
# chunk a rank (1F1B, GPipe).
_LOOPED_SCHEDULE = re.compile(r"interleav|looped|circular[- ]?(?:pipeline|repeat)|virtual[- ]?(?:pipeline|stage)"
                              r"|zero[- ]?bubble|\bzbv\b|\bzb[- ]?v\b|dualpipe", re.I)
_FLAT_SCHEDULE = re.compile(r"(?:1f1b|gpipe|non[- ]?interleaved|not interleaved|no interleaving|no|false|off)"
                            r"(?:\s*\(.*\))?", re.I)
_VIRTUAL_CELL = re.compile(r"(?:interleav\w*|virtual(?:[-_ ]stages?)?)\W{0,3}(\d+)\W{0,2}", re.I)


def _annotated_counts(row: dict, assumed: list[str]) -> dict:
    """The row with count cells that carry words around one number read as that number (each named in
    ``assumed``); a cell this cannot read stays as written."""
    out = dict(row)
    for col in _COUNT_COLUMNS:
        raw = (row.get(col) or "").strip()
        if not raw or _num(raw) is not None or raw.lower() in _ABSENT:
            continue
        if raw.lower() in _BLANKS:
            out[col] = ""
            assumed.append(f"{col} blank (from {raw!r})")
            continue
        if col == "vp" and _FLAT_SCHEDULE.fullmatch(raw):
            out[col] = "1"
            assumed.append(f"vp=1 (from {raw!r}: one model chunk a pipeline rank)")
            continue
        if col == "vp" and _LOOPED_SCHEDULE.search(raw) and not _VIRTUAL_CELL.fullmatch(raw):
            out[col], out[SCHEDULE_KEY] = "", raw
            assumed.append(f"vp blank ({raw!r} names an interleaved schedule, not its chunks a rank)")
            continue
        text = _LABEL.sub("", _GROUPED.sub(lambda g: g.group(0).replace(",", ""), raw))
        nodes = re.fullmatch(r"(\d+)\s*(?:nodes?\s*)?[x\u00d7*]\s*(\d+)(?:\s*gpus?)?|(\d+)\s*nodes?", text, re.I)
        if col == "num_gpus" and nodes:
            per = _int(row.get("gpus_per_node", "")) or 8
            x = int(nodes.group(1)) * int(nodes.group(2)) if nodes.group(1) else int(nodes.group(3)) * per
        else:
            m = _ANNOTATED.fullmatch(text)
            # Another number outside brackets ("8 or 16") is a second reading: left as written (a pipeline's
            # "16, vpp 4" excepted).
            rest = re.sub(r"\(.*?\)", "", text[m.end(1):]) if m else ""
            # The vp column's number after its word: "interleaved (2)", "virtual stages: 2".
            worded = _VIRTUAL_CELL.fullmatch(text) if col == "vp" and not m else None
            # A degree after the word for its kind: "ring (2)", "ulysses (4)", "a2a: 8".
            kind = None if m or worded else re.fullmatch(r"[a-z][\w-]*\s*(?:\((\d+)\)|[=:]\s*(\d+))", text, re.I)
            if worded:
                x = int(worded.group(1))
            elif kind:
                x = int(kind.group(1) or kind.group(2))
            elif not m or _MULTIPLE.match(text) or (re.search(r"\d", rest)
                                                    and not (col == "pp" and _VIRTUAL.search(rest))):
                continue
            else:
                x = int(m.group(1))
        out[col] = str(x)
        assumed.append(f"{col}={x} (from {raw!r})")
        said_sp = col == "tp" and re.search(r"(?<![a-z])(sp|seq(uence)?[- ]?par(allel(ism)?)?)(?![a-z])", text, re.I)
        if said_sp and not (row.get("sp") or "").strip():
            # "8 (SP)", "4 + sequence parallel": the tp cell says sequence parallelism ran.
            out["sp"] = "true"
            assumed.append(f"sp=true (from tp {raw!r})")
        virtual = _VIRTUAL.search(text) if col == "pp" else None
        if virtual and _num(row.get("vp", "")) is None:
            out["vp"] = virtual.group(1)
            assumed.append(f"vp={virtual.group(1)} (from pp {raw!r})")
        elif col == "pp" and _LOOPED_SCHEDULE.search(text) and _num(row.get("vp", "")) is None:
            out[SCHEDULE_KEY] = raw   # "4 (Interleaved1F1B)": interleaved, its chunks unpublished
    return out


# A measured figure written with its unit ("3.2 s", "450 ms", "3,100 tokens/s/GPU", "12.3k tok/s"): the number
# (a k / M multiple of a measured figure is decimal), then the unit.
_QUANTITY = re.compile(r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.?\d+(?:e[-+]?\d+)?)\s*([kKM](?![a-z]))?\s*(\S.*)?",
                       re.I)


def _values_with_units(row: dict, assumed: list[str]) -> dict:
    """The row with a step time or measured value that carries its unit written as the number alone: a
    step_time_s of "3200 ms" is 3.2 (seconds), a measured_value of "3,100 tokens/s/GPU" is 3100 with the unit
    joined to a measured_metric that does not name one itself ("throughput" -> "throughput tokens/s/GPU")."""
    out = dict(row)
    raw = (row.get("step_time_s") or "").strip()
    # "~8", "about 8 s", "8.0 s/iter", "1,500 ms per step": an approximate or per-iteration figure is a step time.
    text = re.sub(r"^(?:~|\u2248|approx\.?|about|circa|ca\.)\s*", "", raw, flags=re.I)
    text = re.sub(r"\s*(?:/|per)\s*(?:iter(?:ation)?|it|step|batch)s?$", "", text, flags=re.I)
    m = _QUANTITY.fullmatch(text) if _num(raw) is None else None
    unit = (m.group(3) or "s").strip().lower() if m and not m.group(2) else None
    if unit in ("s", "sec", "secs", "second", "seconds", "ms", "msec", "milliseconds"):
        x = float(m.group(1).replace(",", "")) / (1e3 if unit.startswith("m") else 1.0)
        out["step_time_s"] = repr(x)
        assumed.append(f"step_time_s={x:g} (from {raw!r})")
    raw = (row.get("measured_value") or "").strip()
    m = _QUANTITY.fullmatch(raw) if _num(raw) is None else None
    if m and (m.group(2) or m.group(3)):
        x = float(m.group(1).replace(",", "")) * {"k": 1e3, "m": 1e6}.get((m.group(2) or "").lower(), 1.0)
        metric = (row.get("measured_metric") or "").strip()
        if m.group(3) and not metric_named(metric):
            metric = f"{metric} {m.group(3).strip()}".strip()
        out["measured_value"], out["measured_metric"] = repr(x), metric
        assumed.append(f"measured_value={x:g} {metric} (from {raw!r})".replace("  ", " "))
    return out


# Training stacks that are not Megatron (framework "other" in costmodel/estimate.py FRAMEWORK). NeMo AutoModel is
# NeMo's Hugging Face path, not its Megatron one: "a PyTorch DTensor-native SPMD library" (FSDP2, with Transformer
# Engine and DeepEP kernels; docs.nvidia.com/nemo/automodel, "About NeMo AutoModel").
_OTHER_STACKS = (r"deepspeed|torchtitan|maxtext|colossal|nanotron|metaseq|fairscale|llm-foundry|composer|gpt-neox"
                 r"|pytorch fsdp|torch fsdp|fsdp2|levanter|t5x|megablocks|veomni|openrlhf|nemo[\s_-]*auto-?model"
                 r"|(hf|hugging ?face)[ -](accelerate|trainer)|\baccelerate\b")
# Stacks built on Megatron-LM under another name, read as megatron-core: ByteDance's MegaScale overlaps the
# tensor / sequence-parallel, pipeline and data-parallel communication with computation as megatron-core does
# (Jiang et al., NSDI'24, arXiv:2402.15627, Sec. 3.2).
_MEGATRON_NAMES = r"megatron|nemo|mcore|megascale"
# Asynchronous tensor parallelism named for such a stack (costmodel/estimate.py FRAMEWORK "other-async-tp"):
# torchtitan's AsyncTP (--parallelism.enable_async_tensor_parallel), PyTorch's micro-pipelined TP, XLA's collective
# matmul / windowed einsum; not where the text says it was off.
_ASYNC_TP = re.compile(r"async(?:hronous)?[-_ ]?(?:tp\b|tensor[-_ ]parallel)|micro[-_ ]?pipelin\w*[-_ ]tp\b"
                       r"|collective[-_ ]matmul|windowed[-_ ]einsum")
_OFF_BEFORE = re.compile(r"(?:\bno|\bw/o|\bwithout|\bdisabled?)\s*$")
_OFF_AFTER = re.compile(r"^\s*(?:[=:]\s*)?(?:false|off|disabled|0)\b|^\s+(?:was\s+)?(?:off|disabled)\b")
# Frameworks whose tensor parallelism shards the norms' activations too (sequence parallelism) unless a row says
# otherwise: megatron-core (Megatron-Bridge recipes turn it on with tp) and today's other stacks (torchtitan's
# tensor-parallel plan, MegaScale on Megatron-LM); Megatron-LM before 2022 and the other stacks up to 2022 had none.
OTHER_STACKS_NOW = ("other", "other-async-tp")
"""The FRAMEWORK keys of stacks other than Megatron or Pax after 2022 (not ``other-2022``)."""
SEQUENCE_PARALLEL_STACKS = ("megatron-core", *OTHER_STACKS_NOW)
# Words that name such a stack only where no Megatron or NeMo is named (Megatron-FSDP is megatron-core's).
_OTHER_UNLESS_MEGATRON = r"\bfsdp\b"


# Key under which the CSV reader keeps a vp or pp cell that names an interleaved schedule without its chunk count.
SCHEDULE_KEY = "_schedule"

# Stacks other than Megatron whose pipeline schedule is documented to be interleaved (model chunks looped over
# the pipeline ranks): (pattern over the framework column, pattern over the notes and source id, where it is
# documented). A row of such a stack that leaves vp blank is read as the fastest interleaving that fits, as a
# megatron-core row's is; any other non-Megatron stack keeps vp 1 (DeepSpeed's PipelineEngine and torchtitan's
# default Schedule1F1B, for two, run one stage a rank).
_INTERLEAVING_STACKS = (
    (r"(?<![\w-])meta(?![\w-])", r"llama[- ]?3(\.\d)?[- ]paper|2407\.21783|herd of models|(^|_)meta(_|$)",
     "Meta's Llama 3 stack: Llama 3 paper (arXiv:2407.21783) Sec. 3.3.2 and Fig. 6, stages looped over the "
     "pipeline ranks with a tunable number of consecutive micro-batches"),
)


def interleaving_stack(row: dict, other_stack: bool) -> str | None:
    """Why a row with vp blank interleaved its pipeline, where it says so: its vp or pp cell names an interleaved
    schedule (_LOOPED_SCHEDULE: 'Interleaved1F1B', 'interleaved', 'ZBV'); and, for a stack other than Megatron or
    Pax (``other_stack``), its notes name one or its stack (framework column, or the paper its notes or source id
    cite) is documented to interleave (_INTERLEAVING_STACKS). Megatron-LM 2021-2022 notes saying "interleaved
    schedule" may name the paper's method, not the run's. None otherwise."""
    if row.get(SCHEDULE_KEY):
        return f"the row names an interleaved schedule, {row[SCHEDULE_KEY]!r}"
    if not other_stack:
        return None
    named = _LOOPED_SCHEDULE.search(row.get("notes") or "")
    if named:
        return f"the notes name an interleaved schedule, {named.group(0)!r}"
    framework = (row.get("framework") or "").lower()
    cited = " ".join(row.get(c) or "" for c in ("notes", "source_id")).lower()
    return next((why for named, cites, why in _INTERLEAVING_STACKS
                 if re.search(named, framework) or re.search(cites, cited)), None)


def _names_paxml(t: str) -> bool:
    """Whether normalised text (lower case, runs of spaces and underscores as '-') names Pax (Praxis: Pax's layer
    library)."""
    return "paxml" in t or "praxis" in t or bool(re.search(r"(^|\W)pax(\W|$)", t))


def _megatron_lm_tag(t: str) -> str | None:
    """The generation a Megatron-LM release tag in normalised text names: v1.x 2020, v2.x 2021 and v3.x 2022
    (before megatron-core's core_r0.x); None without one (or where megatron-core is named)."""
    tag = re.search(r"megatron-lm-?v?([1-3])\.\d+(?!\d)", t)
    if tag is None or "core" in t:
        return None
    return "megatron-lm-2020" if tag.group(1) == "1" else "megatron-lm-2021"


def _years(text: str) -> list[int]:
    """The years 2010-2029 a text names."""
    return [int(y) for y in re.findall(r"(?<!\d)(20[12]\d)(?!\d)", text)]


def framework_of(row: dict, assumed: list[str]) -> str:
    """The row's ``framework`` column: a key of costmodel/estimate.py FRAMEWORK (megatron-core, megatron-lm-2021,
    megatron-lm-2020, paxml, other, other-async-tp, other-2022). A row that leaves it empty, or a CSV without the
    column (the schema of data/validation/published_runs.csv before it had one), gets the framework its notes name
    (:func:`framework_from_notes`), and the row says so. A stack other than Megatron whose row names no year
    after 2022 (source id, notes, framework column) and at least one up to 2022 is ``other-2022``: it ran
    before FlashAttention reached such stacks; one whose framework column or notes name asynchronous tensor
    parallelism (:func:`async_tp_named`) is ``other-async-tp``."""
    said = len(assumed)
    fw = _framework_as_named(row, assumed)
    text = " ".join(row.get(c) or "" for c in ("source_id", "notes", "framework"))
    years = [int(y) for y in re.findall(r"(?<!\d)(20[012]\d)(?!\d)", text)]
    if fw != "other":
        return fw
    said_as = repr((row.get("framework") or "").strip() or "the notes")
    if years and max(years) <= 2022:
        fw, why = "other-2022", (f"{said_as}: a stack other than Megatron, in {max(years)}: attention unfused, no "
                                 f"sequence parallelism")
    elif async_tp_named(" ".join(row.get(c) or "" for c in ("framework", "notes"))):
        fw, why = "other-async-tp", (f"{said_as} with asynchronous tensor parallelism named: its collectives "
                                     f"pipelined against the GEMMs, as megatron-core's --tp-comm-overlap")
    else:
        return fw
    del assumed[said:]
    assumed.append(f"framework={fw} ({why})")
    return fw


def async_tp_named(text: str) -> bool:
    """Whether a text names asynchronous tensor parallelism (_ASYNC_TP) as on: 'AsyncTP', 'async tensor
    parallel', 'collective matmul'; not 'no async TP', 'without AsyncTP', 'async_tp=False', 'async TP off'."""
    t = text.lower()
    return any(not _OFF_BEFORE.search(t[:m.start()]) and not _OFF_AFTER.search(t[m.end():])
               for m in _ASYNC_TP.finditer(t))


def _framework_as_named(row: dict, assumed: list[str]) -> str:
    raw = (row.get("framework") or "").strip()
    fw = raw.lower()
    if fw == "" or fw in _ABSENT:   # 'unknown', 'n/a': as blank
        fw = framework_from_notes(row)
        assumed.append(f"framework={fw} (from the row's notes and source)")
        return fw
    if fw in FRAMEWORK:
        return fw
    named = framework_named(fw, row)
    if named is None:
        assumed.append(f"framework=other ({raw!r} is none of {', '.join(FRAMEWORK)}: modelled as a stack "
                       f"without Megatron's overlaps)")
        return "other"
    assumed.append(f"framework={named} (from {raw!r})")
    return named


def framework_named(text: str, row: dict) -> str | None:
    """The FRAMEWORK key a framework column spelled another way names (NeMo 2.0, Megatron-Bridge, mcore,
    Megatron-LM v0.9 -> megatron-core; Megatron-LM v1.x -> megatron-lm-2020, v2.x / v3.x -> megatron-lm-2021;
    DeepSpeed, Megatron-DeepSpeed, torchtitan, MaxText -> other; Pax, Praxis -> paxml); None if it names none. A
    bare Megatron-LM takes the generation the row's notes and source name (the 2020 README tables, the 2021
    papers) and megatron-core otherwise."""
    t = re.sub(r"[\s_]+", "-", text.lower())
    if _names_paxml(t):
        return "paxml"
    if "deepspeed" in t or re.search(_OTHER_STACKS, text.lower()):
        return "other"
    if re.search(f"{_MEGATRON_NAMES}|bridge", t):
        tag = _megatron_lm_tag(t)
        if tag:
            return tag
        years = _years(t)
        if years:
            return _megatron_of_year(years[0])
        if "megatron-lm" in t and not re.search(r"\d", t):
            notes = framework_from_notes(row)
            if notes.startswith("megatron-lm"):
                return notes
            # A bare Megatron-LM takes the generation of the latest year its source and notes name.
            years = _years(" ".join(row.get(c) or "" for c in ("source_id", "notes")))
            return _megatron_of_year(max(years)) if years else "megatron-core"
        return "megatron-core"
    return None


def _megatron_of_year(year: int) -> str:
    """The Megatron generation of a year: up to 2020 Megatron-LM before interleaving (the 2019 paper's and the
    2020 README's; no sequence parallelism, unfused attention), 2021-2022 Megatron-LM of the 2021 paper, later
    megatron-core."""
    return "megatron-lm-2020" if year <= 2020 else "megatron-lm-2021" if year <= 2022 else "megatron-core"


def framework_from_notes(row: dict) -> str:
    """The framework a row's notes, model name, sharding and source id name, read as a framework column naming
    it would be (:func:`framework_named`): Paxml; Megatron-DeepSpeed, or a non-Megatron stack (_OTHER_STACKS)
    when neither Megatron nor NeMo is named, as ``other``; the Megatron-LM 2020 README tables and the 2021
    papers (Narayanan et al., Korthikanti et al.) as their generations; a Megatron-LM release tag (v1.x-v3.x),
    a NeMo container release (YY.MM) or, for a Megatron or NeMo row that names nothing newer, the latest year
    it names as that year's generation (:func:`_megatron_of_year`). A row naming no stack and no year after 2022
    but one up to 2022 ran on some stack of its time (``other``; :func:`framework_of` makes it ``other-2022``);
    otherwise megatron-core."""
    text = " ".join([row.get("notes", ""), row.get("model_name", ""), row.get("zero_stage_or_distopt", "")]).lower()
    t = re.sub(r"[\s_]+", "-", text)
    if _names_paxml(t):
        return "paxml"
    megatron = re.search(_MEGATRON_NAMES, t) and not re.search(r"nemo-*auto-?model", t)
    # Megatron-DeepSpeed (BigScience's and Microsoft's fork: Megatron-LM's layers under DeepSpeed's pipeline
    # and ZeRO) is DeepSpeed's stack, as a framework column naming it is read.
    if re.search(r"megatron-?deepspeed|megatron-ds(\W|$)", t) or (
            not megatron and re.search(f"{_OTHER_STACKS}|{_OTHER_UNLESS_MEGATRON}", text)):
        return "other"
    if "tables.tex" in text or "2020" in row.get("source_id", ""):
        return "megatron-lm-2020"
    if "ddp-impl" in text or "narayanan" in text or "paper table 1" in text or "table 3 config" in text \
            or "korthikanti" in row.get("source_id", "").lower():
        return "megatron-lm-2021"
    tag = _megatron_lm_tag(t)
    if tag:
        return tag
    container = re.search(r"nemo(?:-megatron|-framework)?-?v?(2\d)\.(0[1-9]|1[0-2])(?!\d)", t)
    if container:
        return _megatron_of_year(2000 + int(container.group(1)))
    years = _years(" ".join([text, row.get("source_id", "")]))
    newer = re.search(r"core|bridge|transformer-engine|fp8|h100|h200|b200|b300|gb200|gb300|nemo-2", t)
    if years and max(years) <= 2022 and not newer:
        return _megatron_of_year(max(years)) if megatron else "other"
    return "megatron-core"


def _family(name: str) -> ModelSpec | None:
    key = re.sub(r"[^a-z0-9.-]", "", name.lower().replace(" ", "-"))
    for pat, cat in _FAMILY:
        if pat in key:
            return catalog()[cat]
    # A hybrid Mamba model by any name the catalog knows ('NemotronH-56B', 'Nemotron Nano 2 9B'): its layer pattern
    # is not in the CSV's columns.
    try:
        spec = get_model(re.sub(r"\(.*?\)", "", name).strip())
    except InputError:
        return None
    return spec if spec.hybrid_pattern else None


def row_model(row: dict, assumed: list[str]) -> ModelSpec:
    name = row["model_name"]
    fam = _family(name)
    hidden, heads = _int(row["hidden"]), _int(row["heads"])
    experts = _int(row.get("moe_experts", "")) or 0
    spec: dict = {}
    if fam is not None:
        spec.update(fam.model_dump())
        if fam.hybrid_pattern:
            kinds = ", ".join(f"{n} {HYBRID_KINDS[k]}" for k, n in fam.hybrid_counts.items() if n)
            assumed.append(f"hybrid_pattern {fam.hybrid_pattern} ({kinds} layers; the catalog's {fam.name}, which "
                           f"no column states)")
    lname = name.lower()
    gated = any(g in lname for g in _GATED) if fam is None else fam.gated_mlp
    spec.update(name=name, layers=_int(row["layers"]), hidden=hidden, heads=heads,
                seq_len=_int(row["seq_len"]), gated_mlp=gated)
    kv = _int(row.get("kv_heads", ""))
    if kv:
        spec["kv_heads"] = kv
    elif fam is None:
        spec["kv_heads"] = None
    label, named = next(((lb, d) for pat, lb, d in _NAMED_DEFAULTS if pat.search(name.lower())), ("", {})) \
        if fam is None else ("", {})
    vocab = _int(row.get("vocab", ""))
    if vocab:
        spec["vocab"] = vocab
    elif "vocab" in named:
        spec["vocab"] = named["vocab"]
        assumed.append(f"vocab={named['vocab']} ({label}'s tokenizer)")
    elif fam is None:
        spec["vocab"] = 51200
        assumed.append("vocab=51200 (Megatron GPT default)")
    ffn = _int(row.get("ffn_hidden", ""))
    notes = row.get("notes", "")
    if experts:
        spec.update(num_experts=experts, moe_topk=_int(row.get("moe_topk", "")) or spec.get("moe_topk", 2))
        if ffn and fam is not None and fam.num_experts and ffn == fam.ffn_hidden \
                and fam.moe_ffn_hidden not in (None, fam.ffn_hidden):
            # The schema's ffn_hidden of a MoE row is the expert width; this one is the family's dense-layer
            # width, so the experts keep the catalog's.
            assumed.append(f"moe_ffn_hidden={fam.moe_ffn_hidden} (ffn_hidden {ffn} is {fam.name}'s dense-layer "
                           f"width; the experts are {fam.moe_ffn_hidden} wide)")
        elif ffn:
            spec["moe_ffn_hidden"] = ffn
        m = re.search(r"dense-layer ffn (\d+)", notes)
        spec["ffn_hidden"] = int(m.group(1)) if m else spec.get("ffn_hidden", ffn or 4 * hidden)
        m = re.search(r"(\d+) shared expert", notes)
        if m:
            spec["shared_experts"] = int(m.group(1))
        if _TOKEN_DROP.search(f"{name} {notes}"):
            spec["moe_token_drop"] = True
    else:
        spec.update(num_experts=0, moe_topk=0, moe_ffn_hidden=None, shared_experts=0, dense_layers=0, moe_layer_step=1)
        if ffn:
            spec["ffn_hidden"] = ffn
        elif fam is None or spec.get("num_experts"):
            spec["ffn_hidden"] = 4 * hidden
            assumed.append("ffn_hidden=4h")
    if not spec.get("moe_ffn_hidden") and experts:
        spec["moe_ffn_hidden"] = spec["ffn_hidden"]
    if fam is None:
        spec["learned_position_embeddings"] = not gated
        spec["tied_embeddings"] = not gated
        spec.update({k: v for k, v in named.items() if k != "vocab"})
    if spec.get("mtp_layers"):
        # The model trains with multi-token prediction (Megatron-Bridge's DeepSeek-V3 recipe: mtp_num_layers
        # 1) unless the row says it ran without.
        if re.search(r"w/o mtp|without mtp|no mtp", lname):
            spec["mtp_layers"] = 0
        elif "mtp" not in lname:
            assumed.append(f"mtp_layers={spec['mtp_layers']} (the model's default)")
    spec["precision"] = precision_of(row.get("precision") or "", assumed, f"{name} {notes}")
    spec["finetune"] = finetune_of(row, assumed)
    spec["optimizer"] = optimizer_of(row, assumed)
    model = ModelSpec.model_validate(spec)
    return _match_published_size(model, row, assumed) if fam is None else model


# A row's params_b (its published total size) checks the two things the schema's columns leave open for a model
# outside the catalog: whether its MLP is gated (a 3-matrix SwiGLU / GeGLU, guessed from the name) and, for a MoE,
# whether ffn_hidden is the experts' width or the dense layers' (both spellings are in published tables: the
# Megatron-Bridge archive gives DeepSeek-V3's experts, 2,048; a Hugging Face config's intermediate_size is the
# dense width, 10,944 for DeepSeek-V2-Lite, whose 64 experts are 1,408 wide). Published sizes are nominal (Llama 2
# "7B" has 6.7B parameters, "8x7B" 46.7B), so a size within SIZE_AGREES of the columns' is left alone, and a
# reading is taken only when it lands within SIZE_MATCHES.
SIZE_AGREES = 1.25
SIZE_MATCHES = 1.1


def _width_for(model: ModelSpec, field: str, target: float) -> ModelSpec | None:
    """The model with ``field`` (ffn_hidden or moe_ffn_hidden: total parameters grow linearly in it) set to the
    multiple of 64 that gives ``target`` parameters; None if none does (below 64)."""
    w1 = getattr(model, field) or model.expert_ffn
    t1 = total_params(model.model_copy(update={field: w1}))
    per_width = (total_params(model.model_copy(update={field: 2 * w1})) - t1) / w1
    width = int(round((w1 + (target - t1) / per_width) / 64.0)) * 64
    if width < 64:
        return None
    try:   # validated: a published size beyond what the cost model takes (ModelSpec's bounds) gives no reading
        return ModelSpec.model_validate({**model.model_dump(), field: width})
    except ValidationError:
        return None


def _match_published_size(model: ModelSpec, row: dict, assumed: list[str]) -> ModelSpec:
    """The model read the way that matches the row's ``params_b`` when the columns as read miss it by more than
    SIZE_AGREES: for a dense model whose ffn_hidden the row leaves blank, the width that gives the published size
    (not 4h); else the other MLP form (with the embeddings of that style); else, for a MoE, the expert width that
    gives it (ffn_hidden read as the dense layers' width). Each change is named in ``assumed``; without a usable
    params_b, or where no reading matches, the model is as read."""
    published = _num(row.get("params_b", ""))
    if published is None or not math.isfinite(published) or published <= 0:
        return model
    target = published * 1e9
    billions = lambda m: total_params(m) / 1e9  # noqa: E731
    off = lambda m: abs(math.log(total_params(m) / target))  # noqa: E731
    matches = lambda m: m is not None and off(m) <= math.log(SIZE_MATCHES)  # noqa: E731
    if off(model) <= math.log(SIZE_AGREES):
        return model
    if not model.is_moe and "ffn_hidden=4h" in assumed:   # the row left ffn_hidden blank
        wide = _width_for(model, "ffn_hidden", target)
        if matches(wide):
            assumed[assumed.index("ffn_hidden=4h")] = (
                f"ffn_hidden={wide.ffn_hidden} (not in the row; params_b {published:g}: 4h would give "
                f"{billions(model):.1f}B, {wide.ffn_hidden} gives {billions(wide):.1f}B)")
            return wide
    gated = not model.gated_mlp
    other = model.model_copy(update={"gated_mlp": gated, "learned_position_embeddings": not gated,
                                     "tied_embeddings": not gated})
    if matches(other):
        assumed.append(f"gated_mlp={gated} (params_b {published:g}: {billions(other):.1f}B so, "
                       f"{billions(model):.1f}B with gated_mlp={not gated})")
        return other
    wide = _width_for(model, "moe_ffn_hidden", target) if model.is_moe else None
    if matches(wide):
        assumed.append(f"moe_ffn_hidden={wide.moe_ffn_hidden} (params_b {published:g}: ffn_hidden {model.ffn_hidden} "
                       f"as the experts' width gives {billions(model):.1f}B, so it is read as the dense layers' "
                       f"width; experts {wide.moe_ffn_hidden} wide give {billions(wide):.1f}B)")
        return wide
    return model


# A LoRA / PEFT run: the word in the model name, the notes or a task column (Megatron-Bridge's archive: "lora";
# NeMo's tables: "LoRA on SQuAD"). Not part of a longer name (MLA's kv_lora_rank is not a LoRA run).
_LORA = re.compile(r"(?<![a-z0-9_])(q?lora|peft)(?![a-z0-9_])", re.I)
_TASK_COLUMNS = ("finetune", "task", "peft", "training", "mode")


def finetune_of(row: dict, assumed: list[str]) -> str:
    """'lora' when the row says it trained adapters on frozen weights (ModelSpec.finetune), else 'full'."""
    for col in ("model_name", *_TASK_COLUMNS, "notes"):
        m = _LORA.search(row.get(col) or "")
        if m:
            assumed.append(f"finetune=lora (from {m.group(0)!r} in {col}: frozen weights, no weight gradients)")
            return "lora"
    return "full"


# A Muon run: the word in an optimizer column or in the notes (Megatron-Bridge's archive, Kimi K2: "Muon optimizer
# was used"; its recipe's default optimizer_type is "muon", scripts/performance/configs/kimi/kimi_llm_pretrain.py).
_MUON = re.compile(r"(?<![a-z0-9_])muon(clip)?(?![a-z0-9_])", re.I)


def optimizer_of(row: dict, assumed: list[str]) -> str:
    """'muon' when the row says its weight matrices stepped with Muon (ModelSpec.optimizer), else 'adam'."""
    for col in ("optimizer", "notes"):
        m = _MUON.search(row.get(col) or "")
        if m:
            assumed.append(f"optimizer=muon (from {m.group(0)!r} in {col})")
            return "muon"
    return "adam"


# Precision columns that say mixed precision without the format (or nothing): the default, bf16 (fp16 on a GPU
# without bf16 arithmetic, load_cases).
_VAGUE_PRECISION = ("unknown", "n/a", "na", "-", "mixed", "mixed precision", "mixed-precision", "amp mixed precision",
                    "default")


# The training formats as a model name, notes or precision column name them, the narrowest first (a column naming
# NVFP4 and MXFP8 names the NVFP4 recipe). A blank precision column reads only these from the name and notes (notes
# also mention 8-bit optimizers and int8 gradient compression, which say nothing of the GEMMs).
_NAMED_FORMATS = ((r"nvfp4|(?<![a-z])fp4", "nvfp4"), (r"mxfp8|mx-?fp8|fp8-?mx", "mxfp8"),
                  (r"fp8|float8|e4m3|e5m2", "fp8"), (r"bf16|bfloat16", "bf16"))
# Formats a precision column may name that have no price of their own, the format priced in their place and why
# (said with the reading): MXFP4 runs on the same FP4 tensor cores as NVFP4 and MXFP6 at the FP8 rate (NVIDIA
# Blackwell datasheet: FP6 and FP8 share one rate); an 8-bit integer recipe at the 8-bit (FP8) tensor-core rate.
_PRICED_AS = ((r"mx-?fp4", "nvfp4", ": the FP4 tensor cores NVFP4 runs on"),
              (r"mx-?fp6|(?<![a-z])fp6", "mxfp8", ": the FP8 tensor-core rate FP6 runs at"),
              (r"int8|(?<![a-z0-9])8-?bit", "fp8", ": the 8-bit tensor-core rate"))
# A precision column's formats: the named ones with those priced as them, then fp16 and fp32 as AMP / Apex and
# PyTorch Lightning's precision flags (NeMo's trainer.precision) name them: '16-mixed' / '16' is fp16, '32' /
# '32-true' fp32.
_FORMATS = tuple((pattern + "".join(f"|{p}" for p, as_, _ in _PRICED_AS if as_ == name), name)
                 for pattern, name in _NAMED_FORMATS) + (
    (r"fp16|float16|half|(?<![a-z])amp(?![a-z])|apex|(?<![a-z0-9])o[12](?![a-z0-9])|^16(-mixed|-true)?(-|$)", "fp16"),
    (r"^32(-true)?$|^float32$", "fp32"))


def precision_of(raw: str, assumed: list[str], context: str = "") -> str:
    """The training precision a precision column names, however spelled: 'FP8 (delayed scaling)', 'FP8-hybrid',
    'fp8_e4m3', 'fp8-blockwise' -> fp8; 'MXFP8', 'fp8-mx' -> mxfp8; 'bf16 mixed', 'bfloat16' -> bf16; 'AMP fp16',
    'float16', Apex AMP's 'O1' / 'O2' (fp16 mixed precision, as the 2019-2021 Megatron-LM and DeepSpeed papers ran)
    -> fp16; a spelling ModelSpec knows is kept (lower-cased). The GEMMs' format decides (fp8 with bf16
    master weights is fp8). Blank: the format the ``context`` (the model name and notes) names, the narrowest
    first (NVFP4, MXFP8, FP8, then BF16, FP16), else bf16; said in ``assumed``. Anything else stays as given,
    and ModelSpec says what is valid."""
    text = raw.strip()
    key = text.lower()
    if not key:
        t = re.sub(r"[\s_]+", "-", context.lower())
        named = next((name for pattern, name in _NAMED_FORMATS if re.search(pattern, t)), None)
        if named is None and re.search(r"(?<![a-z])fp16|float16", t):
            named = "fp16"
        assumed.append(f"precision={named} (the precision column is blank; the name or notes say so)" if named
                       else "precision=bf16")
        return named or "bf16"
    if key in _VAGUE_PRECISION:
        assumed.append(f"precision=bf16 (the row says {text!r})")
        return "bf16"
    if key in PRECISION_ALIASES:
        return key
    t = re.sub(r"[\s_]+", "-", key)
    for pattern, name in _FORMATS:
        if re.search(pattern, t):
            why = next((w for p, as_, w in _PRICED_AS if as_ == name and re.search(p, t)), "")
            assumed.append(f"precision={name} (from {text!r}{why})")
            return name
    return text


# Links a network description may count, by the InfiniBand generation or fabric that names their rate (Gb/s).
_LINK_GBPS = {"fdr": 56.0, "edr": 100.0, "hdr100": 100.0, "hdr": 200.0, "ndr200": 200.0, "ndr": 400.0, "xdr": 800.0,
              "omni-path": 100.0, "omnipath": 100.0, "opa": 100.0, "slingshot": 200.0,
              # ConnectX adapters at their generation's port rate: 4 and 5 EDR, 6 HDR, 7 NDR, 8 XDR.
              "connectx4": 100.0, "connectx5": 100.0, "connectx6": 200.0, "connectx7": 400.0, "connectx8": 800.0}
_GEN = r"(?:fdr|edr|hdr|ndr|xdr|omni-?path|opa|slingshot|connectx-?[4-8]|cx-?[4-8])"
# A rate and its unit in bits (Gb/s, Gbps, Gbit, "400G"; Tb/s): "GB/s" is bytes and names no network rate here.
_UNIT = r"(?:tbps|tb/s|tbit/s|gbps|gb/s|gbit/s|gbit|gbe\b|g\b)"
# "8x HDR-200", "8x 200Gb/s HDR", "4x 100 Gbps EFA", "8 x NDR400", "8x ConnectX-7 400Gb/s", "4 OmniPath links",
# "8 HDR HCAs": a count of links (with an x before a bare rate), the generation or rate of each.
_COUNT = r"(?<![\w.-])(?P<count>\d+)(?!\d)"
_ADAPTER = r"(?:(?:connectx|cx)-?\d+\s*)?"
_LINKS = re.compile(rf"{_COUNT}\s*(?:[x\u00d7]\s*(?:{_ADAPTER}(?P<rate>\d+(?:\.\d+)?)\s*(?P<unit>{_UNIT})\s*)?)?"
                    rf"(?:(?P<gen>{_GEN})(?:[-\s]?(?P<genrate>\d+)(?:\s*{_UNIT})?)?)?(?=(?P<tail>[^;,.]{{0,40}}))")
_NUMBER_WORDS = {"two": "2", "four": "4", "six": "6", "eight": "8", "sixteen": "16"}
_NETWORK_WORDS = re.compile(r"infiniband|\bib\b|roce|efa|ethernet|\bnics?\b|\bhcas?\b|network|interconnect|"
                            r"omni-?path|\bopa\b|slingshot|rdma|connectx|\bcx-?\d|\b(?:fdr|edr|hdr|ndr|xdr)"
                            r"|\blinks?\b|\bports?\b|adapters?\b")
# A rate with a unit that names no count: an aggregate per node, or a rate per GPU, as the words beside it say.
_QUALIFIED = re.compile(rf"(?P<rate>\d+(?:\.\d+)?)\s*(?P<unit>{_UNIT})(?P<tail>[^;,.]{{0,40}})")


def network_named(text: str) -> tuple[float, bool, str] | None:
    """The scale-out network a row's text states: (bits per second, per GPU or not, the phrase), or None. A count
    of links ('8x HDR-200', '8x 200Gb/s HDR', '4x 100 Gbps EFA', '4 OmniPath links', '8 NDR HCAs') is that many
    links per node unless 'per GPU' follows; a rate without a count counts only with 'per GPU' or 'per node' /
    'per instance' / 'per server' beside it, or in Tb/s or above 800 Gb/s (a node's aggregate): '400 Gb/s
    InfiniBand' alone may be either. Only where a network word (InfiniBand, RoCE, EFA, NIC, HCA, an InfiniBand
    generation, link, ...) is near."""
    text = re.sub(r"\b(two|four|six|eight|sixteen)\b", lambda w: _NUMBER_WORDS[w.group(1)], text.lower())
    for m in _LINKS.finditer(text):
        phrase = (m.group(0) + m.group("tail")).strip()
        if not (m.group("rate") or m.group("gen")) or not _NETWORK_WORDS.search(phrase):
            continue
        count = float(m.group("count"))
        if m.group("rate"):
            gbps = float(m.group("rate")) * (1000.0 if m.group("unit").startswith("t") else 1.0)
        else:
            gen, rate = re.sub(r"^cx", "connectx", m.group("gen").replace("-", "")), m.group("genrate")
            # HDR-200 names HDR's own rate; HDR100 and NDR200 are the half-rate ports.
            gbps = _LINK_GBPS[gen + rate] if rate and gen + rate in _LINK_GBPS else (
                float(rate) if rate else _LINK_GBPS[gen])
        per_gpu = bool(re.search(r"per\s+gpu|/\s*gpu|each\s+gpu", m.group("tail")))
        return count * gbps * 1e9, per_gpu, phrase
    for m in _QUALIFIED.finditer(text):
        around = text[max(0, m.start() - 40):m.end()]
        if not _NETWORK_WORDS.search(around):
            continue
        tail, tera = m.group("tail"), m.group("unit").startswith("t")
        gbps = float(m.group("rate")) * (1000.0 if tera else 1.0)
        if re.search(r"per\s+gpu|/\s*gpu|each\s+gpu", tail):
            return gbps * 1e9, True, m.group(0).strip()
        # Tb/s, or more than one link carries (XDR's 800 Gb/s), is a node's aggregate.
        if re.search(r"per\s+(?:node|instance|server|host|vm|machine)", tail) or tera or gbps > _LINK_GBPS["xdr"]:
            return gbps * 1e9, False, m.group(0).strip()
    return None


def row_cluster(row: dict, profile: HardwareProfile, assumed: list[str] | None = None) -> ClusterSpec:
    """The cluster a row ran on (costmodel.profiles.cluster_of): ``profile``'s GPUs in the row's servers, on the
    network its notes or GPU column state (a cloud instance type of hardware_profiles/instances.yaml, or links and
    rates, :func:`network_named`), else the profile's reference NIC; a network so read is said in ``assumed``."""
    num_gpus = _int(row["num_gpus"])
    cluster = cluster_of(f"{row['gpu_type']}x{num_gpus}", profile, num_gpus, _int(row.get("gpus_per_node", "")))
    text = " ".join(row.get(c) or "" for c in ("gpu_type", "notes"))
    inst = instance_named(text)
    if inst is not None:
        nic, why = inst.per_gpu_bytes_per_s, (f"{inst.name}: {inst.gpu_network_bytes_per_s * 8 / 1e9:,.0f} Gb/s over "
                                              f"its {inst.gpus} GPUs, hardware_profiles/instances.yaml")
    else:
        named = network_named(row.get("notes") or "")
        if named is None:
            return cluster
        bits, per_gpu, phrase = named
        nic = bits / 8 / (1 if per_gpu else cluster.gpus_per_node)
        why = f"from the notes, {phrase!r}" + ("" if per_gpu else f", over {cluster.gpus_per_node} GPUs a node")
    if assumed is not None and nic != cluster.inter_node.nic_bandwidth_bytes_per_s:
        assumed.append(f"nic={nic * 8 / 1e9:g} Gb/s per GPU ({why}; the {profile.name} profile's reference system "
                       f"has {cluster.inter_node.nic_bandwidth_bytes_per_s * 8 / 1e9:g})")
    return with_nic(cluster, nic)


def row_plan(row: dict, model: ModelSpec, framework: str, assumed: list[str]) -> tuple[ParallelPlan, bool]:
    tp, pp = _int(row["tp"]), _int(row["pp"])
    cp = _int(row.get("cp", "")) or 1
    num_gpus = _int(row["num_gpus"])
    dp = data_parallel(num_gpus, tp, pp, cp)
    given = _int(row.get("dp", ""))
    if given and given != dp and dp * tp * pp * cp == num_gpus:
        # The GPUs fill tp x pp x cp x dp; a published dp that does not multiply out (counted without cp, or
        # with the experts' data parallelism) gives way to the GPU count.
        assumed.append(f"dp={dp} (num_gpus / (tp x pp x cp); the row's dp={given} does not multiply out)")
    elif given:
        dp = given
    gbs = _int(row["global_batch"])
    vp = _int(row.get("vp", ""))
    if not vp:
        vp = 1
        if pp > 1:
            assumed.append("vpp=1 (not published)")
    if pp == 1:
        vp = 1
    if model.is_moe and not _int(row.get("ep", "")):
        assumed.append("ep=1 (not published)")
    ep = _expert_parallel(_int(row.get("ep", "")) or 1, model, tp * cp * dp, assumed)
    etp = _expert_tensor_parallel(row, model, framework, tp, ep, tp * cp * dp, assumed)
    mbs = _int(row.get("micro_batch", ""))
    if not mbs:
        if framework == "megatron-lm-2020":
            mbs = max(1, gbs // dp)
            assumed.append(f"micro_batch={mbs} (whole per-rank batch, no pipeline)")
        else:
            mbs = 1
            assumed.append("micro_batch=1 (Megatron default)")
    sp_raw = (row.get("sp") or "").strip().lower()
    if sp_raw in _YES + _NO:
        sp = sp_raw in _YES
    elif (named := sequence_parallel_named(" ".join([row.get("model_name") or "", row.get("notes") or ""]),
                                           framework)) is not None:
        sp = named
        assumed.append(f"sequence_parallel={sp} (from the name or notes)")
    else:
        sp = framework in SEQUENCE_PARALLEL_STACKS and tp > 1
        assumed.append(f"sequence_parallel={sp}")
    rc_text = (row.get("recompute") or "").strip().lower()
    rc_raw = recompute_named(rc_text)
    known = rc_raw in ("none", "selective", "full", "offload")
    recompute = rc_raw if known else ("full" if framework == "megatron-lm-2020" else "none")
    # 'offload (40 layers)', 'cpu_offloading_num_layers=40': the layers offloaded; unsaid, all but the last.
    m_off = re.search(r"(\d+)", rc_text) if recompute == "offload" else None
    recompute_layers = int(m_off.group(1)) if m_off else None
    if recompute == "full":
        recompute_layers = _full_recompute_layers(rc_text, model, pp, vp)
    if framework == "megatron-lm-2020" and not known:
        known = True
        assumed.append("recompute=full (Megatron-LM 2020 examples checkpoint activations)")
    z = (row.get("zero_stage_or_distopt") or "").strip().lower()
    fsdp, zstage = sharding_named(z)
    distopt = framework in ("megatron-core", "paxml") or bool(zstage) or "distributed optim" in z \
        or "distopt" in z or "dist-opt" in z
    if framework.startswith("other") and (z == "" or (z in _ABSENT and z != "none")):
        # A stack other than Megatron that names no sharding shards at least the optimizer state (DeepSpeed
        # ZeRO-1, PyTorch FSDP, MaxText): unsharded Adam state is 12 bytes per parameter on every rank.
        distopt = True
        assumed.append("zero_stage=1 (not published; optimizer state sharded over data parallelism)")
    instances = shard_replicas(z, (row.get("notes") or "").lower(), tp, dp * cp,
                               tp * cp * dp // ep if model.is_moe else dp * cp,
                               _int(row.get("gpus_per_node", "")) or 8, assumed) if distopt or fsdp or zstage else 1
    offload = optimizer_offload_named(z, (row.get("notes") or "").lower())
    if offload and not (distopt or fsdp or zstage):
        distopt = True
        assumed.append("zero_stage=1 (optimizer offload runs on a sharded optimizer state)")
    split = framework_split(model.layers, pp, vp)
    if split is not None:
        assumed.append(f"layers_per_stage={'/'.join(map(str, split))} (virtual stages filled first, "
                       f"the last takes the remainder with the loss)")
    plan = ParallelPlan(tp=tp, pp=pp, vpp=vp, dp=dp, cp=cp, ep=ep, etp=etp, sequence_parallel=sp, micro_batch=mbs,
                        global_batch=gbs, recompute=recompute, recompute_layers=recompute_layers,
                        distributed_optimizer=distopt or fsdp,
                        zero_stage=3 if fsdp else (zstage or (1 if distopt else 0)), framework=framework, layers_per_stage=split,
                        dist_opt_instances=instances, optimizer_offload=offload)
    return plan, known


_SEQ_PAR = re.compile(r"(?<![a-z])(?:seq(?:uence)?[-_ ]?par(?:allel(?:ism)?)?|--sequence-parallel|sp)(?![a-z])"
                      r"(?:\s*[=:]\s*(\w+))?")


def sequence_parallel_named(text: str, framework: str) -> bool | None:
    """Whether a Megatron row's name or notes name Megatron's sequence parallelism as on ('seq-par',
    '--sequence-parallel', 'sequence parallelism', 'SP=True') or off ('no seq-par', 'without sequence
    parallelism', 'SP=False'); None where they do not, or where the stack is not Megatron-LM of 2021-2022 or
    megatron-core (Megatron-LM 2020 had none; elsewhere 'sequence parallelism' often names DeepSpeed-Ulysses or
    context parallelism, which split the sequence another way), or where Ulysses is named. A bare 'SP' counts
    only with a value ('SP=True')."""
    t = text.lower()
    if framework not in ("megatron-lm-2021", "megatron-core") or "ulysses" in t:
        return None
    for m in _SEQ_PAR.finditer(t):
        value = (m.group(1) or "")
        if m.group(0).startswith("sp") and not value:
            continue
        if value in (*_NO, "none") or re.search(r"(?:\bno|\bw/o|\bwithout|\bnot)\s*$", t[:m.start()]):
            return False
        return True
    return None


# Megatron-Bridge's performance scripts also name it "MoE A2A 1F1B communication overlap" (their a2a_1f1b option;
# scripts/performance/utils/helpers.py moe_a2a_1f1b_overrides sets overlap_moe_expert_parallel_comm=True).
_A2A_OVERLAP = re.compile(r"(overlap[-_ ]moe[-_ ]expert[-_ ]parallel[-_ ]comm|moe[-_ ]a2a[-_ ]overlap"
                          r"|(?:ep|expert[-_ ]parallel)[-_ ](?:a2a|all[-_ ]to[-_ ]all)[-_ ]overlap"
                          r"|(?:a2a|all[-_ ]to[-_ ]all)[-_ ]overlap|(?:a2a|all[-_ ]to[-_ ]all)[-_ ]1f1b)"
                          r"(?:\s*[=:]\s*(\w+))?")


def a2a_overlap_named(notes: str) -> bool | None:
    """Whether a row's notes name megatron-core's MoE all-to-all overlap (--overlap-moe-expert-parallel-comm,
    Megatron-Bridge's moe_a2a_overlap and a2a_1f1b, 'EP A2A overlap') as on (True) or off ('=False', 'no a2a overlap');
    None where they do not name it."""
    text = notes.lower()
    m = _A2A_OVERLAP.search(text)
    if m is None:
        return None
    if (m.group(2) or "") in ("false", "0", "off", "no", "none", "disabled") \
            or re.search(r"(?:\bno|\bw/o|\bwithout)\s*$", text[:m.start()]):
        return False
    return True


def overlap_waits_for_interleaving(row: dict, model: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether the notes name the all-to-all overlap that megatron-core would run on this row's plan but for the
    interleaving the row does not publish (vp blank with pp > 1; Case.a2a_overlap_open)."""
    from costmodel.rules import a2a_overlap_violations

    return (plan.pp > 1 and not _int(row.get("vp", "")) and bool(a2a_overlap_named(row.get("notes") or ""))
            and not a2a_overlap_violations(model, plan.model_copy(update={"moe_a2a_overlap": True, "vpp": 2})))


def _with_a2a_overlap(plan: ParallelPlan, model: ModelSpec, notes: str, assumed: list[str]) -> ParallelPlan:
    """The plan with the all-to-all overlap its notes name (ParallelPlan.moe_a2a_overlap), where megatron-core
    allows it (costmodel.rules.a2a_overlap_violations); else as it is, and the row says why."""
    from costmodel.rules import a2a_overlap_violations

    if not a2a_overlap_named(notes):
        return plan
    overlapped = plan.model_copy(update={"moe_a2a_overlap": True})
    why = a2a_overlap_violations(model, overlapped)
    if why:
        assumed.append(f"moe_a2a_overlap=False (the notes name the all-to-all overlap, which megatron-core does not "
                       f"run here: {why[0]})")
        return plan
    assumed.append("moe_a2a_overlap=True (from the notes)")
    return overlapped


_REPLICAS = re.compile(r"(?:num[-_ ]distributed[-_ ]optimizer[-_ ]instances|optimizer[-_ ]instances|dp[-_ ]?replicate"
                       r"|data[-_ ]parallel[-_ ]replicate[-_ ]degree|replicate[-_ ]degree|replicas?(?=\s*[=:]))\s*[=:]?\s*(\d+)"
                       r"|(\d+)\s*(?:hsdp |fsdp )?(?:replicas|optimizer instances)")
_SHARD_GROUP = re.compile(r"(?:dp[-_ ]?shard|data[-_ ]parallel[-_ ]shard[-_ ]degree|shard(?:ing)?[-_ ](?:group|degree|size)"
                          r"(?: of)?)\s*[=:]?\s*(\d+)|(\d+)[-_ ]way (?:hsdp|hybrid|shard)")


def shard_replicas(z: str, notes: str, tp: int, dp_cp: int, edp: int, gpus_per_node: int, assumed: list[str]) -> int:
    """Replicas of the sharded data-parallel state (ParallelPlan.dist_opt_instances) a row's sharding column or
    notes name, lower-cased: megatron-core's 'num-distributed-optimizer-instances 4', torchtitan's 'dp_replicate=4'
    / 'dp_shard=8', 'shard group of 8', '8-way HSDP'; HSDP or HYBRID_SHARD without a size shards within a node
    (PyTorch FSDP's default hybrid process groups: intra-node shard, inter-node replicate), the dp x cp ranks of
    ``gpus_per_node`` / ``tp`` GPUs. It divides dp x cp and the expert data-parallel size (megatron-core's
    initialize_model_parallel asserts both): else the largest replica count up to it that does, said in
    ``assumed``. 1 where none is named (sharded over all of dp x cp)."""
    text = f"{z} {notes}"
    m_rep, m_sh = _REPLICAS.search(text), _SHARD_GROUP.search(text)
    hybrid = re.search(r"hsdp|hybrid[-_ ]shard", text)
    if m_rep:
        want, why = int(m_rep.group(1) or m_rep.group(2)), "named"
    elif m_sh:
        want, why = dp_cp // max(int(m_sh.group(1) or m_sh.group(2)), 1), "dp x cp over the named shard group"
    elif hybrid:
        want = node_replicas(dp_cp, tp, gpus_per_node)
        why = f"HSDP shards within a node of {gpus_per_node} GPUs, {max(1, gpus_per_node // max(tp, 1))} dp ranks"
    else:
        return 1
    fit = max(r for r in range(1, max(1, min(want, dp_cp)) + 1) if dp_cp % r == 0 and edp % r == 0)
    note = f"dist_opt_instances={fit} ({why}" + (f"; {want} does not divide dp x cp = {dp_cp} and the expert "
                                                 f"data-parallel size {edp})" if fit != want else ")")
    if fit > 1 or want > 1:
        assumed.append(note)
    return fit


_OPTIMIZER_OFFLOAD = re.compile(r"zero[-_ ]?offload|offload[-_ ]optimizer|optimizer[-_ ](?:cpu[-_ ])?offload"
                                r"|cpu[-_ ]?adam|hybrid[-_ ]?device[-_ ]?optimizer"
                                r"|zero[-_ ]?(?:stage[-_ ]?)?[1-3]\s*(?:\+|with|w/|and)\s*"
                                r"(?:cpu[-_ ]|nvme[-_ ])?offload")
_OFFLOAD_FRACTION = re.compile(r"offload[-_ ]fraction\s*[=: ]\s*([01](?:\.\d+)?|\.\d+)")


def optimizer_offload_named(z: str, notes: str) -> float:
    """The share of the optimizer state a row's sharding column or notes (lower-cased) put in host memory:
    DeepSpeed ZeRO-Offload ('ZeRO-Offload', 'ZeRO-3 + CPU offload'), offload_optimizer, CPU-Adam, megatron-core
    --optimizer-cpu-offload (with --optimizer-offload-fraction F: F, else all of it); 0 where none is named.
    Activation offloading (--cpu-offloading, the recompute column) is not this."""
    for text in (z, notes):
        if _OPTIMIZER_OFFLOAD.search(text):
            m = _OFFLOAD_FRACTION.search(text)
            return float(m.group(1)) if m else 1.0
    return 0.0


def sharding_named(z: str) -> tuple[bool, int | None]:
    """(weights sharded, ZeRO stage or None) a sharding column names, lower-cased: 'ZeRO-2', 'ZeRO stage 2',
    'zero_optimization stage 1', 'ZeRO (stage 1)', '3'; DeepSpeed's ZeRO without a stage is stage 1 (its
    ZeRO-DP default in Megatron-DeepSpeed), ZeRO++ and ZeRO-Infinity stage 3, ZeRO-Offload stage 2; PyTorch
    FSDP's strategies FULL_SHARD (and HYBRID_SHARD / HSDP, modelled as FULL_SHARD) shard the weights,
    SHARD_GRAD_OP gradients and optimizer states (ZeRO-2), NO_SHARD nothing (DDP)."""
    zstage = _stage_number(z)
    if zstage is None and re.search(r"no[-_ ]shard", z):
        return False, 0
    if zstage is None and re.search(r"shard[-_ ]grad[-_ ]op", z):
        return False, 2
    if zstage is None and re.search(r"full[-_ ]shard", z):
        zstage = 3
    if zstage is None and re.search(r"zero(\+\+|[-_ ]?infinity)", z):
        zstage = 3
    elif zstage is None and re.search(r"zero[-_ ]?offload", z):
        zstage = 2
    elif zstage is None and re.search(r"(?<![a-z])zero(?![a-z])", z):
        zstage = 1
    fsdp = ("fsdp" in z and "fsdp=0" not in z) or "hsdp" in z or "hybrid shard" in z or "hybrid_shard" in z
    return (fsdp and zstage in (None, 3)) or zstage == 3, zstage


def _stage_number(z: str) -> int | None:
    """The ZeRO stage number a sharding column (lower-cased) writes out ('ZeRO-2', 'ZeRO stage 1', 'zero_optimization
    stage 3', '3'), or None."""
    m = re.search(r"zero[-_ ]?(?:stage)?[-_ =]?([0-3])", z) or re.fullmatch(r"(?:stage[-_ ]?)?([0-3])", z) \
        or (re.search(r"zero", z) and re.search(r"stage[-_ =:]*([0-3])", z))
    return int(m.group(1)) if m else None


def stage_named(z: str) -> bool:
    """Whether a sharding column (lower-cased) names its ZeRO stage outright: a stage number, FSDP's SHARD_GRAD_OP
    or NO_SHARD. DeepSpeed's ZeRO without a stage, a distributed optimizer or FSDP alone name a default, not a
    stage the source chose."""
    return _stage_number(z) is not None or bool(re.search(r"no[-_ ]shard|shard[-_ ]grad[-_ ]op", z))


_YES = ("true", "yes", "y", "1", "on", "enabled")
_NO = ("false", "no", "n", "0", "off", "disabled")


def _expert_parallel(ep: int, model: ModelSpec, ranks: int, assumed: list[str]) -> int:
    """The row's expert parallelism where a run can have it: megatron-core splits the experts evenly over the ep
    ranks and the ep ranks out of tp x cp x dp, so ep divides both the expert count and that product. A row
    beyond either (ep counted over the GPUs, or 16 for 8 experts) takes the largest ep up to its own that does,
    said in ``assumed``; a dense model has none."""
    if not model.is_moe:
        return 1
    if model.num_experts % ep == 0 and ranks % ep == 0:
        return ep
    fit = max(e for e in range(1, min(ep, model.num_experts, ranks) + 1)
              if model.num_experts % e == 0 and ranks % e == 0)
    assumed.append(f"ep={fit} (the row's ep={ep} does not divide the {model.num_experts} experts and the "
                   f"{ranks} tp x cp x dp ranks)")
    return fit


_ETP_NAMED = re.compile(r"(?<![a-z])(?:etp|expert[-_ ]tensor[-_ ]parallel(?:[-_ ]size)?)\s*[=: ]\s*(\d+)", re.I)


def _expert_tensor_parallel(row: dict, model: ModelSpec, framework: str, tp: int, ep: int, ranks: int,
                            assumed: list[str]) -> int:
    """The expert tensor parallelism a MoE row ran: the notes' ETP where they give one; else, on megatron-core
    with tp > 1, megatron-core's own default, the tensor-parallel size (parallel_state.initialize_model_parallel
    and arguments.py: expert_tensor_parallel_size None -> tensor_model_parallel_size; before that option existed
    the experts were split over the tensor-parallel group), except for Megatron-Bridge runs, whose performance
    recipes set 1 (scripts/performance/configs/*_workload_base_configs.py: expert_tensor_parallel_size=1); 1 on
    other stacks. ep x etp divides the tp x cp x dp ranks (megatron-core's expert model-parallel group), else
    the largest etp up to it that does, said in ``assumed``."""
    if not model.is_moe:
        return 1
    notes = row.get("notes") or ""
    m = _ETP_NAMED.search(notes)
    if m:
        want, why = int(m.group(1)), "the row's notes"
    elif framework == "megatron-core" and tp > 1 and not re.search(
            r"bridge", " ".join(row.get(c) or "" for c in ("source_id", "framework", "notes")), re.I):
        want, why = tp, "megatron-core's default, the tensor-parallel size, where a run sets none"
    else:
        return 1
    fit = max(e for e in range(1, max(want, 1) + 1) if ranks % (ep * e) == 0 and (want % e == 0))
    if fit != 1 or want != 1:
        assumed.append(f"etp={fit} ({why}" + (f"; {want} x ep {ep} does not divide the {ranks} tp x cp x dp "
                                              f"ranks)" if fit != want else ")"))
    return fit


def _full_recompute_layers(text: str, model: ModelSpec, pp: int, vpp: int) -> int | None:
    """Layers per pipeline stage a full-recompute column recomputes: Megatron's block method ('full (block, 4
    layers)', 'partial, 2 layers', 'recompute_num_layers=2') recomputes that many layers of each model chunk,
    so times vpp, at most the stage's layers; None (all) for the uniform method ('full (uniform, 1 layer)', the
    number is its chunk size) or when no count is given."""
    if "uniform" in text:
        return None
    m = re.search(r"(\d+)\s*layers?|num[-_ ]layers\s*[=:]?\s*(\d+)", text)
    if not m:
        return None
    per_chunk = int(m.group(1) or m.group(2))
    return min(per_chunk * vpp, math.ceil(model.layers / pp))


def recompute_named(text: str) -> str:
    """none / selective / full / offload for the ways a recompute column says them ('yes', 'activation
    checkpointing', 'AC', 'full (uniform, 1 layer)', 'selective (core attn)', 'SAC', 'off', 'cpu offloading');
    anything else (blank, 'unknown') unchanged."""
    # 'none (no AC)', 'no recompute', 'w/o activation checkpointing', 'disabled': a negation before anything else.
    if text in _NO or re.match(r"(?:none|no|off|disabled|without|w/o)(?![a-z0-9])", text):
        return "none"
    if "offload" in text:
        return "offload"
    if "selective" in text or "core attn" in text or "core_attn" in text or re.search(r"\bsac\b|op[- ]level", text):
        return "selective"      # torchtitan's selective activation checkpointing: 'SAC', 'op-level'
    # 'activation recomputation', JAX's 'remat', DeepSpeed's 'partition activations' (of checkpointed layers).
    if text in _YES or re.search(r"full|checkpoint|uniform|block|partial|recomput|remat|partition[-_ ]activ|\bac\b",
                                 text):
        return "full"
    return text


def framework_split(layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Layers per pipeline rank where a published run's layer count does not divide its pp x vpp virtual
    stages (Megatron then needs an explicit split). With the embedding and loss counted as a layer each
    it divides (Llama-3.1-405B: 126 + 2 over 32), the even split of Megatron's
    account_for_embedding/loss_in_pipeline_split applies: None. Otherwise the virtual stages hold
    ceil(layers / (pp*vpp)) layers each and the last the remainder, beside the loss (and any MTP modules):
    Megatron-Bridge's DeepSeek-V3 layouts (61 layers, pp16: 4 x 15 and 1; pp8: 8 x 7 and 5; pp4: 16 x 3 and
    13; recipes/deepseek/deepseek_v3.py, set_deepseek_v3_pipeline_model_parallel_layout)."""
    stages = pp * vpp
    if pp > 1 and stages > layers + 2:
        raise InputError(f"pp x vp = {pp} x {vpp} = {stages} virtual pipeline stages for {layers} layers; each stage "
                         f"needs a layer (at most {layers + 2} with the embedding and the loss counted)")
    if pp <= 1 or layers % stages == 0 or (layers + 2) % stages == 0:
        return None
    per = -(-layers // stages)
    virt, left = [], layers
    for _ in range(stages):
        virt.append(min(per, left))
        left -= virt[-1]
    return tuple(sum(virt[v * pp + r] for v in range(vpp)) for r in range(pp))


# Numeric columns a scored row must give (positive integers; step_time_s a positive number of seconds), and
# those it may leave blank or "unknown".
_REQUIRED_INTS = ("layers", "hidden", "heads", "seq_len", "num_gpus", "tp", "pp", "global_batch")
_OPTIONAL_INTS = ("ffn_hidden", "kv_heads", "vocab", "moe_topk", "gpus_per_node", "vp", "cp", "ep", "dp",
                  "micro_batch")


# Architecture columns a row may leave blank when its model name is a catalog model.
_ARCH_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "vocab", "seq_len", "ffn_hidden", "moe_experts", "moe_topk")


def fill_from_catalog(row: dict, assumed: list[str]) -> dict:
    """The row with the architecture columns it leaves blank (_ARCH_COLUMNS) taken from the catalog model its
    name is (an alias, any spacing or case; a parenthesised note such as '(dropless)' ignored), each named in
    ``assumed``. A row that gives its layers, hidden and heads comes back unchanged; one that leaves any of them
    blank and names no catalog model is a ValueError naming the blank columns and the catalog."""
    blank = [c for c in _ARCH_COLUMNS if _num(row.get(c, "")) is None]
    need = [c for c in ("layers", "hidden", "heads") if c in blank]
    if not need:
        return _fill_named_widths(row, blank, assumed)
    try:
        spec = get_model(re.sub(r"\(.*?\)", "", row.get("model_name") or "").strip())
    except InputError as exc:
        near = re.search(r" \(did you mean [^)]*\)", str(exc))
        raise ValueError(f"column(s) {', '.join(need)} empty and model_name {row.get('model_name')!r} is no "
                         f"catalog model to take them from{near.group(0) if near else ''}; fill them or name one "
                         f"of: {_catalog_list()}") from None
    return _filled(row, spec, blank, assumed, "")


def _catalog_list(limit: int = 24) -> str:
    """The catalog's names for a one-line error: the first ``limit``, then how many more (the README's --model
    lists them all)."""
    names = catalog_names()
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more (README, --model)" if more > 0 else "")


def _filled(row: dict, spec: ModelSpec, blank: list[str], assumed: list[str], why: str) -> dict:
    """The row with its ``blank`` architecture columns taken from ``spec``, named in ``assumed``."""
    # The schema's ffn_hidden of a MoE row is the expert width.
    ffn = (spec.moe_ffn_hidden or spec.ffn_hidden) if spec.num_experts else spec.ffn_hidden
    values = {**{c: getattr(spec, c) for c in _ARCH_COLUMNS[:6]}, "ffn_hidden": ffn,
              "moe_experts": spec.num_experts, "moe_topk": spec.moe_topk}
    filled = {c: values[c] for c in blank if values[c]}
    if filled:
        assumed.append(f"{', '.join(f'{c}={v}' for c, v in filled.items())} (not in the row; the catalog's "
                       f"{spec.name}{why})")
    return {**row, **{c: str(v) for c, v in filled.items()}}


# Columns a row giving its layers, hidden and heads may still leave blank, which the schema's defaults (MHA,
# Megatron's 51,200 tokens, 4h or the width params_b implies, a dense MLP) would misread for a known model.
_WIDTH_COLUMNS = ("kv_heads", "vocab", "ffn_hidden", "moe_experts", "moe_topk")


def _fill_named_widths(row: dict, blank: list[str], assumed: list[str]) -> dict:
    """The row with the _WIDTH_COLUMNS it leaves blank taken from the catalog model its name names
    ('LLAMA2-70B (SFT)', 'Llama-3.1-405B (proxy, 7 layers)', 'DeepSeek-V3': costmodel.catalog.named_in) where
    the row's hidden and heads, and its expert count where it gives one, agree with that model's (a proxy with
    fewer layers is still its model); unchanged where none does."""
    want = [c for c in _WIDTH_COLUMNS if c in blank]
    if not want:
        return row
    experts = _int(row.get("moe_experts", ""))
    for name in named_in(row.get("model_name") or ""):
        spec = catalog()[name]
        if (spec.hidden, spec.heads) == (_int(row.get("hidden", "")), _int(row.get("heads", ""))) \
                and experts in (None, spec.num_experts):
            return _filled(row, spec, want, assumed, ", whose hidden and heads the row gives")
    return row


def fill_degrees(row: dict, assumed: list[str]) -> dict:
    """The row with a blank ``num_gpus`` (tp x pp x cp x dp where all four are given) or a blank ``tp`` or ``pp``
    filled, each named in ``assumed``: from the GPU count where the other degrees and ``dp`` are given (num_gpus / (the others x cp x dp), when that is a whole number), else 1
    (not published: a stack that names no tensor or pipeline parallelism ran none). A row whose given degrees
    cannot fill its GPUs that way keeps the blank, and _check_numbers names it."""
    given = {}
    for c in ("num_gpus", "tp", "pp", "cp", "dp"):
        raw = (row.get(c) or "").strip()
        x = _num(raw)
        if x is None and raw.lower() in ("", *_ABSENT):
            continue
        if x is None or not math.isfinite(x) or x != int(x) or x < 0:   # text, inf, NaN, a fraction:
            return row                                                     # _check_numbers names it
        given[c] = int(x)
    blank = [c for c in ("tp", "pp") if c not in given]
    if "num_gpus" not in given and not blank and given.get("dp"):
        # A blank GPU count where every degree is given: their product (ep and etp divide it, not multiply).
        gpus = given["tp"] * given["pp"] * (given.get("cp") or 1) * given["dp"]
        assumed.append(f"num_gpus={gpus} (tp x pp x cp x dp)")
        return {**row, "num_gpus": str(gpus)}
    gpus = given.get("num_gpus", 0)
    if not blank or gpus < 1 or any(given[c] < 1 for c in ("tp", "pp") if c not in blank):
        return row
    cp, dp = given.get("cp") or 1, given.get("dp")
    known = 1
    for c in ("tp", "pp"):
        if c not in blank:
            known *= given[c]
    if dp:
        rest, left = divmod(gpus, known * cp * dp)
        if left or rest < 1 or (len(blank) == 2 and rest != 1):
            return row
        filled = {blank[0]: rest} if len(blank) == 1 else {"tp": 1, "pp": 1}
        how = f"num_gpus / ({' x '.join([c for c in ('tp', 'pp') if c not in blank] + ['cp', 'dp'])})"
    else:
        filled = {c: 1 for c in blank}
        how = "not published"
    assumed.append(f"{', '.join(f'{c}={v}' for c, v in filled.items())} ({how})")
    return {**row, **{c: str(v) for c, v in filled.items()}}


# A published step time outside these is no measurement of a training step: a microsecond is below one kernel
# launch, a million seconds (11.6 days) beyond any step of the published runs by four orders of magnitude.
MIN_STEP_TIME_S = 1e-6
MAX_STEP_TIME_S = 1e6


def _check_numbers(row: dict) -> float:
    """The row's published step time; a ValueError naming the column for a number a row gets wrong: text, 0, a
    fraction, NaN, inf."""
    # A wrong number first (it is why a blank degree could not be filled), then a blank required column.
    for col in _REQUIRED_INTS + _OPTIONAL_INTS + ("moe_experts",):
        raw = (row.get(col) or "").strip()
        x = _num(raw)
        if x is None:
            if raw and raw.lower() not in _ABSENT:
                raise ValueError(f"column '{col}': expected a positive integer, got {raw!r}")
            continue
        low = 0 if col == "moe_experts" or col in _OPTIONAL_INTS else 1   # an optional 0: not used / unset
        if not math.isfinite(x) or x != int(x) or not low <= x <= INT64_MAX:
            raise ValueError(f"column '{col}': expected an integer >= {low}, got {raw!r}")
    for col in _REQUIRED_INTS:
        if _num(row.get(col) or "") is None:
            raise ValueError(f"column '{col}': expected a positive integer, got {(row.get(col) or '').strip()!r}")
    raw = (row.get("step_time_s") or "").strip()
    t = _num(raw) if raw else published_step_time(row)
    if t is None or not math.isfinite(t) or not MIN_STEP_TIME_S <= t <= MAX_STEP_TIME_S:
        raise ValueError(f"column 'step_time_s': expected a step time in seconds, {MIN_STEP_TIME_S:g} to "
                         f"{MAX_STEP_TIME_S:g}, got {raw or f'{t:g} (from measured_value)'!r}")
    return t


def _delimiter(header: str) -> str:
    """The field separator of a published-runs file, read off its header line: a comma, or, where the header has
    none, a tab, semicolon or bar (spreadsheet exports)."""
    if "," in header:
        return ","
    return max("\t;|", key=header.count) if any(d in header for d in "\t;|") else ","


def load_cases(path: str | Path, unpublished: bool = False) -> tuple[list[Case], list[dict]]:
    """Scored rows as cases; rows that cannot be turned into a case come back as errors. With ``unpublished`` a
    row whose only fault is that it gives no step time (NoStepTime) is a case too, with a NaN published step
    time and an assumption saying why: ``plan validate`` predicts it without scoring it."""
    p = Path(path)
    text = read_text(p, "CSV file")
    if "\0" in text:
        raise InputError(f"{p}: not a CSV file (it holds NUL bytes); expected the columns of "
                         f"data/validation/published_runs.csv")
    lines = text.splitlines()
    reader = csv.DictReader(lines, delimiter=_delimiter(lines[0] if lines else ""))
    try:
        cols = reader.fieldnames or []
        # Header names as the schema spells them: surrounding spaces and capitals do not matter.
        cols = reader.fieldnames = [c.strip().lower() if isinstance(c, str) else c for c in cols]
    except csv.Error as exc:
        raise InputError(f"{p}: malformed CSV header ({exc})") from None
    # A file without a source_id column is one source, named after the file.
    one_source = p.stem if "source_id" not in cols and any(c in cols for c in REQUIRED_COLUMNS) else None
    missing = [c for c in REQUIRED_COLUMNS if c not in cols and not (c == "source_id" and one_source)]
    if "step_time_s" not in cols and not {"measured_metric", "measured_value"} <= set(cols):
        missing.append("step_time_s (or measured_metric and measured_value)")
    if missing:
        raise InputError(f"{p}: missing column(s) {', '.join(missing)}; expected the columns of "
                         f"data/validation/published_runs.csv")
    cases, errors = [], []
    rows = iter(reader)
    i = -1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(f"{p}: line {reader.line_num}: malformed CSV ({exc})") from None
        i += 1
        if "scored" in cols and (row.get("scored") or "").strip().lower() not in _YES:
            continue
        assumed: list[str] = []
        if one_source:
            row["source_id"] = one_source
            assumed.append(f"source_id={one_source} (the file has no source_id column: one source)")
        try:
            # Numbers as tables print them, before and after the catalog fills a blank seq_len (a batch in tokens).
            row = normalise_numbers(fill_from_catalog(normalise_numbers(row, assumed), assumed), assumed)
            splits, alternatives, fault = product_splits(row), [], None
            for tp, pp in splits:
                try:
                    alternatives.append(_case_of(i, {**row, "tp": str(tp), "pp": str(pp)}, list(assumed), unpublished,
                                                 ()))
                except (InputError, ValueError) as exc:   # a split the model cannot take (rules, layers), or the row
                    fault = fault or exc                    # itself (said below where no split can be read)
            if splits:
                if not alternatives:
                    raise fault
                cases.append(replace(alternatives[0], alternatives=tuple(alternatives)))
                continue
            open_degrees = _open_degrees(row)
            cases.append(_case_of(i, fill_degrees(row, assumed), assumed, unpublished, open_degrees))
        except Exception as exc:   # noqa: BLE001 - one row's fault must not lose the file's other rows
            errors.append({"row": i, "source_id": row.get("source_id"), "gpu_type": row.get("gpu_type"),
                           "model_name": row.get("model_name"), "num_gpus": _int(row.get("num_gpus", "")),
                           "published_step_time_s": _num(row.get("step_time_s", "")),
                           "error": f"{p}: row {i}: {_row_error(exc)}"})
    return cases, errors


# Model names of families whose layers are not all attention (Mamba hybrids, linear attention, RWKV): a row naming
# one is priced as a transformer of its layers, and says so (costmodel/catalog.py refuses such Hugging Face configs).
_NON_ATTENTION_NAME = re.compile(r"nemotron[- ]?h\b|nemotron[- ]?3[- ]?(nano|super|ultra)|mamba|jamba|zamba|"
                                 r"falcon[- ]?h1|qwen3[- ]?next|hymba|rwkv|minimax[- ]?(text[- ]?01|m1)|bamba", re.I)


def _case_of(i: int, row: dict, assumed: list[str], unpublished: bool, open_degrees: tuple[str, ...]) -> Case:
    """One read row (numbers normalised, catalog and degrees filled) as a case; ``assumed`` grows with what is
    read into it."""
    try:
        published = _check_numbers(row)
    except NoStepTime as exc:
        if not unpublished:
            raise
        published = math.nan
        assumed.append(f"not scored: {exc}")
    framework = framework_of(row, assumed)
    profile = load_profile(row["gpu_type"])
    model = row_model(row, assumed)
    hybrid = _NON_ATTENTION_NAME.search(row.get("model_name") or "")
    if hybrid and not model.hybrid_pattern:
        assumed.append(f"model_name names a model with state-space or linear-attention layers ({hybrid.group(0)!r}): "
                       f"priced as a transformer of its {model.layers} layers, every one attention and MLP (such "
                       f"layers are not modelled)")
    if not profile.supports(model.precision) and any(a.startswith("precision=bf16") for a in assumed):
        # Mixed precision on a GPU without bf16 arithmetic (V100) is fp16.
        model = model.model_copy(update={"precision": "fp16"})
        assumed[:] = [a.replace("precision=bf16", "precision=fp16", 1) if a.startswith("precision=bf16")
                      else a for a in assumed]
    if not profile.supports(model.precision):
        # Priced as it is (HardwareProfile.peak falls back to the next wider type), and said.
        rate = profile.rate_dtype(gemm_dtype(model.precision))
        assumed.append(f"precision={model.precision} priced at {rate} rates ({profile.name} has no "
                       f"{model.precision} tensor cores)")
    cluster = row_cluster(row, profile, assumed)
    plan, known = row_plan(row, model, framework, assumed)
    overlap_open = overlap_waits_for_interleaving(row, model, plan)
    if not overlap_open:   # else predict_case decides with the interleavings it tries (Case.a2a_overlap_open)
        plan = _with_a2a_overlap(plan, model, row.get("notes") or "", assumed)
    # megatron-core's unpublished vp is searched regardless; another stack's where the row says it interleaved.
    looped = interleaving_stack(row, framework in OTHER_STACKS_NOW) if plan.pp > 1 else None
    mbs_known = bool(_int(row.get("micro_batch", ""))) or not micro_batch_open(plan)
    if not mbs_known:   # predict_case tries the options; drop the default row_plan noted
        assumed[:] = [a for a in assumed if not a.startswith("micro_batch=")]
    return Case(i, row["source_id"], profile.name, model, cluster, plan, published, known, assumed,
                release_of(row["source_id"], row.get("notes", "")),
                vpp_known=plan.pp == 1 or bool(_int(row.get("vp", ""))),
                micro_batch_known=mbs_known, ep_known=not model.is_moe or bool(_int(row.get("ep", ""))),
                open_degrees=open_degrees,
                stage_named=stage_named((row.get("zero_stage_or_distopt") or "").strip().lower()),
                stack_interleaves=looped or "",
                a2a_overlap_open=overlap_open)


# What every row error :func:`unexpected` writes says (tests look for it: no input may cause one).
UNEXPECTED = "a fault of the cost model"


def _row_error(exc: Exception) -> str:
    """One line saying why a row could not be read or predicted: the field and value for a schema error, the
    message of an input check, or :func:`unexpected`."""
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"]) or "(row)"
        return f"{exc.title} field '{loc}': {e['msg']} (got {e.get('input')!r})"
    if isinstance(exc, (InputError, ValueError, TypeError, KeyError, FloatingPointError)):
        return str(exc).splitlines()[0]
    return unexpected(exc)


def unexpected(exc: Exception) -> str:
    """One line for an error no input check foresaw (a fault of the model, not of the row): the row is reported
    with it and the file's other rows are still predicted."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return (f"unexpected {type(exc).__name__}{at}: {str(exc).splitlines()[0] if str(exc) else '(no message)'} "
            f"({UNEXPECTED}, not of the row: please report it with the row)")


def micro_batch_open(plan: ParallelPlan) -> bool:
    """Whether an unpublished micro-batch is left to :func:`predict_case` (the fastest that fits) rather than
    Megatron's 1: where weights are sharded (ZeRO-3, FSDP: every micro-batch gathers the weights again, so the
    people who ran it would not split the per-rank batch without need), on stacks other than Megatron without
    a pipeline (PyTorch FSDP / DDP, DeepSpeed, torchtitan: a per-device batch, split only when it does not fit),
    and on megatron-core, whose published runs set it per model and GPU (Megatron-Bridge's recipes: 1 to 8,
    scripts/performance/configs/*/..._workload_base_configs.py micro_batch_size)."""
    return (plan.zero_stage == 3 or (plan.framework.startswith("other") and plan.pp == 1)
            or plan.framework == "megatron-core")


def _why_micro_batch_open(plan: ParallelPlan) -> str:
    if plan.zero_stage == 3:
        return "weights gathered per micro-batch"
    return "a tuned recipe" if plan.framework == "megatron-core" else "no pipeline"


def micro_batch_options(plan: ParallelPlan) -> list[ParallelPlan]:
    """The micro-batches an unpublished one may be (:func:`micro_batch_open`): every divisor of the per-rank
    batch (global batch // dp), the whole of it the last."""
    per_rank = max(1, plan.global_batch // plan.dp)
    return [plan.model_copy(update={"micro_batch": b}) for b in range(1, per_rank + 1) if per_rank % b == 0]


def expert_options(plan: ParallelPlan, model: ModelSpec, num_gpus: int) -> list[ParallelPlan]:
    """What a MoE run whose row leaves ep blank may have split its experts over: Megatron's default (1) and every
    ep that divides the experts and, with the row's etp, the tp x cp x dp ranks, where megatron-core accepts the
    layout as far as the row's own does (rules.violations). :func:`predict_case` takes the fastest that fits: a
    model whose experts do not fit on every GPU ran with them split."""
    from costmodel.rules import violations

    ranks = plan.tp * plan.cp * plan.dp
    base = set(violations(model, plan, num_gpus))    # what the row's layout already breaks (an uneven split) stays
    out = [plan]
    for e in range(2, model.num_experts + 1):
        if model.num_experts % e or ranks % (e * plan.etp):
            continue
        q = plan.model_copy(update={"ep": e})
        if set(violations(model, q, num_gpus)) <= base:
            out.append(q)
    return out


# Shares of the layers an unknown activation-memory setting may offload (recompute_options).
OFFLOAD_SHARES = (0.125, 0.25, 0.5, 0.75)


def recompute_options(plan: ParallelPlan, model: ModelSpec, profile: HardwareProfile | None = None
                      ) -> list[ParallelPlan]:
    """What a framework user tries, in order, until the run fits: no recompute; with megatron-core at pp 1 on a
    GPU whose host link is known, offloading a growing share of the layers' activations to host memory
    (--cpu-offloading-num-layers); selective; then full recompute of a growing number of layers per stage
    (Megatron --recompute-num-layers), then all, without the all-to-all overlap, which megatron-core does not run
    with full recompute. :func:`predict_case` takes the fastest that fits."""
    per_stage = max(1, model.layers // plan.pp)
    chunk = max(1, per_stage // plan.vpp)
    opts = [plan.model_copy(update={"recompute": "none", "recompute_layers": None})]
    if (plan.pp == 1 and plan.framework == "megatron-core" and profile is not None
            and profile.host_link_bandwidth_bytes_per_s is not None):
        ks = sorted({max(1, int(round(model.layers * f))) for f in OFFLOAD_SHARES} | {model.layers - 1})
        opts += [plan.model_copy(update={"recompute": "offload", "recompute_layers": k})
                 for k in ks if 1 <= k < model.layers]
    opts.append(plan.model_copy(update={"recompute": "selective", "recompute_layers": None}))
    for frac in (0.125, 0.25, 0.5, 0.75):
        k = max(1, int(round(chunk * frac)))
        if k < chunk:
            opts.append(plan.model_copy(update={"recompute": "full", "recompute_layers": k * plan.vpp,
                                                "moe_a2a_overlap": False}))
    opts.append(plan.model_copy(update={"recompute": "full", "recompute_layers": None, "moe_a2a_overlap": False}))
    return opts


# The deepest interleaving interleaving_options tries (model chunks per pipeline rank): published recipes use
# up to about 20 (Megatron-Bridge Llama 3 70B pp4 vp5; NeMo Llama 2 70B pp4 vp20), and the bound keeps a row
# with an absurd layer count from trying millions.
MAX_UNPUBLISHED_VPP = 64


def _with_named_overlap(plan: ParallelPlan, model: ModelSpec) -> ParallelPlan:
    """An interleaving predict_case tries for a row whose notes name the all-to-all overlap (Case.a2a_overlap_open):
    with the overlap where megatron-core allows it (rules.a2a_overlap_violations: vpp > 1 here), else as it is."""
    from costmodel.rules import a2a_overlap_violations

    overlapped = plan.model_copy(update={"moe_a2a_overlap": True})
    return plan if a2a_overlap_violations(model, overlapped) else overlapped


def interleaving_options(plan: ParallelPlan, model: ModelSpec, num_gpus: int,
                         stack_interleaves: bool = False) -> list[ParallelPlan]:
    """What a megatron-core run with pp > 1 whose row leaves vp blank may have interleaved: no interleaving
    (Megatron's default) and every vp whose virtual stages split the layers evenly (the embedding and loss
    counted as a layer each, as framework_split does) and that megatron-core accepts (rules.violations).
    :func:`predict_case` takes the fastest that fits, as for an unknown recompute: published recipes with
    pp > 1 interleave where the layers allow (Megatron-Bridge's Llama 3 70B: pp4 vp5). Older Megatron-LM (the
    2020-2022 papers' tables) and other stacks keep the row's vp=1: their schedules are not megatron-core's."""
    from costmodel.rules import violations

    if plan.pp == 1 or not (plan.framework == "megatron-core" or stack_interleaves):
        return [plan]
    out = [plan]
    # Where the layers do not divide the pipeline but do with the embedding and loss counted (Qwen3-235B's 94 + 2
    # over pp 8), the split is written out: the first and last ranks one layer short (plan.even_split), as
    # account_for_embedding/loss_in_pipeline_split places them; the rules judge an even split otherwise.
    split = even_split(model.layers, plan.pp) if model.layers % plan.pp else None
    for v in range(2, min(model.layers // plan.pp, MAX_UNPUBLISHED_VPP) + 1):
        stages = plan.pp * v
        if model.layers % stages and (model.layers + 2) % stages:
            continue
        q = plan.model_copy(update={"vpp": v, "layers_per_stage": split})
        if not violations(model, q, num_gpus):
            out.append(q)
    return out


def product_splits(row: dict) -> list[tuple[int, int]]:
    """(tp, pp) splits of a row that gives dp but neither tp nor pp: their product is num_gpus / (cp x dp), and tp
    a power of two up to 8, or to the node where the row gives a larger one (an NVL72 rack). Empty for any other
    row, and where the GPU count does not divide (the blank is then the row's one-line error). predict_case takes
    the fastest that fits: over the shared CSV with tp and pp blanked, that is the published split in 184 of the
    232 rows whose product is above 1 (6.9% MAPE there, 7.70% over all 342 against 7.61% as published), where
    tensor parallelism inside a node first (Megatron's practice) gave 118% on the rows it read otherwise."""
    if _num(row.get("dp", "")) is None or any(_num(row.get(c, "")) is not None for c in ("tp", "pp")):
        return []
    gpus, dp, cp = _int(row.get("num_gpus", "")), _int(row.get("dp", "")), _int(row.get("cp", "")) or 1
    if not gpus or not dp or gpus % (cp * dp):
        return []
    k = gpus // (cp * dp)
    node = max(_int(row.get("gpus_per_node", "")) or 8, 8)
    return [(t, k // t) for t in (1, 2, 4, 8, 16, 32, 64) if t <= node and k % t == 0] if k > 1 else []


def _open_degrees(row: dict) -> tuple[str, ...]:
    """The degrees fill_degrees will read as 1 (not published): tp and pp where the row leaves them blank and dp
    too (with dp given, the GPU count fills them)."""
    if _num(row.get("dp", "")) is not None:
        return ()
    return tuple(c for c in ("tp", "pp") if _num(row.get(c, "")) is None)


def degree_options(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec,
                   open_degrees: tuple[str, ...]) -> list[ParallelPlan]:
    """Tensor and pipeline parallelism a run whose row names neither (nor dp) may have had, for the ``open``
    ones: tp a power of two inside one NVLink domain, pp a divisor of the layers, dp what the GPUs leave, with
    sequence parallelism on where tp > 1 (megatron-core and later stacks), where megatron-core accepts the layout
    (rules.violations); the row's own reading (1) excluded."""
    from costmodel.rules import violations

    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cluster.domain_gpus] if "tp" in open_degrees else [plan.tp]
    pps = [q for q in range(1, model.layers + 1) if model.layers % q == 0] if "pp" in open_degrees else [plan.pp]
    gpus = plan.tp * plan.pp * plan.cp * plan.dp    # the row's GPUs (its cluster rounds them up to whole nodes)
    out = []
    for t in tps:
        for q in pps:
            rest, left = divmod(gpus, t * q * plan.cp)
            if left or rest < 1 or (t, q) == (plan.tp, plan.pp):
                continue
            sp = t > 1 and plan.framework in SEQUENCE_PARALLEL_STACKS
            cand = plan.model_copy(update={"tp": t, "pp": q, "dp": rest, "vpp": 1, "layers_per_stage": None,
                                           "sequence_parallel": sp})
            if not violations(model, cand, gpus):
                out.append(cand)
    return out


def with_degrees(case: Case, plan: ParallelPlan) -> Case:
    """The case with one of its degree_options as its layout, nothing left open; a pipeline the row did not
    publish has its interleaving unpublished too (interleaving_options)."""
    return replace(case, plan=plan, open_degrees=(), vpp_known=plan.pp == 1 or case.plan.vpp > 1)


def sharding_fallbacks(plan: ParallelPlan, raise_stage: bool = True) -> list[ParallelPlan]:
    """A published run that cannot fit as described must have sharded more than the row says: try the
    same plan with the optimizer state (ZeRO-1, Megatron's distributed optimizer), then gradients (ZeRO-2) and
    then weights (ZeRO-3 / FSDP) sharded over data parallelism. Gradients and weights not with pipeline
    parallelism: megatron-core's Megatron-FSDP (either stage) needs pp 1 (rules.py,
    fsdp_pipeline), so the estimate would refuse those plans anyway. ``raise_stage=False`` (a row that names its
    stage) keeps the stage and tries only larger shard groups."""
    if plan.dp * plan.cp <= 1:
        return []
    # Sharded inside replicas (HSDP) that do not hold the state: fewer replicas of larger shard groups.
    fewer = [plan.model_copy(update={"dist_opt_instances": r}) for r in range(plan.dist_opt_instances - 1, 0, -1)
             if plan.dist_opt_instances % r == 0]
    if plan.zero_stage >= 3 or not raise_stage:
        return fewer
    stages = (1, 2, 3) if plan.pp == 1 else (1,)
    return fewer + [plan.model_copy(update={"zero_stage": z, "distributed_optimizer": True}) for z in stages
                    if z > plan.zero_stage]


def _describe_recompute(plan: ParallelPlan) -> str:
    if plan.recompute in ("full", "offload") and plan.recompute_layers is not None:
        return f"{plan.recompute}:{plan.recompute_layers}"
    return plan.recompute


def _fastest_fitting(fits: np.ndarray, step_s: np.ndarray, n_base: int, peaks: np.ndarray) -> int:
    """The option a published run most likely used: the fastest of the layout as published that fits; failing
    that, the fastest sharding fallback that fits; failing that, the option as published that needs the least
    memory (it does not fit either, but the run ran, so it is the one nearest to how: an open micro-batch at its
    smallest, an open recompute at its fullest), the last one where none can be priced."""
    step_s = np.asarray(step_s, dtype=float)
    for lo, hi in ((0, n_base), (n_base, len(fits))):
        ok = np.flatnonzero(fits[lo:hi])
        if ok.size:
            return lo + int(ok[np.argmin(step_s[lo:hi][ok])])
    need = np.where(np.isfinite(step_s[:n_base]), np.asarray(peaks, dtype=float)[:n_base], np.inf)
    return int(np.argmin(need)) if np.isfinite(need).any() else n_base - 1


# How a prediction that does not fit because of its host memory says so (plan validate's not-fit line reads it).
HOST_SHORT = "host memory: "


def predict_case(case: Case, profile: HardwareProfile | None = None, offload_fallback: bool = True) -> dict:
    """Predict one case; an unknown recompute setting (recompute_options) takes the fastest that fits: a
    published run was tuned by the people who ran it.

    A published layout that does not fit as the row gives it ran some other way; the fallbacks, in order: a
    one-node run whose host share cannot hold what it offloads on a server of the usual size; an
    other-2022 row with memory-efficient attention; the fastest recompute that fits, where the recompute setting
    alone keeps it out; the optimizer state in host memory with the row's recompute (and only where that does
    not fit either, another recompute). ``offload_fallback=False`` leaves the last one out."""
    if case.alternatives:
        got, fit = _fastest_of(case.alternatives, profile, offload_fallback)
        q = got["plan"]
        got["assumed"].append(f"tp={q.tp}, pp={q.pp} (not published; tp x pp = {q.tp * q.pp} from num_gpus / (cp x dp), "
                              f"split the {'fastest way that fits' if fit else 'way needing the least memory: none fits'})")
        return got
    if case.open_degrees and case.plan.framework in TUNED_DEGREES:
        layouts = [case.plan] + degree_options(case.plan, case.model, case.cluster, case.open_degrees)
        # A layout whose data parallelism does not divide the global batch is none the run used (megatron-core's
        # calculator refuses it), where some layout's does.
        whole = [q for q in layouts if q.global_batch % (q.dp * q.micro_batch) == 0]
        got, fit = _fastest_of([with_degrees(case, q) for q in whole or layouts], profile, offload_fallback)
        q = got["plan"]
        got["assumed"] = [a for a in got["assumed"] if not (a.startswith(("tp=", "pp=")) and a.endswith("(not published)"))]
        got["assumed"].append(f"{', '.join(f'{c}={getattr(q, c)}' for c in case.open_degrees)}, dp={q.dp} (not published; "
                              f"the {'fastest layout that fits' if fit else 'layout needing the least memory: none fits'}"
                              f": a Megatron run's degrees are tuned)")
        return got
    prof = profile or load_profile(case.cluster.gpu)
    world = case.plan.tp * case.plan.pp * case.plan.cp * case.plan.dp    # the row's GPUs (a node may hold more)
    layouts = [case.plan] if case.vpp_known else interleaving_options(case.plan, case.model, world,
                                                                      bool(case.stack_interleaves))
    interleaved = len(layouts) > 1
    if case.a2a_overlap_open:
        layouts = [_with_named_overlap(q, case.model) for q in layouts]
    if not case.micro_batch_known:
        layouts = [q for p in layouts for q in micro_batch_options(p)]
    if not case.ep_known:
        layouts = [q for p in layouts for q in expert_options(p, case.model, world)]

    def with_recompute(ps: list[ParallelPlan]) -> list[ParallelPlan]:
        return [q for p in ps for q in ([p] if case.recompute_known else recompute_options(p, case.model, prof))]

    base = with_recompute(layouts)
    plans = base + with_recompute(sharding_fallbacks(case.plan, raise_stage=not case.stage_named))
    out = estimate_arrays(case.model, case.cluster, PlanArrays.from_plans(plans), profile=prof,
                          framework=case.plan.framework)
    assumed = list(case.assumed)
    # The run ran, so what it had to fit is the GPU's memory (and the host's, for offloaded activations), not the
    # planner's usable share of it (HardwareProfile.usable_memory_fraction, a margin for plans not yet run).
    peaks = np.nan_to_num(np.asarray(out["peak_memory_bytes"], dtype=float).reshape(len(plans), -1),
                          nan=-np.inf).max(axis=1)
    fits = np.isfinite(out["step_time_s"]) & (peaks <= prof.memory_bytes.value) & out["host_fits"]
    idx = _fastest_fitting(fits, out["step_time_s"], len(base), peaks)
    host_short = not fits[idx] and peaks[idx] <= prof.memory_bytes.value and not out["host_fits"][idx]
    if host_short and case.cluster.nodes == 1 and case.cluster.gpus_per_node < (server := server_gpus(prof)):
        # The run ran: GPUs whose offloaded state a node of their own number cannot hold sat in a server of the
        # usual size (the row's gpus_per_node counts the GPUs it used), whose idle GPUs' host shares they had.
        bigger = replace(case, cluster=case.cluster.model_copy(update={"gpus_per_node": server}))
        got = predict_case(bigger, profile, offload_fallback)
        if got["fits"]:
            got["assumed"].append(f"gpus_per_node={server} (the host memory of a {case.cluster.gpus_per_node}-GPU "
                                  f"node does not hold the offloaded state: the run's GPUs in a {server}-GPU server)")
            return got
    if not fits[idx] and case.plan.framework == "other-2022":
        got = _memory_efficient_reading(case, profile, offload_fallback)
        if got is not None:
            return got
    if not fits[idx] and case.recompute_known:
        # The run ran: a layout that holds its activations with no setting the row names saved them another way
        # (the row's recompute column says less than the run did): the fastest recompute that fits.
        # Only where a recompute setting alone makes it fit: a run whose optimizer state does not fit kept it in
        # host memory with the recompute it names (the next fallback), not some other recompute.
        got = predict_case(replace(case, recompute_known=False), profile, offload_fallback=False)
        if got["fits"]:
            got["assumed"] = [a for a in got["assumed"] if not a.endswith("(fastest that fits)")]
            if _describe_recompute(got["plan"]) != _describe_recompute(case.plan):
                got["assumed"].append(f"recompute={_describe_recompute(got['plan'])} (the published layout does not "
                                      f"fit with recompute={_describe_recompute(case.plan)} as the row says)")
            return got
    if not fits[idx] and case.open_degrees:
        # The run ran: a row naming no tensor or pipeline parallelism whose GPUs cannot hold it without them had
        # some: the fastest layout of the open degrees that fits (each with the fallbacks above and below).
        tried = [predict_case(with_degrees(case, q), profile, offload_fallback)
                 for q in degree_options(case.plan, case.model, case.cluster, case.open_degrees)]
        fitting = [g for g in tried if g["fits"]]
        if fitting:
            got = min(fitting, key=lambda g: g["predicted_step_time_s"])
            q = got["plan"]
            got["assumed"] = [a for a in got["assumed"] if not (a.startswith(("tp=", "pp="))
                                                                and a.endswith("(not published)"))]
            got["assumed"].append(f"{', '.join(f'{c}={getattr(q, c)}' for c in case.open_degrees)} (not published; "
                                  f"1 does not fit: the fastest that fits)")
            return got
    if not fits[idx] and offload_fallback and case.plan.optimizer_offload < 1.0 \
            and prof.host_memory_bandwidth_bytes_per_s is not None \
            and prof.host_link_bandwidth_bytes_per_s is not None:
        # The run ran: a layout whose weights fit and optimizer state does not kept the state in host memory
        # (megatron-core --optimizer-cpu-offload, DeepSpeed ZeRO-Offload), the step's Adam on the CPU.
        offloaded = case.plan.model_copy(update={"optimizer_offload": 1.0, "zero_stage": max(case.plan.zero_stage, 1),
                                                 "distributed_optimizer": True})
        got = predict_case(replace(case, plan=offloaded), profile)
        if got["fits"]:
            got["assumed"].append("optimizer_offload=1 (the published layout does not fit with its optimizer "
                                  "state on the GPU)")
            return got
    if not fits[idx] and case.stage_named:
        # The run ran: where nothing the row leaves open fits with the stage it names, it sharded more.
        got = predict_case(replace(case, stage_named=False), profile, offload_fallback)
        if got["fits"]:
            return got
    _note_choice(assumed, case, plans, idx, fits, out, peaks, prof, interleaved, host_short)
    peak = out["peak_memory_bytes"][idx]
    return {
        "predicted_step_time_s": float(out["step_time_s"][idx]),
        "predicted_peak_memory_bytes": float(np.nanmax(peak)),
        "fits": bool(fits[idx]),
        "assumed": assumed,
        "plan": plans[idx],
    }


# Frameworks whose runs choose tp and pp for speed: a row of theirs that gives none of tp, pp and dp takes the
# fastest layout that fits (degree_options), not 1 first as a stack without them is read. With all three blanked in
# the shared CSV: Megatron-LM 2021-2022 88.5 -> 12.6% MAPE, megatron-core 33.6 -> 25.2%; the 2020 stack (13.7 ->
# 14.1%) and Paxml (4.7%) gain nothing.
TUNED_DEGREES = ("megatron-core", "megatron-lm-2021")


def _fastest_of(alternatives, profile: HardwareProfile | None, offload_fallback: bool) -> tuple[dict, bool]:
    """The prediction of the fastest of several readings of one row (cases) that fits, else of the one needing the
    least memory, and whether it fits."""
    preds = [predict_case(alt, profile, offload_fallback) for alt in alternatives]
    fitting = [g for g in preds if g["fits"]]
    got = min(fitting, key=lambda g: g["predicted_step_time_s"]) if fitting else \
        min(preds, key=lambda g: g["predicted_peak_memory_bytes"])
    return got, bool(fitting)


def _memory_efficient_reading(case: Case, profile: HardwareProfile | None, offload_fallback: bool) -> dict | None:
    """An other-2022 layout that cannot hold its activations as the row reads it, read the way it could have run
    (the prediction, or None where none fits). With full recomputation and sequence parallelism left open, first
    with the stored layer inputs partitioned over the tensor-parallel ranks: DeepSpeed's partitioned activation
    checkpoints (``partition_activations``; ZeRO-R's P_a, Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 6.1),
    whose memory sequence parallelism prices; the attention stays unfused. Then a memory-efficient attention
    kernel (and sequence parallelism where the row leaves it open)."""
    sp_open = "sequence_parallel=False" in case.assumed and case.plan.tp > 1
    rest = [a for a in case.assumed if a != "sequence_parallel=False"]
    sp = case.plan.sequence_parallel or sp_open
    fused_note = (f"framework=other (the published layout fits only with memory-efficient attention"
                  f"{' and sequence parallelism' if sp != case.plan.sequence_parallel else ''})")
    if sp_open and case.recompute_known and case.plan.recompute == "full":
        partitioned = replace(case, plan=case.plan.model_copy(update={"sequence_parallel": True}), assumed=rest)
        got = predict_case(partitioned, profile, offload_fallback)
        if not got["fits"]:
            return None   # its own fallback read it with memory-efficient attention: the reading below, not fitting
        if got["plan"].framework == "other-2022":
            got["assumed"].append("sequence_parallel=True (the published layout fits only with its activation "
                                  "checkpoints partitioned over the tensor-parallel ranks, as DeepSpeed's "
                                  "partition_activations keeps them)")
        else:   # it fits as that fallback read it, the reading below: said as below
            got["assumed"][-1] = fused_note
        return got
    fused = replace(case, plan=case.plan.model_copy(update={"framework": "other", "sequence_parallel": sp}),
                    assumed=rest)
    got = predict_case(fused, profile, offload_fallback)
    if got["fits"]:
        got["assumed"].append(fused_note)
        return got
    return None


def _note_choice(assumed: list[str], case: Case, plans: list[ParallelPlan], idx: int, fits: np.ndarray, out: dict,
                 peaks: np.ndarray, prof: HardwareProfile, interleaved: bool, host_short: bool) -> None:
    """Add to ``assumed`` what :func:`predict_case` chose for what the row leaves open (``plans[idx]``) and why, and
    how a prediction that does not fit falls short."""
    if fits[idx] and not out["fits"][idx]:
        assumed.append(f"peak memory {peaks[idx] / 1e9:.1f} GB is above the planner's usable "
                       f"{prof.usable_memory_fraction:.0%} of {prof.memory_bytes.value / 1e9:.1f} GB, within all of it")
    chosen = "fastest that fits" if fits[idx] else "least memory: none fits"
    if not case.recompute_known:
        assumed.append(f"recompute={_describe_recompute(plans[idx])} ({chosen})")
    if not case.micro_batch_known:
        assumed.append(f"micro_batch={plans[idx].micro_batch} (not published; the {chosen}: "
                       f"{_why_micro_batch_open(case.plan)})")
    if interleaved:
        assumed[:] = [a for a in assumed if a != "vpp=1 (not published)"
                      and not (plans[idx].vpp > 1 and a.startswith("layers_per_stage="))]
        why = f": {case.stack_interleaves}" if case.stack_interleaves else ""
        assumed.append(f"vpp={plans[idx].vpp} (not published; the {chosen.replace('fastest', 'fastest interleaving')}"
                       f"{why})")
    if not case.ep_known:
        assumed[:] = [a for a in assumed if a != "ep=1 (not published)"]
        assumed.append(f"ep={plans[idx].ep} (not published; the {chosen})")
    if plans[idx].zero_stage != case.plan.zero_stage:
        assumed.append(f"zero_stage={plans[idx].zero_stage} (the published layout does not fit otherwise)")
    if case.a2a_overlap_open and plans[idx].moe_a2a_overlap:
        assumed.append(f"moe_a2a_overlap=True (from the notes, with the interleaving chosen: vpp={plans[idx].vpp})")
    elif case.a2a_overlap_open and plans[idx].vpp == 1:
        assumed.append("moe_a2a_overlap=False (the notes name the all-to-all overlap, which megatron-core runs only "
                       "with an interleaved pipeline, and the fastest layout that fits does not interleave)")
    elif case.a2a_overlap_open or plans[idx].moe_a2a_overlap != case.plan.moe_a2a_overlap:
        assumed.append("moe_a2a_overlap=False (what fits is full recompute, which megatron-core does not run with "
                       "the all-to-all overlap)")
    if plans[idx].dist_opt_instances != case.plan.dist_opt_instances:
        assumed.append(f"dist_opt_instances={plans[idx].dist_opt_instances} (shard groups of "
                       f"{plans[idx].shard_group} ranks: the state does not fit in smaller ones)")
    q = plans[idx]
    if q.global_batch % (q.dp * q.micro_batch):
        m = q.num_microbatches
        assumed.append(f"global_batch={q.global_batch} is not a multiple of dp x micro_batch = {q.dp * q.micro_batch}: "
                       f"priced as {m} micro-batch{'es' if m > 1 else ''} a rank ({m * q.dp * q.micro_batch} sequences), "
                       f"as megatron-core's calculator counts them")
    if host_short:
        assumed.append(f"{HOST_SHORT}{out['host_offload_bytes'][idx] / 1e9:.0f} GB offloaded per GPU, above the "
                       f"{out['host_capacity_bytes'][idx] / 1e9:.0f} GB its share of a "
                       f"{case.cluster.gpus_per_node}-GPU node's host memory holds (the GPU's memory holds the rest)")


def abs_percent_error(pred: float, pub: float) -> float:
    """|predicted - published| / published, in percent."""
    return abs(pred - pub) / pub * 100.0


def summarize(rows: list[dict]) -> dict:
    def stats(sel: list[dict]) -> dict:
        """``predicted``: rows with an error figure; ``unscored``: rows predicted without a published step time
        to score them against."""
        errs = [r["ape"] for r in sel if r.get("ape") is not None]
        misses = sum(1 for r in sel if r.get("error"))
        unscored = sum(1 for r in sel if r.get("ape") is None and not r.get("error")
                       and r.get("predicted_step_time_s") is not None)
        if not errs:
            return {"count": len(sel), "predicted": 0, "unscored": unscored, "misses": misses, "mape": None,
                    "median_ape": None, "p90_ape": None}
        e = np.array(errs)
        return {"count": len(sel), "predicted": len(errs), "unscored": unscored, "misses": misses,
                "mape": round(float(e.mean()), 2), "median_ape": round(float(np.median(e)), 2),
                "p90_ape": round(float(np.percentile(e, 90)), 2)}

    by_source = {s: stats([r for r in rows if r["source_id"] == s]) for s in sorted({r["source_id"] for r in rows})}
    by_gpu = {g: stats([r for r in rows if r["gpu_type"] == g]) for g in sorted({str(r["gpu_type"]) for r in rows})}
    return {"overall": stats(rows), "by_source": by_source, "by_gpu": by_gpu}


def validate(path: str | Path, profiles: dict[str, HardwareProfile] | None = None) -> dict:
    """Predict every scored row; returns {"rows": [...], "summary": {...}}."""
    cases, errors = load_cases(path, unpublished=True)
    if not cases:
        why = errors[0]["error"] if errors else f"{path}: no row has scored=true"
        raise InputError(f"nothing to score: {why}" + (f" (and {len(errors) - 1} more rows)" if len(errors) > 1 else ""))
    rows = []
    for c in cases:
        prof = (profiles or {}).get(c.cluster.gpu)
        # None for a row predicted but not scored (it publishes no step time).
        published = c.published_step_time_s if math.isfinite(c.published_step_time_s) else None
        try:
            pred = predict_case(c, prof)
        except Exception as exc:   # noqa: BLE001 - one row's fault must not lose the file's other rows
            rows.append({"row": c.row, "source_id": c.source_id, "gpu_type": c.gpu_type,
                         "predicted_step_time_s": None, "published_step_time_s": published,
                         "predicted_peak_memory_bytes": None, "fits": None, "error": _row_error(exc), "ape": None})
            continue
        ok = math.isfinite(pred["predicted_step_time_s"])
        plan = pred.pop("plan")
        pred.update(interval_fields(c, plan, pred["predicted_step_time_s"], prof))
        # A row read several ways (Case.alternatives) is the way predicted.
        feats = case_features(replace(c, plan=plan) if c.alternatives else c)
        rows.append({"row": c.row, "source_id": c.source_id, "gpu_type": c.gpu_type,
                     "model_name": c.model.name, "unexpressed": list(c.model.unexpressed), **feats, **pred,
                     "published_step_time_s": published,
                     "error": None if ok else "non-finite prediction",
                     "ape": abs_percent_error(pred["predicted_step_time_s"], published)
                     if ok and published is not None else None})
    for e in errors:
        rows.append({**e, "predicted_step_time_s": None, "predicted_peak_memory_bytes": None, "fits": None,
                     "ape": None})
    rows.sort(key=lambda r: r["row"])
    return {"rows": rows, "summary": summarize(rows)}


def interval_fields(case: Case, plan: ParallelPlan, step_time_s: float,
                    profile: HardwareProfile | None = None) -> dict:
    """P10 / P90 of a predicted row (costmodel/trust.py) and the validated runs near it; ``profile``: the one
    that predicted it, when not the shipped profile of the row's GPU (plan validate --profile)."""
    from costmodel.trust import INTERVALS_FILE, RUNS_FILE, step_intervals

    # Without the shipped files (while scripts/fit_intervals.py bootstraps them) there is no interval.
    if not math.isfinite(step_time_s) or not (INTERVALS_FILE.exists() and RUNS_FILE.exists()):
        return {"predicted_p10_step_time_s": None, "predicted_p90_step_time_s": None, "support_runs": None}
    iv = step_intervals(case.model, case.cluster, PlanArrays.from_plans([plan]), np.array([step_time_s]),
                        plan.framework, profile)
    return {"predicted_p10_step_time_s": float(iv["step_time_p10_s"][0]),
            "predicted_p90_step_time_s": float(iv["step_time_p90_s"][0]), "support_runs": int(iv["support_runs"][0])}


def interval_coverage(rows: list[dict]) -> dict:
    """How many published step times fall inside their row's P10-P90."""
    sel = [r for r in rows if r.get("predicted_p10_step_time_s") is not None and r.get("published_step_time_s")]
    inside = sum(1 for r in sel if r["predicted_p10_step_time_s"] <= r["published_step_time_s"]
                 <= r["predicted_p90_step_time_s"])
    below = sum(1 for r in sel if r["published_step_time_s"] < r["predicted_p10_step_time_s"])
    return {"rows": len(sel), "inside": inside, "below_p10": below, "above_p90": len(sel) - inside - below,
            "fraction": round(inside / len(sel), 4) if sel else None,
            "with_interval": sum(1 for r in rows if r.get("predicted_p10_step_time_s") is not None),
            "published": sum(1 for r in rows if r.get("published_step_time_s"))}


def run_descriptors(cases: list[Case]) -> list[dict]:
    """The cases as the support table holds them (costmodel.trust.describe_run)."""
    from costmodel.trust import describe_run

    return [describe_run(c.row, c.source_id, c.model, c.cluster, c.plan) for c in cases]


def nested_interval_coverage(path: str | Path, cv_rows: list[dict]) -> dict:
    """Coverage of held-out rows by intervals refitted without their fold (the shipped blending strength):
    how the intervals do on a source they have not seen."""
    from costmodel import trust

    cases, _ = load_cases(path)
    d = trust.cv_inputs(run_descriptors(cases), cv_rows)
    fit = trust.intervals_data()
    lo, hi = trust.held_out_bounds(d["residuals"], d["paths"], d["support"], d["folds"], fit["prior_rows"],
                                   fit.get("width_factor", 1.0), fit.get("thin_width_factor"))
    return trust.coverage(d["residuals"], lo, hi)


def measurements_for(cases: list[Case], profiles: dict[str, HardwareProfile] | None = None) -> list:
    """Cases as fit measurements, with unknown recompute resolved the way predict_case resolves it (with
    ``profiles[gpu]`` where given, else the shipped profile)."""
    from costmodel.fit import Measurement

    out = []
    for c in cases:
        plan = c.plan if c.recompute_known and c.vpp_known and c.micro_batch_known and c.ep_known \
            and not c.open_degrees and not c.alternatives else \
            predict_case(c, (profiles or {}).get(c.cluster.gpu))["plan"]
        out.append(Measurement(c.model, c.cluster, plan, c.published_step_time_s))
    return out


# Partial pooling of the calibration factors (fit_profiles). Every GPU type's factors are fitted in three
# levels: one set shared by all GPUs, a deviation per architecture generation shrunk toward it, a deviation per
# GPU type shrunk toward its generation. A level's prior weighs as POOL_PRIOR_ROWS measurements' worth, so a
# level backed by few rows stays near its parent and one backed by many follows its data; a GPU type without
# rows takes its generation's factors, a generation without rows the shared ones. Rows are weighted by
# source: each row by n_source^-SOURCE_BALANCE (0: every row alike; 1: every source alike), so the largest
# source does not set the shared level alone. The three numbers are chosen by grouped cross-validation
# (plan validate --cross-validate: leave-one-source-out, leave-one-release-out, leave-one-GPU-type-out);
# README "Accuracy" gives the table.
POOL_PRIOR_ROWS = {"generation": 8.0, "gpu": 8.0}
SOURCE_BALANCE = 0.5
# Least-squares evaluations per level, without the derivative-free polish of fit_calibration, so that a
# cross-validation fold takes about a minute (each evaluation predicts every row of the level). With the
# polish (120 more evaluations) a pooled fit took 3 minutes and reached 8.98% in-sample; its effect on the
# held-out error was not measured.
FIT_EVALS = 60


def _source_weights(cases: list[Case], balance: float) -> np.ndarray:
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.source_id] = counts.get(c.source_id, 0) + 1
    return np.array([counts[c.source_id] ** -balance for c in cases])


def fit_profiles(cases: list[Case], *, fitted_by: str, exclude=None, gpus: list[str] | None = None,
                 pool_prior_rows: dict[str, float] | None = None,
                 source_balance: float | None = None) -> tuple[dict, list]:
    """Fit every profile's calibration on the cases with partial pooling (shared -> generation -> GPU type).

    ``exclude(case) -> bool`` leaves cases out (cross-validation folds). ``gpus``: the profiles to return
    (default: every GPU type among the cases); one without training cases takes its generation's factors.
    Returns ({profile: HardwareProfile}, reports).
    """
    from costmodel.fit import fit_factors, relevant_factors
    from costmodel.profiles import Calibration

    prior_rows = {**POOL_PRIOR_ROWS, **(pool_prior_rows or {})}
    balance = SOURCE_BALANCE if source_balance is None else source_balance
    train = [c for c in cases if not (exclude and exclude(c))]
    names_out = gpus or sorted({c.cluster.gpu for c in cases})
    base = {g: load_profile(g).model_copy(update={"calibration": Calibration()})
            for g in sorted(set(names_out) | {c.cluster.gpu for c in train})}
    ms = measurements_for(train)
    w = _source_weights(train, balance)
    gen_of = {g: (p.generation or g) for g, p in base.items()}
    reports: list[dict] = []

    def level(idx: list[int], center: dict[str, float], prior: float | None, label: str) -> dict[str, float]:
        sub = [ms[i] for i in idx]
        names = relevant_factors(sub)[:max(1, len(sub) - 1)]
        vals = fit_factors(sub, {m.cluster.gpu: base[m.cluster.gpu] for m in sub}, names, center=center,
                           prior_weight=prior, weights=w[idx], fitted_by=fitted_by, max_nfev=FIT_EVALS,
                           polish_evals=0)
        out = {**center, **vals}
        reports.append({"level": label, "measurements": len(sub), "factors": names,
                        "values": {k: round(v, 4) for k, v in vals.items()}})
        return out

    shared = level(list(range(len(ms))), {}, None, "shared") if ms else {}
    by_gen: dict[str, list[int]] = {}
    by_gpu: dict[str, list[int]] = {}
    for i, m in enumerate(ms):
        by_gen.setdefault(gen_of[m.cluster.gpu], []).append(i)
        by_gpu.setdefault(m.cluster.gpu, []).append(i)
    gen_vals = {g: level(idx, shared, prior_rows["generation"], f"generation {g}") for g, idx in by_gen.items()}
    # A generation backed by one GPU type is that GPU type's level already (same rows, nearly the same fit).
    types_in = {g: {ms[i].cluster.gpu for i in idx} for g, idx in by_gen.items()}
    rows_of, pooled = factor_rows(ms)
    fitted = {}
    for g in names_out:
        parent = gen_vals.get(gen_of[g], shared)
        own = g in by_gpu and len(types_in[gen_of[g]]) > 1
        vals = level(by_gpu[g], parent, prior_rows["gpu"], g) if own else parent
        cal = Calibration(**{**Calibration().model_dump(), **vals, "fitted_by": fitted_by,
                             "fitted_rows": rows_of.get(g, {}), "fitted_rows_pooled": pooled})
        fitted[g] = base[g].model_copy(update={"calibration": cal})
    return fitted, reports


def release_of(source_id: str, notes: str) -> str:
    """The software release a row ran (container, framework version), read from its notes; '' if unsaid."""
    for pat in (r"container (\d\d\.\d\d(?:\.\d+)?)", r"NeMo (\d\d\.\d\d)", r"\b(r\d+\.\d+\.\d+)\b",
                r"v(\d\d\.\d\d(?:\.\d+)?)"):
        m = re.search(pat, notes or "")
        if m:
            return m.group(1)
    return ""


# Cross-validation schemes: which cases a fold holds out. "source": one source at a time; "release": one
# software release at a time inside the sources that span several (Megatron-Bridge's archive: 25.09-26.06);
# "gpu": one GPU type at a time (its factors then come from its generation or the shared level).
def case_features(c: Case) -> dict:
    """What a row is, for error tables, interval classes and support: GPU, scale, sharding and regime."""
    return {"num_gpus": c.plan.tp * c.plan.pp * c.plan.dp * c.plan.cp, "moe": c.model.is_moe,
            "zero_stage": c.plan.zero_stage, "pp": c.plan.pp, "cp": c.plan.cp, "ep": c.plan.ep,
            "precision": c.model.precision, "release": c.release}
