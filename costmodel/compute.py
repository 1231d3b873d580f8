"""Kernel time from the hardware profile: GEMMs through a shape-dependent efficiency curve, flash
attention through the same curve, memory-bound kernels through HBM bandwidth. Vectorised."""

from __future__ import annotations

import numpy as np

from costmodel.profiles import HardwareProfile

GEMM_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4", "fp32": "fp32"}

# Reference size at which the best-shape (MAMF) efficiency of the profile is reached.
_REF_DIM = 8192.0
# Flash attention reaches a lower share of the matmul peak than a large GEMM: the softmax, masking
# and online rescaling run on CUDA cores. FlashAttention-2 (Dao 2023, Fig. 5-6) reports 50-73% of
# A100 peak forward and 35-63% backward; FlashAttention-3 (Shah et al. 2024) 75% forward on H100.
ATTN_FWD_EFFICIENCY = 0.70
ATTN_BWD_EFFICIENCY = 0.55
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
    Short sequences and narrow heads run less efficiently (same saturating curve on min(s, 8*d)).
    """
    shape_dim = np.minimum(np.asarray(seq_len_local, dtype=float), 8.0 * head_dim)
    base = gemm_efficiency(profile, dtype, shape_dim) * profile.calibration.attention_efficiency
    fwd = np.asarray(fwd_flops, dtype=float) / (profile.peak(dtype) * base * ATTN_FWD_EFFICIENCY)
    bwd = 2.5 * np.asarray(fwd_flops, dtype=float) / (profile.peak(dtype) * base * ATTN_BWD_EFFICIENCY)
    return fwd, bwd


def memory_bound_time_s(profile: HardwareProfile, bytes_moved) -> np.ndarray:
    bw = profile.hbm_bandwidth_bytes_per_s.value * profile.calibration.memory_bound_efficiency
    return np.asarray(bytes_moved, dtype=float) / bw
