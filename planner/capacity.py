"""Capacity planning and what-if sweeps: time, cost and goodput to train a model on a number of tokens.

Every point is a full re-plan: the same exhaustive layout search that ``plan`` runs (planner.search), on the
cluster as varied (resized with ``ClusterSpec.model_copy``, another GPU profile, another network), then the
failure-free time to train (tokens / cluster throughput), the goodput under failures and checkpoints
(costmodel/goodput.py), the expected wall time (time / goodput), GPU-hours and cost at the cluster's
price per GPU-hour (GPUs are paid for during failures and restarts too).

``plan capacity`` searches cluster sizes (powers of two of whole nodes / NVLink domains) and GPU types (one
cluster file each) for the cheapest that meets a deadline, or the fastest within a budget; ``plan whatif``
sweeps one or two quantities (gpus, gpu, bandwidth, seq_len, global_batch, precision, compression).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import numpy as np

from costmodel.catalog import with_overrides
from costmodel.compression import GradCompression, get_compression
from costmodel.estimate import estimate_arrays
from costmodel.flops import total_params
from costmodel.goodput import CheckpointPolicy, FailureModel, GoodputEstimate, checkpoint_bytes, estimate_goodput
from costmodel.profiles import InputError, gpu_label, gpu_nvlink_domain, load_profile
from costmodel.specs import FINETUNE, OPTIMIZERS, PRECISION_ALIASES, ClusterSpec, ModelSpec
from costmodel.plan import ParallelPlan, default_global_batch
from planner.search import exhaustive, offload_alternative, pareto_front, plan_at
from planner.space import missing_host_fields

DAY_S = 86_400.0
HOUR_S = 3_600.0
# Tokens when none are given: 20 per parameter, the compute-optimal ratio of Hoffmann et al. 2022 (Chinchilla).
CHINCHILLA_TOKENS_PER_PARAM = 20.0
MAX_DEFAULT_GPUS = 16_384
# Halvings of the gap between the powers of two where a target flips from missed to met (1.5x, then 1.25x / 1.75x).
REFINE_STEPS = 2

# ---------------------------------------------------------------------------------------------------------
# Input parsing: one-line InputError on bad values
# ---------------------------------------------------------------------------------------------------------

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_DURATION = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": HOUR_S, "hr": HOUR_S, "d": DAY_S, "w": 7 * DAY_S}
_NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"


def _match(pattern: str, text: str):
    return re.fullmatch(pattern, str(text).strip().replace(",", "").replace("_", ""), flags=re.IGNORECASE)


def parse_tokens(text: str, what: str = "--tokens") -> float:
    """15T, 300B, 2.5e12, 800M -> tokens."""
    m = _match(_NUMBER + r"\s*([kmbgt]?)", text)
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"{what} {text!r}: expected a positive token count such as 15T, 300B, 800M or 2.5e12")
    return float(m.group(1)) * _SI[m.group(2).lower()]


def parse_duration(text: str, what: str = "--deadline") -> float:
    """30d, 12h, 90m, 45s, 2w (a bare number is seconds) -> seconds."""
    m = _match(_NUMBER + r"\s*(s|sec|m|min|h|hr|d|w)?", text)
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"{what} {text!r}: expected a positive duration such as 30d, 12h, 90m or 45s")
    return float(m.group(1)) * _DURATION[(m.group(2) or "s").lower()]


def parse_money(text: str, what: str = "--budget") -> float:
    """$2.5M, 800k, 1.2e6 USD -> dollars."""
    t = str(text).strip().lstrip("$").removesuffix("USD").removesuffix("usd").strip()
    m = _match(_NUMBER + r"\s*([kmbt]?)", t)
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"{what} {text!r}: expected a positive dollar amount such as $2.5M, 800k or 1.2e6")
    return float(m.group(1)) * {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Per-GPU inter-node bandwidth in bytes/s: 400Gbps / 400Gb/s (lower-case b: bits), 50GB/s (bytes), or a
    plain number of bytes/s."""
    m = re.fullmatch(_NUMBER + r"\s*([kKmMgGtT]?)(bps|b/s|b|Bps|B/s|B)?", str(text).strip().replace("_", ""))
    if not m or float(m.group(1)) <= 0 or (m.group(2) and not m.group(3)):
        raise InputError(f"{what} {text!r}: expected a bandwidth per GPU such as 400Gbps, 50GB/s or 5e10 (bytes/s)")
    value = float(m.group(1)) * _SI[m.group(2).lower()]
    return value / 8.0 if (m.group(3) or "B").startswith("b") else value


def _ints(values: list[str], dim: str) -> list[int]:
    out = []
    for v in values:
        m = _match(r"([0-9]+)\s*(k?)", v)
        if not m or int(m.group(1)) <= 0:
            raise InputError(f"--vary {dim}: {v!r} is not a positive integer (e.g. {dim}=256,512,1024)")
        out.append(int(m.group(1)) * (1024 if m.group(2) and dim == "seq_len" else 1000 if m.group(2) else 1))
    return out


# ---------------------------------------------------------------------------------------------------------
# Scenarios: a model on a cluster with the knobs a sweep varies
# ---------------------------------------------------------------------------------------------------------

DIMENSIONS = ("gpus", "gpu", "bandwidth", "oversubscription", "seq_len", "global_batch", "precision", "compression",
              "finetune", "optimizer", "optimizer_offload")
_ALIASES = {"num_gpus": "gpus", "size": "gpus", "gpu_type": "gpu", "hardware": "gpu", "nic": "bandwidth",
            "inter_node_bandwidth": "bandwidth", "network": "bandwidth", "seq": "seq_len", "seqlen": "seq_len",
            "sequence_length": "seq_len", "batch": "global_batch", "gbs": "global_batch",
            "grad_compression": "compression", "dtype": "precision", "peft": "finetune", "training": "finetune",
            "optimizer_cpu_offload": "optimizer_offload", "optimizer_offload_fraction": "optimizer_offload",
            "optim_offload": "optimizer_offload", "core_oversubscription": "oversubscription",
            "taper": "oversubscription"}
NUMERIC = {"gpus", "bandwidth", "oversubscription", "seq_len", "global_batch", "optimizer_offload"}


@dataclass(frozen=True)
class Scenario:
    """What one point plans: a model on a cluster, its global batch (None: ~4M tokens) and compression."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int | None = None
    compression: GradCompression | None = None
    labels: tuple[tuple[str, object], ...] = ()     # (dimension, value) pairs this scenario was varied by
    source: str = ""                                 # the cluster file it came from
    optimizer_offload: float = 0.0                   # share of the optimizer state on the host (--optimizer-offload)

    def label(self, dim: str):
        return dict(self.labels).get(dim)


def cluster_unit(cluster: ClusterSpec) -> int:
    """Smallest GPU count a cluster grows by: whole nodes and whole NVLink domains."""
    return math.lcm(cluster.gpus_per_node, cluster.domain_gpus)


def resize(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    unit = cluster_unit(cluster)
    if gpus <= 0 or gpus % unit:
        raise InputError(f"gpus={gpus}: {cluster.name} grows by whole nodes and NVLink domains of {unit} GPUs; "
                         f"valid counts are multiples of {unit}")
    return cluster.model_copy(update={"nodes": gpus // cluster.gpus_per_node,
                                      "name": f"{load_profile(cluster.gpu).name.lower()}x{gpus}"})


def size_range(cluster: ClusterSpec, min_gpus: int | None = None, max_gpus: int | None = None) -> list[int]:
    """GPU counts to try: the cluster unit times powers of two, between min_gpus and max_gpus (default: one
    unit to max(16,384, the file's size)), plus the file's own size."""
    unit = cluster_unit(cluster)
    lo = min_gpus or unit
    hi = max_gpus or max(MAX_DEFAULT_GPUS, cluster.num_gpus)
    if lo > hi:
        raise InputError(f"--min-gpus {lo} is above --max-gpus {hi}")
    sizes = {unit * 2**k for k in range(40) if lo <= unit * 2**k <= hi}
    if lo <= cluster.num_gpus <= hi:
        sizes.add(cluster.num_gpus)
    if not sizes:
        raise InputError(f"no GPU count between {lo} and {hi} is a multiple of {unit} (whole nodes / NVLink "
                         f"domains of {cluster.name}) times a power of two; widen --min-gpus/--max-gpus")
    return sorted(sizes)


def parse_vary(spec: str) -> tuple[str, list]:
    """'gpus=256,512' -> ("gpus", [256, 512]); values checked and converted per dimension."""
    if "=" not in spec:
        raise InputError(f"--vary {spec!r}: expected NAME=V1,V2,... with NAME one of {', '.join(DIMENSIONS)}")
    name, _, rest = spec.partition("=")
    key = name.strip().lower().replace("-", "_")
    dim = _ALIASES.get(key, key)
    if dim not in DIMENSIONS:
        raise InputError(f"--vary {name!r}: unknown dimension; valid: {', '.join(DIMENSIONS)}")
    raw = [v.strip() for v in rest.split(",") if v.strip()]
    if not raw:
        raise InputError(f"--vary {dim}: no values given (e.g. {dim}=...)")
    if dim in ("gpus", "seq_len", "global_batch"):
        values: list = _ints(raw, dim)
    elif dim == "bandwidth":
        values = [parse_bandwidth(v, "--vary bandwidth value") for v in raw]
    elif dim == "optimizer_offload":
        values = [_share(v) for v in raw]
    elif dim == "oversubscription":
        values = [_oversubscription(v) for v in raw]
    elif dim == "gpu":
        values = [load_profile(v).name for v in raw]
    elif dim == "compression":
        values = [(c.name if (c := get_compression(v)) else "none") for v in raw]
    elif dim in ("finetune", "optimizer"):
        valid = FINETUNE if dim == "finetune" else OPTIMIZERS
        bad = [v for v in raw if v.lower() not in valid]
        if bad:
            raise InputError(f"--vary {dim}: unknown value {bad[0]!r}; valid: {', '.join(valid)}")
        values = [v.lower() for v in raw]
    else:
        bad = [v for v in raw if v.lower() not in PRECISION_ALIASES]
        if bad:
            raise InputError(f"--vary precision: unknown precision {bad[0]!r}; valid: "
                             f"{', '.join(sorted(set(PRECISION_ALIASES.values())))}")
        values = [PRECISION_ALIASES[v.lower()] for v in raw]
    if len(set(values)) != len(values):
        raise InputError(f"--vary {dim}: values repeat ({', '.join(map(str, raw))})")
    return dim, values


def _share(text: str) -> float:
    """A --vary optimizer_offload value: the share of the optimizer state in host memory, 0 to 1."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0.0 <= x <= 1.0:
        raise InputError(f"--vary optimizer_offload: {text!r} is not a share from 0 to 1 (0: none, 1: all of the "
                         f"optimizer state in host memory)")
    return x


def _oversubscription(text: str) -> float:
    """A --vary oversubscription value: the fat tree's core oversubscription, '2', '2:1', 7 (1 = full bisection)."""
    head, _, tail = text.partition(":")
    try:
        x = float(head) / (float(tail) if tail else 1.0)
    except (ValueError, ZeroDivisionError):
        x = math.nan
    if not 1.0 <= x <= 1e3:
        raise InputError(f"--vary oversubscription: {text!r} is not a core oversubscription from 1 (full bisection) "
                         f"to 1000, such as 2 or 2:1")
    return x


def vary(sc: Scenario, dim: str, value) -> Scenario:
    """The scenario with one quantity changed."""
    m, cl = sc.model, sc.cluster
    if dim == "gpus":
        cl = resize(cl, int(value))
    elif dim == "gpu":
        # A PCIe board's NVLink domain (a bridged pair) replaces the node-wide one of the cluster it is put in.
        cl = gpu_nvlink_domain(cl.model_copy(update={"gpu": value, "name": f"{value.lower()}x{cl.num_gpus}"}),
                               load_profile(value))
    elif dim in ("bandwidth", "oversubscription"):
        field = "nic_bandwidth_bytes_per_s" if dim == "bandwidth" else "oversubscription"
        cl = cl.model_copy(update={"inter_node": cl.inter_node.model_copy(update={field: float(value)})})
    elif dim == "seq_len":
        m = with_overrides(m, f"model {m.name!r}", int(value), None)
    elif dim == "precision":
        m = with_overrides(m, f"model {m.name!r}", None, str(value))
    elif dim in ("finetune", "optimizer"):
        m = m.model_copy(update={dim: str(value)})
    elif dim == "global_batch":
        return replace(sc, global_batch=int(value), labels=sc.labels + ((dim, value),))
    elif dim == "compression":
        return replace(sc, compression=get_compression(value), labels=sc.labels + ((dim, value),))
    elif dim == "optimizer_offload":
        return replace(sc, optimizer_offload=float(value), labels=sc.labels + ((dim, value),))
    return replace(sc, model=m, cluster=cl, labels=sc.labels + ((dim, value),))


# ---------------------------------------------------------------------------------------------------------
# One point: re-plan, then time, goodput and cost
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Assumptions:
    """Inputs every point shares."""

    tokens: float
    failures: FailureModel = FailureModel()
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    price_per_gpu_hour_usd: float | None = None     # overrides the cluster files' price when set


@dataclass
class CapacityPoint:
    """The best plan of one scenario and what it takes to train the tokens with it."""

    scenario: Scenario
    global_batch: int
    evaluated: int
    plan: ParallelPlan | None = None
    step_time_s: float = math.nan
    step_time_p10_s: float = math.nan       # P10-P90 of the step time (costmodel/trust.py)
    step_time_p90_s: float = math.nan
    support_runs: int | None = None         # validated runs near the plan
    tokens_per_s_per_gpu: float = math.nan
    mfu: float = math.nan
    peak_memory_bytes: float = math.nan
    train_time_s: float = math.nan          # failure-free
    goodput: GoodputEstimate | None = None
    wall_time_s: float = math.nan           # expected, with failures and checkpoints
    price_per_gpu_hour_usd: float | None = None
    reason: str = ""                        # why there is no plan
    meets: dict = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def gpus(self) -> int:
        return self.scenario.cluster.num_gpus

    @property
    def gpu_type(self) -> str:
        """The GPU as tables name it (a --profile file as its profile's name and file name)."""
        return gpu_label(self.scenario.cluster.gpu)

    @property
    def gpu_hours(self) -> float:
        return self.wall_time_s / HOUR_S * self.gpus

    @property
    def cost_usd(self) -> float | None:
        return None if self.price_per_gpu_hour_usd is None else self.gpu_hours * self.price_per_gpu_hour_usd

    def at(self, level: str) -> float:
        """Factor from the P50 point to its P10 or P90: wall time, GPU-hours and cost scale with the step
        time (goodput does not depend on it)."""
        t = self.step_time_p10_s if level == "p10" else self.step_time_p90_s
        return t / self.step_time_s if math.isfinite(t) and self.step_time_s > 0 else math.nan

    def ranges(self) -> dict:
        """P10 and P90 of the wall time, GPU-hours and cost."""
        out = {}
        for lv in ("p10", "p90"):
            f = self.at(lv)
            out.update({f"wall_time_days_{lv}": self.wall_time_s / DAY_S * f, f"gpu_hours_{lv}": self.gpu_hours * f,
                        f"cost_usd_{lv}": None if self.cost_usd is None else self.cost_usd * f})
        return out

    def to_dict(self) -> dict:
        sc = self.scenario
        d = {"cluster": sc.cluster.name, "source": sc.source, "gpu": sc.cluster.gpu, "gpus": self.gpus,
             "nodes": sc.cluster.nodes, "inter_node_bandwidth_bytes_per_s": sc.cluster.inter_node.nic_bandwidth_bytes_per_s,
             "seq_len": sc.model.seq_len, "precision": sc.model.precision, "finetune": sc.model.finetune,
             "optimizer": sc.model.optimizer,
             "compression": sc.compression.name if sc.compression else "none", "global_batch": self.global_batch,
             "varied": {k: v for k, v in sc.labels}, "fits": self.fits, "layouts_scored": self.evaluated}
        if not self.fits:
            d["reason"] = self.reason
            return d
        d.update({"plan": self.plan.model_dump(exclude={"rank_order", "framework"}),
                  "step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                  "mfu": self.mfu, "peak_memory_bytes": self.peak_memory_bytes,
                  "train_time_s": self.train_time_s, "wall_time_s": self.wall_time_s,
                  "wall_time_days": self.wall_time_s / DAY_S, "gpu_hours": self.gpu_hours,
                  "price_per_gpu_hour_usd": self.price_per_gpu_hour_usd, "cost_usd": self.cost_usd,
                  "step_time_p10_s": self.step_time_p10_s, "step_time_p90_s": self.step_time_p90_s,
                  "support_runs": self.support_runs, **self.ranges(),
                  "goodput": self.goodput.summary()})
        if self.meets:
            d["meets"] = self.meets
        return d


def _cost_fn(compression: GradCompression | None):
    if compression is None:
        return lambda model, cluster, plans: estimate_arrays(model, cluster, plans)
    return partial(_compressed_cost, compression)


def _compressed_cost(compression, model, cluster, plans):
    return estimate_arrays(model, cluster, plans, grad_compression=compression)


def plan_point(sc: Scenario, a: Assumptions) -> CapacityPoint:
    """Search the layouts of the scenario (exhaustive, as ``plan``) and cost out its best plan."""
    cl, model = sc.cluster, sc.model
    gbs = sc.global_batch or default_global_batch(model.seq_len, cl.num_gpus)
    if sc.optimizer_offload and (missing := missing_host_fields(cl.gpu)):
        point = CapacityPoint(sc, gbs, 0)
        point.reason = (f"optimizer offload needs the host of a {cl.gpu}, and its profile has no "
                        f"{' or '.join(missing)}")
        return point
    space_kw = {"optimizer_offload": sc.optimizer_offload} if sc.optimizer_offload else {}
    res = exhaustive(model, cl, gbs, cost=_cost_fn(sc.compression), **space_kw)
    point = CapacityPoint(sc, gbs, res.evaluated)
    if res.evaluated == 0:
        point.reason = (f"no layout of {model.layers} layers on {cl.num_gpus} GPUs with global batch {gbs} passes "
                        f"Megatron's rules")
        return point
    i = int(res.order[0])
    s = res.scores
    peak = float(np.nanmax(s["peak_memory_bytes"][i]))
    if not res.any_fits:
        point.reason = (f"no layout fits in memory: the closest needs {peak / 1e9:.0f} GB per GPU against "
                        f"{float(s['memory_capacity_bytes'][i]) / 1e9:.0f} GB usable"
                        + offload_alternative(model, cl, res, _cost_fn(sc.compression)))
        return point
    point.plan = plan_at(res.plans, i)
    point.step_time_s = float(s["step_time_s"][i])
    point.step_time_p10_s = float(s["step_time_p10_s"][i])
    point.step_time_p90_s = float(s["step_time_p90_s"][i])
    point.support_runs = int(s["support_runs"][i])
    point.tokens_per_s_per_gpu = float(s["tokens_per_s_per_gpu"][i])
    point.mfu = float(s["mfu"][i])
    point.peak_memory_bytes = peak
    point.train_time_s = a.tokens / (point.tokens_per_s_per_gpu * cl.num_gpus)
    point.goodput = estimate_goodput(checkpoint_bytes(model, a.checkpoint), cl.storage_bandwidth_bytes_per_s,
                                     cl.num_gpus, cl.nodes, a.failures, a.checkpoint)
    g = point.goodput
    if not g.goodput > 0:   # restarts outlast the time between failures: no checkpoint interval makes progress
        point.plan = None
        point.reason = (f"failures leave no progress: {g.failure_rate_per_s * 3600:.3g} per hour on {cl.num_gpus} "
                        f"GPUs, each costing {g.restart_s / 3600:.3g} h of restart and checkpoint load (goodput 0)")
        return point
    point.wall_time_s = point.train_time_s / g.goodput
    point.price_per_gpu_hour_usd = (a.price_per_gpu_hour_usd if a.price_per_gpu_hour_usd is not None
                                    else cl.price_per_gpu_hour_usd)
    return point


def default_tokens(model: ModelSpec) -> float:
    return CHINCHILLA_TOKENS_PER_PARAM * total_params(model)


def sweep(scenarios: list[Scenario], a: Assumptions,
          progress: Callable[[int, int], None] | None = None) -> list[CapacityPoint]:
    out = []
    for k, sc in enumerate(scenarios):
        out.append(plan_point(sc, a))
        if progress:
            progress(k + 1, len(scenarios))
    return out


def whatif_scenarios(base: Scenario, dims: list[tuple[str, list]]) -> list[Scenario]:
    """The grid of the varied quantities (first dimension outermost in the plots' x axis)."""
    if not dims:
        raise InputError("plan whatif needs at least one --vary NAME=V1,V2,... "
                         f"(NAME: {', '.join(DIMENSIONS)})")
    names = [d for d, _ in dims]
    if len(set(names)) != len(names):
        raise InputError(f"--vary: dimension {', '.join(n for n in names if names.count(n) > 1)} given twice")
    out = []
    for combo in itertools.product(*(values for _, values in dims)):
        sc = base
        for (dim, _), value in zip(dims, combo):
            sc = vary(sc, dim, value)
        out.append(sc)
    return out


def capacity_scenarios(bases: list[Scenario], gpus: list[int] | None, min_gpus: int | None,
                       max_gpus: int | None, search: bool) -> list[Scenario]:
    """Each cluster file at its own size, or (search) at every size of its range / the --gpus list."""
    out = []
    for b in bases:
        if not search and not gpus:
            out.append(replace(b, labels=b.labels + (("gpus", b.cluster.num_gpus),)))
            continue
        sizes = gpus or size_range(b.cluster, min_gpus, max_gpus)
        out += [vary(b, "gpus", g) for g in sizes]
    return out


# ---------------------------------------------------------------------------------------------------------
# Deadline / budget
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Decision:
    """What a capacity search recommends."""

    best: CapacityPoint | None          # the recommendation (None when nothing meets the targets)
    met: bool                           # whether best meets every target given
    closest: CapacityPoint | None       # when nothing meets: the point nearest to the targets
    message: str
    smallest_by_gpu: dict[str, CapacityPoint] = field(default_factory=dict)   # per GPU type: fewest GPUs meeting


def _check_prices(points: list[CapacityPoint], budget: bool) -> None:
    """Costs are compared only when every cluster has a price (a budget needs one); without any price,
    GPU-hours stand in for cost."""
    priced = [p for p in points if p.price_per_gpu_hour_usd is not None]
    missing = sorted({p.scenario.source or p.scenario.cluster.name for p in points
                      if p.price_per_gpu_hour_usd is None})
    if missing and (budget or priced):
        why = "--budget" if budget else "comparing costs across cluster files"
        raise InputError(f"{missing[0]}: field 'price_per_gpu_hour_usd' is not set; {why} needs a price per "
                         f"GPU-hour (add it to the cluster YAML or pass --price-per-gpu-hour)")


def _fmt_days(s: float) -> str:
    return f"{s / DAY_S:.1f} d" if s >= DAY_S else f"{s / HOUR_S:.1f} h"


def fmt_usd(x: float | None) -> str:
    if x is None:
        return "-"
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"${x / div:.2f}{suf}"
    return f"${x:.0f}"


def describe(p: CapacityPoint) -> str:
    lo, hi = p.at("p10"), p.at("p90")
    cost = (f", {fmt_usd(p.cost_usd)} (P10-P90 {fmt_usd(p.cost_usd * lo)}-{fmt_usd(p.cost_usd * hi)})"
            if p.cost_usd is not None else "")
    return (f"{p.gpus} x {p.gpu_type} ({p.scenario.cluster.name}): {_fmt_days(p.wall_time_s)} wall "
            f"(P10-P90 {_fmt_days(p.wall_time_s * lo)}-{_fmt_days(p.wall_time_s * hi)}; goodput "
            f"{p.goodput.goodput * 100:.1f}%), {p.gpu_hours / 1e6:.2f}M GPU-hours{cost}")


def decide(points: list[CapacityPoint], deadline_s: float | None = None,
           budget_usd: float | None = None) -> Decision:
    """Cheapest plan meeting the deadline (and budget); fastest within the budget alone; with neither, the
    fastest. When nothing meets, the closest: the fastest for a deadline, the cheapest for a budget."""
    ok = [p for p in points if p.fits]
    _check_prices(ok, budget_usd is not None)
    if not ok:
        reasons = sorted({p.reason for p in points})
        return Decision(None, False, None, "no cluster in range can run the model: " + "; ".join(reasons))
    for p in ok:
        p.meets = {}
        if deadline_s is not None:
            p.meets["deadline"] = p.wall_time_s <= deadline_s
        if budget_usd is not None:
            p.meets["budget"] = p.cost_usd <= budget_usd
    good = [p for p in ok if all(p.meets.values())]

    def cost_key(p):
        return (p.cost_usd if p.cost_usd is not None else p.gpu_hours, p.gpus, p.wall_time_s)

    smallest: dict[str, CapacityPoint] = {}
    for p in sorted(good, key=lambda p: (p.gpus, cost_key(p))):
        smallest.setdefault(p.scenario.cluster.gpu, p)
    if deadline_s is None and budget_usd is None:
        best = min(ok, key=lambda p: (p.wall_time_s, cost_key(p)))
        return Decision(best, True, None, ("fastest: " if len(ok) > 1 else "") + describe(best), smallest)
    targets = " and ".join(t for t in (f"the deadline of {_fmt_days(deadline_s)}" if deadline_s else "",
                                       f"the budget of {fmt_usd(budget_usd)}" if budget_usd else "") if t)
    if good:
        if deadline_s is not None:
            best = min(good, key=cost_key)
            what = "cheapest" if best.cost_usd is not None else "fewest GPU-hours"
        else:
            best = min(good, key=lambda p: (p.wall_time_s, cost_key(p)))
            what = "fastest"
        return Decision(best, True, None, f"{what} meeting {targets}: {describe(best)}", smallest)
    if deadline_s is not None:
        closest = min(ok, key=lambda p: (p.wall_time_s, cost_key(p)))
    else:
        closest = min(ok, key=cost_key)
    sizes = sorted({p.gpus for p in points})
    return Decision(None, False, closest,
                    f"no cluster in range ({sizes[0]}-{sizes[-1]} GPUs, "
                    f"{', '.join(sorted({p.gpu_type for p in points}))}) meets {targets}; closest: {describe(closest)}",
                    smallest)


def _meets(p: CapacityPoint, deadline_s: float | None, budget_usd: float | None) -> bool:
    return p.fits and (deadline_s is None or p.wall_time_s <= deadline_s) and \
        (budget_usd is None or (p.cost_usd is not None and p.cost_usd <= budget_usd))


def refine_sizes(points: list[CapacityPoint], deadline_s: float | None, budget_usd: float | None) -> list[Scenario]:
    """Sizes to try between neighbours of one GPU type where meeting the targets flips (a deadline is met from
    some size up, a budget up to some size): the midpoint in whole nodes / NVLink domains, so that each call
    halves the gap. Already planned sizes are skipped."""
    if deadline_s is None and budget_usd is None:
        return []
    out = []
    by_type: dict[str, list[CapacityPoint]] = {}
    for p in points:
        by_type.setdefault(p.scenario.source or p.scenario.cluster.name, []).append(p)
    for pts in by_type.values():
        pts = sorted(pts, key=lambda p: p.gpus)
        have = {p.gpus for p in pts}
        for a, b in zip(pts, pts[1:]):
            if _meets(a, deadline_s, budget_usd) == _meets(b, deadline_s, budget_usd):
                continue
            unit = cluster_unit(a.scenario.cluster)
            mid = (a.gpus + b.gpus) // 2 // unit * unit
            if a.gpus < mid < b.gpus and mid not in have:
                sc = a.scenario
                out.append(vary(replace(sc, labels=tuple(kv for kv in sc.labels if kv[0] != "gpus")), "gpus", mid))
    return out


def pareto(points: list[CapacityPoint]) -> list[CapacityPoint]:
    """Points no other point beats on both wall time and cost (GPU-hours where a price is missing)."""
    ok = [p for p in points if p.fits]
    if not ok:
        return []
    use_cost = all(p.cost_usd is not None for p in ok)
    v = np.array([[p.wall_time_s, p.cost_usd if use_cost else p.gpu_hours] for p in ok])
    return sorted((ok[i] for i in pareto_front(v)), key=lambda p: p.wall_time_s)
