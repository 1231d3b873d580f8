"""Kernel time from the hardware profile: GEMMs through a shape-dependent efficiency curve, flash
attention through the same curve, memory-bound kernels through HBM bandwidth. Vectorised."""

from __future__ import annotations

import numpy as np

from costmodel.profiles import HardwareProfile

GEMM_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4", "fp32": "fp32",
              "tf32": "tf32"}

# Reference size at which the best-shape (MAMF) efficiency of the profile is reached.
_REF_DIM = 8192.0
# Flash attention reaches a lower share of the matmul peak than a large GEMM: the softmax, masking
# and online rescaling run on CUDA cores. FlashAttention-2 (Dao 2023, Fig. 5-6) reports 50-73% of
# A100 peak forward and 35-63% backward; FlashAttention-3 (Shah et al. 2024) 75% forward on H100.
ATTN_FWD_EFFICIENCY = 0.70
ATTN_BWD_EFFICIENCY = 0.55
# How the fused attention core's throughput depends on the key/value length one call sees (s / cp), as
# measured by kernel microbenchmarks, relative to 8,192 tokens where the constants above apply: NVIDIA
# cudnn-frontend benchmark/sdpa_benchmark_training, artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv
# (cudnn_fe backend, as Transformer Engine calls it; bf16, causal, head dim 128, batch 1, 128 query / 8 KV
# heads), forward and backward TFLOP/s; copied to data/validation/attention.csv. Below 512 tokens the rate
# falls in proportion to the length; beyond 32k it is held.
ATTN_KV_TOKENS = (512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)
ATTN_FWD_TFLOPS_BY_KV = (408.0, 733.0, 1069.0, 1386.0, 1584.0, 1668.0, 1681.0)
ATTN_BWD_TFLOPS_BY_KV = (329.0, 527.0, 655.0, 1054.0, 1211.0, 1304.0, 1348.0)
ATTN_REF_KV_TOKENS = 8192.0


def attention_length_factor(kv_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward attention throughput at ``kv_tokens`` relative to ATTN_REF_KV_TOKENS (measured;
    interpolated in log2 of the length)."""
    kv = np.maximum(np.asarray(kv_tokens, dtype=float), 1.0)
    lo = ATTN_KV_TOKENS[0]
    xs = np.log2(ATTN_KV_TOKENS)
    x = np.log2(np.maximum(kv, lo))
    short = np.minimum(kv / lo, 1.0)
    ref = np.log2(ATTN_REF_KV_TOKENS)
    fwd = np.interp(x, xs, ATTN_FWD_TFLOPS_BY_KV) / np.interp(ref, xs, ATTN_FWD_TFLOPS_BY_KV)
    bwd = np.interp(x, xs, ATTN_BWD_TFLOPS_BY_KV) / np.interp(ref, xs, ATTN_BWD_TFLOPS_BY_KV)
    return fwd * short, bwd * short


# No achieved matmul efficiency in data/validation/gemm.csv exceeds 0.97 (Gaudi 2) and no NVIDIA one 0.87 of the
# vendor peak: a calibration factor may not push a GEMM past this (a bound with margin, not fitted).
MAX_GEMM_EFFICIENCY = 0.92


def gemm_dtype(precision: str) -> str:
    return GEMM_DTYPE[precision]


def gemm_efficiency(profile: HardwareProfile, dtype: str, min_dim) -> np.ndarray:
    """Achieved fraction of peak for a GEMM whose smallest dimension is ``min_dim``.

    Saturating shape curve d/(d + d_half), normalised so that a GEMM with all dimensions >= 8192
    reaches the profile's best-shape efficiency (MAMF), then scaled by the calibration factors.
    """
    d = np.maximum(np.asarray(min_dim, dtype=float), 1.0)
    dh = profile.gemm_half_efficiency_dim * profile.calibration.gemm_shape
    shape = (d / (d + dh)) / (_REF_DIM / (_REF_DIM + dh))
    eff = profile.max_efficiency(dtype) * np.minimum(shape, 1.0) * profile.calibration.gemm_efficiency
    if dtype in ("fp8", "fp4"):
        eff = eff * profile.calibration.fp8_gemm_efficiency
    if dtype == "fp4":
        eff = eff * profile.calibration.fp4_gemm_efficiency
    # MAX_GEMM_EFFICIENCY bounds it; a measured profile (plan profile) whose peak is its own best GEMM rate
    # sets its cap to 1.0.
    cap = profile.gemm_efficiency_cap if profile.gemm_efficiency_cap is not None else MAX_GEMM_EFFICIENCY
    return np.minimum(eff, cap)


def gemm_time_s(profile: HardwareProfile, dtype: str, flops, min_dim) -> np.ndarray:
    return np.asarray(flops, dtype=float) / (profile.peak(dtype) * gemm_efficiency(profile, dtype, min_dim))


def attention_time_s(profile: HardwareProfile, fwd_flops, seq_len_local, head_dim, dtype: str = "bf16") -> tuple:
    """Forward and backward time of the flash-attention core (bf16 unless training in fp32: fp8 recipes
    keep it in bf16).

    Backward does 2.5x the forward FLOPs (dQ, dK, dV plus recomputing the scores).
    Short sequences and narrow heads run less efficiently (same saturating curve on min(s, 8*d)), and the
    rate follows the measured dependence on the key/value length (attention_length_factor).
    """
    shape_dim = np.minimum(np.asarray(seq_len_local, dtype=float), 8.0 * head_dim)
    base = gemm_efficiency(profile, dtype, shape_dim) * profile.calibration.attention_efficiency
    len_f, len_b = attention_length_factor(seq_len_local)
    fwd = np.asarray(fwd_flops, dtype=float) / (profile.peak(dtype) * base * ATTN_FWD_EFFICIENCY * len_f)
    bwd = 2.5 * np.asarray(fwd_flops, dtype=float) / (profile.peak(dtype) * base * ATTN_BWD_EFFICIENCY * len_b)
    return fwd, bwd


def memory_bound_time_s(profile: HardwareProfile, bytes_moved) -> np.ndarray:
    bw = profile.hbm_bandwidth_bytes_per_s.value * profile.calibration.memory_bound_efficiency
    return np.asarray(bytes_moved, dtype=float) / bw


# Share of the host DRAM's theoretical peak (HardwareProfile.host_memory_bandwidth_bytes_per_s) a CPU optimizer
# step streams at. An assumption, not fitted: STREAM-type kernels on two-socket servers reach roughly 70-80% of
# the channels' peak, and the Adam step is such a kernel (each element read and written once). The second half
# is checked by scripts/cpu_adam_rate.py: on the 2-core AMD EPYC CI machine the fused step moved 1.03-1.07x the
# bytes per second of a STREAM copy / triad in three of four runs (0.74 in one; a shared VM). A profile measured
# by plan profile on GPUs carries the step's own rate instead (host_stream_fraction 1.0).
HOST_STREAM_FRACTION = 0.75
# Host bytes one Adam step moves per parameter (torch.optim.AdamW(fused=True) on the CPU, what megatron-core's
# HybridDeviceOptimizer runs, and DeepSpeed's CPU-Adam alike): reads the fp32 weight, gradient and both moments
# (16), writes the weight and both moments (12).
CPU_ADAM_BYTES_PER_PARAM = 28.0
# Bytes per offloaded parameter over the host link: the fp32 gradient to the host (megatron-core
# hybrid_optimizer.py _set_sub_optimizer_grads copies the main gradient as it is) and the fp32 weight back
# (param_copy_back_gpu_hook: the CPU weight copied into the GPU's, the cast done on arrival).
OFFLOAD_GRAD_BYTES = 4.0
OFFLOAD_PARAM_BYTES = 4.0


def cpu_optimizer_time_s(profile: HardwareProfile, params, host_share=1.0) -> np.ndarray:
    """Seconds a CPU optimizer step over ``params`` parameters takes, copies included (optimizer_offload).

    megatron-core's HybridDeviceOptimizer (--overlap-cpu-optimizer-d2h-h2d) steps one CPU optimizer per
    parameter: the gradient copy to the host, the CPU step and the copy back run as a pipeline, so the step
    takes the longest of the three. ``host_share``: how many GPUs' share of the host this GPU has (more than
    one where the run leaves GPUs of a node idle). Infinite where the profile does not know its host."""
    params = np.asarray(params, dtype=float)
    host_bw, link = profile.host_memory_bandwidth_bytes_per_s, profile.host_link_bandwidth_bytes_per_s
    if host_bw is None or link is None:
        return np.where(params > 0, np.inf, 0.0)
    frac = profile.host_stream_fraction or HOST_STREAM_FRACTION
    t_cpu = params * CPU_ADAM_BYTES_PER_PARAM / (host_bw.value * frac * np.asarray(host_share))
    t_d2h = params * OFFLOAD_GRAD_BYTES / link.value
    t_h2d = params * OFFLOAD_PARAM_BYTES / link.value
    return np.maximum(np.maximum(t_cpu, t_d2h), t_h2d)
