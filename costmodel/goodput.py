"""Goodput of a training run under failures: checkpoint intervals and expected wall time, in closed form.

A synchronous training job stops whenever any of its GPUs or nodes fails; it then restarts from its last
checkpoint. With failures arriving as a Poisson process of rate lambda = 1/M (M: the job's mean time
between failures), a checkpoint that costs delta seconds every tau seconds of work, and a restart that costs R
seconds (detect, reschedule, initialise, load the checkpoint), the expected wall time of T_s seconds of
useful work is (Daly 2006, the "complete" model with failures also during checkpoints and restarts)

    T_w = M * exp(R/M) * (exp((tau + delta)/M) - 1) * T_s / tau

and the goodput (useful share of wall time) is T_s / T_w. Without failures (M -> inf) it is
tau / (tau + delta): the checkpoint overhead alone. Optimal intervals:

    Young 1974 (first order):          tau = sqrt(2 delta M)
    Daly 2006 (higher order, delta < 2M): tau = sqrt(2 delta M) (1 + sqrt(delta/(2M))/3 + delta/(18 M)) - delta
    exact minimum of T_w above:         tau = M (1 + W0(-exp(-1 - delta/M)))

The exact form follows from d/dtau [(exp((tau+delta)/M) - 1)/tau] = 0, i.e. (1 - x) e^(x + delta/M) = 1 with
x = tau/M, whose solution is x = 1 + W0(-e^(-1 - delta/M)) (W0: principal branch of Lambert's W); for
delta << M it reduces to Young's.

References:
  J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974.
  J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006.

Failure-rate defaults (per GPU-hour for GPU faults, per node-hour for everything else) are taken from the
Llama 3 report (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3.4 and Table 5):
419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes of 8).
  GPU-attributed: faulty GPU 148 + GPU HBM3 memory 72 + GPU SRAM memory 19 + GPU system processor 17 = 256
  exposure: 16,384 GPUs x 54 d x 24 h = 21,233,664 GPU-hours -> 256 / 21,233,664 = 1.206e-5 per GPU-hour
  other causes (network switch/cable 35, software, host, NIC, storage, power, ...): 419 - 256 = 163
  exposure: 2,048 nodes x 1,296 h = 2,654,208 node-hours -> 163 / 2,654,208 = 6.141e-5 per node-hour
  check: 16,384 x 1.206e-5 + 2,048 x 6.141e-5 = 0.3233 failures/h, MTBF 3.09 h = 1,296 h / 419.
The same report states more than 90% effective training time; with its 2 TB/s checkpoint storage
(hardware_profiles/clusters/h100x16384.yaml) these defaults give about 92% for 405B on 16,384 H100
(tests/test_goodput.py). Cross-check: the OPT-175B logbook (Zhang et al. 2022, arXiv:2205.01068, Sec. 2.5)
reports at least 35 manual restarts and over 100 hosts cycled in about 2 months on 992 A100 (124 nodes):
more than 100 / 1,440 h = one failure per < 14 h, where these defaults give 992 x 1.206e-5 + 124 x 6.141e-5 =
0.0196 /h (one per 51 h); an older or less burnt-in fleet fails several times more often, so scale the rates
(``FailureModel.scaled``, ``plan capacity --failure-scale``) for such a fleet. Kokolis et al. 2024
("Revisiting Reliability in Large-Scale Machine Learning Research Clusters", arXiv:2410.21680) model a job's
failure rate, as here, as the sum of its nodes' rates (nodes in series).

Restart overhead (assumption, edit to your stack): 10 min to detect the failure, reschedule and initialise,
before the checkpoint load; Megatron's hang timeout alone is 10 min (--distributed-timeout-minutes 10),
crashes are detected at once. Checkpoint size: 14 bytes per parameter, what a Megatron checkpoint holds with
mixed precision and Adam (2-byte weights + fp32 master weights and two moments, costmodel/memory.py).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field
from scipy.special import lambertw

from costmodel.flops import embedding_params, total_params
from costmodel.memory import OPTIMIZER_BYTES, WEIGHT_BYTES, muon_state_bytes
from costmodel.specs import FrozenSpec, ModelSpec

HOUR_S = 3600.0
LLAMA3_HOURS = 54 * 24
GPU_FAILURES_PER_GPU_HOUR = (148 + 72 + 19 + 17) / (16_384 * LLAMA3_HOURS)
NODE_FAILURES_PER_NODE_HOUR = (419 - (148 + 72 + 19 + 17)) / (2_048 * LLAMA3_HOURS)
RESTART_OVERHEAD_S = 600.0
CHECKPOINT_BYTES_PER_PARAM = WEIGHT_BYTES + OPTIMIZER_BYTES
# Device-to-host copy rate of one GPU's checkpoint shard for an asynchronous save (assumption: half of a
# PCIe Gen5 x16 link's 64 GB/s each way, which the NICs share on DGX-style nodes).
SNAPSHOT_BYTES_PER_S = 25e9


class FailureModel(FrozenSpec):
    """Failures that stop a synchronous job: rates per GPU-hour and per node-hour, and the restart cost."""

    per_gpu_hour: float = Field(default=GPU_FAILURES_PER_GPU_HOUR, ge=0)
    """Job-stopping GPU faults per GPU-hour (GPU, HBM, SRAM, GPU system processor)."""
    per_node_hour: float = Field(default=NODE_FAILURES_PER_NODE_HOUR, ge=0)
    """Job-stopping faults per node-hour from everything else (network, host, software, storage, power)."""
    restart_overhead_s: float = Field(default=RESTART_OVERHEAD_S, ge=0)
    """Detect, reschedule and initialise after a failure, before the checkpoint load."""

    def rate_per_s(self, gpus, nodes) -> np.ndarray:
        """Failure rate of a job on ``gpus`` GPUs in ``nodes`` nodes (broadcasts)."""
        per_h = np.asarray(gpus, dtype=float) * self.per_gpu_hour + np.asarray(nodes, dtype=float) * self.per_node_hour
        return per_h / HOUR_S

    def scaled(self, factor: float) -> FailureModel:
        return self.model_copy(update={"per_gpu_hour": self.per_gpu_hour * factor,
                                       "per_node_hour": self.per_node_hour * factor})


class CheckpointPolicy(FrozenSpec):
    """How the job checkpoints."""

    bytes_per_param: float = Field(default=CHECKPOINT_BYTES_PER_PARAM, gt=0)
    """Checkpoint bytes per model parameter (weights + optimizer state)."""
    interval_s: float | None = Field(default=None, gt=0)
    """Seconds of training between checkpoints; None = the interval that maximises goodput."""
    asynchronous: bool = False
    """Asynchronous save: training blocks only for the device-to-host snapshot; the write runs behind."""
    snapshot_bytes_per_s: float = Field(default=SNAPSHOT_BYTES_PER_S, gt=0)
    """Per-GPU device-to-host copy rate of an asynchronous snapshot."""


class GoodputEstimate(FrozenSpec):
    """Expected goodput of one job under a failure model and a checkpoint policy."""

    failure_rate_per_s: float
    """Failures per second of the whole job."""
    mtbf_s: float
    """Mean time between job failures (inf without failures)."""
    checkpoint_bytes: float
    """Bytes of one checkpoint."""
    save_s: float
    """Seconds training blocks per checkpoint (the write, or the snapshot when asynchronous)."""
    write_s: float
    """Seconds to write one checkpoint to storage."""
    restart_s: float
    """Seconds lost per failure besides rework: overhead + load (+ the unfinished asynchronous write)."""
    interval_s: float
    """Seconds of training between checkpoints (inf: never, without failures)."""
    young_interval_s: float
    """Young's first-order optimum sqrt(2 delta M), for reference."""
    goodput: float
    """Useful share of wall time."""
    checkpoint_fraction: float
    """Share of wall time spent blocked on checkpoints."""
    failure_fraction: float
    """Share of wall time lost to failures (rework and restarts)."""
    expected_failures_per_day: float
    """Failures a day of wall time."""

    def summary(self) -> dict:
        """JSON-safe dump (inf -> None)."""
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in self.model_dump().items()}


def young_interval_s(save_s, mtbf_s):
    """Young 1974: tau = sqrt(2 delta M)."""
    return np.sqrt(2.0 * np.asarray(save_s, dtype=float) * np.asarray(mtbf_s, dtype=float))


def daly_interval_s(save_s, mtbf_s):
    """Daly 2006 higher-order estimate: for delta < 2M, sqrt(2 delta M)(1 + sqrt(delta/2M)/3 + delta/18M) - delta;
    otherwise M."""
    d = np.asarray(save_s, dtype=float)
    m = np.asarray(mtbf_s, dtype=float)
    r = d / (2.0 * m)
    est = np.sqrt(2.0 * d * m) * (1.0 + np.sqrt(r) / 3.0 + r / 9.0) - d
    return np.where(d < 2.0 * m, est, m)


def optimal_interval_s(save_s, rate_per_s):
    """The interval that minimises Daly's expected wall time exactly: M (1 + W0(-exp(-1 - delta/M))).
    inf where the failure rate is 0 (never checkpoint)."""
    d = np.asarray(save_s, dtype=float)
    lam = np.asarray(rate_per_s, dtype=float)
    safe = np.where(lam > 0, lam, 1.0)
    x = 1.0 + np.real(lambertw(-np.exp(-1.0 - d * safe), 0))
    return np.where(lam > 0, x / safe, np.inf)


def wall_time_factor(interval_s, save_s, restart_s, rate_per_s):
    """Expected wall time per second of useful work (Daly 2006): exp(R lambda) expm1((tau+delta) lambda)/(lambda tau),
    and (tau + delta)/tau without failures; 1 for an infinite interval without failures."""
    tau = np.asarray(interval_s, dtype=float)
    d = np.asarray(save_s, dtype=float)
    r = np.asarray(restart_s, dtype=float)
    lam = np.asarray(rate_per_s, dtype=float)
    finite = np.isfinite(tau)
    t = np.where(finite, tau, 1.0)
    safe = np.where(lam > 0, lam, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        with_failures = np.exp(r * safe) * np.expm1((t + d) * safe) / (safe * t)
    without = np.where(finite, (t + d) / t, 1.0)
    return np.where(lam > 0, np.where(finite, with_failures, np.inf), without)


def goodput(interval_s, save_s, restart_s, rate_per_s):
    """Useful share of wall time: 1 / wall_time_factor."""
    return 1.0 / wall_time_factor(interval_s, save_s, restart_s, rate_per_s)


def muon_matrix_bytes(model: ModelSpec, policy: CheckpointPolicy) -> float | None:
    """Checkpoint bytes per parameter of a Muon model's matrices at the default policy (weights plus Adam's
    state): one moment where Adam saves two (costmodel/memory.py muon_state_bytes); None otherwise."""
    if model.optimizer != "muon" or policy.bytes_per_param != CHECKPOINT_BYTES_PER_PARAM:
        return None
    return WEIGHT_BYTES + muon_state_bytes(model.precision)


def checkpoint_bytes(model: ModelSpec, policy: CheckpointPolicy = CheckpointPolicy()) -> float:
    """Bytes of one checkpoint: every parameter at the policy's bytes, a Muon model's matrices at
    :func:`muon_matrix_bytes` (its embedding and output layer keep Adam's)."""
    n = total_params(model)
    matrix = muon_matrix_bytes(model, policy)
    if matrix is not None:
        e = embedding_params(model)
        adam = e["embedding"] + e["lm_head"]
        return float(adam * policy.bytes_per_param + (n - adam) * matrix)
    return float(n * policy.bytes_per_param)


def estimate_goodput(ckpt_bytes: float, storage_bytes_per_s: float, gpus: int, nodes: int,
                     failures: FailureModel = FailureModel(),
                     policy: CheckpointPolicy = CheckpointPolicy()) -> GoodputEstimate:
    """Goodput of a job of ``gpus`` GPUs in ``nodes`` nodes writing ``ckpt_bytes`` per checkpoint.

    Synchronous: training blocks for the write (bytes / storage bandwidth). Asynchronous: it blocks for the
    snapshot of each GPU's shard (bytes / gpus / snapshot rate); the write runs behind, so the next
    checkpoint waits for it (interval >= write) and a failure during it falls back one more checkpoint,
    which costs the write time in expectation (added to the restart). A restart loads the checkpoint at the
    storage bandwidth.
    """
    lam = float(failures.rate_per_s(gpus, nodes))
    write_s = ckpt_bytes / storage_bytes_per_s
    load_s = write_s
    if policy.asynchronous:
        save_s = ckpt_bytes / max(gpus, 1) / policy.snapshot_bytes_per_s
        restart_s = failures.restart_overhead_s + load_s + write_s
        floor = write_s
    else:
        save_s = write_s
        restart_s = failures.restart_overhead_s + load_s
        floor = 0.0
    tau = policy.interval_s if policy.interval_s is not None else float(optimal_interval_s(save_s, lam))
    tau = max(tau, floor)
    gp = float(goodput(tau, save_s, restart_s, lam))
    # Each tau of useful work carries one blocking save of save_s.
    ckpt_frac = 0.0 if not np.isfinite(tau) else gp * save_s / tau
    mtbf = 1.0 / lam if lam > 0 else float("inf")
    return GoodputEstimate(
        failure_rate_per_s=lam, mtbf_s=mtbf, checkpoint_bytes=ckpt_bytes, save_s=save_s, write_s=write_s,
        restart_s=restart_s, interval_s=tau, young_interval_s=float(young_interval_s(save_s, mtbf)),
        goodput=gp, checkpoint_fraction=ckpt_frac, failure_fraction=max(0.0, 1.0 - gp - ckpt_frac),
        expected_failures_per_day=lam * 86_400.0,
    )
