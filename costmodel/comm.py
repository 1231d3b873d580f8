"""Collective time from busbw curves and the cluster's shape.

Which ranks form which group follows Megatron's rank order (default ``tp-cp-ep-dp-pp``, innermost
first, as in ``parallel_state.generate_masked_orthogonal_rank_groups``): a group of size n whose
members are ``stride`` ranks apart has k = min(n, D/stride) members in each NVLink domain of D GPUs
and spans N = n/k domains. Collectives spanning domains run hierarchically, as NCCL does: the
NVLink part at the measured intra-domain busbw, the network part through the k NICs of the members
in each domain; the slower part sets the time (NCCL pipelines the two).

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer per
rank, all-gather and reduce-scatter (n-1)/n of the full buffer, all-to-all (n-1)/n.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from costmodel.profiles import HardwareProfile, busbw_at
from costmodel.specs import ClusterSpec

# A ConnectX-7 at 400 Gb/s reaches 46-49 GB/s of its 50 GB/s (nccl-tests issues #267, #290).
NIC_EFFICIENCY = 0.92
# NVLink point-to-point copies reach about 80% of the link rate without a measured curve.
LINK_EFFICIENCY = 0.80
# All-to-all cannot aggregate NICs (nccl-tests #267, maintainer): each GPU gets its own NIC.
# DeepEP dispatch/combine over CX7 400G (data/validation/nccl.csv, DEEPEP_V1_LEGACY) reach 39-58 GB/s
# of RDMA bottleneck bandwidth per 50 GB/s NIC, about 0.9 of it at EP 8-64.
A2A_INTER_EFFICIENCY = 0.90
# Inside the NVLink domain DeepEP reaches 153-158 GB/s on H800 (~200 GB/s NVLink) and 643-740 GB/s
# on Blackwell (900 GB/s): about 0.8 of the link rate.
A2A_INTRA_EFFICIENCY = 0.80


def group_span(stride, size, domain: int):
    """Members per NVLink domain (k) and domains spanned (N) of a group. Broadcasts."""
    stride = np.asarray(stride, dtype=float)
    size = np.asarray(size, dtype=float)
    per_domain = np.maximum(np.floor(domain / np.maximum(stride, 1.0)), 1.0)
    k = np.minimum(size, per_domain)
    n_domains = np.ceil(size / k)
    return k, n_domains


def _intra_busbw(profile: HardwareProfile, cluster: ClusterSpec, collective: str, nbytes) -> np.ndarray:
    nbytes = np.asarray(nbytes, dtype=float)
    scale = 1.0
    if cluster.intra_node.bandwidth_bytes_per_s:
        scale = cluster.intra_node.bandwidth_bytes_per_s / profile.nvlink_bandwidth_bytes_per_s.value
    link = profile.nvlink_bandwidth_bytes_per_s.value
    curve = profile.curve(collective, "intra")
    if curve is not None:
        return np.maximum(busbw_at(curve, nbytes), 1.0) * scale
    if collective == "all_to_all":
        return A2A_INTRA_EFFICIENCY * link * np.maximum(nbytes, 1.0) / (np.maximum(nbytes, 1.0) + 1e6) * scale
    ar = profile.curve("all_reduce", "intra")
    if ar is not None and collective in ("all_gather", "reduce_scatter"):
        bw = busbw_at(ar, nbytes)
        if profile.nvls:
            # NVLS (in-switch reduction) lifts all-reduce busbw above the ring rate; gathers do
            # not get it: 8x H200 ring 367 vs NVLS 480 GB/s (STAS_H200_NCCLTESTS).
            bw = np.minimum(bw, LINK_EFFICIENCY * link)
        return np.maximum(bw, 1.0) * scale
    # Latency-bandwidth model at LINK_EFFICIENCY of the link rate.
    size_eff = np.maximum(nbytes, 1.0) / (np.maximum(nbytes, 1.0) + 4e6)
    return LINK_EFFICIENCY * link * size_eff * scale


def core_share(cluster: ClusterSpec, n_domains, all_to_all: bool = False) -> np.ndarray:
    """Share of the NIC rate a group's network traffic keeps on a fat tree whose core is oversubscribed
    (``inter_node.oversubscription`` above blocks of ``inter_node.full_bisection_nodes`` nodes), when every group
    of its kind moves data at once (the data-parallel reduce, the expert all-to-all). Nothing is lost inside one
    block, nor on a full-bisection core. The group's domains are taken as contiguous (ranks in order), spread
    evenly over the blocks they span; each block's GPUs can send 1/oversubscription of their NIC rate over the
    core.

    - Rings (all-reduce, all-gather, reduce-scatter: NCCL's rings over the domains, one per NIC rail) cross
      the core once out of each block they span, however many of the group's d domains the block holds, so
      the block's crossing traffic is 1/d of its GPUs' ring rate: the rings keep the full rate while
      d >= oversubscription, else d / oversubscription of it.
    - All-to-all: a rank's network traffic goes evenly to the group's other N - 1 domains, (N - d) / (N - 1)
      of it to other blocks, so the rate is 1 / (oversubscription x that share), at most the full rate.

    The capacity argument of a well-placed job, not a measurement: ECMP collisions and other tenants'
    traffic are not in it. A pipeline send/recv is priced as a pair of neighbouring domains (one block,
    unless a block is smaller than two domains): a stage boundary crosses a block boundary only now and then.
    A torus has no core: it keeps its own rule (:func:`_inter_bw_per_gpu`)."""
    n = np.asarray(n_domains, dtype=float)
    over = cluster.inter_node.oversubscription
    if over <= 1.0:
        return np.ones_like(n)
    per_domain = max(cluster.domain_gpus // cluster.gpus_per_node, 1)
    block = max(cluster.inter_node.full_bisection_nodes // per_domain, 1)     # domains in one block
    blocks = np.ceil(n / block)
    d = n / np.maximum(blocks, 1.0)                                             # the group's domains per block
    if all_to_all:
        crossing = (n - d) / np.maximum(n - 1.0, 1.0)
        share = 1.0 / np.maximum(over * crossing, 1.0)
    else:
        share = np.minimum(d / over, 1.0)
    return np.where(blocks > 1, share, 1.0)


def _inter_bw_per_gpu(cluster: ClusterSpec, n_domains, nbytes, all_to_all: bool = False) -> np.ndarray:
    """Network bandwidth per GPU for traffic that leaves the NVLink domain."""
    nic = cluster.inter_node.nic_bandwidth_bytes_per_s * NIC_EFFICIENCY
    nbytes = np.asarray(nbytes, dtype=float)
    size_eff = np.maximum(nbytes, 1.0) / (np.maximum(nbytes, 1.0) + 2e6)
    bw = nic * size_eff * np.ones_like(np.asarray(n_domains, dtype=float))
    if cluster.topology == "torus":
        # A ring maps onto a torus dimension at full rate; all-to-all crosses the bisection,
        # which for a 3-D torus of N nodes shrinks as N^(1/3) relative to a fat tree.
        if all_to_all:
            nodes_spanned = np.asarray(n_domains, dtype=float) * max(cluster.domain_gpus // cluster.gpus_per_node, 1)
            bw = bw / np.maximum(1.0, np.cbrt(nodes_spanned) / 2.0)
    else:
        bw = bw * core_share(cluster, n_domains, all_to_all)
    if all_to_all:
        bw = bw * A2A_INTER_EFFICIENCY
    return bw


def collective_time_s(profile: HardwareProfile, cluster: ClusterSpec, collective: str,
                      nbytes, size, k, n_domains) -> np.ndarray:
    """Time of one collective over ``size`` ranks laid out as k per domain over n_domains domains.

    ``nbytes``: all_reduce - the buffer; all_gather/reduce_scatter - the full (gathered) buffer;
    all_to_all - what one rank sends in total (its own share included); send_recv - the message.
    """
    nbytes = np.asarray(nbytes, dtype=float)
    size = np.asarray(size, dtype=float)
    k = np.asarray(k, dtype=float)
    n_domains = np.asarray(n_domains, dtype=float)
    lat = profile.latency_s(collective)
    if profile.kind == "host" and profile.curve(collective, "intra") is not None:
        # `plan profile` curves start at 256 B, so the measured busbw already contains the latency.
        lat = 0.0
    if collective == "send_recv":
        intra = nbytes / (_intra_busbw(profile, cluster, "send_recv", nbytes)
                          if profile.curve("send_recv", "intra") else
                          LINK_EFFICIENCY * profile.nvlink_bandwidth_bytes_per_s.value)
        inter = nbytes / _inter_bw_per_gpu(cluster, n_domains, nbytes) + cluster.inter_node.latency_s
        return np.where(n_domains > 1, inter, intra) + lat
    if collective == "all_reduce":
        f_intra, f_inter = 2 * (k - 1) / np.maximum(k, 1), 2 * (n_domains - 1) / np.maximum(n_domains, 1)
    else:
        f_intra, f_inter = (k - 1) / np.maximum(k, 1), (n_domains - 1) / np.maximum(n_domains, 1)
    if collective == "all_to_all":
        # Share of a rank's data that stays in its domain vs crosses the network.
        f_intra = (k - 1) / np.maximum(size, 1)
        f_inter = (size - k) / np.maximum(size, 1)
        t_intra = nbytes * f_intra / _intra_busbw(profile, cluster, "all_to_all", nbytes)
        t_inter = nbytes * f_inter / _inter_bw_per_gpu(cluster, n_domains, nbytes, all_to_all=True)
        t = np.maximum(t_intra, t_inter)
    else:
        busbw = _intra_busbw(profile, cluster, collective, nbytes / np.maximum(n_domains, 1))
        t_intra = nbytes * f_intra / busbw
        # Network part: each domain moves f_inter of the (domain-reduced) buffer through its k NICs.
        t_inter = (nbytes / np.maximum(k, 1)) * f_inter / _inter_bw_per_gpu(cluster, n_domains, nbytes / k)
        t = np.maximum(t_intra, t_inter) + 0.2 * np.minimum(t_intra, t_inter)
    t = t + lat * np.where(n_domains > 1, 2.0, 1.0)
    return np.where((size > 1) & (nbytes > 0), t, 0.0)


def _groups_reached(groups: int, chosen: int, topk: int, places) -> np.ndarray:
    """Expected places (domains or GPUs, ``places`` of them, the routed experts spread evenly over them) a token
    reaches when its ``topk`` experts come from ``chosen`` expert groups of ``groups`` (group-limited routing;
    megatron-core assigns experts to expert-parallel ranks in order, so a group of consecutive experts sits on
    consecutive ranks). Places holding whole groups (groups / places >= 1 of them): those holding a chosen group,
    each missed with probability C(groups - groups/places, chosen) / C(groups, chosen), and no more than topk
    experts drawn freely reach. Groups spanning several places: the chosen groups cover chosen x places / groups
    of them, over which the experts spread."""
    places = np.maximum(np.asarray(places, dtype=float), 1.0)
    per = groups / places
    miss = np.ones_like(places)
    for i in range(chosen):
        miss = miss * np.clip((groups - per - i) / (groups - i), 0.0, None)
    free = places * (1.0 - (1.0 - 1.0 / places) ** topk)
    cover = np.maximum(chosen * places / groups, 1.0)
    spread = cover * (1.0 - (1.0 - 1.0 / cover) ** topk)
    return np.where(per >= 1.0, np.minimum(places * (1.0 - miss), free), spread)


def moe_dispatch_time_s(profile: HardwareProfile, cluster: ClusterSpec, token_bytes, topk: int,
                        size, k, n_domains, nvlink_factor: float = 1.0,
                        groups: tuple[int, int] | None = None) -> np.ndarray:
    """One MoE dispatch (or combine) all-to-all of ``token_bytes`` (the rank's tokens, one copy each).

    Hierarchical dispatch as DeepEP and megatron-core's flex dispatcher run it: a token crosses the
    network once per destination domain (not once per expert) and fans out over NVLink there. With
    k experts drawn evenly over N domains a token reaches N*(1-(1-1/N)^k) distinct domains, (N-1)/N
    of them remote. Over NVLink, too, it moves once per destination GPU, not once per expert: the flex
    dispatcher's DeepEP and HybridEP kernels send a token to each rank holding any of its experts and
    the rank copies it to its local experts (Megatron-Bridge's performance recipes run it, scripts/performance/
    configs/deepseek/deepseek_workload_base_configs.py and configs/qwen/qwen3_workload_base_configs.py:
    moe_flex_dispatcher_backend "hybridep" for DeepSeek-V3 on every GPU and Qwen3 on GB200 / GB300; Qwen3-235B
    on B200 / B300 keeps the alltoall dispatcher, a copy per expert). With k experts over ``size`` GPUs a GPU
    receives a given token with probability p = 1-(1-1/size)^k; each domain forwards to its other k_dom - 1
    GPUs, N (k_dom - 1) p copies of a rank's tokens in all (own domain plus those it relays from its network
    peers). For 8 experts over 8 GPUs that is 4.6 copies where a copy per expert would be 7.

    Group-limited routing (``groups`` = (expert groups, groups a token may use): DeepSeek-V3's 8 and 4, megatron-core
    --moe-router-num-groups / --moe-router-group-topk) confines a token's experts to the places holding its chosen
    groups (:func:`_groups_reached`), fewer than k experts drawn freely would reach: DeepSeek-V3 sends each token to at
    most 4 nodes (arXiv:2412.19437, Sec. 2.1.2); with ep 64 over 8 nodes, 4 remote-or-local domains instead of 5.25.

    ``nvlink_factor`` (the profile's fitted a2a_time) scales the NVLink part alone. The published MoE runs it
    is fitted to hold expert parallelism inside one NVLink domain far more often than across domains, so the
    factor measures how the dispatch kernels (and whatever of them overlaps) fare there; the network part is
    priced at the measured network rates.
    """
    token_bytes = np.asarray(token_bytes, dtype=float)
    size = np.asarray(size, dtype=float)
    k = np.asarray(k, dtype=float)
    N = np.asarray(n_domains, dtype=float)

    def reached(n):
        # Probability that one of n equal places (domains, GPUs) holds any of the token's topk experts.
        if groups is None:
            return 1.0 - (1.0 - 1.0 / np.maximum(n, 1.0)) ** topk
        n = np.maximum(np.asarray(n, dtype=float), 1.0)
        return _groups_reached(groups[0], groups[1], topk, n) / n

    remote = reached(N) * (N - 1.0)   # remote domains the token reaches
    inter_bytes = token_bytes * remote
    # Copies that land on other GPUs of a domain (own tokens plus those relayed from the network), one per GPU.
    intra_bytes = token_bytes * reached(size) * (k - 1.0) * N
    t_intra = nvlink_factor * intra_bytes / _intra_busbw(profile, cluster, "all_to_all", token_bytes * topk)
    t_inter = inter_bytes / _inter_bw_per_gpu(cluster, N, np.maximum(inter_bytes, 1.0), all_to_all=True)
    t = np.maximum(t_intra, t_inter) + profile.latency_s("all_to_all") * np.where(N > 1, 2.0, 1.0)
    return np.where((size > 1) & (token_bytes > 0), t, 0.0)


def topology_graph(cluster: ClusterSpec) -> nx.Graph:
    """The cluster as a graph: GPUs, NVLink-domain switches, leaf (rail) switches and a spine.

    Edge attribute ``bandwidth_bytes_per_s`` is the per-direction link rate. Used to report which
    links a group crosses and to count hops; the collective formulas above use its aggregate shape.
    """
    g = nx.Graph()
    domain = cluster.domain_gpus
    nic = cluster.inter_node.nic_bandwidth_bytes_per_s
    n_domains = max(1, cluster.num_gpus // domain)
    for d in range(n_domains):
        sw = f"nvswitch{d}"
        g.add_node(sw, kind="nvswitch")
        for i in range(domain):
            gpu = d * domain + i
            g.add_node(gpu, kind="gpu", domain=d)
            g.add_edge(gpu, sw, bandwidth_bytes_per_s=cluster.intra_node.bandwidth_bytes_per_s or 0.0,
                       link="nvlink")
    gpn = cluster.gpus_per_node
    if cluster.topology == "torus":
        side = max(1, round(n_domains ** (1 / 3)))
        for d in range(n_domains):
            for step in (1, side, side * side):
                e = (d + step) % n_domains
                if e != d:
                    g.add_edge(f"nvswitch{d}", f"nvswitch{e}", bandwidth_bytes_per_s=nic * gpn, link="torus")
        return g
    rails = cluster.inter_node.rails
    per_leaf = cluster.inter_node.full_bisection_nodes
    leaves = max(1, -(-n_domains * max(domain // gpn, 1) // per_leaf))
    g.add_node("spine", kind="spine")
    for leaf in range(leaves):
        for r in range(rails if cluster.topology == "rail-optimised" else 1):
            name = f"leaf{leaf}.rail{r}"
            g.add_node(name, kind="leaf")
            g.add_edge(name, "spine", bandwidth_bytes_per_s=nic * per_leaf / cluster.inter_node.oversubscription,
                       link="spine")
    for gpu in range(cluster.num_gpus):
        node = gpu // gpn
        leaf = node // per_leaf
        rail = (gpu % gpn) % rails if cluster.topology == "rail-optimised" else 0
        g.add_edge(gpu, f"leaf{leaf}.rail{rail}", bandwidth_bytes_per_s=nic, link="nic")
    return g


def group_links(cluster: ClusterSpec, tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int = 1) -> dict:
    """Which links each parallel group's ring crosses, for the group that holds rank 0.

    Ranks follow Megatron's tp-cp-ep-dp-pp order (experts: etp-ep-edp); the ring visits the group's
    ranks in order and each hop takes the shortest path in ``topology_graph``. Returns
    {group: {"ranks": [...], "links": sorted link kinds, "max_hops": int}}.
    """
    g = topology_graph(cluster)
    strides = {"tp": (1, tp), "cp": (tp, cp), "dp": (tp * cp, dp), "pp": (tp * cp * dp, pp), "ep": (etp, ep)}
    out = {}
    for name, (stride, size) in strides.items():
        if size <= 1:
            continue
        ranks = [i * stride for i in range(size)]
        ring = ranks + [ranks[0]] if size > 2 else ranks
        kinds, hops = set(), 0
        for a, b in zip(ring, ring[1:]):
            path = nx.shortest_path(g, a, b)
            hops = max(hops, len(path) - 1)
            kinds |= {g.edges[u, v]["link"] for u, v in zip(path, path[1:])}
        out[name] = {"ranks": ranks if size <= 16 else ranks[:8] + ["..."] + ranks[-2:], "links": sorted(kinds),
                     "max_hops": hops}
    return out
