"""Finding the fastest plan that fits: score the space with an injected cost function.

The planner never imports the executor; the cost function is passed in (by default the vectorised
cost model, ``costmodel.estimate.estimate_arrays``).
"""

from __future__ import annotations

import contextlib
import warnings
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.estimate import PlanArrays, estimate_arrays
from costmodel.specs import ClusterSpec, ModelSpec, ParallelPlan
from costmodel.trust import with_intervals
from planner.space import FSDP_STAGE, RECOMPUTE_NAMES, valid_plans

CostFn = Callable[[ModelSpec, ClusterSpec, PlanArrays], dict]
RANK_BY = ("p50", "p90")
"""What "time" means when plans are ranked: the predicted (P50) step time or its P90 (costmodel/trust.py)."""


def default_cost(model: ModelSpec, cluster: ClusterSpec, plans: PlanArrays) -> dict:
    return estimate_arrays(model, cluster, plans)


@dataclass
class SearchResult:
    """Scored candidates, best first among those that fit."""

    plans: PlanArrays
    scores: dict
    order: np.ndarray          # indices into plans, fitting plans by step time, then the rest
    evaluated: int
    rank_by: str = "p50"       # the step time the fitting plans are ordered by (RANK_BY)

    def plan(self, rank: int = 0) -> ParallelPlan:
        return to_plan(self.plans, int(self.order[rank]))

    def split_plan(self, rank: int = 0) -> ParallelPlan:
        """The plan at ``rank`` with its uneven stage split, when it has one."""
        plan = self.plan(rank)
        sl = self.plans.stage_layers
        i = int(self.order[rank])
        if sl is not None and not np.isnan(sl[i, 0]):
            plan = plan.model_copy(update={"layers_per_stage": tuple(int(x) for x in sl[i, : plan.pp])})
        return plan

    @property
    def any_fits(self) -> bool:
        return bool(self.scores["fits"].any()) if self.evaluated else False


def to_plan(a: PlanArrays, i: int) -> ParallelPlan:
    rl = a.recompute_layers[i]
    return ParallelPlan(tp=int(a.tp[i]), pp=int(a.pp[i]), vpp=int(a.vpp[i]), dp=int(a.dp[i]), cp=int(a.cp[i]),
                        ep=int(a.ep[i]), etp=int(a.etp[i]), sequence_parallel=bool(a.sp[i]),
                        micro_batch=int(a.micro_batch[i]), global_batch=int(a.global_batch[i]),
                        recompute=RECOMPUTE_NAMES[int(a.recompute[i])],
                        recompute_layers=None if rl < 0 else int(rl),
                        distributed_optimizer=bool(a.distributed_optimizer[i]), zero_stage=int(a.zero_stage[i]))


def exhaustive(model: ModelSpec, cluster: ClusterSpec, global_batch: int, cost: CostFn = default_cost,
               rank_by: str = "p50", **space_kw) -> SearchResult:
    """Score every valid plan in one vectorised call (``space_kw``: ``planner.space.candidate_columns``
    keywords that narrow the space, e.g. zero_stages=(1,)); the scores gain the P10/P90 step times and the
    support of every plan (``costmodel.trust.with_intervals``), and ``rank_by`` says which time ranks them."""
    plans = valid_plans(model, cluster, global_batch, **space_kw)
    if len(plans) == 0:
        return SearchResult(plans, {}, np.zeros(0, dtype=int), 0)
    return ranked(plans, with_intervals(model, cluster, plans, cost(model, cluster, plans)), rank_by)


def rank_time(scores: dict, rank_by: str = "p50") -> np.ndarray:
    """The step time plans are ranked by: P50 (the prediction) or P90 (where the scores have it)."""
    if rank_by not in RANK_BY:
        from costmodel.profiles import InputError

        raise InputError(f"--rank-by {rank_by}: valid: {', '.join(RANK_BY)}")
    key = "step_time_p90_s" if rank_by == "p90" and "step_time_p90_s" in scores else "step_time_s"
    return np.asarray(scores[key], dtype=float)


def ranked(plans: PlanArrays, scores: dict, rank_by: str = "p50") -> SearchResult:
    """Scored plans in order: those that fit by step time (``rank_time``), then the rest by peak memory."""
    t = np.where(scores["fits"], rank_time(scores, rank_by), np.inf)
    fit_order = np.argsort(t, kind="stable")
    n_fit = int(scores["fits"].sum())
    rest = np.argsort(np.nanmax(scores["peak_memory_bytes"], axis=1), kind="stable")
    rest = rest[~scores["fits"][rest]]
    order = np.concatenate([fit_order[:n_fit], rest])
    return SearchResult(plans, scores, order, len(plans), rank_by)


# ---------------------------------------------------------------------------------------------------------
# Sample-efficient search with Optuna
# ---------------------------------------------------------------------------------------------------------
#
# Design (the choices the planner makes on top of Optuna):
#
# * Search space. One parameter per knob -- tp, cp, pp, vpp, ep, micro_batch, recompute, zero_stage (1 =
#   distributed optimizer, 3 = Megatron-FSDP; ``planner.space.ZERO_STAGES``) and ``nodes`` when the "gpus"
#   objective is asked for -- each sampled with ``suggest_categorical`` over the fixed, sorted list
#   of the values that occur in the valid plans of ``planner.space`` (the union over every node count when the
#   GPU count varies). dp is derived (GPUs / (tp*cp*pp)). The lists never change between trials of a study;
#   they are stored in the study's user attributes and a resumed study with other lists is refused.
# * Proposals. Every sampler is wrapped (``_distinct_sampler``) so that a trial gets a valid configuration the
#   study has not tried: validity (the rules) and repeats are known without the cost model, so a joint proposal
#   that breaks a rule or repeats a finished/running trial is drawn once more and then moved to the nearest
#   valid, unseen configuration (fewest knobs changed). Knobs a sampler leaves to independent sampling (TPE's
#   start-up trials, NSGA-II's mutation) are drawn uniformly inside the wrapper so that the check sees whole
#   configurations. Without it TPE spent about half of its trials on repeats and invalid layouts on
#   70b/h100x512 and missed the 1% target in 3 runs out of 20; with it, 20 out of 20 found the optimum.
# * Invalid combinations that still reach the objective (enqueued by hand, a sampler instance passed in, or an
#   exhausted space) are never scored by the cost model. The trial completes with a penalty value and a
#   violated constraint ``rules`` = 1000 x the number of broken rules (so any valid plan, even one far over
#   memory, ranks before an invalid one). Pruning them (``optuna.TrialPruned``) was not chosen: NSGA-II and
#   CMA-ES leave pruned trials out of their populations, so they would never learn where the invalid region
#   is, while a completed infeasible trial is ranked by constrained domination (NSGA-II) and put in TPE's
#   "above" group by its violation; every sampler sees the same, complete history.
# * Memory: a valid plan that does not fit is scored and kept; its constraint ``memory`` is
#   peak_memory / capacity - 1 (> 0 = infeasible). Constraints are set with ``Trial.set_constraint``
#   (Optuna >= 5, where ``constraints_func`` is deprecated; the samplers read ``FrozenTrial.constraints`` either
#   way); on older Optuna the same values go through ``constraints_func``.
# * CMA-ES has neither categorical parameters nor constraints. With ``sampler="cmaes"`` each knob is an
#   integer index into its list (``suggest_int("tp_index", 0, len-1)``, CMA-ES with margin for the discrete
#   dimensions) and the objective is penalised: a plan over memory scores PENALTY * (1 + overflow), above
#   every plan that fits. Its studies use their own parameter names, so a study is resumed with the same
#   encoding (the default study name carries it).
# * Seeding: the layouts an expert tries first (Megatron/NeMo recipes, ``expert_seeds``) are enqueued before
#   sampling (at most a quarter of the trials); they count as trials and as TPE's start-up trials.
# * Caching: a configuration already scored in the study (Optuna's samplers do propose duplicates) is answered
#   from the study's own record of it (trial user attribute ``eval``), not re-scored; a resumed study fills
#   the cache from its finished trials.
# * Persistence: ``storage`` None keeps the study in memory; an RDB URL ("sqlite:///plan.db",
#   "postgresql+psycopg://...") persists every finished trial as it finishes, and the same storage + study
#   name resumes (``load_if_exists``). Optuna commits each trial as it ends, so
#   Ctrl-C (the result comes back with ``interrupted=True``) or a killed process loses only the trial that was
#   running; RDB storages get Optuna heartbeats, so a trial left RUNNING by a killed process is marked FAIL
#   (and its configuration enqueued again) by the next trial started more than GRACE_S after it died. SIGTERM
#   is handled like SIGINT. SQLite files are put in WAL mode. Several processes may share one RDB study
#   (SQLite or PostgreSQL): run the same ``plan`` command with the same ``--storage`` and ``--study-name`` in
#   several shells, or pass ``workers=N`` (N spawned processes that end with their parent). ``n_trials`` is
#   the number of finished trials the study should have: each process stops once the study has them, and a
#   resumed study runs only the rest. What Optuna does not make atomic between processes is done under
#   ``_StudyLock``: the schema is created, and the seeds enqueued, once; a polish step or a sampled
#   configuration that another process has running or waiting is not tried again.

OPTUNA_KNOBS = ("tp", "cp", "pp", "vpp", "ep", "micro_batch", "recompute", "zero_stage")
"""The sampled knobs; each is also a PlanArrays column (recompute there as its code)."""
OBJECTIVES = ("time", "memory", "gpus")
SAMPLERS = ("tpe", "cmaes", "nsga2")
# Objective values of plans that break a rule, and the scale of the memory penalty used with CMA-ES.
PENALTY = {"time": 1.0e4, "memory": 1.0e15, "gpus": 1.0e7}
RULE_WEIGHT = 1000.0
_RC_NAME = {0: "none", 1: "selective", 2: "full"}
_RC_CODE = {v: k for k, v in _RC_NAME.items()}


FSDP_SEEDS = 2


def default_budget(n_valid: int) -> int:
    """Trials of an Optuna search: 10% of the valid plans, at least 50."""
    return max(50, n_valid // 10)


def _take(a: PlanArrays, idx) -> PlanArrays:
    idx = np.atleast_1d(np.asarray(idx, dtype=int))
    cols = {}
    for name in a.__dataclass_fields__:
        v = getattr(a, name)
        cols[name] = None if v is None else v[idx]
    return PlanArrays(**cols)


def _keys(a: PlanArrays) -> list[tuple[int, ...]]:
    """The knob key (OPTUNA_KNOBS, recompute as its code) of every row."""
    return list(zip(*(getattr(a, k).astype(np.int64).tolist() for k in OPTUNA_KNOBS)))


def _cfg_of_key(key) -> dict:
    """Knob values of a key (recompute by name)."""
    cfg = dict(zip(OPTUNA_KNOBS, (int(x) for x in key)))
    cfg["recompute"] = _RC_NAME[cfg["recompute"]]
    return cfg


@dataclass
class SearchSpace:
    """The fixed search space of a study: the knob lists and, per node count, the valid plans."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    nodes: tuple[int, ...]                        # node counts sampled (one: the cluster's)
    choices: dict[str, list]                      # knob -> sorted values (recompute as names)
    valid: dict[int, PlanArrays]                  # nodes -> valid plans
    index: dict[int, dict[tuple[int, ...], int]]  # nodes -> knob key -> row in valid[nodes]

    @property
    def n_valid(self) -> int:
        return sum(len(v) for v in self.valid.values())

    def cluster_for(self, nodes: int) -> ClusterSpec:
        return self.cluster if nodes == self.cluster.nodes else self.cluster.model_copy(update={"nodes": nodes})

    def signature(self, encoding: str, objectives: tuple[str, ...]) -> dict:
        return {"model": self.model.name, "layers": self.model.layers, "cluster": self.cluster.name,
                "global_batch": self.global_batch, "objectives": list(objectives), "encoding": encoding,
                "nodes": list(self.nodes), "choices": {k: list(v) for k, v in self.choices.items()}}


def search_space(model: ModelSpec, cluster: ClusterSpec, global_batch: int, vary_nodes: bool = False) -> SearchSpace:
    """Knob lists of ``planner.space``'s valid plans; with ``vary_nodes`` over powers of two up to the
    cluster's node count (and the full cluster)."""
    if vary_nodes:
        nodes = sorted({n for n in (2 ** k for k in range(64)) if n <= cluster.nodes} | {cluster.nodes})
    else:
        nodes = [cluster.nodes]
    valid, index = {}, {}
    values: dict[str, set] = {k: set() for k in OPTUNA_KNOBS}
    for n in nodes:
        cl = cluster if n == cluster.nodes else cluster.model_copy(update={"nodes": n})
        v = valid_plans(model, cl, global_batch)
        if len(v) == 0:
            continue
        valid[n] = v
        index[n] = {k: i for i, k in enumerate(_keys(v))}
        for k in OPTUNA_KNOBS:
            values[k].update(int(x) for x in np.unique(getattr(v, k)))
    choices = {k: sorted(values[k]) for k in OPTUNA_KNOBS}
    choices["recompute"] = [_RC_NAME[c] for c in choices["recompute"]]
    return SearchSpace(model, cluster, global_batch, tuple(n for n in nodes if n in valid), choices, valid, index)


def expert_seeds(space: SearchSpace, limit: int = 12) -> list[dict]:
    """Layouts an expert tries first (Megatron / NeMo recipes), valid ones only, best guess first.

    tp = min(8, NVLink domain) for models of 20B parameters or more (smaller variants tp/2, tp/4 after it);
    cp 1, and 2 for sequences of 8k tokens or more; pp the smallest depth whose weights, gradients and
    sharded optimizer states take at most 60% of a GPU (leaving room for activations), and the next deeper
    one (depths that do not divide the layers take the uneven split of ``planner.space``); vpp the largest
    divisor of the layers per stage that keeps at least 4 layers per chunk (1 for uneven splits); micro-batch
    1; selective recompute; ep = min(8, experts) for MoE models; ZeRO-1 (distributed optimizer). Then
    Megatron-FSDP (ZeRO-3, pp 1, cp 1) at the two smallest of those tp, as Megatron-Bridge's FSDP recipes run
    (Llama 3 70B on GB200/GB300: tp1 pp1, data/validation/published_runs.csv); the first FSDP seed comes
    second, after the recipe's best guess, so that short studies try both kinds of layout.
    """
    from costmodel import memory
    from costmodel.flops import total_params
    from costmodel.profiles import load_profile

    m, cl = space.model, space.cluster
    if not space.nodes:
        return []
    nodes = cl.nodes if cl.nodes in space.nodes else space.nodes[-1]
    n_gpus = nodes * cl.gpus_per_node
    prof = load_profile(cl.gpu)
    cap = prof.memory_bytes.value * prof.usable_memory_fraction
    params = total_params(m)
    ch = space.choices
    top_tp = min(8, cl.domain_gpus) if params >= 20e9 else min(2, cl.domain_gpus)
    tps = [t for t in (top_tp, top_tp // 2, top_tp // 4, top_tp * 2) if t in ch["tp"]]
    cps = [c for c in ((1, 2) if m.seq_len >= 8192 else (1,)) if c in ch["cp"]]
    ep = max([e for e in ch["ep"] if e <= 8] or [1])
    seeds, seen = [], set()
    index = space.index[nodes]
    for cp in cps:
        for tp in tps:
            pps = [p for p in ch["pp"] if n_gpus % (tp * cp * p) == 0]
            static_ok = []
            for p in pps:
                dp = n_gpus // (tp * cp * p)
                per_gpu = params / (tp * p) * (memory.WEIGHT_BYTES + memory.GRAD_BYTES_CORE
                                               + memory.OPTIMIZER_BYTES / (dp * cp))
                if per_gpu <= 0.6 * cap:
                    static_ok.append(p)
            for p in static_ok[:2]:
                per_stage = m.layers // p
                even = m.layers % p == 0
                vpps = [v for v in ch["vpp"] if per_stage % v == 0 and per_stage // v >= 4] if p > 1 and even else []
                for vpp in sorted(vpps, reverse=True) + [1]:
                    key = (tp, cp, p, vpp, ep if m.is_moe else 1, 1, _RC_CODE["selective"], 1)
                    if key in index:
                        if key not in seen:
                            seen.add(key)
                            seeds.append(key)
                        break
    # Best guesses first: the largest tp (recipe), cp=2 / cp=1 interleaved.
    seeds.sort(key=lambda k: (tps.index(k[0]), k[2], k[1]))
    fsdp = [k for k in ((tp, 1, 1, 1, ep if m.is_moe else 1, 1, _RC_CODE["selective"], FSDP_STAGE)
                        for tp in sorted(tps)) if k in index][:FSDP_SEEDS]
    keys = seeds[:1] + fsdp[:1] + seeds[1: max(1, limit - len(fsdp))] + fsdp[1:]
    out = []
    for key in keys[:limit]:
        cfg = _cfg_of_key(key)
        if len(space.nodes) > 1:
            cfg["nodes"] = nodes
        out.append(cfg)
    return out


@dataclass
class OptunaResult(SearchResult):
    """An Optuna search: the distinct valid plans the study scored (a ``SearchResult``, best first), the
    study, the Pareto front of the objectives among plans that fit, and how the run went.

    ``plans`` / ``scores`` / ``order`` / ``evaluated`` mean what they mean for ``exhaustive`` (``evaluated`` =
    distinct valid plans scored in the whole study, resumed runs included); ``order`` puts the Pareto front
    first (sorted by the first objective), then the other plans that fit, then the rest by peak memory.
    """

    study: object = None                          # optuna.Study (None when no plan is valid)
    objectives: tuple[str, ...] = ("time",)
    pareto: np.ndarray = None                     # indices into plans: non-dominated plans that fit
    nodes: np.ndarray = None                      # node count of each plan
    n_trials: int = 0                             # trials finished by this call
    total_trials: int = 0                         # finished trials in the study
    evaluations: int = 0                          # cost-model evaluations made by this call (cache misses)
    interrupted: bool = False                     # KeyboardInterrupt stopped the search (trials kept)
    sampler: str = "tpe"
    study_name: str | None = None
    storage: str | None = None

    def plan(self, rank: int = 0) -> ParallelPlan:
        """The plan ranked ``rank``, with its uneven stage split (``layers_per_stage``) when it has one."""
        return plan_at(self.plans, int(self.order[rank]))

    @property
    def best_plan(self) -> ParallelPlan | None:
        return self.plan(0) if self.any_fits else None

    def objective_values(self, i: int) -> tuple[float, ...]:
        return tuple(float(_objective_column(self.scores, o, self.plans, self.rank_by)[i]) for o in self.objectives)

    def pareto_plans(self) -> list[ParallelPlan]:
        return [plan_at(self.plans, int(i)) for i in self.pareto]


def plan_at(a: PlanArrays, i: int) -> ParallelPlan:
    """``to_plan`` plus the uneven stage split of row i (``stage_layers``), if the row has one."""
    plan = to_plan(a, i)
    sl = a.stage_layers
    if sl is not None and not np.isnan(sl[i, 0]):
        plan = plan.model_copy(update={"layers_per_stage": tuple(int(x) for x in sl[i, : plan.pp])})
    return plan


def _objective_column(scores: dict, objective: str, plans: PlanArrays, rank_by: str = "p50") -> np.ndarray:
    if objective == "time":
        return rank_time(scores, rank_by)
    if objective == "memory":
        return np.nanmax(scores["peak_memory_bytes"], axis=1)
    return plans.tp * plans.pp * plans.dp * plans.cp


def pareto_front(values: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``values`` (n x k, minimised) that no other row dominates."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return np.zeros(0, dtype=int)
    le = (v[:, None, :] <= v[None, :, :]).all(axis=2)   # le[j, i]: j <= i everywhere
    lt = (v[:, None, :] < v[None, :, :]).any(axis=2)
    dominated = (le & lt).any(axis=0)
    return np.flatnonzero(~dominated)


def _check_args(objectives, sampler) -> tuple[tuple[str, ...], str]:
    from costmodel.profiles import InputError

    if isinstance(objectives, str):
        objectives = tuple(o.strip() for o in objectives.split(",") if o.strip())
    objectives = tuple(objectives)
    bad = [o for o in objectives if o not in OBJECTIVES]
    if not objectives or bad or len(set(objectives)) != len(objectives):
        raise InputError(f"objectives {','.join(objectives) or '(none)'}: valid objectives are "
                         f"{', '.join(OBJECTIVES)}, each at most once (e.g. time or time,memory)")
    if sampler in (None, "auto"):
        sampler = "tpe" if len(objectives) == 1 else "nsga2"
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise InputError(f"sampler {sampler!r}: valid samplers are {', '.join(SAMPLERS)}")
        if sampler == "cmaes" and len(objectives) > 1:
            raise InputError(f"sampler cmaes is single-objective but objectives are {','.join(objectives)}; "
                             f"use nsga2 or tpe")
    return objectives, sampler


def _make_sampler(sampler, seed: int, n_trials: int):
    import optuna

    old = _constraints_func if not hasattr(optuna.trial.Trial, "set_constraint") else None
    kw = {"constraints_func": old} if old else {}
    if not isinstance(sampler, str):
        return sampler
    if sampler == "tpe":
        # Tuned on 70b/h100x512 and 405b/h100x16384 (tests/test_search.py, tests/benchmarks/bench_search.py):
        # multivariate TPE over the joint space (Optuna's default for one objective, stated for older
        # versions), 10 start-up trials (the expert seeds fill them), 64 EI candidates instead of 24 and
        # REDRAWS=3 in the wrapper: 405b found its optimum in 7 of 10 seeds instead of 3 of 10, 70b in 10 of 10.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=TPE_STARTUP,
                                          n_ei_candidates=TPE_EI_CANDIDATES, **kw)
    if sampler == "nsga2":
        pop = int(min(50, max(10, n_trials // 6)))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=pop, **kw)
    try:
        import cmaes  # noqa: F401  (Optuna's CmaEsSampler runs on the cmaes package)
    except ImportError:
        from costmodel.profiles import InputError

        raise InputError("sampler cmaes needs the cmaes package (pip install cmaes); "
                         "valid samplers without it: tpe, nsga2") from None
    return optuna.samplers.CmaEsSampler(seed=seed, with_margin=True, n_startup_trials=0,
                                        independent_sampler=optuna.samplers.TPESampler(seed=seed),
                                        warn_independent_sampling=False)


TPE_STARTUP = 10
TPE_EI_CANDIDATES = 64
REDRAWS = 3


def _distinct_sampler(inner, obj: "_Objective", seed: int, tries: int | None = None):
    """Wrap a sampler so that each trial gets a valid configuration the study has not seen.

    Optuna's TPE proposes the arg-max of l(x)/g(x) among a few candidates and, over a small categorical
    space, often lands on a configuration it has already tried or on one that breaks a rule; such a trial
    brings no information. Both are known without the cost model, so a joint (relative) proposal that
    repeats a finished or running trial's configuration, or is invalid, is drawn again (``tries`` times,
    default REDRAWS); if it still is, it is moved to the nearest valid, unseen configuration (fewest knobs
    changed, ties at random). Knobs the inner sampler leaves to independent sampling are drawn uniformly
    here. Enqueued (fixed) trials are left alone; when no unseen valid configuration is left the proposal
    stands and the objective answers it from the cache or as infeasible. Uses only Optuna's public
    ``BaseSampler`` interface.
    """
    import optuna

    rng = np.random.default_rng(seed)
    tries = REDRAWS if tries is None else tries

    class DistinctSampler(optuna.samplers.BaseSampler):
        def __init__(self):
            self.inner = inner

        def __str__(self) -> str:
            return f"Distinct({self.inner})"

        def infer_relative_search_space(self, study, trial):
            return self.inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            # A first heartbeat now: Optuna's heartbeat thread starts after sampling, and a trial killed
            # before any heartbeat would stay RUNNING for ever.
            _beat(study, trial)
            params = self.inner.sample_relative(study, trial, search_space)
            if trial.system_attrs.get("fixed_params") or not obj.covers(search_space):
                return params
            # Finished, running and waiting trials (an enqueued seed or polish step of another process too),
            # and configurations other processes have drawn for trials they are starting: the draw and its
            # claim are made under the study's lock.
            with obj.lock:
                params = self._distinct(study, trial, search_space, params)
                key = obj.key_of_params(params)
                if key is not None:
                    _claim(study, trial, key)
            return params

        def _distinct(self, study, trial, search_space, params):
            seen = _taken(study, obj, exclude=trial.number)
            for attempt in range(tries + 1):
                # Knobs the inner sampler leaves to independent sampling (TPE's start-up trials, NSGA-II's
                # mutation) are drawn here, uniformly, as the independent samplers would.
                params = obj.complete(params, search_space, rng)
                key = obj.key_of_params(params)
                if key not in seen and key[1:] in obj.space.index.get(key[0], {}):
                    return params
                if attempt < tries:
                    params = self.inner.sample_relative(study, trial, search_space)
            near = obj.nearest_unseen(key, seen, rng)
            if near is None:
                return params
            return {k: v for k, v in obj.params_of(near).items() if k in search_space}

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self.inner.sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study, trial):
            self.inner.before_trial(study, trial)

        def after_trial(self, study, trial, state, values):
            self.inner.after_trial(study, trial, state, values)

        def reseed_rng(self):
            self.inner.reseed_rng()

    return DistinctSampler()


def _constraints_func(trial) -> tuple[float, float]:
    """Optuna < 5: the constraints the objective recorded (``constraints_func`` API)."""
    c = trial.user_attrs.get("constraints", {})
    return (float(c.get("rules", 0.0)), float(c.get("memory", 0.0)))


def _raw(ev: dict, rank_by: str = "p50") -> dict[str, float]:
    """Every objective's value of a valid evaluation, unpenalised ("time": its P50 or P90 step time)."""
    t = ev.get("step_time_p90_s", ev["step_time_s"]) if rank_by == "p90" else ev["step_time_s"]
    return {"time": t, "memory": ev["peak_memory_bytes"], "gpus": float(ev["config"]["num_gpus"])}


def _overflow(ev: dict) -> float:
    """How far a valid evaluation's peak memory exceeds the capacity (negative: headroom), as a fraction."""
    return ev["peak_memory_bytes"] / ev["memory_capacity_bytes"] - 1.0


class _Objective:
    """Optuna objective over a SearchSpace; caches every configuration the study has seen."""

    def __init__(self, space: SearchSpace, cost: CostFn, objectives: tuple[str, ...], encoding: str,
                 penalise: bool, rank_by: str = "p50"):
        self.space, self.cost, self.objectives, self.rank_by = space, cost, objectives, rank_by
        self.encoding, self.penalise = encoding, penalise
        self.cache: dict[tuple[int, ...], dict] = {}
        self.evaluations = 0
        self._keys = None
        self._row: dict = {}
        self._ords: list[list[int]] | None = None
        import optuna

        self.new_api = hasattr(optuna.trial.Trial, "set_constraint")
        self.lock = _StudyLock(None)   # the study's lock once _prepare has opened a storage

    # parameters <-> configurations
    def params_of(self, cfg: dict) -> dict:
        if self.encoding == "index":
            p = {f"{k}_index": self.space.choices[k].index(cfg[k]) for k in OPTUNA_KNOBS}
            if len(self.space.nodes) > 1:
                p["nodes_index"] = list(self.space.nodes).index(cfg["nodes"])
        else:
            p = {k: cfg[k] for k in OPTUNA_KNOBS}
            if len(self.space.nodes) > 1:
                p["nodes"] = cfg["nodes"]
        return p

    def suggest(self, trial) -> dict:
        ch = self.space.choices
        if self.encoding == "index":
            cfg = {k: ch[k][trial.suggest_int(f"{k}_index", 0, len(ch[k]) - 1)] for k in OPTUNA_KNOBS}
            cfg["nodes"] = (self.space.nodes[trial.suggest_int("nodes_index", 0, len(self.space.nodes) - 1)]
                            if len(self.space.nodes) > 1 else self.space.nodes[0])
        else:
            cfg = {k: trial.suggest_categorical(k, ch[k]) for k in OPTUNA_KNOBS}
            cfg["nodes"] = (trial.suggest_categorical("nodes", list(self.space.nodes))
                            if len(self.space.nodes) > 1 else self.space.nodes[0])
        return cfg

    def _names(self):
        """(knob, parameter name, values) of every knob, ``nodes`` included."""
        for k in (*OPTUNA_KNOBS, "nodes"):
            ch = list(self.space.nodes) if k == "nodes" else self.space.choices[k]
            yield k, (f"{k}_index" if self.encoding == "index" else k), ch

    def covers(self, search_space: dict) -> bool:
        """Whether a relative search space holds every knob that has more than one value."""
        return bool(search_space) and all(name in search_space for _, name, ch in self._names() if len(ch) > 1)

    def complete(self, params: dict, search_space: dict, rng) -> dict:
        """``params`` with the knobs of ``search_space`` it lacks drawn uniformly."""
        out = dict(params)
        for _, name, ch in self._names():
            if name in search_space and name not in out:
                j = int(rng.integers(len(ch)))
                out[name] = j if self.encoding == "index" else ch[j]
        return out

    def key_of_params(self, params: dict) -> tuple[int, ...] | None:
        """The configuration key of trial parameters; knobs with a single value may be missing; None when
        a knob with several values is."""
        cfg = {}
        for k, name, ch in self._names():
            if name in params:
                cfg[k] = ch[params[name]] if self.encoding == "index" else params[name]
            elif len(ch) == 1:
                cfg[k] = ch[0]
            else:
                return None
        return self.key_of(cfg)

    def nearest_unseen(self, key: tuple[int, ...] | None, seen: set, rng) -> dict | None:
        """A valid configuration not in ``seen`` that differs from ``key`` in the fewest knobs (any, at
        random, when key is None)."""
        self._valid_keys()
        free = np.ones(len(self._keys), dtype=bool)
        for k in seen:
            i = self._row.get(k)
            if i is not None:
                free[i] = False
        if not free.any():
            return None
        cand = np.flatnonzero(free)
        if key is None:   # uniformly among the unseen
            best = cand
        else:
            dist = (self._keys[cand] != np.asarray(key)[None, :]).sum(axis=1)
            best = cand[dist == dist.min()]
        row = self._keys[int(rng.choice(best))]
        return {"nodes": int(row[0]), **_cfg_of_key(row[1:])}

    def _valid_keys(self) -> np.ndarray:
        """Every valid configuration key (nodes, *OPTUNA_KNOBS), one row each."""
        if self._keys is None:
            rows = [(n, *k) for n in self.space.nodes for k in self.space.index[n]]
            self._keys = np.array(rows, dtype=np.int64).reshape(-1, 1 + len(OPTUNA_KNOBS))
            self._row = {tuple(r): i for i, r in enumerate(rows)}
        return self._keys

    def _ordinals(self) -> list[list[int]]:
        """Per key position (nodes, then OPTUNA_KNOBS), the sorted values as they appear in keys."""
        if self._ords is None:
            vals = {k: ([_RC_CODE[v] for v in ch] if k == "recompute" else [int(v) for v in ch])
                    for k, _, ch in self._names()}
            self._ords = [vals["nodes"], *(vals[k] for k in OPTUNA_KNOBS)]
        return self._ords

    def neighbours(self, key: tuple[int, ...], repair: bool = False) -> list[tuple[int, ...]]:
        """Valid configurations one step from ``key``: one knob (``nodes`` included) moved to the next
        smaller or larger value of its sorted list, the others kept. With ``repair``, the steps that break
        a rule instead (pp 8 -> 16 where the layers per stage do not take vpp 15; cp 8 -> 4 where dp x
        micro-batch no longer divides the batch), each made valid again by moving one other knob to its
        nearest value that is (one configuration per other knob)."""
        keys, ords = self._valid_keys(), self._ordinals()
        out = []
        for pos, vals in enumerate(ords):
            if key[pos] not in vals:
                continue
            at = vals.index(key[pos])
            for step in (-1, 1):
                if not 0 <= at + step < len(vals):
                    continue
                cand = (*key[:pos], vals[at + step], *key[pos + 1:])
                ok = cand[1:] in self.space.index.get(cand[0], {})
                if ok and not repair:
                    out.append(cand)
                if ok or not repair or len(keys) == 0:
                    continue
                diff = keys != np.asarray(cand)[None, :]
                one = np.flatnonzero(diff.sum(axis=1) == 1)
                by_knob: dict[int, tuple[int, tuple]] = {}
                for r in one:
                    b = int(np.flatnonzero(diff[r])[0])
                    if b == pos:   # ``key`` itself, or another step of the same knob
                        continue
                    dist = abs(ords[b].index(int(keys[r, b])) - ords[b].index(cand[b])) if cand[b] in ords[b] else 0
                    if b not in by_knob or dist < by_knob[b][0]:
                        by_knob[b] = (dist, tuple(int(x) for x in keys[r]))
                out.extend(v for _, v in sorted(by_knob.values()))
        return out

    def _rank(self, ev: dict, penalised: bool) -> tuple:
        """Sort key of a valid evaluation for ``ranked_keys``."""
        raw, overflow = _raw(ev, self.rank_by)[self.objectives[0]], _overflow(ev)
        if penalised:
            return (raw * (1.0 + max(0.0, overflow)),)
        return (0, raw) if overflow <= 0 else (1, overflow)

    def ranked_keys(self, penalised: bool = False) -> list[tuple[int, ...]]:
        """Keys of the valid configurations evaluated so far, best first: plans that fit by the first
        objective, then plans that do not by how far they overflow memory; with ``penalised``, all of them
        by the first objective times (1 + overflow), so that a fast plan just over the memory comes early."""
        rows = [(self._rank(ev, penalised), key) for key, ev in self.cache.items() if ev.get("valid")]
        rows.sort()
        return [k for _, k in rows]

    def best_key(self) -> tuple[int, ...] | None:
        """``ranked_keys()[0]`` without sorting them all (None before any valid evaluation)."""
        rows = [(self._rank(ev, False), key) for key, ev in self.cache.items() if ev.get("valid")]
        return min(rows)[1] if rows else None

    @staticmethod
    def key_of(cfg: dict) -> tuple[int, ...]:
        """(nodes, *OPTUNA_KNOBS) of a configuration, recompute as its code."""
        return (int(cfg["nodes"]), *(_RC_CODE[cfg[k]] if k == "recompute" else int(cfg[k]) for k in OPTUNA_KNOBS))

    def remember(self, trials) -> None:
        """Fill the cache from finished trials (a resumed study, or other workers)."""
        for t in trials:
            ev = t.user_attrs.get("eval")
            if ev and "config" in ev:
                self.cache.setdefault(self.key_of(ev["config"]), {**ev, "scored": False})

    def evaluate(self, cfg: dict) -> dict:
        sp = self.space
        nodes = int(cfg["nodes"])
        n_gpus = nodes * sp.cluster.gpus_per_node
        key = self.key_of(cfg)[1:]
        tp, cp, pp = key[0], key[1], key[2]
        dp = max(1, n_gpus // (tp * cp * pp))
        config = {**{k: cfg[k] for k in OPTUNA_KNOBS}, "dp": dp, "nodes": nodes, "num_gpus": n_gpus}
        i = sp.index.get(nodes, {}).get(key)
        if i is None:
            from costmodel.rules import violations

            plan = ParallelPlan(tp=tp, pp=pp, vpp=key[3], dp=dp, cp=cp, ep=key[4], sequence_parallel=tp > 1,
                                micro_batch=key[5], global_batch=sp.global_batch, recompute=cfg["recompute"],
                                zero_stage=key[7], distributed_optimizer=key[7] >= 1)
            msgs = violations(sp.model, plan, n_gpus) or ["outside the planner's candidate space "
                                                          "(planner.space.candidate_columns)"]
            return {"config": config, "valid": False, "violations": msgs, "scored": False}
        one = _take(sp.valid[nodes], i)
        out = with_intervals(sp.model, sp.cluster_for(nodes), one, self.cost(sp.model, sp.cluster_for(nodes), one))
        self.evaluations += 1
        peak = float(np.nanmax(out["peak_memory_bytes"][0]))
        capacity = float(out["memory_capacity_bytes"][0])
        return {"config": config, "valid": True, "scored": True, "step_time_s": float(out["step_time_s"][0]),
                "step_time_p90_s": float(out["step_time_p90_s"][0]),
                "peak_memory_bytes": peak, "memory_capacity_bytes": capacity, "fits": bool(out["fits"][0]),
                "mfu": float(out["mfu"][0])}

    def values(self, ev: dict) -> tuple[list[float], dict]:
        if not ev["valid"]:
            n = len(ev["violations"])
            return ([PENALTY[o] * (RULE_WEIGHT + n) for o in self.objectives],
                    {"rules": RULE_WEIGHT * n, "memory": 0.0})
        overflow, raw = _overflow(ev), _raw(ev, self.rank_by)
        vals = [raw[o] for o in self.objectives]
        if self.penalise and overflow > 0:
            vals = [PENALTY[o] * (1.0 + overflow) for o in self.objectives]
        return vals, {"rules": 0.0, "memory": overflow}

    def __call__(self, trial):
        cfg = self.suggest(trial)
        key = self.key_of(cfg)
        ev = self.cache.get(key)
        if ev is None:
            ev = self.evaluate(cfg)
            self.cache[key] = {**ev, "scored": False}
        vals, cons = self.values(ev)
        trial.set_user_attr("eval", ev)
        if self.new_api:
            for k, v in cons.items():
                trial.set_constraint(k, v)
        else:
            trial.set_user_attr("constraints", cons)
        return vals[0] if len(vals) == 1 else vals


def _storage_url(url: str) -> str:
    """An RDB URL with its PostgreSQL driver made explicit: plain ``postgresql://`` (or ``postgres://``) runs
    on psycopg 3 (the ``[postgres]`` extra) when it is installed, else on psycopg2; without either, or with a
    ``+driver`` that is not installed, a one-line error says what to install."""
    import importlib.util

    from costmodel.profiles import InputError

    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return url
    dialect, _, driver = scheme.partition("+")
    have = {d: importlib.util.find_spec(m) is not None for d, m in (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))}
    if not driver:
        driver = next((d for d in ("psycopg", "psycopg2") if have[d]), "")
    if driver in have and not have[driver] or not driver:
        raise InputError(f"--storage {url}: the PostgreSQL driver {driver or 'psycopg'} is not installed; "
                         f"pip install -e \".[postgres]\" (psycopg 3) and use postgresql+psycopg://user@host/db")
    return f"postgresql+{driver}://{rest}"


def _open_storage(storage):
    """None (in memory), an RDB URL, or an Optuna storage object. RDB storages get heartbeats: a trial that a
    killed process left RUNNING is marked FAIL by the next trial any process of the study starts more than
    GRACE_S after its last heartbeat, and enqueued again (``RetryHeartbeatStaleTrialCallback``) so that its
    configuration is still tried. Call it under ``_StudyLock``: creating the tables is not safe against a
    second process doing the same."""
    import optuna

    if storage is None or not isinstance(storage, str):
        return storage
    kw = {}
    if storage.startswith("sqlite"):
        kw["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        _sqlite_wal(storage)
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:
        kw["heartbeat_stale_trial_callback"] = retry(max_retry=1)
    else:   # Optuna < 4.9
        kw["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=1)
    return optuna.storages.RDBStorage(_storage_url(storage), heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                      **kw)


HEARTBEAT_S = 2
GRACE_S = 10
"""A running trial records a heartbeat every HEARTBEAT_S; one silent for GRACE_S belongs to a dead process."""


class _StudyLock:
    """A lock shared by every process of one RDB study, for what Optuna does not make atomic: creating the
    schema (two processes on an empty database both try: "table studies already exists", UniqueViolation on
    PostgreSQL), enqueueing the expert seeds and the polish steps once per study. SQLite: ``flock`` on the
    file ``DB.lock`` beside the database; PostgreSQL: a session advisory lock (``pg_advisory_lock``). Other
    storages are not locked. Re-entrant within a process."""

    KEY = 0x706C616E   # "plan": the advisory lock's key

    def __init__(self, storage):
        self.url = storage if isinstance(storage, str) else None
        self.kind = None
        self.depth = 0
        self._fh = self._con = None
        if self.url is None:
            return
        if self.url.startswith("sqlite"):
            path = self.url.split(":///", 1)[1].split("?", 1)[0] if ":///" in self.url else ""
            if path and path != ":memory:":
                self.kind, self.path = "sqlite", path + ".lock"
        elif self.url.split("+")[0].split(":")[0] in ("postgresql", "postgres"):
            self.kind = "postgresql"

    def __enter__(self):
        self.depth += 1
        if self.depth > 1 or self.kind is None:
            return self
        if self.kind == "sqlite":
            import fcntl

            try:
                self._fh = open(self.path, "a")
            except OSError:   # no such folder and the like: the storage itself reports it
                self._fh = None
                return self
            fcntl.flock(self._fh, fcntl.LOCK_EX)
        else:
            import sqlalchemy

            if self._con is None:
                engine = sqlalchemy.create_engine(_storage_url(self.url), poolclass=sqlalchemy.pool.NullPool)
                try:
                    self._con = engine.connect()
                except sqlalchemy.exc.OperationalError as exc:
                    from costmodel.profiles import InputError

                    self.depth -= 1
                    why = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
                    raise InputError(f"--storage {self.url}: cannot connect to the PostgreSQL server ({why})") from None
            self._con.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self.KEY})
            self._con.commit()
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth > 0 or self.kind is None:
            return False
        if self._fh is not None:
            self._fh.close()   # releases the flock
            self._fh = None
        elif self._con is not None:
            import sqlalchemy

            self._con.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self.KEY})
            self._con.commit()
        return False

    def close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None


def _sqlite_wal(url: str) -> None:
    """Put an SQLite study file in write-ahead-log mode (a setting the file keeps): commits are cheaper and
    readers in other worker processes do not block the writer."""
    import sqlite3
    from pathlib import Path

    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:" or not Path(path).parent.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as con:
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error:
        pass


def _default_study_name(space: SearchSpace, objectives, encoding: str) -> str:
    enc = "" if encoding == "categorical" else f"-{encoding}"
    return (f"plan-{space.model.name}-{space.cluster.name}-gb{space.global_batch}-"
            f"{'+'.join(objectives)}{enc}")


def _prepare(model, cluster, global_batch, objectives, sampler, storage, study_name, seed, n_trials, cost,
             enqueue: bool = True, rank_by: str = "p50"):
    import optuna

    from costmodel.profiles import InputError

    space = search_space(model, cluster, global_batch, vary_nodes="gpus" in objectives)
    if space.n_valid == 0:
        return space, None, None, None, 0
    encoding = "index" if (sampler == "cmaes" or isinstance(sampler, optuna.samplers.CmaEsSampler)) else "categorical"
    n_trials = default_budget(space.n_valid) if n_trials is None else int(n_trials)
    obj = _Objective(space, cost, objectives, encoding, penalise=encoding == "index", rank_by=rank_by)
    seeds = expert_seeds(space)
    smp = _make_sampler(sampler, seed, n_trials)
    if isinstance(sampler, str):
        smp = _distinct_sampler(smp, obj, seed)
    if storage is not None and study_name is None:
        study_name = _default_study_name(space, objectives, encoding)
    lock = _StudyLock(storage)
    obj.lock = lock
    with lock:
        study = optuna.create_study(storage=_open_storage(storage), sampler=smp, study_name=study_name,
                                    directions=["minimize"] * len(objectives), load_if_exists=True)
        _locked_pop(study, lock)
        if storage is not None:
            _fail_unsampled_dead_trials(study)
        sig = space.signature(encoding, objectives)
        if rank_by != "p50":  # studies made before --rank-by keep their signature
            sig["rank_by"] = rank_by
        old = study.user_attrs.get("planner_space")
        if old is None:
            study.set_user_attr("planner_space", sig)
        elif old != sig:
            diff = [("knob values" if k == "choices" else f"{k} {old.get(k)} (now {sig[k]})")
                    for k in sig if old.get(k) != sig[k]]
            raise InputError(f"study {study.study_name!r} in {storage} was made for another search: "
                             f"{', '.join(diff)} differ; use another --study-name")
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        obj.remember(done)
        # The seeds are enqueued once per study (the first process to get here), for its first n_trials.
        if enqueue and not study.user_attrs.get("planner_seeded"):
            for cfg in seeds[: max(1, n_trials // 4)]:
                study.enqueue_trial(obj.params_of(cfg), skip_if_exists=True, user_attrs={OWNER_ATTR: _owner()})
            study.set_user_attr("planner_seeded", True)
    return space, study, obj, study_name, n_trials


def _locked_pop(study, lock: "_StudyLock") -> None:
    """Take waiting trials under the study's lock: on SQLite, Optuna's ``SELECT ... FOR UPDATE`` is a plain
    SELECT, so two processes could both take one enqueued trial, both run it and both count it. (Study's
    ``_pop_waiting_trial_id``, which ``Study.ask`` calls, is wrapped on this instance; where Optuna has no such
    method the race is caught in ``_optimize``.)"""
    pop = getattr(study, "_pop_waiting_trial_id", None)
    if pop is None or lock.kind is None:
        return

    def locked():
        with lock:
            return pop()

    study._pop_waiting_trial_id = locked


def _n_complete(study) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


CLAIM = "planner_claim"
"""Trial system attribute: the configuration key a DistinctSampler drew for the trial, set as it starts
(before the objective suggests the parameters), so that processes sharing the study do not draw it too."""


def _fail_unsampled_dead_trials(study) -> None:
    """Fail the RUNNING trials without parameters that started more than GRACE_S ago: a process killed between
    creating a trial and its first heartbeat (recorded as sampling starts) leaves one that Optuna's heartbeat
    check never sees. A live process samples a trial's parameters within milliseconds of creating it."""
    import datetime

    import optuna

    optuna.storages.fail_stale_trials(study)   # those with a heartbeat first: failed and retried
    storage = study._storage
    retry = (getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
             or getattr(storage, "get_failed_trial_callback", lambda: None)())   # Optuna < 4.9
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not t.params and t.datetime_start is not None and (now - t.datetime_start).total_seconds() > GRACE_S:
            try:
                failed = storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            except (RuntimeError, optuna.exceptions.StorageInternalError, optuna.exceptions.UpdateFinishedTrialError):
                failed = False
            if failed and retry is not None:   # retried like a stale one: an enqueued seed keeps its parameters
                retry(study, storage.get_trial(t._trial_id))


def _beat(study, trial) -> None:
    storage = study._storage
    if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
        storage.record_heartbeat(trial._trial_id)


def _claim(study, trial, key) -> None:
    study._storage.set_trial_system_attr(trial._trial_id, CLAIM, [int(x) for x in key])


def _trial_key(obj: "_Objective", t):
    """The configuration key of a trial: its parameters, the fixed ones of a trial still waiting, or the one
    claimed for a trial that is starting."""
    if CLAIM in t.system_attrs:
        return tuple(t.system_attrs[CLAIM])
    # (a running trial's params are written one by one as the objective suggests them)
    return obj.key_of_params({**t.params, **t.system_attrs.get("fixed_params", {})})


def _taken(study, obj: "_Objective", exclude: int | None = None) -> set:
    """Keys of every configuration the study has finished, running or waiting (all processes)."""
    import optuna

    S = optuna.trial.TrialState
    return {_trial_key(obj, t) for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.RUNNING, S.PRUNED,
                                                                                 S.WAITING))
            if t.number != exclude}


_STOP_SIGNALS = ("SIGINT", "SIGTERM")


@contextlib.contextmanager
def _on_stop_signals(handler):
    """Install ``handler`` for SIGINT and SIGTERM (main thread only) and restore the previous ones after."""
    import signal
    import threading

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in _STOP_SIGNALS:
            sig = getattr(signal, name)
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _raise_interrupt(*_):
    raise KeyboardInterrupt


def _optimize(study, obj: _Objective, n_trials: int, timeout_s, progress, target: int | None = None,
              run_first: bool = False) -> tuple[int, bool]:
    """Run up to n_trials new trials, stopping early once the study (every process's trials) has ``target``
    finished ones (checked after each trial, and before the first unless ``run_first``: a polish step this
    process just enqueued is run, not left waiting); returns (trials finished here, interrupted)."""
    import threading
    import time

    finished = 0
    stop = threading.Event()

    def reached(study_) -> bool:
        return target is not None and _n_complete(study_) >= target

    def cb(study_, trial_):
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished, n_trials)
        if stop.is_set() or reached(study_):
            study_.stop()

    # Ctrl-C (SIGINT) and SIGTERM ask the study to stop after the trial in flight, the way Optuna's own
    # study.stop() ends a run: a KeyboardInterrupt raised inside Optuna's storage code can be lost or leave it
    # half-way, and the trial RUNNING.
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    races = 0
    first = run_first
    with _on_stop_signals(lambda *_: stop.set()):
        while finished < n_trials and not stop.is_set() and (first or not reached(study)):
            first = False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                study.optimize(obj, n_trials=n_trials - finished, timeout=left, callbacks=[cb])
                break
            except KeyboardInterrupt:
                return finished, True
            except ValueError as exc:
                # Two processes popped the same enqueued trial (SQLite ignores Optuna's SELECT ... FOR UPDATE);
                # the other one finished it first. Nothing is lost: go on with the remaining trials.
                races += 1
                if not str(exc).startswith("Cannot tell a") or races > 100:
                    raise
                first = True   # run one more even at the target: the trial this process enqueued is waiting
    return finished, stop.is_set()


OWNER_ATTR = "planner_owner"
"""User attribute of an enqueued trial: the process (host:pid) that enqueued it."""


def _owner() -> str:
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _drain(study, obj: _Objective, timeout_s) -> tuple[int, bool]:
    """Run the trials this process enqueued that are still waiting (in a shared study, another process can
    take the one it enqueued and leave it to run another's), so that none is left behind. Returns
    (finished, interrupted)."""
    import optuna

    done = 0
    for _ in range(10):
        waiting = sum(t.user_attrs.get(OWNER_ATTR) == _owner() for t in
                      study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        if not waiting:
            break
        finished, interrupted = _optimize(study, obj, waiting, timeout_s, None, run_first=True)
        done += finished
        if interrupted or not finished:
            return done, interrupted
    return done, False


POLISH_FRACTION = 0.2
"""Share of a single-objective study's new trials kept for ``_polish``, the sweep around the best plans."""


def polish_budget(n_trials: int, objectives: tuple[str, ...]) -> int:
    """Trials of ``_polish`` among ``n_trials`` new ones (none for a multi-objective study, whose front
    has no single best plan to sweep around)."""
    return int(round(n_trials * POLISH_FRACTION)) if len(objectives) == 1 else 0


def _shifted(progress, offset: int, total: int):
    """A progress callback of a later phase: its own count offset by the trials of the earlier ones."""
    return None if progress is None else (lambda done, _n: progress(offset + done, total))


def _remaining(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


FAMILY_SLACK = 1.5
"""``_polish`` climbs from the best plan of another ZeRO stage when it is at most this much slower than the best
found (a sweep of its knobs may bring it that far; 175B on 1,024 A100: FSDP tp8 at 1.20x the best pipelined plan,
tp4 beats it)."""


def _moves(a: tuple[int, ...], b: tuple[int, ...]) -> set[tuple[int, int]]:
    """(key position, direction) of every knob that differs between two configuration keys."""
    return {(i, 1 if y > x else -1) for i, (x, y) in enumerate(zip(a, b)) if x != y}


def _climb_starts(obj: _Objective) -> list[tuple[int, ...]]:
    """Plans to climb from, in order: the best plan; the best that fits of each ZeRO stage when within
    FAMILY_SLACK of it (Megatron-FSDP plans, pp 1, lie several knobs away from pipelined ones, out of reach of
    single steps); plans that beat the best but overflow memory (a step in recompute or micro-batch may bring
    them in); then every plan by its objective x (1 + memory overflow)."""
    ranking = obj.ranked_keys()
    if not ranking:
        return []
    raw = {k: _raw(obj.cache[k], obj.rank_by)[obj.objectives[0]] for k in ranking}
    best_raw = raw[ranking[0]]
    first: dict[int, tuple[int, ...]] = {}
    for k in ranking:
        if _overflow(obj.cache[k]) <= 0:
            first.setdefault(k[-1], k)   # k[-1]: the ZeRO stage
    family_best = [k for k in first.values() if raw[k] <= FAMILY_SLACK * best_raw]
    penalised = obj.ranked_keys(penalised=True)
    over = [k for k in penalised if _overflow(obj.cache[k]) > 0 and raw[k] < best_raw]
    return list(dict.fromkeys(ranking[:1] + family_best + over + penalised))


def _polish(study, obj: _Objective, budget: int, deadline, progress, target: int | None = None) -> tuple[int, bool]:
    """Hill-climb from the plans found, one trial at a time. The first plan of ``_climb_starts`` with an
    unseen valid neighbour (``_Objective.neighbours``: one knob one step away; once those are spent, a
    rule-breaking step repaired by a second knob) has its neighbours tried; the first that beats the best
    becomes the new start, and its neighbours along the move that won are tried first (vpp 4 -> 5 -> 6 ...).
    Stops when ``budget`` trials are spent or no plan has an unseen neighbour.

    TPE samples each knob from a density over the good trials; near the optimum it settles on values that
    are good together (vpp 6 with no recompute, vpp 7 with selective) and can miss the one combination of
    them that is best. A sweep along the knobs from the incumbent finds it in a few trials. Returns (trials
    finished, interrupted)."""
    import optuna

    done, favoured = 0, set()
    obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))

    def reached() -> bool:
        return target is not None and _n_complete(study) >= target

    while done < budget and _remaining(deadline) != 0.0 and not reached():
        seen = set(obj.cache) | _taken(study, obj)
        start, batch = None, []
        for key in _climb_starts(obj):
            batch = [k for k in obj.neighbours(key) if k not in seen]
            batch = batch or list(dict.fromkeys(k for k in obj.neighbours(key, repair=True) if k not in seen))
            if batch:
                start = key
                break
        if not batch:
            break
        batch.sort(key=lambda k: not (_moves(start, k) & favoured))
        top = obj.best_key()
        for k in batch[: budget - done]:
            with obj.lock:
                # Another process of the study may have tried, be trying or have enqueued this step.
                obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
                if k in obj.cache or k in _taken(study, obj):
                    continue
                study.enqueue_trial(obj.params_of({"nodes": k[0], **_cfg_of_key(k[1:])}),
                                    user_attrs={OWNER_ATTR: _owner()})
            finished, interrupted = _optimize(study, obj, 1, _remaining(deadline),
                                              _shifted(progress, done, budget), target=target, run_first=True)
            done += finished
            if interrupted or not finished:
                return done, interrupted
            obj.remember(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            if obj.best_key() != top:   # a new best: climb on from it
                favoured = _moves(start, k)
                break
            if reached():
                break
    return done, False


def _search(study, obj: _Objective, n_trials: int, timeout_s, progress, base: int | None = None) -> tuple[int, bool]:
    """``n_trials`` new trials: the sampler's, then ``_polish`` (``polish_budget`` of them), then the
    sampler's again for any of the polish budget left over. Each phase also ends once the study (other
    processes included) has ``base`` (default: its finished trials now) plus that phase's share of
    ``n_trials`` finished trials. Returns (trials finished here, interrupted)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    base = _n_complete(study) if base is None else base
    n_polish = polish_budget(n_trials, obj.objectives)
    finished, interrupted = _optimize(study, obj, n_trials - n_polish, timeout_s, _shifted(progress, 0, n_trials),
                                      target=base + n_trials - n_polish)
    if interrupted or _remaining(deadline) == 0.0:
        return finished, interrupted
    more, interrupted = _polish(study, obj, n_polish, deadline, _shifted(progress, finished, n_trials),
                                target=base + n_trials)
    finished += more
    if not interrupted and finished < n_trials and _remaining(deadline) != 0.0:
        more, interrupted = _optimize(study, obj, n_trials - finished, _remaining(deadline),
                                      _shifted(progress, finished, n_trials), target=base + n_trials)
        finished += more
    return finished, interrupted


def _concat_scores(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k, v in parts[0].items():
        if isinstance(v, dict):
            out[k] = _concat_scores([p[k] for p in parts])
        elif np.ndim(v) == 2:
            w = max(np.shape(p[k])[1] for p in parts)
            out[k] = np.concatenate([np.pad(np.asarray(p[k], float), ((0, 0), (0, w - np.shape(p[k])[1])),
                                            constant_values=np.nan) for p in parts])
        else:
            out[k] = np.concatenate([np.atleast_1d(p[k]) for p in parts])
    return out


def _concat_plans(parts: list[PlanArrays]) -> PlanArrays:
    """Rows of several PlanArrays; ``stage_layers`` (uneven splits) is padded: NaN rows stay even splits,
    stages past a plan's depth hold 0 layers."""
    if len(parts) == 1:
        return parts[0]
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in PlanArrays.__dataclass_fields__
            if f != "stage_layers"}
    if all(p.stage_layers is None for p in parts):
        return PlanArrays(**cols, stage_layers=None)
    width = max(p.stage_layers.shape[1] for p in parts if p.stage_layers is not None)
    blocks = []
    for p in parts:
        if p.stage_layers is None:
            blocks.append(np.full((len(p), width), np.nan))
            continue
        sl = p.stage_layers
        pad = np.where(np.isnan(sl[:, :1]), np.nan, 0.0) * np.ones((1, width - sl.shape[1]))
        blocks.append(np.concatenate([sl, pad], axis=1))
    return PlanArrays(**cols, stage_layers=np.concatenate(blocks))


def _result(space, study, cost, objectives, sampler_name, n_trials, evaluations, interrupted, study_name, storage,
            rank_by: str = "p50"):
    import optuna

    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    by_nodes: dict[int, list[int]] = {}
    seen = set()
    for t in trials:
        ev = t.user_attrs.get("eval")
        if not ev or not ev.get("valid"):
            continue
        k = _Objective.key_of(ev["config"])
        if k in seen:
            continue
        seen.add(k)
        i = space.index.get(k[0], {}).get(k[1:])
        if i is not None:
            by_nodes.setdefault(k[0], []).append(i)
    parts, plan_parts, node_col = [], [], []
    for nodes in sorted(by_nodes):
        sub = _take(space.valid[nodes], sorted(by_nodes[nodes]))
        plan_parts.append(sub)
        parts.append(with_intervals(space.model, space.cluster_for(nodes), sub, cost(space.model, space.cluster_for(nodes), sub)))
        node_col.append(np.full(len(sub), nodes))
    common = dict(study=study, objectives=objectives, n_trials=n_trials, total_trials=len(trials),
                  evaluations=evaluations, interrupted=interrupted, sampler=sampler_name, study_name=study_name,
                  storage=storage if isinstance(storage, str) or storage is None else repr(storage))
    if not parts:
        empty = PlanArrays.from_columns(0, global_batch=space.global_batch)
        return OptunaResult(empty, {}, np.zeros(0, dtype=int), 0, pareto=np.zeros(0, dtype=int),
                            nodes=np.zeros(0, dtype=int), **common)
    plans = _concat_plans(plan_parts)
    scores = _concat_scores(parts)
    fits = np.asarray(scores["fits"], dtype=bool)
    vals = np.stack([_objective_column(scores, o, plans, rank_by) for o in objectives], axis=1)
    feas = np.flatnonzero(fits)
    front = feas[pareto_front(vals[feas])] if len(feas) else np.zeros(0, dtype=int)
    primary, time_ = vals[:, 0], rank_time(scores, rank_by)
    front = front[np.lexsort((time_[front], primary[front]))]
    rest_fit = np.setdiff1d(feas, front)
    rest_fit = rest_fit[np.lexsort((time_[rest_fit], primary[rest_fit]))]
    peak = np.nanmax(scores["peak_memory_bytes"], axis=1)
    nofit = np.flatnonzero(~fits)
    nofit = nofit[np.argsort(peak[nofit], kind="stable")]
    order = np.concatenate([front, rest_fit, nofit]).astype(int)
    return OptunaResult(plans, scores, order, len(plans), pareto=front, nodes=np.concatenate(node_col),
                        rank_by=rank_by, **common)


def optuna_search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, *, cost: CostFn = default_cost,
                  sampler: str | None = None, n_trials: int | None = None,
                  objectives: tuple[str, ...] | str = ("time",), storage: str | None = None,
                  study_name: str | None = None, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None, timeout_s: float | None = None,
                  workers: int = 1, rank_by: str = "p50") -> OptunaResult:
    """Search the layouts of ``planner.space`` with Optuna instead of scoring them all.

    sampler: "tpe", "cmaes" (single objective) or "nsga2"; None picks tpe for one objective, nsga2 for
      several (an ``optuna.samplers.BaseSampler`` instance is used as given).
    n_trials: finished trials the study should have (default ``default_budget``: 10% of the valid plans, at
      least 50); a resumed study keeps its finished trials and runs only the rest, and processes sharing a
      study each stop once it has n_trials. Expert seeds (``expert_seeds``) are enqueued once per study and
      count as trials.
    objectives: any of "time" (step time), "memory" (peak memory), "gpus" (GPU count; the node count is then
      sampled over powers of two up to the cluster's nodes), minimised; several give a Pareto front.
    storage: None (in memory), an RDB URL such as "sqlite:///plan.db", or an Optuna storage. With a storage,
      ``study_name`` (default: derived from model, cluster, batch, objectives) is created or resumed.
    progress: called as progress(finished_trials, n_trials) after each trial (in-process runs; with
      workers > 1 the parent polls the storage and reports the study's new trials).
    timeout_s: stop starting new trials after this many seconds.
    workers: processes sharing the RDB storage (each runs its share of n_trials with seed + its index, and
      ends with this process); only with a storage URL. ``cost`` must then be picklable (a module-level
      function).
    rank_by: "p50" ranks by the predicted step time, "p90" by its P90 (costmodel/trust.py): the "time"
      objective the samplers minimise and the order of the result.

    KeyboardInterrupt, SIGINT or SIGTERM ends the search early: the trial in flight finishes, finished trials
    are kept (in the storage too) and the result, best so far, has ``interrupted=True``.
    """
    import optuna

    from costmodel.profiles import InputError

    objectives, sampler_name = _check_args(objectives, sampler)
    rank_time({"step_time_s": []}, rank_by)  # one-line error on a bad rank_by
    workers = int(workers)
    if workers < 1:
        raise InputError(f"workers={workers}: valid workers are 1 or more")
    if workers > 1 and not (isinstance(storage, str) and "://" in storage and storage != "sqlite://"
                            and ":memory:" not in storage):
        raise InputError(f"workers={workers} needs a shared RDB storage such as sqlite:///plan.db "
                         f"(got storage={storage!r})")
    # Optuna logs every trial (INFO) and a trial stopped by Ctrl-C with its traceback (WARNING); the result
    # reports both (n_trials, interrupted), and an objective's own errors are raised, not logged.
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            _quiet_optuna_warnings()
            space, study, obj, study_name, n_trials = _prepare(model, cluster, global_batch, objectives,
                                                               sampler_name, storage, study_name, seed,
                                                               n_trials, cost, rank_by=rank_by)
            name = sampler_name if isinstance(sampler_name, str) else type(sampler_name).__name__
            if study is None:
                empty = PlanArrays.from_columns(0, global_batch=global_batch)
                return OptunaResult(empty, {}, np.zeros(0, dtype=int), 0, objectives=objectives,
                                    pareto=np.zeros(0, dtype=int), nodes=np.zeros(0, dtype=int), sampler=name)
            base = _n_complete(study)
            need = max(0, n_trials - base)   # n_trials finished trials in the study: a resumed one runs the rest
            finished, interrupted = 0, False
            try:
                with _on_stop_signals(_raise_interrupt):   # SIGTERM like Ctrl-C, between trials too
                    if workers == 1:
                        finished, interrupted = _search(study, obj, need, timeout_s, progress, base=base)
                    else:
                        # The enqueued seeds run here first, so that the workers never race for waiting trials;
                        # the polish sweep runs here last, over every worker's trials.
                        deadline = None if timeout_s is None else time.monotonic() + timeout_s
                        n_sampled = need - polish_budget(need, objectives)
                        waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
                        finished, interrupted = _optimize(study, obj, min(waiting, n_sampled), timeout_s, progress,
                                                          target=base + n_sampled)
                        if not interrupted and _n_complete(study) < base + n_sampled:
                            more, interrupted, ev = _run_workers(
                                study, model, cluster, global_batch, cost, sampler_name, n_sampled - finished,
                                objectives, storage, study_name, seed, _shifted(progress, finished, need), timeout_s,
                                workers, target=base + n_sampled, rank_by=rank_by)
                            finished, obj.evaluations = finished + more, obj.evaluations + ev
                        if not interrupted and _n_complete(study) < base + need:
                            more, interrupted = _polish(study, obj, need - finished, deadline,
                                                        _shifted(progress, finished, need), target=base + need)
                            finished += more
                    if not interrupted:
                        more, interrupted = _drain(study, obj, timeout_s)
                        finished += more
            except KeyboardInterrupt:
                interrupted = True
                finished = max(finished, min(need, _n_complete(study) - base))
            finally:
                obj.lock.close()
            evaluations = obj.evaluations
            return _result(space, study, cost, objectives, name, finished, evaluations, interrupted,
                           study_name, storage, rank_by)
    finally:
        optuna.logging.set_verbosity(level)


def _quiet_optuna_warnings() -> None:
    """Warnings Optuna gives for what the planner does on purpose (heartbeats are experimental; CMA-ES
    ignores the constraints, which are still recorded for best_trial and the Pareto front)."""
    import optuna

    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler")


def die_with_parent(sig: int | None = None) -> None:
    """Have the kernel send this process ``sig`` (default SIGTERM) when its parent dies (Linux
    ``PR_SET_PDEATHSIG``; elsewhere a thread that watches the parent's pid)."""
    import ctypes
    import os
    import signal
    import sys
    import threading

    sig = signal.SIGTERM if sig is None else sig
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0) == 0:   # 1: PR_SET_PDEATHSIG
                if os.getppid() != parent:   # the parent died before the call
                    os.kill(os.getpid(), sig)
                return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, daemon=True).start()


def _worker(args: dict, out) -> None:
    """One worker process of ``optuna_search(workers=N)``: load the shared study and run its trials."""
    import optuna

    die_with_parent()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    _quiet_optuna_warnings()
    try:
        space, study, obj, _, n = _prepare(args["model"], args["cluster"], args["global_batch"],
                                           args["objectives"], args["sampler"], args["storage"],
                                           args["study_name"], args["seed"], args["n_trials"], args["cost"],
                                           enqueue=False, rank_by=args.get("rank_by", "p50"))
        finished, interrupted = _optimize(study, obj, args["n_trials"], args["timeout_s"], None, target=args["target"])
        obj.lock.close()
        out.put((finished, interrupted, obj.evaluations, None))
    except KeyboardInterrupt:
        out.put((0, True, 0, None))
    except BaseException as exc:  # reported by the parent
        out.put((0, False, 0, f"{type(exc).__name__}: {exc}"))


def _run_workers(study, model, cluster, global_batch, cost, sampler, n_trials, objectives, storage, study_name,
                 seed, progress, timeout_s, workers, target=None,
                 rank_by: str = "p50") -> tuple[int, bool, int]:
    import multiprocessing as mp
    import os
    import queue
    import signal
    import time

    import optuna

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    shares = [n_trials // workers + (1 if i < n_trials % workers else 0) for i in range(workers)]
    procs = []
    for i, share in enumerate(shares):
        if share == 0:
            continue
        args = dict(model=model, cluster=cluster, global_batch=global_batch, cost=cost, sampler=sampler,
                    n_trials=share, objectives=objectives, storage=storage, study_name=study_name,
                    seed=seed + i, timeout_s=timeout_s, target=target,
                    rank_by=rank_by)
        p = ctx.Process(target=_worker, args=(args, out), daemon=False)
        p.start()
        procs.append(p)
    interrupted = False
    results = []
    try:
        while any(p.is_alive() for p in procs) or len(results) < len(procs):
            try:
                results.append(out.get(timeout=0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    break
            if progress is not None:
                now = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
                progress(min(now - start, n_trials), n_trials)
    except KeyboardInterrupt:
        interrupted = True
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        p.join()
    while True:
        try:
            results.append(out.get_nowait())
        except queue.Empty:
            break
    errors = [r[3] for r in results if r[3]]
    if errors and not interrupted:
        raise RuntimeError("optuna_search worker failed: " + "; ".join(errors))
    now = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    return now - start, interrupted or any(r[1] for r in results), sum(r[2] for r in results)


def explain_no_fit(model: ModelSpec, cluster: ClusterSpec, global_batch: int, result: SearchResult,
                   cost: CostFn = default_cost, max_doublings: int = 6) -> str:
    """Why nothing fits, and the smallest change that would: the closest plan's memory against capacity and
    what dominates it, then the fewest nodes (doubling) at which some layout fits."""
    i = int(result.order[0])
    peak = float(np.nanmax(result.scores["peak_memory_bytes"][i]))
    cap = float(result.scores["memory_capacity_bytes"][i])
    parts = {k: float(result.scores[k][i]) for k in ("weights_bytes", "grads_bytes", "optimizer_bytes",
                                                     "activations_bytes")}
    from planner.report import layout

    top = max(parts, key=parts.get).removesuffix("_bytes")
    p = to_plan(result.plans, i)
    msg = (f"no layout fits: the closest ({layout(p.model_dump())}, {p.recompute} recompute, micro-batch "
           f"{p.micro_batch}) needs {peak / 1e9:.0f} GB per GPU against {cap / 1e9:.0f} GB usable, mostly {top}")
    for k in range(1, max_doublings + 1):
        bigger = cluster.model_copy(update={"nodes": cluster.nodes * 2**k})
        res = exhaustive(model, bigger, global_batch, cost)
        if res.any_fits:
            q = to_plan(res.plans, int(res.order[0]))
            return (msg + f"; smallest change that fits: {bigger.num_gpus} GPUs ({bigger.nodes} nodes) with "
                    f"{layout(q.model_dump())}, {q.recompute} recompute, micro-batch {q.micro_batch}")
    return msg + f"; even {cluster.num_gpus * 2**max_doublings} GPUs do not fit it: a GPU with more memory is needed"
