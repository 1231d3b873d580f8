"""Specs shared by every room of the house: model, cluster and the estimates (the plan: costmodel/plan.py).

All specs are frozen pydantic v2 models. Units are in the field names (``_bytes``, ``_s``,
``_bytes_per_s``, ``_flops``); degrees are named ``tp pp vpp dp cp ep etp`` as in Megatron.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

Precision = Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32", "tf32"]
RecomputeMode = Literal["none", "selective", "full", "offload"]
Finetune = Literal["full", "lora"]
FINETUNE: tuple[str, ...] = get_args(Finetune)
Optimizer = Literal["adam", "muon"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
Topology = Literal["fat-tree", "rail-optimised", "torus"]
Framework = Literal["megatron-core", "megatron-lm-2021", "megatron-lm-2020", "paxml", "other", "other-async-tp",
                    "other-2022"]
Activation = Literal["swiglu", "geglu", "quick_geglu", "gelu", "gelu_tanh", "squared_relu", "relu", "silu"]
Normalization = Literal["RMSNorm", "LayerNorm", "LayerNorm1p"]
GATED_ACTIVATIONS = ("swiglu", "geglu", "quick_geglu")
# Layer kinds of a hybrid model's pattern (ModelSpec.hybrid_pattern): megatron-core's Symbols and what each is.
HYBRID_KINDS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}
HYBRID_SYMBOLS = "".join(HYBRID_KINDS)

PRECISION_ALIASES: dict[str, str] = {
    "fp32": "fp32",     # plain fp32 training (the executor on CPUs without bf16 arithmetic)
    "tf32": "tf32",     # fp32 tensors, GEMMs on TF32 tensor cores (Ampere and newer; fp32 rate on V100)
    "bf16": "bf16",
    "bf16-mixed": "bf16",
    "fp16": "fp16",
    "fp16-mixed": "fp16",
    "fp8": "fp8",
    "fp8-cs": "fp8",
    "fp8-ds": "fp8",
    "fp8_unspecified": "fp8",
    "fp8-mixed": "fp8",
    "mxfp8": "mxfp8",
    "nvfp4": "nvfp4",
}


INT64_MAX = 2**63 - 1


def _no_bool(v):
    """YAML's true/false are not numbers (pydantic would take true as 1)."""
    if isinstance(v, bool):
        raise ValueError("expected a number, not true/false")
    return v


# Sizes beyond these overflow the cost model's int64/float64 arithmetic long before they mean a model:
# 1e15 parameters is ~2,000x the largest model trained so far, 2**24 tokens 16x the longest context.
MAX_PARAMS = 10**15
MAX_SEQ_LEN = 2**24


def _int(lo: int, hi: int = INT64_MAX):
    return Annotated[int, BeforeValidator(_no_bool), Field(ge=lo, le=hi)]


def _float(lo: float, hi: float, *, gt: bool = False):
    bound = {"gt": lo} if gt else {"ge": lo}
    return Annotated[float, BeforeValidator(_no_bool), Field(le=hi, allow_inf_nan=False, **bound)]


# Checked numbers for everything read from files: integers within int64 (the cost model's arrays are
# int64/float64), finite floats in a physical range, and no booleans where a number is expected.
Count = _int(1)
"""A positive integer within int64."""
Count0 = _int(0)
"""A non-negative integer within int64."""
Bandwidth = _float(1e6, 1e15)
"""Bytes per second: finite, from 1 MB/s (a loaded CPU host) to 1 PB/s."""
Seconds = _float(0.0, 3600.0)
"""A latency: finite, 0 to an hour."""
Money = _float(0.0, 1e6)
"""A price in USD: finite and >= 0."""
GpusPerNode = _int(1, 1024)
"""GPUs (or CPU ranks) in one node."""
Nodes = _int(1, 1_000_000)
"""Nodes of a cluster."""
DomainGpus = _int(1, 1_000_000)
"""GPUs in one NVLink domain."""


def _domain_ok(domain: int | None, gpus_per_node: int, num_gpus: int, where: str = "") -> None:
    """An NVLink domain is a divisor of the node (several domains per node) or whole nodes (NVL72 racks),
    and no larger than the cluster."""
    if domain is None:
        return
    if gpus_per_node % domain and domain % gpus_per_node:
        raise ValueError(f"{where}nvlink_domain_gpus={domain} with gpus_per_node={gpus_per_node}: valid are the "
                         f"divisors of gpus_per_node and its multiples (whole nodes)")
    if domain > num_gpus:
        raise ValueError(f"{where}nvlink_domain_gpus={domain} exceeds the cluster's {num_gpus} GPUs")


class FrozenSpec(BaseModel):
    """Base of every spec: immutable, and unknown fields are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class RopeScaling(FrozenSpec):
    """Rotary-embedding frequency scaling, as a Hugging Face config's ``rope_scaling`` states it."""

    type: Literal["yarn", "llama3", "linear"]
    """yarn (DeepSeek-V3, gpt-oss), llama3 (Llama 3.1 / 3.2) or linear (position interpolation)."""
    factor: float = Field(gt=0)
    """Context extension factor."""
    original_max_position_embeddings: Count | None = None
    """Context length the frequencies were trained for (yarn, llama3)."""
    beta_fast: float = 32.0
    """yarn: high-frequency boundary (rotations)."""
    beta_slow: float = 1.0
    """yarn: low-frequency boundary (rotations)."""
    mscale: float = 1.0
    """yarn: attention-temperature coefficient."""
    mscale_all_dim: float = 0.0
    """yarn: attention-temperature coefficient applied to all dimensions (DeepSeek's mscale_all_dim)."""
    low_freq_factor: float = 1.0
    """llama3: low-frequency wavelength factor."""
    high_freq_factor: float = 4.0
    """llama3: high-frequency wavelength factor."""


class ModelSpec(FrozenSpec):
    """A decoder-only transformer (GPT / Llama / MoE family), or a hybrid of Mamba-2, attention, MLP and MoE layers
    (``hybrid_pattern``: Nemotron-H, Nemotron 3), as Megatron builds it.

    The architectural facts below the shape (positions, normalisation, activation, biases, router) change
    numerics but not the cost model's figures; ``planner/outputs.py`` turns every one into Megatron-LM flags.
    ``activation``, ``normalization``, ``linear_bias`` and the dropouts default from ``gated_mlp`` (SwiGLU +
    RMSNorm + no biases + no dropout, or GELU + LayerNorm + biases + dropout 0.1), as Megatron's flags were
    written before they were fields.
    """

    name: str = "custom"
    """Catalog name or a free label."""
    layers: Count
    """Number of transformer layers."""
    hidden: Count
    """Model (residual stream) width h."""
    ffn_hidden: Count
    """FFN width of a dense layer (for MoE models: the width of the dense layers, if any)."""
    heads: Count
    """Number of query attention heads a."""
    kv_heads: Count | None = None
    """Number of key/value heads (GQA); None means multi-head attention (= heads)."""
    head_dim: Count | None = None
    """Per-head width; None means hidden / heads."""
    vocab: Count
    """Vocabulary size (padded as Megatron pads it is close enough for costing)."""
    seq_len: Count
    """Training sequence length s (tokens)."""
    gated_mlp: bool = True
    """SwiGLU-style gated MLP (three weight matrices) instead of the GPT two-matrix MLP."""
    tied_embeddings: bool = False
    """Input embedding and LM head share one matrix."""
    learned_position_embeddings: bool = False
    """GPT-2/3 style learned absolute position embedding table (s x h); False = rotary embeddings."""
    activation: Activation = "swiglu"
    """MLP activation: swiglu / geglu / quick_geglu are gated (gated_mlp), the others are not."""
    activation_clamp: float | None = Field(default=None, gt=0)
    """Clamp of the activation's inputs (gpt-oss swiglu_limit); None = no clamp."""
    glu_linear_offset: float = 0.0
    """Offset added to the linear half of a gated activation: act(x1) * (x2 + offset) (gpt-oss: 1)."""
    normalization: Normalization = "RMSNorm"
    """Layer normalisation: RMSNorm, LayerNorm, or LayerNorm1p (LayerNorm with zero-centred gamma)."""
    norm_epsilon: float = Field(default=1e-5, gt=0)
    """Epsilon of every normalisation (HF rms_norm_eps / layer_norm_eps)."""
    qk_norm: bool = False
    """Normalisation of queries and keys per head (Qwen3) or of the compressed q / kv latents (MLA)."""
    linear_bias: bool = False
    """Biases on every linear layer (attention and MLP); the cost model counts none either way."""
    qkv_bias: bool = False
    """Biases on the query / key / value projections only (Qwen2); implied by linear_bias."""
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the attention probabilities during training (default 0, or 0.1 without gated_mlp)."""
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the residual-branch outputs during training (default 0, or 0.1 without gated_mlp)."""
    rotary_base: float = Field(default=10000.0, gt=0)
    """Rotary embedding base theta (HF rope_theta)."""
    rotary_percent: float = Field(default=1.0, gt=0, le=1)
    """Share of each head's dimensions that get rotary embeddings (HF partial_rotary_factor)."""
    rope_scaling: RopeScaling | None = None
    """Rotary frequency scaling (YaRN, Llama 3.1); None = plain rotary embeddings."""
    num_experts: Count0 = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    moe_topk: Count0 = 0
    """Routed experts each token goes to."""
    moe_ffn_hidden: Count | None = None
    """FFN width of one routed expert."""
    shared_experts: Count0 = 0
    """Shared (always-on) experts per MoE layer, each of width moe_ffn_hidden."""
    dense_layers: Count0 = 0
    """Leading dense layers before the MoE layers (DeepSeek's first_k_dense_replace)."""
    moe_layer_step: Count = 1
    """After the leading dense layers, MoE on every ``moe_layer_step``-th layer and dense MLPs on the others: layer
    i (from 0) is MoE when (i + 1) is a multiple of it, as HF's ``interleave_moe_layer_step`` (Llama 4 Maverick: 2,
    Megatron-Bridge's ``moe_layer_freq=[0, 1] * 24``) and ``decoder_sparse_step`` count; 1 = every layer."""
    moe_router_score: Literal["softmax", "sigmoid"] = "softmax"
    """Router score function (DeepSeek-V3 scoring_func sigmoid)."""
    moe_router_norm_topk: bool = True
    """The top-k routing weights are renormalised to sum to 1 (HF norm_topk_prob; softmax over the top-k)."""
    moe_router_expert_bias: bool = False
    """Aux-loss-free balancing: a per-expert bias added to the scores for selection (DeepSeek-V3 noaux_tc)."""
    moe_router_topk_scaling: float = Field(default=1.0, gt=0)
    """Factor on the routing weights (DeepSeek-V3 routed_scaling_factor 2.5)."""
    moe_router_groups: Count | None = None
    """Group-limited routing: experts fall into this many groups (DeepSeek-V3 n_group); None = no groups."""
    moe_router_group_topk: Count | None = None
    """Group-limited routing: groups each token may use (DeepSeek-V3 topk_group)."""
    moe_token_drop: bool = False
    """Token-drop MoE: each expert takes at most its capacity and is padded to it (Megatron
    --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity). The shapes are static, so no token
    counts go to the host and the MoE layers can be captured in CUDA graphs (megatron-core
    transformer/moe/README.md, "CUDA Graph Support"); False: dropless, the default."""
    mtp_layers: Count0 = 0
    """Multi-token-prediction modules (DeepSeek-V3's num_nextn_predict_layers, Megatron --mtp-num-layers).
    Each adds one transformer layer of the model's last kind and a 2h->h projection, and runs the shared
    output layer and loss once more; megatron-core places them on the last pipeline stage."""
    mla_kv_lora_rank: Count | None = None
    """Multi-head latent attention: compressed KV rank (DeepSeek-V2/V3); None = standard attention."""
    mla_q_lora_rank: Count | None = None
    """Multi-head latent attention: compressed Q rank (None = no Q compression)."""
    mla_rope_dim: Count0 = 64
    """Multi-head latent attention: decoupled RoPE head width."""
    mla_v_head_dim: Count | None = None
    """Multi-head latent attention: value head width (None = head_dim)."""
    hybrid_pattern: str | None = None
    """A hybrid model's layers as Megatron's ``--hybrid-override-pattern`` writes them, one character a layer: ``M``
    a Mamba-2 mixer, ``*`` self-attention, ``-`` an MLP, ``E`` a MoE (Nemotron-H, Nemotron 3; megatron-core
    ``ssm/mamba_hybrid_layer_allocation.py``). Each such layer is one block (norm, that mixer or MLP, residual), so
    ``layers`` is the pattern's length. None: every layer is attention plus an MLP (or a MoE)."""
    mamba_heads: Count | None = None
    """Mamba-2 heads of a hybrid model's ``M`` layers (megatron-core --mamba-num-heads); inner width heads x
    mamba_head_dim."""
    mamba_head_dim: Count = 64
    """Mamba-2 head width P (--mamba-head-dim)."""
    mamba_state_dim: Count = 128
    """Mamba-2 state width N (--mamba-state-dim)."""
    mamba_groups: Count = 8
    """Mamba-2 groups sharing one B and C projection (--mamba-num-groups)."""
    moe_latent: Count | None = None
    """LatentMoE (Nemotron 3 Super, --moe-latent-size): routed experts work in this width; each token is projected
    down to it before the dispatch and back after the combine. None: experts take the model width."""
    precision: Precision = "bf16"
    """Training precision of the GEMMs: bf16, fp16 (mixed), fp8 (Hopper tensor/delayed scaling), mxfp8, nvfp4."""
    finetune: Finetune = "full"
    """What the step trains: every weight ("full": pretraining, SFT) or low-rank adapters on frozen weights
    ("lora": LoRA, Hu et al. 2021, arXiv:2106.09685). Frozen weights get no weight gradient (the backward runs
    the data-gradient GEMMs only), no gradient reduction, no optimizer state and no optimizer step; the adapters
    (rank r << hidden) are left out of the costs."""
    optimizer: Optimizer = "adam"
    """The optimizer of the weight matrices: Adam ("adam", mixed precision: fp32 master weight and two moments), or
    Muon ("muon": momentum orthogonalised by Newton-Schulz iterations; Kimi K2, Moonlight), as megatron-core
    0.16.1 runs it (optimizer/muon.py, layer_wise_optimizer.py; Newton-Schulz from NVIDIA's
    emerging_optimizers): every 2-D weight but the embedding and output layer steps with Muon (one fp32
    momentum, no second moment), the rest with Adam. The iterations are GEMMs on each matrix a rank owns
    (costmodel/muon.py); with the distributed optimizer the matrices are dealt whole to the data-parallel ranks
    (Megatron's layer-wise distributed optimizer, --optimizer dist_muon), which all-reduce the gradients and
    all-gather the updated weights after the step."""
    unexpressed: tuple[str, ...] = ()
    """Architectural facts of the source (a config.json, or the catalog's citation) that no field above holds;
    megatron_args.txt names them in a '# not expressed:' line. Empty for a model the planner fully expresses."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_gated(cls, data):
        # GPT-era (ungated) models: GELU, LayerNorm, biases and Megatron's default dropout 0.1, which is what the
        # cost model assumes for them (costmodel/memory.py: dropout masks only without gated_mlp).
        derived = ("activation", "normalization", "linear_bias", "attention_dropout", "hidden_dropout")
        if isinstance(data, dict) and not set(derived) <= data.keys():
            gated = data.get("gated_mlp", True) is not False
            data = dict(data)
            for key, value in zip(derived, ("swiglu", "RMSNorm", False, 0.0, 0.0) if gated
                                  else ("gelu", "LayerNorm", True, 0.1, 0.1)):
                data.setdefault(key, value)
        return data

    @field_validator("precision", mode="before")
    @classmethod
    def _alias_precision(cls, v: str) -> str:
        key = str(v).strip().lower()
        if key in PRECISION_ALIASES:
            return PRECISION_ALIASES[key]
        raise ValueError(f"unknown precision {v!r}; valid: {sorted(set(PRECISION_ALIASES))}")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_experts:
            if not self.moe_topk or self.moe_topk > self.num_experts:
                raise ValueError(
                    f"moe_topk={self.moe_topk} must be in 1..num_experts={self.num_experts}"
                )
            if self.dense_layers > self.layers:
                raise ValueError(f"dense_layers={self.dense_layers} exceeds layers={self.layers}")
        if self.moe_layer_step > 1:
            if not self.num_experts or self.hybrid_pattern is not None:
                raise ValueError(f"moe_layer_step={self.moe_layer_step} needs an MoE transformer (num_experts > 0, "
                                 f"no hybrid_pattern: write a hybrid's MoE layers (E) into the pattern); valid: 1")
            if not self.moe_layers:
                raise ValueError(f"moe_layer_step={self.moe_layer_step} with dense_layers={self.dense_layers} leaves "
                                 f"no MoE layer among layers={self.layers}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.gated_mlp != (self.activation in GATED_ACTIVATIONS):
            raise ValueError(f"activation={self.activation!r} is {'' if self.gated_mlp else 'not '}expected with "
                             f"gated_mlp={self.gated_mlp}; gated: {', '.join(GATED_ACTIVATIONS)}")
        if self.moe_router_expert_bias and self.moe_router_score != "sigmoid":
            raise ValueError("moe_router_expert_bias needs moe_router_score='sigmoid'")
        if (self.moe_router_groups is None) != (self.moe_router_group_topk is None):
            raise ValueError("moe_router_groups and moe_router_group_topk go together (group-limited routing)")
        if self.moe_router_groups is not None:
            if not self.num_experts or self.num_experts % self.moe_router_groups:
                raise ValueError(f"moe_router_groups={self.moe_router_groups} must divide "
                                 f"num_experts={self.num_experts}")
            if self.moe_router_group_topk > self.moe_router_groups:
                raise ValueError(f"moe_router_group_topk={self.moe_router_group_topk} exceeds "
                                 f"moe_router_groups={self.moe_router_groups}")
        if self.hybrid_pattern is not None:
            self._check_hybrid()
        if self.seq_len > MAX_SEQ_LEN:
            raise ValueError(f"seq_len={self.seq_len} is beyond the {MAX_SEQ_LEN:,} tokens the cost model takes")
        width = max(self.ffn_hidden, self.expert_ffn * (self.num_experts + self.shared_experts))
        attn = max(self.hidden, self.heads * (self.head_dim or 1), self.kv_head_count * (self.head_dim or 1))
        params = self.layers * self.hidden * (4 * attn + 3 * width) + 2 * self.vocab * self.hidden
        if params > MAX_PARAMS:
            raise ValueError(f"about {float(params):.3g} parameters (layers, widths, experts and vocab): beyond the "
                             f"{MAX_PARAMS:.0e} the cost model takes")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} does not divide hidden={self.hidden}: give head_dim, or heads "
                             f"that divide hidden")
        return self

    def _check_hybrid(self) -> None:
        pattern = self.hybrid_pattern
        bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if bad or not pattern:
            raise ValueError(f"hybrid_pattern {pattern!r}: one character a layer, each of {HYBRID_SYMBOLS!r} "
                             f"({', '.join(f'{k} {v}' for k, v in HYBRID_KINDS.items())})")
        if len(pattern) != self.layers:
            raise ValueError(f"hybrid_pattern has {len(pattern)} layers, layers={self.layers}; give the same count")
        if ("E" in pattern) != bool(self.num_experts):
            raise ValueError("hybrid_pattern: MoE layers (E) need num_experts and num_experts needs an E layer")
        if self.dense_layers:
            raise ValueError("dense_layers does not apply with hybrid_pattern: write the MLP layers (-) into it")
        if "M" in pattern:
            if not self.mamba_heads:
                raise ValueError("hybrid_pattern has Mamba layers (M): give mamba_heads")
            if self.mamba_heads % self.mamba_groups:
                raise ValueError(f"mamba_groups={self.mamba_groups} does not divide mamba_heads={self.mamba_heads}")

    # Derived shapes -----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads or self.heads

    @property
    def hybrid_counts(self) -> dict[str, int]:
        """Layers of each kind of a hybrid model (M Mamba-2, * attention, - MLP, E MoE); {} for a transformer."""
        return {k: self.hybrid_pattern.count(k) for k in HYBRID_SYMBOLS} if self.hybrid_pattern else {}

    @property
    def moe_layers(self) -> int:
        return int(self.moe_before(self.layers))

    def moe_before(self, j):
        """MoE layers among the first ``j`` (an int or an array of them, as floats too): the leading
        ``dense_layers`` dense, then every ``moe_layer_step``-th. A hybrid's layers all count (its pattern says
        which mix what)."""
        if not self.is_moe:
            return np.zeros_like(j)
        step = self.moe_layer_step
        return np.maximum(np.floor_divide(j, step) - self.dense_layers // step, 0)

    def dense_prefix(self) -> np.ndarray:
        """Dense layers among the first j, j = 0..layers (a hybrid's: none)."""
        j = np.arange(self.layers + 1)
        return j - self.moe_before(j)

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (from 0) holds the experts."""
        return bool(self.moe_before(i + 1) - self.moe_before(i))

    def moe_mask(self) -> list[bool]:
        """Whether each layer holds the experts, layer by layer."""
        return np.diff(self.moe_before(np.arange(self.layers + 1))).astype(bool).tolist()

    def moe_layer_freq(self) -> list[int] | None:
        """Megatron's ``--moe-layer-freq`` as a list, one 0 (dense) or 1 (MoE) a layer; None when every layer is
        MoE (the default, 1) or the model is dense."""
        if not self.is_moe or self.moe_layers == self.layers:
            return None
        return [int(x) for x in self.moe_mask()]

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    def architecture_key(self) -> str:
        """The network's shape, the same for one model at any sequence length, precision or name, and with its
        vocabulary padded for any tp (Megatron pads it to a multiple of 128 x tp, so a log's differs from the
        catalog's): what a calibrated profile remembers of the models it was measured on
        (Calibration.measured_models)."""
        key = f"L{self.layers} h{self.hidden} ffn{self.ffn_hidden} a{self.heads}/{self.kv_head_count}"
        if self.is_moe:
            key += f" moe{self.num_experts}x{self.expert_ffn} top{self.moe_topk} shared{self.shared_experts}"
            if self.moe_layer_step > 1:
                key += f" every{self.moe_layer_step}"
        if self.mla_kv_lora_rank:
            key += f" mla{self.mla_kv_lora_rank}"
        if self.hybrid_pattern:
            key += f" hybrid {self.hybrid_pattern} mamba{self.mamba_heads}x{self.mamba_head_dim}"
        if self.moe_latent:
            key += f" latent{self.moe_latent}"
        return key


def moe_layout(mask) -> dict[str, int] | None:
    """The ``dense_layers`` and ``moe_layer_step`` that place MoE layers where ``mask`` (one 0 / 1 a layer, 1 =
    MoE) has them, the smallest step that does; None when none does (MoE on layers 0, 2, 4, ...: Megatron's
    integer --moe-layer-freq 2, a first layer with experts and a dense one after it)."""
    mask = [int(bool(x)) for x in mask]
    moe = [i for i, x in enumerate(mask) if x]
    if not moe:
        return None
    for step in range(1, len(mask) + 1):
        dense = max(moe[0] - step + 1, 0)
        if all(x == (i >= dense and (i + 1) % step == 0) for i, x in enumerate(mask)):
            return {"dense_layers": dense, "moe_layer_step": step}
    return None


class InterNodeFabric(FrozenSpec):
    """The scale-out network between NVLink domains."""

    name: str = "InfiniBand NDR"
    """Fabric name, for reports."""
    nic_bandwidth_bytes_per_s: Bandwidth
    """Unidirectional NIC bandwidth per GPU (400 Gb/s NDR = 50e9)."""
    rails: GpusPerNode = 8
    """NICs (rails) per node."""
    latency_s: Seconds = 5e-6
    """One-hop latency of a small message across the fabric."""
    oversubscription: _float(1.0, 1e3) = 1.0
    """Core oversubscription of the fat tree (1.0 = full bisection): the links above a full-bisection block
    carry 1/oversubscription of what its GPUs' NICs can send."""
    full_bisection_nodes: Nodes = 32
    """Nodes in one full-bisection block (32: a leaf, or rail, switch of a two-tier fat tree such as a DGX
    SuperPOD scalable unit; a pod of a three-tier Clos, e.g. 384 for Meta's 3,072-GPU pods). Traffic between
    blocks meets ``oversubscription`` (costmodel/comm.py core_share)."""


class IntraNodeFabric(FrozenSpec):
    """The scale-up fabric inside one NVLink domain."""

    name: str = "NVLink"
    """Fabric name, for reports."""
    bandwidth_bytes_per_s: Bandwidth | None = None
    """Unidirectional bandwidth per GPU; None takes the GPU profile's NVLink figure."""


class DeviceGroup(FrozenSpec):
    """One homogeneous part of a heterogeneous cluster."""

    name: str
    """Label used in plans and reports."""
    gpu: str
    """Hardware profile name of this group's GPUs."""
    nodes: Nodes
    """Nodes in the group."""
    gpus_per_node: GpusPerNode
    """GPUs per node in the group."""
    nvlink_domain_gpus: DomainGpus | None = None
    """GPUs in one NVLink domain of this group; None = gpus_per_node."""
    intra_node: IntraNodeFabric | None = None
    """Scale-up fabric of this group; None = the cluster's."""
    inter_node: InterNodeFabric | None = None
    """Scale-out fabric of this group's nodes; None = the cluster's."""
    price_per_gpu_hour_usd: Money | None = None
    """Price of one GPU-hour of this group; None = the cluster's."""

    @model_validator(mode="after")
    def _domain(self) -> DeviceGroup:
        _domain_ok(self.nvlink_domain_gpus, self.gpus_per_node, self.num_gpus)
        return self

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class InterGroupLink(FrozenSpec):
    """What joins the device groups of a heterogeneous cluster (pipeline hops between groups cross it)."""

    name: str = "inter-group link"
    """Label for reports."""
    bandwidth_bytes_per_s: Bandwidth
    """Unidirectional bandwidth per GPU for traffic between groups (also accepted as bandwidth_gbps, Gb/s)."""
    latency_s: Seconds = 5e-6
    """One-hop latency between groups."""
    shared: bool = False
    """True: the bandwidth is one link shared by every rank whose traffic crosses it (not per GPU)."""

    @model_validator(mode="before")
    @classmethod
    def _gbps(cls, data):
        if isinstance(data, dict) and "bandwidth_gbps" in data:
            data = dict(data)
            gbps = data.pop("bandwidth_gbps")
            if "bandwidth_bytes_per_s" in data:
                raise ValueError("give bandwidth_gbps or bandwidth_bytes_per_s, not both")
            if not isinstance(gbps, (int, float)) or isinstance(gbps, bool) or gbps <= 0:
                raise ValueError(f"bandwidth_gbps={gbps!r} must be a positive number (Gb/s)")
            data["bandwidth_bytes_per_s"] = float(gbps) * 1e9 / 8
        return data


class ClusterSpec(FrozenSpec):
    """A training cluster: how many GPUs of which profile, joined by which fabrics."""

    name: str = "cluster"
    """Label for reports."""
    gpu: str
    """Hardware profile name (a file in hardware_profiles/gpus/, or an alias of one)."""
    nodes: Nodes
    """Number of nodes (servers, or trays for NVL racks)."""
    gpus_per_node: GpusPerNode = 8
    """GPUs per node."""
    nvlink_domain_gpus: DomainGpus | None = None
    """GPUs in one NVLink domain (72 for a GB200 NVL72 rack); None = gpus_per_node."""
    intra_node: IntraNodeFabric = IntraNodeFabric()
    """Scale-up fabric."""
    inter_node: InterNodeFabric
    """Scale-out fabric."""
    topology: Topology = "rail-optimised"
    """Shape of the scale-out network."""
    price_per_gpu_hour_usd: Money | None = None
    """Price of one GPU-hour, for cost estimates."""
    storage_bandwidth_bytes_per_s: Bandwidth = 100e9
    """Aggregate checkpoint storage write bandwidth."""
    device_groups: tuple[DeviceGroup, ...] = ()
    """Heterogeneous clusters: the groups (empty for a homogeneous cluster)."""
    inter_group_link: InterGroupLink | None = None
    """Heterogeneous clusters: the link between groups; None = the scale-out fabric (inter_node)."""

    @model_validator(mode="before")
    @classmethod
    def _from_groups(cls, data):
        """With device_groups, gpu / nodes / gpus_per_node / inter_node may be left out: they describe the
        first group (and nodes counts every group's nodes). Files without device_groups are untouched."""
        if not isinstance(data, dict) or not data.get("device_groups"):
            return data
        groups = data["device_groups"]
        if not isinstance(groups, (list, tuple)):
            return data
        get = lambda g, k: g.get(k) if isinstance(g, dict) else getattr(g, k, None)  # noqa: E731
        first = groups[0]
        data = dict(data)
        data.setdefault("gpu", get(first, "gpu"))
        data.setdefault("gpus_per_node", get(first, "gpus_per_node"))
        nodes = [get(g, "nodes") for g in groups]
        if all(isinstance(x, int) for x in nodes):
            data.setdefault("nodes", sum(nodes))
        if "inter_node" not in data and get(first, "inter_node") is not None:
            data["inter_node"] = get(first, "inter_node")
        return data

    @model_validator(mode="after")
    def _groups_ok(self) -> ClusterSpec:
        names = [g.name for g in self.device_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"device group names {names} are not unique")
        if self.inter_group_link is not None and not self.device_groups:
            raise ValueError("inter_group_link needs device_groups")
        if not self.device_groups:
            _domain_ok(self.nvlink_domain_gpus, self.gpus_per_node, self.num_gpus)
        return self

    @property
    def num_gpus(self) -> int:
        if self.device_groups:
            return sum(g.num_gpus for g in self.device_groups)
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        return self.nvlink_domain_gpus or self.gpus_per_node


class StepEstimate(FrozenSpec):
    """Predicted step of one plan: time, its breakdown, throughput and memory."""

    step_time_s: float
    """Wall time of one optimizer step."""
    step_time_lower_s: float
    """Lower bound: every overlappable communication fully hidden."""
    step_time_upper_s: float
    """Upper bound: no communication overlapped."""
    breakdown_s: dict[str, float]
    """Seconds per component (compute, recompute, bubble, exposed comm per group, optimizer, ...)."""
    tokens_per_s_per_gpu: float
    """Training throughput."""
    mfu: float
    """Model FLOPs utilisation against the dense peak of the training precision."""
    model_flops_per_step: float
    """Model FLOPs of one step (no recompute)."""
    stage_time_s: tuple[float, ...]
    """Forward+backward time of one micro-batch on each pipeline stage."""
    peak_memory_bytes: tuple[float, ...]
    """Peak memory per pipeline stage."""
    memory_capacity_bytes: float
    """Usable memory of one GPU."""
    fits: bool
    """Whether every stage's peak fits the GPU (and what the plan offloads, the host's share of its memory)."""
    memory_breakdown_bytes: dict[str, float]
    """Peak-stage memory per component (weights, grads, optimizer, activations, buffers)."""
