"""Expert seeds: the layouts an expert tries first (Megatron / NeMo recipes), enqueued before an Optuna study
samples, with the rough static-memory model that picks their pipeline depths."""

from __future__ import annotations

from costmodel import memory
from costmodel.plan import RECOMPUTE_CODE, data_parallel
from costmodel.flops import total_params
from costmodel.profiles import load_profile
from planner.search._keys import SearchSpace, cfg_of_key
from planner.space import FSDP_STAGE

FSDP_SEEDS = 2
"""Megatron-FSDP seeds (ZeRO-3, pp 1, cp 1), at the smallest recipe tp degrees."""
STATIC_MEMORY_SHARE = 0.6
"""A seed's pipeline depth keeps weights, gradients and sharded optimizer states within this share of a GPU's
usable memory, leaving the rest for activations."""
MIN_LAYERS_PER_CHUNK = 4
"""A seed's vpp keeps at least this many layers per virtual stage."""


def expert_seeds(space: SearchSpace, limit: int = 12) -> list[dict]:
    """Layouts an expert tries first (Megatron / NeMo recipes), valid ones only, best guess first.

    tp = min(8, NVLink domain) for models of 20B parameters or more (smaller variants tp/2, tp/4 after it);
    cp 1, and 2 for sequences of 8k tokens or more; pp the smallest depth whose weights, gradients and
    sharded optimizer states take at most 60% of a GPU (leaving room for activations), and the next deeper
    one (depths that do not divide the layers take the uneven split of ``planner.space``); vpp the largest
    divisor of the layers per stage that keeps at least 4 layers per chunk (1 for uneven splits); micro-batch
    1; selective recompute where the space has it (else none: planner.space leaves selective out where the stack
    cannot run it as priced); ep = min(8, experts) for MoE models; ZeRO-1 (distributed optimizer). Then
    Megatron-FSDP (ZeRO-3, pp 1, cp 1) at the two smallest of those tp, as Megatron-Bridge's FSDP recipes run
    (Llama 3 70B on GB200/GB300: tp1 pp1, data/validation/published_runs.csv); the first FSDP seed comes
    second, after the recipe's best guess, so that short studies try both kinds of layout.
    """
    m, cl = space.model, space.cluster
    if not space.nodes:
        return []
    nodes = cl.nodes if cl.nodes in space.nodes else space.nodes[-1]
    n_gpus = nodes * cl.gpus_per_node
    prof = load_profile(cl.gpu)
    cap = prof.memory_bytes.value * prof.usable_memory_fraction
    params = total_params(m)
    ch = space.choices
    top_tp = min(8, cl.domain_gpus) if params >= 20e9 else min(2, cl.domain_gpus)
    tps = [t for t in (top_tp, top_tp // 2, top_tp // 4, top_tp * 2) if t in ch["tp"]]
    cps = [c for c in ((1, 2) if m.seq_len >= 8192 else (1,)) if c in ch["cp"]]
    ep = max([e for e in ch["ep"] if e <= 8] or [1])
    rc = RECOMPUTE_CODE["selective" if "selective" in ch["recompute"] else "none"]
    seeds, seen = [], set()
    index = space.index[nodes]
    for cp in cps:
        for tp in tps:
            pps = [p for p in ch["pp"] if n_gpus % (tp * cp * p) == 0]
            static_ok = []
            for p in pps:
                dp = data_parallel(n_gpus, tp, p, cp)
                per_gpu = params / (tp * p) * (memory.WEIGHT_BYTES + memory.GRAD_BYTES_CORE
                                               + memory.OPTIMIZER_BYTES / (dp * cp))
                if per_gpu <= STATIC_MEMORY_SHARE * cap:
                    static_ok.append(p)
            for p in static_ok[:2]:
                per_stage = m.layers // p
                even = m.layers % p == 0
                vpps = ([v for v in ch["vpp"] if per_stage % v == 0 and per_stage // v >= MIN_LAYERS_PER_CHUNK]
                        if p > 1 and even else [])
                for vpp in sorted(vpps, reverse=True) + [1]:
                    key = (tp, cp, p, vpp, ep if m.is_moe else 1, 1, rc, 1)
                    if key in index:
                        if key not in seen:
                            seen.add(key)
                            seeds.append(key)
                        break
    # Best guesses first: the largest tp (recipe), cp=2 / cp=1 interleaved.
    seeds.sort(key=lambda k: (tps.index(k[0]), k[2], k[1]))
    fsdp = [k for k in ((tp, 1, 1, 1, ep if m.is_moe else 1, 1, rc, FSDP_STAGE)
                        for tp in sorted(tps)) if k in index][:FSDP_SEEDS]
    keys = seeds[:1] + fsdp[:1] + seeds[1: max(1, limit - len(fsdp))] + fsdp[1:]
    out = []
    for key in keys[:limit]:
        cfg = cfg_of_key(key)
        if len(space.nodes) > 1:
            cfg["nodes"] = nodes
        out.append(cfg)
    return out
