"""Pipeline schedules: the step time of 1F1B and interleaved 1F1B from per-stage micro-batch times.

For p stages with per-micro-batch time t_i (forward + backward) and m micro-batches:
- 1F1B (Narayanan et al. 2021, Sec. 2.2.1): the slowest stage runs m micro-batches back to back and
  the others add the fill and drain, T = m * max(t) + (sum(t) - max(t)); with equal stages this is
  (m + p - 1) * t, a bubble fraction of (p - 1) / m.
- Interleaved 1F1B with v chunks per stage (Sec. 2.2.2): fill and drain shrink by v,
  T = m * max(t) + (sum(t) - max(t)) / v, i.e. a bubble of (p - 1) / (v * m).
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
