"""Hardware profiles and cluster files: they load, their aliases cover the validation data, their
numbers match the cited sources, and bad files fail with a message naming the file and the field."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from costmodel.profiles import (
    PROFILE_DIR,
    InputError,
    busbw_at,
    load_cluster,
    load_profile,
    profile_paths,
)
from script_module import load_script

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "data" / "validation"
CLUSTER_PATHS = sorted((PROFILE_DIR / "clusters").glob("*.yaml"))
GIB = 2**30


def _rows(name: str) -> list[dict[str, str]]:
    with (VALIDATION / name).open(newline="") as fh:
        return list(csv.DictReader(fh))


def _curve_script():
    """scripts/build_profile_curves.py as a module."""
    return load_script("build_profile_curves")


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


# --- every shipped file loads ----------------------------------------------------------------

def test_expected_profiles_and_clusters_ship():
    assert {p.stem for p in profile_paths()} >= {
        "A100-80GB", "A100-40GB", "A800-80GB", "H100", "H200", "H800", "GH200", "GH200-96GB", "B200", "B300",
        "GB200", "GB300", "V100-32GB", "V100-16GB", "H100-PCIe", "H100-NVL", "A100-PCIe-80GB", "A100-PCIe-40GB",
        "H200-NVL", "H20"}
    assert {p.stem for p in CLUSTER_PATHS} >= {
        "h100x512", "a100x1024", "h200x256", "b200x1024", "gb200-nvl72x8", "gb300-nvl72x4",
        "h100x16384", "v100-dgx2x64"}


@pytest.mark.parametrize("path", profile_paths(), ids=lambda p: p.stem)
def test_profile_loads_and_is_sourced(path):
    prof = load_profile(str(path))
    assert prof.name == path.stem
    assert load_profile(path.stem) is prof
    raw = yaml.safe_load(path.read_text())
    # Every source id in the table is used, and every citation is a real sentence.
    used = {raw[k]["source"] for k in ("memory_bytes", "hbm_bandwidth_bytes_per_s",
                                       "nvlink_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s")}
    used |= {v["source"] for k in ("peak_flops", "gemm_max_efficiency") for v in raw[k].values()}
    used |= {c["source"] for c in raw.get("curves") or []}
    if isinstance(raw.get("gemm_half_efficiency_dim"), dict):
        used.add(raw["gemm_half_efficiency_dim"]["source"])
    for k in ("host_link_bandwidth_bytes_per_s", "host_memory_bytes", "host_memory_bandwidth_bytes_per_s"):
        if raw.get(k):
            used.add(raw[k]["source"])
    if raw.get("unfused_attention_source"):
        used.add(raw["unfused_attention_source"])
    assert set(prof.sources) == used, f"unused sources: {set(prof.sources) - used}"
    assert all(len(text) > 40 for text in prof.sources.values())
    assert prof.gap_model.strip()
    if "calibration" in raw:  # written by scripts/fit_profiles.py only, which names itself
        assert "scripts/fit_profiles.py" in raw["calibration"]["fitted_by"]


@pytest.mark.parametrize("path", profile_paths(), ids=lambda p: p.stem)
def test_profile_numbers_are_yaml_numbers(path):
    """PyYAML reads `989e12` as a string; pydantic would coerce it, other readers would not."""
    raw = yaml.safe_load(path.read_text())
    values = [raw[k]["value"] for k in ("memory_bytes", "hbm_bandwidth_bytes_per_s",
                                        "nvlink_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s")]
    values += [v["value"] for k in ("peak_flops", "gemm_max_efficiency") for v in raw[k].values()]
    values += [x for c in raw.get("curves") or [] for pt in c["points"] for x in pt]
    values.append(raw["collective_latency_s"])
    bad = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)]
    assert not bad, f"{path.name}: non-numeric values {bad[:5]}"


@pytest.mark.parametrize("path", profile_paths(), ids=lambda p: p.stem)
def test_profile_values_are_plausible(path):
    prof = load_profile(str(path))
    assert 16 * GIB <= prof.memory_bytes.value <= 300 * GIB
    assert 0.5e12 <= prof.hbm_bandwidth_bytes_per_s.value <= 10e12
    assert 100e9 <= prof.nvlink_bandwidth_bytes_per_s.value <= 1e12
    assert 5e9 <= prof.nic_bandwidth_bytes_per_s.value <= 100e9
    for dtype, eff in prof.gemm_max_efficiency.items():
        assert 0.5 < eff.value < 1.0, dtype
        assert dtype in prof.peak_flops, f"efficiency for {dtype} without a peak"
    # Narrower dtypes are never slower.
    order = [d for d in ("fp32", "tf32", "bf16", "fp8", "fp4") if d in prof.peak_flops]
    peaks = [prof.peak_flops[d].value for d in order]
    assert peaks == sorted(peaks), order
    assert 1e-6 <= prof.collective_latency_s <= 100e-6


@pytest.mark.parametrize("path", CLUSTER_PATHS, ids=lambda p: p.stem)
def test_cluster_loads(path):
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    assert load_cluster(path.stem) == cluster  # shipped files resolve by name
    prof = load_profile(cluster.gpu)
    assert cluster.domain_gpus % cluster.gpus_per_node == 0
    assert cluster.num_gpus % cluster.domain_gpus == 0
    assert cluster.domain_gpus == prof.nvlink_domain_gpus
    assert cluster.inter_node.rails <= cluster.gpus_per_node
    assert cluster.inter_node.nic_bandwidth_bytes_per_s == prof.nic_bandwidth_bytes_per_s.value
    assert "storage_bandwidth_bytes_per_s" in yaml.safe_load(path.read_text())


@pytest.mark.parametrize("name, gpus, domain", [
    ("h100x512", 512, 8), ("a100x1024", 1024, 8), ("h200x256", 256, 8), ("b200x1024", 1024, 8),
    ("gb200-nvl72x8", 576, 72), ("gb300-nvl72x4", 288, 72), ("h100x16384", 16384, 8),
    ("v100-dgx2x64", 64, 16)])
def test_cluster_sizes(name, gpus, domain):
    cluster = load_cluster(name)
    assert (cluster.num_gpus, cluster.domain_gpus) == (gpus, domain)


def test_cluster_details():
    h100 = load_cluster("h100x512")
    assert (h100.nodes, h100.gpus_per_node, h100.inter_node.rails) == (64, 8, 8)
    assert h100.topology == "rail-optimised" and h100.price_per_gpu_hour_usd == 2.5
    gb200 = load_cluster("gb200-nvl72x8")
    assert (gb200.nodes, gb200.gpus_per_node, gb200.nvlink_domain_gpus) == (144, 4, 72)
    assert load_cluster("a100x1024").inter_node.nic_bandwidth_bytes_per_s == 25e9
    assert load_cluster("gb300-nvl72x4").inter_node.nic_bandwidth_bytes_per_s == 100e9


# --- names and aliases -----------------------------------------------------------------------

@pytest.mark.parametrize("gpu_type", sorted({r["gpu_type"] for r in _rows("published_runs.csv")}))
def test_published_runs_gpu_types_resolve(gpu_type):
    load_profile(gpu_type)


@pytest.mark.parametrize("alias, name", [
    ("A100", "A100-80GB"), ("A100-80GB", "A100-80GB"), ("V100", "V100-32GB"), ("H100", "H100"),
    ("B200", "B200"), ("B300", "B300"), ("GB200", "GB200"), ("GB300", "GB300"),
    ("H100-80GB-HBM3", "H100"), ("NVIDIA H100 SXM", "H100"), ("nvidia h100 80gb hbm3", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("Tesla V100-SXM3-32GB", "V100-32GB"),
    ("NVIDIA B300 SXM6 AC", "B300"), ("h800", "H800"), ("NVIDIA H200", "H200"),
    ("A100 40GB", "A100-40GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("V100 16GB", "V100-16GB"), ("A800", "A800-80GB"), ("NVIDIA A800-SXM4-80GB", "A800-80GB"), ("GH200", "GH200"),
    ("NVIDIA GH200 SXM", "GH200"), ("GH200 96GB", "GH200-96GB")])
def test_alias_resolves_to(alias, name):
    assert load_profile(alias).name == name


@pytest.mark.parametrize("spelling, name", [
    ("NVIDIA H100 SXM5 80GB", "H100"), ("H100 80GB HBM3", "H100"), ("HGX H100", "H100"),
    ("A100 80GB SXM4", "A100-80GB"), ("NVIDIA A100 40GB", "A100-40GB"), ("Tesla V100 SXM2 16GB", "V100-16GB"),
    ("B200 192GB", "B200"), ("H200 141GB HBM3e", "H200"), ("A100-80G", "A100-80GB"), ("A100 40G", "A100-40GB")])
def test_spelling_with_the_same_identifying_words_resolves(spelling, name):
    """Vendor, module and memory-technology words do not matter; a stated memory size must be the profile's."""
    assert load_profile(spelling).name == name


@pytest.mark.parametrize("spelling", ["L40S", "V100 PCIe", "Tesla V100-PCIE-32GB", "A100 PCIe", "B200 80GB",
                                      "H20 141GB", "MI300X"])
def test_other_products_do_not_resolve(spelling):
    """Parts without a profile (L40S, V100 PCIe), a PCIe A100 of unstated memory, another memory size (the
    141 GB HBM3e H20 is not the 96 GB profile)."""
    with pytest.raises(InputError, match="unknown GPU type"):
        load_profile(spelling)


@pytest.mark.parametrize("description, name", [
    ("H100 (AWS p5)", "H100"), ("DGX H100 (8x H100 SXM)", "H100"), ("8x H100", "H100"), ("8 x A100 80GB", "A100-80GB"),
    ("1024 \u00d7 A100 40GB", "A100-40GB"), ("p5.48xlarge (8x H100 80GB)", "H100"), ("AWS p5 (H100)", "H100"),
    ("AWS p5.48xlarge", "H100"), ("p4d.24xlarge", "A100-40GB"), ("p4de.24xlarge", "A100-80GB"),
    ("a3-megagpu-8g", "H100"), ("Standard_ND96isr_H200_v5", "H200"), ("a4x-highgpu-4g", "GB200"),
    ("GH200 480GB", "GH200-96GB"), ("GH200 624GB", "GH200"), ("A100 80GB (x8)", "A100-80GB"),
    ("Hopper H100", "H100"), ("NVIDIA Blackwell B200", "B200"), ("Blackwell Ultra GB300", "GB300"),
    ("Ampere A100 40GB", "A100-40GB"), ("Grace Blackwell GB200", "GB200"), ("GH200 Grace Hopper Superchip", "GH200"),
    ("DGX SuperPOD H100", "H100")])
def test_system_descriptions_resolve_to_their_gpu(description, name):
    """A GPU named inside a system description: bracketed remarks, GPU counts and cloud instance types."""
    assert load_profile(description).name == name


@pytest.mark.parametrize("description", ["L40S (48GB)", "8x L40S", "8x V100 PCIe", "A100 (PCIe)",
                                         "H100 SXM (PCIe Gen5)", "MI300X (8 per node)", "B200 (80GB)"])
def test_system_descriptions_of_other_products_do_not_resolve(description):
    with pytest.raises(InputError, match="unknown GPU type"):
        load_profile(description)


def test_aliases_do_not_collide():
    owner: dict[str, str] = {}
    for path in profile_paths():
        prof = load_profile(str(path))
        for spelling in (prof.name, *prof.aliases):
            key = _norm(spelling)
            assert owner.setdefault(key, prof.name) == prof.name, \
                f"{spelling!r} names both {owner[key]} and {prof.name}"


def test_gemm_csv_nvidia_names_resolve():
    for gpu_type in ("NVIDIA A100 SXM", "NVIDIA H100 SXM", "NVIDIA H200 SXM", "NVIDIA B200 SXM",
                     "NVIDIA B300 SXM", "NVIDIA GB200 SXM", "NVIDIA GH200 SXM"):
        load_profile(gpu_type)
    for other in ("NVIDIA A100 PCIe", "NVIDIA V100 PCIe", "AMD MI300X"):
        with pytest.raises(InputError, match="unknown GPU type"):
            load_profile(other)


def test_script_gpu_type_map_agrees_with_aliases():
    """nccl.csv spellings the curve script maps to a profile resolve to that same profile."""
    mapping = _curve_script().GPU_TYPE_TO_PROFILE
    assert {r["gpu_type"] for r in _rows("nccl.csv")} <= set(mapping)
    for gpu_type, name in mapping.items():
        if name is not None:
            assert load_profile(gpu_type).name == name, gpu_type


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(InputError) as err:
        load_profile("TPU v5p")
    assert "H100" in str(err.value) and "A100-80GB" in str(err.value)


# --- values against their sources ------------------------------------------------------------

def test_h100_headline_numbers():
    h100 = load_profile("H100")
    assert h100.peak_flops["bf16"].value == 989e12
    assert h100.peak_flops["fp8"].value == 1979e12
    assert h100.peak("fp4") == 1979e12  # no fp4 on Hopper: falls back to fp8
    assert h100.memory_bytes.value == 80 * GIB
    assert h100.hbm_bandwidth_bytes_per_s.value == 3.35e12
    assert h100.nvlink_bandwidth_bytes_per_s.value == 450e9
    assert h100.nic_bandwidth_bytes_per_s.value == 50e9
    assert h100.nvls and h100.nvlink_domain_gpus == 8


def test_a100_headline_numbers():
    a100 = load_profile("A100")
    assert a100.memory_bytes.value == 80 * GIB == 85899345920
    assert a100.peak_flops["bf16"].value == 312e12
    assert "fp8" not in a100.peak_flops and "fp8" not in a100.gemm_max_efficiency
    assert a100.peak("fp8") == 312e12
    assert a100.nvlink_bandwidth_bytes_per_s.value == 300e9
    assert a100.nic_bandwidth_bytes_per_s.value == 25e9
    assert not a100.nvls


@pytest.mark.parametrize("name, memory_gib, bf16, fp8, fp4, nvlink, nic, domain, nvls", [
    ("H200", 141, 989e12, 1979e12, None, 450e9, 50e9, 8, True),
    ("H800", 80, 989e12, 1979e12, None, 200e9, 50e9, 8, False),
    ("B200", 180, 2.25e15, 4.5e15, 9e15, 900e9, 50e9, 8, True),
    ("GB200", 186, 2.5e15, 5e15, 10e15, 900e9, 50e9, 72, True),
    ("B300", 270, 2.25e15, 4.5e15, 13.5e15, 900e9, 100e9, 8, True),
    ("GB300", 279, 2.5e15, 5e15, 15e15, 900e9, 100e9, 72, True),
    ("V100-32GB", 32, 125e12, None, None, 150e9, 6.25e9, 16, False),
    ("A100-40GB", 40, 312e12, None, None, 300e9, 25e9, 8, False),
    ("V100-16GB", 16, 125e12, None, None, 150e9, 6.25e9, 8, False),
    ("A800-80GB", 80, 312e12, None, None, 200e9, 25e9, 8, False),
    ("GH200", 141, 989e12, 1979e12, None, 450e9, 25e9, 4, False),
    ("GH200-96GB", 96, 989e12, 1979e12, None, 450e9, 25e9, 4, False),
    ("H20", 96, 148e12, 296e12, None, 450e9, 50e9, 8, True)])
def test_headline_numbers(name, memory_gib, bf16, fp8, fp4, nvlink, nic, domain, nvls):
    p = load_profile(name)
    assert p.memory_bytes.value == memory_gib * GIB
    assert p.peak_flops["bf16"].value == bf16
    assert (p.peak_flops["fp8"].value if "fp8" in p.peak_flops else None) == fp8
    assert (p.peak_flops["fp4"].value if "fp4" in p.peak_flops else None) == fp4
    assert p.nvlink_bandwidth_bytes_per_s.value == nvlink
    assert p.nic_bandwidth_bytes_per_s.value == nic
    assert (p.nvlink_domain_gpus, p.nvls) == (domain, nvls)


# --- PCIe and NVL boards ------------------------------------------------------------------------

@pytest.mark.parametrize("spelling, name", [
    ("H100 PCIe", "H100-PCIe"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("H100-PCIE-80GB", "H100-PCIe"),
    ("H100 80GB PCIe", "H100-PCIe"), ("H100 PCIe 80GB HBM2e", "H100-PCIe"), ("H100 (PCIe)", "H100-PCIe"),
    ("8x H100 PCIe", "H100-PCIe"), ("H100 NVL", "H100-NVL"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("H100 NVL (94GB)", "H100-NVL"), ("8x H100 NVL", "H100-NVL"), ("H100 NVL 94GB PCIe", "H100-NVL"),
    ("H100 PCIe 94GB", "H100-NVL"), ("Standard_NC40ads_H100_v5", "H100-NVL"),
    ("A100 PCIe 80GB", "A100-PCIe-80GB"), ("A100-PCIE-80GB", "A100-PCIe-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"), ("4x A100 PCIe 80GB", "A100-PCIe-80GB"),
    ("Standard_NC96ads_A100_v4", "A100-PCIe-80GB"), ("A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("A100 PCIe 40GB", "A100-PCIe-40GB"), ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("H200 NVL", "H200-NVL"), ("NVIDIA H200 NVL", "H200-NVL"), ("H200 NVL 141GB", "H200-NVL"),
    ("H200 NVL (141GB)", "H200-NVL"), ("8x H200 NVL", "H200-NVL"), ("H200 PCIe", "H200-NVL"),
    ("GH200 NVL2", "GH200"),
    # The SXM spellings keep their profiles.
    ("H100", "H100"), ("H100 SXM", "H100"), ("NVIDIA H100 80GB HBM3", "H100"), ("8x H100", "H100"),
    ("DGX H100 (8x H100 SXM)", "H100"), ("A100", "A100-80GB"), ("A100 80GB", "A100-80GB"),
    ("A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("Tesla V100", "V100-32GB"),
    ("H200", "H200"), ("H200 SXM", "H200"), ("NVIDIA H200", "H200"), ("H200 141GB", "H200"),
    ("8x H200", "H200"), ("DGX H200", "H200")])
def test_pcie_and_nvl_spellings_resolve_to_their_own_profiles(spelling, name):
    assert load_profile(spelling).name == name


def _gemm_row(gpu_type: str, dtype: str = "bf16") -> float:
    row = next(r for r in _rows("gemm.csv") if r["gpu_type"] == gpu_type and r["dtype"] == dtype)
    return float(row["tflops"]) / float(row["peak_tflops_spec"])


# Datasheet figures (TFLOP/s; tf32, bf16 and fp8 "with sparsity"), memory in GB, HBM and host PCIe in bytes/s
# (PCIe bidirectional: Gen5 x16 128 GB/s, Gen4 x16 64 GB/s), the assumed NIC rate per GPU, the NVLink bridge
# (bidirectional per GPU: 600 GB/s, H200 NVL 900 GB/s) and the bridged group.
@pytest.mark.parametrize(
    "name, generation, fp32, tf32_sparse, bf16_sparse, fp8_sparse, memory_gb, hbm, pcie, nic, bridge, domain", [
        ("H100-PCIe", "hopper", 51, 756, 1513, 3026, 80, 2.0e12, 128e9, 25e9, 600e9, 2),
        ("H100-NVL", "hopper", 60, 835, 1671, 3341, 94, 3.9e12, 128e9, 25e9, 600e9, 2),
        ("H200-NVL", "hopper", 60, 835, 1671, 3341, 141, 4.8e12, 128e9, 25e9, 900e9, 4),
        ("A100-PCIe-80GB", "ampere", 19.5, 312, 624, None, 80, 1.935e12, 64e9, 12.5e9, 600e9, 2),
        ("A100-PCIe-40GB", "ampere", 19.5, 312, 624, None, 40, 1.555e12, 64e9, 12.5e9, 600e9, 2)])
def test_pcie_headline_numbers(name, generation, fp32, tf32_sparse, bf16_sparse, fp8_sparse, memory_gb, hbm, pcie,
                               nic, bridge, domain):
    p = load_profile(name)
    assert p.generation == generation   # pools its calibration with the SXM parts of its generation
    assert p.memory_bytes.value == memory_gb * GIB
    assert p.hbm_bandwidth_bytes_per_s.value == hbm
    assert p.peak_flops["fp32"].value == fp32 * 1e12
    # Dense peaks are half the sparse datasheet figures (H100 PCIe bf16: 1,513 / 2 written 756, as H100 SXM's 989).
    for dtype, sparse in (("tf32", tf32_sparse), ("bf16", bf16_sparse), ("fp16", bf16_sparse), ("fp8", fp8_sparse)):
        if sparse is None:
            assert dtype not in p.peak_flops
        else:
            assert p.peak_flops[dtype].value == pytest.approx(sparse * 1e12 / 2, rel=1e-3), dtype
    if generation == "hopper":   # PCIe / NVL cards run lower clocks (H100 PCIe: fewer SMs too) than SXM5
        assert p.peak("bf16") < load_profile("H100").peak("bf16")
    else:                        # A100 PCIe: the SXM4 part's tensor-core rates
        assert p.peak_flops == load_profile("A100-80GB").peak_flops
    # NVLink bridge for a pair of cards (H200 NVL: the 4-way bridge, an assumption); no NVSwitch; PCIe to the host.
    assert p.nvlink_bandwidth_bytes_per_s.value == bridge / 2
    assert (p.nvlink_domain_gpus, p.nvls) == (domain, False)
    assert p.host_link_bandwidth_bytes_per_s.value == pcie / 2
    assert p.nic_bandwidth_bytes_per_s.value == nic
    assert "Assumption" in p.sources[p.nic_bandwidth_bytes_per_s.source]


def test_pcie_gemm_efficiencies():
    """A100 PCIe: the MAMF row measured on it. H100 PCIe / NVL (no row): the H100 SXM MAMF fraction scaled by the
    A100 PCIe / SXM ratio, named as an assumption."""
    a100_pcie = _gemm_row("NVIDIA A100 PCIe")
    for name in ("A100-PCIe-80GB", "A100-PCIe-40GB"):
        p = load_profile(name)
        assert p.max_efficiency("bf16") == p.max_efficiency("fp16") == pytest.approx(a100_pcie, abs=1e-4)
        assert p.gemm_max_efficiency["bf16"].source == "STAS_MAMF"
        assert "NVIDIA A100 PCIe" in p.sources["STAS_MAMF"]
    ratio = a100_pcie / _gemm_row("NVIDIA A100 SXM")
    assert 0.9 < ratio < 1.0
    # H200 NVL scales the H200 SXM profile's figures: bf16 the H100 SXM row ("H200 is the same"), fp8 the H200 row.
    for name, fp8_row in (("H100-PCIe", "NVIDIA H100 SXM"), ("H100-NVL", "NVIDIA H100 SXM"),
                          ("H200-NVL", "NVIDIA H200 SXM")):
        p = load_profile(name)
        assert p.max_efficiency("bf16") == pytest.approx(_gemm_row("NVIDIA H100 SXM") * ratio, abs=1e-4)
        assert p.max_efficiency("fp8") == pytest.approx(_gemm_row(fp8_row, "fp8_e4m3fn") * ratio, abs=1e-4)
        assert p.max_efficiency("fp16") == p.max_efficiency("bf16")
        for eff in p.gemm_max_efficiency.values():
            assert eff.source.startswith("ASSUMPTION") and "power" in p.sources[eff.source]
    measured = set()
    for r in _rows("gemm.csv"):
        try:
            measured.add(load_profile(r["gpu_type"]).name)
        except InputError:
            pass
    assert not measured & {"H200-NVL", "H20"}   # no measured row: hence the assumptions
    assert "600 W" in load_profile("H200-NVL").sources["ASSUMPTION_H200_NVL_GEMM"]


def test_tp8_on_a_server_of_pcie_cards_is_costed_off_nvlink():
    """A tp 8 group on one 8-GPU server of PCIe cards spans four NVLink-bridged pairs, so its collectives leave
    the NVLink domain and are costed at the NIC / PCIe rate: far more exposed TP communication than on the SXM
    node's NVSwitch. A tp 2 group stays on the bridge."""
    from costmodel.catalog import catalog
    from costmodel.comm import group_span
    from costmodel.estimate import estimate
    from costmodel.plan import ParallelPlan
    from costmodel.specs import ClusterSpec, InterNodeFabric

    model = catalog()["70b"]
    plan = ParallelPlan(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, recompute="full")

    def run(name):
        prof = load_profile(name)
        nic = InterNodeFabric(nic_bandwidth_bytes_per_s=prof.nic_bandwidth_bytes_per_s.value)
        cluster = ClusterSpec(name=f"{name}x8", gpu=name, nodes=1, gpus_per_node=8,
                              nvlink_domain_gpus=prof.nvlink_domain_gpus, inter_node=nic)
        return estimate(model, cluster, plan, profile=prof)

    for sxm_name, pcie_names in (("H100", ("H100-PCIe", "H100-NVL")), ("A100-80GB", ("A100-PCIe-80GB",))):
        sxm = run(sxm_name)
        assert sxm.breakdown_s["tp_comm_exposed"] > 0
        for name in pcie_names:
            pcie = run(name)
            assert pcie.breakdown_s["tp_comm_exposed"] > 5 * sxm.breakdown_s["tp_comm_exposed"], name
            assert pcie.step_time_s > 1.2 * sxm.step_time_s, name
    domain = load_profile("H100-PCIe").nvlink_domain_gpus
    assert group_span(1, 8, domain) == (2, 4)   # tp 8: 2 GPUs in each of 4 domains
    assert group_span(1, 2, domain) == (2, 1)   # tp 2: one bridged pair


def test_h200_nvl_tp4_stays_on_the_4way_bridge_and_tp8_leaves_it():
    """H200 NVL: the NVLink domain is the 4-way bridged group (an assumption), so a tp 4 group costs its
    collectives on NVLink at the SXM part's rate, while tp 8 on one 8-GPU server spans two groups and crosses
    at the NIC / PCIe rate; a cluster file or row of 8 such GPUs per node gets the 4-GPU domain."""
    from costmodel.catalog import catalog
    from costmodel.comm import group_span
    from costmodel.estimate import estimate
    from costmodel.plan import ParallelPlan
    from costmodel.specs import ClusterSpec, InterNodeFabric
    from costmodel.validate import row_cluster

    model = catalog()["70b"]

    def run(name, tp):
        prof = load_profile(name)
        nic = InterNodeFabric(nic_bandwidth_bytes_per_s=prof.nic_bandwidth_bytes_per_s.value)
        cluster = ClusterSpec(name=f"{name}x8", gpu=name, nodes=1, gpus_per_node=8,
                              nvlink_domain_gpus=prof.nvlink_domain_gpus, inter_node=nic)
        plan = ParallelPlan(tp=tp, pp=1, dp=8 // tp, micro_batch=1, global_batch=8, recompute="full")
        return estimate(model, cluster, plan, profile=prof)

    nvl = load_profile("H200-NVL")
    assert nvl.nvlink_domain_gpus == 4
    assert "NVL4" in nvl.sources["ASSUMPTION_PCIE_2_8_5"]
    assert group_span(1, 4, 4) == (4, 1) and group_span(1, 8, 4) == (4, 2)
    tp4, tp4_sxm = run("H200-NVL", 4), run("H200", 4)
    assert tp4.breakdown_s["tp_comm_exposed"] == pytest.approx(tp4_sxm.breakdown_s["tp_comm_exposed"], rel=0.1)
    tp8, tp8_sxm = run("H200-NVL", 8), run("H200", 8)
    assert tp8.breakdown_s["tp_comm_exposed"] > 2 * tp8_sxm.breakdown_s["tp_comm_exposed"]
    assert tp8.step_time_s > 1.2 * tp8_sxm.step_time_s
    # ... but less exposed than the H100 NVL's pairs at 300 GB/s.
    assert tp8.breakdown_s["tp_comm_exposed"] < run("H100-NVL", 8).breakdown_s["tp_comm_exposed"]
    assert row_cluster({"gpu_type": "H200 NVL", "num_gpus": "16", "gpus_per_node": "8"}, nvl).domain_gpus == 4


def test_h20_headline_numbers_and_sources():
    """H20: the export-market Hopper, from reports of NVIDIA's partner table (no public datasheet): 96 GB HBM3 at
    4.0 TB/s, 148 / 296 dense bf16 / fp8 TFLOP/s, TF32 74, FP32 44, NVLink 900 GB/s on an 8-GPU NVSwitch
    board, PCIe Gen5; the GEMM efficiency is H100 SXM's MAMF fraction and the NIC / host memory DGX H100's,
    both named assumptions."""
    h20, h100 = load_profile("H20"), load_profile("H100")
    assert h20.generation == "hopper"
    assert h20.memory_bytes.value == 96 * GIB
    assert h20.hbm_bandwidth_bytes_per_s.value == 4.0e12
    assert {d: v.value for d, v in h20.peak_flops.items()} == {
        "fp32": 44e12, "tf32": 74e12, "bf16": 148e12, "fp16": 148e12, "fp8": 296e12}
    assert h20.peak("fp4") == 296e12   # no fp4 on Hopper: falls back to fp8
    assert h100.peak("bf16") / h20.peak("bf16") == pytest.approx(6.68, abs=0.01)   # the reported "6.68x"
    assert h20.nvlink_bandwidth_bytes_per_s.value == 450e9 and h20.nvlink_domain_gpus == 8
    assert h20.host_link_bandwidth_bytes_per_s.value == 64e9
    assert h20.nic_bandwidth_bytes_per_s.value == 50e9 and h20.host_memory_bytes.value == 256 * GIB
    assert "Secondary" in h20.sources[h20.peak_flops["bf16"].source]
    for eff, want in ((h20.gemm_max_efficiency["bf16"], _gemm_row("NVIDIA H100 SXM")),
                      (h20.gemm_max_efficiency["fp8"], _gemm_row("NVIDIA H100 SXM", "fp8_e4m3fn"))):
        assert eff.value == pytest.approx(want, abs=1e-4)
        assert eff.source.startswith("ASSUMPTION") and "Assumption" in h20.sources[eff.source]
    for field in (h20.nic_bandwidth_bytes_per_s, h20.host_memory_bytes):
        assert "Assumption" in h20.sources[field.source]


@pytest.mark.parametrize("spelling, name", [
    ("H20", "H20"), ("NVIDIA H20", "H20"), ("nvidia h20", "H20"), ("H20 96GB", "H20"), ("HGX H20", "H20"),
    ("8x H20", "H20"), ("H20 (96GB)", "H20"),
    ("H200", "H200"), ("H200 SXM", "H200"), ("NVIDIA H200", "H200"), ("H200 141GB", "H200"),
    ("GH200", "GH200"), ("NVIDIA GH200", "GH200"), ("GH200 96GB", "GH200-96GB"),
    ("H200 NVL", "H200-NVL"), ("NVIDIA H200 NVL", "H200-NVL")])
def test_h20_and_h200_spellings_do_not_collide(spelling, name):
    """Identifying words are whole words: "H20" is not "H200", "GH200" neither."""
    assert load_profile(spelling).name == name


def test_a_compute_bound_plan_on_h20_takes_as_many_times_longer_as_its_peak_is_lower():
    """8B on one 8-GPU node, tp 1 pp 1 dp 8: compute dominates the step, so H20 (148 dense bf16 TFLOP/s) takes
    several times as long as H100 (989), a little under the 6.7x of the peaks since H20's HBM is faster."""
    from costmodel.catalog import catalog
    from costmodel.estimate import estimate
    from costmodel.plan import ParallelPlan
    from costmodel.specs import ClusterSpec, InterNodeFabric

    model = catalog()["8b"]
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, recompute="full")

    def run(name):
        prof = load_profile(name)
        nic = InterNodeFabric(nic_bandwidth_bytes_per_s=prof.nic_bandwidth_bytes_per_s.value)
        cluster = ClusterSpec(name=f"{name}x8", gpu=name, nodes=1, gpus_per_node=8, inter_node=nic)
        return estimate(model, cluster, plan, profile=prof)

    h100, h20 = run("H100"), run("H20")
    assert h20.breakdown_s["compute"] > 0.7 * h20.step_time_s   # compute-bound
    ratio = h20.step_time_s / h100.step_time_s
    assert 4 < ratio <= 1.02 * 989 / 148, ratio
    assert h20.breakdown_s["compute"] / h100.breakdown_s["compute"] == pytest.approx(989 / 148, rel=0.1)


def test_v100_bf16_stands_in_for_fp16():
    v100 = load_profile("V100")
    assert v100.peak_flops["bf16"].value == v100.peak_flops["fp16"].value == 125e12
    # The V100 PCIe cuBLAS measurement of gemm.csv, as a fraction of that card's own peak, for both parts.
    row = next(r for r in _rows("gemm.csv") if r["source_id"] == "NVIDIA_FORUM_79781")
    want = float(row["tflops"]) / float(row["peak_tflops_spec"])
    for name in ("V100-32GB", "V100-16GB"):
        prof = load_profile(name)
        assert prof.max_efficiency("bf16") == prof.max_efficiency("fp16") == pytest.approx(want, abs=1e-4)
        assert prof.gemm_max_efficiency["fp16"].source == "NVIDIA_FORUM_79781"


def test_v100_runs_attention_unfused_and_no_transformer_engine():
    """No fused attention kernel runs on Volta: a megatron-core plan on V100 has its attention costed unfused, as
    Megatron-LM 2020 ran it (the score matrices in HBM: slower, more activation memory) than it would run were
    there a kernel (the same profile without the flag); Ampere and newer keep the flash path."""
    from costmodel.estimate import estimate
    from costmodel.catalog import catalog
    from costmodel.plan import ParallelPlan

    assert {n for n in ("V100-32GB", "V100-16GB", "A100-80GB", "H100") if load_profile(n).unfused_attention_source} \
        == {"V100-32GB", "V100-16GB"}
    v100 = load_profile("V100-32GB")
    assert "SM80" in v100.sources[v100.unfused_attention_source]
    fused = v100.model_copy(update={"unfused_attention_source": None})
    model = catalog()["8b"].model_copy(update={"seq_len": 2048, "precision": "fp16"})
    cluster = load_cluster("v100-dgx2x64")
    plan = ParallelPlan(tp=8, pp=1, dp=8, micro_batch=1, global_batch=64, recompute="none")
    core, flash = estimate(model, cluster, plan, profile=v100), estimate(model, cluster, plan, profile=fused)
    assert core.step_time_s > 1.03 * flash.step_time_s
    assert core.peak_memory_bytes > flash.peak_memory_bytes
    # Transformer Engine does not run there either: the planner writes --transformer-impl local, so the TP
    # collectives are priced without userbuffers overlap, as for a stack without Megatron's overlaps.
    assert not v100.runs_transformer_engine() and load_profile("A100-80GB").runs_transformer_engine()
    other = estimate(model, cluster, plan.model_copy(update={"framework": "other"}), profile=v100)
    assert core.breakdown_s["tp_comm_exposed"] == pytest.approx(other.breakdown_s["tp_comm_exposed"], rel=1e-12)
    assert core.breakdown_s["tp_comm_exposed"] > 0


@pytest.mark.parametrize("row", [r for r in _rows("gemm.csv") if r["gpu_type"].startswith("NVIDIA")
                                 and "PCIe" not in r["gpu_type"]],
                         ids=lambda r: f"{r['gpu_type']}-{r['dtype']}")
def test_gemm_efficiency_matches_gemm_csv(row):
    """gemm.csv (STAS_MAMF): peak_tflops_spec equals the profile's peak, and the profile's
    efficiency is tflops / peak (Maximum Achievable Matmul FLOPS), to 4 decimals."""
    prof = load_profile(row["gpu_type"])
    dtype = {"bf16": "bf16", "fp8_e4m3fn": "fp8"}[row["dtype"]]
    peak = float(row["peak_tflops_spec"]) * 1e12
    assert prof.peak_flops[dtype].value == peak
    assert prof.gemm_max_efficiency[dtype].value == pytest.approx(float(row["tflops"]) * 1e12 / peak, abs=1e-4)
    assert prof.gemm_max_efficiency[dtype].source == "STAS_MAMF"


def test_fp16_efficiency_equals_bf16_where_both_exist():
    # costmodel.profiles.max_efficiency falls back dtype -> fp8 -> bf16, so fp16 is given explicitly.
    for path in profile_paths():
        prof = load_profile(str(path))
        if "fp16" in prof.peak_flops:
            assert prof.max_efficiency("fp16") == prof.max_efficiency("bf16"), prof.name


# --- curves ----------------------------------------------------------------------------------

def test_h100_intra_all_reduce_curve():
    curve = load_profile("H100").curve("all_reduce", "intra")
    assert curve.group_size == 8 and curve.source == "DGXC_NCCL_README"
    busbw = np.array([p[1] for p in curve.points])
    assert busbw.max() == pytest.approx(480e9, rel=0.01)  # nccl-tests issue #290: 476-480 GB/s with NVLS
    assert busbw[-1] >= 0.99 * busbw.max()
    # Monotone except for measurement noise of a few percent.
    assert np.all(busbw[1:] >= 0.9 * np.maximum.accumulate(busbw)[:-1])
    assert curve.points[0][0] == 64  # 8-32 B print 0.00 GB/s and are dropped


@pytest.mark.parametrize("path", profile_paths(), ids=lambda p: p.stem)
def test_curves_are_sane(path):
    prof = load_profile(str(path))
    for c in prof.curves:
        sizes = np.array([p[0] for p in c.points])
        busbw = np.array([p[1] for p in c.points])
        assert np.all(np.diff(sizes) > 0) and np.all(busbw > 0)
        assert busbw[-1] >= 0.9 * busbw.max(), (c.collective, c.scope)  # saturates, no collapse
        assert np.all(busbw[1:] >= 0.75 * np.maximum.accumulate(busbw)[:-1]), (c.collective, c.scope)
        if c.scope == "intra":  # NVLS can exceed the link rate a little, never by much
            limit = (1.25 if prof.nvls else 1.0) * prof.nvlink_bandwidth_bytes_per_s.value
            assert busbw.max() <= limit, (c.collective, busbw.max(), limit)
        assert c.group_size >= 2


def test_curve_groups_match_nccl_csv():
    h100 = load_profile("H100")
    inter = h100.curve("all_reduce", "inter")
    assert (inter.group_size, inter.source) == (16, "A3MEGA_NCCL")
    assert inter.points[-1] == (8589934592, pytest.approx(338.82e9))
    b200 = load_profile("B200")
    assert b200.curve("all_reduce", "inter").group_size == 32
    assert b200.curve("all_reduce", "intra").points[-1] == (17179869184, pytest.approx(845.67e9))
    assert load_profile("A100").curve("all_reduce", "intra").points[-1][1] == pytest.approx(234.89e9)
    assert load_profile("H200").curve("all_reduce", "intra").points[-1][1] == pytest.approx(482.26e9)
    for name in ("H800", "B300", "GB200", "GB300", "V100-32GB", "A100-40GB", "V100-16GB"):
        assert load_profile(name).curves == ()


def test_busbw_at_measured_points_and_between():
    curve = load_profile("H100").curve("all_reduce", "intra")
    sizes = np.array([p[0] for p in curve.points], dtype=float)
    busbw = np.array([p[1] for p in curve.points])
    np.testing.assert_allclose(busbw_at(curve, sizes), busbw, rtol=1e-12)
    assert busbw_at(curve, np.array([2**30]))[0] == pytest.approx(466.33e9)
    # Between two points: between their values (log-size interpolation).
    mid = busbw_at(curve, np.array([1.5 * 2**30]))[0]
    assert 466.33e9 < mid < 473.37e9
    # Clamped at both ends.
    assert busbw_at(curve, np.array([1.0]))[0] == busbw[0]
    assert busbw_at(curve, np.array([2.0**40]))[0] == busbw[-1]


def test_curves_are_in_sync_with_nccl_csv():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_profile_curves.py"),
                             "--check", "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_curve_script_keeps_head_byte_for_byte(tmp_path):
    mod = _curve_script()
    original = (PROFILE_DIR / "gpus" / "H100.yaml").read_text()
    head = original[: original.index(mod.MARKER)]
    target = tmp_path / "H100.yaml"
    target.write_text(head + mod.MARKER + "\ncurves: []\n")
    by_profile, _ = mod.read_groups()
    new = mod.rewrite(target, by_profile["H100"])
    assert new == original
    assert new.startswith(head)


def test_curve_script_rejects_unmapped_gpu_type(tmp_path):
    mod = _curve_script()
    bad = tmp_path / "nccl.csv"
    header = (VALIDATION / "nccl.csv").read_text().splitlines()[0]
    bad.write_text(header + "\nX,Mystery GPU,intra,1,all_reduce,1024,1.0,0.5,8,nccl-tests,\n")
    with pytest.raises(SystemExit, match="Mystery GPU"):
        mod.read_groups(bad)


# --- bad input -------------------------------------------------------------------------------

def _profile_text(**replace: str) -> str:
    text = (PROFILE_DIR / "gpus" / "H100.yaml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(_profile_text(**{"nvlink_domain_gpus: 8": "nvlink_domain_gpus: [8"}))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    msg = str(err.value)
    assert str(path) in msg and "malformed YAML" in msg and "line" in msg


def test_unknown_field_names_file_and_field(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(_profile_text(**{"nvlink_domain_gpus: 8": "nvlink_domain_gpu: 8"}))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    msg = str(err.value)
    assert str(path) in msg and "nvlink_domain_gpu" in msg


def test_bad_value_names_nested_field(tmp_path):
    path = tmp_path / "badvalue.yaml"
    path.write_text(_profile_text(**{"{value: 3.35e+12, source: H100_DATASHEET}":
                                     "{value: fast, source: H100_DATASHEET}"}))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    assert str(path) in str(err.value) and "hbm_bandwidth_bytes_per_s.value" in str(err.value)


def test_unresolved_source_id_is_rejected(tmp_path):
    path = tmp_path / "nosource.yaml"
    path.write_text(_profile_text(**{"{value: 3.35e+12, source: H100_DATASHEET}":
                                     "{value: 3.35e+12, source: NOWHERE}"}))
    with pytest.raises(InputError, match="NOWHERE"):
        load_profile(str(path))


def test_cluster_unknown_field_and_gpu(tmp_path):
    text = (PROFILE_DIR / "clusters" / "h100x512.yaml").read_text()
    typo = tmp_path / "typo.yaml"
    typo.write_text(text.replace("gpus_per_node: 8", "gpu_per_node: 8"))
    with pytest.raises(InputError) as err:
        load_cluster(typo)
    assert str(typo) in str(err.value) and "gpu_per_node" in str(err.value)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(text.replace("gpu: H100 ", "gpu: H900 "))
    with pytest.raises(InputError) as err:
        load_cluster(unknown)
    assert str(unknown) in str(err.value) and "field 'gpu'" in str(err.value) and "H900" in str(err.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text(text + "\n  : : [\n")
    with pytest.raises(InputError, match="malformed YAML"):
        load_cluster(broken)


def test_an_input_error_quoting_a_line_break_stays_one_line():
    # Messages quote keys and values from the user's file; a line break in them is escaped, not printed.
    err = InputError("f.yaml: field 'x\ny': expected a number, got 'a\r\nb'")
    assert str(err) == "f.yaml: field 'x\\ny': expected a number, got 'a\\r\\nb'" and "\n" not in str(err)


# The H100 calibration's fitted GEMM factor as scripts/fit_profiles.py last wrote it (its value changes with a refit).
_FITTED_GEMM_LINE = re.search(r"^  gemm_efficiency: .*$", (PROFILE_DIR / "gpus" / "H100.yaml").read_text(),
                              re.M).group(0)


@pytest.mark.parametrize("old, new, field", [
    ("{value: 3.35e+12, source: H100_DATASHEET}", "{value: 0, source: H100_DATASHEET}",
     "hbm_bandwidth_bytes_per_s.value"),
    (_FITTED_GEMM_LINE, "  gemm_efficiency: .inf", "calibration.gemm_efficiency"),
    ("calibration:\n", "calibration:\n  per_model: {'L32 h4096': {fitted_by: 1.0}}\n",
     "per_model.L32 h4096: 'fitted_by' is not a calibration factor"),
    ("calibration:\n", "calibration:\n  per_model: {'L32 h4096': {gemm_efficiency: -1}}\n",
     "per_model.L32 h4096.gemm_efficiency = -1.0: expected a finite number from 0.001 to 1000"),
    ("calibration:\n", "calibration:\n  uncalibrated: {comm_exposed: -0.5}\n",
     "uncalibrated.comm_exposed = -0.5: expected a finite number from 0 to 1000"),
    # Found by FUZZ_RANDOM=1 (2026-12-07): a factor of 5e-324 priced every GEMM at forever and the step at NaN.
    (_FITTED_GEMM_LINE, "  gemm_efficiency: 5.0e-324", "calibration.gemm_efficiency': Input should be greater "
                                                       "than or equal to 0.001"),
    # Found by FUZZ_RANDOM=1 (2026-12-07, second day): a denormal HBM bandwidth overflowed every memory-bound
    # time to infinity and the step to NaN.
    ("{value: 3.35e+12, source: H100_DATASHEET}", "{value: 2.2e-309, source: H100_DATASHEET}",
     "hbm_bandwidth_bytes_per_s.value': Input should be greater than or equal to 0.001"),
])
def test_a_number_a_profile_cannot_use_is_a_one_line_error(tmp_path, old, new, field):
    # Found by fuzzing --profile FILE: HBM bandwidth 0 priced a step at NaN; per_model / uncalibrated entries
    # were applied without validation.
    path = tmp_path / "cal.yaml"
    path.write_text(_profile_text(**{old: new}))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    msg = str(err.value)
    assert str(path) in msg and field in msg and "\n" not in msg, msg


def test_a_server_of_pcie_pairs_is_several_nvlink_domains_in_rows_and_cluster_files(tmp_path):
    """A published row of H100 PCIe with 8 GPUs per node, and a cluster file of such servers that leaves
    nvlink_domain_gpus out, both get the profile's bridged pair as the NVLink domain (not the whole node);
    an SXM row keeps its node-wide NVSwitch domain, and a cluster file's own figure stands."""
    from costmodel.validate import row_cluster

    row = {"gpu_type": "H100 PCIe", "num_gpus": "16", "gpus_per_node": "8"}
    assert row_cluster(row, load_profile("H100-PCIe")).domain_gpus == 2
    assert row_cluster({**row, "gpu_type": "H100"}, load_profile("H100")).domain_gpus == 8
    assert row_cluster({**row, "gpus_per_node": ""}, load_profile("H100-PCIe")).domain_gpus == 2
    base = {"gpu": "H100-PCIe", "nodes": 2, "gpus_per_node": 8,
            "inter_node": {"nic_bandwidth_bytes_per_s": 25.0e+9}}
    (tmp_path / "pcie.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({**base, "nvlink_domain_gpus": 4}))
    (tmp_path / "sxm.yaml").write_text(yaml.safe_dump({**base, "gpu": "H100"}))
    assert load_cluster(tmp_path / "pcie.yaml").domain_gpus == 2
    assert load_cluster(tmp_path / "own.yaml").domain_gpus == 4
    assert load_cluster(tmp_path / "sxm.yaml").domain_gpus == 8


@pytest.mark.parametrize("points", [((8.0, 1e9), (1024.0, 0.0)), ((8.0, 1e9), (1024.0, 2.2e-309)),
                                    ((0.0, 1e9), (1024.0, 2e9)), ((8.0, 1e9), (float("inf"), 2e9))])
def test_a_busbw_curve_point_no_collective_can_run_at_is_refused(points):
    """A busbw of 0 or a denormal one divides a message's bytes into infinity (the step time NaN); a message of
    0 bytes or of infinitely many is no measurement."""
    from pydantic import ValidationError

    from costmodel.profiles import BusBwCurve

    with pytest.raises(ValidationError, match="expected a finite message size above 0 bytes"):
        BusBwCurve(collective="all_reduce", scope="intra", group_size=8, points=points, source="X")
    assert BusBwCurve(collective="all_reduce", scope="intra", group_size=8, points=((8.0, 1e9), (1024.0, 2e9)),
                      source="X").points[1] == (1024.0, 2e9)


@pytest.mark.parametrize("name, gpu, nodes, per_node, domain, shipped", [
    ("h100x1024", "H100", 128, 8, 8, "h100x512"), ("1024xH100", "H100", 128, 8, 8, "h100x8192"),
    ("GB200 x 576", "GB200", 144, 4, 72, "gb200-nvl72x8"), ("a100x4", "A100-80GB", 1, 4, 4, "a100x1024"),
    ("H100 PCIe x 16", "H100-PCIe", 8, 2, 2, None)])
def test_a_gpu_and_count_names_a_cluster_of_its_servers(name, gpu, nodes, per_node, domain, shipped):
    """Where no cluster file has the name: the GPU's servers (an NVL rack's trays), its NIC rate, and the price the
    shipped clusters of that GPU state (none for a GPU without one)."""
    from costmodel.profiles import load_cluster

    cl = load_cluster(name)
    prof = load_profile(gpu)
    assert (cl.name, cl.gpu, cl.nodes, cl.gpus_per_node, cl.domain_gpus) == (name, gpu, nodes, per_node, domain)
    assert cl.inter_node.nic_bandwidth_bytes_per_s == prof.nic_bandwidth_bytes_per_s.value
    price = load_cluster(shipped).price_per_gpu_hour_usd if shipped else None
    assert cl.price_per_gpu_hour_usd == price and (price is None) == (shipped is None)


@pytest.mark.parametrize("name, message", [
    ("h100x12", "do not fill servers of 8"), ("h100x0", "at least 1 GPU"),
    ("gb200-nvl72x16", "a count of GPUs or of nvl72 systems"), ("mi300xx8", "'mi300x' is no GPU profile"),
    ("nothere", "cluster file not found; shipped clusters"), ("missing.yaml", "cluster file not found")])
def test_a_cluster_name_that_is_no_file_and_no_gpu_count_is_a_one_line_error(name, message):
    from costmodel.profiles import load_cluster

    with pytest.raises(InputError, match=message):
        load_cluster(name)


def _shipped_copy(gpu: str, tmp_path: Path):
    """scripts/fit_profiles.py as a module, the shipped profile of ``gpu`` and a copy of it under tmp_path."""
    from script_module import load_script

    src = next(p for p in profile_paths() if p.stem == gpu)
    copy = tmp_path / src.name
    copy.write_text(src.read_text())
    return load_script("fit_profiles"), src, copy


@pytest.mark.parametrize("gpu", ["H100", "GB200", "V100-32GB"])
def test_a_refit_to_the_same_factors_rewrites_a_profile_byte_for_byte(gpu, tmp_path):
    """scripts/fit_profiles.py writes a fitted block without the fields only plan calibrate sets (measured models
    and kinds, the transfer weights, per-model factors): rewriting a shipped profile with its own calibration leaves
    the file as it was."""
    fit, src, copy = _shipped_copy(gpu, tmp_path)
    fit.write_block(copy, load_profile(gpu).calibration)
    assert copy.read_text() == src.read_text()
    assert "measured_kinds" not in copy.read_text() and "other_kind_weight" not in copy.read_text()


def test_a_refit_on_another_machine_rewrites_a_profile_byte_for_byte(tmp_path):
    """A refit's last digits follow the machine's floating point (another CPU moved every factor by about 1e-13);
    scripts/fit_profiles.py writes factors to FACTOR_DIGITS significant digits, so such a refit leaves the shipped
    file as it was, and a factor that really moved is written moved."""
    fit, src, copy = _shipped_copy("H100", tmp_path)
    cal = load_profile("H100").calibration
    noisy = cal.model_copy(update={k: v * (1 + 3e-13) for k, v in cal.model_dump().items()
                                   if isinstance(v, float) and v})
    assert noisy.gemm_efficiency != cal.gemm_efficiency
    fit.write_block(copy, noisy)
    assert copy.read_text() == src.read_text()
    fit.write_block(copy, cal.model_copy(update={"gemm_efficiency": cal.gemm_efficiency * 1.001}))
    assert copy.read_text() != src.read_text()
    assert f"gemm_efficiency: {float(f'{cal.gemm_efficiency * 1.001:.8g}')!r}" in copy.read_text()
