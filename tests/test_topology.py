"""The cluster topology graph (networkx) and which links each parallel group crosses."""

import networkx as nx
import numpy as np

from costmodel import comm
from costmodel.comm import _intra_busbw, group_links, group_span, moe_dispatch_time_s, topology_graph
from costmodel.profiles import load_cluster, load_profile


def test_graph_has_every_gpu_and_is_connected():
    c = load_cluster("h100x512")
    g = topology_graph(c)
    gpus = [n for n, d in g.nodes(data=True) if d.get("kind") == "gpu"]
    assert len(gpus) == 512
    assert nx.is_connected(g)


def test_groups_follow_megatron_rank_order():
    c = load_cluster("h100x512")  # 8 GPUs per node, 32 nodes per leaf switch
    links = group_links(c, tp=8, cp=1, dp=16, pp=4)
    assert links["tp"]["links"] == ["nvlink"]          # ranks 0-7: one node
    assert links["dp"]["links"] == ["nic"]             # ranks 0, 8, ..., 120: 16 nodes under one leaf
    assert "spine" in links["pp"]["links"]             # ranks 0, 128, 256, 384: different leaves


def test_nvl72_domain_keeps_expert_group_on_nvlink():
    c = load_cluster("gb200-nvl72x8")
    links = group_links(c, tp=1, cp=1, dp=576, pp=1, ep=64)
    assert links["ep"]["links"] == ["nvlink"]
    k, n = group_span(1, 64, c.domain_gpus)
    assert (k, n) == (64, 1)


def test_torus_links_domains_directly():
    c = load_cluster("h100x512").model_copy(update={"topology": "torus"})
    g = topology_graph(c)
    assert not any(d.get("kind") == "spine" for _, d in g.nodes(data=True))
    links = group_links(c, tp=8, cp=1, dp=64, pp=1)
    assert "torus" in links["dp"]["links"]


def test_moe_dispatch_sends_a_token_once_per_destination_gpu():
    """The flex dispatcher (DeepEP / HybridEP) moves a token over NVLink once per GPU holding any of its
    experts: 8 experts over 8 GPUs in one domain reach 8(1-(7/8)^8) = 5.25 GPUs, 7/8 of them other GPUs
    (4.59 copies), not 7 copies as one per expert would; over 64 GPUs in one domain, 64(1-(63/64)^8) x 63/64."""
    c = load_cluster("gb200-nvl72x8")
    prof = load_profile("GB200")
    token_bytes = 64e6
    lat = prof.latency_s("all_to_all")
    busbw = float(_intra_busbw(prof, c, "all_to_all", token_bytes * 8))
    for size, copies in ((8, 7 * (1 - (7 / 8) ** 8)), (64, 63 * (1 - (63 / 64) ** 8))):
        t = float(moe_dispatch_time_s(prof, c, token_bytes, 8, size, size, 1))
        assert np.isclose(t, token_bytes * copies / busbw + lat, rtol=1e-9)
    # The copies the dispatch of 8 experts over 8 GPUs moves, read back from its time: 4.59, not 7.
    t8 = float(moe_dispatch_time_s(prof, c, token_bytes, 8, 8, 8, 1))
    assert 4.58 < (t8 - lat) * busbw / token_bytes < 4.60
    # One expert per token: the same as a copy per expert, (size - 1) / size of the tokens leave the GPU.
    t1 = float(moe_dispatch_time_s(prof, c, token_bytes, 1, 8, 8, 1))
    assert np.isclose(t1, token_bytes * 7 / 8 / float(_intra_busbw(prof, c, "all_to_all", token_bytes)) + lat)


def test_fitted_all_to_all_factor_scales_the_nvlink_part_of_the_dispatch_only():
    """The profile's a2a_time is fitted to runs that keep expert parallelism inside one NVLink domain, so it
    scales that part: inside a domain the transfer time moves with it, across 4 nodes (where the network part
    is the longer one) the dispatch takes the network time whatever the factor."""
    c = load_cluster("h100x512")
    prof = load_profile("H100")
    token_bytes = 64e6
    lat = prof.latency_s("all_to_all")
    inside = [float(moe_dispatch_time_s(prof, c, token_bytes, 8, 8, 8, 1, nvlink_factor=f)) for f in (1.0, 0.25)]
    assert np.isclose(inside[1] - lat, 0.25 * (inside[0] - lat), rtol=1e-9)
    across = [float(moe_dispatch_time_s(prof, c, token_bytes, 8, 32, 8, 4, nvlink_factor=f)) for f in (1.0, 0.25, 2.0)]
    assert across[0] > inside[0]                      # the network part sets the pace
    assert np.isclose(across[1], across[0], rtol=1e-12) and np.isclose(across[2], across[0], rtol=1e-12)


def test_group_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3's routing picks 4 of 8 expert groups per token, and a group of consecutive experts sits on
    consecutive ranks: with ep 64 over 8 nodes each group is one node, so a token reaches 4 nodes (3.5 of them
    remote) where 8 experts drawn freely reach 8(1-(7/8)^8) = 5.25 (4.59 remote); with ep 32 over 4 nodes (two
    groups a node) 4(1 - C(6,4)/C(8,4)) = 3.14 nodes instead of 3.60. The network part, which sets the pace
    across nodes, shrinks in proportion."""
    from costmodel.comm import _groups_reached

    assert np.allclose(_groups_reached(8, 4, 8, np.array([8.0, 4.0])), [4.0, 4 * (1 - 15 / 70)])
    # Groups spanning several GPUs: the chosen groups cover 4 x 64 / 8 = 32 GPUs, over which the experts spread.
    assert np.isclose(float(_groups_reached(8, 4, 8, 64.0)), 32 * (1 - (31 / 32) ** 8))
    # One group chosen of one: no limit.
    assert np.isclose(float(_groups_reached(1, 1, 8, 8.0)), 8 * (1 - (7 / 8) ** 8))
    c, prof = load_cluster("h100x512"), load_profile("H100")
    token_bytes, lat = 64e6, prof.latency_s("all_to_all")
    free = float(moe_dispatch_time_s(prof, c, token_bytes, 8, 64, 8, 8)) - 2 * lat
    limited = float(moe_dispatch_time_s(prof, c, token_bytes, 8, 64, 8, 8, groups=(8, 4))) - 2 * lat
    assert np.isclose(limited / free, 3.5 / (8 * (1 - (7 / 8) ** 8) * 7 / 8), rtol=0.02)


def _fabric(cluster, oversubscription: float, block_nodes: int = 32):
    return cluster.model_copy(update={"inter_node": cluster.inter_node.model_copy(
        update={"oversubscription": oversubscription, "full_bisection_nodes": block_nodes})})


def test_rings_keep_the_nic_rate_while_a_block_holds_enough_of_their_domains():
    """A ring over 64 nodes in two 32-node blocks crosses the core once out of each block: its 32 domains there
    share one crossing, so a 1:7 core does not slow it; 1:64 leaves it 32/64 of the rate, the network part twice
    as long."""
    prof, c = load_profile("H100"), load_cluster("h100x8192")
    one = float(comm.collective_time_s(prof, c, "all_reduce", 1e9, 64, 1, 64))
    assert float(comm.collective_time_s(prof, _fabric(c, 7.0), "all_reduce", 1e9, 64, 1, 64)) == one
    assert comm.core_share(_fabric(c, 64.0), 64) == 0.5
    slow = float(comm.collective_time_s(prof, _fabric(c, 64.0), "all_reduce", 1e9, 64, 1, 64))
    lat = 2 * prof.latency_s("all_reduce")
    assert np.isclose(slow - lat, 2 * (one - lat))
    # Three blocks of 8 nodes for 24 domains: 8 per block, under a 1:16 core half the rate.
    assert comm.core_share(_fabric(c, 16.0, 8), 24) == 0.5
    # Inside one block, or on a full-bisection core, nothing changes.
    assert comm.core_share(_fabric(c, 64.0), 32) == 1.0
    assert comm.core_share(_fabric(c, 1.0), 1024) == 1.0


def test_all_to_all_pays_for_the_share_of_its_traffic_that_leaves_the_block():
    """An all-to-all over 64 domains in two blocks sends 32 of its 63 remote shares across the core: a 1:7 core
    gives it 1 / (7 x 32/63) of the NIC rate; in one 384-node block (a Meta-style pod) none of it."""
    prof, c = load_profile("H100"), load_cluster("h100x8192")
    share = float(comm.core_share(_fabric(c, 7.0), 64, all_to_all=True))
    assert np.isclose(share, 1.0 / (7.0 * 32.0 / 63.0))
    base = float(comm.collective_time_s(prof, c, "all_to_all", 1e8, 512, 8, 64))
    lat = 2 * prof.latency_s("all_to_all")
    slow = float(comm.collective_time_s(prof, _fabric(c, 7.0), "all_to_all", 1e8, 512, 8, 64))
    assert np.isclose(slow - lat, (base - lat) / share)
    assert float(comm.collective_time_s(prof, _fabric(c, 7.0, 384), "all_to_all", 1e8, 512, 8, 64)) == base


def test_topology_graph_groups_nodes_into_full_bisection_blocks():
    c = _fabric(load_cluster("h100x512"), 4.0, 16)
    g = topology_graph(c)
    leaves = {n for n, d in g.nodes(data=True) if d.get("kind") == "leaf"}
    assert len(leaves) == 4 * 8                          # 64 nodes in blocks of 16, one switch per rail
    assert g.edges["leaf0.rail0", "spine"]["bandwidth_bytes_per_s"] == 50e9 * 16 / 4.0
    assert "spine" in group_links(c, tp=8, cp=1, dp=32, pp=1)["dp"]["links"]      # 32 nodes: two blocks
