"""Knob keys: the fixed knob space of an Optuna study (``SearchSpace``) and the translation between its
configurations, their keys and trial parameters (``KnobCodec``), with the neighbourhoods the sampler and the
polish sweep move in.

One parameter per knob (OPTUNA_KNOBS, and ``nodes`` when the GPU count is searched), each over the fixed,
sorted list of the values that occur in the valid plans of ``planner.space`` (the union over every node count
when the GPU count varies). dp is derived (GPUs / (tp*cp*pp)). A configuration is a dict of knob values
(recompute by name); its key is the tuple (nodes, *OPTUNA_KNOBS) of ints (recompute as its code). With the
"index" encoding (CMA-ES, which has no categorical parameters) each knob is an integer index into its list.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.plan import RECOMPUTE_CODE, RECOMPUTE_NAMES, PlanArrays
from costmodel.specs import ClusterSpec, ModelSpec
from planner.space import valid_plans

OPTUNA_KNOBS = ("tp", "cp", "pp", "vpp", "ep", "micro_batch", "recompute", "zero_stage")
"""The sampled knobs; each is also a PlanArrays column (recompute there as its code)."""


def knob_keys(a: PlanArrays) -> list[tuple[int, ...]]:
    """The knob key (OPTUNA_KNOBS, recompute as its code) of every row."""
    return list(zip(*(getattr(a, k).astype(np.int64).tolist() for k in OPTUNA_KNOBS)))


def cfg_of_key(key) -> dict:
    """Knob values of a key (recompute by name)."""
    cfg = dict(zip(OPTUNA_KNOBS, (int(x) for x in key)))
    cfg["recompute"] = RECOMPUTE_NAMES[cfg["recompute"]]
    return cfg


def key_of(cfg: dict) -> tuple[int, ...]:
    """(nodes, *OPTUNA_KNOBS) of a configuration, recompute as its code."""
    return (int(cfg["nodes"]), *(RECOMPUTE_CODE[cfg[k]] if k == "recompute" else int(cfg[k]) for k in OPTUNA_KNOBS))


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
    space_kw: dict | None = None                  # planner.space.candidate_columns keywords that narrowed it

    @property
    def n_valid(self) -> int:
        return sum(len(v) for v in self.valid.values())

    def cluster_for(self, nodes: int) -> ClusterSpec:
        return self.cluster if nodes == self.cluster.nodes else self.cluster.model_copy(update={"nodes": nodes})

    def signature(self, encoding: str, objectives: tuple[str, ...]) -> dict:
        sig = {"model": self.model.name, "layers": self.model.layers, "cluster": self.cluster.name,
               "global_batch": self.global_batch, "objectives": list(objectives), "encoding": encoding,
               "nodes": list(self.nodes), "choices": {k: list(v) for k, v in self.choices.items()}}
        if self.space_kw:   # studies of the full space keep the signature they were made with
            sig["space"] = {k: self.space_kw[k] for k in sorted(self.space_kw)}
        return sig


def search_space(model: ModelSpec, cluster: ClusterSpec, global_batch: int, vary_nodes: bool = False,
                 plans: PlanArrays | None = None, space_kw: dict | None = None) -> SearchSpace:
    """Knob lists of ``planner.space``'s valid plans; with ``vary_nodes`` over powers of two up to the
    cluster's node count (and the full cluster). ``plans``: the valid plans of the cluster itself, when the
    caller has built them already (``choose_strategy``), with the same ``space_kw``
    (``planner.space.candidate_columns`` keywords that narrow the space, e.g. optimizer_offload=1)."""
    if vary_nodes:
        nodes = sorted({n for n in (2 ** k for k in range(64)) if n <= cluster.nodes} | {cluster.nodes})
    else:
        nodes = [cluster.nodes]
    valid, index = {}, {}
    values: dict[str, set] = {k: set() for k in OPTUNA_KNOBS}
    for n in nodes:
        cl = cluster if n == cluster.nodes else cluster.model_copy(update={"nodes": n})
        v = plans if plans is not None and n == cluster.nodes else valid_plans(model, cl, global_batch,
                                                                               **(space_kw or {}))
        if len(v) == 0:
            continue
        valid[n] = v
        index[n] = {k: i for i, k in enumerate(knob_keys(v))}
        for k in OPTUNA_KNOBS:
            values[k].update(int(x) for x in np.unique(getattr(v, k)))
    choices = {k: sorted(values[k]) for k in OPTUNA_KNOBS}
    choices["recompute"] = [RECOMPUTE_NAMES[c] for c in choices["recompute"]]
    return SearchSpace(model, cluster, global_batch, tuple(n for n in nodes if n in valid), choices, valid, index,
                       dict(space_kw) if space_kw else None)


class KnobCodec:
    """Configurations of a SearchSpace <-> trial parameters ("categorical" or "index" encoding), and the
    valid configurations near a key."""

    key_of = staticmethod(key_of)

    def __init__(self, space: SearchSpace, encoding: str):
        self.space, self.encoding = space, encoding
        self._keys = None
        self._row: dict = {}
        self._ords: list[list[int]] | None = None

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
        return key_of(cfg)

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
        return {"nodes": int(row[0]), **cfg_of_key(row[1:])}

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
            vals = {k: ([RECOMPUTE_CODE[v] for v in ch] if k == "recompute" else [int(v) for v in ch])
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
                out.extend(self._repairs(keys, ords, pos, cand))
        return out

    @staticmethod
    def _repairs(keys: np.ndarray, ords: list[list[int]], pos: int, cand: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Valid keys one knob (other than ``pos``) away from the invalid ``cand``: per other knob the one
        nearest along its sorted list."""
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
        return [v for _, v in sorted(by_knob.values())]
