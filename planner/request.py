"""What a command asks for, and every default the commands decide, in one place.

A command parses its flags into a request and calls ``resolve()``: the request loads the model and the
cluster, applies a calibrated ``--profile``, picks the precision the GPUs run, and fills what was not
given. The defaults live here and nowhere else:

==================  =========================================================================================
precision           the model's; a default bf16 becomes fp16 mixed precision on GPUs without bf16 (V100),
                    with a PlanNote; another precision the GPUs lack is a one-line error
global batch        ~4M tokens (costmodel.plan.default_global_batch); on CPU ranks (a profile of kind host,
                    commands that train here) HOST_SEQUENCES_PER_RANK sequences per rank
dp                  the GPUs left by tp * pp * cp (plan check)
zero stage          1 (Megatron's distributed optimizer); 0 with --no-distributed-optimizer
device group        plan check on a cluster of device groups needs --group
tokens, failures    20 tokens per parameter; the Llama 3 failure rates, scaled; the optimal checkpoint interval
==================  =========================================================================================

    PlanRequest(...).resolve()      -> Target(model, cluster, global_batch, profile)   plan, autotune
    CheckRequest(...).resolve()     -> CheckTarget(..., plan, layout, load)            plan check
    CapacityRequest(...).resolve()  -> (model, compression, Assumptions)               capacity, whatif
    scenarios_with_profile(...), validate_profiles(...)   --profile for capacity / whatif and validate
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from costmodel.profiles import InputError
from costmodel.specs import FINETUNE

__all__ = ["HOST_SEQUENCES_PER_RANK", "CapacityRequest", "CheckRequest", "CheckTarget", "PlanNote", "PlanRequest",
           "Target", "native_precision", "scenarios_with_profile", "validate_profiles"]

HOST_SEQUENCES_PER_RANK = 8
"""Default global batch per rank on CPU processes (the ~4M-token default would take hours per step there)."""


class PlanNote(UserWarning):
    """Something the user should know about a run that went through (printed after it, not before an error)."""


# --profile FILE ---------------------------------------------------------------------------------------
def _profile_override(spec: str | None):
    """--profile FILE as (what a cluster's gpu field names it by, the profile); one-line errors when the file
    does not load."""
    if not spec:
        return None
    from costmodel.profiles import load_profile

    p = Path(spec)
    if p.suffix in (".yaml", ".yml") and not p.exists():
        raise InputError(f"--profile {spec}: file not found")
    prof = load_profile(spec)
    return (str(p.resolve()) if p.exists() else prof.name), prof


def _with_profile(cluster, override):
    """The cluster with every GPU of the override's type (name or alias) read from the override file; None
    when the cluster has no such GPU."""
    from costmodel.profiles import load_profile, same_gpu

    ref, prof = override
    hit = same_gpu(load_profile(cluster.gpu), prof)
    upd = {"gpu": ref} if hit else {}
    if cluster.device_groups:
        groups = []
        for g in cluster.device_groups:
            mine = same_gpu(load_profile(g.gpu), prof)
            hit = hit or mine
            groups.append(g.model_copy(update={"gpu": ref}) if mine else g)
        upd["device_groups"] = groups
    return cluster.model_copy(update=upd) if hit else None


def _wrong_gpu(override, clusters) -> str:
    from costmodel.profiles import load_profile

    ref, prof = override
    gpus = sorted({load_profile(g).name for cl in clusters
                   for g in ([x.gpu for x in cl.device_groups] if cl.device_groups else [cl.gpu])})
    return (f"--profile {ref}: profile {prof.name} is not a GPU type of the cluster ({', '.join(gpus)}); give a "
            f"profile calibrated for {' or '.join(gpus)}")


def scenarios_with_profile(scenarios, spec: str | None):
    """Capacity / what-if scenarios with --profile applied where their cluster has that GPU type."""
    override = _profile_override(spec)
    if override is None:
        return scenarios
    out = [replace(s, cluster=c) if (c := _with_profile(s.cluster, override)) is not None else s for s in scenarios]
    if all(o is s for o, s in zip(out, scenarios)):
        raise InputError(_wrong_gpu(override, [s.cluster for s in scenarios]))
    return out


def validate_profiles(spec: str | None) -> dict | None:
    """--profile FILE for plan validate: {shipped GPU type it replaces: the profile}."""
    override = _profile_override(spec)
    if override is None:
        return None
    from costmodel.profiles import load_profile, profile_paths, same_gpu

    ref, prof = override
    shipped = [load_profile(str(p)) for p in profile_paths()]
    hit = [q.name for q in shipped if same_gpu(q, prof)]
    if not hit:
        raise InputError(f"--profile {ref}: profile {prof.name} is not a shipped GPU type (name or alias); valid: "
                         f"{', '.join(q.name for q in shipped)}")
    return {hit[0]: prof}


def native_precision(model, cluster, explicit: bool):
    """The model in a precision every GPU of the cluster runs: a default bf16 becomes fp16 mixed precision
    on GPUs without bf16 (V100), with a note; anything else they lack is a one-line error."""
    from typing import get_args

    from costmodel.profiles import load_profile
    from costmodel.specs import Precision

    gpus = [g.gpu for g in cluster.device_groups] if cluster.device_groups else [cluster.gpu]
    profs = [load_profile(g) for g in dict.fromkeys(gpus)]
    lacking = [p.name for p in profs if not p.supports(model.precision)]
    if not lacking:
        return model
    if model.precision == "bf16" and not explicit and all(p.supports("fp16") for p in profs):
        warnings.warn(f"{', '.join(lacking)} has no bf16: {model.name} planned in fp16 mixed precision "
                      f"(--fp16, as Megatron trains on Volta)", PlanNote, stacklevel=2)
        return model.model_copy(update={"precision": "fp16"})
    valid = [p for p in get_args(Precision) if all(q.supports(p) for q in profs)]
    raise InputError(f"--precision {model.precision}: {', '.join(lacking)} in {cluster.name} cannot train in "
                     f"{model.precision}; valid there: {', '.join(valid)}")


# plan, plan autotune -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A resolved request: what to plan, where, with which global batch."""

    model: Any
    """ModelSpec in the precision the cluster runs."""
    cluster: Any
    """ClusterSpec, with --profile applied."""
    global_batch: int
    """Sequences per step, given or defaulted."""
    profile: Any = None
    """The HardwareProfile autotune starts from (--profile there), or None: the cluster's."""


def with_finetune(model, finetune: str):
    """The model trained as --finetune says: full (every weight) or lora (adapters on frozen weights)."""
    key = str(finetune).strip().lower()
    if key not in FINETUNE:
        raise InputError(f"--finetune {finetune}: expected one of {', '.join(FINETUNE)}")
    return model if key == model.finetune else model.model_copy(update={"finetune": key})


def with_optimizer(model, optimizer: str):
    """The model stepped as --optimizer says: adam, or muon (Newton-Schulz-orthogonalised momentum on the weight
    matrices, ModelSpec.optimizer)."""
    from costmodel.specs import OPTIMIZERS

    key = str(optimizer).strip().lower()
    if key not in OPTIMIZERS:
        raise InputError(f"--optimizer {optimizer}: expected one of {', '.join(OPTIMIZERS)}")
    if key == "muon" and model.precision == "fp16":
        raise InputError(f"--optimizer muon with precision fp16: megatron-core 0.16.1 \"muon with fp16 is not "
                         f"supported\"; valid: --precision bf16, fp8, mxfp8 or nvfp4")
    return model if key == model.optimizer else model.model_copy(update={"optimizer": key})


def with_token_drop(model, token_drop: bool):
    """The model with --moe-token-drop: its MoE layers drop tokens over a capacity and pad to it (static shapes,
    no per-layer token counts to the host, so no host floor: ModelSpec.moe_token_drop). One-line error for a
    dense model."""
    if not token_drop:
        return model
    if not model.is_moe:
        raise InputError(f"--moe-token-drop: {model.name} has no experts (the flag is for MoE models)")
    return model.model_copy(update={"moe_token_drop": True})


def requested_model(req):
    """The catalog model a request names, at its --seq-len / --precision, trained as --finetune says, with
    --moe-token-drop (PlanRequest and CapacityRequest share these fields)."""
    from costmodel.catalog import get_model

    model = get_model(req.model, seq_len=req.seq_len, precision=req.precision)
    return with_optimizer(with_token_drop(with_finetune(model, req.finetune), req.moe_token_drop), req.optimizer)


@dataclass(frozen=True)
class PlanRequest:
    """A model on a cluster, as ``plan`` and ``plan autotune`` take it (the field names are the flags' dests)."""

    model: str
    """Catalog name or a HF config.json."""
    cluster: str
    """Cluster YAML (a path or a file in hardware_profiles/clusters/)."""
    seq_len: int | None = None
    """Sequence length; None: the model's."""
    precision: str | None = None
    """None: the model's (bf16 becomes fp16 on GPUs without bf16)."""
    finetune: str = "full"
    """What the step trains: full (every weight) or lora (adapters on frozen weights)."""
    optimizer: str = "adam"
    """adam or muon (--optimizer)."""
    moe_token_drop: bool = False
    """MoE layers drop tokens over a capacity and pad to it (--moe-token-drop)."""
    global_batch: int | None = None
    """Sequences per step; None: ~4M tokens (HOST_SEQUENCES_PER_RANK per rank on CPU ranks with host_batch)."""
    profile_file: str | None = None
    """Calibrated profile YAML replacing the shipped profile of its GPU type."""
    start_profile: str | None = None
    """plan autotune's --profile: the profile it starts from (None: the cluster's)."""
    host_batch: bool = False
    """The command trains on this machine: a host (CPU) profile gets the small per-rank default batch."""
    routing: str | None = None
    """MoE routing histogram file (--routing)."""
    placement: str = "best"
    """Expert placement with --routing: best, contiguous or lpt."""
    capacity_factor: float | None = None
    """MoE expert capacity factor with --routing."""
    optimizer_offload: float = 0.0
    """Share of the optimizer state in host memory, stepped by the CPU (--optimizer-offload-fraction); plan searches
    only layouts with that share offloaded."""

    def load_target(self):
        """(model, cluster): loaded, --profile applied, the model in a precision the cluster runs."""
        from costmodel.profiles import load_cluster

        model = requested_model(self)
        cluster = load_cluster(self.cluster)
        override = _profile_override(self.profile_file)
        if override is not None:
            cluster = _with_profile(cluster, override)
            if cluster is None:
                raise InputError(_wrong_gpu(override, [load_cluster(self.cluster)]))
        return native_precision(model, cluster, explicit=self.precision is not None), cluster

    def global_batch_for(self, model, cluster, profile=None) -> int:
        """The global batch: given, HOST_SEQUENCES_PER_RANK per rank on CPU ranks (host_batch), else ~4M tokens."""
        if self.global_batch:
            return self.global_batch
        if self.host_batch:
            from costmodel.profiles import load_profile

            if (profile or load_profile(cluster.gpu)).kind == "host":
                return HOST_SEQUENCES_PER_RANK * cluster.num_gpus
        from costmodel.plan import default_global_batch

        return default_global_batch(model.seq_len, cluster.num_gpus)

    def resolve(self) -> Target:
        model, cluster = self.load_target()
        if self.optimizer_offload:
            _check_offload_host(cluster)
            if model.optimizer == "muon":
                raise InputError("--optimizer-offload with --optimizer muon: megatron-core's optimizer CPU offload "
                                 "is Adam's (HybridDeviceOptimizer); valid: --optimizer adam, or no offload")
        profile = None
        if self.start_profile:
            from costmodel.profiles import load_profile

            profile = load_profile(self.start_profile)
        return Target(model, cluster, self.global_batch_for(model, cluster, profile), profile)

    def load_routing(self, model, restrict: bool = True):
        """The histogram of --routing (None without); with ``restrict`` a placement other than best limits the
        placements searched."""
        if not self.routing:
            if self.capacity_factor is not None:
                raise InputError("--capacity-factor needs --routing FILE (the histogram it applies to)")
            return None
        from costmodel.routing import PLACEMENTS
        from planner.routing import load_routing

        places = PLACEMENTS if (self.placement == "best" or not restrict) else (self.placement,)
        return load_routing(self.routing, model, capacity_factor=self.capacity_factor, placements=places)


def _check_offload_host(cluster) -> None:
    """One-line error where --optimizer-offload asks for a CPU optimizer step on a GPU whose host is unknown."""
    from costmodel.profiles import load_profile
    from planner.space import missing_host_fields

    gpus = [g.gpu for g in cluster.device_groups] if cluster.device_groups else [cluster.gpu]
    for gpu in dict.fromkeys(gpus):
        missing = missing_host_fields(gpu)
        if missing:
            raise InputError(f"--optimizer-offload: GPU profile {load_profile(gpu).name} has no {' or '.join(missing)} "
                             f"(what a CPU optimizer step streams through); valid: --optimizer-offload 0, or a "
                             f"profile that states its host")


# plan check --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckTarget:
    """A resolved plan check: one plan on one homogeneous cluster."""

    model: Any
    cluster: Any
    """The cluster, or the device group --group names."""
    plan: Any
    """The ParallelPlan, valid per costmodel.rules.check_plan."""
    routing: Any = None
    """The --routing histogram (planner.routing.Routing), or None."""
    load: Any = None
    """The expert load of the plan's ep under the histogram (--placement best: the best placement), or None."""
    layers_per_stage: tuple[int, ...] | None = None
    """The uneven split given (--layers-per-stage or --pipeline-layout), or None."""
    layout: str | None = None
    """The Megatron layout string of that split, or None."""


def _default_recompute(model, cluster) -> str:
    """plan check's recompute when none is named: selective where megatron-core runs what the estimate prices
    for it, else none (a dense model on Transformer Engine, where megatron-core's selective frees nothing)."""
    from planner.space import recompute_modes

    return "selective" if "selective" in recompute_modes(model, cluster) else "none"


@dataclass(frozen=True)
class CheckRequest(PlanRequest):
    """One layout to predict and check (plan check); degrees and knobs as the flags give them."""

    placement: str = "contiguous"
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int | None = None
    """None: the GPUs left by tp * pp * cp."""
    cp: int = 1
    ep: int = 1
    etp: int = 1
    micro_batch: int = 1
    recompute: str | None = None
    """None: selective where megatron-core runs it as priced (costmodel.rules.selective_runs_as_priced), else
    none."""
    recompute_layers: int | None = None
    no_sequence_parallel: bool = False
    no_distributed_optimizer: bool = False
    zero_stage: int | None = None
    """None: 1 (distributed optimizer), 0 with no_distributed_optimizer."""
    dist_opt_instances: int = 1
    """Replicas of the sharded data-parallel state (HSDP / partial distributed optimizer)."""
    moe_a2a_overlap: bool = False
    """Overlap the MoE all-to-all with another micro-batch's compute (--overlap-moe-expert-parallel-comm)."""
    group: str | None = None
    """The device group to check on, for a cluster of device groups."""
    layers_per_stage: str | None = None
    """'N,N,...': decoder layers per pipeline rank."""
    pipeline_layout: str | None = None
    """Megatron's --pipeline-model-parallel-layout string (sets vpp)."""

    def zero(self) -> int:
        zero = self.zero_stage if self.zero_stage is not None else (0 if self.no_distributed_optimizer else 1)
        if self.no_distributed_optimizer and zero >= 1:
            raise InputError(f"--no-distributed-optimizer with --zero-stage {zero}: ZeRO stages 1-3 shard the "
                             f"optimizer states (Megatron's distributed optimizer); valid: --zero-stage 0, or drop "
                             f"--no-distributed-optimizer")
        return zero

    def resolve(self) -> CheckTarget:
        from costmodel.rules import check_plan
        from costmodel.plan import ParallelPlan, data_parallel

        model, cluster = self.load_target()
        cluster = _check_cluster(cluster, self.group)
        routing = self.load_routing(model, restrict=False)
        dp = self.dp or data_parallel(cluster.num_gpus, self.tp, self.pp, self.cp)
        gbs = self.global_batch_for(model, cluster)
        zero = self.zero()
        vpp, lps, layout = self.split(model)
        recompute = self.recompute or _default_recompute(model, cluster)
        plan = ParallelPlan(tp=self.tp, pp=self.pp, vpp=vpp, dp=dp, cp=self.cp, ep=self.ep, etp=self.etp,
                            sequence_parallel=not self.no_sequence_parallel, micro_batch=self.micro_batch,
                            global_batch=gbs, recompute=recompute, recompute_layers=self.recompute_layers,
                            distributed_optimizer=zero >= 1, zero_stage=zero, layers_per_stage=lps,
                            dist_opt_instances=self.dist_opt_instances, moe_a2a_overlap=self.moe_a2a_overlap,
                            optimizer_offload=self.optimizer_offload)
        check_plan(model, plan, cluster.num_gpus)
        if plan.optimizer_offload:
            _check_offload_host(cluster)
        if plan.recompute == "offload":
            from costmodel.profiles import load_profile

            if load_profile(cluster.gpu).host_link_bandwidth_bytes_per_s is None:
                raise InputError(f"--recompute offload: GPU profile {cluster.gpu} has no host_link_bandwidth_bytes_per_s "
                                 f"(the GPU-to-host link activations would stream over); valid: --recompute none, "
                                 f"selective or full, or a profile that states its host link")
        if lps is not None and layout is None:
            from costmodel.plan import megatron_layout

            layout = megatron_layout(lps, vpp, mtp=model.mtp_layers)
        placement = None if self.placement == "best" else self.placement
        load = routing.load(plan.ep, placement) if routing is not None else None
        return CheckTarget(model, cluster, plan, routing, load, lps, layout)

    def split(self, model) -> tuple[int, tuple[int, ...] | None, str | None]:
        """(vpp, layers per pipeline rank or None, layout string or None) of --layers-per-stage /
        --pipeline-layout; a list or layout that does not fit --pp and the model is a one-line error."""
        pp = self.pp
        if self.pipeline_layout is not None:
            from planner.outputs import check_layout, parse_layout

            layout = self.pipeline_layout.strip()
            vpp, per_rank = parse_layout(layout, pp)
            if self.vpp not in (1, vpp):
                raise InputError(f"--pipeline-layout {layout!r} has {vpp * pp} stages = pp {pp} x vpp {vpp}, but "
                                 f"--vpp is {self.vpp}; drop --vpp (the layout sets it)")
            check_layout(model, pp, vpp, layout)
            return vpp, per_rank, layout
        if self.layers_per_stage is None:
            return self.vpp, None, None
        text = self.layers_per_stage
        need = f"give {pp} comma-separated counts (one per pipeline rank, --pp {pp}) summing to {model.layers}"
        try:
            lps = tuple(int(x) for x in text.replace(" ", "").split(","))
        except ValueError:
            raise InputError(f"--layers-per-stage {text!r} is not a list of integers; {need}") from None
        if len(lps) != pp:
            raise InputError(f"--layers-per-stage {text!r} has {len(lps)} counts but --pp is {pp}; {need}")
        if sum(lps) != model.layers:
            raise InputError(f"--layers-per-stage {text!r} sums to {sum(lps)} but {model.name} has {model.layers} "
                             f"layers; {need}")
        bad = [i for i, x in enumerate(lps) if x < 1]
        if bad:
            raise InputError(f"--layers-per-stage {text!r}: stage(s) {', '.join(map(str, bad))} hold {min(lps)} "
                             f"layers; every stage needs at least 1 ({need}; an embedding- or loss-only edge stage "
                             f"is a --pipeline-layout 'E|...|L')")
        return self.vpp, lps, None


def _check_cluster(cluster, group: str | None):
    """plan check runs on one homogeneous cluster: a device group of a heterogeneous one with --group."""
    if not cluster.device_groups:
        if group:
            raise InputError(f"--group {group}: cluster {cluster.name} has no device_groups")
        return cluster
    from costmodel.hetero import group_clusters

    groups = group_clusters(cluster)
    if group and group not in groups:
        raise InputError(f"--group {group}: {cluster.name} has no device group {group!r}; valid: {', '.join(groups)}")
    if group not in groups:
        raise InputError(f"{cluster.name} has device groups ({', '.join(groups)}): plan check takes one with "
                         f"--group NAME, or use plan --cluster {cluster.name} to place stages on the groups")
    return groups[group]


# plan capacity, plan whatif ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CapacityRequest:
    """The model and the shared assumptions of plan capacity / plan whatif (field names are the flags' dests)."""

    model: str
    tokens: str | None = None
    """'15T', '300B', '2e12'; None: 20 per parameter."""
    seq_len: int | None = None
    precision: str | None = None
    finetune: str = "full"
    optimizer: str = "adam"
    moe_token_drop: bool = False
    global_batch: int | None = None
    compression: str = "none"
    """DP gradient compression: none, int8, int4."""
    price_per_gpu_hour: str | None = None
    """'$2.5'; None: the cluster files' price."""
    failure_scale: float = 1.0
    """Factor on the default (Llama 3) failure rates."""
    failures_per_gpu_hour: float | None = None
    failures_per_node_hour: float | None = None
    restart: str | None = None
    """Overhead per failure before the checkpoint load; None: the FailureModel's (10 min)."""
    checkpoint_interval: str | None = None
    """Fixed checkpoint interval; None: optimal (Daly)."""
    async_checkpoint: bool = False

    def resolve(self):
        """(model, compression, Assumptions) (one-line errors on bad values)."""
        from costmodel.compression import get_compression
        from costmodel.goodput import CheckpointPolicy, FailureModel
        from planner.capacity import Assumptions, default_tokens, parse_duration, parse_money, parse_tokens

        model = requested_model(self)
        if not self.failure_scale >= 0:
            raise InputError(f"--failure-scale {self.failure_scale}: expected a factor >= 0 (1 = the Llama 3 rates)")
        fm = FailureModel()
        upd = {k: v for k, v in (("per_gpu_hour", self.failures_per_gpu_hour),
                                 ("per_node_hour", self.failures_per_node_hour)) if v is not None}
        if any(v < 0 for v in upd.values()):
            raise InputError("--failures-per-gpu-hour / --failures-per-node-hour: expected rates >= 0")
        if self.restart is not None:
            upd["restart_overhead_s"] = parse_duration(self.restart, "--restart")
        fm = fm.model_copy(update=upd).scaled(self.failure_scale)
        ckpt = CheckpointPolicy(asynchronous=self.async_checkpoint,
                                interval_s=parse_duration(self.checkpoint_interval, "--checkpoint-interval")
                                if self.checkpoint_interval is not None else None)
        tokens = parse_tokens(self.tokens) if self.tokens is not None else default_tokens(model)
        price = (parse_money(self.price_per_gpu_hour, "--price-per-gpu-hour") if self.price_per_gpu_hour is not None
                 else None)
        return model, get_compression(self.compression), Assumptions(tokens, fm, ckpt, price)
