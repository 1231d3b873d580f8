"""Pipeline schedules: the step time of 1F1B and interleaved 1F1B from per-stage micro-batch times.

For p stages with per-micro-batch time t_i (forward + backward) and m micro-batches:
- 1F1B (Narayanan et al. 2021, Sec. 2.2.1): the slowest stage runs m micro-batches back to back and
  the others add the fill and drain, T = m * max(t) + (sum(t) - max(t)); with equal stages this is
  (m + p - 1) * t, a bubble fraction of (p - 1) / m.
- Interleaved 1F1B with v chunks per stage (Sec. 2.2.2): fill and drain shrink by v,
  T = m * max(t) + (sum(t) - max(t)) / v, i.e. a bubble of (p - 1) / (v * m).

The closed form takes a stage's v chunks as equal. :func:`interleaved_schedule_s` runs Megatron's interleaved
order op by op for given chunk times; it reproduces the closed form for equal chunks and shows what unequal
ones cost (the planner offers only chunkings that split its heaviest stages evenly, planner/space.py).
"""

from __future__ import annotations

import numpy as np


def pipeline_time_s(stage_time_s: np.ndarray, weight: np.ndarray, m, vpp) -> tuple[np.ndarray, np.ndarray]:
    """Step time of the pipelined part and its bubble, from (n_plans, n_columns) stage times where each
    column stands for ``weight`` identical stages."""
    t = np.where(weight > 0, stage_time_s, 0.0)
    t_max = t.max(axis=1)
    fill = ((t * weight).sum(axis=1) - t_max) / np.asarray(vpp, dtype=float)
    m = np.asarray(m, dtype=float)
    return m * t_max + fill, fill


def in_flight_microbatches(pp, vpp, m, stage_index: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations stage i holds at its peak under 1F1B (Korthikanti Sec. 4.2.3):
    stage i keeps p - i; interleaving multiplies the first stage's by 1 + (p-1)/(p*v)."""
    pp = np.asarray(pp, dtype=float)[:, None]
    vpp = np.asarray(vpp, dtype=float)[:, None]
    m = np.asarray(m, dtype=float)[:, None]
    i = stage_index
    base = np.minimum(m, np.maximum(pp - i, 1.0))
    inter = np.where(vpp > 1, 1.0 + (pp - 1) / (pp * vpp), 1.0)
    return base * inter


def _interleaved_order(pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """(pass, chunk, micro-batch) in the order one pipeline rank runs them in megatron-core's interleaved 1F1B
    (pipeline_parallel/schedules.py: (pp - rank - 1) * 2 + (vpp - 1) * pp warm-up forwards, then one forward
    and one backward in turn; the k-th forward runs chunk (k // pp) % vpp on micro-batch
    (k // (pp * vpp)) * pp + k % pp, the k-th backward the same micro-batch on chunk vpp - 1 - that)."""
    total = m * vpp

    def fwd(k: int) -> tuple[int, int]:
        group, pos = divmod(k, pp * vpp)
        return pos // pp, group * pp + pos % pp

    def bwd(k: int) -> tuple[int, int]:
        chunk, mb = fwd(k)
        return vpp - 1 - chunk, mb

    warm = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    order = [("F", *fwd(k)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *fwd(warm + k)), ("B", *bwd(k))]
    return order + [("B", *bwd(k)) for k in range(total - warm, total)]


def interleaved_schedule_s(forward_s, backward_s, m: int) -> float:
    """Time of the interleaved 1F1B schedule for per-chunk forward and backward seconds of one micro-batch
    (``forward_s[r][c]``: chunk c of pipeline rank r), ``m`` micro-batches (a multiple of pp), communication
    free: each rank runs its ops in order, an op starting when the rank is free and its input is ready (the
    previous virtual stage's forward, the next one's backward, the last forward for the first backward).
    Python, one plan at a time: a check on the closed form, not a term of the vectorised estimate."""
    f, b = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    pp, vpp = f.shape
    orders = [_interleaved_order(pp, vpp, m, r) for r in range(pp)]
    done: dict[tuple, float] = {}
    free, nxt = [0.0] * pp, [0] * pp
    progressed = True
    while progressed:
        progressed = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                kind, c, mb = orders[r][nxt[r]]
                if kind == "F":
                    dep = ("F", c, mb, r - 1) if r > 0 else (("F", c - 1, mb, pp - 1) if c > 0 else None)
                else:
                    dep = (("B", c, mb, r + 1) if r < pp - 1 else
                           (("B", c + 1, mb, 0) if c < vpp - 1 else ("F", vpp - 1, mb, pp - 1)))
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep is not None else 0.0)
                free[r] = done[(kind, c, mb, r)] = start + (f[r, c] if kind == "F" else b[r, c])
                nxt[r] += 1
                progressed = True
    return max(free)
