"""What grows with the number of ranks: stragglers and the latency of collectives over many nodes.

Two terms, each resting on a published measurement or model (README "Scale terms"):

Stragglers. Synchronous training runs at the pace of its slowest GPU: tensor-parallel collectives wait for
every rank of the node in every layer, pipeline stages wait for their neighbours, and the data-parallel
gradient reduction waits for every pipeline once per step. GPUs of one SKU in one cluster do not run equally
fast (power management and manufacturing spread): Sinha et al. 2022, "Not All GPUs Are Created Equal:
Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv:2208.11035), measured
SGEMM, ResNet-50, BERT and other kernels on over 90% of the GPUs of five clusters (Summit, Vortex, Frontera,
Longhorn, Corona; V100 and MI60) and report an 8% average performance variation between GPUs (outliers,
up to 1.5x slower than the median GPU, excluded from it). Read as the whisker-to-whisker range of their
box plots (Q1 - 1.5 IQR to Q3 + 1.5 IQR, +-2.70 sigma for a Gaussian, a range of 5.4 sigma), that is a
per-GPU speed spread of sigma = 8% / 5.4 = 1.5% (GPU_SPEED_SPREAD). Outliers are what operators detect and
drain (Llama 3 paper Sec. 3.3.4; MegaScale, NSDI'24, Sec. 5), so only the Gaussian part is kept. The
slowest of N GPUs is then expected sigma * E[max of N standard normals] behind the mean, about
sigma * sqrt(2 ln N) (extreme value theory, below): 4.6% at 512 GPUs, 5.7% at 8,192, 6.0% at 16,384.
Newer platforms vary at least as much: Golden et al. 2025, "PRISM" (arXiv:2510.15596, Meta), find GEMM
microbenchmarks across GPUs at scale differing by up to 14% depending on hardware and deployment (no per-platform
spread is given there, so it does not set the number). The SC'22 proceedings page of Sinha et al.'s study
(sc22.supercomputing.org, technical paper 186) states "32% (max 72%) average performance variation" over four of
the clusters, a figure other than the arXiv abstract's 8% for the non-outlier spread; it is not used here.

Collective latency over many nodes. NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc,
ncclTopoTuneModel, at commit 01afd20a of the public repository) charges a ring collective a base latency
plus one hop latency per ring step: Ring/Simple base 8.4 us, 3.4 us per NVLink step and 9.6 us per network
step, with nRanks-1 steps for all-gather and reduce-scatter (2(nRanks-1) for all-reduce), of which
nNodes-1 (2(nNodes-1)) cross the network; all-reduce may take the tree instead, 2 (log2(nNodes) x 50 us +
(ranks per node - 1) x 28 us) for Simple. Megatron reduces gradients in buckets of max(40M, 1M x dp)
parameters (megatron-core distributed/distributed_data_parallel.py:65), each one such collective, and
Megatron-FSDP gathers and reduces once per layer and micro-batch; a data-parallel group over 64-128 nodes
pays about 0.6-1.2 ms per bucket, which the constant small-message latency of costmodel/comm.py does not
grow with.
"""

from __future__ import annotations

import numpy as np

# Per-GPU speed spread (standard deviation / mean) among GPUs of one SKU: Sinha et al. 2022 (module doc).
GPU_SPEED_SPREAD = 0.015
# NCCL tuning model, Ring / Simple protocol (module doc): base latency, per NVLink step, per network step.
NCCL_RING_BASE_S = 8.4e-6
NCCL_RING_NVLINK_STEP_S = 3.4e-6
NCCL_RING_NET_STEP_S = 9.6e-6
# Tree / Simple: per NVLink level and per network level (log2 of the nodes), each way.
NCCL_TREE_NVLINK_STEP_S = 28e-6
NCCL_TREE_NET_STEP_S = 50e-6
# megatron-core DDP bucket: max(40M, 1M x dp) parameters (distributed_data_parallel.py:65).
DDP_BUCKET_MIN_PARAMS = 40e6
DDP_BUCKET_PARAMS_PER_DP_RANK = 1e6


# E[max of n independent standard normals] at n = 2^0 .. 2^20, by numerical integration of
# x n Phi(x)^(n-1) phi(x) (tests/test_scale.py recomputes it). It grows about like sqrt(2 ln n): the normal is
# in the Gumbel domain of attraction (Cramer 1946; David & Nagaraja, "Order Statistics", 2003, Sec. 10.5).
EXPECTED_MAX_STD_NORMAL_POW2 = (0.0, 0.5642, 1.0294, 1.4236, 1.766, 2.0697, 2.3437, 2.5946, 2.8269, 3.0439,
                                3.2482, 3.4418, 3.6261, 3.8023, 3.9714, 4.1341, 4.2911, 4.443, 4.5903, 4.7332,
                                4.8723)


def expected_max_std_normal(n) -> np.ndarray:
    """E[max of n independent standard normals] (0 for n = 1), interpolated in log2 n between the table's
    powers of two (within 0.01 of the integral); beyond 2^20 it follows sqrt(2 ln n). Broadcasts."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    table = np.asarray(EXPECTED_MAX_STD_NORMAL_POW2)
    k = np.log2(n)
    top = len(table) - 1
    beyond = table[-1] + np.sqrt(2.0 * np.log(n)) - np.sqrt(2.0 * np.log(2.0) * top)
    return np.where(k <= top, np.interp(k, np.arange(top + 1.0), table), beyond)


def straggler_fraction(world_gpus) -> np.ndarray:
    """How far behind the mean GPU the slowest of ``world_gpus`` runs, as a fraction of the step's compute."""
    return GPU_SPEED_SPREAD * expected_max_std_normal(world_gpus)


def nccl_latency_s(collective: str, size, n_domains) -> np.ndarray:
    """NCCL's modelled latency of one collective over ``size`` ranks in ``n_domains`` NVLink domains (one
    node each); all-reduce takes the lower of ring and tree. Zero for one rank. Broadcasts."""
    size = np.asarray(size, dtype=float)
    nodes = np.maximum(np.asarray(n_domains, dtype=float), 1.0)
    factor = 2.0 if collective == "all_reduce" else 1.0
    steps = factor * np.maximum(size - 1.0, 0.0)
    inter = factor * (nodes - 1.0)
    ring = NCCL_RING_BASE_S + (steps - inter) * NCCL_RING_NVLINK_STEP_S + inter * NCCL_RING_NET_STEP_S
    if collective == "all_reduce":
        per_node = np.maximum(size / nodes, 1.0)
        tree = 2.0 * ((per_node - 1.0) * NCCL_TREE_NVLINK_STEP_S + np.log2(nodes) * NCCL_TREE_NET_STEP_S)
        ring = np.where(nodes > 1, np.minimum(ring, tree), ring)
    return np.where(size > 1, ring, 0.0)


def ddp_buckets(params, dp) -> np.ndarray:
    """Gradient buckets megatron-core's DDP splits ``params`` into at data-parallel size ``dp``."""
    size = np.maximum(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * np.asarray(dp, dtype=float))
    return np.ceil(np.asarray(params, dtype=float) / size)
