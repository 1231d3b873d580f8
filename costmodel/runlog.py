"""Megatron-LM / Megatron-Bridge / NeMo training logs as a measured run (text in, Measurement out).

What a log holds and where this reads it from:

- the argument dump Megatron-LM prints at start-up (megatron/training/arguments.py, ``_print_args``)::

      ------------------------ arguments ------------------------
        tensor_model_parallel_size ...................... 8
      -------------------- end of arguments ---------------------

  (one ``name .... value`` line per argument, dots padding the name to 48 characters). Without that block
  (Megatron-Bridge and NeMo 2 print their configuration as YAML) the same names are read from ``name: value``
  lines, first occurrence;
- the tokenizer's ``> padded vocab (size: V) with N dummy tokens (new size: P)`` line (the padded vocabulary,
  which the dump does not hold);
- the per-iteration lines of ``training_log`` (megatron/training/training.py), or NeMo's progress-bar
  ``train_step_timing in s=`` with its ``global_step``::

      [2024-06-12 10:15:42] iteration       10/     100 | consumed samples: 5120 | elapsed time per
      iteration (ms): 12345.6 | throughput per GPU (TFLOP/s/GPU): 456.7 | ... | global batch size:   512 | ...

  each the mean over the ``log_interval`` iterations since the previous line. A line whose window starts
  inside the first ``warmup_iterations`` iterations is skipped (compilation, allocator and NCCL set-up make them
  slow), and so is any line logged before a batch-size ramp-up ended; the step time is the median of the rest.

The GPU type is not in a Megatron log unless something printed the device name ("NVIDIA H100 80GB HBM3");
otherwise the caller names it (``plan calibrate --gpu`` or ``--cluster``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from costmodel.fit import Measurement
from costmodel.profiles import InputError, load_profile
from costmodel.plan import ParallelPlan, data_parallel
from costmodel.specs import ClusterSpec, ModelSpec, moe_layout

_BEGIN = re.compile(r"-{3,}\s*arguments\s*-{3,}")
_END = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
_ARG = re.compile(r"^(?:\s*\S+:)?\s+([A-Za-z_][A-Za-z0-9_]*) (?:\.+ |\s)(.*?)\s*$")
_YAML = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s+([^#{}\[\]]*?)\s*$")
_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_NUMBER = r"((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"   # 12, 12.5, .5, 1e3: not a lone "."
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUMBER)
_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUMBER)
_GBS = re.compile(r"global batch size:\s*(\d+)")
# NeMo (PyTorch Lightning progress bar): "Epoch 0: ... 5/100 [01:02<19:40, ..., global_step=4.000, ...,
# train_step_timing in s=12.1]" (seconds, the last step)
_NEMO_STEP = re.compile(r"global_step=" + _NUMBER + r".*?train_step_timing in s=" + _NUMBER)
_PADDED = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
_DEVICE = re.compile(r"NVIDIA ((?:GB|[A-Z])\d{2,3}[A-Za-z]*(?:[- ]?\d+GB)?)")
# Names the YAML fallback looks for (Megatron-Bridge / NeMo 2 configuration dumps use Megatron's names).
_KNOWN = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
          "group_query_attention", "kv_channels", "seq_length", "vocab_size", "padded_vocab_size", "num_experts",
          "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
          "moe_layer_freq", "swiglu", "gated_linear_unit", "untie_embeddings_and_output_weights",
          "share_embeddings_and_output_weights", "position_embedding_type", "multi_latent_attention", "q_lora_rank",
          "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "fp8", "fp8_recipe",
          "fp4", "fp4_recipe", "bf16", "fp16", "tensor_model_parallel_size", "pipeline_model_parallel_size",
          "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "context_parallel_size",
          "expert_model_parallel_size", "expert_tensor_parallel_size", "data_parallel_size", "world_size",
          "micro_batch_size", "global_batch_size", "sequence_parallel", "recompute_granularity", "recompute_method",
          "recompute_num_layers", "use_distributed_optimizer", "use_megatron_fsdp", "use_custom_fsdp",
          "use_torch_fsdp2", "data_parallel_sharding_strategy", "log_interval", "rampup_batch_size", "optimizer",
          "use_layer_wise_distributed_optimizer")


MAX_ITERATION_MS = 1e12
"""Longest iteration time read (about 32 years): a larger figure is no measurement, and a median of two such
floats near the float limit overflows to inf."""


@dataclass
class LogRun:
    """One training log read: the measurement and what it was read from."""

    measurement: Measurement
    iterations: list[int]
    """Logged iterations whose times make up the median."""
    skipped: list[int]
    """Logged iterations left out (warm-up, batch-size ramp-up)."""
    tflops_per_gpu: float | None
    """Median of the logged ``throughput per GPU (TFLOP/s/GPU)`` over the same lines (Megatron's FLOP count)."""
    args: dict[str, str] = field(default_factory=dict)
    """The arguments as printed."""


def parse_arguments(text: str) -> dict[str, str]:
    """The argument dump as {name: printed value}; without one, ``name: value`` lines of known names."""
    lines = text.splitlines()
    out: dict[str, str] = {}
    inside = False
    for ln in lines:
        if _END.search(ln):
            if inside:
                break
            continue
        if _BEGIN.search(ln):
            inside = True
            continue
        if inside:
            m = _ARG.match(ln)
            if m:
                out.setdefault(m.group(1), m.group(2))
    if out:
        return out
    for ln in lines:
        m = _YAML.match(ln)
        if m and m.group(1) in _KNOWN:
            out.setdefault(m.group(1), m.group(2).strip().strip("'\""))
    return out


def parse_iterations(text: str) -> list[tuple[int, float, float | None, int | None]]:
    """(iteration, elapsed ms per iteration, TFLOP/s/GPU or None, global batch or None) per logged line."""
    out = []
    for ln in text.splitlines():
        m = _ITER.search(ln)
        if not m:
            n = _NEMO_STEP.search(ln)
            if n and math.isfinite(float(n.group(1))):   # global_step counts finished steps before this one
                out.append((int(float(n.group(1))) + 1, float(n.group(2)) * 1e3, None, None))
            continue
        rest = m.group(3)
        e = _ELAPSED.search(rest)
        if not e:
            continue
        t = _TFLOPS.search(rest)
        g = _GBS.search(rest)
        out.append((int(m.group(1)), float(e.group(1)), float(t.group(1)) if t else None,
                    int(g.group(1)) if g else None))
    return out


def _value(raw: str | None):
    """A printed Python value: None, bools, ints, floats, else the string."""
    if raw is None:
        return None
    s = raw.strip()
    if s in ("None", "null", "~", ""):
        return None
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


class _Args:
    """Typed access to the printed arguments, with one-line errors naming the log and the field."""

    def __init__(self, raw: dict[str, str], source: str):
        self.raw, self.source = raw, source

    def get(self, *names: str, default=None):
        for n in names:
            v = _value(self.raw.get(n))
            if v is not None:
                return v
        return default

    def int(self, *names: str, default: int | None = None, required: bool = False, low: int = 1) -> int | None:
        """The first of ``names`` the log prints, as an integer >= ``low`` (1: a size or a count that divides;
        0 where none is a setting, such as no experts)."""
        v = self.get(*names)
        if v is None:
            if required:
                raise InputError(f"{self.source}: field '{names[0]}' is not in the log's argument dump (Megatron "
                                 f"prints it between '---- arguments ----' and '---- end of arguments ----')")
            return default
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v
                or v < low):
            name = next(n for n in names if _value(self.raw.get(n)) is not None)
            raise InputError(f"{self.source}: field '{name}' = {self.raw.get(name)!r}: expected an integer >= {low}")
        return int(v)

    def flag(self, *names: str) -> bool:
        return bool(self.get(*names))


def _offload_fraction(a: _Args) -> float:
    """The share of the optimizer state a run kept in host memory: megatron-core --optimizer-cpu-offload with
    --optimizer-offload-fraction (megatron/training/arguments.py default 1.0); 0 without the flag."""
    if not a.flag("optimizer_cpu_offload"):
        return 0.0
    v = a.get("optimizer_offload_fraction", default=1.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise InputError(f"{a.source}: field 'optimizer_offload_fraction' = {a.raw.get('optimizer_offload_fraction')!r}: "
                         f"expected a number from 0 to 1")
    return float(v)


def _moe_layer_fields(a: _Args, layers: int) -> dict[str, int]:
    """``dense_layers`` and ``moe_layer_step`` from Megatron's --moe-layer-freq as the dump prints it: an integer k
    (MoE on layers 0, k, 2k, ...), a list [0, 0, 1, ...] or a pattern string ([0]*3+[1]*58, [0,1]*24)."""
    freq = a.get("moe_layer_freq")
    if freq is None:
        return {}
    raw = a.raw.get("moe_layer_freq")
    if isinstance(freq, (int, float)) and not isinstance(freq, bool) and freq >= 1 and int(freq) == freq:
        mask = [int(i % int(freq) == 0) for i in range(layers)]
    else:
        mask = _freq_list(str(raw))
    if mask is None or len(mask) != layers or any(x not in (0, 1) for x in mask):
        raise InputError(f"{a.source}: field 'moe_layer_freq' = {raw!r}: expected an integer or a list of 0 / 1, one a "
                         f"layer ({layers} layers)")
    fields = moe_layout(mask)
    if fields is None:
        raise InputError(f"{a.source}: field 'moe_layer_freq' = {raw!r}: the cost model places MoE layers after "
                         f"leading dense ones, on every layer or every k-th counted from 1 (Llama 4 Maverick's "
                         f"[0,1]*24); valid: such a pattern")
    return fields


def _freq_list(text: str) -> list[int] | None:
    """A printed list or Python list expression of 0 / 1 (+ and * of lists and integers), evaluated without eval."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) <= 100_000:
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
                count = right if isinstance(left, list) else left
                if 0 <= count <= 100_000:
                    return left * count if isinstance(left, list) else right * count
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
        raise ValueError

    try:
        out = value(tree)
    except (ValueError, RecursionError):
        return None
    return out if isinstance(out, list) and all(type(x) is int for x in out) else None


def _precision(a: _Args) -> str:
    fp4, fp8 = a.get("fp4"), a.get("fp8")
    if fp4:
        return "nvfp4"
    if fp8:
        return "mxfp8" if str(a.get("fp8_recipe", default="")).lower() == "mxfp8" else "fp8"
    if a.flag("bf16"):
        return "bf16"
    if a.flag("fp16"):
        return "fp16"
    return "fp32"


def _hybrid_fields(a: _Args, pattern: str, hidden: int) -> dict:
    """pretrain_mamba.py's hybrid model (Nemotron-H, Nemotron 3): its layer pattern (the part before a '/', which
    megatron-core's unified pattern puts before the multi-token-prediction modules' patterns), the Mamba-2 widths
    (megatron-core's defaults where the dump has none: head 64, state 128, 8 groups, heads = 2 x hidden / head) and
    a LatentMoE's width. The MLP activation is squared ReLU unless the run asked for a gated one."""
    main, *mtp = pattern.strip().split("/")
    head_dim = a.int("mamba_head_dim", default=64)
    fields: dict = dict(hybrid_pattern=main, mamba_head_dim=head_dim,
                        mamba_heads=a.int("mamba_num_heads") or 2 * hidden // head_dim,
                        mamba_state_dim=a.int("mamba_state_dim", default=128),
                        mamba_groups=a.int("mamba_num_groups", default=8), moe_latent=a.int("moe_latent_size"))
    if mtp:
        fields["mtp_layers"] = len(mtp)
    if a.flag("squared_relu"):
        fields["activation"] = "squared_relu"
        # what the dump says of the rest, with Megatron's defaults (LayerNorm, biases, dropout 0.1)
        fields.update(normalization=str(a.get("normalization", default="LayerNorm")),
                      linear_bias=a.flag("add_bias_linear") if a.get("add_bias_linear") is not None else True,
                      hidden_dropout=float(a.get("hidden_dropout", default=0.1)),
                      attention_dropout=float(a.get("attention_dropout", default=0.1)))
    return fields


def log_model(a: _Args, name: str, vocab_padded: int | None) -> ModelSpec:
    hybrid = a.get("hybrid_override_pattern")
    layers = a.int("num_layers", required=True)
    hidden = a.int("hidden_size", required=True)
    heads = a.int("num_attention_heads", required=True)
    ffn = a.int("ffn_hidden_size", default=4 * hidden)
    gqa = a.get("group_query_attention")
    groups = a.int("num_query_groups")
    kv = groups if (groups and (gqa or gqa is None) and groups != heads) else None
    vocab = vocab_padded or a.int("padded_vocab_size", "vocab_size", required=True)
    experts = a.int("num_experts", "num_moe_experts", default=0, low=0)
    spec: dict = dict(name=name, layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, kv_heads=kv,
                      vocab=vocab, seq_len=a.int("seq_length", required=True),
                      gated_mlp=a.flag("swiglu", "gated_linear_unit"),
                      tied_embeddings=not a.flag("untie_embeddings_and_output_weights")
                      if a.get("untie_embeddings_and_output_weights") is not None
                      else a.flag("share_embeddings_and_output_weights"),
                      learned_position_embeddings=str(a.get("position_embedding_type", default="learned_absolute"))
                      == "learned_absolute", precision=_precision(a),
                      mtp_layers=a.int("mtp_num_layers", default=0, low=0),
                      # Megatron-LM prints optimizer 'muon' for --optimizer muon and dist_muon alike (validate_args).
                      optimizer="muon" if "muon" in str(a.get("optimizer", default="adam")).lower() else "adam")
    kv_ch = a.int("kv_channels")
    if kv_ch and kv_ch != hidden // heads:
        spec["head_dim"] = kv_ch
    if hybrid:
        spec.update(_hybrid_fields(a, str(hybrid), hidden))
        if len(spec["hybrid_pattern"]) != layers:
            raise InputError(f"{a.source}: field 'hybrid_override_pattern' = {hybrid!r}: "
                             f"{len(spec['hybrid_pattern'])} layers before any '/', num_layers {layers}; valid: one "
                             f"character (M, *, -, E) per layer")
    if experts:
        moe_ffn = a.int("moe_ffn_hidden_size", default=ffn)
        shared = a.int("moe_shared_expert_intermediate_size", default=0, low=0)
        if shared % moe_ffn:
            raise InputError(f"{a.source}: field 'moe_shared_expert_intermediate_size' = {shared}: not a multiple of "
                             f"moe_ffn_hidden_size {moe_ffn}; the cost model holds shared experts as whole experts "
                             f"of that width")
        spec.update(num_experts=experts, moe_topk=a.int("moe_router_topk", default=2), moe_ffn_hidden=moe_ffn,
                    shared_experts=shared // moe_ffn if shared else 0, **_moe_layer_fields(a, layers))
    if a.flag("multi_latent_attention"):
        spec.update(mla_kv_lora_rank=a.int("kv_lora_rank", default=512), mla_q_lora_rank=a.int("q_lora_rank", low=0),
                    mla_rope_dim=a.int("qk_pos_emb_head_dim", default=64), head_dim=a.int("qk_head_dim", default=128),
                    mla_v_head_dim=a.int("v_head_dim", default=128), kv_heads=None)
    try:
        return ModelSpec.model_validate(spec)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(f"{a.source}: model field '{'.'.join(map(str, e['loc']))}': {e['msg']}") from None


def log_plan(a: _Args, model: ModelSpec, global_batch: int | None) -> tuple[ParallelPlan, int]:
    """The layout and the world size."""
    from costmodel.validate import framework_split

    tp = a.int("tensor_model_parallel_size", default=1)
    pp = a.int("pipeline_model_parallel_size", default=1)
    cp = a.int("context_parallel_size", default=1)
    vpp = a.int("virtual_pipeline_model_parallel_size")
    per_virtual = a.int("num_layers_per_virtual_pipeline_stage")
    if vpp is None:
        vpp = model.layers // (pp * per_virtual) if per_virtual and pp > 1 else 1
    world = a.int("world_size")
    dp = a.int("data_parallel_size")
    if dp is None:
        if world is None:
            raise InputError(f"{a.source}: field 'world_size' is not in the log's argument dump (nor "
                             f"data_parallel_size); the GPU count is needed")
        dp = data_parallel(world, tp, pp, cp)
    world = world or tp * pp * cp * dp
    gran = a.get("recompute_granularity")
    recompute, layers = "none", None
    if gran in ("selective", "full"):
        recompute = gran
        if gran == "full" and a.get("recompute_method") == "block":
            layers = a.int("recompute_num_layers", default=1) * vpp
    elif a.flag("cpu_offloading") and a.int("cpu_offloading_num_layers", default=0, low=0):
        # megatron-core --cpu-offloading (activations to host memory; Megatron-Bridge's FSDP recipes).
        recompute, layers = "offload", a.int("cpu_offloading_num_layers")
    strategy = str(a.get("data_parallel_sharding_strategy", default="optim_grads_params"))
    fsdp = a.flag("use_megatron_fsdp", "use_custom_fsdp", "use_torch_fsdp2")
    zero = {"no_shard": 0, "optim": 1, "optim_grads": 2}.get(strategy, 3) if fsdp else (
        1 if a.flag("use_distributed_optimizer") or a.flag("use_layer_wise_distributed_optimizer") else 0)
    gbs = global_batch or a.int("global_batch_size", required=True)
    # Megatron prints the expert tensor parallelism it resolved (None -> the tensor-parallel size); a log without
    # it predates the option, when the experts were split over the tensor-parallel group: the same.
    try:
        plan = ParallelPlan(tp=tp, pp=pp, vpp=max(vpp, 1), dp=dp, cp=cp, ep=a.int("expert_model_parallel_size", default=1),
                            etp=(a.int("expert_tensor_parallel_size", default=tp, low=0) or tp) if model.is_moe else 1,
                            sequence_parallel=a.flag("sequence_parallel"),
                            micro_batch=a.int("micro_batch_size", required=True), global_batch=gbs,
                            recompute=recompute, recompute_layers=layers, distributed_optimizer=zero >= 1,
                            zero_stage=zero, layers_per_stage=framework_split(model.layers, pp, max(vpp, 1)),
                            dist_opt_instances=(a.int("num_distributed_optimizer_instances", default=1) or 1)
                            if zero >= 1 else 1, moe_a2a_overlap=a.flag("overlap_moe_expert_parallel_comm"),
                            optimizer_offload=_offload_fraction(a) if zero >= 1 else 0.0)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(f"{a.source}: layout field '{'.'.join(map(str, e['loc']))}': {e['msg']}") from None
    return plan, world


def gpu_in_log(text: str) -> str | None:
    """A shipped GPU type named by a device string in the log ("NVIDIA H100 80GB HBM3"), if any."""
    for m in _DEVICE.finditer(text):
        for cand in (m.group(1), m.group(1).split()[0], re.match(r"(?:GB|[A-Z])\d+", m.group(1)).group(0)):
            try:
                return load_profile(cand).name
            except InputError:
                continue
    return None


def parse_megatron_log(text: str, source: str, *, gpu: str | None = None, cluster: ClusterSpec | None = None,
                       warmup_iterations: int = 3, name: str | None = None) -> LogRun:
    """A Megatron-LM / Megatron-Bridge / NeMo log as one measured run.

    The cluster is ``cluster`` resized to the run's world size when given, else built from the GPU profile
    (``gpu``, else the device the log names) the way ``plan validate`` builds a published run's cluster.
    """
    from costmodel.validate import row_cluster

    a = _Args(parse_arguments(text), source)
    if not a.raw:
        raise InputError(f"{source}: no Megatron argument dump ('---- arguments ----' block) and no configuration "
                         f"fields in the log; is it a Megatron-LM / Megatron-Bridge / NeMo training log?")
    lines = parse_iterations(text)
    if not lines:
        raise InputError(f"{source}: field 'elapsed time per iteration (ms)': no iteration lines in the log "
                         f"(Megatron prints them every --log-interval iterations)")
    interval = a.int("log_interval", default=None)
    final_gbs = lines[-1][3]
    kept, skipped = [], []
    prev = None
    for it, ms, tf, gbs in lines:
        start = (prev if prev is not None else it - (interval or it))   # the line averages (start, it]
        prev = it
        if start < warmup_iterations or (final_gbs is not None and gbs is not None and gbs != final_gbs):
            skipped.append((it, ms, tf))
            continue
        if not 0 < ms < MAX_ITERATION_MS:
            raise InputError(f"{source}: iteration {it}: field 'elapsed time per iteration (ms)' = {ms}: expected "
                             f"a positive time under {MAX_ITERATION_MS:.0e} ms")
        kept.append((it, ms, tf))
    if not kept:
        raise InputError(f"{source}: all {len(lines)} logged iteration(s) fall in the first {warmup_iterations} "
                         f"(warm-up); log more iterations or lower --warmup-iterations")
    model = log_model(a, name or _run_name(a, source), _padded_vocab(text))
    if _LORA_CONFIG.search(text):
        model = model.model_copy(update={"finetune": "lora"})
    plan, world = log_plan(a, model, final_gbs)
    gpu = None if cluster is not None else gpu or gpu_in_log(text)
    if cluster is None and gpu is None:
        raise InputError(f"{source}: field 'gpu': the log does not name the GPU type; pass --gpu NAME (e.g. "
                         f"H100) or --cluster C.yaml")
    try:
        if cluster is not None:
            nodes = max(1, -(-world // cluster.gpus_per_node))
            cl = type(cluster).model_validate({**cluster.model_dump(), "nodes": nodes,
                                               "name": f"{cluster.name}@{world}"})
        else:
            prof = load_profile(gpu)
            cl = row_cluster({"num_gpus": str(world), "gpus_per_node": "", "gpu_type": prof.name}, prof)
    except ValidationError as err:
        where = cluster.name if cluster is not None else gpu
        raise InputError(f"{source}: the run's {world:,} GPUs (tp x pp x cp x dp of the argument dump) make no "
                         f"cluster of {where}: {err.errors()[0]['msg']}") from None
    step_s = float(np.median([ms for _, ms, _ in kept])) / 1e3
    tfs = [tf for _, _, tf in kept if tf is not None]
    return LogRun(measurement=Measurement(model=model, cluster=cl, plan=plan, step_time_s=step_s),
                  iterations=[it for it, _, _ in kept], skipped=[it for it, _, _ in skipped],
                  tflops_per_gpu=float(np.median(tfs)) if tfs else None, args=a.raw)


# A PEFT run's configuration dump: Megatron-Bridge's `peft:` block (`_target_: megatron.bridge.peft.lora.LoRA`,
# or DoRA / CanonicalLoRA, all adapters on frozen weights) or NeMo's `peft_scheme: lora`.
_LORA_CONFIG = re.compile(r"_target_:\s*[\w.]*\.peft\.[\w.]*(?:LoRA|DoRA)\b|^\s*peft_scheme:\s*['\"]?(?:q?lora|dora)",
                          re.I | re.M)


def _padded_vocab(text: str) -> int | None:
    m = _PADDED.search(text)
    return int(m.group(3)) if m else None


def _run_name(a: _Args, source: str) -> str:
    return f"{source.rsplit('/', 1)[-1]} ({a.int('num_layers')}L h{a.int('hidden_size')})"
