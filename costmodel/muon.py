"""What the Muon optimizer costs beyond Adam's memory-bound step: its Newton-Schulz iterations. Vectorised.

Muon (ModelSpec.optimizer "muon") replaces each 2-D weight's update by its momentum orthogonalised with
Newton-Schulz iterations. As megatron-core 0.16.1 runs it (optimizer/muon.py ``get_megatron_muon_optimizer``,
``TensorParallelMuon``), with NVIDIA's emerging_optimizers
(``orthogonalized_optimizers/muon_utils.py`` ``newton_schulz``, ``newton_schulz_step``):

- every 2-D parameter but the embedding and the output layer is Muon's; those two, the norms and biases step
  with Adam;
- ``muon_tp_mode`` "blockwise" (the default) orthogonalises each tensor-parallel shard on its own rank, no
  communication: the matrices are the local shards;
- ``muon_split_qkv`` (default True) splits a fused QKV weight into its q, k and v parts first (``linear_qkv``
  only; multi-head latent attention's projections are separate weights anyway);
- ``muon_num_ns_steps`` 5 iterations, each ``A = X X^T``, ``B = b A + c A A``, ``X = a X + B X`` on the matrix
  transposed so that X is m x n with m <= n: 2 m^2 n + 2 m^3 + 2 m^2 n FLOPs;
- ``muon_fp32_matmul_prec`` "medium" (the default) runs them in bf16 ("We explicitly convert to BF16").

A routed expert's weights are one matrix per expert (Transformer Engine's grouped linear keeps weight0 ...
weightN). With the distributed optimizer (Megatron's layer-wise distributed optimizer,
layer_wise_optimizer.py) each data-parallel rank steps whole matrices, dealt to the ranks by size: a rank's
share of the iterations is its stage's over the ranks sharing the state; without it every rank runs them all.
"""

from __future__ import annotations

import numpy as np

from costmodel import compute
from costmodel.specs import ModelSpec

# megatron-core 0.16.1 optimizer/optimizer_config.py muon_num_ns_steps.
NS_STEPS = 5


def _ns_time_s(prof, rows, cols, count) -> np.ndarray:
    """Seconds of NS_STEPS iterations on ``count`` matrices of rows x cols each (arrays, one per plan), on the
    GEMM curve at the matrix's smaller side."""
    rows, cols = np.asarray(rows, dtype=float), np.asarray(cols, dtype=float)
    m, n = np.minimum(rows, cols), np.maximum(rows, cols)
    flops = NS_STEPS * (4.0 * m * m * n + 2.0 * m ** 3)
    return np.asarray(count, dtype=float) * compute.gemm_time_s(prof, "bf16", flops, m)


def _mlp_time_s(model: ModelSpec, prof, ffn, split, count=1.0) -> np.ndarray:
    """fc1 (gated: both halves, one weight) and fc2 of an MLP of width ``ffn`` split ``split`` ways."""
    h = model.hidden
    fc1 = (2.0 if model.gated_mlp else 1.0) * ffn / split
    return _ns_time_s(prof, fc1, h, count) + _ns_time_s(prof, h, ffn / split, count)


def _attention_time_s(model: ModelSpec, prof, tp) -> np.ndarray:
    h, a, d = model.hidden, model.heads, model.head_width
    if model.mla_kv_lora_rank:
        # megatron-core MLASelfAttention: the down projections are replicated over tensor parallelism, the up
        # projections column-parallel, the output row-parallel.
        r, v = model.mla_rope_dim, model.mla_v_head_dim or d
        ql, kl = model.mla_q_lora_rank, model.mla_kv_lora_rank
        q = (_ns_time_s(prof, ql, h, 1.0) + _ns_time_s(prof, a * (d + r) / tp, ql, 1.0)) if ql \
            else _ns_time_s(prof, a * (d + r) / tp, h, 1.0)
        kv = _ns_time_s(prof, kl + r, h, 1.0) + _ns_time_s(prof, a * (d + v) / tp, kl, 1.0)
        return q + kv + _ns_time_s(prof, h, a * v / tp, 1.0)
    kv = model.kv_head_count
    return (_ns_time_s(prof, a * d / tp, h, 1.0) + _ns_time_s(prof, kv * d / tp, h, 2.0)
            + _ns_time_s(prof, h, a * d / tp, 1.0))


def newton_schulz_layer_s(model: ModelSpec, prof, tp, etp, ep) -> dict[str, np.ndarray]:
    """Seconds of one rank's Newton-Schulz iterations on one layer's matrices, before the distributed
    optimizer deals them out: ``dense`` (a dense layer), ``moe_dense`` (a MoE layer's attention, shared
    experts and router) and ``expert`` (its routed experts on this rank, E / ep of them, split over etp)."""
    tp = np.asarray(tp, dtype=float)
    attn = _attention_time_s(model, prof, tp)
    out = {"dense": attn + _mlp_time_s(model, prof, model.ffn_hidden, tp)}
    if model.is_moe:
        f = model.expert_ffn
        shared = _mlp_time_s(model, prof, f * model.shared_experts, tp) if model.shared_experts else 0.0
        router = _ns_time_s(prof, model.num_experts, model.hidden, 1.0)
        out["moe_dense"] = attn + shared + router
        out["expert"] = _mlp_time_s(model, prof, f, np.asarray(etp, dtype=float),
                                    model.num_experts / np.asarray(ep, dtype=float))
    else:
        out["moe_dense"] = out["expert"] = np.zeros_like(tp)
    return out
