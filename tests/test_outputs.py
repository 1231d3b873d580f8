"""planner/outputs.py: Megatron flags round-trip into the same plan, the launchers are valid bash that
hand exactly those flags to torchrun, and write_outputs writes its four files atomically."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from costmodel import memory
from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.profiles import InputError, load_cluster
from costmodel.rules import check_plan
from costmodel.plan import ParallelPlan
from planner import outputs
from planner.outputs import (
    OUTPUT_FILES,
    launch_script,
    layout_from_layers_per_stage,
    megatron_args,
    parse_layout,
    parse_megatron_args,
    sbatch_script,
    write_outputs,
)

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash not installed")


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("h100x512")


def flags(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("#")]


def flag_value(args: list[str], flag: str) -> str | None:
    for a in flags(args):
        name, _, value = a.partition(" ")
        if name == flag:
            return value
    raise KeyError(flag)


def round_trip(model, plan, num_gpus, **kw) -> ParallelPlan:
    args = megatron_args(model, plan, **kw)
    return ParallelPlan(**parse_megatron_args(args, num_gpus=num_gpus))


# name -> (model, precision, plan fields); every plan is valid for Megatron's rules on 512 GPUs.
CASES = {
    "dense-mha-7b": ("7b", None, dict(tp=4, pp=2, dp=64, global_batch=512)),
    "dense-gpt3-learned-tied": ("gpt3-175b", None, dict(tp=8, pp=8, dp=8, global_batch=1536)),
    "gqa-70b": ("70b", None, dict(tp=8, pp=4, dp=16, global_batch=512)),
    "gqa-70b-no-sp-no-distopt": ("70b", None, dict(tp=8, pp=4, dp=16, global_batch=512, sequence_parallel=False,
                                                   distributed_optimizer=False, zero_stage=0,
                                                   recompute="none")),
    "tp1-fp16": ("7b", "fp16", dict(tp=1, pp=8, dp=64, global_batch=512)),
    "moe-mixtral-ep-etp": ("mixtral-8x7b", None, dict(tp=4, pp=2, dp=64, ep=8, etp=1, global_batch=1024)),
    "moe-mixtral-etp2": ("mixtral-8x7b", "mxfp8", dict(tp=2, pp=4, dp=64, ep=4, etp=2, global_batch=1024)),
    "mla-deepseek-v3": ("deepseek-v3", "fp8", dict(tp=2, pp=8, dp=32, ep=64, etp=1, global_batch=1024,
                                                   layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6))),
    "cp-70b": ("70b", "nvfp4", dict(tp=8, pp=4, cp=2, dp=8, global_batch=512)),
    "vpp-70b": ("70b", None, dict(tp=8, pp=4, vpp=5, dp=16, global_batch=512)),
    "vpp-pp2-70b": ("70b", None, dict(tp=8, pp=2, vpp=4, dp=32, global_batch=512)),
    "full-recompute-n-layers": ("70b", None, dict(tp=8, pp=8, dp=8, global_batch=512, recompute="full",
                                                  recompute_layers=4)),
    "full-recompute-n-layers-vpp": ("70b", None, dict(tp=8, pp=4, vpp=2, dp=16, global_batch=512,
                                                      recompute="full", recompute_layers=6)),
    "full-recompute-all": ("70b", None, dict(tp=8, pp=4, dp=16, global_batch=512, recompute="full")),
    "selective": ("70b", None, dict(tp=8, pp=4, dp=16, global_batch=512, recompute="selective")),
    "zero3-fsdp": ("8b", None, dict(tp=1, pp=1, dp=512, global_batch=1024, zero_stage=3)),
    "tp-pp-dp-order": ("8b", None, dict(tp=1, pp=4, dp=128, global_batch=1024, rank_order="tp-cp-ep-pp-dp")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flags_round_trip_into_the_same_plan(case, cluster):
    name, precision, fields = CASES[case]
    model = get_model(name, precision=precision)
    plan = ParallelPlan(**fields)
    check_plan(model, plan, cluster.num_gpus)  # the cases are plans Megatron accepts
    args = megatron_args(model, plan)
    assert ParallelPlan(**parse_megatron_args(args, num_gpus=cluster.num_gpus)) == plan
    # the text file form and an argv-style token list parse the same way
    text = "\n".join(args) + "\n"
    assert ParallelPlan(**parse_megatron_args(text, num_gpus=cluster.num_gpus)) == plan
    argv = [tok for a in flags(args) for tok in a.split(" ", 1)]
    assert ParallelPlan(**parse_megatron_args(argv, num_gpus=cluster.num_gpus)) == plan
    # one flag (and at most one value) per item, every flag written once
    names = [a.split(" ", 1)[0] for a in flags(args)]
    assert all(n.startswith("--") for n in names)
    assert len(names) == len(set(names)), names


def test_model_shape_flags():
    m = get_model("70b")
    args = megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512))
    for f, v in [("--num-layers", "80"), ("--hidden-size", "8192"), ("--ffn-hidden-size", "28672"),
                 ("--num-attention-heads", "64"), ("--num-query-groups", "8"), ("--seq-length", "8192"),
                 ("--max-position-embeddings", "8192"), ("--position-embedding-type", "rope"),
                 ("--normalization", "RMSNorm"), ("--micro-batch-size", "1"), ("--global-batch-size", "512")]:
        assert flag_value(args, f) == v, f
    for f in ("--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights", "--bf16",
              "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer", "--overlap-grad-reduce",
              "--overlap-param-gather"):
        assert flag_value(args, f) == "", f
    assert "--kv-channels" not in " ".join(args)  # head_dim = hidden / heads
    assert not any(a.startswith("--vocab-size") for a in args)
    assert any(a.startswith("#") and "128256" in a for a in args)  # vocab only as a comment

    gpt3 = megatron_args(get_model("gpt3-175b"), ParallelPlan(tp=8, pp=8, dp=8, global_batch=1536))
    assert flag_value(gpt3, "--position-embedding-type") == "learned_absolute"
    assert flag_value(gpt3, "--normalization") == "LayerNorm"
    joined = " ".join(gpt3)
    assert "--swiglu" not in joined and "--untie-embeddings" not in joined and "--group-query" not in joined


def test_moe_and_mla_flags():
    ds = get_model("deepseek-v3")
    plan = ParallelPlan(tp=2, pp=8, dp=32, ep=64, global_batch=1024, layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6))
    args = megatron_args(ds, plan)
    for f, v in [("--num-experts", "256"), ("--moe-router-topk", "8"), ("--moe-ffn-hidden-size", "2048"),
                 ("--moe-shared-expert-intermediate-size", "2048"), ("--moe-layer-freq", "([0]*3+[1]*58)"),
                 ("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "hybridep"),
                 ("--q-lora-rank", "1536"), ("--kv-lora-rank", "512"),
                 ("--qk-head-dim", "128"), ("--qk-pos-emb-head-dim", "64"), ("--v-head-dim", "128"),
                 ("--kv-channels", "128"), ("--expert-model-parallel-size", "64"),
                 ("--expert-tensor-parallel-size", "1")]:
        assert flag_value(args, f) == v, f
    assert flag_value(args, "--multi-latent-attention") == ""
    assert flag_value(args, "--moe-grouped-gemm") == ""
    # the fused permutation the fitted MoE factors assume (Megatron-Bridge sets it); it needs Transformer Engine
    assert flag_value(args, "--moe-permute-fusion") == ""
    assert "--moe-permute-fusion" not in megatron_args(ds, plan, transformer_engine=False)
    assert "--moe-permute-fusion" not in megatron_args(get_model("70b"), ParallelPlan(tp=8, pp=4, dp=16,
                                                                                      global_batch=512))
    assert "--group-query-attention" not in " ".join(args)
    # the uneven split becomes a layout, and the layout parses back into the split
    layout = flag_value(args, "--pipeline-model-parallel-layout")
    assert parse_layout(layout, 8) == (1, (7, 8, 8, 8, 8, 8, 8, 6))

    mix = megatron_args(get_model("mixtral-8x7b"), ParallelPlan(tp=4, pp=2, dp=64, ep=8, global_batch=1024))
    assert flag_value(mix, "--num-experts") == "8"
    assert "--moe-layer-freq" not in " ".join(mix) and "--moe-shared-expert" not in " ".join(mix)
    # without --expert-tensor-parallel-size Megatron takes etp = tp
    no_etp = [a for a in mix if not a.startswith("--expert-tensor-parallel-size")]
    assert parse_megatron_args(no_etp, num_gpus=512)["etp"] == 4


def test_moe_dispatcher_is_the_one_the_estimate_prices():
    """Expert parallelism gets the flex dispatcher (one copy of a token per destination GPU, as
    costmodel/comm.py prices it); without expert parallelism, or with capacity padding (which DeepEP does not
    do), alltoall, and a note says the dispatch will be slower than estimated."""
    qwen = get_model("qwen3-30b-a3b")
    ep8 = megatron_args(qwen, ParallelPlan(tp=1, pp=1, ep=8, dp=8, global_batch=64))
    assert (flag_value(ep8, "--moe-token-dispatcher-type"), flag_value(ep8, "--moe-flex-dispatcher-backend")) \
        == ("flex", "hybridep")
    ep1 = megatron_args(qwen, ParallelPlan(tp=2, pp=1, ep=1, dp=4, global_batch=64))
    assert flag_value(ep1, "--moe-token-dispatcher-type") == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in " ".join(ep1)
    assert not any(a.startswith("# alltoall") for a in ep1)
    drop = megatron_args(qwen.model_copy(update={"moe_token_drop": True}),
                         ParallelPlan(tp=1, pp=1, ep=8, dp=8, global_batch=64))
    assert flag_value(drop, "--moe-token-dispatcher-type") == "alltoall"
    assert any(a.startswith("# alltoall dispatcher: capacity padding") for a in drop)


def test_pipeline_and_recompute_flags():
    m = get_model("70b")
    vpp = megatron_args(m, ParallelPlan(tp=8, pp=4, vpp=5, dp=16, global_batch=512))
    assert flag_value(vpp, "--num-virtual-stages-per-pipeline-rank") == "5"
    assert "--pipeline-model-parallel-layout" not in " ".join(vpp)
    # the older spelling parses to the same vpp
    old = [a for a in vpp if "num-virtual-stages" not in a] + ["--num-layers-per-virtual-pipeline-stage 4"]
    assert parse_megatron_args(old)["vpp"] == 5
    # Megatron's uneven first/last stage flags parse too
    fl = flags(megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)))
    fl += ["--decoder-first-pipeline-num-layers 18", "--decoder-last-pipeline-num-layers 22"]
    assert parse_megatron_args(fl)["layers_per_stage"] == (18, 20, 20, 22)

    pp2 = megatron_args(m, ParallelPlan(tp=8, pp=2, vpp=4, dp=32, global_batch=512))
    assert "--no-overlap-p2p-communication" not in [a.split(" ")[0] for a in flags(pp2)]
    assert any(a.startswith("#") and "pp=2" in a for a in pp2)

    full = megatron_args(m, ParallelPlan(tp=8, pp=8, dp=8, global_batch=512, recompute="full", recompute_layers=4))
    assert (flag_value(full, "--recompute-granularity"), flag_value(full, "--recompute-method"),
            flag_value(full, "--recompute-num-layers")) == ("full", "block", "4")
    full_vpp = megatron_args(m, ParallelPlan(tp=8, pp=4, vpp=2, dp=16, global_batch=512, recompute="full",
                                             recompute_layers=6))
    assert flag_value(full_vpp, "--recompute-num-layers") == "3"  # per virtual chunk
    all_layers = megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, recompute="full"))
    assert (flag_value(all_layers, "--recompute-method"), flag_value(all_layers, "--recompute-num-layers")) == \
        ("uniform", "1")
    sel = megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512))
    assert flag_value(sel, "--recompute-granularity") == "selective"
    assert "--recompute-method" not in " ".join(sel) and "--recompute-num-layers" not in " ".join(sel)
    none = megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, recompute="none"))
    assert "--recompute" not in " ".join(none)
    with pytest.raises(InputError, match="vpp=2"):
        megatron_args(m, ParallelPlan(tp=8, pp=4, vpp=2, dp=16, global_batch=512, recompute="full",
                                      recompute_layers=5))


@pytest.mark.parametrize("precision,expected", [
    ("bf16", ["--bf16"]),
    ("fp16", ["--fp16"]),
    ("fp8", ["--bf16", "--fp8-format hybrid", "--fp8-recipe tensorwise"]),
    ("mxfp8", ["--bf16", "--fp8-format e4m3", "--fp8-recipe mxfp8"]),
    ("nvfp4", ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"]),
    ("fp32", []),
    ("tf32", []),
])
def test_precision_flags(precision, expected):
    args = megatron_args(get_model("8b", precision=precision), ParallelPlan(tp=2, dp=256, global_batch=512))
    got = [a for a in flags(args) if a.split(" ")[0] in ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe",
                                                           "--fp4-format", "--fp4-recipe")]
    assert got == expected
    # TF32 has no Megatron flag: the note says what the training script must set for the GEMMs the estimate prices.
    assert ("torch.backends.cuda.matmul.allow_tf32 = True" in "\n".join(args)) == (precision == "tf32")
    if precision == "fp8":
        delayed = megatron_args(get_model("8b", precision="fp8"), ParallelPlan(tp=2, dp=256, global_batch=512),
                                fp8_recipe="delayed")
        assert flag_value(delayed, "--fp8-recipe") == "delayed"


def megatron_grad_bytes(args: list[str]) -> int:
    """Bytes per parameter of the gradient buffer Megatron-LM core_v0.16 allocates for these flags: validate_args
    sets accumulate_allreduce_grads_in_fp32 for --bf16 unless --grad-reduce-in-bf16, and training.py builds
    DistributedDataParallelConfig(grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32); otherwise the
    buffer has the parameters' dtype (distributed_data_parallel.py: ``torch.float if grad_reduce_in_fp32 else
    param.dtype``)."""
    names = {a.split(" ")[0] for a in flags(args)}
    half = "--bf16" in names or "--fp16" in names
    fp32_grads = "--accumulate-allreduce-grads-in-fp32" in names or (
        "--bf16" in names and "--grad-reduce-in-bf16" not in names)
    return 4 if fp32_grads or not half else 2


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32", "fp8", "mxfp8"])
def test_gradient_buffer_is_the_one_the_estimate_prices(precision, cluster):
    # Megatron-LM's bf16 default is an fp32 gradient buffer: a 70B tp4 plan priced at 2 bytes per parameter would
    # allocate 35 GB more than its estimate. The flags written must give the buffer the estimate counts.
    model = get_model("70b", precision=precision)
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)
    mem = estimate(model, cluster, plan).memory_breakdown_bytes
    weight_bytes = memory.WEIGHT_BYTES * (2 if precision == "fp32" else 1)   # fp8 weights of a sharded plan: 2
    local_params = mem["weights"] / weight_bytes
    assert mem["grads"] / local_params == pytest.approx(megatron_grad_bytes(megatron_args(model, plan)))
    if precision != "fp32":
        assert mem["grads"] / local_params == pytest.approx(2.0)


def megatron_weight_bytes(args: list[str]) -> int:
    """Bytes per parameter an FP8 run's module weights take on a Hopper GPU for these flags: with --fp8-param-gather
    the weight itself is FP8 (megatron-core keeps no other compute copy; DistributedDataParallelConfig
    fp8_param_gather: "keep the compute param in fp8 (do not use any other intermediate dtype)") plus the
    transposed FP8 copy Transformer Engine makes for the backward GEMMs; without it a bf16 weight and Transformer
    Engine's cached FP8 workspace of it, row- and column-wise (megatron-core passes is_first_microbatch, which
    caches it across micro-batches)."""
    names = {a.split(" ")[0] for a in flags(args)}
    return 1 + 1 if "--fp8-param-gather" in names else 2 + 2


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_weights_are_held_as_the_estimate_prices_them(precision, cluster):
    # An FP8 plan's flags keep the weights in FP8 (Megatron-Bridge's recipes do): without --fp8-param-gather a 70B
    # tp8 pp4 rank would hold 4.4 GB more weights than its estimate (4 bytes a parameter against 2).
    model = get_model("70b", precision=precision)
    plan = ParallelPlan(tp=8, pp=4, dp=16, global_batch=512)
    for p, held in ((plan, 2.0), (plan.model_copy(update={"zero_stage": 3}), 2.0),
                    (plan.model_copy(update={"distributed_optimizer": False, "zero_stage": 0}), 4.0)):
        mem = estimate(model, cluster, p).memory_breakdown_bytes
        priced = mem["weights"] / mem["grads"] * 2.0    # bf16 gradients: 2 bytes a parameter
        assert megatron_weight_bytes(megatron_args(model, p)) == held
        assert priced == pytest.approx(held), p
    args = megatron_args(model, plan)
    assert ("--reuse-grad-buf-for-mxfp8-param-ag" in flags(args)) == (precision == "mxfp8")
    # Megatron-LM refuses FP8 parameters without a sharded optimizer state: such a plan says what it holds
    assert any("no --fp8-param-gather" in a for a in megatron_args(model, plan.model_copy(
        update={"distributed_optimizer": False, "zero_stage": 0})))
    assert "--fp8-param-gather" not in flags(megatron_args(get_model("70b"), plan))


def test_garbage_collection_runs_on_every_rank_at_once():
    # Megatron-LM --manual-gc --manual-gc-interval 100, as the Megatron-Bridge benchmark runs the profiles are
    # fitted to: without it each rank's collector runs when its own allocation count trips it, and a synchronous
    # step waits for the slowest rank's pause.
    from costmodel.rules import MANUAL_GC_INTERVAL_STEPS

    args = megatron_args(get_model("70b"), ParallelPlan(tp=8, pp=4, dp=16, global_batch=512))
    assert "--manual-gc" in flags(args) and MANUAL_GC_INTERVAL_STEPS == 100
    assert flag_value(args, "--manual-gc-interval") == "100"


def test_explicit_layout(cluster):
    m = get_model("70b")
    layout = "Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L"  # pp=4 x vpp=2, 19/20/20/21 layers per rank
    plan = ParallelPlan(tp=8, pp=4, vpp=2, dp=16, global_batch=512)
    args = megatron_args(m, plan, layout=layout)
    assert flag_value(args, "--pipeline-model-parallel-layout") == layout
    assert "--num-virtual-stages-per-pipeline-rank" not in " ".join(args)  # Megatron: at most one of the two
    parsed = parse_megatron_args(args, num_gpus=cluster.num_gpus)
    assert parsed["vpp"] == 2 and parsed["layers_per_stage"] == (19, 20, 20, 21)
    assert round_trip(m, plan.model_copy(update={"layers_per_stage": (19, 20, 20, 21)}), 512, layout=layout) == \
        plan.model_copy(update={"layers_per_stage": (19, 20, 20, 21)})
    # the generated layout of a split parses back to it, for any vpp
    for lps, v in [((19, 20, 20, 21), 2), ((20, 20, 20, 20), 4), ((0, 40, 40, 0), 1)]:
        assert parse_layout(layout_from_layers_per_stage(lps, v), 4) == (v, lps)
    # a layout that does not fit the model or the plan is refused, naming it
    for bad, msg in [("Et*20|t*20|t*20|t*19L", "layers=80"), ("Et*20|t*20|t*20L", "pp=4"),
                     ("t*20|t*20|t*20|t*20", "'E'"), ("Et*20|t*20|t*20|t*20|L", "pp=4"),
                     ("Et*20|t*20|t*20|t*19mL", "MTP"), ("Ex*20|t*20|t*20|t*20L", "unknown")]:
        with pytest.raises(InputError, match=msg) as err:
            megatron_args(m, ParallelPlan(tp=8, pp=4, dp=16, global_batch=512), layout=bad)
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="layers_per_stage"):
        megatron_args(m, plan.model_copy(update={"layers_per_stage": (20, 20, 20, 20)}), layout=layout)


def test_parse_derives_dp_and_rejects_bad_input():
    m = get_model("70b")
    args = megatron_args(m, ParallelPlan(tp=8, pp=4, cp=2, dp=8, global_batch=512))
    assert parse_megatron_args(args, num_gpus=512)["dp"] == 8
    assert parse_megatron_args(args, num_gpus=1024)["dp"] == 16
    assert "dp" not in parse_megatron_args(args)
    with pytest.raises(InputError, match="not divisible"):
        parse_megatron_args(args, num_gpus=100)
    with pytest.raises(InputError, match="integer"):
        parse_megatron_args(["--tensor-model-parallel-size eight"])
    assert parse_megatron_args("pretrain_gpt.py --tensor-model-parallel-size=4 --sequence-parallel")["tp"] == 4


# Scripts ------------------------------------------------------------------------------------------
def _plan_70b(**kw):
    return ParallelPlan(**{**dict(tp=8, pp=4, vpp=5, dp=16, global_batch=512), **kw})


def test_launch_script_contents(cluster):
    m = get_model("70b")
    plan = _plan_70b()
    args = megatron_args(m, plan)
    sh = launch_script(m, cluster, plan, args)
    assert sh.startswith("#!/usr/bin/env bash\n")
    assert "NNODES=64\n" in sh and "GPUS_PER_NODE=8\n" in sh
    assert '--nnodes "$NNODES"' in sh and '--nproc_per_node "$GPUS_PER_NODE"' in sh
    assert '--node_rank "$NODE_RANK"' in sh and '--master_addr "$MASTER_ADDR"' in sh
    for var, default in (("NODE_RANK", "0"), ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "29500")):
        assert f'{var}="${{{var}:-{default}}}"' in sh
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in sh
    assert "pretrain_gpt.py" in sh and '"$@"' in sh
    for a in flags(args):
        assert a.split(" ", 1)[0] in sh

    # tp = cp = 1: Megatron does not need the single hardware queue
    p1 = ParallelPlan(tp=1, pp=8, dp=64, global_batch=512)
    sh1 = launch_script(get_model("7b"), cluster, p1, megatron_args(get_model("7b"), p1))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in sh1
    # cp alone needs it
    pcp = ParallelPlan(tp=1, pp=4, cp=2, dp=64, global_batch=512)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch_script(m, cluster, pcp, megatron_args(m, pcp))
    # Megatron-FSDP asserts the opposite
    pz = ParallelPlan(tp=2, pp=1, dp=256, global_batch=512, zero_stage=3)
    shz = launch_script(get_model("8b"), cluster, pz, megatron_args(get_model("8b"), pz))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in shz and "unset CUDA_DEVICE_MAX_CONNECTIONS" in shz
    # a plan that does not use the cluster exactly is refused
    with pytest.raises(InputError, match="512"):
        launch_script(m, cluster, _plan_70b(dp=8), args)


def test_sbatch_script_contents(cluster):
    m = get_model("70b")
    plan = _plan_70b()
    sb = sbatch_script(m, cluster, plan, megatron_args(m, plan), partition="batch", time_limit="04:00:00")
    lines = sb.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert lines[1:1 + len(directives)] == directives  # all directives before any command
    for d in ("#SBATCH --nodes=64", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
              "#SBATCH --partition=batch", "#SBATCH --time=04:00:00"):
        assert d in directives
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p' in sb
    assert "srun" in sb and "--rdzv_backend c10d" in sb and '--rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"' in sb
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in sb


@needs_bash
@pytest.mark.parametrize("case", ["mla-deepseek-v3", "vpp-70b", "tp1-fp16", "zero3-fsdp"])
def test_scripts_pass_bash_syntax_check(case, cluster, tmp_path):
    name, precision, fields = CASES[case]
    model = get_model(name, precision=precision)
    plan = ParallelPlan(**fields)
    args = megatron_args(model, plan)
    for fname, text in (("launch.sh", launch_script(model, cluster, plan, args)),
                        ("launch.sbatch", sbatch_script(model, cluster, plan, args))):
        path = tmp_path / fname
        path.write_text(text)
        res = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{fname}: {res.stderr}"


def _write_bin(bin_dir: Path, scripts: dict[str, str]) -> Path:
    for n, body in scripts.items():
        p = bin_dir / n
        p.write_text(body)
        p.chmod(0o755)
    return bin_dir


def _fake_bin(tmp_path: Path) -> Path:
    """torchrun that records its argv, srun that runs its command, scontrol that lists 5000 hosts (enough
    output that a reader stopping after the first line would SIGPIPE it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "torchrun": '#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGV_OUT"\n'
                    'echo "CDMC=${CUDA_DEVICE_MAX_CONNECTIONS:-unset}" >> "$ARGV_OUT"\n',
        "srun": '#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": '#!/usr/bin/env bash\nfor i in $(seq 1 5000); do echo "node-$i"; done\n',
    }
    return _write_bin(bin_dir, scripts)


@needs_bash
def test_launchers_hand_exactly_the_flags_to_torchrun(cluster, tmp_path):
    model = get_model("deepseek-v3", precision="fp8")
    plan = ParallelPlan(**CASES["mla-deepseek-v3"][2])
    args = megatron_args(model, plan)
    expected = [tok for a in flags(args) for tok in a.split(" ", 1)]
    bin_dir = _fake_bin(tmp_path)
    out = tmp_path / "argv.txt"
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "ARGV_OUT": str(out), "HOME": str(tmp_path),
           "MEGATRON_LM_DIR": "/opt/megatron", "NODE_RANK": "3", "MASTER_ADDR": "10.0.0.1"}

    sh = tmp_path / "launch.sh"
    sh.write_text(launch_script(model, cluster, plan, args))
    res = subprocess.run([BASH, str(sh), "--mock-data", "--train-iters", "10"], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    got = out.read_text().splitlines()
    assert got[:10] == ["--nnodes", "64", "--nproc_per_node", "8", "--node_rank", "3", "--master_addr",
                        "10.0.0.1", "--master_port", "29500"]
    entry = got.index("/opt/megatron/pretrain_gpt.py")
    assert got[entry + 1:-1] == expected + ["--mock-data", "--train-iters", "10"]
    assert got[-1] == "CDMC=1"
    assert ParallelPlan(**parse_megatron_args(got[entry + 1:-1], num_gpus=512)) == plan

    sb = tmp_path / "launch.sbatch"
    sb.write_text(sbatch_script(model, cluster, plan, args))
    slurm = {**env, "SLURM_JOB_NODELIST": "node-[1-5000]", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "64"}
    res = subprocess.run([BASH, str(sb)], env=slurm, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = out.read_text().splitlines()
    assert got[:10] == ["--nnodes", "64", "--nproc_per_node", "8", "--rdzv_id", "77", "--rdzv_backend", "c10d",
                        "--rdzv_endpoint", "node-1:29500"]
    entry = got.index("/opt/megatron/pretrain_gpt.py")
    assert got[entry + 1:-1] == expected
    # a job with the wrong node count stops before launching
    res = subprocess.run([BASH, str(sb)], env={**slurm, "SLURM_JOB_NUM_NODES": "32"}, capture_output=True, text=True)
    assert res.returncode != 0 and "64" in res.stderr


# write_outputs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chosen(cluster):
    model = get_model("70b")
    plan = _plan_70b()
    return model, plan, estimate(model, cluster, plan)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def test_write_outputs_creates_exactly_the_four_files(cluster, chosen, tmp_path):
    model, plan, est = chosen
    out = tmp_path / "run1"
    paths = write_outputs(out, model, cluster, plan, est, extra={"note": "chosen by test"})
    assert [p.name for p in paths] == list(OUTPUT_FILES)
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    assert _leftovers(tmp_path) == []

    data = json.loads((out / "plan.json").read_text())
    assert set(data) == {"model", "cluster", "plan", "estimate", "note"}
    assert ParallelPlan(**data["plan"]) == plan
    assert data["model"]["name"] == "70b" and data["cluster"]["name"] == "h100x512"
    assert data["estimate"]["step_time_s"] == pytest.approx(est.step_time_s)

    lines = (out / "megatron_args.txt").read_text().splitlines()
    assert lines == megatron_args(model, plan)
    assert ParallelPlan(**parse_megatron_args((out / "megatron_args.txt").read_text(), num_gpus=512)) == plan

    assert os.stat(out / "launch.sh").st_mode & stat.S_IXUSR
    assert (out / "launch.sh").read_text() == launch_script(model, cluster, plan, megatron_args(model, plan))
    assert "#SBATCH --nodes=64" in (out / "launch.sbatch").read_text()

    # into an existing directory: files replaced one by one, other files kept, no temp dirs left
    (out / "keep.txt").write_text("x")
    plan2 = plan.model_copy(update={"recompute": "none"})
    write_outputs(out, model, cluster, plan2, estimate(model, cluster, plan2))
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUT_FILES, "keep.txt"])
    assert json.loads((out / "plan.json").read_text())["plan"]["recompute"] == "none"
    assert _leftovers(tmp_path) == [] and _leftovers(out) == []


def test_write_outputs_with_layout(cluster, tmp_path):
    model = get_model("70b")
    plan = ParallelPlan(tp=8, pp=4, vpp=2, dp=16, global_batch=512, layers_per_stage=(19, 20, 20, 21))
    layout = "Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L"
    write_outputs(tmp_path / "o", model, cluster, plan, None, layout=layout)
    data = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert data["layout"] == layout and data["estimate"] is None
    assert f"--pipeline-model-parallel-layout {layout}" in (tmp_path / "o" / "megatron_args.txt").read_text()


def test_write_outputs_missing_parent_raises_and_leaves_nothing(cluster, chosen, tmp_path):
    model, plan, est = chosen
    target = tmp_path / "missing" / "run"
    with pytest.raises(InputError) as err:
        write_outputs(target, model, cluster, plan, est)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "missing") in msg
    assert list(tmp_path.iterdir()) == []


def test_write_outputs_refuses_a_file_in_the_way(cluster, chosen, tmp_path):
    model, plan, est = chosen
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(InputError, match="not a directory"):
        write_outputs(tmp_path / "run", model, cluster, plan, est)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_write_outputs_unwritable_parent(cluster, chosen, tmp_path):
    model, plan, est = chosen
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(InputError, match="not writable"):
            write_outputs(parent / "run", model, cluster, plan, est)
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_write_outputs_failure_midway_leaves_nothing(cluster, chosen, tmp_path, monkeypatch):
    model, plan, est = chosen
    real_chmod = os.chmod

    def failing_chmod(path, mode, *a, **kw):
        if "launch.sbatch" in Path(path).name:   # the temporary file of launch.sbatch
            raise OSError(28, "No space left on device")
        return real_chmod(path, mode, *a, **kw)

    monkeypatch.setattr(outputs.os, "chmod", failing_chmod)
    with pytest.raises(InputError, match="No space left") as err:
        write_outputs(tmp_path / "run", model, cluster, plan, est)
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []

    # an existing directory is not touched either when writing fails before the files move in
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "plan.json").write_text("old")
    with pytest.raises(InputError):
        write_outputs(existing, model, cluster, plan, est)
    assert (existing / "plan.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]
    assert sorted(p.name for p in existing.iterdir()) == ["plan.json"]


# Heterogeneous launch: node ranks bound to device groups --------------------------------------------------------
def _mixed_outputs(tmp_path: Path) -> tuple[Path, list[str]]:
    """launch.sh / launch.sbatch of a 13B plan on the shipped mixed cluster: pipeline rank 0 (22 layers) on the
    2 A100 nodes, ranks 1-2 (9 layers each) on the 4 V100 nodes, tp2 dp8."""
    from costmodel.hetero import HeteroPlan, estimate_hetero
    from planner.hetero import Scored, write_hetero_outputs

    mixed = load_cluster("a100-v100-mixed")
    model = get_model("13b", precision="fp16")
    hp = HeteroPlan(stage_groups=("a100", "v100", "v100"), stage_tp=(2,) * 3, stage_dp=(8,) * 3,
                    layers_per_stage=(22, 9, 9), micro_batch_sequences=8, global_batch=768, recompute="selective")
    est = estimate_hetero(model, mixed, [hp])[0]
    out = tmp_path / "out"
    write_hetero_outputs(str(out), model, mixed, Scored(hp, est, "mixed"))
    args = (out / "megatron_args.txt").read_text().splitlines()
    return out, [tok for a in flags(args) for tok in a.split(" ", 1)]


def _fake_cluster_bin(tmp_path: Path) -> Path:
    """nvidia-smi printing $FAKE_GPU_COUNT x $FAKE_GPU, torchrun recording its argv, srun running its command,
    scontrol expanding a comma-separated node list."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    scripts = {
        "nvidia-smi": '#!/usr/bin/env bash\n[[ "$*" == "--query-gpu=name --format=csv,noheader" ]] || exit 9\n'
                      'for i in $(seq 1 "${FAKE_GPU_COUNT:-8}"); do echo "$FAKE_GPU"; done\n',
        "torchrun": '#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGV_OUT"\n',
        "srun": '#!/usr/bin/env bash\nfor a in "$@"; do [[ "$a" == --* ]] || break; echo "$a"; done > "$SRUN_OUT"\n'
                'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": '#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] || exit 9\ntr , "\\n" <<< "$3"\n',
    }
    return _write_bin(bin_dir, scripts)


A100_SMI = "NVIDIA A100-SXM4-80GB"
V100_SMI = "Tesla V100-SXM2-32GB"


@needs_bash
def test_mixed_launch_binds_node_ranks_to_groups(tmp_path):
    out, expected = _mixed_outputs(tmp_path)
    sh = (out / "launch.sh").read_text()
    assert "node ranks 0-1: group a100" in sh and "node ranks 2-5: group v100" in sh and "--rdzv_backend" not in sh
    argv = tmp_path / "argv.txt"
    base = {"PATH": f"{_fake_cluster_bin(tmp_path)}:{os.environ.get('PATH', '')}", "ARGV_OUT": str(argv),
            "HOME": str(tmp_path), "MEGATRON_LM_DIR": "/opt/megatron",
            "HOSTS_A100": "gpu-a1 gpu-a2", "HOSTS_V100": "gpu-v1,gpu-v2,gpu-v3,gpu-v4"}

    def run(host: str, gpu: str, **env) -> subprocess.CompletedProcess:
        argv.unlink(missing_ok=True)
        return subprocess.run([BASH, str(out / "launch.sh"), "--mock-data"], capture_output=True, text=True,
                              env={**base, "NODE_HOST": host, "FAKE_GPU": gpu, **env})

    # the right hosts start with their rank in the lists, static rendezvous on the first A100 host
    for host, gpu, rank in (("gpu-a1", A100_SMI, 0), ("gpu-a2", A100_SMI, 1), ("gpu-v1", V100_SMI, 2),
                            ("gpu-v4.cluster.local", V100_SMI, 5)):
        res = run(host, gpu)
        assert res.returncode == 0, res.stderr
        got = argv.read_text().splitlines()
        assert got[:10] == ["--nnodes", "6", "--nproc_per_node", "8", "--node_rank", str(rank), "--master_addr",
                            "gpu-a1", "--master_port", "29500"]
        assert got[11:] == expected + ["--mock-data"] and got[10] == "/opt/megatron/pretrain_gpt.py"

    # wrong bindings refuse with one line and exit 2, before torchrun
    refusals = [
        (dict(host="gpu-a1", gpu=V100_SMI), "bound to node rank 0 of group a100 (A100-80GB) but nvidia-smi reports "
                                            f"'{V100_SMI}'"),
        (dict(host="gpu-v2", gpu=A100_SMI), "node rank 3 of group v100 (V100-32GB)"),
        (dict(host="gpu-a1", gpu="NVIDIA A100-SXM4-40GB"), "reports 'NVIDIA A100-SXM4-40GB'"),
        (dict(host="gpu-a1", gpu=A100_SMI, FAKE_GPU_COUNT="4"), "shows 4 GPUs in nvidia-smi; the plan needs 8"),
        (dict(host="gpu-a1", gpu=A100_SMI, HOSTS_A100="gpu-a1 gpu-a2 gpu-a3"),
         "group a100 needs 2 A100-80GB nodes but HOSTS_A100 lists 3"),
        (dict(host="gpu-v1", gpu=V100_SMI, HOSTS_V100=""), "group v100 needs 4 V100-32GB nodes but HOSTS_V100 lists 0"),
        (dict(host="gpu-v1", gpu=V100_SMI, NODE_RANK="0"), "NODE_RANK=0 but host gpu-v1 is node rank 2"),
        (dict(host="gpu-x", gpu=A100_SMI), "this host (gpu-x) is in none of HOSTS_A100 HOSTS_V100"),
        (dict(host="gpu-a1", gpu=A100_SMI, HOSTS_V100="gpu-a1 gpu-v2 gpu-v3 gpu-v4"), "host gpu-a1 is listed twice"),
    ]
    for kw, message in refusals:
        res = run(**kw)
        assert res.returncode == 2 and message in res.stderr, (kw, res.stderr)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("launch.sh: ") and not argv.exists()


@needs_bash
def test_mixed_sbatch_is_a_heterogeneous_job(tmp_path):
    out, expected = _mixed_outputs(tmp_path)
    sb = (out / "launch.sbatch").read_text()
    lines = sb.splitlines()
    directives = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert lines[1:1 + len(directives)] == directives
    het = directives.index("#SBATCH hetjob")
    assert "#SBATCH --nodes=2" in directives[:het] and "#SBATCH --nodes=4" in directives[het:]
    assert directives.count("#SBATCH --gpus-per-node=8") == 2 and directives.count("#SBATCH hetjob") == 1
    argv, srun_out = tmp_path / "argv.txt", tmp_path / "srun.txt"
    base = {"PATH": f"{_fake_cluster_bin(tmp_path)}:{os.environ.get('PATH', '')}", "ARGV_OUT": str(argv),
            "SRUN_OUT": str(srun_out), "HOME": str(tmp_path), "SLURM_SUBMIT_DIR": "/opt/megatron",
            "SLURM_JOB_ID": "77", "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "a01,a02",
            "SLURM_JOB_NODELIST_HET_GROUP_1": "v01,v02,v03,v04"}

    def run(node: str, gpu: str, **env) -> subprocess.CompletedProcess:
        argv.unlink(missing_ok=True)
        return subprocess.run([BASH, str(out / "launch.sbatch")], capture_output=True, text=True,
                              env={**base, "SLURMD_NODENAME": node, "FAKE_GPU": gpu, **env})

    res = run("v02", V100_SMI)
    assert res.returncode == 0, res.stderr
    got = argv.read_text().splitlines()
    assert got[:10] == ["--nnodes", "6", "--nproc_per_node", "8", "--node_rank", "3", "--master_addr", "a01",
                        "--master_port", "29500"]
    assert got[11:] == expected and got[10] == "/opt/megatron/pretrain_gpt.py"
    assert srun_out.read_text().splitlines()[:2] == ["--het-group=0,1", "--kill-on-bad-exit=1"]
    assert run("a02", A100_SMI).returncode == 0 and argv.read_text().splitlines()[5] == "1"

    for kw, message in [
        (dict(node="a01", gpu=V100_SMI), "launch.sbatch: host a01 is bound to node rank 0 of group a100"),
        (dict(node="v01", gpu=V100_SMI, SLURM_HET_SIZE="1"), "needs a heterogeneous job of 2 components"),
        (dict(node="v01", gpu=V100_SMI, SLURM_JOB_NODELIST_HET_GROUP_1="v01,v02"),
         "component 1 (v100) has 2 nodes but the plan needs 4 V100-32GB nodes"),
    ]:
        res = run(**kw)
        assert res.returncode == 2 and message in res.stderr, (kw, res.stderr)
        assert res.stderr.count("\n") == 1 and not argv.exists()


@needs_bash
def test_mixed_scripts_need_stages_on_whole_groups(tmp_path):
    from planner.outputs import launch_script

    mixed = load_cluster("a100-v100-mixed")
    model = get_model("13b", precision="fp16")
    plan = ParallelPlan(tp=8, pp=2, dp=3, global_batch=768, layers_per_stage=(20, 20))   # 24-GPU stages
    with pytest.raises(InputError, match="group a100's 16 GPUs do not hold whole pipeline stages of tp\\*cp\\*dp = 24"):
        launch_script(model, mixed, plan, megatron_args(model, plan))


def test_files_in_two_directories_are_checked_before_either_is_written(tmp_path):
    from costmodel.files import write_paths_atomic
    from costmodel.profiles import InputError

    a, b = tmp_path / "profiles", tmp_path / "clusters"
    a.mkdir()
    with pytest.raises(InputError, match=f"{b / 'c.yaml'}: directory {b} does not exist"):
        write_paths_atomic({a / "p.yaml": "p: 1\n", b / "c.yaml": "c: 2\n"})
    assert list(a.iterdir()) == []           # nothing written, no temporary file left
    b.mkdir()
    paths = write_paths_atomic({a / "p.yaml": "p: 1\n", b / "c.yaml": lambda p: p.write_text("c: 2\n")})
    assert [p.read_text() for p in paths] == ["p: 1\n", "c: 2\n"]
    assert sorted(x.name for x in a.iterdir()) == ["p.yaml"]


def test_moe_selective_recompute_names_the_modules_the_estimate_prices():
    # costmodel/memory.py prices a MoE layer's selective recompute as the pre-MLP LayerNorm and the experts'
    # activation besides the attention core; megatron-core's default --recompute-modules is core_attn alone.
    plan = ParallelPlan(tp=4, pp=2, dp=64, ep=8, etp=1, global_batch=1024, recompute="selective")
    args = megatron_args(get_model("mixtral-8x7b"), plan)
    assert flag_value(args, "--recompute-modules") == "core_attn layernorm moe_act"
    # nargs='*' values read back in every form (items, text, argv)
    assert parse_megatron_args(args, num_gpus=512)["recompute"] == "selective"
    argv = [tok for a in flags(args) for tok in a.split(" ")]
    assert ParallelPlan(**parse_megatron_args(argv, num_gpus=512)) == plan
    # dense: nothing beyond the default core_attn exists for Transformer Engine layers
    dense = megatron_args(get_model("70b"), ParallelPlan(tp=8, pp=4, dp=16, global_batch=512, recompute="selective"))
    assert "--recompute-modules" not in " ".join(flags(dense))
    # fp8 with delayed scaling: megatron-core refuses layernorm / moe_act recompute, so they are left out, said
    delayed = megatron_args(get_model("mixtral-8x7b", precision="fp8"), plan, fp8_recipe="delayed")
    assert "--recompute-modules" not in " ".join(flags(delayed))
    assert any(a.startswith("# --recompute-modules layernorm moe_act left out") for a in delayed)
