"""The Blackwell profiles' GEMM shape curve comes from XLA's measured matmul table (data/validation/gemm_shapes.csv)
through scripts/gemm_shape_ratio.py, and the cost model follows it."""

from pathlib import Path

import numpy as np
import pytest

from costmodel import compute
from costmodel.profiles import load_profile
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_script("gemm_shape_ratio")


@pytest.fixture(scope="module")
def ratio():
    return _script().shape_ratio()


def test_table_holds_both_architectures_on_the_same_grid(ratio):
    assert ratio["fits"]["sm_90"]["shapes"] == ratio["fits"]["sm_100"]["shapes"] == 375


def test_fixed_time_plus_rate_describes_the_table(ratio):
    """About 6.3 us per GEMM on both architectures, within 10% of each other; the rates are 754 and 1,403
    TFLOP/s; each fit is within 11% (rms, log time) of the 375 measured shapes."""
    h, b = ratio["fits"]["sm_90"], ratio["fits"]["sm_100"]
    assert h["fixed_s"] == pytest.approx(6.3e-6, rel=0.05)
    assert b["fixed_s"] == pytest.approx(h["fixed_s"], rel=0.10)
    assert h["rate_flops_per_s"] == pytest.approx(754e12, rel=0.02)
    assert b["rate_flops_per_s"] == pytest.approx(1403e12, rel=0.02)
    assert h["rms_log_error"] < 0.11 and b["rms_log_error"] < 0.11
    assert ratio["ratio"] == pytest.approx(1.855, abs=0.005)


def test_sm100_profiles_take_the_measured_ratio_and_the_others_the_default(ratio):
    for gpu in ("B200", "GB200"):
        assert load_profile(gpu).gemm_half_efficiency_dim == ratio["blackwell_gemm_half_efficiency_dim"] == 950.0
    for gpu in ("H100", "H200", "A100-80GB", "V100-32GB", "B300", "GB300"):
        assert load_profile(gpu).gemm_half_efficiency_dim == 512.0


def test_a_narrow_gemm_loses_more_on_b200_than_on_h100():
    """At a smallest dimension of 1,024 the shape curve leaves a B200 GEMM (d_half 950 x gemm_shape) a smaller
    share of its 8,192 rate than an H100 one (512 x gemm_shape), by the curve's own formula."""
    h100, b200 = load_profile("H100"), load_profile("B200")

    def rel(p, d):
        return float(compute.gemm_efficiency(p, "bf16", np.array([d]))[0]
                     / compute.gemm_efficiency(p, "bf16", np.array([8192.0]))[0])

    def curve(dh, d):
        return (d / (d + dh)) / (8192.0 / (8192.0 + dh))

    assert rel(h100, 1024.0) == pytest.approx(curve(512.0 * h100.calibration.gemm_shape, 1024.0), rel=1e-9)
    assert rel(b200, 1024.0) == pytest.approx(curve(950.0 * b200.calibration.gemm_shape, 1024.0), rel=1e-9)


def test_a_malformed_measured_dim_is_a_one_line_error(tmp_path):
    from costmodel.profiles import InputError

    text = (ROOT / "hardware_profiles" / "gpus" / "B200.yaml").read_text()
    assert "gemm_half_efficiency_dim: {value: 950, source: XLA_MATMUL_PERF_TABLE}" in text
    bad = tmp_path / "B200.yaml"
    bad.write_text(text.replace("{value: 950, source: XLA_MATMUL_PERF_TABLE}", "{value: wide, source: XLA_MATMUL_PERF_TABLE}"))
    with pytest.raises(InputError) as e:
        load_profile(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg and "gemm_half_efficiency_dim" in msg and "valid: a number" in msg
    bad.write_text(text.replace("source: XLA_MATMUL_PERF_TABLE}", "source: NOWHERE}"))
    with pytest.raises(InputError, match="NOWHERE"):
        load_profile(str(bad))
