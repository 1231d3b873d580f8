"""What plan validate fills in for a row that leaves fields out (costmodel/validate.py): the sharding and
sequence parallelism of a stack other than Megatron, the sharding fallback of a pipelined run that does not fit
as published, and the architecture of a catalog model whose columns are blank."""

from __future__ import annotations

import pytest

from costmodel.validate import load_cases, predict_case
from csv_rows import write_rows

# Llama 3 405B at tp8 pp16 dp64 on 8,192 H100 with 16M tokens per step (the layout of the Llama 3 paper,
# Table 4); the step time is a placeholder: these tests read what is assumed and whether it fits.
ROW = dict(source_id="X", model_name="Llama 3.1 405B", params_b="405", layers="126", hidden="16384",
           ffn_hidden="53248", heads="128", kv_heads="8", vocab="128256", seq_len="8192", moe_experts="",
           moe_topk="", gpu_type="H100", num_gpus="8192", gpus_per_node="8", tp="8", pp="16", vp="", cp="1",
           ep="", dp="64", sp="", recompute="", global_batch="2048", micro_batch="1",
           zero_stage_or_distopt="", framework="torchtitan", step_time_s="10", scored="true", notes="")


def _case(tmp_path, **upd):
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", [{**ROW, **upd}]))
    assert not errors, errors
    return cases[0]


def test_a_stack_other_than_megatron_that_names_no_sharding_shards_the_optimizer(tmp_path):
    case = _case(tmp_path)
    assert case.plan.framework == "other"
    assert (case.plan.zero_stage, case.plan.distributed_optimizer, case.plan.sequence_parallel) == (1, True, True)
    assert "zero_stage=1 (not published; optimizer state sharded over data parallelism)" in case.assumed
    assert "sequence_parallel=True" in case.assumed
    out = predict_case(case)
    assert out["fits"] and out["plan"].recompute == "none"
    assert out["predicted_peak_memory_bytes"] < 85.9e9


def test_a_pipelined_run_that_does_not_fit_unsharded_is_read_as_sharding_the_optimizer(tmp_path):
    # Said unsharded: 3.2e9 parameters per GPU with their Adam state do not fit 80 GB next to 16 micro-batches'
    # activations, so the run must have sharded the optimizer state (the only sharding that works with pp > 1).
    case = _case(tmp_path, zero_stage_or_distopt="none", sp="true", recompute="none")
    assert case.plan.zero_stage == 0
    out = predict_case(case)
    assert out["fits"] and out["plan"].zero_stage == 1 and out["plan"].pp == 16
    assert "zero_stage=1 (the published layout does not fit otherwise)" in out["assumed"]


def test_megatron_lm_before_sequence_parallelism_keeps_it_off(tmp_path):
    case = _case(tmp_path, framework="megatron-lm-2021", zero_stage_or_distopt="", num_gpus="1024", dp="8")
    assert not case.plan.sequence_parallel and case.plan.zero_stage == 0


def test_blank_architecture_columns_come_from_the_catalog_model_the_name_is(tmp_path):
    case = _case(tmp_path, model_name="Llama-3.1-70B (bf16)", layers="", hidden="", heads="", kv_heads="",
                 vocab="", ffn_hidden="", num_gpus="512", pp="4", dp="16")
    m = case.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab, m.ffn_hidden) == (80, 8192, 64, 8, 128256, 28672)
    assert ("layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, ffn_hidden=28672 "
            "(not in the row; the catalog's llama3.1-70b)") in case.assumed
    # Columns the row does give are kept.
    case = _case(tmp_path, model_name="Llama 3.1 70B", layers="", hidden="", heads="", seq_len="4096",
                 num_gpus="512", pp="4", dp="16")
    assert (case.model.layers, case.model.seq_len, case.model.ffn_hidden) == (80, 4096, 53248)


def test_blank_architecture_of_a_model_outside_the_catalog_is_an_error_naming_the_columns(tmp_path):
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", [{**ROW, "model_name": "InternLM2-20B",
                                                                    "layers": "", "hidden": ""}]))
    assert not cases
    msg = errors[0]["error"]
    assert "column(s) layers, hidden empty and model_name 'InternLM2-20B' is no catalog model" in msg
    assert "did you mean" not in msg
    _, near = load_cases(write_rows(tmp_path / "near.csv", [{**ROW, "model_name": "Mixtral 8x7", "layers": "",
                                                             "hidden": ""}]))
    assert "'Mixtral 8x7' is no catalog model to take them from (did you mean mixtral-8x7b" in near[0]["error"]
    assert "70b" in msg and "deepseek-v3" in msg


@pytest.mark.parametrize("name, want", [
    ("Falcon-180B", (80, 14848, 232, 8, 65024, 59392)), ("BLOOM 176B", (70, 14336, 112, 112, 250880, 57344)),
    ("OPT-175B", (96, 12288, 96, 96, 50272, 49152)), ("GPT-NeoX-20B", (44, 6144, 64, 64, 50432, 24576)),
    ("LLaMA-65B", (80, 8192, 64, 64, 32000, 22016)), ("DBRX", (40, 6144, 48, 8, 100352, 10752))])
def test_models_of_published_runs_outside_megatron_tables_fill_their_blank_columns(tmp_path, name, want):
    """The architectures of widely published runs (BLOOM, OPT, Falcon, GPT-NeoX, LLaMA, DBRX) are catalog models:
    a row naming one without its columns is predicted, not an error."""
    case = _case(tmp_path, model_name=name, layers="", hidden="", heads="", kv_heads="", vocab="", ffn_hidden="",
                 num_gpus="512", pp="4", dp="16", tp="8", seq_len="2048")
    m = case.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads or m.heads, m.vocab, m.expert_ffn if m.is_moe else m.ffn_hidden
            ) == want
    assert predict_case(case)["predicted_step_time_s"] > 0


def test_a_row_giving_the_columns_of_a_catalog_model_takes_its_structure(tmp_path):
    """A row naming BLOOM-176B with its shape keeps the catalog's tied embeddings, biases and rope-free positions
    where the schema's defaults for a GELU model outside the catalog would add a learned position table."""
    case = _case(tmp_path, model_name="BLOOM-176B", layers="70", hidden="14336", heads="112", kv_heads="",
                 vocab="250880", ffn_hidden="57344", num_gpus="384", tp="4", pp="12", dp="8", seq_len="2048")
    m = case.model
    assert not m.gated_mlp and m.tied_embeddings and not m.learned_position_embeddings and m.linear_bias
    outside = _case(tmp_path, model_name="BigLM-176B", layers="70", hidden="14336", heads="112", kv_heads="",
                    vocab="250880", ffn_hidden="57344", num_gpus="384", tp="4", pp="12", dp="8", seq_len="2048")
    assert outside.model.learned_position_embeddings


@pytest.mark.parametrize("name", ["LLAMA4 Maverick e128", "Llama-4-Maverick-17B-128E"])
def test_a_maverick_row_with_its_columns_keeps_the_experts_on_every_other_layer(tmp_path, name):
    """No column says where the experts sit: a row naming Llama 4 Maverick takes the catalog's placement (24 MoE
    layers of 48, dense ones 16384 wide), where a row of the same shape under another name is MoE throughout."""
    kw = dict(layers="48", hidden="5120", heads="40", kv_heads="8", vocab="202048", ffn_hidden="8192",
              moe_experts="128", moe_topk="1", num_gpus="512", tp="4", pp="1", ep="128", dp="128", seq_len="8192",
              global_batch="512")
    m = _case(tmp_path, model_name=name, **kw).model
    assert (m.moe_layers, m.ffn_hidden, m.expert_ffn, m.shared_experts) == (24, 16384, 8192, 1)
    other = _case(tmp_path, model_name="MoE-400B", **kw).model
    assert (other.moe_layers, other.moe_layer_step) == (48, 1)


@pytest.mark.parametrize("blank", ["layers", "heads"])
def test_a_row_giving_its_architecture_is_read_as_given(tmp_path, blank):
    # One blank required column with the others given still takes the catalog's value for it alone.
    case = _case(tmp_path, **{blank: ""})
    assert (case.model.layers, case.model.heads, case.model.hidden) == (126, 128, 16384)


def test_a_blank_parallel_degree_is_filled_from_the_gpu_count_or_taken_as_none(tmp_path):
    """pp blank with tp, cp and dp given: num_gpus / (tp x cp x dp); both blank with dp filling the GPUs:
    1 and 1; blank without dp: 1 (a stack naming no pipeline ran none); degrees that cannot fill the GPUs keep
    the blank, which stays an error naming the column."""
    case = _case(tmp_path, pp="")
    assert (case.plan.tp, case.plan.pp, case.plan.dp) == (8, 16, 64)
    assert "pp=16 (num_gpus / (tp x cp x dp))" in case.assumed
    case = _case(tmp_path, tp="", pp="", dp="8192", num_gpus="8192", model_name="Llama3-8B", layers="32",
                 hidden="4096", ffn_hidden="14336", heads="32", vocab="128256", global_batch="8192")
    assert (case.plan.tp, case.plan.pp, case.plan.dp) == (1, 1, 8192) and "tp=1, pp=1 (num_gpus / (cp x dp))" in case.assumed
    case = _case(tmp_path, pp="", dp="")
    assert (case.plan.tp, case.plan.pp, case.plan.dp) == (8, 1, 1024) and "pp=1 (not published)" in case.assumed
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, "pp": "", "dp": "7"}]))
    assert not cases and "column 'pp'" in errors[0]["error"]


def test_unpublished_degrees_that_cannot_hold_the_run_are_the_fastest_layout_that_fits(tmp_path):
    """NeMo's long-context tables give no TP / PP for their runs without context parallelism: Llama 2 7B at
    262,144 tokens on 256 H100 cannot hold one sequence on a GPU (tp 1, pp 1), so the run had some: the fastest
    layout that fits. A megatron-core or Megatron-LM 2021 row takes the fastest layout that fits even where tp 1,
    pp 1 fits (TUNED_DEGREES); another stack keeps tp 1, pp 1 where it fits."""
    row = dict(model_name="LLAMA2-7B long-context (no CP)", params_b="7", layers="32", hidden="4096",
               ffn_hidden="11008", heads="32", kv_heads="32", vocab="32000", seq_len="262144", num_gpus="256",
               tp="", pp="", cp="1", dp="", global_batch="16", micro_batch="", framework="megatron-core",
               precision="fp8", notes="NeMo 24.03.01, TP/PP/DP not published")
    case = _case(tmp_path, **row)
    assert case.open_degrees == ("tp", "pp") and (case.plan.tp, case.plan.pp) == (1, 1)
    out = predict_case(case)
    assert out["fits"] and out["plan"].tp * out["plan"].pp > 1
    q = out["plan"]
    assert f"tp={q.tp}, pp={q.pp}, dp={q.dp} (not published; the fastest layout that fits: a Megatron run's degrees " \
        "are tuned)" in out["assumed"]
    assert "tp=1, pp=1 (not published)" not in out["assumed"]
    # A megatron-core row that fits as read takes the fastest layout too, tp 1 and pp 1 among them (here it is).
    small = _case(tmp_path, **{**row, "seq_len": "4096", "global_batch": "512"})
    assert predict_case(small)["plan"].tp == 1 and predict_case(small)["plan"].pp == 1
    # A stack without Megatron's degrees keeps tp 1, pp 1 where that fits, and says 1 does not fit where not.
    other = predict_case(_case(tmp_path, **{**row, "framework": "torchtitan"}))
    assert f"tp={other['plan'].tp}, pp={other['plan'].pp} (not published; 1 does not fit: the fastest that fits)" \
        in other["assumed"]
    assert [(p.tp, p.pp) for p in [predict_case(_case(tmp_path, **{**row, "framework": "torchtitan", "seq_len": "4096",
                                                                    "global_batch": "512"}))["plan"]]] == [(1, 1)]
    # A row giving its degrees has none open.
    assert _case(tmp_path).open_degrees == ()


def test_unpublished_degrees_keep_the_whole_global_batch(tmp_path):
    """The Megatron-LM paper's text run (GPT-3 175B on 1,024 A100 at batch 1,536, no degree published): dp 1,024
    (tp 1, pp 1) does not divide the batch, so it is no layout the run used (megatron-core's calculator refuses
    it); the fastest layout whose dp divides the batch is taken, and the whole batch is priced."""
    row = dict(model_name="GPT-3 175B", params_b="175", layers="96", hidden="12288", ffn_hidden="49152",
               heads="96", kv_heads="96", vocab="51200", seq_len="2048", gpu_type="A100-80GB", num_gpus="1024",
               tp="", pp="", cp="", dp="", global_batch="1536", micro_batch="", framework="megatron-core",
               precision="fp16")
    out = predict_case(_case(tmp_path, **row))
    q = out["plan"]
    assert out["fits"] and 1536 % (q.dp * q.micro_batch) == 0 and q.tp * q.pp * q.dp == 1024
    assert not any("is not a multiple of dp x micro_batch" in a for a in out["assumed"])
    # A batch no dp of the GPUs divides keeps the row's own reading and says how it is priced.
    odd = predict_case(_case(tmp_path, **{**row, "global_batch": "1537"}))
    assert any("is not a multiple of dp x micro_batch" in a for a in odd["assumed"])


def test_a_run_on_part_of_a_node_has_its_unpublished_interleaving_searched(tmp_path):
    # 4 of a node's 8 H100 (the cluster is the whole node): the interleavings are checked against the row's 4
    # GPUs, not the node's 8, which refused every one of them.
    row = dict(model_name="Llama3-8B", params_b="8", layers="32", hidden="4096", ffn_hidden="14336", heads="32",
               kv_heads="8", vocab="128256", seq_len="8192", num_gpus="4", tp="1", pp="2", vp="", cp="1", dp="2",
               global_batch="64", micro_batch="1", framework="megatron-core")
    case = _case(tmp_path, **row)
    assert case.cluster.num_gpus == 8 and not case.vpp_known
    out = predict_case(case)
    assert any(a.startswith("vpp=") and "the fastest interleaving that fits" in a for a in out["assumed"])


@pytest.mark.parametrize("col, bad", [("cp", "INF"), ("pp", "inf"), ("dp", "nan"), ("num_gpus", "1e400"),
                                      ("dp", "2.5"), ("cp", "-1")])
def test_a_blank_degree_beside_a_number_that_is_not_whole_is_an_error_naming_that_number(tmp_path, col, bad):
    # The fuzzing of CI found tp blank with cp or pp 'INF' raising OverflowError instead of the row's error.
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, "tp": "", col: bad}]))
    assert not cases and f"column '{col}': expected an integer" in errors[0]["error"], errors


def test_a_degree_given_as_text_is_an_error_not_a_blank_to_fill(tmp_path):
    # 'x' in tp was read as blank and filled from the GPU count (num_gpus / (pp x cp x dp) = 8), so the row
    # calibrated and validated as if it had said tp8.
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, "tp": "x"}]))
    assert not cases and "column 'tp': expected a positive integer, got 'x'" in errors[0]["error"]
    case = _case(tmp_path, tp="n/a")   # a word for "not published" is a blank
    assert case.plan.tp == 8 and "tp=8 (num_gpus / (pp x cp x dp))" in case.assumed


# DeepSeek-V2-Lite as its Hugging Face config gives it (intermediate_size 10,944 is the dense layer's width;
# moe_intermediate_size 1,408 the experts'), 15.7B parameters; on one 8-H100 node with expert parallelism 8.
V2_LITE = dict(model_name="DeepSeek-V2-Lite", params_b="16", layers="27", hidden="2048", ffn_hidden="10944",
               heads="16", kv_heads="16", vocab="102400", seq_len="4096", moe_experts="64", moe_topk="6",
               num_gpus="8", tp="1", pp="1", cp="1", ep="8", dp="8", global_batch="256", micro_batch="1",
               framework="megatron-core", recompute="")


def test_a_moe_row_whose_ffn_hidden_is_the_dense_width_takes_the_expert_width_its_published_size_gives(tmp_path):
    case = _case(tmp_path, **V2_LITE)
    # 64 experts 10,944 wide would be 117.1B parameters; the published 16B gives experts 1,408 wide (the
    # config's moe_intermediate_size, found to the nearest 64 from params_b alone).
    assert case.model.moe_ffn_hidden == 1408
    assert any(a.startswith("moe_ffn_hidden=1408 (params_b 16: ffn_hidden 10944 as the experts' width gives "
                            "117.1B") for a in case.assumed), case.assumed
    assert predict_case(case)["fits"]
    # Without params_b the columns are read as given: experts 10,944 wide, which cannot fit one node.
    case = _case(tmp_path, **{**V2_LITE, "params_b": ""})
    assert case.model.moe_ffn_hidden == 10944 and not predict_case(case)["fits"]


def test_a_published_size_decides_a_gated_mlp_the_name_does_not_name(tmp_path):
    # OLMoE-1B-7B's shape (SwiGLU experts, 6.9B parameters) under a name that names no gated family: a 2-matrix
    # MLP would make it 4.7B. (Named OLMoE, its family says gated.)
    olmoe = dict(V2_LITE, model_name="SparseLM-1B-7B", params_b="7", layers="16", ffn_hidden="1024",
                 vocab="50304", moe_experts="64", moe_topk="8")
    assert _case(tmp_path, **{**olmoe, "model_name": "OLMoE-1B-7B", "params_b": ""}).model.gated_mlp
    case = _case(tmp_path, **olmoe)
    assert case.model.gated_mlp and case.model.moe_ffn_hidden == 1024
    assert "gated_mlp=True (params_b 7: 6.9B so, 4.7B with gated_mlp=False)" in case.assumed
    # A size within 25% of the columns' (a nominal "7B" for 6.7B) changes nothing, nor a size neither reading
    # gives (a layer-reduced proxy of a larger model).
    for size in ("5.5", "0.5"):
        case = _case(tmp_path, **{**olmoe, "params_b": size})
        assert not case.model.gated_mlp and not any("params_b" in a for a in case.assumed)


@pytest.mark.parametrize("text, named", [("AC", "full"), ("full AC", "full"), ("SAC", "selective"),
                                         ("op-level SAC", "selective"), ("Selective AC", "selective"),
                                         ("activation checkpointing", "full"), ("off", "none"),
                                         ("activation recomputation", "full"), ("partition activations", "full"),
                                         ("remat", "full")])
def test_recompute_spellings_of_other_stacks(tmp_path, text, named):
    # torchtitan's names: full activation checkpointing 'AC', selective 'SAC' (op-level); before, 'AC' and 'SAC'
    # were read as unknown and took the fastest setting that fits.
    case = _case(tmp_path, recompute=text)
    assert case.recompute_known and case.plan.recompute == named


def test_a_node_smaller_than_the_profiles_nvlink_domain_is_its_own_domain(tmp_path):
    # Summit's nodes hold 6 V100s: the row was a ClusterSpec error (an 8-GPU domain over 6-GPU nodes). Nodes of
    # 4 A100s (JUWELS Booster, Perlmutter) were merged in pairs into one 8-GPU NVLink domain, so tp 8 crossed
    # the network for free.
    summit = dict(model_name="GPT-2 2.5B", params_b="", layers="52", hidden="1920", ffn_hidden="7680", heads="24",
                  kv_heads="24", vocab="51200", seq_len="2048", gpu_type="V100-16GB", num_gpus="768",
                  gpus_per_node="6", tp="6", pp="1", cp="1", dp="128", global_batch="1536", micro_batch="2",
                  framework="megatron-lm-2021", recompute="full")
    case = _case(tmp_path, **summit)
    assert (case.cluster.gpus_per_node, case.cluster.nvlink_domain_gpus, case.cluster.nodes) == (6, 6, 128)
    assert predict_case(case)["predicted_step_time_s"] > 0
    # A V100-32GB row in 8-GPU nodes (DGX-1, AWS p3dn): the profile's 16-GPU domain is DGX-2's, so the row's node
    # is its own domain. This was a ClusterSpec error (8-GPU domain over 4-GPU "trays", a rule for NVL racks).
    dgx1 = _case(tmp_path, **{**summit, "gpu_type": "V100-32GB", "gpus_per_node": "8", "num_gpus": "64", "tp": "8",
                              "dp": "8", "global_batch": "512"})
    assert (dgx1.cluster.gpus_per_node, dgx1.cluster.nvlink_domain_gpus, dgx1.cluster.nodes) == (8, 8, 8)
    dgx2 = _case(tmp_path, **{**summit, "gpu_type": "V100-32GB", "gpus_per_node": "", "num_gpus": "64", "tp": "8",
                              "dp": "8", "global_batch": "512"})
    assert dgx2.cluster.nvlink_domain_gpus == 16
    a100 = dict(model_name="Llama 2 13B", params_b="13", layers="40", hidden="5120", ffn_hidden="13824", heads="40",
                kv_heads="40", vocab="32000", seq_len="4096", gpu_type="A100-40GB", num_gpus="64",
                gpus_per_node="4", pp="1", cp="1", global_batch="256", micro_batch="1", framework="megatron-core",
                recompute="full")
    tp4, tp8 = (_case(tmp_path, **a100, tp=tp, dp=str(64 // int(tp))) for tp in ("4", "8"))
    assert tp4.cluster.nvlink_domain_gpus == tp8.cluster.nvlink_domain_gpus == 4
    # tp 8 over two 4-GPU nodes puts every layer's tensor-parallel collectives on the network.
    assert predict_case(tp8)["predicted_step_time_s"] > 1.15 * predict_case(tp4)["predicted_step_time_s"]


@pytest.mark.parametrize("metric, value, step_s", [
    ("tokens/s/GPU", "1024", 2048 * 8192 / (1024 * 8192)), ("Tokens per second per GPU", "2048", 1.0),
    ("tok/s/gpu", "2048", 1.0), ("throughput (tokens/s)", str(2048 * 8192), 1.0), ("samples/s", "1024", 2.0),
    ("step time (ms)", "1500", 1.5), ("elapsed time per iteration (ms)", "1500", 1.5), ("sec/iter", "3", 3.0),
    ("time per step (s)", "3", 3.0), ("it/s", "0.5", 2.0)])
def test_measured_metric_spellings_give_the_step_time(tmp_path, metric, value, step_s):
    # Row: global batch 2048 sequences of 8192 tokens on 8192 GPUs.
    case = _case(tmp_path, step_time_s="", measured_metric=metric, measured_value=value)
    assert case.published_step_time_s == pytest.approx(step_s)


@pytest.mark.parametrize("metric", ["TFLOPS/GPU", "model TFLOP/s per GPU", "MFU", "Iteration time", "throughput"])
def test_a_metric_that_needs_a_flop_convention_or_a_unit_gives_no_step_time(tmp_path, metric):
    cases, errors = load_cases(write_rows(tmp_path / "runs.csv", [{**ROW, "step_time_s": "", "measured_metric": metric,
                                                                   "measured_value": "400"}]))
    assert not cases and "does not give a step time" in errors[0]["error"]


@pytest.mark.parametrize("text", ["O2", "apex O2", "Apex AMP O1", "FP16 (O2)"])
def test_apex_amp_levels_are_fp16(tmp_path, text):
    # Apex AMP's opt levels (Megatron-LM 2019-2021, DeepSpeed-era papers) are fp16 mixed precision; 'O2' was an
    # invalid precision before.
    case = _case(tmp_path, precision=text)
    assert case.model.precision == "fp16" and f"precision=fp16 (from {text!r})" in case.assumed


def test_a_blank_ffn_hidden_of_a_model_outside_the_catalog_takes_the_width_its_published_size_gives(tmp_path):
    # A Llama-style (gated) 13B without its ffn width: 4h would make it 17.1B; params_b 13 gives 13,824, Llama 2
    # 13B's width. A params_b that 4h already gives within 25% leaves 4h.
    row = dict(model_name="Llama-style 13B", params_b="13", layers="40", hidden="5120", ffn_hidden="", heads="40",
               kv_heads="40", vocab="32000", seq_len="4096", num_gpus="64", tp="8", pp="1", cp="1", dp="8",
               global_batch="512", micro_batch="1")
    case = _case(tmp_path, **row)
    assert case.model.ffn_hidden == 13824
    assert ("ffn_hidden=13824 (not in the row; params_b 13: 4h would give 17.1B, 13824 gives 13.0B)"
            in case.assumed)
    case = _case(tmp_path, **{**row, "params_b": "16"})
    assert case.model.ffn_hidden == 4 * 5120 and "ffn_hidden=4h" in case.assumed


def test_an_expert_parallelism_no_run_can_have_takes_the_largest_that_divides(tmp_path):
    # Mixtral's 8 experts over ep 16, and Qwen3-30B-A3B's ep 32 on 16 GPUs: megatron-core splits the experts evenly
    # over ep ranks drawn from tp x cp x dp. The rows were priced with half an expert per rank before.
    mixtral = dict(model_name="Mixtral-8x22B", params_b="141", layers="56", hidden="6144", ffn_hidden="16384",
                   heads="48", kv_heads="8", vocab="32768", seq_len="4096", moe_experts="8", moe_topk="2",
                   num_gpus="256", tp="4", pp="4", cp="1", ep="16", dp="16", global_batch="1024",
                   micro_batch="1", framework="megatron-core")
    case = _case(tmp_path, **mixtral)
    assert case.plan.ep == 8
    assert "ep=8 (the row's ep=16 does not divide the 8 experts and the 64 tp x cp x dp ranks)" in case.assumed
    assert _case(tmp_path, **{**mixtral, "ep": "8"}).plan.ep == 8
    qwen = dict(mixtral, model_name="Qwen3-30B-A3B", params_b="30", layers="48", hidden="2048", ffn_hidden="768",
                heads="32", kv_heads="4", vocab="151936", moe_experts="128", moe_topk="8", num_gpus="16", tp="1",
                pp="1", ep="32", dp="16")
    assert _case(tmp_path, **qwen).plan.ep == 16
    # A dense model has no expert parallelism, whatever the column says.
    assert _case(tmp_path, ep="8").plan.ep == 1


def test_an_unpublished_expert_parallelism_is_the_fastest_that_fits(tmp_path):
    # DeepSeek-V3 on 256 GB200 with the experts on every GPU (Megatron's default ep=1) holds 671B parameters per
    # pipeline stage's worth of layers: it cannot fit, so a run that ran split them; the fastest split that fits.
    dsv3 = dict(model_name="DeepSeek-V3", params_b="671", layers="61", hidden="7168", ffn_hidden="2048", heads="128",
                kv_heads="", vocab="", seq_len="4096", moe_experts="256", moe_topk="8", gpu_type="GB200",
                num_gpus="256", gpus_per_node="4", tp="1", pp="4", vp="4", cp="1", ep="", dp="64",
                global_batch="2048", micro_batch="1", framework="megatron-core")
    case = _case(tmp_path, **dsv3)
    assert not case.ep_known and case.plan.ep == 1 and "ep=1 (not published)" in case.assumed
    out = predict_case(case)
    assert out["fits"] and out["plan"].ep > 1
    assert f"ep={out['plan'].ep} (not published; the fastest that fits)" in out["assumed"]
    assert "ep=1 (not published)" not in out["assumed"]
    assert predict_case(_case(tmp_path, **{**dsv3, "ep": "1"}))["fits"] is False
    # A published ep, and a dense model's blank one, are taken as they are.
    assert _case(tmp_path, **{**dsv3, "ep": "32"}).ep_known
    assert _case(tmp_path).ep_known


def test_a_known_models_blank_widths_come_from_the_catalog_where_its_shape_agrees(tmp_path):
    # Llama 2 70B is GQA (8 key-value heads) with Llama's 32,000-token vocabulary: a blank read by the schema's
    # defaults would be MHA with Megatron's 51,200 tokens.
    llama = dict(model_name="LLAMA2-70B (SFT)", params_b="70", layers="80", hidden="8192", ffn_hidden="",
                 heads="64", kv_heads="", vocab="", num_gpus="64", tp="4", pp="4", dp="4", global_batch="128")
    case = _case(tmp_path, **llama)
    assert (case.model.kv_heads, case.model.vocab, case.model.ffn_hidden) == (8, 32000, 28672)
    assert ("kv_heads=8, vocab=32000, ffn_hidden=28672 (not in the row; the catalog's llama2-70b, whose hidden and "
            "heads the row gives)") in case.assumed
    # A proxy with fewer layers is its model's shape: Llama 3.1 405B cut to 7 layers on 32 H100 (DGX Cloud's
    # proxy rows) fits with the 405B's widths; read as 4h MLP sized to params_b 405 it did not.
    proxy = dict(model_name="Llama3.1-405B (proxy, 7 layers)", layers="7", ffn_hidden="", kv_heads="", vocab="",
                 num_gpus="32", tp="8", pp="1", cp="2", dp="2", global_batch="126", framework="megatron-core")
    case = _case(tmp_path, **proxy)
    assert (case.model.layers, case.model.ffn_hidden, case.model.kv_heads, case.model.vocab) == (7, 53248, 8, 128256)
    assert predict_case(case)["fits"]
    # A name whose shape disagrees (GPT-2 8B is not Llama 3 8B; '8b' alone names no family) keeps the defaults.
    gpt2 = dict(model_name="GPT-2 8B (8.67B)", params_b="8.3", layers="72", hidden="3072", ffn_hidden="",
                heads="24", kv_heads="", vocab="", num_gpus="8", tp="8", pp="1", dp="1", global_batch="512")
    case = _case(tmp_path, **gpt2)
    assert case.model.kv_heads is None and not any("catalog" in a for a in case.assumed)
    assert _case(tmp_path, **{**llama, "hidden": "4096"}).model.kv_heads is None
    # A MoE model's blank expert columns: without them DeepSeek-V3 would be read as dense (and its router groups
    # refused); with them it is the catalog's 256 experts, top-8.
    dsv3 = dict(model_name="DeepSeek-V3", params_b="671", layers="61", hidden="7168", ffn_hidden="", heads="128",
                kv_heads="", vocab="", moe_experts="", moe_topk="", num_gpus="256", tp="1", pp="8", ep="32",
                dp="32", global_batch="2048", framework="megatron-core")
    m = _case(tmp_path, **dsv3).model
    assert (m.num_experts, m.moe_topk, m.expert_ffn, m.vocab) == (256, 8, 2048, 129280)


def test_an_unpublished_expert_tensor_parallelism_is_what_the_stack_defaults_to(tmp_path):
    # megatron-core splits the experts over the tensor-parallel group unless told otherwise
    # (expert_tensor_parallel_size None -> tensor_model_parallel_size); Megatron-Bridge's recipes set 1.
    grok = dict(model_name="Grok-1 314B", params_b="314", layers="64", hidden="6144", ffn_hidden="32768",
                heads="48", kv_heads="8", vocab="131072", seq_len="8192", moe_experts="8", moe_topk="2",
                num_gpus="512", tp="4", pp="8", vp="8", cp="2", ep="8", dp="8", global_batch="1024",
                micro_batch="1", framework="megatron-core", notes="dgxc-benchmarking v24.11.1")
    case = _case(tmp_path, **grok)
    assert case.plan.etp == 4
    assert "etp=4 (megatron-core's default, the tensor-parallel size, where a run sets none)" in case.assumed
    assert _case(tmp_path, **{**grok, "notes": "Megatron-Bridge docs/performance-summary.md"}).plan.etp == 1
    assert _case(tmp_path, **{**grok, "notes": "ETP=2"}).plan.etp == 2
    assert _case(tmp_path, **{**grok, "framework": "torchtitan"}).plan.etp == 1
    assert _case(tmp_path, **{**grok, "tp": "1", "dp": "32"}).plan.etp == 1
    # ep x etp must divide the tp x cp x dp ranks of a stage: 8 x 4 does not divide 4 x 1 x 4.
    small = _case(tmp_path, **{**grok, "num_gpus": "128", "cp": "1", "dp": "4", "global_batch": "256"})
    assert small.plan.etp == 2
    assert ("etp=2 (megatron-core's default, the tensor-parallel size, where a run sets none; 4 x ep 8 does not "
            "divide the 16 tp x cp x dp ranks)") in small.assumed
    # A dense model has none.
    assert _case(tmp_path, framework="megatron-core").plan.etp == 1


@pytest.mark.parametrize("upd, want, said", [
    # Thousands separators, as tables print GPU counts and batches.
    (dict(num_gpus="8,192"), dict(num_gpus=8192, global_batch=2048, seq_len=8192), None),
    # k multiples of counts are binary: 8k tokens are 8,192, 16K GPUs 16,384 (dp 128).
    (dict(seq_len="8k"), dict(num_gpus=8192, global_batch=2048, seq_len=8192), "seq_len=8192 (from '8k')"),
    (dict(num_gpus="16K", dp="128", global_batch="4096"), dict(num_gpus=16384, global_batch=4096, seq_len=8192),
     "num_gpus=16384 (from '16K')"),
    # A batch in tokens (the Llama 3 paper's 16M): sequences of the row's length, the reading (binary or
    # decimal M) that gives whole sequences.
    (dict(global_batch="16M tokens"), dict(num_gpus=8192, global_batch=2048, seq_len=8192),
     "global_batch=2048 sequences of 8192 tokens (from '16M tokens')"),
    (dict(global_batch="16,777,216 tokens"), dict(num_gpus=8192, global_batch=2048, seq_len=8192),
     "global_batch=2048 sequences of 8192 tokens (from '16,777,216 tokens')"),
    (dict(global_batch="3.15M tokens", seq_len="2048", dp="64"), dict(num_gpus=8192, global_batch=1538, seq_len=2048),
     "global_batch=1538 sequences of 2048 tokens (from '3.15M tokens')"),
    # A blank GPU count where every degree is given is their product.
    (dict(num_gpus=""), dict(num_gpus=8192, global_batch=2048, seq_len=8192), "num_gpus=8192 (tp x pp x cp x dp)"),
])
def test_numbers_as_tables_print_them(tmp_path, upd, want, said):
    case = _case(tmp_path, **upd)
    got = dict(num_gpus=case.plan.tp * case.plan.pp * case.plan.cp * case.plan.dp,
               global_batch=case.plan.global_batch, seq_len=case.model.seq_len)
    assert got == want
    assert said is None or said in case.assumed, case.assumed


@pytest.mark.parametrize("bad", ["1,5", "8 or 16", "many", "8 x 8 x 8"])
def test_a_number_no_table_convention_reads_stays_an_error(tmp_path, bad):
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, "num_gpus": bad}]))
    assert not cases and f"column 'num_gpus': expected a positive integer, got {bad!r}" in errors[0]["error"]


@pytest.mark.parametrize("text, named", [
    ("Megatron-LM v1.1", "megatron-lm-2020"), ("Megatron-LM v2.5", "megatron-lm-2021"),
    ("Megatron-LM v3.0", "megatron-lm-2021"), ("Megatron-LM core_r0.9.0", "megatron-core"),
    ("Megatron-LM 23.08", "megatron-core"), ("megatron-lm-v4.0", "megatron-core")])
def test_megatron_lm_release_tags_name_their_generation(tmp_path, text, named):
    assert _case(tmp_path, framework=text).plan.framework == named


def test_an_unpublished_micro_batch_of_a_sharded_or_unpipelined_other_stack_is_the_fastest_that_fits(tmp_path):
    """FSDP / ZeRO-3 gathers the weights again for every micro-batch, and a stack other than Megatron without a
    pipeline splits its per-device batch only when it does not fit, so a blank micro-batch there is the fastest
    that fits, not Megatron's 1. OPT-175B's layout (metaseq FSDP + tp8 on 992 A100, 2M tokens per step, no
    micro-batch published) was predicted at 14% MFU with micro-batch 1 (39 of its 51 s gathering weights)."""
    opt = dict(ROW, model_name="OPT-175B", params_b="175", layers="96", hidden="12288", ffn_hidden="49152",
               heads="96", kv_heads="", vocab="50272", seq_len="2048", gpu_type="A100-80GB", num_gpus="992", tp="8",
               pp="1", cp="", dp="124", global_batch="1024", micro_batch="", zero_stage_or_distopt="FSDP",
               framework="metaseq")
    blank = _case(tmp_path, **opt)
    assert not blank.micro_batch_known and not any(a.startswith("micro_batch=1 (Megatron") for a in blank.assumed)
    got = predict_case(blank)
    # 1024 // 124 = 8 sequences per rank: the whole of it, one micro-batch.
    assert got["plan"].micro_batch == 8 and got["fits"]
    assert "micro_batch=8 (not published; the fastest that fits: weights gathered per micro-batch)" in got["assumed"]
    one = predict_case(_case(tmp_path, **{**opt, "micro_batch": "1"}))
    assert one["plan"].micro_batch == 1 and one["predicted_step_time_s"] > 3 * got["predicted_step_time_s"]
    # A Megatron-LM run of 2021-2022 keeps Megatron's default; a megatron-core one (whose published recipes set
    # it per model and GPU, 1 to 8) takes the fastest that fits too.
    megatron = _case(tmp_path, framework="megatron-lm-2021", micro_batch="", zero_stage_or_distopt="none")
    assert megatron.micro_batch_known and megatron.plan.micro_batch == 1
    assert "micro_batch=1 (Megatron default)" in megatron.assumed
    core = _case(tmp_path, framework="megatron-core", micro_batch="")
    assert not core.micro_batch_known
    got = predict_case(core)
    assert got["fits"] and f"micro_batch={got['plan'].micro_batch} (not published; the fastest that fits: a tuned " \
        "recipe)" in got["assumed"]


def test_a_row_that_fits_no_way_is_priced_as_the_option_nearest_to_fitting(tmp_path):
    """A published run ran, so where no option the row leaves open fits, the one needing the least memory is the
    nearest to how it ran (before: the last, here the largest micro-batch); the row says none fits. A 500B model
    without tensor parallelism under ZeRO-3 on 512 V100: one layer's gathered weights (8 GB in fp16) do not fit
    beside the rest at any micro-batch (ZeRO-Infinity's memory-centric tiling, which splits that layer, is not
    modelled)."""
    row = dict(ROW, model_name="GPT 500B", params_b="500", layers="125", hidden="18432", ffn_hidden="", heads="144",
               kv_heads="", vocab="50257", seq_len="1024", gpu_type="V100-32GB", num_gpus="512", gpus_per_node="16",
               tp="1", pp="1", cp="", dp="512", global_batch="2048", micro_batch="", zero_stage_or_distopt="ZeRO-3",
               framework="deepspeed", notes="")
    got = predict_case(_case(tmp_path, **row))
    assert not got["fits"] and got["plan"].micro_batch == 1 and got["plan"].recompute == "full"
    assert "micro_batch=1 (not published; the least memory: none fits: weights gathered per micro-batch)" \
        in got["assumed"]
    assert "recompute=full (least memory: none fits)" in got["assumed"]
    assert 34.4e9 < got["predicted_peak_memory_bytes"] < 80e9
    # Where the GPU holds it and the host does not (a 13B model's CPU Adam state, 16 bytes a parameter, split
    # over tp 2 on two nodes of one V100 each with the profile's 96 GiB of host memory a GPU), the row says so.
    small = dict(row, model_name="GPT-2 10B", params_b="10", layers="50", hidden="4096", heads="32", num_gpus="1",
                 gpus_per_node="1", dp="1", global_batch="10", micro_batch="10", zero_stage_or_distopt="ZeRO-Offload")
    two = dict(small, params_b="13", layers="64", num_gpus="2", tp="2", global_batch="2", micro_batch="1")
    got = predict_case(_case(tmp_path, **two))
    assert not got["fits"] and got["predicted_peak_memory_bytes"] < 34.4e9
    assert any(a.startswith("host memory: 105 GB offloaded per GPU, above the 82 GB its share of a 1-GPU node's")
               for a in got["assumed"])
    # A single GPU whose 164 GB of offloaded state a 1-GPU node's share does not hold sat in a server of the usual
    # size (the row's gpus_per_node counts the GPUs the run used): it is priced there, as with the column blank;
    # on a 16-GPU node (a DGX-2, as the ZeRO-Offload paper's single-GPU runs) the host holds it as well.
    got = predict_case(_case(tmp_path, **small))
    assert got["fits"] and got["assumed"][-1] == ("gpus_per_node=8 (the host memory of a 1-GPU node does not hold "
                                                  "the offloaded state: the run's GPUs in a 8-GPU server)")
    blank = predict_case(_case(tmp_path, **dict(small, gpus_per_node="")))
    assert got["predicted_step_time_s"] == pytest.approx(blank["predicted_step_time_s"], rel=1e-12)
    assert predict_case(_case(tmp_path, **dict(small, gpus_per_node="16")))["fits"]


@pytest.mark.parametrize("text, zero", [
    ("ZeRO", 1), ("DeepSpeed ZeRO", 1), ("ZeRO (stage 1)", 1), ("zero_optimization stage 1", 1), ("ZeRO stage-2", 2),
    ("ZeRO-Offload", 2), ("ZeRO++", 3), ("ZeRO-Infinity", 3), ("FSDP SHARD_GRAD_OP", 2), ("FSDP NO_SHARD", 0),
    ("FSDP FULL_SHARD", 3), ("FSDP", 3), ("ZeRO-3 + CPU offload", 3)])
def test_sharding_spellings_of_other_stacks(tmp_path, text, zero):
    # pp 1 so that every stage is possible (ZeRO-2/3 and FSDP need no pipeline); 8B on 64 H100, 4 sequences per rank.
    case = _case(tmp_path, model_name="Llama 3.1 8B", layers="", hidden="", ffn_hidden="", heads="", kv_heads="",
                 vocab="", num_gpus="64", tp="1", pp="1", dp="64", global_batch="256", micro_batch="4",
                 zero_stage_or_distopt=text, framework="DeepSpeed")
    assert case.plan.zero_stage == zero


def test_a_non_megatron_stack_of_2022_or_before_runs_attention_unfused(tmp_path):
    """GPT-NeoX-20B's layout (tp2 pp4 on 96 A100-40GB, 2022): a stack other than Megatron whose row names 2022
    ran before FlashAttention reached it, so its attention goes through HBM as Megatron-LM's 2021 generation
    runs it, without sequence parallelism; the same row naming 2023 keeps flash attention."""
    neox = dict(ROW, model_name="GPT-NeoX-20B", params_b="20", layers="44", hidden="6144", ffn_hidden="24576",
                heads="64", kv_heads="", vocab="50432", seq_len="2048", gpu_type="A100-40GB", num_gpus="96", tp="2",
                pp="4", cp="", dp="12", global_batch="1536", micro_batch="4", zero_stage_or_distopt="ZeRO-1",
                framework="gpt-neox", source_id="BLACK2022")
    old = _case(tmp_path, **neox)
    assert old.plan.framework == "other-2022" and not old.plan.sequence_parallel
    assert "framework=other-2022 ('gpt-neox': a stack other than Megatron, in 2022: attention unfused, no " \
           "sequence parallelism)" in old.assumed
    new = _case(tmp_path, **{**neox, "source_id": "X", "notes": "rerun 2022 layout in 2023"})
    assert new.plan.framework == "other" and new.plan.sequence_parallel
    slow, fast = predict_case(old)["predicted_step_time_s"], predict_case(new)["predicted_step_time_s"]
    assert slow > 1.2 * fast
    # A Megatron row keeps its own generation whatever the year.
    assert _case(tmp_path, **{**neox, "framework": "megatron-core"}).plan.framework == "megatron-core"


def test_a_2022_layout_that_fits_only_with_memory_efficient_attention_had_it(tmp_path):
    """BLOOM-176B's layout (tp4 pp12 dp8, micro-batch 2 on 384 A100-80GB) written with no recomputation: unfused
    attention scores and activations without sequence parallelism would need 169 GB, so the run that ran had a
    memory-efficient kernel; it is priced as framework other, as a row naming no year would be."""
    bloom = dict(ROW, model_name="BLOOM-176B", params_b="176", layers="70", hidden="14336", ffn_hidden="57344",
                 heads="112", kv_heads="", vocab="250880", seq_len="2048", gpu_type="A100-80GB", num_gpus="384",
                 tp="4", pp="12", cp="", dp="8", global_batch="2048", micro_batch="2", recompute="none",
                 zero_stage_or_distopt="ZeRO-1", framework="Megatron-DeepSpeed", source_id="BLOOM2022")
    case = _case(tmp_path, **bloom)
    assert case.plan.framework == "other-2022"
    got = predict_case(case)
    assert got["fits"] and got["plan"].framework == "other" and got["plan"].sequence_parallel
    assert "framework=other (the published layout fits only with memory-efficient attention and sequence " \
           "parallelism)" in got["assumed"]
    undated = predict_case(_case(tmp_path, **{**bloom, "source_id": "BLOOM"}))
    assert got["predicted_step_time_s"] == pytest.approx(undated["predicted_step_time_s"])


@pytest.mark.parametrize("upd, step_s", [
    (dict(step_time_s="3.2 s"), 3.2), (dict(step_time_s="3200 ms"), 3.2), (dict(step_time_s="3.2s"), 3.2),
    # The unit in the value cell, where the metric column names none (row: 2048 x 8192 tokens on 8192 GPUs).
    (dict(step_time_s="", measured_metric="throughput", measured_value="1,024 tokens/s/GPU"), 2.0),
    (dict(step_time_s="", measured_metric="Iteration time", measured_value="1500 ms"), 1.5),
    (dict(step_time_s="", measured_metric="tokens/s/GPU", measured_value="2.048k"), 1.0),
    (dict(step_time_s="", measured_metric="throughput", measured_value="8.388608M tokens/s"), 2.0)])
def test_a_measured_figure_written_with_its_unit(tmp_path, upd, step_s):
    case = _case(tmp_path, **upd)
    assert case.published_step_time_s == pytest.approx(step_s)
    raw = upd["step_time_s"] or upd["measured_value"]
    assert any(note.endswith(f"(from {raw!r})") for note in case.assumed), case.assumed


@pytest.mark.parametrize("upd", [dict(step_time_s="3.2 parsecs"), dict(step_time_s="", measured_metric="MFU",
                                                                        measured_value="40 %")])
def test_a_figure_with_a_unit_that_gives_no_step_time_stays_an_error(tmp_path, upd):
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, **upd}]))
    assert not cases and "step_time_s" in errors[0]["error"], errors


@pytest.mark.parametrize("upd, field, want", [
    (dict(tp="TP=8"), "tp", 8), (dict(tp="8-way"), "tp", 8), (dict(tp="8 (SP)"), "tp", 8), (dict(pp="PP16"), "pp", 16),
    (dict(pp="16 (interleaved 4)"), "vpp", 4), (dict(micro_batch="1 (GA 16)"), "micro_batch", 1),
    (dict(global_batch="2048 seqs"), "global_batch", 2048), (dict(global_batch="2048 (16M tokens)"), "global_batch", 2048),
    (dict(global_batch="16Mi tokens"), "global_batch", 2048), (dict(num_gpus="1024 nodes"), "num_gpus", 8192),
    (dict(num_gpus="1024x8"), "num_gpus", 8192), (dict(num_gpus="8,192 (1,024 nodes)"), "num_gpus", 8192),
    (dict(dp="auto"), "dp", 64), (dict(pp="16, vpp 4"), "vpp", 4), (dict(num_gpus="1024 x 8 GPUs"), "num_gpus", 8192), (dict(cp="\u2014"), "cp", 1), (dict(gpus_per_node="8 GPUs"), "num_gpus", 8192),
    (dict(vp="interleaved (2)"), "vpp", 2), (dict(vp="virtual stages: 4"), "vpp", 4), (dict(cp="ring (2)"), "cp", 2),
    (dict(cp="ulysses: 2"), "cp", 2), (dict(tp="4*"), "tp", 4), (dict(num_gpus="8,192\u2020"), "num_gpus", 8192),
    (dict(seq_len="8K tokens", global_batch="2048"), "seq_len", 8192)])
def test_a_count_written_with_words_around_it(tmp_path, upd, field, want):
    case = _case(tmp_path, **upd)
    got = case.cluster.num_gpus if field == "num_gpus" else case.model.seq_len if field == "seq_len" \
        else getattr(case.plan, field)
    assert got == want, case.assumed
    raw = next(iter(upd.values()))
    assert any(f"(from {raw!r}" in note or f"(from pp {raw!r})" in note for note in case.assumed), case.assumed


def test_a_tp_cell_that_says_sequence_parallelism_sets_a_blank_sp(tmp_path):
    # Megatron-LM 2021 ran tp without sequence parallelism unless a row says otherwise.
    assert not _case(tmp_path, tp="8", sp="", framework="megatron-lm-2021").plan.sequence_parallel
    on = _case(tmp_path, tp="8 (SP)", sp="", framework="megatron-lm-2021")
    assert on.plan.sequence_parallel and "sp=true (from tp '8 (SP)')" in on.assumed
    # A given sp column decides; a tp cell without the words leaves the row's own reading.
    off = _case(tmp_path, tp="8 (SP)", sp="false")
    assert not off.plan.sequence_parallel and not any(a.startswith("sp=true") for a in off.assumed)
    assert not any(a.startswith("sp=true (from tp") for a in _case(tmp_path, tp="8-way", sp="").assumed)


@pytest.mark.parametrize("raw", ["10 s/iter", "~10", "about 10 seconds", "10,000 ms per step", "10s per iteration"])
def test_an_approximate_or_per_iteration_step_time(tmp_path, raw):
    assert _case(tmp_path, step_time_s=raw).published_step_time_s == pytest.approx(10.0)


@pytest.mark.parametrize("upd", [dict(tp="TP"), dict(num_gpus="many"), dict(pp="x4")])
def test_a_count_without_a_number_stays_an_error(tmp_path, upd):
    cases, errors = load_cases(write_rows(tmp_path / "bad.csv", [{**ROW, **upd}]))
    col = next(iter(upd))
    assert not cases and f"column '{col}'" in errors[0]["error"], errors


@pytest.mark.parametrize("metric, value", [("tokens/s/GPU (k)", "1.024"), ("Tokens/s/GPU (thousands)", "1.024"),
                                           ("throughput (millions of tokens/s)", "8.388608"), ("tokens/s (M)", "8.388608"),
                                           ("iteration time (ms)", "2000")])
def test_a_multiple_in_the_metric_name(tmp_path, metric, value):
    # The row: 2048 sequences of 8192 tokens on 8192 GPUs, 2 s a step.
    case = _case(tmp_path, step_time_s="", measured_metric=metric, measured_value=value)
    assert case.published_step_time_s == pytest.approx(2.0)


def test_a_published_layout_that_cannot_hold_its_activations_as_written_saved_them(tmp_path):
    # Llama-3-8B, micro-batch 4 of 8,192 tokens, no recomputation: about 150 GB of activations on an 80 GB H100.
    # The run ran, so it recomputed (or the row says less than it did): the fastest recompute that fits.
    row = dict(ROW, model_name="Llama 3 8B", params_b="8", layers="32", hidden="4096", ffn_hidden="14336", heads="32",
               num_gpus="64", tp="1", pp="1", dp="64", global_batch="256", micro_batch="4", recompute="none")
    case = _case(tmp_path, **row)
    assert case.recompute_known and case.plan.recompute == "none"
    got = predict_case(case)
    assert got["fits"] and got["plan"].recompute != "none"
    assert got["assumed"][-1].endswith("(the published layout does not fit with recompute=none as the row says)")
    assert not any(a.endswith("(fastest that fits)") for a in got["assumed"])


def test_a_blank_precision_is_the_format_the_notes_name(tmp_path):
    case = _case(tmp_path, precision="", notes="NeMo 24.09, FP8 (delayed scaling) with bf16 master weights")
    assert case.model.precision == "fp8"
    assert "precision=fp8 (the precision column is blank; the name or notes say so)" in case.assumed
    assert _case(tmp_path, precision="", notes="Megatron-Bridge 26.02, MXFP8 recipe").model.precision == "mxfp8"
    # Nothing said: Megatron's bf16, as before.
    case = _case(tmp_path, precision="", notes="")
    assert case.model.precision == "bf16" and "precision=bf16" in case.assumed


def test_a_megatron_lm_2020_row_with_sharded_weights_and_no_micro_batch_leaves_it_open(tmp_path):
    # Megatron-LM 2020 fills a blank micro-batch with the whole per-rank batch; with ZeRO-3 the micro-batch is
    # left to predict_case instead, and the filled-in default is dropped whatever it said (it used to raise).
    case = _case(tmp_path, framework="megatron-lm-2020", model_name="GPT 8.3B", params_b="8.3", layers="72",
                 hidden="3072", ffn_hidden="12288", heads="32", kv_heads="32", vocab="51200", seq_len="1024",
                 gpu_type="V100-32GB", num_gpus="512", gpus_per_node="16", tp="8", pp="1", dp="64",
                 global_batch="512", micro_batch="", zero_stage_or_distopt="ZeRO-3", precision="fp16")
    assert case.plan.zero_stage == 3 and not case.micro_batch_known
    assert not [a for a in case.assumed if a.startswith("micro_batch=")]
    out = predict_case(case)
    assert out["fits"] and 64 * out["plan"].micro_batch <= 512
    assert any(a.startswith("micro_batch=") and "not published" in a for a in out["assumed"])


def test_a_row_the_model_fails_on_is_reported_and_the_others_still_predicted(tmp_path, monkeypatch):
    import costmodel.validate as v

    real = v.row_plan

    def fails_on_405b(row, model, framework, assumed):
        if model.layers == 126:
            raise RuntimeError("boom")
        return real(row, model, framework, assumed)

    monkeypatch.setattr(v, "row_plan", fails_on_405b)
    small = {**ROW, "model_name": "Llama 3 8B", "params_b": "8", "layers": "32", "hidden": "4096",
             "ffn_hidden": "14336", "heads": "32", "vocab": "128256", "num_gpus": "64", "tp": "1", "pp": "1",
             "dp": "64", "global_batch": "128"}
    out = v.validate(write_rows(tmp_path / "runs.csv", [ROW, small]))
    bad, good = out["rows"]
    assert bad["predicted_step_time_s"] is None
    assert bad["error"].startswith(f"{tmp_path / 'runs.csv'}: row 0: unexpected RuntimeError at ")
    assert "boom" in bad["error"] and v.UNEXPECTED in bad["error"] and "\n" not in bad["error"]
    assert good["error"] is None and good["predicted_step_time_s"] > 0


@pytest.mark.parametrize("gpu, precision, note", [
    ("A100-80GB", "fp8", "precision=fp8 priced at bf16 rates (A100-80GB has no fp8 tensor cores)"),
    ("H100", "mxfp8", "precision=mxfp8 priced at fp8 rates (H100 has no mxfp8 tensor cores)"),
    ("H100", "nvfp4", "precision=nvfp4 priced at fp8 rates (H100 has no nvfp4 tensor cores)")])
def test_a_precision_the_gpu_has_no_tensor_cores_for_is_priced_at_the_next_wider_and_said(tmp_path, gpu, precision,
                                                                                         note):
    case = _case(tmp_path, model_name="Llama 3.1 8B", layers="", hidden="", ffn_hidden="", heads="", kv_heads="",
                 vocab="", gpu_type=gpu, num_gpus="64", tp="1", pp="1", dp="64", global_batch="256",
                 framework="megatron-core", precision=precision)
    assert note in case.assumed
    assert not [a for a in _case(tmp_path, model_name="Llama 3.1 8B", layers="", hidden="", ffn_hidden="",
                                 heads="", kv_heads="", vocab="", gpu_type="B200", num_gpus="64", tp="1", pp="1",
                                 dp="64", global_batch="256", precision=precision).assumed if "tensor cores" in a]


# The ZeRO paper's largest layout (Rajbhandari et al. 2019, arXiv:1910.02054): a 170B GPT with Megatron's tensor
# parallelism over a 16-V100 DGX-2 node and ZeRO-2 over 25 of them, activation checkpoints kept (step time a
# placeholder). ZeRO-3 did not exist then; the paper's ZeRO-R partitions the checkpoints over the tp ranks.
ZERO_2019 = dict(ROW, source_id="ZERO_2019", model_name="GPT 170B", params_b="170", layers="212", hidden="8192",
                 ffn_hidden="32768", heads="32", kv_heads="", vocab="50257", seq_len="1024", gpu_type="V100-32GB",
                 num_gpus="400", gpus_per_node="16", tp="16", pp="1", cp="", dp="25", recompute="full",
                 global_batch="1600", micro_batch="", zero_stage_or_distopt="ZeRO-2", framework="DeepSpeed",
                 precision="fp16")


def test_a_named_zero_stage_is_kept_while_what_the_row_leaves_open_can_make_it_fit(tmp_path):
    """A row naming its ZeRO stage ran that stage: where it does not fit as read, the activation checkpoints
    partitioned over the tensor-parallel ranks (DeepSpeed's partition_activations, priced as sequence
    parallelism; the row leaves that open) come before a higher stage. Before, the 170B layout was read as ZeRO-3,
    its weights gathered over InfiniBand for every micro-batch: 768 s a step against 98 s."""
    case = _case(tmp_path, **ZERO_2019)
    assert case.stage_named and case.plan.zero_stage == 2 and not case.plan.sequence_parallel
    got = predict_case(case)
    assert got["fits"] and got["plan"].zero_stage == 2 and got["plan"].sequence_parallel
    assert got["plan"].framework == "other-2022"   # attention still unfused in 2019
    assert any(a.startswith("sequence_parallel=True (the published layout fits only with its activation "
                            "checkpoints partitioned") for a in got["assumed"])
    assert 80 < got["predicted_step_time_s"] < 120
    # The same layout with the stage left to a default (DeepSpeed's ZeRO without a stage is stage 1) is sharded
    # further first, as before.
    unnamed = _case(tmp_path, **{**ZERO_2019, "zero_stage_or_distopt": "ZeRO"})
    assert not unnamed.stage_named
    got = predict_case(unnamed)
    assert got["fits"] and got["plan"].zero_stage == 3 and got["predicted_step_time_s"] > 5 * 98
    assert "zero_stage=3 (the published layout does not fit otherwise)" in got["assumed"]


def test_a_named_zero_stage_that_fits_no_other_way_is_raised_last(tmp_path):
    """Where nothing the row leaves open fits with the stage it names (here the layout of a 340B GPT on the same
    nodes, far beyond what ZeRO-2 can hold), the run ran with more sharding: the stage is raised."""
    case = _case(tmp_path, **{**ZERO_2019, "model_name": "GPT 340B", "params_b": "340", "layers": "424"})
    assert case.stage_named
    got = predict_case(case)
    assert got["fits"] and got["plan"].zero_stage == 3
    assert "zero_stage=3 (the published layout does not fit otherwise)" in got["assumed"]


@pytest.mark.parametrize("text, named", [
    ("zero-2", True), ("zero stage 1", True), ("zero_optimization stage 3", True), ("2", True),
    ("shard_grad_op", True), ("no_shard", True), ("zero", False), ("distributed optimizer", False),
    ("fsdp", False), ("zero-infinity (nvme offload)", False), ("", False)])
def test_which_sharding_columns_name_their_stage(text, named):
    from costmodel.validate import stage_named

    assert stage_named(text) is named


@pytest.mark.parametrize("text, framework, named", [
    ("22B (seq-par + selective recompute)", "megatron-lm-2021", True),
    ("--sequence-parallel --tp 8", "megatron-lm-2021", True),
    ("SP=True", "megatron-core", True),
    ("without sequence parallelism", "megatron-core", False),
    ("no seq-par", "megatron-lm-2021", False),
    ("sp=false", "megatron-core", False),
    ("GPT-3 175B (full recompute)", "megatron-lm-2021", None),
    ("SP 8", "megatron-core", None),          # a bare SP with a number: not this switch
    ("sparse attention", "megatron-core", None),
    ("sequence parallelism (DeepSpeed-Ulysses)", "megatron-core", None),
    ("seq-par", "other", None),               # other stacks: often Ulysses or context parallelism
    ("seq-par", "megatron-lm-2020", None)])   # before sequence parallelism existed
def test_sequence_parallelism_named_in_a_megatron_rows_name_or_notes(text, framework, named):
    from costmodel.validate import sequence_parallel_named

    assert sequence_parallel_named(text, framework) is named


def test_a_blank_sequence_parallel_column_takes_what_the_name_says(tmp_path):
    """Korthikanti et al.'s rows name sequence parallelism in the model name ('seq-par + selective recompute');
    with the sp column blank, Megatron-LM 2021-2022's default (off) priced GPT-3 175B 1.29x slow and MT-NLG 1.41x,
    the name read 0.97x and 0.98x, as with the column given."""
    row = dict(ROW, source_id="KORTHIKANTI2022", model_name="GPT-3 175B (seq-par + selective recompute)",
               params_b="175", layers="96", hidden="12288", ffn_hidden="49152", heads="96", kv_heads="",
               vocab="51200", seq_len="2048", gpu_type="A100-80GB", num_gpus="64", tp="8", pp="8", vp="3", dp="1",
               sp="", recompute="selective", global_batch="64", micro_batch="1", framework="megatron-lm-2021",
               precision="fp16")
    blank = _case(tmp_path, **row)
    assert blank.plan.sequence_parallel and "sequence_parallel=True (from the name or notes)" in blank.assumed
    given = _case(tmp_path, **{**row, "sp": "true"})
    assert predict_case(blank)["predicted_step_time_s"] == predict_case(given)["predicted_step_time_s"]
    off = _case(tmp_path, **{**row, "model_name": "GPT-3 175B"})
    assert not off.plan.sequence_parallel and "sequence_parallel=False" in off.assumed


def test_a_global_batch_the_ranks_do_not_divide_says_how_it_is_priced(tmp_path):
    """megatron-core refuses such a run; a published row may still give one (a rounded batch, a data-parallel size
    counted another way). It is priced with megatron-core's count of micro-batches, and the row says so."""
    got = predict_case(_case(tmp_path, model_name="Llama 3.1 8B", layers="", hidden="", ffn_hidden="", heads="",
                             kv_heads="", vocab="", num_gpus="96", tp="1", pp="1", dp="96", global_batch="1000",
                             micro_batch="1", framework="megatron-core"))
    assert got["plan"].num_microbatches == 10
    assert "global_batch=1000 is not a multiple of dp x micro_batch = 96: priced as 10 micro-batches a rank (960 " \
        "sequences), as megatron-core's calculator counts them" in got["assumed"]
    even = predict_case(_case(tmp_path, model_name="Llama 3.1 8B", layers="", hidden="", ffn_hidden="", heads="",
                              kv_heads="", vocab="", num_gpus="96", tp="1", pp="1", dp="96", global_batch="960",
                              micro_batch="1", framework="megatron-core"))
    assert not [a for a in even["assumed"] if "not a multiple" in a]


def test_a_row_giving_dp_but_neither_tp_nor_pp_takes_the_fastest_split_of_their_product(tmp_path):
    """Llama 3 70B on 64 H100 with dp 4: tp x pp = 16 (before, the blank tp was the row's error). Each split is a
    case of its own, read as if the row gave it; the prediction is the fastest that fits."""
    from costmodel.validate import product_splits

    row = dict(ROW, model_name="Llama 3 70B", params_b="70", layers="80", hidden="8192", ffn_hidden="28672",
               heads="64", kv_heads="8", vocab="128256", num_gpus="64", tp="", pp="", dp="4", global_batch="128",
               framework="megatron-core")
    assert product_splits(row) == [(1, 16), (2, 8), (4, 4), (8, 2)]
    case = _case(tmp_path, **row)
    assert [(c.plan.tp, c.plan.pp) for c in case.alternatives] == [(1, 16), (2, 8), (4, 4), (8, 2)]
    got = predict_case(case)
    each = {(c.plan.tp, c.plan.pp): predict_case(c) for c in case.alternatives}
    best = min((k for k, g in each.items() if g["fits"]), key=lambda k: each[k]["predicted_step_time_s"])
    assert (got["plan"].tp, got["plan"].pp) == best and got["fits"]
    assert got["predicted_step_time_s"] == each[best]["predicted_step_time_s"]
    assert f"tp={best[0]}, pp={best[1]} (not published; tp x pp = 16 from num_gpus / (cp x dp), split the fastest " \
        "way that fits)" in got["assumed"]
    # A row giving one of them, or neither and no dp, is read as before.
    assert product_splits({**row, "tp": "8"}) == [] and product_splits({**row, "dp": ""}) == []
    assert product_splits({**row, "dp": "64"}) == []                  # tp x pp = 1
    assert product_splits({**row, "dp": "5"}) == []                   # 64 GPUs do not divide


def test_the_shared_runs_with_tp_and_pp_blanked_are_read_back_to_their_published_split(tmp_path):
    """Over the shared CSV's scored rows with tp and pp blanked (dp kept), the fastest split that fits is the
    published one for most rows and the error stays near the published layouts' (7.61%)."""
    import csv
    import statistics
    from pathlib import Path

    from costmodel.validate import validate

    src = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"
    with src.open() as f:
        rows = list(csv.DictReader(f))
    out = validate(write_rows(tmp_path / "blank.csv", [dict(r, tp="", pp="") for r in rows]))
    scored = [r for r in out["rows"] if r["ape"] is not None]
    assert len(scored) == 342 and not [r for r in out["rows"] if r["error"]]
    assert statistics.mean(r["ape"] for r in scored) < 8.0
    split = [r for r in scored if int(rows[r["row"]]["tp"]) * int(rows[r["row"]]["pp"]) > 1]
    same = [r for r in split if any(a.startswith(f"tp={rows[r['row']]['tp']}, pp={rows[r['row']]['pp']} (not published")
                                    for a in r["assumed"])]
    assert len(split) == 232 and len(same) >= 180
    # The row reports the split predicted, not the first one read.
    assert all(r["pp"] == int(rows[r["row"]]["pp"]) for r in same)


def test_the_shared_runs_with_no_degree_published_take_the_fastest_megatron_layout(tmp_path):
    """With tp, pp and dp all blanked in the shared CSV, a Megatron row (megatron-core, Megatron-LM 2021) takes the
    fastest layout that fits: read as tp 1, pp 1 first (a stack without them), those rows were 88.5% (Megatron-LM
    2021) and 33.6% (megatron-core) off; the 2020 stack and Paxml keep that reading."""
    import csv
    import statistics
    from pathlib import Path

    from costmodel.validate import validate

    src = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"
    with src.open() as f:
        rows = list(csv.DictReader(f))
    out = validate(write_rows(tmp_path / "blank.csv", [dict(r, tp="", pp="", dp="") for r in rows]))
    scored = [r for r in out["rows"] if r["ape"] is not None]
    assert len(scored) == 342 and all(r["fits"] for r in scored)
    by_stack = {}
    for r in scored:
        by_stack.setdefault(rows[r["row"]]["framework"], []).append(r["ape"])
    assert statistics.mean(by_stack["megatron-lm-2021"]) < 15 and statistics.mean(by_stack["megatron-core"]) < 26


def test_a_row_none_of_whose_tp_x_pp_splits_can_be_read_says_what_is_wrong_with_it(tmp_path):
    """Where every split fails for the row's own fault (here its GPU), the error names that, not the blank tp."""
    from costmodel.validate import load_cases as read

    row = dict(ROW, model_name="Llama 3 70B", params_b="70", layers="80", hidden="8192", ffn_hidden="28672",
               heads="64", kv_heads="8", vocab="128256", num_gpus="64", tp="", pp="", dp="4", global_batch="128",
               framework="megatron-core", gpu_type="MI300X")
    cases, errors = read(write_rows(tmp_path / "runs.csv", [row]))
    assert not cases and "unknown GPU type 'MI300X'" in errors[0]["error"] and "column 'tp'" not in errors[0]["error"]


def test_a_tf32_run_is_priced_on_the_tf32_tensor_cores_with_fp32_tensors(tmp_path):
    """TF32 keeps fp32 weights and activations and runs the GEMMs at the TF32 rate: on A100 (156 of bf16's 312
    TFLOP/s) between the bf16 and the fp32 (CUDA-core, 19.5 TFLOP/s) readings, with fp32's memory; on V100, which
    has no TF32 tensor cores, the fp32 reading itself."""
    row = dict(model_name="GPT-3 1.3B", params_b="1.3", layers="24", hidden="2048", ffn_hidden="8192", heads="16",
               kv_heads="16", vocab="51200", seq_len="2048", gpu_type="A100-80GB", num_gpus="8", tp="1", pp="1",
               dp="8", global_batch="64", micro_batch="4", recompute="full", framework="megatron-core")
    got = {(g, p): predict_case(_case(tmp_path, **{**row, "gpu_type": g, "precision": p}))
           for g in ("A100-80GB", "V100-32GB") for p in ("bf16", "tf32", "fp32")}
    t = {k: v["predicted_step_time_s"] for k, v in got.items()}
    assert t["A100-80GB", "bf16"] < t["A100-80GB", "tf32"] < t["A100-80GB", "fp32"] / 3
    assert t["V100-32GB", "tf32"] == t["V100-32GB", "fp32"]
    mem = {k: v["predicted_peak_memory_bytes"] for k, v in got.items()}
    assert mem["A100-80GB", "tf32"] == mem["A100-80GB", "fp32"] > mem["A100-80GB", "bf16"]


def test_a_row_naming_a_hybrid_mamba_model_is_priced_as_its_layers_and_says_so(tmp_path):
    """A row naming a catalog hybrid (Nemotron-H 8B) is that model, Mamba layers and all; one naming a hybrid the
    catalog does not hold (Jamba) is still predicted, as a transformer of its layers, and its assumptions say so; a
    Nemotron-4 row is not such a model."""
    from costmodel.catalog import catalog

    row = dict(model_name="Nemotron-H 8B", params_b="8", layers="52", hidden="4096", ffn_hidden="21504", heads="32",
               kv_heads="8", vocab="131072", seq_len="8192", num_gpus="8", tp="1", pp="1", dp="8",
               global_batch="64", micro_batch="1", framework="megatron-core")
    hybrid = _case(tmp_path, **row)
    assert hybrid.model.hybrid_pattern == catalog()["nemotron-h-8b"].hybrid_pattern
    assert not any("state-space" in a for a in hybrid.assumed) and predict_case(hybrid)["fits"]
    case = _case(tmp_path, **{**row, "model_name": "Jamba 8B"})
    assert case.model.hybrid_pattern is None
    assert any(a.startswith("model_name names a model with state-space or linear-attention layers ('Jamba')")
               and "52 layers" in a for a in case.assumed)
    assert predict_case(case)["fits"]
    plain = _case(tmp_path, **{**row, "model_name": "Nemotron-4 15B"})
    assert not any("state-space" in a for a in plain.assumed)
