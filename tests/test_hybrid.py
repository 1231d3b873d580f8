"""Hybrid Mamba models (ModelSpec.hybrid_pattern: Nemotron-H, Nemotron 3): the spec, the FLOP and parameter
counts, the step estimate, the rules, Megatron's flags and the CSV reader."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from costmodel import flops
from costmodel.catalog import get_model
from costmodel.estimate import _context, compose_step, estimate_arrays, layer_terms
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import InputError, cluster_of, load_profile
from costmodel.rules import violations
from costmodel.specs import ModelSpec

H100 = load_profile("H100")
CLUSTER = cluster_of("H100", H100, 64, 8)
NANO = get_model("nemotron-3-nano")


def _step(model: ModelSpec, plan: ParallelPlan, cluster=CLUSTER) -> dict:
    return estimate_arrays(model, cluster, PlanArrays.from_plans([plan]), profile=load_profile(cluster.gpu))


def test_a_transformer_written_as_a_pattern_costs_what_the_transformer_does():
    """Llama 3 8B's 32 layers written as 64 hybrid layers, attention then MLP: the same parameters and FLOPs, and
    the same step and memory within 1% (each block's own norm and half the layer's collectives). With full
    recomputation each of the 64 blocks keeps its input, twice the transformer's checkpoints."""
    llama = get_model("8b")
    hybrid = llama.model_copy(update={"layers": 64, "hybrid_pattern": "*-" * 32})
    assert flops.total_params(hybrid) == pytest.approx(flops.total_params(llama), rel=1e-12)
    assert flops.model_flops_per_step(hybrid, 512) == pytest.approx(flops.model_flops_per_step(llama, 512), rel=1e-12)
    for plan in (ParallelPlan(tp=1, dp=64, global_batch=512, recompute="none"),
                 ParallelPlan(tp=4, dp=16, micro_batch=2, global_batch=512, recompute="none"),
                 ParallelPlan(tp=2, pp=4, dp=8, global_batch=512, recompute="full")):
        a, b = _step(llama, plan), _step(hybrid, plan)
        assert b["step_time_s"][0] == pytest.approx(a["step_time_s"][0], rel=0.01), plan
        if plan.recompute == "none":
            assert b["activations_bytes"][0] == pytest.approx(a["activations_bytes"][0], rel=0.01), plan
        else:
            assert b["activations_bytes"][0] > 1.3 * a["activations_bytes"][0]


def test_the_mean_layer_is_the_patterns_mean_and_a_stage_holds_the_pattern():
    """At pp 1 the step's layers cost exactly the sum of the pattern's layers (23 Mamba, 23 MoE, 6 attention)."""
    plan = ParallelPlan(tp=1, dp=8, ep=8, micro_batch=2, global_batch=512, recompute="none")
    a = PlanArrays.from_plans([plan])
    c = _context(NANO, CLUSTER, a, H100, "megatron-core", 1.0, None)
    lt = layer_terms(c)
    assert NANO.hybrid_counts == {"M": 23, "*": 6, "-": 0, "E": 23}
    from costmodel import estimate as E
    d = E._dense_layer(c)
    parts = {"*": E._attention_sublayer(c, d)["f"], "M": E._mamba_sublayer(c, d)["f"],
             "E": E._moe_layer(c, d, attention=False)["moe_f"]}
    total = sum(NANO.hybrid_counts[k] * np.asarray(v) for k, v in parts.items())
    assert lt.moe_f[0] * NANO.layers == pytest.approx(float(total[0]), rel=1e-12)
    # a Mamba layer costs more with more heads; the MoE layer is the one with the host floor
    wider = NANO.model_copy(update={"mamba_heads": 128})
    c2 = _context(wider, CLUSTER, a, H100, "megatron-core", 1.0, None)
    assert E._mamba_sublayer(c2, E._dense_layer(c2))["f"][0] > 1.5 * parts["M"][0]


def test_nano_and_super_count_as_published():
    """31.6B / 120B in total; the FLOPs a token costs (3x forward, attention non-causal) within 2% / 4% of what the
    Megatron-Bridge archive's model TFLOP/s per GPU and tokens per second imply for its runs (22.1-22.4 / 84.3-85.4
    GFLOP a token)."""
    sup = get_model("nemotron-3-super")
    assert flops.total_params(NANO) == pytest.approx(31.58e9, rel=1e-3)
    assert flops.total_params(sup) == pytest.approx(120.67e9, rel=1e-3)
    assert flops.model_flops_per_step(NANO, 1) / 8192 == pytest.approx(22.25e9, rel=0.02)
    assert flops.model_flops_per_step(sup, 1) / 8192 == pytest.approx(84.8e9, rel=0.04)
    # LatentMoE: the routed experts work in 1,024, not 4,096
    plain = sup.model_copy(update={"moe_latent": None})
    lost = sup.hybrid_counts["E"] * sup.num_experts * 2 * sup.expert_ffn * (4096 - 1024) - \
        sup.hybrid_counts["E"] * 2 * 4096 * 1024
    assert flops.total_params(plain) - flops.total_params(sup) == pytest.approx(lost, rel=1e-9)


@pytest.mark.parametrize("update, match", [
    ({"hybrid_pattern": "M*M"}, "3 layers, layers=52"),
    ({"hybrid_pattern": "MX" * 26}, "one character a layer"),
    ({"num_experts": 0, "moe_topk": 0}, "need num_experts"),
    ({"mamba_heads": None}, "give mamba_heads"),
    ({"mamba_groups": 7}, "does not divide mamba_heads"),
    ({"dense_layers": 2}, "dense_layers does not apply")])
def test_a_bad_pattern_is_a_one_line_error(update, match):
    with pytest.raises(ValidationError, match=match):
        ModelSpec.model_validate({**NANO.model_dump(), **update})


def test_rules_split_mamba_heads_and_groups_over_tp_and_run_no_interleaving():
    h56 = get_model("nemotron-h-56b")
    assert violations(h56, ParallelPlan(tp=8, pp=2, dp=4, global_batch=64)) == []
    bad = violations(h56, ParallelPlan(tp=16, pp=1, dp=4, global_batch=64))
    assert any("mamba_groups=8" in v and "valid tp: 1, 2, 4, 8" in v for v in bad)
    assert any("tp x cp dividing 256" in v for v in violations(h56, ParallelPlan(tp=8, cp=64, dp=1, global_batch=64)))
    bad = violations(h56, ParallelPlan(tp=8, pp=2, vpp=2, dp=4, global_batch=64))
    assert any("hybrid Mamba model" in v and "valid vpp: 1" in v for v in bad)


def test_context_parallel_mamba_layers_pay_their_all_to_alls():
    """cp 2 splits the sequence, and each Mamba-2 layer turns it into head shards and back: its cp term is an
    all-to-all each way, none at cp 1."""
    from costmodel import estimate as E

    for cp, some in ((1, False), (2, True)):
        a = PlanArrays.from_plans([ParallelPlan(tp=2, cp=cp, dp=32 // cp, global_batch=64, recompute="none")])
        c = _context(get_model("nemotron-h-8b"), CLUSTER, a, H100, "megatron-core", 1.0, None)
        m = E._mamba_sublayer(c, E._dense_layer(c))
        assert (m["cp_f"][0] > 0) == some and (m["cp_b"][0] > 0) == some


def test_megatron_flags_and_entry_script_build_the_hybrid_model(tmp_path):
    from planner.outputs import entry_script, megatron_args, write_outputs

    plan = ParallelPlan(tp=1, dp=8, ep=8, global_batch=512)
    args = megatron_args(NANO, plan)
    assert f"--hybrid-override-pattern {NANO.hybrid_pattern}" in args
    assert {"--mamba-num-heads 64", "--mamba-head-dim 64", "--mamba-state-dim 128", "--mamba-num-groups 8",
            "--position-embedding-type none", "--squared-relu", "--moe-shared-expert-intermediate-size 3712"} <= set(args)
    assert "--moe-latent-size 1024" in megatron_args(get_model("nemotron-3-super"), plan)
    assert entry_script(NANO) == "pretrain_mamba.py" and entry_script(get_model("8b")) == "pretrain_gpt.py"
    cluster = cluster_of("H100", H100, 8, 8)
    write_outputs(tmp_path, NANO, cluster, plan, None)
    launch = (tmp_path / "launch.sh").read_text()
    assert "pretrain_mamba.py" in launch and "pretrain_gpt.py" not in launch


def test_the_executor_refuses_a_hybrid_model_before_any_process_starts():
    from executor.launch import preflight

    with pytest.raises(InputError, match="hybrid Mamba model .* pretrain_mamba.py"):
        preflight(NANO, ParallelPlan(tp=1, dp=1, ep=1, global_batch=8))


def test_a_csv_row_naming_a_hybrid_model_reads_its_pattern(tmp_path):
    """A Megatron-Bridge archive row of Nemotron 3 Nano with its widths blank: the catalog's hybrid model, with
    nothing said of layers priced as attention."""
    from costmodel.validate import load_cases, predict_case
    from tests.csv_rows import write_rows

    path = write_rows(tmp_path / "n.csv", [dict(
        source_id="X", model_name="Nemotron-3-Nano", layers="", hidden="", heads="", seq_len="8192", gpu_type="H100", num_gpus="16",
        gpus_per_node="8", tp="1", pp="1", cp="1", ep="8", dp="16", global_batch="1024", micro_batch="1",
        framework="megatron-core", precision="fp8", step_time_s="36.0", scored="true")])
    cases, errors = load_cases(path)
    assert errors == [] and cases[0].model.hybrid_pattern == NANO.hybrid_pattern
    assert not any("state-space" in a for a in cases[0].assumed)
    assert any(a.startswith(f"hybrid_pattern {NANO.hybrid_pattern} (23 Mamba-2, 6 attention, 23 MoE layers; the "
                            f"catalog's nemotron-3-nano") for a in cases[0].assumed)
    pred = predict_case(cases[0])
    assert pred["fits"] and 25.0 < pred["predicted_step_time_s"] < 40.0


def test_compose_step_is_unchanged_for_transformers():
    """No transformer reads a hybrid term: the same step with or without hybrid_pattern None written out."""
    llama = get_model("70b")
    plan = PlanArrays.from_plans([ParallelPlan(tp=8, pp=4, dp=2, global_batch=64)])
    cluster = cluster_of("H100", H100, 64, 8)
    a = compose_step(llama, cluster, plan, H100)["step_time_s"]
    b = compose_step(llama.model_copy(update={"hybrid_pattern": None}), cluster, plan, H100)["step_time_s"]
    assert a[0] == b[0]


@pytest.mark.parametrize("name, want", [
    ("NemotronH-56B", "nemotron-h-56b"), ("Nemotron-H-56B-Base-8K", "nemotron-h-56b"),
    ("Nemotron Nano 2 9B", "nemotron-nano-9b-v2"), ("NVIDIA-Nemotron-Nano-12B-v2", "nemotron-nano-12b-v2"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nemotron-3-nano"), ("Nemotron 3 Super (MXFP8)", "nemotron-3-super")])
def test_a_csv_row_finds_its_hybrid_model_by_the_names_it_goes_by(name, want):
    """Published tables spell the hybrid models many ways; each is the catalog's pattern, which no column holds."""
    from costmodel.validate import _family

    assert _family(name).name == want
    assert _family("Llama3-70B") is None     # a transformer keeps the columns' reading
