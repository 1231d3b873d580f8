"""Hardware profiles: the schema of ``hardware_profiles/gpus/*.yaml`` and cluster files.

This is the only module of the cost model that reads files. Every number in a profile carries
a source id that the profile's ``sources`` table resolves to a citation.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.specs import ClusterSpec, FrozenSpec, InterNodeFabric

PROFILE_DIR = Path(__file__).resolve().parent.parent / "hardware_profiles"

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Scope = Literal["intra", "inter"]
DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]
Kind = Literal["gpu", "host"]


class InputError(ValueError):
    """Bad user input: one line naming the file and field, and what would be valid. A line break a message
    quotes from the user's file (a key, a value) is written as the escape ``\\n``, so the message stays one
    line."""

    def __init__(self, message: object = "", *args: object) -> None:
        if isinstance(message, str):
            message = message.replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(message, *args)


# The smallest number a profile may give for a size, a rate or an efficiency, in the unit its field name says.
# Every real one is far above it (the smallest shipped: an fp8 GEMM efficiency of 0.66); a denormal bandwidth
# (2.2e-309 B/s, found by FUZZ_RANDOM=1 on the calibrated-profile reader) overflowed every time it divided to
# infinity and the step time to NaN.
MIN_QUANTITY = 1e-3


class Sourced(FrozenSpec):
    """A number with the id of its source."""

    value: float = Field(allow_inf_nan=False, ge=MIN_QUANTITY)
    """The number, in the unit its field name says (finite, at least MIN_QUANTITY: a size, a rate or an
    efficiency)."""
    source: str
    """Key into the profile's sources table."""


class BusBwCurve(FrozenSpec):
    """Measured bus bandwidth (nccl-tests definition) against message size."""

    collective: Collective
    """Which collective."""
    scope: Scope
    """intra = inside one NVLink domain; inter = across nodes."""
    group_size: int = Field(ge=2)
    """Ranks in the measured group."""
    points: tuple[tuple[float, float], ...]
    """(message bytes, busbw bytes/s) pairs, increasing message size."""
    source: str
    """Key into the sources table."""

    @model_validator(mode="after")
    def _sorted(self) -> BusBwCurve:
        sizes = [p[0] for p in self.points]
        if len(sizes) < 2 or sizes != sorted(sizes):
            raise ValueError("points need at least two entries sorted by message size")
        bad = [p for p in self.points if not (math.isfinite(p[0]) and math.isfinite(p[1]) and p[0] > 0
                                              and p[1] >= MIN_QUANTITY)]
        if bad:
            raise ValueError(f"point {list(bad[0])}: expected a finite message size above 0 bytes and a busbw of at "
                             f"least {MIN_QUANTITY:g} bytes/s")
        return self


class GemmPoint(FrozenSpec):
    """One measured GEMM shape (written by ``plan profile``)."""

    dtype: DType
    """Input dtype of the GEMM."""
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    """C[m, n] = A[m, k] @ B[k, n]."""
    flops_per_s: float = Field(allow_inf_nan=False, ge=MIN_QUANTITY)
    """Achieved rate: 2 m n k / time of one call."""
    source: str
    """Key into the sources table."""


# The range a calibration multiplier may take in a profile file: a thousandth to a thousand times the physics,
# far wider than any fit's bounds (costmodel/fit.py FACTORS: 0.1-5), so only a malformed file meets it (a factor of
# 5e-324 made every GEMM take forever and the step time NaN).
FACTOR_MIN = 1e-3
FACTOR_MAX = 1e3


# Calibration fields that are weights of an update, not factors of the model.
_WEIGHTS = ("other_models_weight", "other_kind_weight")


def model_kind(model) -> str:
    """A model's kind, as a calibration's transfer to models not measured distinguishes them: dense or MoE, and
    its precision ('moe/mxfp8')."""
    return f"{'moe' if model.num_experts > 0 else 'dense'}/{model.precision}"


class Calibration(FrozenSpec):
    """Efficiency factors fitted by ``scripts/fit_profiles.py`` (never by hand)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gemm_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on the GEMM efficiency curve as real training kernels reach it."""
    fp8_gemm_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Extra multiplier on fp8/fp4 GEMMs (quantisation, scaling overheads)."""
    fp4_gemm_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Extra multiplier on fp4 (NVFP4) GEMMs, on top of the fp8 one (no fp4 MAMF is published)."""
    memory_bound_efficiency: float = Field(default=0.7, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Fraction of HBM bandwidth reached by element-wise kernels."""
    moe_overhead: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on MoE routing/permutation/grouped-GEMM overheads."""
    comm_exposed: float = Field(default=1.0, ge=0, le=FACTOR_MAX)
    """Multiplier on the exposed share of overlappable communication."""
    gemm_shape: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on gemm_half_efficiency_dim: how fast GEMM efficiency falls for narrow shapes."""
    attention_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on the flash-attention efficiency."""
    a2a_time: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on MoE dispatch/combine all-to-all time."""
    layer_overhead_s: float = Field(default=0.0, ge=0, le=10.0)
    """Fixed host time per transformer layer and micro-batch in the forward pass (twice that backward):
    kernel launches and Python. Fitted only from executor measurements (``plan calibrate``); 0 otherwise."""
    activation_memory: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    """Multiplier on a stage's activation memory (the layers' saved tensors and the last stage's logits).
    Fitted only by ``plan calibrate`` from runs that measured their peak memory (executor runs on CUDA);
    1 otherwise. megatron-core's local layer spec without Transformer Engine keeps about 1.9x what the
    model counts (one H200, examples/gpu_check_h200)."""
    fitted_by: str = "defaults (not fitted)"
    """Script and data that produced these factors."""
    fitted_rows: dict[str, int] = {}
    """Per factor, how many runs of this GPU type the factors were fitted to exercise it
    (costmodel.fit.relevant_factors of each run); a factor not named rests on no run of this GPU type.
    Written by scripts/fit_profiles.py, grown by plan calibrate; a one-run calibration moves the factor the fewest
    runs pin down, among those the run moves (costmodel/recalibrate.py)."""
    fitted_rows_pooled: dict[str, int] = {}
    """The same over every GPU type in the fit (the shared level of the partial pooling)."""
    measured_models: tuple[str, ...] = ()
    """Architectures (costmodel.specs.ModelSpec.architecture_key) of the runs ``plan calibrate`` fitted these
    factors to; empty for a shipped profile. A model among them gets the factors as they are; any other model
    gets them moved only ``other_models_weight`` of the way from ``uncalibrated`` (HardwareProfile.for_model)."""
    uncalibrated: dict[str, float] = {}
    """The values ``plan calibrate`` moved, as they were before it."""
    other_models_weight: float = Field(default=1.0, ge=0, le=1)
    """Share of the calibration update (in log space) that carries to a model that was not measured but is of a
    measured kind (``measured_kinds``: dense or MoE, and precision): 1 all of it, 0 none
    (costmodel/recalibrate.py OTHER_MODELS_WEIGHT, chosen by cross-validation)."""
    measured_kinds: tuple[str, ...] = ()
    """Kinds (:func:`model_kind`: 'dense/bf16', 'moe/mxfp8', ...) of the runs ``plan calibrate`` fitted these
    factors to; empty for a shipped profile, and in a profile calibrated before they were recorded (every model
    not measured then gets ``other_models_weight``)."""
    other_kind_weight: float = Field(default=1.0, ge=0, le=1)
    """Share of the update that carries to a model of a kind none of the measured runs was
    (costmodel/recalibrate.py OTHER_KIND_WEIGHT)."""
    per_model: dict[str, dict[str, float]] = {}
    """Where ``plan calibrate`` measured several architectures: per architecture (a measured_models key), the
    factor values fitted to that architecture's runs alone, which it gets in place of the pooled update above
    (HardwareProfile.for_model); a model not measured gets the pooled update at ``other_models_weight``. Empty
    after a calibration on one architecture (the pooled update is that architecture's own)."""

    @model_validator(mode="after")
    def _factor_maps_name_factors(self) -> Calibration:
        """``uncalibrated`` and each ``per_model`` entry map factor names to values those factors may take (they
        are applied without validation by HardwareProfile.for_model)."""
        maps = [("uncalibrated", self.uncalibrated)] + [(f"per_model.{k}", v) for k, v in self.per_model.items()]
        for where, values in maps:
            for name, value in values.items():
                field = type(self).model_fields.get(name)
                if field is None or field.annotation is not float or name in _WEIGHTS:
                    raise ValueError(f"{where}: {name!r} is not a calibration factor; expected one of "
                                     f"{', '.join(_FACTOR_NAMES)}")
                low = next(m.ge for m in field.metadata if getattr(m, "ge", None) is not None)
                high = next(m.le for m in field.metadata if getattr(m, "le", None) is not None)
                if not (math.isfinite(value) and low <= value <= high):
                    raise ValueError(f"{where}.{name} = {value}: expected a finite number from {low:g} to {high:g}")
        return self


_FACTOR_NAMES = [n for n, f in Calibration.model_fields.items() if f.annotation is float and n not in _WEIGHTS]


# A GEMM dtype and those it falls back to, narrowest first, where a profile has no figure for it (any other: bf16).
# TF32 falls back to fp32 (Volta has no TF32 tensor cores: fp32 GEMMs run on the CUDA cores).
_AND_WIDER = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "tf32": ("tf32", "fp32")}
# Where a profile measured no GEMM efficiency for a dtype: the tensor-core figure of the next wider one (TF32 GEMMs
# are cuBLAS tensor-core kernels like bf16's; no TF32 MAMF is stored).
_EFFICIENCY_FROM = {**_AND_WIDER, "tf32": ("tf32", "bf16")}


class HardwareProfile(FrozenSpec):
    """One GPU type as the cost model sees it."""

    name: str
    """Canonical name (file stem)."""
    kind: Kind = "gpu"
    """gpu = an accelerator; host = the CPU processes of one machine, each standing for one 'GPU'
    (a profile measured by ``plan profile`` with the gloo backend)."""
    generation: str = ""
    """GPU architecture generation (volta, ampere, hopper, blackwell), from the vendor's datasheet: the level
    at which calibration factors are pooled across GPU types (costmodel/validate.py fit_profiles), the class
    of a plan's P10-P90 interval and its GPU family for support (costmodel/trust.py). Empty: pooled with
    every other GPU only, the intervals of all GPUs, no support."""
    aliases: tuple[str, ...] = ()
    """Other spellings that resolve to this profile (case-insensitive)."""
    sources: dict[str, str]
    """Source id -> citation."""
    memory_bytes: Sourced
    """HBM capacity."""
    usable_memory_fraction: float = Field(default=0.95, gt=0, le=1)
    """Share of HBM the framework can allocate (CUDA context, NCCL, fragmentation take the rest)."""
    hbm_bandwidth_bytes_per_s: Sourced
    """HBM bandwidth."""
    peak_flops: dict[DType, Sourced]
    """Dense peak FLOP/s per dtype (no sparsity)."""
    gemm_max_efficiency: dict[DType, Sourced]
    """Best-shape achieved matmul efficiency (MAMF / peak) per dtype."""
    emulated_dtypes: tuple[DType, ...] = ()
    """Dtypes the GPU has no tensor-core support for, listed in peak_flops with another dtype's figures so
    that plans in them can still be costed (V100: bf16 with the fp16 figures); ``supports`` says no."""
    gemm_half_efficiency_dim: float = Field(default=512.0, gt=0)
    """Shape model: efficiency falls as d/(d + this) in the smallest GEMM dimension d. In YAML either a number
    (the default 512 is the shape the curve was built with) or ``{value: ..., source: ...}`` for a measured one."""
    gemm_half_efficiency_dim_source: str | None = None
    """Key into the sources table for a measured gemm_half_efficiency_dim; None for the default."""
    gemm_efficiency_cap: float | None = Field(default=None, gt=0, le=1)
    """Largest fraction of peak_flops any GEMM may reach after calibration; None = the cost model's cap
    for vendor peaks (costmodel.compute.MAX_GEMM_EFFICIENCY). 1.0 where peak_flops is itself the best
    measured rate."""
    gemm_points: tuple[GemmPoint, ...] = ()
    """Measured GEMM rates by shape, where the profile was measured (the cost model uses the efficiency
    curve fitted to them: gemm_max_efficiency and gemm_half_efficiency_dim)."""
    nvlink_bandwidth_bytes_per_s: Sourced
    """Unidirectional NVLink bandwidth per GPU."""
    host_link_bandwidth_bytes_per_s: Sourced | None = None
    """Unidirectional bandwidth between one GPU and host memory (PCIe, or NVLink-C2C on Grace superchips, shared
    by the GPUs of a superchip): what activation offloading (recompute='offload') streams over. None: not
    known, and plans do not offload on this GPU."""
    host_link_shared_with_network: bool = False
    """Whether the GPU's network traffic to and from its NIC crosses the host link too: true on a PCIe GPU, whose
    one x16 interface carries its GPUDirect RDMA traffic (the NIC sits on the GPU's PCIe switch, "PIX" in
    nvidia-smi topo -m on DGX / HGX systems) as well as its host copies; false on a Grace superchip, whose host
    traffic has NVLink-C2C to itself. Activation offloading then shares the link with Megatron-FSDP's gathers."""
    host_memory_bytes: Sourced | None = None
    """Host (CPU) memory per GPU in the reference system (system memory / GPUs per node, or per superchip):
    what activation offloading may fill (costmodel.memory.HOST_USABLE_FRACTION of it). None: not checked."""
    host_memory_bandwidth_bytes_per_s: Sourced | None = None
    """Host (CPU) DRAM bandwidth per GPU in the reference system (the CPUs' theoretical peak: channels x
    transfer rate x 8 bytes, over the GPUs sharing them): what a CPU optimizer step (optimizer_offload) streams
    its state through, at costmodel.compute.HOST_STREAM_FRACTION of it (``host_stream_fraction`` where set).
    None: not known, and plans do not offload the optimizer on this GPU."""
    host_stream_fraction: float | None = Field(default=None, gt=0, le=1)
    """Share of host_memory_bandwidth_bytes_per_s a CPU optimizer step streams at. None: the assumed
    costmodel.compute.HOST_STREAM_FRACTION; 1.0 where the bandwidth is itself a measured optimizer step's rate
    (``plan profile`` on GPUs)."""
    nvlink_domain_gpus: int = Field(default=8, ge=1)
    """GPUs per NVLink domain in the reference system."""
    nvls: bool = False
    """NVLink SHARP in-switch reductions (all-reduce busbw above link rate)."""
    nic_bandwidth_bytes_per_s: Sourced
    """Unidirectional NIC bandwidth per GPU in the reference system."""
    collective_latency_s: float = Field(default=15e-6, ge=0)
    """Small-message latency of an NCCL collective inside the domain."""
    collective_latency_by_op_s: dict[Collective, float] = {}
    """Measured small-message latency per collective (overrides collective_latency_s for that one)."""
    curves: tuple[BusBwCurve, ...] = ()
    """Measured busbw curves."""
    gap_model: str = ""
    """How collectives without a measured curve are filled (text for the reader)."""
    unfused_attention_source: str | None = None
    """Set, to the id of a source that says so, where no fused (flash) attention kernel runs on the GPU: its
    attention is costed unfused (score matrices in HBM, as Megatron ran before flash attention) whatever the
    framework (V100: FlashAttention-2 and cuDNN's fused attention need Ampere or newer). None: the framework
    decides (costmodel/estimate.py FRAMEWORK ``flash``)."""
    calibration: Calibration = Calibration()
    """Fitted efficiency factors."""

    def _update_in_full(self, model) -> bool:
        """Whether ``model`` gets the calibration as it stands: a shipped profile, a weight of 1, or a model
        among those plan calibrate measured."""
        cal = self.calibration
        return not cal.measured_models or self._transfer_weight(model) >= 1.0 or \
            model.architecture_key() in cal.measured_models

    def _of_measured_kind(self, model) -> bool:
        """Whether ``model`` is of a kind plan calibrate measured (or the kinds were not recorded)."""
        kinds = self.calibration.measured_kinds
        return not kinds or model_kind(model) in kinds

    def _transfer_weight(self, model) -> float:
        """The share of a plan calibrate update that ``model``, not measured, gets: other_models_weight for a kind
        the measured runs were, other_kind_weight otherwise."""
        cal = self.calibration
        return cal.other_models_weight if self._of_measured_kind(model) else cal.other_kind_weight

    def for_model(self, model) -> HardwareProfile:
        """The profile as it predicts ``model`` (a ModelSpec): unchanged, unless its calibration was measured on
        other architectures (Calibration.measured_models), where each moved factor goes back towards its
        uncalibrated value, keeping ``other_models_weight`` of the update in log space (linearly for a
        factor that was 0); an architecture with factors of its own (Calibration.per_model) gets those. The copy
        keeps no measured_models, so it is not moved twice."""
        cal = self.calibration
        own = cal.per_model.get(model.architecture_key()) if cal.per_model else None
        if own is not None:
            return self.model_copy(update={"calibration": cal.model_copy(update={
                **own, "measured_models": (), "measured_kinds": (), "uncalibrated": {}, "per_model": {}})})
        if self._update_in_full(model):
            return self
        w = self._transfer_weight(model)
        upd: dict = {"measured_models": (), "measured_kinds": (), "uncalibrated": {}, "per_model": {}}
        for name, before in cal.uncalibrated.items():
            now = getattr(cal, name)
            upd[name] = (before ** (1.0 - w) * now ** w) if before > 0 and now > 0 else before + w * (now - before)
        return self.model_copy(update={"calibration": cal.model_copy(update=upd)})

    def measured_on(self, model) -> bool:
        """Whether ``plan calibrate`` fitted this profile to runs of ``model``'s architecture (its predictions
        then get the narrower interval of a calibrated model, costmodel/trust.py CALIBRATED_KEY)."""
        return model.architecture_key() in self.calibration.measured_models

    def calibration_scope(self, model) -> str | None:
        """One line on how a ``plan calibrate`` update applies to ``model`` (a ModelSpec); None for a profile
        no plan calibrate fitted."""
        cal = self.calibration
        if not cal.measured_models:
            return None
        if model.architecture_key() in cal.per_model:
            return (f"profile {self.name} calibrated by {cal.fitted_by}: {model.name} gets the factors fitted to "
                    f"its own runs")
        if self._update_in_full(model):
            return f"profile {self.name} calibrated by {cal.fitted_by}: the update applies in full to {model.name}"
        n = len(cal.measured_models)
        kind = "" if self._of_measured_kind(model) else \
            f", none of its kind ({model_kind(model)}; measured: {', '.join(cal.measured_kinds)})"
        return (f"profile {self.name} calibrated on {n} other architecture{'s' if n > 1 else ''}{kind} "
                f"({cal.fitted_by}): {model.name} gets {self._transfer_weight(model):.0%} of that update")

    @model_validator(mode="before")
    @classmethod
    def _sourced_half_efficiency_dim(cls, data):
        dim = data.get("gemm_half_efficiency_dim") if isinstance(data, dict) else None
        if isinstance(dim, dict):
            try:
                sourced = Sourced(**dim)
            except (ValidationError, TypeError) as e:
                why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
                raise ValueError(f"gemm_half_efficiency_dim: {why} (got {dim!r}); valid: a number, or "
                                 "{value: number, source: id of the sources table}") from None
            data = {**data, "gemm_half_efficiency_dim": sourced.value,
                    "gemm_half_efficiency_dim_source": sourced.source}
        return data

    @model_validator(mode="after")
    def _sources_resolve(self) -> HardwareProfile:
        used = [self.memory_bytes.source, self.hbm_bandwidth_bytes_per_s.source,
                self.nvlink_bandwidth_bytes_per_s.source, self.nic_bandwidth_bytes_per_s.source]
        used += [s.source for s in self.peak_flops.values()]
        used += [s.source for s in self.gemm_max_efficiency.values()]
        used += [c.source for c in self.curves]
        used += [g.source for g in self.gemm_points]
        used += [self.gemm_half_efficiency_dim_source] if self.gemm_half_efficiency_dim_source else []
        used += [self.unfused_attention_source] if self.unfused_attention_source else []
        missing = sorted({u for u in used if u not in self.sources})
        if missing:
            raise ValueError(f"source ids {missing} are not in the sources table")
        if "bf16" not in self.peak_flops:
            raise ValueError("peak_flops needs at least a bf16 entry")
        return self

    def supports(self, precision: str) -> bool:
        """Whether the GPU trains in ``precision`` (a ModelSpec precision) natively. MXFP8 and NVFP4 are
        the block-scaled formats of Blackwell's tensor cores, the generation that adds fp4 (Transformer
        Engine: the MXFP8 and NVFP4 recipes need compute capability 10.0), so they go with an fp4 peak."""
        need = {"mxfp8": "fp4", "nvfp4": "fp4"}.get(precision, precision)
        return need in self.peak_flops and need not in self.emulated_dtypes

    def runs_transformer_engine(self) -> bool:
        """Whether Transformer Engine's kernels run on the GPU (compute capability 8.0, Ampere, and newer): the
        planner writes ``--transformer-impl local`` and no ``--tp-comm-overlap`` where they do not, and the cost
        model prices what it writes. The profiles carry no compute capability; native bf16 tensor cores came with
        the same generation (8.0), so a profile that ``supports('bf16')`` stands for it (V100, 7.0, emulates bf16)."""
        return self.supports("bf16")

    def peak(self, dtype: str) -> float:
        """Dense peak for a GEMM dtype, falling back to the next wider type."""
        return self.peak_flops[self.rate_dtype(dtype)].value

    def rate_dtype(self, dtype: str) -> str:
        """The dtype whose peak a GEMM of ``dtype`` runs at: itself, else the next wider type the GPU has."""
        return next((d for d in _AND_WIDER.get(dtype, (dtype, "bf16")) if d in self.peak_flops), "bf16")

    def max_efficiency(self, dtype: str) -> float:
        d = next((d for d in _EFFICIENCY_FROM.get(dtype, (dtype, "bf16")) if d in self.gemm_max_efficiency), None)
        return self.gemm_max_efficiency[d].value if d else 0.75

    def latency_s(self, collective: str) -> float:
        """Small-message latency of one collective inside the domain: the measured one where the profile
        has it, else collective_latency_s (half of it for a point-to-point send/recv)."""
        if collective in self.collective_latency_by_op_s:
            return self.collective_latency_by_op_s[collective]
        return self.collective_latency_s * (0.5 if collective == "send_recv" else 1.0)

    def curve(self, collective: str, scope: str) -> BusBwCurve | None:
        best = None
        for c in self.curves:
            if c.collective == collective and c.scope == scope:
                if best is None or c.group_size > best.group_size:
                    best = c
        return best


def validation_line(err: ValidationError, rename: dict[str, str] | None = None) -> str:
    """The first error of a pydantic ValidationError as one line: the field (its first part renamed by
    ``rename``, e.g. to the key of the file it came from), the rule, what was given."""
    e = err.errors()[0]
    parts = [str(p) for p in e["loc"]]
    if parts and rename:
        parts[0] = rename.get(parts[0], parts[0])
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    given = ""
    if isinstance(got, (bool, int, float, str)) and e["type"] != "missing":
        text = repr(got)
        given = f" (got {text if len(text) <= 40 else text[:37] + '...'})"
    # A whole-model check (no field of its own) names its fields in the message.
    return f"field '{'.'.join(parts)}': {msg}{given}" if parts else f"{msg}{given}"


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of a user's file, or a one-line InputError: not found, a directory, unreadable, not UTF-8."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory; expected a {what}") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); "
                         f"save the {what} as UTF-8") from None


# libyaml's parser where PyYAML was built with it (the wheels are): every planning command reads all the GPU
# profiles, and this takes ~0.2 s off `plan`'s 2 s. Same safe types, same error marks.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:   # an unhashable key: SafeLoader reports it below
                continue
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, path: str | Path):
    """YAML text of ``path`` (safe types, duplicate keys refused), or a one-line InputError with the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        why = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise InputError(f"{path}:{where} malformed YAML ({why})") from None
    except (ValueError, OverflowError, RecursionError) as exc:   # e.g. a timestamp out of range
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{path}: malformed YAML ({why})") from None


def parse_json(text: str, path: str | Path):
    """JSON text of ``path``, or a one-line InputError with the line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno} column {exc.colno}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{path}: malformed JSON (nested too deeply)") from None


def _read_yaml(path: Path) -> dict:
    data = parse_yaml(read_text(path, "YAML file"), path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of fields at the top level")
    return data


def profile_paths(root: Path = PROFILE_DIR) -> list[Path]:
    return sorted((root / "gpus").glob("*.yaml"))


def file_version(path: Path, missing: str = "file not found") -> tuple[int, int]:
    """(mtime_ns, size) of a file: the key its parse is cached under, so a rewritten file is read again."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: {missing}") from None
    return st.st_mtime_ns, st.st_size


def _load_profile_file(path: Path) -> HardwareProfile:
    """The profile in ``path``, parsed once per version of the file (a rewritten file is read again)."""
    return _parse_profile_file(path, *file_version(path))


@lru_cache(maxsize=64)
def _parse_profile_file(path: Path, _mtime_ns: int, _size: int) -> HardwareProfile:
    data = _read_yaml(path)
    data.setdefault("name", path.stem)
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as err:
        raise InputError(f"{path}: {validation_line(err)}") from None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def same_gpu(a: HardwareProfile, b: HardwareProfile) -> bool:
    """Whether two profiles describe one GPU type: either's name is the other's name or one of its aliases
    (a calibrated copy written by ``plan calibrate`` keeps the shipped profile's name)."""
    names = lambda p: {_norm(p.name), *(_norm(x) for x in p.aliases)}  # noqa: E731
    return _norm(a.name) in names(b) or _norm(b.name) in names(a)


# Words of a GPU's spelling that name its vendor, module or memory technology but not which GPU it is
# ("NVIDIA H100 SXM5 80GB HBM3" is the H100 80GB). PCIe and NVL parts are other products (lower clocks and
# power): their words are kept, so they match only their own profiles (H100-PCIe, H100-NVL, ...), never an SXM one.
_GPU_NOISE = frozenset({"nvidia", "tesla", "gpu", "tensor", "core", "sxm", "sxm2", "sxm3", "sxm4", "sxm5", "sxm6",
                        "hbm", "hbm2", "hbm2e", "hbm3", "hbm3e", "hgx", "dgx", "ac"})


def _gpu_words(name: str) -> tuple[frozenset, float | None]:
    """A GPU spelling as (its identifying words, the memory size it states in GB or None)."""
    text = re.sub(r"(\d+)\s*(gb|gib|g)\b", r"\1gb", name.lower())
    words = frozenset(w for w in re.split(r"[^a-z0-9]+", text) if w and w not in _GPU_NOISE)
    mem = [float(w[:-2]) for w in words if re.fullmatch(r"\d+gb", w)]
    return words, (mem[0] if mem else None)


def _match_by_words(name: str, profiles: list[HardwareProfile]) -> list[HardwareProfile]:
    """Profiles one of whose spellings has the same identifying words as ``name``; failing that, those whose
    words are ``name``'s without its memory size, where that size is within 10% of the profile's memory
    (in GB or GiB: "B200 192GB" is the B200 profile's 180 GiB)."""
    want, mem = _gpu_words(name)
    spell = {id(p): [_gpu_words(x)[0] for x in (p.name, *p.aliases)] for p in profiles}
    hits = [p for p in profiles if want in spell[id(p)]]
    if hits or mem is None:
        return hits
    bare = frozenset(w for w in want if not re.fullmatch(r"\d+gb", w))
    gib = [p for p in profiles if bare in spell[id(p)]]
    return [p for p in gib if any(abs(mem * unit / p.memory_bytes.value - 1) <= 0.10 for unit in (1e9, 2**30))]


# Words a system description wraps around the GPU's name ("AWS p5.48xlarge", "8x H100 per node", the architecture
# in "Hopper H100", "Grace Blackwell GB200 superchip"): dropped when the spelling as written names no profile
# (:func:`_simpler_spellings`).
_SYSTEM_NOISE = re.compile(r"\b(aws|ec2|gcp|google|cloud|azure|instance|instances|node|nodes|server|servers|per|"
                           r"gpus?|cluster|volta|ampere|hopper|blackwell|grace|superchips?|superpod|ultra|"
                           r"architecture)\b", re.I)
# A word that names another product than the SXM part (PCIe card, H100 NVL): such a spelling is never simplified
# into one without it, so it never reaches an SXM profile's name.
_OTHER_PRODUCT = re.compile(r"\b(pcie|nvl)\b", re.I)


def _simpler_spellings(name: str) -> list[str]:
    """Shorter spellings of a GPU description that names no profile as written, most of it first: without
    its bracketed remarks but a memory size in them ("H100 (AWS p5)" -> "H100"), then each remark on its own ("p5.48xlarge (8x H100)" ->
    "8x H100"), each without a GPU count ("8x", "1024 x") and system words (AWS, node, ...). For a spelling
    that names a PCIe or NVL part only those that still name it ("8x H100 PCIe" -> "H100 PCIe"), so it reaches
    that part's profile or none, never the SXM one ("H100 SXM (PCIe Gen5)" stays unresolved)."""
    remarks = re.findall(r"[\(\[]([^\)\]]*)[\)\]]", name)
    # A memory size stated in a remark stays: "B200 (80GB)" is no B200.
    sizes = re.findall(r"\d+\s*(?:gb|gib|g)\b", " ".join(remarks), flags=re.I)
    parts = [" ".join([re.sub(r"[\(\[][^\)\]]*[\)\]]", " ", name), *sizes[:1]])] + remarks
    out = []
    for part in parts:
        for text in (part, re.sub(r"(?<![a-z0-9])\d+\s*[x\u00d7]\s*(?=[a-z])", " ", part, flags=re.I)):
            text = " ".join(_SYSTEM_NOISE.sub(" ", text).replace(",", " ").split())
            if text and text != name and text not in out:
                out.append(text)
    if _OTHER_PRODUCT.search(name):
        out = [text for text in out if _OTHER_PRODUCT.search(text)]
    return out


def _find_profile(name: str, profiles: list[HardwareProfile]) -> list[HardwareProfile]:
    """Profiles a spelling names: the one whose name or alias it is (case and punctuation ignored), else those
    with its identifying words (:func:`_match_by_words`)."""
    want = _norm(name)
    for prof in profiles:
        if want in {_norm(prof.name), *(_norm(a) for a in prof.aliases)}:
            return [prof]
    return _match_by_words(name, profiles)


def load_profile(name_or_path: str, root: Path = PROFILE_DIR) -> HardwareProfile:
    """A profile by file path, canonical name or alias (case and punctuation ignored), or by a spelling with
    the same identifying words (vendor, module and memory-technology words aside: "NVIDIA H100 SXM5 80GB"),
    or, failing those, by the GPU a system description names ("H100 (AWS p5)", "8x A100 80GB", "DGX H100
    (8x H100 SXM)")."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return _load_profile_file(p.resolve())
    paths = profile_paths(root)
    profiles = [_load_profile_file(path) for path in paths]
    hits = _find_profile(name_or_path, profiles)
    for simpler in ([] if hits else _simpler_spellings(name_or_path)):
        hits = _find_profile(simpler, profiles)
        if hits:
            break
    if len(hits) == 1:
        return hits[0]
    names = [path.stem for path in paths]
    if hits:
        raise InputError(f"ambiguous GPU type {name_or_path!r}: it could be {', '.join(h.name for h in hits)}; "
                         f"name one of them")
    raise InputError(f"unknown GPU type {name_or_path!r}; valid: {', '.join(names)}")


INSTANCES_FILE = PROFILE_DIR / "instances.yaml"


class InstanceNetwork(BaseModel):
    """A cloud instance type's GPU network (hardware_profiles/instances.yaml): ``gpus`` GPUs moving
    ``gpu_network_bytes_per_s`` between instances, each way, as the cited source states."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    gpus: int = Field(ge=1)
    gpu_network_bytes_per_s: float = Field(gt=0)
    source: str

    @property
    def per_gpu_bytes_per_s(self) -> float:
        return self.gpu_network_bytes_per_s / self.gpus


def instance_networks(path: Path = INSTANCES_FILE) -> tuple[InstanceNetwork, ...]:
    """The instance types of ``path``, each with a source id the file's ``sources`` table defines."""
    return _parse_instances(path, *file_version(path))


@lru_cache(maxsize=4)
def _parse_instances(path: Path, _mtime_ns: int, _size: int) -> tuple[InstanceNetwork, ...]:
    data = _read_yaml(path)
    sources = data.get("sources") or {}
    out = []
    for i, entry in enumerate(data.get("instances") or []):
        try:
            item = InstanceNetwork.model_validate(entry)
        except ValidationError as err:
            raise InputError(f"{path}: instances[{i}]: {validation_line(err)}") from None
        if item.source not in sources:
            raise InputError(f"{path}: instances[{i}] ({item.name}): source {item.source!r} is not in the sources "
                             f"table; valid: {', '.join(sorted(sources)) or '(none)'}")
        out.append(item)
    return tuple(out)


def instance_named(text: str) -> InstanceNetwork | None:
    """The instance type a text names (``p4d.24xlarge``, ``AWS p4de``, ``a3-megagpu-8g``; a family name without
    its size, ``p4d``, counts), case and punctuation aside; None where it names none."""
    words = re.findall(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", text.lower())
    for inst in instance_networks():
        full = inst.name.lower()
        family = full.split(".")[0]
        if any(w == full or (w == family and "." in full) for w in words):
            return inst
    return None


def gpu_label(gpu: str) -> str:
    """How tables name a cluster's GPU: as it is, or, where a profile file stands in for it (``--profile``
    FILE), the profile's name and the file's ("H100 (h100_mine.yaml)") rather than the file's whole path."""
    path = Path(gpu)
    if path.suffix not in (".yaml", ".yml"):
        return gpu
    try:
        return f"{load_profile(gpu).name} ({path.name})"
    except InputError:
        return path.name


def _resolve_profile_path(data: dict, cluster_path: Path) -> None:
    """A ``gpu:`` that names a profile file relative to the cluster file becomes an absolute path, so
    that the cluster loads from any working directory (``plan profile`` writes such pairs)."""
    gpu = data.get("gpu")
    if isinstance(gpu, str) and Path(gpu).suffix in (".yaml", ".yml") and not Path(gpu).is_absolute():
        beside = cluster_path.parent / gpu
        if beside.exists():
            data["gpu"] = str(beside.resolve())


def gpu_nvlink_domain(cluster: ClusterSpec, prof: HardwareProfile) -> ClusterSpec:
    """The cluster with the GPU's NVLink domain where that is smaller than the cluster's and divides its nodes
    (PCIe boards bridged in pairs or fours: a node of several domains); otherwise unchanged."""
    dom = prof.nvlink_domain_gpus
    if dom < cluster.domain_gpus and cluster.gpus_per_node % dom == 0:
        return cluster.model_copy(update={"nvlink_domain_gpus": dom})
    return cluster


def server_gpus(profile: HardwareProfile) -> int:
    """GPUs of the server a GPU type comes in where nothing says: its NVLink domain up to 8 (HGX / DGX boards),
    the 4-GPU tray of an NVL rack."""
    if profile.nvlink_domain_gpus > 16:  # NVL racks: 4-GPU trays inside a 72-GPU NVLink domain (not DGX-2's 16)
        return 4
    return min(profile.nvlink_domain_gpus, 8)


def cluster_of(name: str, profile: HardwareProfile, num_gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """``num_gpus`` GPUs of ``profile`` in the servers they come in (``gpus_per_node`` where given; an NVL rack's
    4-GPU trays whatever is given), joined by the profile's NIC rate per GPU on a full-bisection rail-optimised
    fabric: the cluster a published run or a GPU-and-count name (``h100x1024``) describes."""
    given = gpus_per_node
    gpn = server_gpus(profile) if profile.nvlink_domain_gpus > 16 or not given else given
    # A node smaller than the profile's NVLink domain (4 A100 per node, Summit's 6 V100) is its own NVLink
    # domain: the next node is reached over the network.
    domain = given if given and given < profile.nvlink_domain_gpus <= 16 else \
        max(gpn, min(profile.nvlink_domain_gpus, num_gpus))
    nodes = max(1, math.ceil(num_gpus / gpn))
    # PCIe boards bridged in pairs or fours: a node of several NVLink domains.
    return gpu_nvlink_domain(ClusterSpec(
        name=name, gpu=profile.name, nodes=nodes, gpus_per_node=gpn, nvlink_domain_gpus=domain,
        inter_node=InterNodeFabric(nic_bandwidth_bytes_per_s=profile.nic_bandwidth_bytes_per_s.value)), profile)


def with_nic(cluster: ClusterSpec, nic_bytes_per_s: float) -> ClusterSpec:
    """``cluster`` with another NIC rate per GPU (each way)."""
    fabric = cluster.inter_node.model_copy(update={"nic_bandwidth_bytes_per_s": nic_bytes_per_s})
    return cluster.model_copy(update={"inter_node": fabric})


# A cluster named by its GPU and count where no file has the name: "h100x1024", "GB200x72", "1024xH100".
_GPU_COUNT = (re.compile(r"(?P<gpu>.*?[a-z].*?)\s*[x\u00d7]\s*(?P<n>\d+)", re.I),
              re.compile(r"(?P<n>\d+)\s*[x\u00d7]\s*(?P<gpu>.*?[a-z].*)", re.I))


def _named_cluster(name: str) -> tuple[ClusterSpec | None, str]:
    """The cluster a GPU-and-count name describes (:func:`cluster_of`: the GPU's servers and NIC rate, full
    bisection, the price the shipped clusters of that GPU state, :func:`_shipped_price`), or None and why not (''
    where the name is no such pair)."""
    why = ""
    for pattern in _GPU_COUNT:
        m = pattern.fullmatch(name.strip())
        if not m:
            continue
        system = re.search(r"nvl\d+|dgx|hgx|superpod|rack|pod|node", m.group("gpu"), re.I)
        if system:
            # gb200-nvl72x8 (shipped) is 8 racks, v100-dgx2x64 64 GPUs: a system's count is no GPU count.
            raise InputError(f"{name}: a count of GPUs or of {system.group(0)} systems? Name the GPU and its count "
                             f"(gb200x576) or write a cluster file")
        try:
            prof = load_profile(m.group("gpu"))
        except InputError as err:
            why = why or f"{m.group('gpu')!r} is no GPU profile ({err})"
            continue
        n = int(m.group("n"))
        if n < 1:
            raise InputError(f"{name}: a cluster needs at least 1 GPU; got {n}")
        gpn = server_gpus(prof)
        if n > gpn and n % gpn:
            raise InputError(f"{name}: {n} {prof.name} do not fill servers of {gpn}; name a multiple of {gpn} "
                             f"(or write a cluster file: hardware_profiles/clusters/h100x512.yaml is one)")
        price = _shipped_price(prof)
        cluster = cluster_of(name.strip(), prof, n, min(n, gpn))
        inst = instance_named(m.group("gpu"))
        if inst is not None:   # a cloud instance type: its own network (hardware_profiles/instances.yaml)
            cluster = with_nic(cluster, inst.per_gpu_bytes_per_s)
        return cluster.model_copy(update={"price_per_gpu_hour_usd": price}), ""
    return None, why


def _shipped_price(profile: HardwareProfile) -> float | None:
    """The price per GPU-hour the shipped cluster files of ``profile``'s GPU agree on (an illustrative price each
    file cites), None where none states one or they differ."""
    prices = set()
    for path in sorted((PROFILE_DIR / "clusters").glob("*.yaml")):
        data = _read_yaml(path)
        if data.get("device_groups") or data.get("price_per_gpu_hour_usd") is None:
            continue
        try:
            if same_gpu(load_profile(str(data.get("gpu"))), profile):
                prices.add(float(data["price_per_gpu_hour_usd"]))
        except InputError:
            continue
    return prices.pop() if len(prices) == 1 else None


def load_cluster(path: str | Path) -> ClusterSpec:
    """A cluster YAML by path (or by name of a shipped file in hardware_profiles/clusters/), or, where no file
    has the name, the cluster a GPU-and-count name describes ("h100x1024": :func:`cluster_of`)."""
    p = Path(path)
    if not p.exists():
        shipped = PROFILE_DIR / "clusters" / (p.name if p.suffix else f"{p.name}.yaml")
        if shipped.exists():
            p = shipped
        else:
            named, why = (None, "") if p.suffix in (".yaml", ".yml") or len(p.parts) > 1 else \
                _named_cluster(str(path))
            if named is not None:
                return named
            names = sorted(x.name for x in (PROFILE_DIR / "clusters").glob("*.yaml"))
            raise InputError(f"{path}: cluster file not found{f', and {why}' if why else ''}; shipped clusters: "
                             f"{', '.join(names)}; or a GPU and its count (h100x1024)")
    data = _read_yaml(p)
    data.setdefault("name", p.stem)
    _resolve_profile_path(data, p)
    try:
        cluster = ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise InputError(f"{p}: {validation_line(err)}") from None
    try:
        prof = load_profile(cluster.gpu)
    except InputError as err:
        raise InputError(f"{p}: field 'gpu': {err}") from None
    if cluster.nvlink_domain_gpus is None:
        # A node of several NVLink domains (PCIe boards bridged in pairs): the file that leaves the domain out
        # gets the GPU's, not the whole node.
        cluster = gpu_nvlink_domain(cluster, prof)
    for i, group in enumerate(cluster.device_groups):
        try:
            load_profile(group.gpu)
        except InputError as err:
            raise InputError(f"{p}: field 'device_groups.{i}.gpu': {err}") from None
    return cluster


def busbw_at(curve: BusBwCurve, message_bytes: np.ndarray) -> np.ndarray:
    """Bus bandwidth at each message size, interpolated on a log-size axis (clamped at the ends)."""
    xs = np.log2([p[0] for p in curve.points])
    ys = np.array([p[1] for p in curve.points])
    return np.interp(np.log2(np.maximum(message_bytes, 1.0)), xs, ys)


def transformer_engine_runs(cluster: ClusterSpec) -> bool:
    """Whether every GPU of ``cluster`` runs Transformer Engine (HardwareProfile.runs_transformer_engine)."""
    gpus = {g.gpu for g in cluster.device_groups} or {cluster.gpu}
    return all(load_profile(g).runs_transformer_engine() for g in sorted(gpus))
