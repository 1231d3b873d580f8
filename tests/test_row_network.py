"""The network a published row ran on: a cloud instance type (hardware_profiles/instances.yaml) or links and rates
its notes state (costmodel/validate.py network_named), read into the row's cluster in place of the GPU profile's
reference NIC, and said in the row's assumptions."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from costmodel.profiles import instance_named, instance_networks, load_profile
from costmodel.validate import load_cases, network_named, predict_case
from csv_rows import write_rows

DATA = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"


@pytest.mark.parametrize("text, gbps, per_gpu", [
    ("Selene: 8x A100-80GB + 8x HDR-200 per node; MBS=16", 1600, False),
    ("Selene: 8x A100-80GB per node, 8x HDR 200Gb/s HCAs; interleaved", 1600, False),
    ("4x 100 Gbps EFA", 400, False),
    ("Jean Zay, 4 OmniPath links per node", 400, False),
    ("8x400G RoCE", 3200, False),
    ("8 x NDR400 InfiniBand", 3200, False),
    ("2x HDR100", 200, False),
    ("8x CX-7 400Gb/s NICs", 3200, False),
    ("8x CX7 NICs", 3200, False),
    ("GPUDirect RDMA through 4 ConnectX-6 HCAs per node", 800, False),
    ("every GPU reaches the fabric through one of four ConnectX-6 HCAs", 800, False),
    ("3.2 Tbps EFA", 3200, False),
    ("8x H100 with 3200 Gbps EFA", 3200, False),
    ("EFA 400 Gbps per instance", 400, False),
    ("400G IB per GPU", 400, True),
    ("2x 100 GbE RoCE", 200, False),
])
def test_notes_name_the_network_by_links_or_a_qualified_rate(text, gbps, per_gpu):
    bits, each, _ = network_named(text)
    assert (bits, each) == (gbps * 1e9, per_gpu)


@pytest.mark.parametrize("text", ["400 Gbps InfiniBand", "NVLink 900 GB/s, 8 GPUs", "MBS=16, 8x A100-80GB",
                                  "seq 4096, 8x H100 per node", "top-8 experts, 256 GPUs", "no async TP, 2x200"])
def test_a_rate_that_may_be_per_gpu_or_per_node_or_no_network_names_none(text):
    assert network_named(text) is None


def test_every_instance_type_names_a_gpu_profile_and_a_source():
    assert len(instance_networks()) >= 15
    for inst in instance_networks():
        load_profile(inst.name)    # the GPU profile whose alias it is
        assert instance_named(f"AWS {inst.name} (8 GPUs)") == inst
    assert instance_named("H100 (AWS p5)").name == "p5.48xlarge" and instance_named("H100 SXM") is None
    assert instance_named("p4d").per_gpu_bytes_per_s == 6.25e9


def test_a_row_on_a_slower_network_is_priced_on_it_and_says_so(tmp_path):
    """Megatron-FSDP over 8 nodes of A100-40GB: on DGX A100 (200 Gb/s a GPU) and on AWS p4d (400 Gb/s an instance,
    50 a GPU, hardware_profiles/instances.yaml); the Selene rows' stated 8x HDR-200 is the profile's own rate."""
    row = next(r for r in csv.DictReader(DATA.open()) if r["source_id"] == "MLM_PAPER_T1")
    base = {**row, "model_name": "Llama 2 7B", "params_b": "", "layers": "", "hidden": "", "ffn_hidden": "",
            "heads": "", "kv_heads": "", "vocab": "", "gpu_type": "A100-40GB", "num_gpus": "64", "gpus_per_node": "8",
            "tp": "1", "pp": "1", "vp": "", "dp": "64", "global_batch": "64", "micro_batch": "1", "seq_len": "2048",
            "zero_stage_or_distopt": "fsdp", "framework": "megatron-core", "recompute": "none", "notes": "2024"}
    rows = [base, {**base, "gpu_type": "p4d.24xlarge"}, {**base, "notes": "2024, 4x 100 Gbps EFA per node"},
            {**base, "notes": "2024, 8x HDR-200 per node"}]
    cases, errors = load_cases(write_rows(tmp_path / "net.csv", rows))
    assert errors == []
    nics = [c.cluster.inter_node.nic_bandwidth_bytes_per_s for c in cases]
    assert nics == [25e9, 6.25e9, 6.25e9, 25e9]
    said = [[a for a in c.assumed if a.startswith("nic=")] for c in cases]
    assert said[0] == said[3] == []
    assert said[1] == ["nic=50 Gb/s per GPU (p4d.24xlarge: 400 Gb/s over its 8 GPUs, hardware_profiles/instances.yaml; "
                       "the A100-40GB profile's reference system has 200)"]
    assert said[2][0].startswith("nic=50 Gb/s per GPU (from the notes, '4x 100 gbps efa per node', over 8 GPUs a node")
    t = [predict_case(c)["predicted_step_time_s"] for c in cases]
    assert t[1] == t[2] > 1.1 * t[0] and t[3] == t[0]


def test_a_cluster_named_by_an_instance_type_and_count_has_its_network():
    from costmodel.profiles import load_cluster

    p4d, dgx = load_cluster("p4d.24xlargex64"), load_cluster("a100-40gbx64")
    assert (p4d.gpu, p4d.nodes, p4d.gpus_per_node) == (dgx.gpu, dgx.nodes, dgx.gpus_per_node) == ("A100-40GB", 8, 8)
    assert (p4d.inter_node.nic_bandwidth_bytes_per_s, dgx.inter_node.nic_bandwidth_bytes_per_s) == (6.25e9, 25e9)
    assert load_cluster("a3-megagpu-8gx256").inter_node.nic_bandwidth_bytes_per_s == 25e9
    assert load_cluster("p5.48xlargex64").inter_node.nic_bandwidth_bytes_per_s == \
        load_cluster("h100x64").inter_node.nic_bandwidth_bytes_per_s == 50e9
