"""Heterogeneous clusters: one pipeline whose stages run on device groups of different GPUs.

A ``HeteroPlan`` puts every pipeline stage on one device group with its own tp and dp (cp, ep, etp, vpp and
recompute are shared). A pipeline micro-batch of B sequences is split over each stage's dp ranks
(B / dp_s sequences per rank), so stages may differ in dp as long as it divides B. Megatron-LM runs one
plan as one job only when tp and dp are the same on every stage (an uneven layer split goes through
``--pipeline-model-parallel-layout``); other plans are flagged (:attr:`HeteroPlan.launch_issue`).

The estimate is composed from the homogeneous cost model (``estimate_arrays``): every stage is scored on
its own group's hardware (profile and fabrics from :func:`group_cluster`) with its own degrees and the
whole pipeline's split, which gives its per-micro-batch time, its gradient-sync + optimizer tail and its
peak memory; pipeline hops between groups pay the slower of the inter-group link and either side's NIC;
the schedule (``pipeline.pipeline_time_s``) turns the stage times into the step, composed and turned into
MFU by the same functions as ``estimate`` (``step_time_s``, ``mfu``). A plan that uses one group only is
scored exactly as ``estimate`` scores it on that group (step time and MFU).

The layer split of a HeteroPlan comes from costmodel/split.py (``stage_coefficients``, ``optimal_split``:
the heterogeneous case of the one stage-split solver).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field, model_validator

from costmodel import comm, pipeline
from costmodel.compute import gemm_dtype
from costmodel.estimate import FRAMEWORK, P2P_FIXED_S, mfu, step_time_s
from costmodel.plan import RECOMPUTE_CODE, ParallelPlan, PlanArrays, even_split, num_microbatches
from costmodel.flops import layer_forward_flops, model_flops_per_step
from costmodel.profiles import HardwareProfile, load_profile
from costmodel.specs import ClusterSpec, DeviceGroup, Framework, FrozenSpec, ModelSpec, RecomputeMode
from costmodel.split import score_with



# Groups ------------------------------------------------------------------------------------------------


def group_cluster(cluster: ClusterSpec, group: DeviceGroup) -> ClusterSpec:
    """One device group as a homogeneous cluster (its GPUs, node shape and fabrics)."""
    return ClusterSpec(name=f"{cluster.name}/{group.name}", gpu=group.gpu, nodes=group.nodes,
                       gpus_per_node=group.gpus_per_node, nvlink_domain_gpus=group.nvlink_domain_gpus,
                       intra_node=group.intra_node or cluster.intra_node,
                       inter_node=group.inter_node or cluster.inter_node, topology=cluster.topology,
                       price_per_gpu_hour_usd=(group.price_per_gpu_hour_usd if group.price_per_gpu_hour_usd
                                               is not None else cluster.price_per_gpu_hour_usd),
                       storage_bandwidth_bytes_per_s=cluster.storage_bandwidth_bytes_per_s)


def group_clusters(cluster: ClusterSpec) -> dict[str, ClusterSpec]:
    """Every device group by name (a homogeneous cluster is one group named after the cluster)."""
    if not cluster.device_groups:
        return {cluster.name: cluster}
    return {g.name: group_cluster(cluster, g) for g in cluster.device_groups}


# The plan ----------------------------------------------------------------------------------------------


class HeteroPlan(FrozenSpec):
    """A pipeline over device groups: per stage its group, tp, dp and layers; shared knobs."""

    stage_groups: tuple[str, ...]
    """Device group of each pipeline stage (stage 0 holds the embedding, the last the LM head)."""
    stage_tp: tuple[int, ...]
    """Tensor-parallel degree of each stage."""
    stage_dp: tuple[int, ...]
    """Data-parallel degree of each stage."""
    layers_per_stage: tuple[int, ...]
    """Transformer layers on each stage."""
    micro_batch_sequences: int = Field(ge=1)
    """Sequences of one pipeline micro-batch over a stage's dp ranks (each rank gets this / dp)."""
    global_batch: int = Field(ge=1)
    """Sequences per optimizer step."""
    vpp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    etp: int = Field(default=1, ge=1)
    recompute: RecomputeMode = "selective"
    framework: Framework = "megatron-core"
    optimizer_offload: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of the optimizer state in host memory on every stage (ParallelPlan.optimizer_offload)."""

    @model_validator(mode="after")
    def _check(self) -> HeteroPlan:
        pp = len(self.stage_groups)
        lengths = {len(self.stage_tp), len(self.stage_dp), len(self.layers_per_stage)}
        if pp == 0 or lengths != {pp}:
            raise ValueError(f"stage_groups, stage_tp, stage_dp and layers_per_stage need {pp} entries each")
        bad = [d for d in self.stage_dp if self.micro_batch_sequences % d]
        if bad:
            raise ValueError(f"micro_batch_sequences={self.micro_batch_sequences} is not a multiple of dp {bad}")
        return self

    @property
    def pp(self) -> int:
        return len(self.stage_groups)

    @property
    def stage_micro_batch(self) -> tuple[int, ...]:
        return tuple(self.micro_batch_sequences // d for d in self.stage_dp)

    @property
    def stage_gpus(self) -> tuple[int, ...]:
        return tuple(t * d * self.cp for t, d in zip(self.stage_tp, self.stage_dp))

    @property
    def num_microbatches(self) -> int:
        return num_microbatches(self.global_batch, self.micro_batch_sequences, 1)

    def gpus_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g, n in zip(self.stage_groups, self.stage_gpus):
            out[g] = out.get(g, 0) + n
        return out

    @property
    def launch_issue(self) -> str | None:
        """Why Megatron-LM cannot run this plan as one job (None: it can)."""
        if len(set(self.stage_tp)) > 1:
            return "tp differs between stages (" + _per_group(self, self.stage_tp) + "); one Megatron job has one tp"
        if len(set(self.stage_dp)) > 1:
            return "dp differs between stages (" + _per_group(self, self.stage_dp) + "); one Megatron job has one dp"
        return None

    def stage_plan(self, s: int) -> ParallelPlan:
        """The homogeneous plan stage ``s`` runs (its degrees, the whole pipeline's split)."""
        tp = self.stage_tp[s]
        return ParallelPlan(tp=tp, pp=self.pp, vpp=self.vpp, dp=self.stage_dp[s], cp=self.cp, ep=self.ep,
                            etp=self.etp, sequence_parallel=tp > 1, micro_batch=self.stage_micro_batch[s],
                            global_batch=self.global_batch, recompute=self.recompute,
                            layers_per_stage=self.layers_per_stage, framework=self.framework,
                            optimizer_offload=self.optimizer_offload)

    def megatron_plan(self) -> ParallelPlan:
        """The one-job Megatron plan (raises ValueError when :attr:`launch_issue` says there is none)."""
        if self.launch_issue:
            raise ValueError(self.launch_issue)
        return self.stage_plan(0)

    @classmethod
    def from_plan(cls, plan: ParallelPlan, group: str, layers: int) -> HeteroPlan:
        """A homogeneous plan run on one group."""
        split = plan.layers_per_stage or even_split(layers, plan.pp)
        return cls(stage_groups=(group,) * plan.pp, stage_tp=(plan.tp,) * plan.pp, stage_dp=(plan.dp,) * plan.pp,
                   layers_per_stage=tuple(int(x) for x in split), micro_batch_sequences=plan.dp * plan.micro_batch,
                   global_batch=plan.global_batch, vpp=plan.vpp, cp=plan.cp, ep=plan.ep, etp=plan.etp,
                   recompute=plan.recompute, framework=plan.framework, optimizer_offload=plan.optimizer_offload)


def _per_group(plan: HeteroPlan, values: tuple[int, ...]) -> str:
    seen: dict[str, set[int]] = {}
    for g, v in zip(plan.stage_groups, values):
        seen.setdefault(g, set()).add(v)
    return ", ".join(f"{'/'.join(str(v) for v in sorted(vs))} on {g}" for g, vs in seen.items())


class HeteroEstimate(FrozenSpec):
    """Predicted step of a HeteroPlan, per stage and per group."""

    step_time_s: float
    pipeline_s: float
    """m x the slowest stage + the fill and drain."""
    bubble_s: float
    """Fill and drain of the pipeline."""
    tail_s: float
    """Gradient sync and optimizer after the last micro-batch (the slowest stage's)."""
    inter_group_s: float
    """Exposed extra time of pipeline hops between groups, per micro-batch (the most any stage pays)."""
    stage_time_s: tuple[float, ...]
    """Forward + backward of one micro-batch on each stage (hops included)."""
    peak_memory_bytes: tuple[float, ...]
    memory_capacity_bytes: tuple[float, ...]
    """Usable memory of one GPU of each stage's group."""
    fits: bool
    tokens_per_s_per_gpu: float
    """Over the GPUs the plan uses."""
    mfu: float
    """Model FLOPs over the dense peak of the GPUs used, each at its own peak."""
    groups: dict[str, dict[str, float]]
    """Per group: gpus_used, gpus_total, stages, layers, busy_fraction (share of the step its stages
    compute micro-batches), mfu (its layers' model FLOPs over its GPUs' peak)."""


# Evaluation --------------------------------------------------------------------------------------------


@dataclass
class _Rows:
    """Plan rows of one group: which (plan, stage) each scored row stands for."""

    cols: dict[str, list]
    splits: list[tuple[int, ...]]
    key: dict[tuple, int]


def _group_rows(plans: list[HeteroPlan]) -> dict[str, _Rows]:
    rows: dict[str, _Rows] = {}
    for i, p in enumerate(plans):
        for s, g in enumerate(p.stage_groups):
            r = rows.setdefault(g, _Rows({k: [] for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "micro_batch",
                                                          "global_batch", "recompute", "optimizer_offload")}, [], {}))
            k = (i, p.stage_tp[s], p.stage_dp[s])
            if k in r.key:
                continue
            r.key[k] = len(r.splits)
            for name, v in (("tp", p.stage_tp[s]), ("pp", p.pp), ("vpp", p.vpp), ("dp", p.stage_dp[s]),
                            ("cp", p.cp), ("ep", p.ep), ("etp", p.etp), ("micro_batch", p.stage_micro_batch[s]),
                            ("global_batch", p.global_batch), ("recompute", RECOMPUTE_CODE[p.recompute]),
                            ("optimizer_offload", p.optimizer_offload)):
                r.cols[name].append(v)
            r.splits.append(p.layers_per_stage)
    return rows


def _arrays(cols: dict[str, list], splits) -> PlanArrays:
    n = len(splits)
    a = PlanArrays.from_columns(n, **{k: np.asarray(v, dtype=float) for k, v in cols.items()},
                                sp=np.asarray(cols["tp"]) > 1)
    width = max(len(x) for x in splits)
    sl = np.zeros((n, width))
    for i, x in enumerate(splits):
        sl[i, : len(x)] = x
    a.stage_layers = sl
    return a


def _crossing_s(model: ModelSpec, cluster: ClusterSpec, gcl: dict[str, ClusterSpec],
                profs: dict[str, HardwareProfile], p: HeteroPlan, s: int, t: int) -> float:
    """One pipeline hop between stage s and stage t on different groups (one rank pair)."""
    h, seq = model.hidden, model.seq_len

    def per_rank(i: int) -> float:
        tokens = p.stage_micro_batch[i] * seq / p.cp
        return tokens * h * 2.0 / (p.stage_tp[i] if p.stage_tp[i] > 1 else 1)

    nbytes = max(per_rank(s), per_rank(t))
    one = np.ones(1)
    sides = [float(comm.collective_time_s(profs[p.stage_groups[i]], gcl[p.stage_groups[i]], "send_recv",
                                          np.array([nbytes]), 2 * one, one, 2 * one)[0]) for i in (s, t)]
    link = cluster.inter_group_link
    if link is None:
        return max(sides) + P2P_FIXED_S
    bw = link.bandwidth_bytes_per_s
    if link.shared:
        bw = bw / min(p.stage_gpus[s], p.stage_gpus[t])
    return max(max(sides), nbytes / bw + link.latency_s) + P2P_FIXED_S


def estimate_hetero(model: ModelSpec, cluster: ClusterSpec, plans: list[HeteroPlan], *,
                    scorer=None) -> list[HeteroEstimate]:
    """Estimates of many HeteroPlans: one ``estimate_arrays`` call per group (``scorer`` replaces it, e.g.
    with per-plan MoE imbalance; it takes the same arguments)."""
    gcl = group_clusters(cluster)
    unknown = sorted({g for p in plans for g in p.stage_groups} - set(gcl))
    if unknown:
        raise ValueError(f"unknown device groups {unknown}; cluster {cluster.name} has {', '.join(gcl)}")
    profs = {g: load_profile(c.gpu).for_model(model) for g, c in gcl.items()}
    frameworks = {p.framework for p in plans}
    rows = _group_rows(plans)
    outs: dict[tuple[str, str], dict] = {}
    for fw in frameworks:
        for g, r in rows.items():
            outs[(g, fw)] = score_with(scorer, profs[g], fw)(model, gcl[g], _arrays(r.cols, r.splits))
    seq_flops = _sequence_flops(model)
    result = []
    for i, p in enumerate(plans):
        result.append(_compose(model, cluster, gcl, profs, p, i, rows, outs, seq_flops))
    return result


def _sequence_flops(model: ModelSpec) -> dict[str, float]:
    """Model FLOPs of one sequence (3x forward, attention non-causal, as flops.model_flops_per_step counts
    them) through a dense layer, an MoE layer, the logits and all multi-token-prediction modules."""
    s, h = model.seq_len, model.hidden
    f_dense = layer_forward_flops(model, s, s, moe=False, causal=False)
    f_moe = layer_forward_flops(model, s, s, moe=True, causal=False) if model.is_moe else f_dense
    f_mtp = layer_forward_flops(model, s, s, moe=model.is_moe_layer(model.layers - 1), causal=False)
    logits = 2.0 * s * h * model.vocab
    mtp = model.mtp_layers * (float(f_mtp["gemm"] + f_mtp["expert"] + f_mtp["attn"]) + 2.0 * s * 2 * h * h + logits)
    return {"dense": 3.0 * float(f_dense["gemm"] + f_dense["expert"] + f_dense["attn"]),
            "moe": 3.0 * float(f_moe["gemm"] + f_moe["expert"] + f_moe["attn"]),
            "logits": 3.0 * 2.0 * s * h * model.vocab, "mtp": 3.0 * mtp}


def _stage_flops(model: ModelSpec, p: HeteroPlan, seq_flops: dict[str, float]) -> np.ndarray:
    """Model FLOPs of each stage per step: its dense and MoE layers where the model places them; the logits and the
    multi-token-prediction modules on the last stage (megatron-core puts MTP there)."""
    start = np.cumsum((0,) + p.layers_per_stage[:-1])
    n_moe = model.moe_before(start + np.asarray(p.layers_per_stage)) - model.moe_before(start)
    n_dense = np.asarray(p.layers_per_stage) - n_moe
    stage_flops = p.global_batch * (n_dense * seq_flops["dense"] + n_moe * seq_flops["moe"])
    stage_flops[-1] += p.global_batch * seq_flops["logits"]
    if model.mtp_layers:
        stage_flops[-1] += p.global_batch * seq_flops["mtp"]
    return stage_flops


def _compose(model, cluster, gcl, profs, p: HeteroPlan, i: int, rows, outs, seq_flops) -> HeteroEstimate:
    """One plan's estimate from its groups' scored rows: each stage's time, tail and memory, the exposed
    extra of hops between groups, the step as compose_step builds it, and the MFU overall and per group."""
    pp = p.pp
    stage_t = np.zeros(pp)
    tail = np.zeros(pp)
    peak = np.zeros(pp)
    cap = np.zeros(pp)
    own_hop = np.zeros(pp)
    for s, g in enumerate(p.stage_groups):
        out = outs[(g, p.framework)]
        row = rows[g].key[(i, p.stage_tp[s], p.stage_dp[s])]
        stage_t[s] = out["stage_time_s"][row, s]
        tail[s] = out["stage_tail_s"][row, s]
        peak[s] = out["peak_memory_bytes"][row, s]
        cap[s] = out["memory_capacity_bytes"][row]
        own_hop[s] = out["details"]["p2p_s"][row]
    # Hops between groups: each boundary stage has one of its two hops per chunk across the link.
    extra = np.zeros(pp)
    bounds = [(s, s + 1) for s in range(pp - 1) if p.stage_groups[s] != p.stage_groups[s + 1]]
    if p.vpp > 1 and pp > 1 and p.stage_groups[-1] != p.stage_groups[0]:
        bounds.append((pp - 1, 0))
    for s, t in bounds:
        cross = _crossing_s(model, cluster, gcl, profs, p, s, t)
        for j in (s, t):
            # Blocking send/recv without virtual stages, as in estimate_arrays.
            overlap = FRAMEWORK[p.framework]["p2p_exposed"] if p.vpp > 1 else 1.0
            exposed = overlap * profs[p.stage_groups[j]].calibration.comm_exposed
            extra[j] += p.vpp * max(cross - own_hop[j], 0.0) * exposed
    stage_t = stage_t + extra
    m = p.num_microbatches
    pipe, fill = pipeline.pipeline_time_s(stage_t[None, :], np.ones((1, pp)), np.array([float(m)]), p.vpp)
    gpus = p.stage_gpus
    used = sum(gpus)
    # The step as estimate_arrays composes it (stragglers: the slowest of the plan's GPUs sets the pace).
    on_gpus = all(profs[g].kind == "gpu" for g in p.stage_groups)
    step, _ = step_time_s(float(pipe[0]), float(tail.max()), used, on_gpus)
    step = float(step)
    stage_flops = _stage_flops(model, p, seq_flops)
    dtype = gemm_dtype(model.precision)
    peak_s = np.array([profs[g].peak(dtype) for g in p.stage_groups])
    groups: dict[str, dict[str, float]] = {}
    for g in dict.fromkeys(p.stage_groups):
        idx = [s for s in range(pp) if p.stage_groups[s] == g]
        g_gpus = sum(gpus[s] for s in idx)
        groups[g] = {"gpus_used": float(g_gpus), "gpus_total": float(gcl[g].num_gpus), "stages": float(len(idx)),
                     "layers": float(sum(p.layers_per_stage[s] for s in idx)),
                     "busy_fraction": float(m * stage_t[idx].mean() / step),
                     "mfu": float(mfu(stage_flops[idx].sum(), step, g_gpus, profs[g].peak(dtype)))}
    # MFU as estimate_arrays computes it, over the GPUs' mean peak (one GPU type: its peak).
    peak_mean = float(peak_s[0]) if (peak_s == peak_s[0]).all() else float(np.dot(gpus, peak_s)) / used
    plan_mfu = float(mfu(float(model_flops_per_step(model, p.global_batch)), step, used, peak_mean))
    return HeteroEstimate(
        step_time_s=step, pipeline_s=float(pipe[0]), bubble_s=float(fill[0]), tail_s=float(tail.max()),
        inter_group_s=float(extra.max()), stage_time_s=tuple(float(x) for x in stage_t),
        peak_memory_bytes=tuple(float(x) for x in peak), memory_capacity_bytes=tuple(float(x) for x in cap),
        fits=bool((peak <= cap).all()), tokens_per_s_per_gpu=p.global_batch * model.seq_len / (step * used),
        mfu=plan_mfu, groups=groups)
