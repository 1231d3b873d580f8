"""What the model catalog holds, as rows for ``plan models``: each model's size, shape and what it leaves
unexpressed (costmodel/catalog.py cites every number)."""

from __future__ import annotations

from costmodel.catalog import aliases, catalog, catalog_names, matching
from costmodel.flops import active_params, total_params
from costmodel.profiles import InputError
from costmodel.specs import HYBRID_KINDS

__all__ = ["model_rows"]


def model_rows(text: str | None = None) -> list[dict]:
    """One row per catalog model (those whose name or an alias contains ``text``, case and punctuation ignored):
    name, aliases, total and active parameters, layers, width, heads, experts, default sequence length and
    precision, the hybrid layer counts and the facts no field holds. An InputError names the catalog when
    nothing matches."""
    names = matching(text) if text else catalog_names()
    if not names:
        raise InputError(f"no catalog model's name or alias contains {text!r}; catalog: {', '.join(catalog_names())}")
    cat = catalog()
    rows = []
    for name in names:
        m = cat[name]
        rows.append({
            "name": name, "aliases": list(aliases(name)),
            "params": total_params(m), "active_params": active_params(m) if m.is_moe else None,
            "layers": m.layers, "hidden": m.hidden, "ffn_hidden": m.ffn_hidden, "heads": m.heads,
            "kv_heads": m.kv_head_count, "head_dim": m.head_width, "vocab": m.vocab, "seq_len": m.seq_len,
            "precision": m.precision,
            "experts": m.num_experts or None, "moe_topk": m.moe_topk or None,
            "expert_ffn": m.expert_ffn if m.is_moe else None, "shared_experts": m.shared_experts or None,
            "dense_layers": m.dense_layers if m.is_moe and not m.hybrid_pattern else None,
            "moe_layer_step": m.moe_layer_step if m.moe_layer_step > 1 else None,
            "moe_layers": m.moe_layers if m.is_moe and not m.hybrid_pattern else None,
            "mtp_layers": m.mtp_layers or None,
            "hybrid_layers": {HYBRID_KINDS[k]: n for k, n in m.hybrid_counts.items() if n}
            if m.hybrid_pattern else None,
            "unexpressed": list(m.unexpressed),
        })
    return rows
