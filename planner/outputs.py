"""Turn a chosen plan into what a cluster runs: Megatron-LM flags, a torchrun launcher, a Slurm job.

    megatron_args(model, plan)            the ``pretrain_gpt.py`` flags, one flag (+ value) per item
    parse_megatron_args(args, num_gpus=)  those flags back into ParallelPlan fields
    launch_script(...) / sbatch_script(...)  bash for torchrun on every node / for ``sbatch``
    write_outputs(out_dir, ...)           plan.json, megatron_args.txt, launch.sh, launch.sbatch, atomically

Every flag below was checked against the argparse definitions in NVIDIA/Megatron-LM
``megatron/training/arguments.py`` (commit 000c4ac24f61, late-2025 main; the
choices were cross-checked against the ``megatron-core==0.16.1`` wheel's ``TransformerConfig``,
``enums.Fp8Recipe`` / ``Fp4Recipe`` and ``PipelineParallelLayerLayout``). The comment above each
group names the argparse group function and a recognisable line. Anything the plan implies that has
no verified flag goes into a trailing ``# ...`` comment item instead of a guessed flag; comment items
are skipped by :func:`parse_megatron_args` and become bash comments in the scripts.

Data, tokenizer, optimizer, learning-rate and checkpoint flags are not part of a plan: the scripts
pass their own arguments (``"$@"``) through to ``pretrain_gpt.py``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel.files import Writer, write_files_atomic
from costmodel.profiles import InputError, transformer_engine_runs
from costmodel.rules import MANUAL_GC_INTERVAL_STEPS, grouped_gemm_issue, moe_recompute_modules
from costmodel.specs import ClusterSpec, ModelSpec, StepEstimate
from costmodel.plan import ParallelPlan, data_parallel, megatron_layout, parse_megatron_layout, unroll_layout

__all__ = [
    "OUTPUT_FILES",
    "architecture_flags",
    "check_layout",
    "launch_script",
    "layout_from_layers_per_stage",
    "megatron_args",
    "parse_layout",
    "parse_megatron_args",
    "sbatch_script",
    "transformer_engine_runs",
    "write_files_atomic",
    "write_outputs",
]

OUTPUT_FILES = ("plan.json", "megatron_args.txt", "launch.sh", "launch.sbatch")

# Default rank order of megatron-core; the one alternative with a flag (--use-tp-pp-dp-mapping).
_DEFAULT_ORDER = "tp-cp-ep-dp-pp"
_TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"

_FP8_RECIPES = ("delayed", "tensorwise", "blockwise")


# Pipeline layout strings ----------------------------------------------------------------------
# megatron/core/transformer/pipeline_parallel_layer_layout.py (megatron-core 0.16.1)
#   PipelineParallelLayerLayout.parse_str_to_list: "Ettt|(tt|)*29,m|L"; E embedding, L loss,
#   t decoder layer, m MTP layer; stages split by "|", "(..)*n" and "x*n" unrolled, commas cosmetic.
#   __init__: "layout[vpp_rank * pipeline_model_parallel_size + pp_rank]" -- stage k of the flat list
#   is virtual chunk k // pp of pipeline rank k % pp.
# costmodel/plan.py parses layouts (parse_megatron_layout) and writes them (megatron_layout); this section adds the
# one-line errors a user-given layout gets and the MTP placement the cost model supports.
def _unroll_layout(layout: str) -> list[str]:
    """The virtual stages of a layout, unrolled (to name in errors what is wrong with it)."""
    try:
        return unroll_layout(layout.replace(",", "").replace(" ", "")).split("|")
    except ValueError as exc:
        raise InputError(f"pipeline layout {layout!r}: {exc}") from None


def parse_layout(layout: str, pp: int) -> tuple[int, tuple[int, ...]]:
    """(vpp, decoder layers per pipeline rank) of a ``--pipeline-model-parallel-layout`` string.

    Raises InputError (one line) when the string is not a layout Megatron would accept for ``pp``.
    """
    stages = _unroll_layout(layout)
    bad = sorted({ch for st in stages for ch in st if ch not in "ELtm"})
    if bad:
        raise InputError(f"pipeline layout {layout!r}: unknown layer characters {bad}; valid: E, L, t, m")
    if len(stages) % pp:
        raise InputError(f"pipeline layout {layout!r} has {len(stages)} stages, not a multiple of pp={pp}")
    flat = "".join(stages)
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise InputError(f"pipeline layout {layout!r} must start with one 'E' (embedding) and end with one "
                         f"'L' (loss)")
    vpp = len(stages) // pp
    return vpp, parse_megatron_layout(layout.replace(" ", ""), pp, vpp)


def layout_from_layers_per_stage(layers_per_stage: tuple[int, ...] | list[int], vpp: int = 1, mtp: int = 0) -> str:
    """A layout string placing ``layers_per_stage[r]`` decoder layers on pipeline rank r (embedding first, MTP
    modules and loss last, a rank's later chunks taking the remainder); written by costmodel/plan.py beside
    the split."""
    return megatron_layout(tuple(int(x) for x in layers_per_stage), vpp, mtp=mtp)


# Flags ----------------------------------------------------------------------------------------
def _check_layout(model: ModelSpec, plan: ParallelPlan, layout: str) -> None:
    check_layout(model, plan.pp, plan.vpp, layout, plan.layers_per_stage)


def check_layout(model: ModelSpec, pp: int, vpp_want: int, layout: str,
                 layers_per_stage: tuple[int, ...] | None = None) -> None:
    """Raise InputError (one line) unless ``layout`` places ``model``'s layers (and MTP layers) on ``pp`` ranks
    with ``vpp_want`` virtual stages each (and, if given, ``layers_per_stage`` layers per rank)."""
    vpp, per_rank = parse_layout(layout, pp)
    n_mtp = "".join(_unroll_layout(layout)).count("m")
    if n_mtp != model.mtp_layers:
        raise InputError(f"pipeline layout {layout!r} places {n_mtp} MTP layers ('m') but {model.name} has "
                         f"mtp_layers={model.mtp_layers}")
    if n_mtp and "m" in "".join(_unroll_layout(layout)[:-1]):
        raise InputError(f"pipeline layout {layout!r}: the cost model places MTP layers ('m') on the last "
                         f"stage only")
    if sum(per_rank) != model.layers:
        raise InputError(f"pipeline layout {layout!r} places {sum(per_rank)} decoder layers ('t') but "
                         f"{model.name} has layers={model.layers}")
    if vpp != vpp_want:
        raise InputError(f"pipeline layout {layout!r} has {len(_unroll_layout(layout))} stages = pp={pp} x "
                         f"vpp={vpp}, but the plan has vpp={vpp_want}")
    if layers_per_stage is not None and tuple(layers_per_stage) != per_rank:
        raise InputError(f"pipeline layout {layout!r} puts {list(per_rank)} layers on the pipeline ranks but the "
                         f"plan has layers_per_stage={list(layers_per_stage)}")


def _num(x: float) -> str:
    """A float as Megatron's argparse reads it back exactly (500000.0 -> 500000, 1e-06 -> 1e-06)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


@dataclass
class _Flags:
    """Megatron-LM flags as they are built: the flags, the facts of the model no flag states, comment items."""

    out: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def moe_layer_freq_arg(model: ModelSpec) -> str:
    """Megatron's ``--moe-layer-freq`` for a model with dense layers among its MoE ones, as the Python list
    expression its parser evaluates (arguments.py moe_freq_type): ``([0]*3+[1]*58)`` for leading dense layers,
    ``([0,1]*24)`` for Llama 4 Maverick's every other layer."""
    mask = model.moe_layer_freq()
    first, step, k = mask.index(1), model.moe_layer_step, model.moe_layers
    unit = "[1]" if step == 1 else "[" + ",".join(["0"] * (step - 1) + ["1"]) + "]"
    lead, tail = first - (step - 1), model.layers - (first + 1) - (k - 1) * step
    parts = ([f"[0]*{lead}"] if lead else []) + [f"{unit}*{k}"] + ([f"[0]*{tail}"] if tail else [])
    return "(" + "+".join(parts) + ")"


def architecture_flags(model: ModelSpec, *, transformer_engine: bool = True) -> tuple[list[str], list[str]]:
    """(flags, lost): the Megatron-LM flags that build ``model``'s architecture, and the facts of the model that
    no flag can state (``model.unexpressed`` first). ``megatron_args`` writes ``lost`` as one
    ``# not expressed: ...`` comment line."""
    f = _Flags(lost=list(model.unexpressed))
    for section in (_shape_flags, _position_flags, _layer_flags, _mla_flags, _moe_flags, _hybrid_flags):
        section(model, f)
    return f.out, f.lost


def _shape_flags(model: ModelSpec, f: _Flags) -> None:
    """Layers, widths, heads, sequence length, embeddings."""
    # arguments.py _add_network_size_args:
    #   group.add_argument('--num-layers', type=int, default=None, help='Number of transformer layers.')
    #   '--hidden-size', '--ffn-hidden-size', '--num-attention-heads', '--kv-channels',
    #   group.add_argument('--group-query-attention', action='store_true', ...), '--num-query-groups',
    #   '--max-position-embeddings', '--position-embedding-type' choices=['learned_absolute', 'rope', ...],
    #   '--untie-embeddings-and-output-weights', '--multi-latent-attention'.
    # arguments.py _add_data_args: group.add_argument('--seq-length', type=int, ...)
    mla = model.mla_kv_lora_rank is not None
    f.out += [f"--num-layers {model.layers}", f"--hidden-size {model.hidden}",
            f"--ffn-hidden-size {model.ffn_hidden}", f"--num-attention-heads {model.heads}"]
    if model.hidden % model.heads or model.head_width != model.hidden // model.heads:
        f.out.append(f"--kv-channels {model.head_width}")
    if not mla and model.kv_heads is not None and model.kv_heads != model.heads:
        f.out += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    f.out += [f"--seq-length {model.seq_len}", f"--max-position-embeddings {model.seq_len}"]
    if not model.tied_embeddings:
        f.out.append("--untie-embeddings-and-output-weights")


def _position_flags(model: ModelSpec, f: _Flags) -> None:
    """Learned positions or RoPE with its base, fraction and scaling."""
    mla = model.mla_kv_lora_rank is not None
    # _add_network_size_args: group.add_argument('--rotary-base', type=int, default=10000, ...),
    #   '--rotary-percent' (type=float, default=1.0), '--rotary-seq-len-interpolation-factor' (type=int),
    #   group.add_argument('--use-rope-scaling', action='store_true', help='Apply rope scaling as used in llama3.x'),
    #   '--rope-scaling-factor' (type=float, default=8.0). megatron-core 0.16.1 RotaryEmbedding._apply_scaling
    #   fixes low_freq_factor=1, high_freq_factor=4, original_max_position_embeddings=8192.
    # _add_training_args: '--rope-type' choices=['rope', 'yarn'] ("MLA takes yarn by default, and common attention
    #   takes rope by default"); core_transformer_config_from_args: 'Common attention only support rope_type="rope"'.
    # _add_mla_args: '--rotary-scaling-factor' (float, default 1.0), '--mscale' (1.0), '--mscale-all-dim' (0.0);
    #   MLATransformerConfig fixes original_max_position_embeddings=4096, beta_fast=32, beta_slow=1 (no flags).
    if model.hybrid_pattern:
        # megatron-core MambaModel (and Megatron-Bridge's MambaModelProvider): no position embeddings.
        f.out.append("--position-embedding-type none")
        return
    if model.learned_position_embeddings:
        f.out.append("--position-embedding-type learned_absolute")
    else:
        f.out.append("--position-embedding-type rope")
        if float(model.rotary_base).is_integer():
            f.out.append(f"--rotary-base {int(model.rotary_base)}")
        else:
            f.lost.append(f"rotary base {model.rotary_base} (Megatron's --rotary-base takes an integer)")
        if model.rotary_percent != 1.0:
            f.out.append(f"--rotary-percent {_num(model.rotary_percent)}")
        rs = model.rope_scaling
        if rs is None:
            if mla:
                # MLATransformerConfig defaults to yarn, and "apply_rope_fusion for MLA only works with YARN RoPE"
                # (_add_training_args: '--no-rope-fusion', dest='apply_rope_fusion').
                f.out += ["--rope-type rope", "--no-rope-fusion"]
        elif rs.type == "yarn" and mla:
            f.out += ["--rope-type yarn", f"--rotary-scaling-factor {_num(rs.factor)}", f"--mscale {_num(rs.mscale)}",
                    f"--mscale-all-dim {_num(rs.mscale_all_dim)}"]
            fixed = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
            for name, value in fixed.items():
                if getattr(rs, name) not in (None, value):
                    f.lost.append(f"YaRN {name}={getattr(rs, name)} (Megatron fixes {value})")
        elif rs.type == "yarn":
            f.lost.append(f"YaRN rope scaling (factor {_num(rs.factor)}): Megatron-LM applies YaRN only with "
                        f"--multi-latent-attention")
        elif rs.type == "llama3":
            f.out += ["--use-rope-scaling", f"--rope-scaling-factor {_num(rs.factor)}"]
            fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
            for name, value in fixed.items():
                if getattr(rs, name) not in (None, value):
                    f.lost.append(f"llama3 rope scaling {name}={getattr(rs, name)} (Megatron fixes {value})")
        elif float(rs.factor).is_integer():
            f.out.append(f"--rotary-seq-len-interpolation-factor {int(rs.factor)}")
        else:
            f.lost.append(f"linear rope scaling by {rs.factor} (Megatron's interpolation factor is an integer)")


def _layer_flags(model: ModelSpec, f: _Flags) -> None:
    """Normalisation, activation, biases, dropout."""
    # _add_network_size_args: '--normalization' choices=['LayerNorm', 'RMSNorm'], '--norm-epsilon' (float,
    #   default 1e-5), '--apply-layernorm-1p' ("LayerNorm weights ... centered around zero"), '--squared-relu',
    #   '--swiglu', '--quick-geglu', '--activation-func-clamp-value', '--glu-linear-offset' (default gelu).
    # _add_vision_args (sic): group.add_argument('--qk-layernorm', action='store_true', ...).
    # _add_training_args: '--disable-bias-linear' (dest='add_bias_linear'), '--add-qkv-bias'.
    # _add_regularization_args: '--attention-dropout' (default 0.1), '--hidden-dropout' (default 0.1).
    f.out.append("--normalization " + ("RMSNorm" if model.normalization == "RMSNorm" else "LayerNorm"))
    if model.normalization == "LayerNorm1p":
        f.out.append("--apply-layernorm-1p")
    f.out.append(f"--norm-epsilon {_num(model.norm_epsilon)}")
    if model.qk_norm:
        f.out.append("--qk-layernorm")
    act = {"swiglu": "--swiglu", "squared_relu": "--squared-relu", "quick_geglu": "--quick-geglu", "gelu": None}
    if model.activation in act:
        f.out += [act[model.activation]] if act[model.activation] else []
    else:
        f.lost.append(f"activation {model.activation} (Megatron-LM has --swiglu, --squared-relu, --quick-geglu and "
                    f"GELU)")
    if model.activation_clamp is not None:
        f.out.append(f"--activation-func-clamp-value {_num(model.activation_clamp)}")
    if model.glu_linear_offset:
        f.out.append(f"--glu-linear-offset {_num(model.glu_linear_offset)}")
    if not model.linear_bias:
        f.out.append("--disable-bias-linear")
        if model.qkv_bias:
            f.out.append("--add-qkv-bias")
    f.out += [f"--attention-dropout {_num(model.attention_dropout)}", f"--hidden-dropout {_num(model.hidden_dropout)}"]


def _mla_flags(model: ModelSpec, f: _Flags) -> None:
    """Multi-head latent attention."""
    mla = model.mla_kv_lora_rank is not None
    # arguments.py _add_mla_args: group.add_argument('--q-lora-rank', type=int, default=None, ...),
    #   '--kv-lora-rank', '--qk-head-dim', '--qk-pos-emb-head-dim', '--v-head-dim'.
    if mla:
        f.out.append("--multi-latent-attention")
        if model.mla_q_lora_rank is not None:
            f.out.append(f"--q-lora-rank {model.mla_q_lora_rank}")
        f.out += [f"--kv-lora-rank {model.mla_kv_lora_rank}", f"--qk-head-dim {model.head_width}",
                f"--qk-pos-emb-head-dim {model.mla_rope_dim}",
                f"--v-head-dim {model.mla_v_head_dim or model.head_width}"]


def _moe_flags(model: ModelSpec, f: _Flags) -> None:
    """Mixture of experts and multi-token prediction."""
    # arguments.py _add_moe_args: group.add_argument('--num-experts', type=int, default=None, ...),
    #   '--moe-router-topk', '--moe-ffn-hidden-size',
    #   '--moe-shared-expert-intermediate-size' ("num_shared_experts * ffn_size_of_each_shared_expert"),
    #   '--moe-layer-freq' type=moe_freq_type ("([0]+[1]*23)": 1 dense layer followed by 23 experts layers),
    #   '--moe-token-dispatcher-type' choices=['allgather', 'alltoall', 'flex'],
    #   '--moe-router-score-function' choices=['softmax', 'sigmoid'], '--moe-router-pre-softmax',
    #   '--moe-router-enable-expert-bias', '--moe-router-topk-scaling-factor', '--moe-router-num-groups',
    #   '--moe-router-group-topk'. megatron-core 0.16.1 moe_utils.topk_routing_with_score_function: softmax over
    #   the top-k logits (renormalised) unless pre-softmax; sigmoid scores are always renormalised (top-k > 1);
    #   the scaling factor multiplies the weights either way. TransformerConfig: "Please use
    #   --moe-router-pre-softmax when topk is 1".
    if model.is_moe:
        f.out += [f"--num-experts {model.num_experts}", f"--moe-router-topk {model.moe_topk}",
                f"--moe-ffn-hidden-size {model.expert_ffn}"]
        if model.shared_experts:
            f.out.append(f"--moe-shared-expert-intermediate-size {model.shared_experts * model.expert_ffn}")
        if model.moe_layer_freq():
            f.out.append(f"--moe-layer-freq {moe_layer_freq_arg(model)}")
        f.out.append(f"--moe-router-score-function {model.moe_router_score}")
        if model.moe_router_score == "softmax":
            if not model.moe_router_norm_topk:
                f.out.append("--moe-router-pre-softmax")
            elif model.moe_topk == 1:
                f.lost.append("top-1 routing weight renormalised to 1 (Megatron needs --moe-router-pre-softmax with "
                            "top-1)")
        elif not model.moe_router_norm_topk and model.moe_topk > 1:
            f.lost.append("sigmoid routing weights without renormalisation (Megatron renormalises the top-k)")
        if model.moe_router_expert_bias:
            f.out.append("--moe-router-enable-expert-bias")
        if model.moe_router_topk_scaling != 1.0:
            f.out.append(f"--moe-router-topk-scaling-factor {_num(model.moe_router_topk_scaling)}")
        if model.moe_router_groups is not None:
            f.out += [f"--moe-router-num-groups {model.moe_router_groups}",
                    f"--moe-router-group-topk {model.moe_router_group_topk}"]
        if model.moe_token_drop:
            # arguments.py _add_moe_args: '--moe-expert-capacity-factor' ("The capacity factor for each expert,
            # None means no token will be dropped") and '--moe-pad-expert-input-to-capacity' ("Pads the input for
            # each expert to match the expert capacity length, effective only after the
            # --moe-expert-capacity-factor is set"). Capacity 1.0 padded: every expert runs the balanced load
            # the cost model prices, with static shapes.
            f.out += ["--moe-expert-capacity-factor 1.0", "--moe-pad-expert-input-to-capacity"]
    # arguments.py _add_network_size_args: '--mtp-num-layers' ("Number of Multi-Token Prediction (MTP) Layers").
    if model.mtp_layers:
        f.out.append(f"--mtp-num-layers {model.mtp_layers}")


def _hybrid_flags(model: ModelSpec, f: _Flags) -> None:
    """A hybrid Mamba model's pattern and Mamba-2 widths, and a LatentMoE's width (pretrain_mamba.py)."""
    # arguments.py _add_network_size_args: '--hybrid-override-pattern', '--mamba-state-dim', '--mamba-head-dim',
    #   '--mamba-num-groups', '--mamba-num-heads'; _add_moe_args: '--moe-latent-size' (the flags Megatron-LM's
    #   hybrid checkpoint loaders write for Nemotron-H and Nemotron 3).
    if model.hybrid_pattern:
        f.out += [f"--hybrid-override-pattern {model.hybrid_pattern}", f"--mamba-state-dim {model.mamba_state_dim}",
                  f"--mamba-head-dim {model.mamba_head_dim}", f"--mamba-num-groups {model.mamba_groups}"]
        if model.mamba_heads:
            f.out.append(f"--mamba-num-heads {model.mamba_heads}")
    if model.moe_latent:
        f.out.append(f"--moe-latent-size {model.moe_latent}")


def entry_script(model: ModelSpec) -> str:
    """Megatron-LM's training script for ``model``: pretrain_mamba.py builds the hybrid Mamba models
    (ModelSpec.hybrid_pattern), pretrain_gpt.py every other."""
    return "pretrain_mamba.py" if model.hybrid_pattern else "pretrain_gpt.py"


def megatron_args(model: ModelSpec, plan: ParallelPlan, *, layout: str | None = None,
                  fp8_recipe: str = "tensorwise", transformer_engine: bool = True) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` flags for ``model`` trained with ``plan`` (``pretrain_mamba.py``'s for a
    hybrid model: entry_script).

    One flag, or flag and value separated by one space, per item; items starting with ``#`` are
    comments (settings without a verified flag, and notes; ``# not expressed: ...`` names every fact of the
    model no flag states). ``layout`` is a ``--pipeline-model-parallel-layout`` string for uneven splits;
    without it, a plan with explicit ``layers_per_stage`` gets a layout generated from them. ``fp8_recipe``
    picks the Hopper FP8 scaling (delayed, tensorwise or blockwise) for ``precision='fp8'``.
    ``transformer_engine=False`` (GPUs below compute capability 8.0, which Transformer Engine needs) writes
    ``--transformer-impl local`` and no Transformer Engine-only option.
    """
    if fp8_recipe not in _FP8_RECIPES:
        raise InputError(f"fp8_recipe={fp8_recipe!r}; valid: {', '.join(_FP8_RECIPES)}")
    if not transformer_engine and model.precision in ("fp8", "mxfp8", "nvfp4"):
        raise InputError(f"precision {model.precision} needs Transformer Engine, which needs compute capability "
                         f"8.0 or newer; valid without it: bf16, fp16, fp32")
    out, lost = architecture_flags(model, transformer_engine=transformer_engine)
    f = _Flags(out=out, lost=lost)
    _engine_flags(model, plan, f, transformer_engine)
    _degree_flags(model, plan, f, layout)
    _runtime_flags(plan, f, transformer_engine, model.optimizer)
    # arguments.py _add_training_args: group.add_argument('--micro-batch-size', type=int, default=None, ...),
    #   group.add_argument('--global-batch-size', type=int, default=None, ...).
    f.out += [f"--micro-batch-size {plan.micro_batch}", f"--global-batch-size {plan.global_batch}"]
    _recompute_flags(model, plan, f, transformer_engine, fp8_recipe)
    _precision_flags(model, plan, f, fp8_recipe)
    if model.finetune == "lora":
        # pretrain_gpt.py has no adapters: LoRA runs through Megatron-Bridge / NeMo PEFT on the same layout.
        f.lost.append("LoRA on frozen weights (pretrain_gpt.py trains every weight; run it with Megatron-Bridge's "
                      "PEFT, peft=lora, on this layout)")
    if f.lost:
        f.notes.insert(0, "# not expressed: " + "; ".join(f.lost))
    return f.out + f.notes


def _engine_flags(model: ModelSpec, plan: ParallelPlan, f: _Flags, transformer_engine: bool) -> None:
    """What the plan's implementation takes beyond the architecture: MoE biases, Transformer Engine or the local
    implementation, grouped GEMMs, the vocabulary note."""
    if model.is_moe and model.linear_bias and plan.etp > 1:
        # TransformerConfig.__post_init__: "Bias in Moe is only supported when ETP==1".
        f.out.append("--disable-bias-linear")
        f.lost.append(f"linear biases (Megatron has MoE biases only with expert-tensor-parallel-size 1, the plan has "
                    f"etp={plan.etp})")
    # arguments.py _add_transformer_engine_args: group.add_argument('--transformer-impl',
    #   default='transformer_engine', choices=['local', 'transformer_engine'], ...).
    if not transformer_engine:
        f.out.append("--transformer-impl local")
        f.notes.append("# Transformer Engine needs compute capability 8.0: megatron-core's local implementation, "
                     "no --tp-comm-overlap")
    # arguments.py _add_moe_args: '--moe-grouped-gemm' (the cost model prices, and the executor runs, grouped GEMMs).
    if model.is_moe:
        _dispatcher_flags(model, plan, f)
        issue = grouped_gemm_issue(model, transformer_engine)
        if issue is None:
            f.out.append("--moe-grouped-gemm")
        else:
            f.notes.append(f"# --moe-grouped-gemm left out: {issue} (the estimate prices grouped GEMMs)")
        # arguments.py _add_moe_args: '--moe-permute-fusion' (store_true; TransformerConfig.moe_permute_fusion,
        #   default False, "Fuse token rearrangement ops during token dispatching"; __post_init__ raises "fused
        #   permutation is not available. Please install TE >= 2.1.0." without Transformer Engine's kernels).
        #   Megatron-Bridge's MoE model providers and performance recipes set moe_permute_fusion = True, and the
        #   profiles' MoE routing factor (moe_overhead) is fitted to those runs.
        if transformer_engine:
            f.out.append("--moe-permute-fusion")
    # arguments.py _add_tokenizer_args defines '--vocab-size' but the tokenizer normally sets the
    # vocabulary; it is left to the caller (e.g. NullTokenizer with --mock-data needs it).
    f.notes.append(f"# vocab: {model.vocab} tokens (set by the tokenizer; with --tokenizer-type NullTokenizer "
                 f"pass --vocab-size {model.vocab})")


def _dispatcher_flags(model: ModelSpec, plan: ParallelPlan, f: _Flags) -> None:
    """The MoE token dispatcher the estimate prices: with expert parallelism, the flex dispatcher, which sends a
    token once to each node and each GPU holding any of its experts (costmodel/comm.py moe_dispatch_time_s)."""
    # megatron-core 0.16.1 transformer_config.py: moe_token_dispatcher_type Literal['allgather', 'alltoall',
    #   'flex']; moe_flex_dispatcher_backend Literal['deepep', 'hybridep'] ("Currently only 'hybridep' backend
    #   supports the MNNVL case", i.e. NVLink domains beyond one node); __post_init__: "Flex token dispatcher with
    #   deepep backend does not support moe_pad_expert_input_to_capacity". Megatron-Bridge's performance recipes
    #   run flex / hybridep on H100, B200 and GB200 (scripts/performance/configs/deepseek/
    #   deepseek_workload_base_configs.py).
    if plan.ep > 1 and not model.moe_token_drop:
        f.out += ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend hybridep"]
        f.notes.append("# flex / HybridEP dispatcher (needs DeepEP's hybrid-ep kernels installed), as the estimate "
                       "prices it; --moe-token-dispatcher-type alltoall runs without them but sends a copy per "
                       "expert, slower than estimated")
        return
    f.out.append("--moe-token-dispatcher-type alltoall")
    if plan.ep > 1:
        f.notes.append("# alltoall dispatcher: capacity padding needs it (DeepEP does not pad); the estimate prices "
                       "the flex dispatcher's one copy per destination GPU, so expect slower dispatch")


def _degree_flags(model: ModelSpec, plan: ParallelPlan, f: _Flags, layout: str | None) -> None:
    """The parallel degrees, the pipeline layout or virtual stages, sequence parallelism."""
    # arguments.py _add_distributed_args:
    #   group.add_argument('--tensor-model-parallel-size', type=int, default=1, ...),
    #   '--pipeline-model-parallel-size', '--pipeline-model-parallel-layout' ("E|(t|)*3,m|m||L"),
    #   '--num-layers-per-virtual-pipeline-stage', '--num-virtual-stages-per-pipeline-rank',
    #   '--context-parallel-size', '--use-distributed-optimizer', '--overlap-grad-reduce',
    #   '--overlap-param-gather', '--use-tp-pp-dp-mapping' ("from tp-cp-ep-dp-pp to tp-cp-ep-pp-dp"),
    #   '--use-megatron-fsdp', '--data-parallel-sharding-strategy' choices=['no_shard', 'optim',
    #   'optim_grads', 'optim_grads_params'].
    # arguments.py _add_moe_args: '--expert-model-parallel-size', '--expert-tensor-parallel-size'
    #   (default None = --tensor-model-parallel-size, so it is always written for MoE models).
    # arguments.py _add_training_args: group.add_argument('--sequence-parallel', action='store_true', ...),
    #   group.add_argument('--tp-comm-overlap', action='store_true', ...), '--no-gradient-accumulation-fusion'.
    # arguments.py _add_checkpointing_args: '--ckpt-format' choices=[..., 'fsdp_dtensor'].
    # Megatron-Core developer guide, Megatron-FSDP: "--use-megatron-fsdp --data-parallel-sharding-strategy
    #   optim_grads_params --ckpt-format fsdp_dtensor --init-model-with-meta-device"; megatron-core 0.16.1
    #   mcore_fsdp_adapter.py passes init_model_with_meta_device to MegatronFSDP ("initialize model parameters
    #   in shards ... large models that do not fit on a single device"). The FSDP optimizer is megatron-core's
    #   DistributedOptimizer (optimizer/__init__.py builds it per chunk for use_megatron_fsdp;
    #   distrib_optimizer.py returns early from its buffer set-up), so --use-distributed-optimizer stays.
    # validate_args: "No more than one of the following arguments can be set at the same time:
    #   --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,
    #   --pipeline-model-parallel-layout" -> vpp comes from the layout when there is one.
    f.out += [f"--tensor-model-parallel-size {plan.tp}", f"--pipeline-model-parallel-size {plan.pp}"]
    if layout is None and plan.layers_per_stage is not None:
        layout = layout_from_layers_per_stage(plan.layers_per_stage, plan.vpp, model.mtp_layers)
    if layout is not None:
        _check_layout(model, plan, layout)
        f.out.append(f"--pipeline-model-parallel-layout {layout}")
    elif plan.vpp > 1:
        f.out.append(f"--num-virtual-stages-per-pipeline-rank {plan.vpp}")
    if plan.vpp > 1 and plan.pp == 2:
        # validate_args: without overlap_p2p_comm "pipeline-model-parallel size should be greater than 2";
        # '--no-overlap-p2p-communication' (store_false, dest='overlap_p2p_comm') is the only flag and
        # batch_p2p_comm = not overlap_p2p_comm (core_transformer_config_from_args): the defaults are right.
        f.notes.append("# interleaved schedule with pp=2: keep Megatron's default p2p overlap "
                     "(overlap_p2p_comm=True, batch_p2p_comm=False); never add --no-overlap-p2p-communication")
    if plan.cp > 1:
        f.out.append(f"--context-parallel-size {plan.cp}")
    if model.is_moe or plan.ep != 1:
        f.out.append(f"--expert-model-parallel-size {plan.ep}")
    if model.is_moe or plan.etp != 1:
        f.out.append(f"--expert-tensor-parallel-size {plan.etp}")
    if plan.sequence_parallel and plan.tp > 1:
        f.out.append("--sequence-parallel")


def _runtime_flags(plan: ParallelPlan, f: _Flags, transformer_engine: bool, optimizer: str = "adam") -> None:
    """Communication overlap, data-parallel sharding (distributed optimizer, Megatron-FSDP), the optimizer, rank
    order."""
    fsdp = plan.zero_stage >= 2
    core = plan.framework == "megatron-core"
    muon = optimizer == "muon"
    if core and plan.tp > 1 and plan.sequence_parallel and transformer_engine:
        # validate_args: "Tensor parallel communication/GEMM overlap can happen only when sequence
        # parallelism is enabled".
        f.out.append("--tp-comm-overlap")
    if muon:
        # Megatron-LM arguments.py (megatron-core 0.16): '--optimizer' choices ['adam', 'sgd', 'muon', 'dist_muon'];
        # validate_args turns dist_muon into muon with use_layer_wise_distributed_optimizer (the matrices dealt
        # whole to the data-parallel ranks); megatron-core's muon.py refuses --use-distributed-optimizer ("muon with
        # dist optimizer is not supported"). Later Megatron-LM spells dist_muon as --optimizer muon
        # --use-distributed-optimizer.
        f.out.append("--optimizer dist_muon" if plan.distributed_optimizer else "--optimizer muon")
        f.notes.append("# Muon needs NVIDIA's emerging_optimizers package (pip install emerging-optimizers)")
    elif plan.distributed_optimizer or fsdp:
        f.out.append("--use-distributed-optimizer")
        if plan.dist_opt_instances > 1:
            # megatron-core arguments.py: the optimizer state sharded inside each of this many copies.
            f.out.append(f"--num-distributed-optimizer-instances {plan.dist_opt_instances}")
    if fsdp:
        # ZeRO-2/3 = Megatron-FSDP optim_grads / optim_grads_params (costmodel/rules.py); validate_args:
        # "Megatron FSDP only supports fsdp_dtensor checkpoint format"; gradient accumulation fusion is
        # switched off as Megatron-Bridge does ("not supported with Megatron FSDP").
        strategy = "optim_grads" if plan.zero_stage == 2 else "optim_grads_params"
        f.out += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                "--no-gradient-accumulation-fusion", "--ckpt-format fsdp_dtensor"]
        if plan.zero_stage >= 3:
            f.out.append("--init-model-with-meta-device")
        if plan.dist_opt_instances > 1:
            # HSDP: shard inside each of the replicas, replicate (no_shard) across them (Megatron-FSDP's
            # DP-outer strategy; 'optim' would also shard the optimizer across them, which the plan does not price).
            f.out.append("--outer-dp-sharding-strategy no_shard")
        if plan.tp > 1 or plan.cp > 1:
            # validate_args (before Blackwell) warns instead of asserting CUDA_DEVICE_MAX_CONNECTIONS=1 here.
            f.notes.append("# tp/cp with Megatron-FSDP: Megatron warns that they prefer different "
                         "CUDA_DEVICE_MAX_CONNECTIONS (1 vs more) before Blackwell; FSDP's requirement wins")
    if plan.optimizer_offload:
        # megatron-core 0.16.1 OptimizerConfig: the HybridDeviceOptimizer steps this share of the state on the CPU;
        # it runs with the precision-aware optimizer (which asserts the distributed optimizer), and the copies to
        # and from the host overlap the CPU step (what the cost model prices).
        f.out += ["--optimizer-cpu-offload", f"--optimizer-offload-fraction {plan.optimizer_offload:g}",
                  "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"]
    if plan.moe_a2a_overlap:
        # megatron-core 0.16.1 ModelParallelConfig.overlap_moe_expert_parallel_comm (the combined 1F1B schedule);
        # its rules (costmodel/rules.py) are checked before the arguments are written.
        f.out.append("--overlap-moe-expert-parallel-comm")
    if core:
        # The cost model counts the logits as Transformer Engine's fused cross-entropy keeps them, in place
        # (costmodel/memory.py LOGITS_BYTES_TE_FUSED); megatron-core model_parallel_config.py:241-246
        # (cross_entropy_loss_fusion, cross_entropy_fusion_impl 'native' | 'te'), arguments.py
        # '--cross-entropy-loss-fusion', '--cross-entropy-fusion-impl'.
        f.out += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl te"]
        # arguments.py _add_training_args: '--manual-gc' (store_true), '--manual-gc-interval' (default 0: never
        # between steps); as the runs the profiles are fitted to (costmodel.rules.MANUAL_GC_INTERVAL_STEPS).
        f.out += ["--manual-gc", f"--manual-gc-interval {MANUAL_GC_INTERVAL_STEPS}"]
        f.out.append("--overlap-grad-reduce")
        if (plan.distributed_optimizer or fsdp) and not muon:
            # validate_args: "--overlap-param-gather only supported with distributed optimizer or megatron fsdp"
            f.out.append("--overlap-param-gather")
    else:
        f.notes.append(f"# plan framework is {plan.framework}; these flags are for megatron-core "
                     f"(no overlap flags written)")
    if plan.rank_order == _TP_PP_DP_ORDER and fsdp and plan.pp == 1:
        # Megatron-Bridge refuses "use_tp_pp_dp_mapping is not supported with Megatron FSDP"; with pp = 1
        # both orders place the ranks alike.
        f.notes.append(f"# rank order {plan.rank_order} equals {_DEFAULT_ORDER} with pp=1; --use-tp-pp-dp-mapping "
                     f"left out (not supported with Megatron-FSDP)")
    elif plan.rank_order == _TP_PP_DP_ORDER:
        f.out.append("--use-tp-pp-dp-mapping")
    elif plan.rank_order != _DEFAULT_ORDER:
        f.notes.append(f"# rank order {plan.rank_order} has no Megatron flag (megatron-core supports "
                     f"{_DEFAULT_ORDER} and, with --use-tp-pp-dp-mapping, {_TP_PP_DP_ORDER})")


def _recompute_flags(model: ModelSpec, plan: ParallelPlan, f: _Flags, transformer_engine: bool,
                     fp8_recipe: str) -> None:
    """Activation recomputation, or offloading (of all the model's layers but the last)."""
    layers = model.layers
    # arguments.py (generated from TransformerConfig / ModelParallelConfig): '--cpu-offloading',
    #   '--cpu-offloading-num-layers' ("the number of transformer layers for which activations has to be
    #   offloaded"); cpu_offloading_activations defaults to True, cpu_offloading_weights to False.
    if plan.recompute == "offload":
        k = plan.recompute_layers if plan.recompute_layers is not None else layers - 1
        f.out += ["--cpu-offloading", f"--cpu-offloading-num-layers {k}"]
        return
    # arguments.py _add_training_args: '--recompute-granularity' choices=['full', 'selective'],
    #   '--recompute-method' choices=['uniform', 'block'], '--recompute-num-layers' ("2) block: the
    #   number of individual Transformer layers to recompute within each pipeline stage").
    # megatron-core 0.16.1 TransformerBlock: block recompute counts layers of one model chunk
    #   (self.num_layers_per_pipeline_rank = len(self.layers)), so a plan's per-rank count is N * vpp
    #   (as costmodel/validate.py recompute_options builds it). Full recompute of every layer is
    #   uniform with 1 layer per unit.
    if plan.recompute == "selective":
        f.out.append("--recompute-granularity selective")
        if model.is_moe and transformer_engine:
            _moe_recompute_modules(model, f, fp8_recipe)
    elif plan.recompute == "full":
        if plan.recompute_layers is None:
            f.out += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
        elif plan.recompute_layers == 0:
            f.notes.append("# full recompute of 0 layers per stage = no recomputation (no flags written)")
        else:
            if plan.recompute_layers % plan.vpp:
                raise InputError(f"recompute_layers={plan.recompute_layers} is not a multiple of vpp={plan.vpp}: "
                                 f"Megatron's --recompute-num-layers counts layers per virtual chunk; valid: "
                                 f"multiples of {plan.vpp}, or None (all)")
            f.out += ["--recompute-granularity full", "--recompute-method block",
                    f"--recompute-num-layers {plan.recompute_layers // plan.vpp}"]


def _moe_recompute_modules(model: ModelSpec, f: _Flags, fp8_recipe: str) -> None:
    """The selective recomputation the estimate prices for a MoE model on megatron-core's Transformer Engine
    layers (costmodel/memory.py layer_activation_bytes, ``te_moe_modules``): the pre-MLP LayerNorm
    ("layernorm"), with MLA the input one too, and the routed experts' activation ("moe_act") besides the
    attention core (costmodel.rules.selective_runs_as_priced).
    A dense layer has nothing more to recompute selectively (its LayerNorms are fused into the GEMMs), so it
    gets the default core_attn, and the planner does not offer it selective."""
    # megatron-core 0.16.1 transformer_config.py: recompute_modules choices "core_attn", "moe_act", "layernorm",
    #   "mla_up_proj", "mlp", "moe", "shared_experts" (default ["core_attn"]); arguments.py: '--recompute-modules',
    #   nargs='*'.
    if model.precision == "fp8" and fp8_recipe == "delayed":
        f.notes.append("# --recompute-modules layernorm moe_act left out: megatron-core refuses them with "
                       "--fp8-recipe delayed, and the estimate counts the pre-MLP LayerNorm and the experts' "
                       "activation recomputed (more memory than planned: use --fp8-recipe tensorwise or full "
                       "recompute)")
        return
    grouped = grouped_gemm_issue(model, True) is None
    if not grouped:
        f.notes.append("# moe_act left out of --recompute-modules: megatron-core recomputes the experts' activation "
                       "only with --moe-grouped-gemm, which needs --bf16 (the estimate keeps it too)")
    f.out.append("--recompute-modules " + " ".join(moe_recompute_modules(grouped)))


def _precision_flags(model: ModelSpec, plan: ParallelPlan, f: _Flags, fp8_recipe: str) -> None:
    """Mixed precision, FP8 and FP4 recipes, FP8 parameters, loss scaling."""
    # arguments.py _add_mixed_precision_args: group.add_argument('--bf16', action='store_true', ...), '--fp16'.
    # arguments.py _add_transformer_engine_args:
    #   group.add_argument('--fp8-format', default=None, choices=['e4m3', 'hybrid'], ..., dest='fp8')
    #   group.add_argument('--fp8-recipe', default='delayed',
    #                      choices=['tensorwise', 'delayed', 'mxfp8', 'blockwise', 'custom'], ...)
    #   group.add_argument('--fp4-format', default=None, choices=['e2m1'], ..., dest='fp4')
    #   group.add_argument('--fp4-recipe', default='nvfp4', choices=['nvfp4', 'custom'], ...)
    # (megatron-core 0.16.1 enums.Fp8Recipe / Fp4Recipe hold the same names.)
    # arguments.py _add_mixed_precision_args: '--loss-scale' ("If None, dynamic loss scaling is used"),
    #   '--initial-loss-scale' (default 2**32), '--min-loss-scale', '--loss-scale-window', '--hysteresis'.
    # validate_args: params_dtype = torch.float unless --fp16 / --bf16: an fp32 plan writes neither.
    p = model.precision
    if p == "fp16":
        f.out += ["--fp16", f"--initial-loss-scale {2 ** 32}"]
        f.notes.append("# fp16: dynamic loss scaling (no --loss-scale), from 2^32 as Megatron does")
    elif p == "fp32":
        f.notes.append("# fp32: neither --bf16 nor --fp16 (parameters and GEMMs in fp32, as the estimate prices)")
    elif p == "tf32":
        # PyTorch runs fp32 matmuls on TF32 tensor cores only with torch.backends.cuda.matmul.allow_tf32 = True
        # (its default False since 1.12); Megatron-LM has no flag for it.
        f.notes.append("# tf32: neither --bf16 nor --fp16 (fp32 parameters and activations); the estimate prices the "
                       "GEMMs on TF32 tensor cores, which PyTorch uses for fp32 matmuls only with "
                       "torch.backends.cuda.matmul.allow_tf32 = True (default False since PyTorch 1.12): set it in "
                       "the training script")
    else:
        # validate_args: with --bf16, "if args.grad_reduce_in_bf16: args.accumulate_allreduce_grads_in_fp32 = False
        # elif ... main_grads_dtype == torch.float32: args.accumulate_allreduce_grads_in_fp32 = True", and
        # training.py builds DistributedDataParallelConfig(grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32):
        # without the flag the gradient buffer is fp32, 2 bytes per parameter more than the estimate prices
        # (costmodel/memory.py GRAD_BYTES_CORE, as NVIDIA's Megatron-Bridge performance recipes run:
        # ddp.grad_reduce_in_fp32 = False) and twice the data-parallel gradient traffic.
        f.out += ["--bf16", "--grad-reduce-in-bf16"]
        f.notes.append("# --grad-reduce-in-bf16: gradients accumulated and reduced in bf16, as the estimate prices; "
                       "without it Megatron-LM keeps them in fp32 (2 bytes more per local parameter, twice the "
                       "data-parallel gradient traffic)")
    if p == "fp8":
        f.out += ["--fp8-format hybrid", f"--fp8-recipe {fp8_recipe}"]
    elif p == "mxfp8":
        f.out += ["--fp8-format e4m3", "--fp8-recipe mxfp8"]
    if p in ("fp8", "mxfp8"):
        _fp8_param_flags(plan, f, p, model.optimizer)
    elif p == "nvfp4":
        f.out += ["--fp4-format e2m1", "--fp4-recipe nvfp4"]


def _fp8_param_flags(plan: ParallelPlan, f: _Flags, precision: str, optimizer: str = "adam") -> None:
    """FP8 parameters, as the estimate prices a sharded FP8 run's weights (costmodel/memory.py: 2 bytes a
    parameter, FP8_WEIGHT_EXTRA_BYTES_UNSHARDED more without a sharded optimizer state) and NVIDIA's
    Megatron-Bridge recipes run them (training/mixed_precision.py: fp8_param_gather=True for the delayed,
    tensorwise and MXFP8 recipes, reuse_grad_buf_for_mxfp8_param_ag with MXFP8). With --fp8-param-gather the
    module keeps its weights in FP8 (1 byte, and the transposed copy Transformer Engine makes for the backward
    GEMMs, 1 more); without it a bf16 weight (2) and Transformer Engine's cached FP8 workspace of it, row- and
    column-wise (2): 4 bytes (megatron-core optimizer_config.py warns that MXFP8 without them "will use
    significant amount additional GPU memory")."""
    # Megatron-LM arguments.py validate_args: "--fp8-param-gather only supported with distributed optimizer, torch
    #   fsdp2, megatron fsdp, or inference mode"; megatron-core distributed_data_parallel_config.py: "Reuse grad
    #   buffer only when keeping params in MXFP8" (reuse_grad_buf_for_mxfp8_param_ag asserts fp8_param_gather).
    if optimizer == "muon":
        # Muon's layer-wise distributed optimizer is not Megatron's distributed optimizer, which --fp8-param-gather
        # asserts; Megatron-Bridge's Kimi K2 recipe turns both FP8 parameter options off for dist_muon with MXFP8
        # (scripts/performance/configs/kimi/kimi_llm_pretrain.py: "incompatible with Muon's
        # LayerWiseDistributedOptimizer").
        f.notes.append("# no --fp8-param-gather: Megatron-LM allows it only with its distributed optimizer, not Muon's "
                       "layer-wise one; each weight is held in bf16 and as Transformer Engine's FP8 copies, 4 bytes a "
                       "parameter (as the estimate prices it)")
        return
    if not (plan.distributed_optimizer or plan.zero_stage >= 2):
        f.notes.append("# no --fp8-param-gather: Megatron-LM allows it only with a sharded optimizer state; each "
                       "weight is held in bf16 and as Transformer Engine's FP8 copies, 4 bytes a parameter (as "
                       "the estimate prices it), twice what a sharded FP8 run holds")
        return
    f.out.append("--fp8-param-gather")
    if precision == "mxfp8":
        f.out.append("--reuse-grad-buf-for-mxfp8-param-ag")


# Parsing ----------------------------------------------------------------------------------------
def _tokens(args: list[str] | str) -> list[str]:
    if isinstance(args, str):
        lines = [ln for ln in args.splitlines() if not ln.lstrip().startswith("#")]
        return shlex.split("\n".join(lines), comments=False)
    toks: list[str] = []
    for item in args:
        item = str(item).strip()
        if not item or item.startswith("#"):
            continue
        if item.startswith("--") and " " in item:
            flag, value = item.split(None, 1)
            toks += [flag, value.strip()]
        else:
            toks.append(item)
    return toks


def _flag_map(tokens: list[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(tokens) and not tokens[i].startswith("--"):
        i += 1  # a leading entry script (pretrain_gpt.py) or launcher word
    while i < len(tokens):
        tok = tokens[i]   # a flag: the values after one are taken with it
        if "=" in tok:
            name, value = tok.split("=", 1)
            flags[name] = value
            i += 1
        else:
            # A flag's values run to the next flag: one for most, several for Megatron's nargs='*' flags
            # (--recompute-modules core_attn layernorm moe_act, --data-path).
            j = i + 1
            while j < len(tokens) and not tokens[j].startswith("--"):
                j += 1
            flags[tok] = " ".join(tokens[i + 1:j]) if j > i + 1 else None
            i = j
    return flags


def _int(flags: dict[str, str | None], name: str, default: int | None = None) -> int | None:
    if name not in flags:
        return default
    value = flags[name]
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"Megatron arguments: {name} needs an integer, got {value!r}") from None


def parse_megatron_args(args: list[str] | str, *, num_gpus: int | None = None) -> dict[str, Any]:
    """ParallelPlan fields from Megatron-LM flags (the items of :func:`megatron_args`, an argv-style
    token list, or the text of ``megatron_args.txt`` / a command line).

    dp is not a flag: with ``num_gpus`` it is derived as Megatron does (world / (tp * pp * cp)).
    Flags that are absent take Megatron's defaults (no recompute, no distributed optimizer,
    etp = tp for MoE models); sequence_parallel is left out with tp = 1 (Megatron turns it off).
    """
    f = _flag_map(_tokens(args))
    tp = _int(f, "--tensor-model-parallel-size", 1)
    pp = _int(f, "--pipeline-model-parallel-size", 1)
    cp = _int(f, "--context-parallel-size", 1)
    out: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": _int(f, "--expert-model-parallel-size", 1)}
    if "--expert-tensor-parallel-size" in f:
        out["etp"] = _int(f, "--expert-tensor-parallel-size")
    elif "--num-experts" in f:
        out["etp"] = tp  # validate_args: expert_tensor_parallel_size = tensor_model_parallel_size
    if num_gpus is not None:
        if num_gpus % (tp * pp * cp):
            raise InputError(f"Megatron arguments: {num_gpus} GPUs are not divisible by tp*pp*cp = "
                             f"{tp}*{pp}*{cp} = {tp * pp * cp}")
        out["dp"] = data_parallel(num_gpus, tp, pp, cp)

    num_layers = _int(f, "--num-layers")
    layout = f.get("--pipeline-model-parallel-layout")
    if layout:
        vpp, per_rank = parse_layout(layout, pp)
        out["vpp"] = vpp
        out["layers_per_stage"] = per_rank
    elif "--num-virtual-stages-per-pipeline-rank" in f:
        out["vpp"] = _int(f, "--num-virtual-stages-per-pipeline-rank")
    elif "--num-layers-per-virtual-pipeline-stage" in f:
        if num_layers is None:
            raise InputError("Megatron arguments: --num-layers-per-virtual-pipeline-stage needs --num-layers")
        out["vpp"] = (num_layers // pp) // _int(f, "--num-layers-per-virtual-pipeline-stage")
    else:
        out["vpp"] = 1
    first = _int(f, "--decoder-first-pipeline-num-layers")
    last = _int(f, "--decoder-last-pipeline-num-layers")
    if not layout and (first is not None or last is not None) and num_layers is not None and pp > 1:
        inner = pp - (first is not None) - (last is not None)
        rest = num_layers - (first or 0) - (last or 0)
        if inner and rest % inner:
            raise InputError(f"Megatron arguments: {rest} middle layers do not split evenly over {inner} stages")
        mid = [rest // inner] * inner if inner else []
        out["layers_per_stage"] = tuple(([first] if first is not None else []) + mid
                                        + ([last] if last is not None else []))

    if "--sequence-parallel" in f:
        out["sequence_parallel"] = True
    elif tp > 1:
        out["sequence_parallel"] = False

    if "--micro-batch-size" in f:
        out["micro_batch"] = _int(f, "--micro-batch-size")
    if "--global-batch-size" in f:
        out["global_batch"] = _int(f, "--global-batch-size")

    gran = f.get("--recompute-granularity")
    if "--cpu-offloading" in f:
        gran = "offload"
    if gran is None and "--recompute-activations" in f:
        gran = "selective"  # validate_args: "if args.recompute_activations: recompute_granularity = 'selective'"
    if gran == "full":
        out["recompute"] = "full"
        if f.get("--recompute-method") == "block":
            out["recompute_layers"] = _int(f, "--recompute-num-layers", 0) * out["vpp"]
        else:
            out["recompute_layers"] = None
    elif gran == "selective":
        out["recompute"] = "selective"
    elif gran == "offload":
        out["recompute"] = "offload"
        k = _int(f, "--cpu-offloading-num-layers", 0) or None
        # All layers but the last is the plan's default (recompute_layers None).
        out["recompute_layers"] = None if k is not None and num_layers is not None and k == num_layers - 1 else k
    else:
        out["recompute"] = "none"

    out["distributed_optimizer"] = "--use-distributed-optimizer" in f or f.get("--optimizer") == "dist_muon"
    strategy = f.get("--data-parallel-sharding-strategy") if "--use-megatron-fsdp" in f else None
    if strategy == "optim_grads_params":
        out["zero_stage"] = 3
    elif strategy == "optim_grads":
        out["zero_stage"] = 2
    else:
        out["zero_stage"] = 1 if (out["distributed_optimizer"] or strategy == "optim") else 0
    if "--use-tp-pp-dp-mapping" in f:
        out["rank_order"] = _TP_PP_DP_ORDER
    out["dist_opt_instances"] = _int(f, "--num-distributed-optimizer-instances", 1) or 1
    out["moe_a2a_overlap"] = "--overlap-moe-expert-parallel-comm" in f
    if "--optimizer-cpu-offload" in f:
        out["optimizer_offload"] = _offload_fraction(f.get("--optimizer-offload-fraction"))
    return out


def _offload_fraction(value: str | None) -> float:
    """--optimizer-offload-fraction as megatron/training/arguments.py reads it (default 1.0: all of the state)."""
    if value is None:
        return 1.0
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0.0 <= x <= 1.0:
        raise InputError(f"Megatron arguments: --optimizer-offload-fraction needs a number from 0 to 1, got {value!r}")
    return x


# Scripts ----------------------------------------------------------------------------------------
def _check_world(cluster: ClusterSpec, plan: ParallelPlan) -> None:
    if plan.world_size != cluster.num_gpus:
        raise InputError(f"plan uses tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = {plan.world_size} GPUs "
                         f"but cluster {cluster.name} has {cluster.num_gpus} ({cluster.nodes} nodes x "
                         f"{cluster.gpus_per_node}); Megatron would derive a different dp")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _args_block(args: list[str]) -> str:
    """The flags as a bash array ``MEGATRON_ARGS=(...)``, comment items as bash comments after it."""
    lines = ["MEGATRON_ARGS=("]
    comments: list[str] = []
    for item in args:
        item = str(item).strip()
        if not item:
            continue
        if item.startswith("#"):
            comments.append("# " + _one_line(item.lstrip("#")))
            continue
        if item.startswith("--") and " " in item:
            flag, value = item.split(None, 1)
            lines.append(f"    {shlex.quote(flag)} {shlex.quote(value.strip())}")
        else:
            lines.append(f"    {shlex.quote(item)}")
    lines.append(")")
    return "\n".join(lines + comments)


def _needs_max_connections(plan: ParallelPlan) -> bool:
    # validate_args: with (tp > 1 or cp > 1) before Blackwell, "Using tensor model parallelism or context
    # parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"; Megatron-FSDP
    # asserts the opposite ("FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one").
    # (sequence parallelism only exists with tp > 1: validate_args turns it off when tp == 1.)
    return (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 2


def _env_block(plan: ParallelPlan) -> str:
    block = _max_connections_block(plan)
    if plan.optimizer_offload:
        # torch/distributed/run.py sets OMP_NUM_THREADS=1 for every worker unless it is set; the optimizer's CPU
        # step (torch AdamW on the CPU, what the cost model prices at the host DRAM's rate) would then run on one
        # core per rank.
        block += ("\n# The optimizer's CPU step (--optimizer-cpu-offload) streams the host DRAM: give each rank its share of\n"
                  "# the cores (torchrun sets OMP_NUM_THREADS=1 otherwise).\n"
                  "_cores=$(( $(nproc) / ${GPUS_PER_NODE:-8} ))\n"
                  'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( _cores > 0 ? _cores : 1 ))}"')
    return block


def _max_connections_block(plan: ParallelPlan) -> str:
    if _needs_max_connections(plan):
        return ("# Megatron requires one CUDA hardware queue with tensor/sequence or context parallelism\n"
                "# (validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS == 1 before Blackwell).\n"
                "export CUDA_DEVICE_MAX_CONNECTIONS=1")
    if plan.zero_stage >= 2:
        return ("# Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1.\n"
                "unset CUDA_DEVICE_MAX_CONNECTIONS")
    return "# CUDA_DEVICE_MAX_CONNECTIONS is left alone: no tensor or context parallelism."


def _header(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> str:
    lps = "" if plan.layers_per_stage is None else f", layers per stage {list(plan.layers_per_stage)}"
    extra = ""
    if cluster.device_groups:
        extra = "".join(f"\n# {_binding_line(b)}" for b in _group_bindings(cluster, plan))
        extra = (f"\n# {cluster.name} is heterogeneous: node ranks are bound to device groups in pipeline order "
                 f"(stage 0 first; Megatron puts pp outermost).{extra}")
    gpus = (f"{cluster.nodes} nodes (" + " + ".join(f"{g.nodes} x {g.gpus_per_node} {_one_line(g.gpu)}"
                                                   for g in cluster.device_groups) + " GPUs)"
            if cluster.device_groups else
            f"{cluster.nodes} nodes x {cluster.gpus_per_node} {_one_line(cluster.gpu)} GPUs")
    return (f"# Megatron-LM training of {_one_line(model.name)} on {_one_line(cluster.name)}: {gpus} "
            f"(generated by planner/outputs.py).\n"
            f"# Plan: tp={plan.tp} pp={plan.pp} vpp={plan.vpp} dp={plan.dp} cp={plan.cp} ep={plan.ep} "
            f"etp={plan.etp}, micro-batch {plan.micro_batch}, global batch {plan.global_batch}, recompute "
            f"{plan.recompute}{lps}, precision {model.precision}.{extra}\n"
            f"# Data, tokenizer, optimizer and checkpoint flags are not part of the plan: pass them as arguments,\n"
            f"# e.g. --mock-data --tokenizer-type NullTokenizer --vocab-size {model.vocab} --train-iters 100 "
            f"--lr 3e-4\n"
            f"# MEGATRON_LM_DIR points at the Megatron-LM checkout holding the entry script.")


def _entry(entry: str) -> str:
    if os.path.isabs(entry):
        return shlex.quote(entry)
    return '"$MEGATRON_LM_DIR"/' + shlex.quote(entry)


def launch_script(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, args: list[str], *,
                  entry: str = "pretrain_gpt.py") -> str:
    """A bash ``launch.sh`` that runs torchrun on one node; run it on every node with NODE_RANK set."""
    _check_world(cluster, plan)
    if cluster.device_groups:
        return _hetero_launch_script(model, cluster, plan, args, entry=entry)
    # torch/distributed/run.py: '--nnodes', '--nproc-per-node'/'--nproc_per_node', '--node-rank'/'--node_rank',
    # '--master-addr'/'--master_addr', '--master-port'/'--master_port' (static rendezvous).
    return f"""#!/usr/bin/env bash
{_header(model, cluster, plan)}
# Run on each of the {cluster.nodes} nodes: NODE_RANK=<0..{cluster.nodes - 1}> MASTER_ADDR=<node 0 address> ./launch.sh [extra flags]
set -euo pipefail

NNODES={cluster.nodes}
GPUS_PER_NODE={cluster.gpus_per_node}
if [[ -z "${{MASTER_ADDR:-}}" && $NNODES -gt 1 ]]; then
    echo "launch.sh: MASTER_ADDR is not set; using localhost (set it to node 0's address on every node)" >&2
fi
NODE_RANK="${{NODE_RANK:-0}}"
MASTER_ADDR="${{MASTER_ADDR:-localhost}}"
MASTER_PORT="${{MASTER_PORT:-29500}}"
MEGATRON_LM_DIR="${{MEGATRON_LM_DIR:-.}}"

{_env_block(plan)}

{_args_block(args)}

{_torchrun_exec(entry, _ALL_ARGS)}
"""


_ALL_ARGS = '"${MEGATRON_ARGS[@]}" \\\n    "$@"'


def _torchrun_exec(entry: str, args_expr: str) -> str:
    """``exec torchrun`` with an explicit node rank and torchrun's default static rendezvous on MASTER_ADDR."""
    return f"""exec torchrun \\
    --nnodes "$NNODES" \\
    --nproc_per_node "$GPUS_PER_NODE" \\
    --node_rank "$NODE_RANK" \\
    --master_addr "$MASTER_ADDR" \\
    --master_port "$MASTER_PORT" \\
    {_entry(entry)} \\
    {args_expr}"""


def sbatch_script(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, args: list[str], *,
                  entry: str = "pretrain_gpt.py", job_name: str | None = None, partition: str | None = None,
                  account: str | None = None, time_limit: str | None = None) -> str:
    """A Slurm batch script: one torchrun task per node, c10d rendezvous on the job's first host (on a cluster with
    device groups: a heterogeneous job, one component per group, node ranks bound to the groups)."""
    _check_world(cluster, plan)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", job_name or f"{model.name}-tp{plan.tp}pp{plan.pp}dp{plan.dp}").strip("-")
    if cluster.device_groups:
        return _hetero_sbatch_script(model, cluster, plan, args, entry=entry, job_name=name or "megatron",
                                     partition=partition, account=account, time_limit=time_limit)
    sbatch_lines = "\n".join(_sbatch_opts(name or "megatron", cluster.nodes, cluster.gpus_per_node, partition,
                                           account, time_limit))
    # torch/distributed/run.py: '--rdzv-backend'/'--rdzv_backend', '--rdzv-endpoint'/'--rdzv_endpoint',
    # '--rdzv-id'/'--rdzv_id' (c10d rendezvous: no node rank needed).
    return f"""#!/bin/bash
{sbatch_lines}
{_header(model, cluster, plan)}
# Submit with: sbatch launch.sbatch [extra flags]
set -euo pipefail

NNODES={cluster.nodes}
GPUS_PER_NODE={cluster.gpus_per_node}
if [[ "${{SLURM_JOB_NUM_NODES:-$NNODES}}" != "$NNODES" ]]; then
    echo "launch.sbatch: the plan needs $NNODES nodes but the job has $SLURM_JOB_NUM_NODES" >&2
    exit 1
fi
# First host of the allocation (sed reads all of scontrol's output: no SIGPIPE under pipefail).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
if [[ -z "$MASTER_ADDR" ]]; then
    echo "launch.sbatch: no host in SLURM_JOB_NODELIST=${{SLURM_JOB_NODELIST:-}}" >&2
    exit 1
fi
MASTER_PORT="${{MASTER_PORT:-29500}}"
MEGATRON_LM_DIR="${{MEGATRON_LM_DIR:-${{SLURM_SUBMIT_DIR:-.}}}}"

{_env_block(plan)}

{_args_block(args)}

srun --kill-on-bad-exit=1 torchrun \\
    --nnodes "$NNODES" \\
    --nproc_per_node "$GPUS_PER_NODE" \\
    --rdzv_id "$SLURM_JOB_ID" \\
    --rdzv_backend c10d \\
    --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\
    {_entry(entry)} \\
    "${{MEGATRON_ARGS[@]}}" \\
    "$@"
"""


def _sbatch_opts(name: str | None, nodes: int, gpus_per_node: int, partition: str | None, account: str | None,
                time_limit: str | None) -> list[str]:
    opts = ([f"#SBATCH --job-name={name}"] if name else []) + [
        f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={gpus_per_node}",
        "#SBATCH --exclusive"]
    for key, value in (("partition", partition), ("account", account), ("time", time_limit)):
        if value:
            opts.append(f"#SBATCH --{key}={_one_line(value).replace(' ', '')}")
    return opts


# Heterogeneous clusters ---------------------------------------------------------------------------
# torchrun's c10d rendezvous hands out node ranks in join order, so on a cluster of device groups nothing would
# keep pipeline stage 0 (the embedding, often the fullest stage) on the group the plan gave it. Both scripts
# therefore bind node ranks to groups: launch.sh from per-group host lists (HOSTS_<GROUP>), with torchrun's static
# rendezvous and an explicit --node_rank; launch.sbatch as a Slurm heterogeneous job (one '#SBATCH hetjob'
# component per group, its host lists from SLURM_JOB_NODELIST_HET_GROUP_<i>). Every node checks, before torchrun
# starts, that its group has the planned node count and that `nvidia-smi --query-gpu=name` reports the planned GPU
# type and count; otherwise it refuses with one line and exit code 2.
def _norm_gpu(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _group_bindings(cluster: ClusterSpec, plan: ParallelPlan) -> list[dict[str, Any]]:
    """Per device group in node order: name, host-list variable, GPU, nodes, first node rank, pipeline ranks held,
    accepted nvidia-smi names (normalised: lower case, letters and digits)."""
    from costmodel.profiles import load_profile

    groups = cluster.device_groups
    per_node = sorted({g.gpus_per_node for g in groups})
    if len(per_node) > 1:
        raise InputError(f"cluster {cluster.name}: device groups {', '.join(g.name for g in groups)} have different "
                         f"GPUs per node ({per_node}); one torchrun launch needs the same count on every node")
    if plan.pp > 1 and plan.rank_order != _DEFAULT_ORDER:
        raise InputError(f"plan rank_order={plan.rank_order!r} on the device groups of {cluster.name}: stages sit on "
                         f"groups only with pp outermost; valid: rank_order={_DEFAULT_ORDER!r}")
    stage_gpus = plan.world_size // plan.pp
    out, rank, gpus = [], 0, 0
    variables: set[str] = set()
    for g in groups:
        if g.num_gpus % stage_gpus:
            raise InputError(f"cluster {cluster.name}: group {g.name}'s {g.num_gpus} GPUs do not hold whole pipeline "
                             f"stages of tp*cp*dp = {stage_gpus} GPUs; valid: a plan whose stages fit the groups")
        var = "HOSTS_" + (re.sub(r"[^A-Za-z0-9]+", "_", g.name).strip("_").upper() or "GROUP")
        if var in variables:
            raise InputError(f"cluster {cluster.name}: group names map to the same host variable {var}; rename a group")
        variables.add(var)
        prof = load_profile(g.gpu)
        keys = sorted({_norm_gpu(n) for n in (prof.name, *prof.aliases, g.gpu) if _norm_gpu(n)})
        out.append({"name": g.name, "var": var, "gpu": g.gpu, "gpu_label": prof.name, "nodes": g.nodes,
                    "first_rank": rank, "stages": (gpus // stage_gpus, (gpus + g.num_gpus) // stage_gpus - 1),
                    "keys": keys})
        rank += g.nodes
        gpus += g.num_gpus
    return out


def _binding_line(b: dict[str, Any]) -> str:
    last = b["first_rank"] + b["nodes"] - 1
    s0, s1 = b["stages"]
    ranks = f"node rank {last}" if last == b["first_rank"] else f"node ranks {b['first_rank']}-{last}"
    stages = f"pipeline rank {s0}" if s0 == s1 else f"pipeline ranks {s0}-{s1}"
    return (f"{ranks}: group {_one_line(b['name'])} ({b['nodes']} nodes of {_one_line(b['gpu_label'])}), {stages}; "
            f"hosts in ${b['var']}")


def _node_step(prog: str, cluster: ClusterSpec, plan: ParallelPlan, entry: str, args_expr: str) -> str:
    """Bash that binds this node to its group and rank, checks its GPUs and execs torchrun (static rendezvous)."""
    binds = _group_bindings(cluster, plan)
    q = shlex.quote
    arrays = "\n".join([
        "GROUP_NAMES=(" + " ".join(q(b["name"]) for b in binds) + ")",
        "GROUP_VARS=(" + " ".join(b["var"] for b in binds) + ")",
        "GROUP_NODES=(" + " ".join(str(b["nodes"]) for b in binds) + ")",
        "GROUP_GPU=(" + " ".join(q(b["gpu_label"]) for b in binds) + ")",
        "# nvidia-smi names accepted per group (lower case, letters and digits only): the profile's name and aliases",
        "GROUP_GPU_KEYS=(" + " ".join(q(" ".join(b["keys"])) for b in binds) + ")",
    ])
    return f"""NNODES={cluster.nodes}
GPUS_PER_NODE={cluster.gpus_per_node}
{arrays}
refuse() {{ echo "{prog}: $*" >&2; exit 2; }}

# Node rank = position of this host in the group host lists, in pipeline order.
THIS_HOST="${{NODE_HOST:-${{SLURMD_NODENAME:-$(hostname)}}}}"
ALL_HOSTS=()
RANK_FOUND=""
GROUP=""
declare -A SEEN=()
for g in "${{!GROUP_NAMES[@]}}"; do
    var="${{GROUP_VARS[$g]}}"
    list="${{!var:-}}"
    read -r -a hosts <<< "${{list//,/ }}"
    if (( ${{#hosts[@]}} != GROUP_NODES[g] )); then
        refuse "group ${{GROUP_NAMES[$g]}} needs ${{GROUP_NODES[$g]}} ${{GROUP_GPU[$g]}} nodes but $var lists ${{#hosts[@]}} (\\"$list\\"); set $var to its ${{GROUP_NODES[$g]}} hosts"
    fi
    for h in "${{hosts[@]}}"; do
        [[ -z "${{SEEN[$h]:-}}" ]] || refuse "host $h is listed twice in ${{GROUP_VARS[*]}}"
        SEEN[$h]=1
        if [[ "$h" == "$THIS_HOST" || "$h" == "${{THIS_HOST%%.*}}" ]]; then
            RANK_FOUND=${{#ALL_HOSTS[@]}}
            GROUP=$g
        fi
        ALL_HOSTS+=("$h")
    done
done
[[ -n "$RANK_FOUND" ]] || refuse "this host ($THIS_HOST) is in none of ${{GROUP_VARS[*]}}; set NODE_HOST to its name there"
if [[ -n "${{NODE_RANK:-}}" && "$NODE_RANK" != "$RANK_FOUND" ]]; then
    refuse "NODE_RANK=$NODE_RANK but host $THIS_HOST is node rank $RANK_FOUND (group ${{GROUP_NAMES[$GROUP]}}); unset NODE_RANK"
fi
NODE_RANK=$RANK_FOUND

# This node's GPUs must be the group's type and count.
GPU_LIST="$(nvidia-smi --query-gpu=name --format=csv,noheader)" || refuse "nvidia-smi --query-gpu=name failed on $THIS_HOST"
mapfile -t GPU_NAMES <<< "$GPU_LIST"
if [[ -z "$GPU_LIST" ]] || (( ${{#GPU_NAMES[@]}} != GPUS_PER_NODE )); then
    refuse "host $THIS_HOST (node rank $NODE_RANK, group ${{GROUP_NAMES[$GROUP]}}) shows ${{#GPU_NAMES[@]}} GPUs in nvidia-smi; the plan needs $GPUS_PER_NODE ${{GROUP_GPU[$GROUP]}}"
fi
for name in "${{GPU_NAMES[@]}}"; do
    key="${{name,,}}"
    key="${{key//[^a-z0-9]/}}"
    if [[ " ${{GROUP_GPU_KEYS[$GROUP]}} " != *" $key "* ]]; then
        refuse "host $THIS_HOST is bound to node rank $NODE_RANK of group ${{GROUP_NAMES[$GROUP]}} (${{GROUP_GPU[$GROUP]}}) but nvidia-smi reports '$name'; list it under the group of that GPU"
    fi
done

MASTER_ADDR="${{MASTER_ADDR:-${{ALL_HOSTS[0]}}}}"
MASTER_PORT="${{MASTER_PORT:-29500}}"
echo "{prog}: host $THIS_HOST is node rank $NODE_RANK of $NNODES (group ${{GROUP_NAMES[$GROUP]}}, ${{#GPU_NAMES[@]}} x ${{GPU_NAMES[0]}}); master $MASTER_ADDR:$MASTER_PORT" >&2

# Static rendezvous (torchrun's default without --rdzv-backend): the node rank is the one bound above.
{_torchrun_exec(entry, args_expr)}"""


def _hetero_launch_script(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, args: list[str], *,
                          entry: str) -> str:
    binds = _group_bindings(cluster, plan)
    example = " ".join(b["var"] + '="' + " ".join(f"{b['name']}-{i}" for i in range(b["nodes"])) + '"' for b in binds)
    return f"""#!/usr/bin/env bash
{_header(model, cluster, plan)}
# Run on each of the {cluster.nodes} nodes with the same host lists (space or comma separated, in node order), e.g.
#   {example} ./launch.sh [extra flags]
# Each node finds its rank in the lists (NODE_HOST overrides `hostname`); MASTER_ADDR defaults to the first host.
set -euo pipefail

MEGATRON_LM_DIR="${{MEGATRON_LM_DIR:-.}}"

{_env_block(plan)}

{_args_block(args)}

{_node_step("launch.sh", cluster, plan, entry, _ALL_ARGS)}
"""


def _hetero_sbatch_script(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, args: list[str], *,
                          entry: str, job_name: str, partition: str | None, account: str | None,
                          time_limit: str | None) -> str:
    binds = _group_bindings(cluster, plan)
    opts: list[str] = []
    for i, (b, g) in enumerate(zip(binds, cluster.device_groups)):
        if i:
            opts.append("#SBATCH hetjob")
        opts += _sbatch_opts(job_name if i == 0 else None, g.nodes, g.gpus_per_node, partition, account, time_limit)
    comps = ", ".join(f"{i}: {b['name']} ({b['nodes']} x {b['gpu_label']})" for i, b in enumerate(binds))
    hosts = "\n".join(
        f'{b["var"]}="$(scontrol show hostnames "${{SLURM_JOB_NODELIST_HET_GROUP_{i}:-}}" | paste -sd " " -)"\n'
        f'export {b["var"]}' for i, b in enumerate(binds))
    counts = "\n".join(
        f'read -r -a _h <<< "${b["var"]}"\n'
        f'(( ${{#_h[@]}} == {b["nodes"]} )) || refuse "component {i} ({b["name"]}) has ${{#_h[@]}} nodes but the plan '
        f'needs {b["nodes"]} {b["gpu_label"]} nodes"' for i, b in enumerate(binds))
    first = binds[0]["var"]
    step = _node_step("launch.sbatch", cluster, plan, entry, '"$@"')
    return f"""#!/bin/bash
{chr(10).join(opts)}
{_header(model, cluster, plan)}
# A Slurm heterogeneous job, one component per device group in pipeline order ({comps}).
# Add to each component the --partition / --constraint / --gres that selects that group's nodes on your site.
# Submit with: sbatch launch.sbatch [extra flags]
set -euo pipefail

refuse() {{ echo "launch.sbatch: $*" >&2; exit 2; }}
if [[ "${{SLURM_HET_SIZE:-1}}" != "{len(binds)}" ]]; then
    refuse "the plan needs a heterogeneous job of {len(binds)} components ({comps}) but the job has ${{SLURM_HET_SIZE:-1}}; submit this file with sbatch (its '#SBATCH hetjob' lines make them)"
fi
# The hosts of each component (sed/paste read all of scontrol's output: no SIGPIPE under pipefail).
{hosts}
{counts}
read -r -a _h <<< "${first}"
export MASTER_ADDR="${{_h[0]}}"
export MASTER_PORT="${{MASTER_PORT:-29500}}"
export MEGATRON_LM_DIR="${{MEGATRON_LM_DIR:-${{SLURM_SUBMIT_DIR:-.}}}}"

{_env_block(plan)}

{_args_block(args)}

# Run on every node of every component: bind the node, check its GPUs, start torchrun.
NODE_STEP="$(cat <<'NODE_STEP_EOF'
set -euo pipefail
{step}
NODE_STEP_EOF
)"
srun --het-group={",".join(str(i) for i in range(len(binds)))} --kill-on-bad-exit=1 bash -c "$NODE_STEP" launch.sbatch-node \\
    "${{MEGATRON_ARGS[@]}}" \\
    "$@"
"""


# Writing ----------------------------------------------------------------------------------------
def _jsonable(obj: Any) -> Any:
    if obj is None:
        return None
    # model_dump_json writes inf/nan as null (strict JSON), unlike json.dumps of model_dump().
    return json.loads(obj.model_dump_json())


def write_outputs(out_dir: str | os.PathLike, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                  estimate: StepEstimate | None, *, layout: str | None = None,
                  extra: dict[str, Any] | None = None, figures: dict[str, Writer] | None = None) -> list[Path]:
    """Write plan.json, megatron_args.txt, launch.sh (executable) and launch.sbatch into ``out_dir``, and
    ``figures`` (name -> a function drawing the file at a path, e.g. report.png).

    Everything is rendered first, then written by :func:`write_files_atomic` (temporary files in
    ``out_dir``, renamed into place), so a failure leaves nothing half-written. ``extra`` adds top-level
    keys to plan.json. Returns the paths of the four files.
    """
    args = megatron_args(model, plan, layout=layout, transformer_engine=transformer_engine_runs(cluster))
    data: dict[str, Any] = {"model": _jsonable(model), "cluster": _jsonable(cluster), "plan": _jsonable(plan),
                            "estimate": _jsonable(estimate)}
    if layout is not None:
        data["layout"] = layout
    for key, value in (extra or {}).items():
        if key in data:
            raise ValueError(f"extra key {key!r} would overwrite plan.json's {key!r}")
        data[key] = value
    contents: dict[str, Writer] = {
        "plan.json": json.dumps(data, indent=1, allow_nan=False) + "\n",
        "megatron_args.txt": "\n".join(args) + "\n",
        "launch.sh": launch_script(model, cluster, plan, args, entry=entry_script(model)),
        "launch.sbatch": sbatch_script(model, cluster, plan, args, entry=entry_script(model)),
        **(figures or {}),
    }
    write_files_atomic(out_dir, contents, executable=("launch.sh",), create=True)
    return [Path(out_dir) / name for name in OUTPUT_FILES]
