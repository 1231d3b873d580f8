"""Planning on a heterogeneous cluster: which device group runs which pipeline stages, with which tp and dp,
and how many layers each stage gets (the cost model is ``costmodel/hetero.py``).

The search scores three families with the same cost model and ranks them together:

* **alone**: every group by itself, searched exhaustively as a homogeneous cluster (``planner.search``);
* **uniform**: all groups with one tp/dp and the even layer split, as a planner blind to the GPU types
  would place them (stages in the groups' order);
* **mixed**: every order of two or more groups, each with its own (tp, dp) using all of its GPUs (its stage
  count follows), a shared pipeline micro-batch of B sequences (B / dp per rank), vpp, recompute, cp, ep;
  each layout gets the exact min-time layer split under every stage's memory (``optimal_split``).

Mixed layouts are many; each has a lower bound on its step (fractional layers, memory capacities respected),
and they are split and scored in lower-bound order until the bound cannot beat the ``top``-th best plan that
fits (branch and bound). Each layout's split minimises its pipeline time exactly; the step adds the exactly
scored gradient-sync / optimizer tail and hops, which the split does not trade against (on a 2+2-GPU cluster
the result equals a brute force over every layout and split, tests/test_hetero.py). The best plan is at least
as fast as the best single-group plan and the best uniform plan, which are ranked with it.

A plan with different tp or dp per stage is reported but flagged: Megatron-LM runs one tp and one dp per
job (:attr:`HeteroPlan.launch_issue`); same tp/dp with an uneven split is launchable through
``--pipeline-model-parallel-layout``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from costmodel.estimate import STEP_OVERHEAD_S

from costmodel.plan import RECOMPUTE_NAMES, PlanArrays, even_split, num_microbatches, offload_tag
from costmodel.hetero import HeteroEstimate, HeteroPlan, estimate_hetero, group_clusters
from costmodel.profiles import InputError, load_profile
from costmodel.rules import divisors, valid_mask
from costmodel.specs import ClusterSpec, ModelSpec
from costmodel.split import optimal_split, stage_coefficients
from planner.search import default_cost, exhaustive
from planner.space import MICRO_BATCHES, cp_degrees, ep_degrees, missing_host_fields, recompute_modes

TP_CHOICES = (1, 2, 4, 8)
VPP_CHOICES = (1, 2)
MAX_PP = 64
BATCH = 32
"""Mixed layouts split and scored together."""
ALONE_KEEP = 3
"""Best plans of each group alone kept in the ranking."""


@dataclass
class Scored:
    plan: HeteroPlan
    est: HeteroEstimate
    kind: str
    """'mixed', 'uniform' or 'alone'."""


@dataclass
class HeteroResult:
    ranked: list[Scored]
    """Best first: plans that fit by step time, then the rest by memory over capacity."""
    alone: dict[str, Scored | None]
    """Best plan of each group by itself (None: nothing valid fits there)."""
    uniform: Scored | None
    """Best plan with one tp/dp over every group and the even split."""
    global_batch: int
    counts: dict[str, int] = field(default_factory=dict)
    """layouts (mixed, valid), split (solved exactly), scored (estimated), alone/uniform (scored)."""

    @property
    def any_fits(self) -> bool:
        return bool(self.ranked) and self.ranked[0].est.fits

    def best_launchable(self) -> Scored | None:
        return next((s for s in self.ranked if s.est.fits and s.plan.launch_issue is None), None)

    def fast_group(self) -> str | None:
        """The group whose best plan alone is fastest."""
        done = {g: s for g, s in self.alone.items() if s is not None}
        return min(done, key=lambda g: done[g].est.step_time_s) if done else None


def _fits_key(s: Scored) -> tuple:
    over = max(p / c for p, c in zip(s.est.peak_memory_bytes, s.est.memory_capacity_bytes))
    return (0, s.est.step_time_s) if s.est.fits else (1, over)


# Alone and uniform -----------------------------------------------------------------------------------


def _alone(model, cluster, gcl, gbs, cost, scorer, offload: float = 0.0) -> tuple[dict[str, Scored | None],
                                                                                 list[Scored]]:
    best: dict[str, Scored | None] = {}
    kept: list[Scored] = []
    for g, gc in gcl.items():
        # A HeteroPlan has no ZeRO stage (it runs the distributed optimizer): search the layouts it can hold.
        res = exhaustive(model, gc, gbs, cost, zero_stages=(1,), **({"optimizer_offload": offload} if offload else {}))
        n = min(ALONE_KEEP, len(res.order)) if res.evaluated else 0
        plans = [HeteroPlan.from_plan(res.split_plan(r), g, model.layers) for r in range(n)]
        scored = [Scored(p, e, "alone") for p, e in zip(plans, estimate_hetero(model, cluster, plans, scorer=scorer))]
        scored.sort(key=_fits_key)
        best[g] = scored[0] if scored and scored[0].est.fits else None
        kept += scored
    return best, kept


def _uniform(model, cluster, gcl, gbs, scorer, offload: float = 0.0) -> list[Scored]:

    names = list(gcl)
    sizes = [gcl[g].num_gpus for g in names]
    plans = []
    for tp, cp, ep in itertools.product(TP_CHOICES, cp_degrees(model), ep_degrees(model)):
        if any(tp > gcl[g].domain_gpus for g in names):
            continue
        for dp in divisors(min(sizes) // (tp * cp)) if min(sizes) % (tp * cp) == 0 else []:
            stage = tp * cp * dp
            if any(n % stage for n in sizes):
                continue
            ks = [n // stage for n in sizes]
            pp = sum(ks)
            if pp > min(model.layers, MAX_PP):
                continue
            split = even_split(model.layers, pp)
            groups = tuple(g for g, k in zip(names, ks) for _ in range(k))
            for mbs, rc in itertools.product(MICRO_BATCHES, recompute_modes(model, cluster)):
                if gbs % (dp * mbs):
                    continue
                plans.append(HeteroPlan(stage_groups=groups, stage_tp=(tp,) * pp, stage_dp=(dp,) * pp,
                                        layers_per_stage=split, micro_batch_sequences=dp * mbs, global_batch=gbs,
                                        cp=cp, ep=ep, recompute=rc, optimizer_offload=offload))
    plans = [p for p, ok in zip(plans, _valid([[_stage_row(p, s) for s in range(p.pp)] for p in plans], model))
             if ok]
    if not plans:
        return []
    return [Scored(p, e, "uniform") for p, e in zip(plans, estimate_hetero(model, cluster, plans, scorer=scorer))]


def _stage_row(p: HeteroPlan, s: int) -> tuple:
    return (p.stage_tp[s], p.pp, p.vpp, p.stage_dp[s], p.cp, p.ep, p.stage_micro_batch[s], p.global_batch)


def _valid(stage_rows: list[list[tuple]], model: ModelSpec) -> np.ndarray:
    """Whether every stage row of each layout passes Megatron's rules (as a plan of that stage's degrees)."""
    flat = [r for rows in stage_rows for r in rows]
    owner = np.repeat(np.arange(len(stage_rows)), [len(rows) for rows in stage_rows])
    good = np.ones(len(stage_rows), bool)
    if flat:
        np.logical_and.at(good, owner, valid_mask(model, _rule_cols(flat), None))
    return good


def _rule_cols(rows: list[tuple]) -> dict[str, np.ndarray]:
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 8)
    names = ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch")
    cols = {k: arr[:, i] for i, k in enumerate(names)}
    cols["sequence_parallel"] = cols["tp"] > 1
    cols["uneven"] = np.ones(len(arr), bool)
    return cols


# Mixed layouts ----------------------------------------------------------------------------------------


@dataclass
class _Layouts:
    """Mixed layouts as columns: order (tuple of group names), per-group (tp, dp, k), B, vpp, rc, cp, ep."""

    rows: list[tuple]
    coef_row: list[list[tuple[str, int]]]


def _shapes(model: ModelSpec, gc: ClusterSpec, cp: int) -> list[tuple[int, int, int]]:
    n = gc.num_gpus
    out = []
    for tp in TP_CHOICES:
        if tp > gc.domain_gpus or n % (tp * cp) or model.heads % tp:
            continue
        for dp in divisors(n // (tp * cp)):
            out.append((tp, dp, n // (tp * cp * dp)))
    return out


def _mixed_layouts(model: ModelSpec, gcl: dict[str, ClusterSpec], gbs: int) -> list[tuple]:
    names = list(gcl)
    rows = []
    for cp, ep in itertools.product(cp_degrees(model), ep_degrees(model)):
        shapes = {g: _shapes(model, gcl[g], cp) for g in names}
        for r in range(2, len(names) + 1):
            for order in itertools.permutations(names, r):
                for combo in itertools.product(*(shapes[g] for g in order)):
                    pp = sum(k for _, _, k in combo)
                    if pp > min(model.layers, MAX_PP):
                        continue
                    dps = [dp for _, dp, _ in combo]
                    Bs = {dp * mb for dp in dps for mb in MICRO_BATCHES}
                    for B in sorted(Bs):
                        if gbs % B or any(B % dp or B // dp > MICRO_BATCHES[-1] for dp in dps):
                            continue
                        for vpp, rc in itertools.product(VPP_CHOICES, (0, 1, 2)):
                            if vpp > 1 and pp < 3:
                                continue
                            rows.append((order, combo, B, vpp, rc, cp, ep))
    return rows


def _valid_layouts(model: ModelSpec, rows: list[tuple], gbs: int) -> list[tuple]:
    stage_rows = []
    for order, combo, B, vpp, rc, cp, ep in rows:
        pp = sum(k for _, _, k in combo)
        stage_rows.append([(tp, pp, vpp, dp, cp, ep, B // dp, gbs) for tp, dp, _ in combo])
    return [r for r, ok in zip(rows, _valid(stage_rows, model)) if ok]


def _coefficients(model, gcl, profs, rows, gbs, scorer,
                  offload: float = 0.0) -> tuple[dict[str, dict], dict[tuple, tuple[str, int]]]:
    """Linear stage costs of every (group, tp, dp, micro-batch, pp, vpp, recompute, cp, ep) the layouts use."""
    keys: dict[str, dict[tuple, int]] = {g: {} for g in gcl}
    for order, combo, B, vpp, rc, cp, ep in rows:
        pp = sum(k for _, _, k in combo)
        for g, (tp, dp, _) in zip(order, combo):
            keys[g].setdefault((tp, dp, B // dp, pp, vpp, rc, cp, ep), len(keys[g]))
    coef = {}
    for g, ks in keys.items():
        if not ks:
            continue
        arr = np.asarray(list(ks), dtype=float)
        plans = PlanArrays.from_columns(len(arr), tp=arr[:, 0], dp=arr[:, 1], micro_batch=arr[:, 2], pp=arr[:, 3],
                                        vpp=arr[:, 4], recompute=arr[:, 5], cp=arr[:, 6], ep=arr[:, 7],
                                        sp=arr[:, 0] > 1, global_batch=gbs, optimizer_offload=offload)
        coef[g] = stage_coefficients(model, gcl[g], plans, profile=profs[g], scorer=scorer)
    return coef, keys


def _stage_table(rows, coef, keys) -> dict[str, np.ndarray]:
    """Per layout and stage: the six linear coefficients and the capacity (padded with NaN)."""
    width = max(sum(k for _, _, k in r[1]) for r in rows)
    names = ("time0", "time_dense", "time_moe", "mem0", "mem_dense", "mem_moe", "capacity")
    out = {k: np.full((len(rows), width), np.nan) for k in names}
    for i, (order, combo, B, vpp, rc, cp, ep) in enumerate(rows):
        pp = sum(k for _, _, k in combo)
        s = 0
        for g, (tp, dp, k) in zip(order, combo):
            r = keys[g][(tp, dp, B // dp, pp, vpp, rc, cp, ep)]
            for k_name in names[:-1]:
                out[k_name][i, s:s + k] = coef[g][k_name][r, s:s + k]
            out["capacity"][i, s:s + k] = coef[g]["capacity"][r]
            s += k
    return out


def lower_bounds(tab: dict[str, np.ndarray], layers: int, n_dense: int, m: np.ndarray,
                 vpp: np.ndarray) -> np.ndarray:
    """A step no split of each layout can beat, inf where no split can fit in memory.

    Relaxation with fractional layers, every layer at its stage's cheaper kind (time and memory separately):
    stage s holds at most floor((capacity_s - mem0_s) / mem-per-layer_s) layers, every stage fits empty, and the
    dense and the MoE layers, each at its cheapest stage, fit in the stages' room summed; T = the least max stage
    time that places every layer; the bound is (m - 1/vpp) * T + (1/vpp) * (sum of the fixed stage times + every layer
    at the cheapest stage) + the fixed step overhead. Vectorised bisection over layouts.
    """
    valid = ~np.isnan(tab["time0"])

    def per_layer(kind: str) -> np.ndarray:
        if n_dense >= layers:
            x = tab[f"{kind}_dense"]
        elif n_dense == 0:
            x = tab[f"{kind}_moe"]
        else:
            x = np.minimum(tab[f"{kind}_dense"], tab[f"{kind}_moe"])
        return np.where(valid, np.maximum(x, 1e-15), 1.0)

    b, d = per_layer("time"), per_layer("mem")
    a = np.where(valid, tab["time0"], 0.0)
    # whole layers: the float slack keeps a layer that fits to the last byte
    hold = np.where(valid, np.clip(np.floor((tab["capacity"] - tab["mem0"]) / d + 1e-9), 0.0, layers), 0.0)
    feasible = hold.sum(axis=1) >= layers
    # ... and all of them together: every stage within its capacity even when empty, and the dense and the MoE
    # layers each at their cheapest stage within the stages' room summed
    room_s = np.where(valid, tab["capacity"] - tab["mem0"], 0.0)
    cheapest = {kind: np.where(valid, np.maximum(tab[f"mem_{kind}"], 0.0), np.inf).min(axis=1)
                for kind in ("dense", "moe")}
    need = n_dense * cheapest["dense"] + (layers - n_dense) * cheapest["moe"]
    empty_fits = np.where(valid, room_s >= -1e-9 * np.abs(np.where(valid, tab["capacity"], 0.0)), True).all(axis=1)
    feasible &= empty_fits & (need <= room_s.sum(axis=1) * (1 + 1e-12))
    lo = np.where(valid, a, -np.inf).max(axis=1)
    hi = np.maximum(lo + layers * np.where(valid, b, 0.0).max(axis=1), np.where(valid, a + b * hold, 0.0).max(axis=1))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        room = np.where(valid, np.minimum(np.maximum(mid[:, None] - a, 0.0) / b, hold), 0.0).sum(axis=1)
        enough = room >= layers * (1 - 1e-12)
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    least_sum = a.sum(axis=1) + layers * np.where(valid, b, np.inf).min(axis=1)
    bound = (m - 1.0 / vpp) * lo + least_sum / vpp + STEP_OVERHEAD_S
    return np.where(feasible, bound, np.inf)


def _split_plan(model, row, tab_row: dict[str, np.ndarray], gbs: int, offload: float = 0.0) -> HeteroPlan | None:
    order, combo, B, vpp, rc, cp, ep = row
    pp = sum(k for _, _, k in combo)
    sl = slice(0, pp)
    try:
        split = optimal_split(*(tab_row[k][sl] for k in ("time0", "time_dense", "time_moe", "mem0", "mem_dense",
                                                           "mem_moe", "capacity")),
                              dense_before=model.dense_prefix(), microbatches=num_microbatches(gbs, B, 1), vpp=vpp)
    except ValueError:
        return None
    groups = tuple(g for g, (_, _, k) in zip(order, combo) for _ in range(k))
    tps = tuple(tp for tp, _, k in combo for _ in range(k))
    dps = tuple(dp for _, dp, k in combo for _ in range(k))
    return HeteroPlan(stage_groups=groups, stage_tp=tps, stage_dp=dps, layers_per_stage=split.layers_per_stage,
                      micro_batch_sequences=B, global_batch=gbs, vpp=vpp, cp=cp, ep=ep,
                      recompute=RECOMPUTE_NAMES[rc], optimizer_offload=offload)


# The search --------------------------------------------------------------------------------------------


def hetero_search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, *, top: int = 10,
                  scorer: Callable | None = None, cost: Callable | None = None,
                  progress: Callable[[int, int], None] | None = None, optimizer_offload: float = 0.0) -> HeteroResult:
    """The fastest plans that fit on a cluster with device groups (see the module docstring).

    ``scorer`` replaces ``estimate_arrays`` in every estimate (e.g. planner.routing.Routing.scorer()), ``cost``
    the homogeneous search's cost function (Routing.cost); ``progress(done, total)`` follows the mixed layouts.
    ``optimizer_offload`` F: every plan keeps that share of its optimizer state in host memory (each group's GPU
    profile must know its host: planner.space.missing_host_fields).
    """
    if not cluster.device_groups:
        raise InputError(f"{cluster.name}: not a heterogeneous cluster (no device_groups)")
    gcl = group_clusters(cluster)
    profs = {g: load_profile(c.gpu) for g, c in gcl.items()}
    if optimizer_offload:
        for g, c in gcl.items():
            if missing := missing_host_fields(c.gpu):
                raise InputError(f"{cluster.name}: optimizer offload needs the host of group {g!r} ({c.gpu}), and its "
                                 f"profile has no {' or '.join(missing)}; valid: optimizer offload 0")
    off = float(optimizer_offload)
    alone, kept = _alone(model, cluster, gcl, global_batch, cost or default_cost, scorer, off)
    uniform = sorted(_uniform(model, cluster, gcl, global_batch, scorer, off), key=_fits_key)
    all_rows = _mixed_layouts(model, gcl, global_batch)
    rows = _valid_layouts(model, all_rows, global_batch)
    scored: list[Scored] = kept + uniform[:ALONE_KEEP]
    counts = {"layouts": len(all_rows), "valid": len(rows), "alone": len(kept), "uniform": len(uniform),
              "split": 0, "scored": 0}
    if rows:
        coef, keys = _coefficients(model, gcl, profs, rows, global_batch, scorer, off)
        tab = _stage_table(rows, coef, keys)
        m = np.array([num_microbatches(global_batch, r[2], 1) for r in rows], dtype=float)
        vpp = np.array([r[3] for r in rows], dtype=float)
        lb = lower_bounds(tab, model.layers, model.layers - model.moe_layers, m, vpp)
        order = np.argsort(lb, kind="stable")
        order = order[np.isfinite(lb[order])]     # layouts no split can fit are never split
        counts["can_fit"] = len(order)
        fitting = sorted(s.est.step_time_s for s in scored if s.est.fits)
        done = 0
        for start in range(0, len(order), BATCH):
            idx = order[start:start + BATCH]
            if len(fitting) >= top and lb[idx[0]] >= fitting[top - 1]:
                break
            plans = [p for i in idx if (p := _split_plan(model, rows[i], {k: v[i] for k, v in tab.items()},
                                                          global_batch, off)) is not None]
            counts["split"] += len(idx)
            if plans:
                batch = [Scored(p, e, "mixed") for p, e in zip(plans, estimate_hetero(model, cluster, plans,
                                                                                      scorer=scorer))]
                counts["scored"] += len(batch)
                scored += batch
                fitting = sorted(fitting + [s.est.step_time_s for s in batch if s.est.fits])
            done += len(idx)
            if progress:
                progress(done, len(order))
        if progress:
            progress(len(order), len(order))
    unique: dict[HeteroPlan, Scored] = {}
    for s in sorted(scored, key=_fits_key):
        unique.setdefault(s.plan, s)
    return HeteroResult(list(unique.values()), alone, uniform[0] if uniform and uniform[0].est.fits else None,
                        global_batch, counts)


# Reporting ---------------------------------------------------------------------------------------------


def describe(plan: HeteroPlan) -> str:
    """'a100 x2 (tp2 dp4) -> v100 x4 (tp2 dp8)': consecutive stages of one group and shape together."""
    parts, s = [], 0
    while s < plan.pp:
        e = s
        key = (plan.stage_groups[s], plan.stage_tp[s], plan.stage_dp[s])
        while e + 1 < plan.pp and (plan.stage_groups[e + 1], plan.stage_tp[e + 1], plan.stage_dp[e + 1]) == key:
            e += 1
        parts.append(f"{key[0]} x{e - s + 1} (tp{key[1]} dp{key[2]})")
        s = e + 1
    extra = "".join(f" {k}{v}" for k, v in (("vpp", plan.vpp), ("cp", plan.cp), ("ep", plan.ep)) if v > 1)
    extra += f" {offload_tag(plan.optimizer_offload)}" if plan.optimizer_offload > 0 else ""
    return " -> ".join(parts) + extra


def plan_dict(s: Scored) -> dict:
    """JSON-ready plan, estimate and per-stage table of one scored plan."""
    p, e = s.plan, s.est
    stages = [{"stage": i, "group": p.stage_groups[i], "tp": p.stage_tp[i], "dp": p.stage_dp[i],
               "micro_batch": p.stage_micro_batch[i], "layers": p.layers_per_stage[i],
               "stage_time_s": e.stage_time_s[i], "peak_memory_bytes": e.peak_memory_bytes[i],
               "memory_capacity_bytes": e.memory_capacity_bytes[i]} for i in range(p.pp)]
    return {"kind": s.kind, "layout": describe(p), "launchable": p.launch_issue is None,
            "launch_issue": p.launch_issue, "plan": p.model_dump(), "estimate": e.model_dump(), "stages": stages}


def comparison(res: HeteroResult, model: ModelSpec, cluster: ClusterSpec) -> dict:
    """The best plan against the fast group alone and the uniform split: step, throughput, GPUs, price."""
    best = res.ranked[0]
    tokens = res.global_batch * model.seq_len
    gcl = group_clusters(cluster)

    def figures(s: Scored | None) -> dict | None:
        if s is None:
            return None
        gpus = s.plan.gpus_used()
        prices = [gcl[g].price_per_gpu_hour_usd for g in gpus]
        usd = (None if any(x is None for x in prices) else
               sum(n * pr for n, pr in zip(gpus.values(), prices)) * s.est.step_time_s / 3600 / tokens * 1e6)
        return {"layout": describe(s.plan), "step_time_s": s.est.step_time_s, "tokens_per_s": tokens / s.est.step_time_s,
                "gpus": sum(gpus.values()), "tokens_per_s_per_gpu": s.est.tokens_per_s_per_gpu,
                "usd_per_million_tokens": usd}

    fast = res.fast_group()
    out = {"best": figures(best), "uniform": figures(res.uniform),
           "alone": {g: figures(s) for g, s in res.alone.items()}, "fast_group": fast}
    if fast is not None and best.est.fits:
        fa = res.alone[fast]
        slow_used = {g: n for g, n in best.plan.gpus_used().items() if g != fast}
        out["speedup_vs_fast_alone"] = fa.est.step_time_s / best.est.step_time_s
        out["slow_groups_used"] = slow_used
        if slow_used:
            gain = fa.est.step_time_s / best.est.step_time_s - 1.0
            extra = sum(slow_used.values())
            out["slow_group_effect"] = (
                f"adding {extra} GPUs of {', '.join(slow_used)} to {fast} makes the step {100 * gain:.0f}% faster "
                f"({fa.est.step_time_s:.3f} -> {best.est.step_time_s:.3f} s); per GPU the throughput falls from "
                f"{fa.est.tokens_per_s_per_gpu:.0f} to {best.est.tokens_per_s_per_gpu:.0f} tokens/s")
        else:
            out["slow_group_effect"] = (f"the other groups do not help: the best plan runs on {fast} alone "
                                        f"({fa.est.step_time_s:.3f} s)")
    if res.uniform is not None and best.est.fits:
        out["speedup_vs_uniform"] = res.uniform.est.step_time_s / best.est.step_time_s
    return out


def write_hetero_outputs(out_dir: str, model: ModelSpec, cluster: ClusterSpec, s: Scored,
                         extra: dict | None = None) -> list:
    """plan.json, megatron_args.txt, launch.sh and launch.sbatch of a launchable plan: one Megatron job over the
    nodes of the groups it uses, listed in pipeline order (stage 0's group first: Megatron puts pp outermost,
    so node ranks must follow the stages). plan.json carries the per-stage table under 'heterogeneous'."""
    from planner.outputs import write_outputs

    if s.plan.launch_issue:
        raise InputError(f"{out_dir}: the plan cannot run as one Megatron job ({s.plan.launch_issue})")
    plan = s.plan.megatron_plan()
    by_name = {g.name: g for g in cluster.device_groups}
    order = [by_name[g] for g in dict.fromkeys(s.plan.stage_groups)]
    if len(order) == 1:
        view = group_clusters(cluster)[order[0].name]
    else:
        per_node = {g.gpus_per_node for g in order}
        if len(per_node) > 1:
            raise InputError(f"{out_dir}: groups {', '.join(g.name for g in order)} have different GPUs per node "
                             f"({sorted(per_node)}); one torchrun launch needs the same count on every node")
        view = cluster.model_copy(update={"gpu": order[0].gpu, "nodes": sum(g.nodes for g in order),
                                          "gpus_per_node": order[0].gpus_per_node, "device_groups": tuple(order)})
    info = plan_dict(s)
    info["node_order"] = [f"{g.name}: {g.nodes} nodes x {g.gpus_per_node} {g.gpu}" for g in order]
    info["note"] = ("Node ranks follow node_order (the first group's nodes hold pipeline stage 0): launch.sh takes "
                    "each group's hosts in HOSTS_<GROUP> and gives every node its --node-rank, launch.sbatch is a "
                    "Slurm heterogeneous job with one component per group; both check each group's node count and "
                    "GPU type on start and refuse (exit 2) when they differ from the plan. The layout string in "
                    "megatron_args.txt gives each stage its layers.")
    return write_outputs(out_dir, model, view, plan, None, extra={"heterogeneous": info, **(extra or {})})
