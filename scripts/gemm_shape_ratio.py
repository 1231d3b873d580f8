"""How much more a Blackwell GPU loses on small GEMMs than a Hopper one, from measured GEMM rates by shape.

data/validation/gemm_shapes.csv holds XLA's default matmul performance table (bf16, 375 shapes, b x m x n x k
from 1 x 256^3 to 4 x 4096^3, for compute capabilities sm_90 and sm_100). Each architecture's times are fitted
with a fixed time per GEMM plus the FLOPs at one rate, t = flops / rate + t0 (least squares in log time). Both
come out with the same fixed time (about 6 us) and the rates differ by the ratio printed here.

In the cost model's shape curve (costmodel/compute.py gemm_efficiency) the efficiency falls as d / (d + d_half) in
the smallest GEMM dimension d. A fixed time t0 on a GEMM of 2 d N K FLOPs run at rate R costs a share
t0 R / (2 d N K) of it, which is d_half / d with d_half = t0 R / (2 N K): d_half grows with t0 x R. The
Blackwell profiles' gemm_half_efficiency_dim is therefore the default 512 (the Hopper and older profiles) times
the ratio of t0 x R on sm_100 to sm_90, printed by this script and checked by tests/test_gemm_shapes.py.

    python scripts/gemm_shape_ratio.py [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

DATA = Path(__file__).resolve().parents[1] / "data" / "validation" / "gemm_shapes.csv"
BASE_HALF_EFFICIENCY_DIM = 512.0   # costmodel/profiles.py HardwareProfile.gemm_half_efficiency_dim default


def fit_arch(rows: list[dict]) -> dict:
    """Rate (FLOP/s) and fixed time (s) per GEMM of t = flops / rate + t0 over one architecture's shapes."""
    b, m, n, k = (np.array([float(r[x]) for r in rows]) for x in "bmnk")
    rate = np.array([float(r["tflops"]) for r in rows]) * 1e12
    flops = 2.0 * b * m * n * k
    t = flops / rate

    def residuals(x: np.ndarray) -> np.ndarray:
        r, t0 = np.exp(x)
        return np.log(flops / r + t0) - np.log(t)

    res = least_squares(residuals, np.log([5e14, 5e-6]))
    r, t0 = np.exp(res.x)
    return {"shapes": len(rows), "rate_flops_per_s": float(r), "fixed_s": float(t0),
            "rms_log_error": float(np.sqrt(np.mean(res.fun ** 2)))}


def shape_ratio(path: Path = DATA) -> dict:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["dtype"] == "bf16"]
    fits = {a: fit_arch([r for r in rows if r["arch"] == a]) for a in ("sm_90", "sm_100")}
    ratio = (fits["sm_100"]["rate_flops_per_s"] * fits["sm_100"]["fixed_s"]) / (
        fits["sm_90"]["rate_flops_per_s"] * fits["sm_90"]["fixed_s"])
    return {"fits": fits, "ratio": float(ratio),
            "blackwell_gemm_half_efficiency_dim": float(round(BASE_HALF_EFFICIENCY_DIM * ratio))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    out = shape_ratio()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for arch, fit in out["fits"].items():
        print(f"{arch}: {fit['shapes']} shapes, rate {fit['rate_flops_per_s'] / 1e12:.0f} TFLOP/s, fixed "
              f"{fit['fixed_s'] * 1e6:.2f} us per GEMM, rms log error {fit['rms_log_error']:.3f}")
    print(f"fixed time x rate, sm_100 / sm_90: {out['ratio']:.3f}; Blackwell gemm_half_efficiency_dim "
          f"{out['blackwell_gemm_half_efficiency_dim']:.0f} (Hopper and older {BASE_HALF_EFFICIENCY_DIM:.0f})")


if __name__ == "__main__":
    main()
