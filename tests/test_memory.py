"""Activation and model-state memory against Korthikanti et al. 2022 (arXiv:2205.05198).

Reference points: data/validation/memory.csv, Figure 1 (per-GPU weights+gradients+optimizer state
and activations of the first pipeline stage) and Figure 7 (activation memory of each technique as a
share of the no-recompute, no-SP baseline), as encoded in calculon (llm/validation.py). The
configurations are the paper's Table 3, on Selene (A100-80GB), Megatron-LM of 2021 (no flash
attention, the a*s^2 score tensors are materialised), fp16 mixed precision, s=2048, V=51200.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest

from costmodel import memory
from costmodel.estimate import estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.flops import embedding_params, layer_params
from costmodel.specs import ClusterSpec, InterNodeFabric, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
MEMORY_CSV = ROOT / "data" / "validation" / "memory.csv"
GIB = float(2**30)
FRAMEWORK = "megatron-lm-2021"
TOL = 0.05          # Figure 1: within 5 %
TOL_PTS = 5.0       # Figure 7: within 5 percentage points

# Korthikanti et al. 2022, Table 3 (Sec. 6: interleaved schedule with 3 chunks for 175B and 530B).
# name: (layers, hidden, heads, tp, pp, vpp, micro_batch, global_batch)
TABLE3 = {
    "22B": (48, 6144, 64, 8, 1, 1, 4, 4),
    "GPT-3 175B": (96, 12288, 96, 8, 8, 3, 1, 64),
    "MT-NLG 530B": (105, 20480, 128, 8, 35, 3, 1, 280),
    "1T": (128, 25600, 160, 8, 64, 1, 1, 512),
}

# memory.csv mode -> (recompute, sequence_parallel)
MODES = {
    "no recompute, no SP": ("none", False),
    "sequence parallel + selective recompute": ("selective", True),
    "none": ("none", False),
    "sequence parallel": ("none", True),
    "selective recompute": ("selective", False),
    "seq+selective": ("selective", True),
    "full recompute": ("full", False),
}


def _rows() -> list[dict[str, str]]:
    with MEMORY_CSV.open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["source_id"] == "KORTHIKANTI2022"]


FIG1 = [r for r in _rows() if r["activations_GiB"].strip()]
FIG7 = [r for r in _rows() if "fig7" in r["config_ref"]]


def _fig7_percent(row: dict[str, str]) -> float:
    m = re.search(r"=\s*([0-9.]+)%", row["notes"])
    assert m, row["notes"]
    return float(m.group(1))


def model_of(name: str) -> ModelSpec:
    layers, hidden, heads = TABLE3[name][:3]
    return ModelSpec(name=name, layers=layers, hidden=hidden, ffn_hidden=4 * hidden, heads=heads, kv_heads=None,
                     vocab=51200, seq_len=2048, gated_mlp=False, tied_embeddings=True,
                     learned_position_embeddings=True, precision="fp16")


def cluster_of(name: str) -> ClusterSpec:
    tp, pp = TABLE3[name][3:5]
    return ClusterSpec(name=f"selene-{tp * pp}", gpu="A100-80GB", nodes=tp * pp // 8, gpus_per_node=8,
                       inter_node=InterNodeFabric(nic_bandwidth_bytes_per_s=25e9))


def plan_of(name: str, recompute: str, sp: bool) -> ParallelPlan:
    layers, _, _, tp, pp, vpp, mbs, gbs = TABLE3[name]
    return ParallelPlan(tp=tp, pp=pp, vpp=vpp, dp=1, micro_batch=mbs, global_batch=gbs, recompute=recompute,
                        sequence_parallel=sp, distributed_optimizer=False, zero_stage=0,
                        layers_per_stage=(layers // pp,) * pp, framework=FRAMEWORK)


def run(name: str, modes: list[tuple[str, bool]]) -> dict[str, np.ndarray]:
    """One estimate_arrays call for all modes of one Table 3 configuration (one column per stage)."""
    plans = [plan_of(name, rc, sp) for rc, sp in modes]
    return estimate_arrays(model_of(name), cluster_of(name), PlanArrays.from_plans(plans), framework=FRAMEWORK)


def first_stage_activations(name: str, out: dict[str, np.ndarray]) -> np.ndarray:
    """``activations_bytes`` is the first stage's. The figure counts the transformer layers only, so with
    pp=1 (first stage = last stage) the fp32 logits the model adds on the last stage are taken off."""
    act = np.asarray(out["activations_bytes"], dtype=float)
    _, _, _, tp, pp, _, mbs, _ = TABLE3[name]
    if pp == 1:
        act = act - memory.logits_bytes(model_of(name), mbs * 2048, tp)
    return act


def layer_stack_model_state(name: str, out: dict[str, np.ndarray]) -> float:
    """Weights + gradients + optimizer state per GPU as the figure counts it.

    estimate_arrays reports model state for the first stage, which also holds the embedding. With
    pp > 1 the figure's value is a stage of transformer layers only (a middle stage), so the first
    stage's state is scaled by the share of its parameters that are transformer layers (every
    parameter costs the same bytes here: dp=1, no distributed optimizer). With pp=1 the only stage
    holds the embedding, which stays in."""
    wgo = float(out["weights_bytes"][0] + out["grads_bytes"][0] + out["optimizer_bytes"][0])
    model = model_of(name)
    _, _, _, tp, pp, _, _, _ = TABLE3[name]
    if pp == 1:
        return wgo
    stage_layers = model.layers // pp * layer_params(model, False)["dense"]
    emb = embedding_params(model)["embedding"]
    return wgo * stage_layers / (stage_layers + emb)


@pytest.mark.parametrize("row", FIG1, ids=[f"{r['model_name']}|{r['mode']}" for r in FIG1])
def test_fig1_activations(row):
    """Korthikanti et al. 2022, Fig. 1: first-stage activation memory per GPU within 5 %."""
    name = row["model_name"]
    out = run(name, [MODES[row["mode"]]])
    got = first_stage_activations(name, out)[0] / GIB
    want = float(row["activations_GiB"])
    assert abs(got - want) / want <= TOL, f"{name} {row['mode']}: {got:.3f} GiB vs {want:.3f} GiB"


@pytest.mark.parametrize("row", FIG1, ids=[f"{r['model_name']}|{r['mode']}" for r in FIG1])
def test_fig1_params_plus_optimizer(row):
    """Korthikanti et al. 2022, Fig. 1: fp16 weights + fp32 gradients + fp32 Adam state (18 bytes per
    parameter) of one GPU's transformer layers within 5 %."""
    name = row["model_name"]
    out = run(name, [MODES[row["mode"]]])
    got = layer_stack_model_state(name, out) / GIB
    want = float(row["params_plus_optimizer_GiB"])
    assert abs(got - want) / want <= TOL, f"{name} {row['mode']}: {got:.3f} GiB vs {want:.3f} GiB"


def test_fig1_rows_cover_table3():
    assert {r["model_name"] for r in FIG1} == set(TABLE3)
    assert {r["mode"] for r in FIG1} == {"no recompute, no SP", "sequence parallel + selective recompute"}


@pytest.mark.parametrize("row", FIG7, ids=[f"{r['model_name']}|{r['mode']}" for r in FIG7])
def test_fig7_activation_share(row):
    """Korthikanti et al. 2022, Fig. 7: activation memory of each technique relative to the
    no-recompute, no-SP baseline, within 5 percentage points."""
    name = row["model_name"]
    out = run(name, [MODES["none"], MODES[row["mode"]]])
    act = first_stage_activations(name, out)
    got = act[1] / act[0] * 100.0
    want = _fig7_percent(row)
    assert abs(got - want) <= TOL_PTS, f"{name} {row['mode']}: {got:.2f} % vs {want:.2f} %"


def test_fig7_rows_cover_every_mode():
    assert len(FIG7) == 4 * 5
    assert {r["mode"] for r in FIG7} == {"none", "sequence parallel", "selective recompute", "seq+selective",
                                         "full recompute"}


def test_megatron_lm_2020_fp16_keeps_and_all_reduces_fp16_gradients():
    """Megatron-LM of 2020 (v1: LocalDDP without --fp32-allreduce) holds and all-reduces fp16 gradients; from
    2021 they are fp32 main gradients (Korthikanti et al. Fig. 1's 18 bytes per parameter), as they are for bf16."""
    from costmodel.catalog import get_model
    from costmodel.profiles import load_profile

    model = get_model("gpt3-175b").model_copy(update={"layers": 8, "precision": "fp16"})
    prof = load_profile("A100-80GB")
    cluster = ClusterSpec(name="a100x1024", gpu="A100-80GB", nodes=128, gpus_per_node=8, nvlink_domain_gpus=8,
                          inter_node=InterNodeFabric(nic_bandwidth_bytes_per_s=25e9))
    plans = PlanArrays.from_plans([ParallelPlan(tp=8, pp=1, dp=128, micro_batch=1, global_batch=128,
                                                recompute="full", distributed_optimizer=False, zero_stage=0)])
    out = {fw: estimate_arrays(model, cluster, plans, profile=prof, framework=fw)
           for fw in ("megatron-lm-2020", "megatron-lm-2021")}
    old, new = out["megatron-lm-2020"], out["megatron-lm-2021"]
    assert old["grads_bytes"][0] == pytest.approx(new["grads_bytes"][0] / 2, rel=1e-9)
    # The all-reduce over 128 nodes is bandwidth-bound: half the bytes, about half the time.
    assert 0.45 < old["dp_comm_exposed_s"][0] / new["dp_comm_exposed_s"][0] < 0.6
    bf16 = estimate_arrays(model.model_copy(update={"precision": "bf16"}), cluster, plans, profile=prof,
                           framework="megatron-lm-2020")
    assert bf16["grads_bytes"][0] == pytest.approx(new["grads_bytes"][0], rel=1e-9)



def _layer(model: ModelSpec, recompute: int) -> float:
    return float(memory.layer_activation_bytes(model, 8192, 8, True, recompute, True, False, False))


def test_selective_with_flash_recomputes_the_layernorm_outputs_and_the_activation():
    # An op-level selective checkpoint: the QKV and FC1 inputs (LayerNorm outputs, 2 x 2h bytes) and the
    # activation output (2f) are recomputed; megatron-core runs this only in part (costmodel.rules
    # selective_runs_as_priced), which the planner and plan check take into account.
    from costmodel.catalog import get_model

    m = get_model("70b")
    assert _layer(m, 0) - _layer(m, 1) == pytest.approx(8192 * (2 * 2 * m.hidden + 2 * m.ffn_hidden) / 8)


def test_dropout_masks_follow_the_models_dropout():
    # Dropout masks only where the model trains with dropout (GPT-3: 0.1), not by its MLP's shape (Nemotron-4's
    # ungated squared-ReLU MLP trains without): one byte per element after the attention and after the MLP
    # (Korthikanti et al. 2022 Table 2), divided by t with sequence parallelism.
    from costmodel.catalog import get_model

    gpt3 = get_model("gpt3-175b")
    no_drop = gpt3.model_copy(update={"hidden_dropout": 0.0})
    assert gpt3.hidden_dropout > 0
    assert _layer(gpt3, 0) - _layer(no_drop, 0) == pytest.approx(8192 * 2 * gpt3.hidden / 8)


def _moe_layer(model: ModelSpec, recompute: int, te: bool, grouped: bool = True) -> float:
    return float(memory.layer_activation_bytes(model, 8192, 1, False, recompute, True, True, False,
                                               te_moe_modules=te, grouped_gemm=grouped))


def test_moe_selective_on_transformer_engine_frees_what_its_recompute_modules_recompute():
    # megatron-core 0.16.1 with --recompute-modules core_attn layernorm moe_act on Transformer Engine layers:
    # the pre-MLP LayerNorm (a module of its own in a MoE layer) and the routed experts' activation; the input
    # LayerNorm is fused into the QKV GEMM (kept) unless the attention is MLA, and the shared experts' activation
    # is kept. Op by op (published rows of other stacks) both LayerNorm outputs and every activation go.
    from costmodel.catalog import get_model

    tok = 8192
    qwen = get_model("qwen3-30b-a3b")   # GQA, 8 of 128 experts, no shared expert
    h, fe, k = qwen.hidden, qwen.expert_ffn, qwen.moe_topk
    assert _moe_layer(qwen, 0, True) - _moe_layer(qwen, 1, True) == pytest.approx(tok * (2 * h + k * 2 * fe))
    assert _moe_layer(qwen, 0, False) - _moe_layer(qwen, 1, False) == pytest.approx(tok * (4 * h + k * 2 * fe))
    # without the grouped GEMM (fp16 parameters) megatron-core refuses moe_act: only the LayerNorm output goes
    assert _moe_layer(qwen, 0, True) - _moe_layer(qwen, 1, True, grouped=False) == pytest.approx(tok * 2 * h)

    dsv3 = get_model("deepseek-v3")     # MLA (input LayerNorm of its own), one shared expert
    h, fe, k = dsv3.hidden, dsv3.expert_ffn, dsv3.moe_topk
    freed_te = _moe_layer(dsv3, 0, True) - _moe_layer(dsv3, 1, True)
    freed_op = _moe_layer(dsv3, 0, False) - _moe_layer(dsv3, 1, False)
    assert freed_te == pytest.approx(tok * (4 * h + k * 2 * fe))
    assert freed_op - freed_te == pytest.approx(tok * dsv3.shared_experts * 2 * fe)
    # recompute none is the same either way
    assert _moe_layer(dsv3, 0, True) == _moe_layer(dsv3, 0, False)


def test_estimate_prices_moe_selective_as_megatron_core_runs_it_on_transformer_engine():
    # The step estimate passes the stack through: on megatron-core with Transformer Engine (H100) selective frees
    # the pre-MLP LayerNorm output and the routed activation (2h + 2k f_e a token for Qwen3-30B-A3B), on another
    # stack op by op both LayerNorm outputs as well (4h + 2k f_e): the saved activations fall by 0.8x as much.
    from costmodel.catalog import get_model
    from costmodel.profiles import load_profile

    m = get_model("qwen3-30b-a3b")
    cluster = ClusterSpec(name="h100x8", gpu="H100", nodes=1, gpus_per_node=8, nvlink_domain_gpus=8,
                          inter_node=InterNodeFabric(nic_bandwidth_bytes_per_s=50e9))
    plans = PlanArrays.from_plans([ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=64, recompute=r)
                                   for r in ("none", "selective")])
    freed = {}
    for fw in ("megatron-core", "other"):
        act = estimate_arrays(m, cluster, plans, profile=load_profile("H100"), framework=fw)["activations_bytes"]
        freed[fw] = act[0] - act[1]
    h, fe, k = m.hidden, m.expert_ffn, m.moe_topk
    assert freed["megatron-core"] / freed["other"] == pytest.approx((2 * h + 2 * k * fe) / (4 * h + 2 * k * fe))
