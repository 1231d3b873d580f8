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
the schedule (``pipeline.pipeline_time_s``) turns the stage times into the step. A plan that uses one
group only is scored exactly as ``estimate`` scores it on that group.

Stage times and peak memory are linear in a stage's dense and MoE layer counts (per stage: a constant for
the edges and hops, a cost per dense and per MoE layer), so :func:`stage_coefficients` reads them from three
probe splits, and :func:`optimal_split` finds the layer split that minimises the 1F1B pipeline time
m*max(t) + (sum(t) - max(t))/vpp exactly, under each stage's memory capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field, model_validator

from costmodel import comm, pipeline, scale
from costmodel.compute import gemm_dtype
from costmodel.estimate import FRAMEWORK, P2P_FIXED_S, RECOMPUTE_CODE, STEP_OVERHEAD_S, PlanArrays, estimate_arrays
from costmodel.flops import layer_forward_flops
from costmodel.profiles import HardwareProfile, load_profile
from costmodel.specs import ClusterSpec, DeviceGroup, Framework, ModelSpec, ParallelPlan, RecomputeMode, FrozenSpec

SPLIT_BATCH = 32
"""Thresholds scored together by the split's dynamic programme."""
SPLIT_MAX_ROUNDS = 16
"""Batches of thresholds tried above the min-max one before the split is returned as best found."""


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
        return max(1, self.global_batch // self.micro_batch_sequences)

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
                            layers_per_stage=self.layers_per_stage, framework=self.framework)

    def megatron_plan(self) -> ParallelPlan:
        """The one-job Megatron plan (raises ValueError when :attr:`launch_issue` says there is none)."""
        if self.launch_issue:
            raise ValueError(self.launch_issue)
        return self.stage_plan(0)

    @classmethod
    def from_plan(cls, plan: ParallelPlan, group: str, layers: int) -> HeteroPlan:
        """A homogeneous plan run on one group."""
        split = plan.layers_per_stage or tuple(pipeline.stage_split_even(layers, np.array([plan.pp]), plan.pp)[0]
                                               .astype(int))
        return cls(stage_groups=(group,) * plan.pp, stage_tp=(plan.tp,) * plan.pp, stage_dp=(plan.dp,) * plan.pp,
                   layers_per_stage=tuple(int(x) for x in split), micro_batch_sequences=plan.dp * plan.micro_batch,
                   global_batch=plan.global_batch, vpp=plan.vpp, cp=plan.cp, ep=plan.ep, etp=plan.etp,
                   recompute=plan.recompute, framework=plan.framework)


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
                                                          "global_batch", "recompute")}, [], {}))
            k = (i, p.stage_tp[s], p.stage_dp[s])
            if k in r.key:
                continue
            r.key[k] = len(r.splits)
            for name, v in (("tp", p.stage_tp[s]), ("pp", p.pp), ("vpp", p.vpp), ("dp", p.stage_dp[s]),
                            ("cp", p.cp), ("ep", p.ep), ("etp", p.etp), ("micro_batch", p.stage_micro_batch[s]),
                            ("global_batch", p.global_batch), ("recompute", RECOMPUTE_CODE[p.recompute])):
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


def _score(model, gcluster, arrays, prof, framework, scorer) -> dict[str, np.ndarray]:
    if scorer is None:
        return estimate_arrays(model, gcluster, arrays, profile=prof, framework=framework)
    return scorer(model, gcluster, arrays, profile=prof, framework=framework)


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
    profs = {g: load_profile(c.gpu) for g, c in gcl.items()}
    frameworks = {p.framework for p in plans}
    rows = _group_rows(plans)
    outs: dict[tuple[str, str], dict] = {}
    for fw in frameworks:
        for g, r in rows.items():
            outs[(g, fw)] = _score(model, gcl[g], _arrays(r.cols, r.splits), profs[g], fw, scorer)
    f_dense = layer_forward_flops(model, model.seq_len, model.seq_len, moe=False, causal=False)
    f_moe = (layer_forward_flops(model, model.seq_len, model.seq_len, moe=True, causal=False)
             if model.is_moe else f_dense)
    seq_flops = {"dense": 3.0 * float(f_dense["gemm"] + f_dense["expert"] + f_dense["attn"]),
                 "moe": 3.0 * float(f_moe["gemm"] + f_moe["expert"] + f_moe["attn"]),
                 "logits": 3.0 * 2.0 * model.seq_len * model.hidden * model.vocab}
    result = []
    for i, p in enumerate(plans):
        result.append(_compose(model, cluster, gcl, profs, p, i, rows, outs, seq_flops))
    return result


def _compose(model, cluster, gcl, profs, p: HeteroPlan, i: int, rows, outs, seq_flops) -> HeteroEstimate:
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
    # Stragglers, as in estimate_arrays: the slowest of the plan's GPUs sets the pipeline's pace.
    on_gpus = all(profs[g].kind == "gpu" for g in p.stage_groups)
    strag = float(scale.straggler_fraction(used)) * float(pipe[0]) * on_gpus
    step = float(pipe[0]) + strag + float(tail.max()) + STEP_OVERHEAD_S
    # Model FLOPs of each stage: its layers (dense first for MoE models) and the logits on the last stage.
    start = np.cumsum((0,) + p.layers_per_stage[:-1])
    n_dense = np.clip((model.dense_layers if model.is_moe else model.layers) - start, 0, p.layers_per_stage)
    n_moe = np.asarray(p.layers_per_stage) - n_dense
    stage_flops = p.global_batch * (n_dense * seq_flops["dense"] + n_moe * seq_flops["moe"])
    stage_flops[-1] += p.global_batch * seq_flops["logits"]
    dtype = gemm_dtype(model.precision)
    peak_s = np.array([profs[g].peak(dtype) for g in p.stage_groups])
    groups: dict[str, dict[str, float]] = {}
    for g in dict.fromkeys(p.stage_groups):
        idx = [s for s in range(pp) if p.stage_groups[s] == g]
        g_gpus = sum(gpus[s] for s in idx)
        groups[g] = {"gpus_used": float(g_gpus), "gpus_total": float(gcl[g].num_gpus), "stages": float(len(idx)),
                     "layers": float(sum(p.layers_per_stage[s] for s in idx)),
                     "busy_fraction": float(m * stage_t[idx].mean() / step),
                     "mfu": float(stage_flops[idx].sum() / (step * g_gpus * profs[g].peak(dtype)))}
    flops = float(stage_flops.sum())
    return HeteroEstimate(
        step_time_s=step, pipeline_s=float(pipe[0]), bubble_s=float(fill[0]), tail_s=float(tail.max()),
        inter_group_s=float(extra.max()), stage_time_s=tuple(float(x) for x in stage_t),
        peak_memory_bytes=tuple(float(x) for x in peak), memory_capacity_bytes=tuple(float(x) for x in cap),
        fits=bool((peak <= cap).all()), tokens_per_s_per_gpu=p.global_batch * model.seq_len / (step * used),
        mfu=flops / (step * float(np.dot(gpus, peak_s))), groups=groups)


# Linear stage costs and the exact split -------------------------------------------------------------------


def stage_coefficients(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, *, profile=None,
                       framework: str = "megatron-core", scorer=None) -> dict[str, np.ndarray]:
    """Per-stage linear costs of every plan row (stage_layers ignored), each (n, max pp):

    ``time0`` / ``mem0``: stage time and peak memory with no layers; ``time_dense`` / ``time_moe`` and
    ``mem_dense`` / ``mem_moe``: what one dense / MoE layer adds; and ``capacity`` (n,). Read from
    ``estimate_arrays`` on three probe splits (no layers, one dense layer, one MoE layer on every stage).
    """
    prof = profile or load_profile(cluster.gpu)
    width = int(plans.pp.max())
    pp = plans.pp.astype(int)
    on = (np.arange(width)[None, :] < pp[:, None]).astype(float)

    def probe(mdl, layers):
        a = PlanArrays(**{k: v for k, v in plans.__dict__.items() if k != "stage_layers"},
                       stage_layers=layers * on)
        return _score(mdl, cluster, a, prof, framework, scorer)

    zero = probe(model, 0.0)
    dense_model = model.model_copy(update={"dense_layers": model.layers}) if model.is_moe else model
    one_d = probe(dense_model, 1.0)
    one_m = probe(model.model_copy(update={"dense_layers": 0}), 1.0) if model.is_moe else one_d
    t0, m0 = zero["stage_time_s"], zero["peak_memory_bytes"]
    return {"time0": t0, "time_dense": one_d["stage_time_s"] - t0, "time_moe": one_m["stage_time_s"] - t0,
            "mem0": m0, "mem_dense": one_d["peak_memory_bytes"] - m0, "mem_moe": one_m["peak_memory_bytes"] - m0,
            "capacity": zero["memory_capacity_bytes"]}


@dataclass(frozen=True)
class Split:
    layers_per_stage: tuple[int, ...]
    pipeline_s: float
    """m*max(t) + (sum(t) - max(t))/vpp of the split, from the linear stage costs."""
    fits: bool
    """Every stage within its capacity (False: no split fits, this is the fastest ignoring memory)."""
    exact: bool
    """False when the threshold search stopped at SPLIT_MAX_ROUNDS before proving optimality."""


def _interval_costs(a, b_dense, b_moe, layers: int, dense_layers: int) -> np.ndarray:
    """cost[s, u, v] = a_s + (layers u..v-1 of stage s), inf for v < u."""
    j = np.arange(layers + 1)
    nd = np.minimum(j, dense_layers)
    prefix = np.asarray(b_dense)[:, None] * nd[None, :] + np.asarray(b_moe)[:, None] * (j - nd)[None, :]
    c = np.asarray(a)[:, None, None] + prefix[:, None, :] - prefix[:, :, None]
    return np.where(j[None, None, :] >= j[None, :, None], c, np.inf)


def _count_ok(pp: int, layers: int) -> np.ndarray:
    """Allowed (stage, u, v): middle stages hold >= 1 layer, the edge stages >= 0, pp = 1 all layers."""
    j = np.arange(layers + 1)
    n = j[None, :] - j[:, None]
    ok = np.zeros((pp, layers + 1, layers + 1), bool)
    for s in range(pp):
        if pp == 1:
            ok[s] = (n == layers)
        elif s in (0, pp - 1):
            ok[s] = n >= 0
        else:
            ok[s] = n >= 1
    ok[0, 1:, :] = False                    # the first stage starts at layer 0
    ok[pp - 1, :, :layers] = False          # the last stage ends at the last layer
    return ok


def _min_sum(cost: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Least sum of stage costs with every stage <= threshold, for each threshold. Shape (nT,)."""
    pp, L1, _ = cost.shape
    T = np.asarray(thresholds, dtype=float)[:, None, None]
    F = np.full((len(T), L1), np.inf)
    F[:, 0] = 0.0
    for s in range(pp):
        c = np.where(cost[s][None] <= T, cost[s][None], np.inf)
        F = np.min(F[:, :, None] + c, axis=1)
    return F[:, -1]


def _min_max(cost: np.ndarray) -> float:
    """Least achievable largest stage cost (inf when no split is allowed)."""
    pp, L1, _ = cost.shape
    F = np.full(L1, np.inf)
    F[0] = -np.inf
    for s in range(pp):
        F = np.min(np.maximum(F[:, None], cost[s]), axis=0)
    return float(F[-1])


def _reconstruct(cost: np.ndarray, threshold: float) -> tuple[int, ...]:
    pp, L1, _ = cost.shape
    c = np.where(cost <= threshold, cost, np.inf)
    F = np.full((pp + 1, L1), np.inf)
    F[0, 0] = 0.0
    arg = np.zeros((pp, L1), dtype=int)
    for s in range(pp):
        tot = F[s][:, None] + c[s]
        arg[s] = np.argmin(tot, axis=0)
        F[s + 1] = tot[arg[s], np.arange(L1)]
    split, v = [], L1 - 1
    for s in range(pp - 1, -1, -1):
        u = int(arg[s, v])
        split.append(v - u)
        v = u
    return tuple(reversed(split))


def optimal_split(time0, time_dense, time_moe, mem0, mem_dense, mem_moe, capacity, *, layers: int,
                  dense_layers: int, microbatches: int, vpp: int = 1) -> Split:
    """The split of ``layers`` (the first ``dense_layers`` dense) over the stages that minimises
    m*max(t) + (sum(t) - max(t))/vpp with linear stage costs t_s = time0_s + time_dense_s*n_dense +
    time_moe_s*n_moe, every stage's memory mem0_s + mem_dense_s*n_dense + mem_moe_s*n_moe <= capacity_s
    (scalar or per stage), the middle stages non-empty.

    Exact: with alpha = m - 1/vpp and beta = 1/vpp the optimum is min over thresholds T of
    alpha*T + beta*S(T), S(T) the least sum of stage costs with every stage <= T (a dynamic programme over
    (stage, layers used)); T ranges over the stage costs any interval can take, from the smallest feasible
    one up to where alpha*T + beta*S(no threshold) cannot beat the best found.
    """
    pp = len(time0)
    if layers < max(pp - 2, 0) or (pp == 1 and layers < 1):
        raise ValueError(f"no split: {layers} layers cannot fill the {max(pp - 2, 1)} stage(s) that must hold one")
    cost = _interval_costs(time0, time_dense, time_moe, layers, dense_layers)
    mem = _interval_costs(mem0, mem_dense, mem_moe, layers, dense_layers)
    cap = np.broadcast_to(np.asarray(capacity, dtype=float), (pp,))
    count_ok = _count_ok(pp, layers)
    fits = True
    allowed = count_ok & (mem <= cap[:, None, None])
    if not np.isfinite(_min_sum(np.where(allowed, cost, np.inf), np.array([np.inf]))[0]):
        fits, allowed = False, count_ok
    cost = np.where(allowed, cost, np.inf)
    alpha, beta = microbatches - 1.0 / vpp, 1.0 / vpp
    t_star = _min_max(cost)
    s_star, s_free = _min_sum(cost, np.array([t_star, np.inf]))
    best_val, best_t, exact = alpha * t_star + beta * s_star, t_star, True
    # Thresholds that could still win: alpha*T + beta*s_free < best_val.
    finite = cost[np.isfinite(cost)]
    cand = np.unique(finite[(finite > t_star) & (alpha * finite + beta * s_free < best_val)])
    for rounds, k in enumerate(range(0, len(cand), SPLIT_BATCH)):
        ts = cand[k: k + SPLIT_BATCH]
        ts = ts[alpha * ts + beta * s_free < best_val]
        if not len(ts):
            break
        if rounds == SPLIT_MAX_ROUNDS:
            exact = False
            break
        vals = alpha * ts + beta * _min_sum(cost, ts)
        j = int(np.argmin(vals))
        if vals[j] < best_val:
            best_val, best_t = float(vals[j]), float(ts[j])
    split = _reconstruct(cost, best_t)
    t = np.array([time0[s] + _layer_sum(time_dense[s], time_moe[s], split, s, dense_layers) for s in range(pp)])
    pipe = microbatches * t.max() + (t.sum() - t.max()) / vpp
    return Split(split, float(pipe), fits, exact)


def _layer_sum(b_dense: float, b_moe: float, split: tuple[int, ...], s: int, dense_layers: int) -> float:
    u = sum(split[:s])
    nd = min(max(dense_layers - u, 0), split[s])
    return b_dense * nd + b_moe * (split[s] - nd)
