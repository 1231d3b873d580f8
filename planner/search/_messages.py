"""No-fit messages: why nothing fits a request, and the smallest change (more nodes) that would."""

from __future__ import annotations

import numpy as np

from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.plan import PlanArrays
from planner.search._results import CostFn, SearchResult, default_cost, to_plan
from planner.search._strategy import exhaustive
from planner.space import layout

GB = 1e9


def explain_no_fit(model: ModelSpec, cluster: ClusterSpec, global_batch: int, result: SearchResult,
                   cost: CostFn = default_cost, max_doublings: int = 6, **space_kw) -> str:
    """Why nothing fits, and the smallest change that would: the closest plan's memory against capacity and
    what dominates it, then the fewest nodes (doubling) at which some layout fits (``space_kw``: the
    candidate-space keywords the search ran with, planner.space.candidate_columns)."""
    i = int(result.order[0])
    peak = float(np.nanmax(result.scores["peak_memory_bytes"][i]))
    cap = float(result.scores["memory_capacity_bytes"][i])
    parts = {k: float(result.scores[k][i]) for k in ("weights_bytes", "grads_bytes", "optimizer_bytes",
                                                     "activations_bytes")}
    top = max(parts, key=parts.get).removesuffix("_bytes")
    p = to_plan(result.plans, i)
    msg = (f"no layout fits: the closest ({layout(p.model_dump())}, {p.recompute} recompute, micro-batch "
           f"{p.micro_batch}) needs {peak / GB:.0f} GB per GPU against {cap / GB:.0f} GB usable, mostly {top}")
    msg += offload_alternative(model, cluster, result, cost)
    for k in range(1, max_doublings + 1):
        bigger = cluster.model_copy(update={"nodes": cluster.nodes * 2**k})
        res = exhaustive(model, bigger, global_batch, cost, **space_kw)
        if res.any_fits:
            q = to_plan(res.plans, int(res.order[0]))
            return (msg + f"; smallest change that fits: {bigger.num_gpus} GPUs ({bigger.nodes} nodes) with "
                    f"{layout(q.model_dump())}, {q.recompute} recompute, micro-batch {q.micro_batch}")
    return msg + f"; even {cluster.num_gpus * 2**max_doublings} GPUs do not fit it: a GPU with more memory is needed"


def offload_alternative(model: ModelSpec, cluster: ClusterSpec, result: SearchResult, cost: CostFn = default_cost) -> str:
    """'; on these GPUs with the optimizer state in host memory: ...' where the candidates with a sharded optimizer
    state fit with all of it offloaded (optimizer_offload 1: megatron-core --optimizer-cpu-offload), the fastest of
    them; '' where none does, every candidate offloads all of it already, or the GPU's host is unknown (the cost
    model prices such plans at infinity)."""
    a = result.plans
    keep = np.flatnonzero((a.zero_stage >= 1) & (a.optimizer_offload < 1.0))
    if keep.size == 0:
        return ""
    cols = {k: v[keep].copy() for k, v in a.__dict__.items() if k != "stage_layers" and v is not None}
    cols["optimizer_offload"] = np.ones(keep.size)
    stage = None if a.stage_layers is None else a.stage_layers[keep]
    off = PlanArrays(**cols, stage_layers=stage)
    scores = cost(model, cluster, off)
    step = np.asarray(scores["step_time_s"], dtype=float)
    ok = np.flatnonzero(np.asarray(scores["fits"]) & np.isfinite(step))
    if ok.size == 0:
        return ""
    j = int(ok[np.argmin(step[ok])])
    q = to_plan(off, j)
    return (f"; on these GPUs with the optimizer state in host memory (optimizer_offload 1, megatron-core "
            f"--optimizer-cpu-offload): {layout(q.model_dump())}, {q.recompute} recompute, micro-batch "
            f"{q.micro_batch} fits at {step[j]:.1f} s per step, {float(scores['optimizer_s'][j]):.1f} s of it the CPU "
            f"optimizer step (plan check --optimizer-offload 1 with that layout)")
