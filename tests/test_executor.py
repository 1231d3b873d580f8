"""The executor trains real megatron-core models: every layout of a tiny GPT follows the one-process run's
loss and grad-norm curves to 1e-5, a short run's loss falls, a killed rank resumes from its checkpoint
on the same curve, and bad plans are refused before any process starts.

Each layout is a torchrun subprocess on gloo (CPU). Skipped where torch / megatron-core are not installed
(they come with the `executor` extra; .ci/run installs it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from costmodel.catalog import get_model  # noqa: E402
from costmodel.plan import ParallelPlan  # noqa: E402
from costmodel.profiles import InputError  # noqa: E402
from executor.data import SyntheticTask, microbatches  # noqa: E402
from executor.launch import LaunchError, first_worker_error, launch, read_plan  # noqa: E402
from kill_worker import HERE as KILL_WORKER, KILL_ENV  # noqa: E402  (tests/kill_worker.py)

STEPS = 6
REL = 1e-5

LAYOUTS = {
    "tp2-sp": ("tiny-gpt", dict(tp=2, sequence_parallel=True)),
    "pp2": ("tiny-gpt", dict(pp=2)),
    "pp2-vpp2": ("tiny-gpt", dict(pp=2, vpp=2)),
    "dp2-distopt": ("tiny-gpt", dict(dp=2, distributed_optimizer=True)),
    "tp2-pp2-sp": ("tiny-gpt", dict(tp=2, pp=2, sequence_parallel=True)),
    "ep2": ("tiny-moe", dict(dp=2, ep=2)),
    # selective on a MoE model recomputes the pre-MLP LayerNorm and the experts' activation (as the planner's
    # --recompute-modules core_attn layernorm moe_act): the same numbers
    "ep2-selective": ("tiny-moe", dict(dp=2, ep=2, recompute="selective")),
}


def write_plan(path, model_name: str, **plan_kw) -> str:
    model = get_model(model_name)
    plan_kw = {"global_batch": 8, "micro_batch": 2, "recompute": "none", **plan_kw}
    plan = ParallelPlan(**plan_kw)
    path.write_text(json.dumps({"model": model.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}))
    return str(path)


def curves(result) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r["loss"] for r in result.metrics]), np.array([r["grad_norm"] for r in result.metrics]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One-process runs of the dense and the MoE tiny model, fp32."""
    d = tmp_path_factory.mktemp("ref")
    out = {}
    for name in ("tiny-gpt", "tiny-moe"):
        out[name] = launch(write_plan(d / f"{name}.json", name), d / name, steps=STEPS, dtype="fp32")
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_matches_one_process_run(layout, reference, tmp_path):
    model_name, kw = LAYOUTS[layout]
    res = launch(write_plan(tmp_path / "plan.json", model_name, **kw), tmp_path / "run", steps=STEPS, dtype="fp32")
    loss, gnorm = curves(res)
    ref_loss, ref_gnorm = curves(reference[model_name])
    assert len(loss) == STEPS
    np.testing.assert_allclose(loss, ref_loss, rtol=REL)
    np.testing.assert_allclose(gnorm, ref_gnorm, rtol=REL)
    if model_name == "tiny-moe":
        # Every token of every step is routed to top-k experts of every MoE layer.
        tokens = 8 * get_model("tiny-moe").seq_len
        for row in res.metrics:
            assert [sum(layer) for layer in row["routing_counts"]] == [2 * tokens] * 4
        hist = res.summary["moe_routing_histogram"]
        assert np.array(hist).sum() == STEPS * 4 * 2 * tokens
        assert hist == reference["tiny-moe"].summary["moe_routing_histogram"]
        check_uses_the_measured_histogram(res, tmp_path, hist)


def check_uses_the_measured_histogram(res, tmp_path, hist):
    """`plan check --routing RUN/summary.json` on the run's own plan prices the measured expert load."""
    import subprocess
    import sys

    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ngpu: H100\nnodes: 1\ngpus_per_node: 2\n"
                       "inter_node: {nic_bandwidth_bytes_per_s: 50.0e+9}\n")
    plan = res.summary["plan"]
    out = subprocess.run([sys.executable, "-m", "planner.cli", "check", "--model", "tiny-moe", "--cluster", str(cluster),
                          "--tp", "1", "--pp", "1", "--dp", str(plan["dp"]), "--ep", str(plan["ep"]),
                          "--global-batch", str(plan["global_batch"]), "--micro-batch", str(plan["micro_batch"]),
                          "--recompute", "none", "--routing", str(res.run_dir / "summary.json"), "--json"],
                         check=True, capture_output=True, text=True)
    routing = json.loads(out.stdout)["routing"]
    assert (routing["layers"], routing["experts"]) == (4, 4)
    # Contiguous placement: rank 0 holds experts 0-1, rank 1 experts 2-3; the hottest rank of each layer
    # over the mean, averaged over the layers, is what the estimate uses.
    per_layer = [2 * max(sum(h[:2]), sum(h[2:])) / sum(h) for h in hist]
    assert routing["load"]["time_factor"] == pytest.approx(np.mean(per_layer), rel=1e-6)
    assert routing["load"]["worst_layer_factor"] == pytest.approx(max(per_layer), rel=1e-6)


def test_interleaved_moe_layers_train_where_the_model_places_them(tmp_path):
    """Experts on every other layer (moe_layer_step 2, as Llama 4 Maverick): megatron-core builds MoE layers 2 and 4
    only, the pp2 run follows the one-process curve, and routing is counted on those two layers."""
    model = get_model("tiny-moe").model_copy(update={"moe_layer_step": 2})
    runs = {}
    for name, kw in (("one", {}), ("pp2", {"pp": 2})):
        plan = ParallelPlan(global_batch=8, micro_batch=2, recompute="none", **kw)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"model": model.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}))
        runs[name] = launch(str(path), tmp_path / name, steps=3, dtype="fp32")
    tokens = 8 * model.seq_len
    for res in runs.values():
        assert res.summary["moe_layers"] == [2, 4]
        assert all([sum(layer) for layer in row["routing_counts"]] == [2 * tokens] * 2 for row in res.metrics)
    np.testing.assert_allclose(curves(runs["pp2"])[0], curves(runs["one"])[0], rtol=REL)


def test_short_run_loss_falls(reference):
    loss, _ = curves(reference["tiny-gpt"])
    assert loss[0] == pytest.approx(np.log(512), rel=0.01)     # uniform prediction at the start
    assert loss[-1] < loss[0] - 0.25
    row = reference["tiny-gpt"].metrics[-1]
    assert row["step_time_s"] > 0 and row["forward_s"] > 0 and row["backward_s"] > 0 and row["optimizer_s"] > 0
    assert row["peak_memory_bytes"] > 50e6 and row["memory_source"] == "process_rss"
    assert row["tokens_per_s"] == pytest.approx(8 * 32 / row["step_time_s"])


def test_killed_rank_resumes_on_the_same_curve(reference, tmp_path):
    plan = write_plan(tmp_path / "plan.json", "tiny-gpt", dp=2)
    run = tmp_path / "run"
    with pytest.raises(LaunchError, match=r"rank 1: killed by signal 9"):
        launch(plan, run, steps=STEPS, dtype="fp32", checkpoint_every=2, env={KILL_ENV: "1:3"},
               worker=KILL_WORKER, timeout_s=240)
    assert (run / "checkpoints" / "step_2" / "COMPLETE").exists()
    res = launch(plan, run, steps=STEPS, dtype="fp32", checkpoint_every=2)
    assert [r["step"] for r in res.metrics] == list(range(1, STEPS + 1))
    loss, gnorm = curves(res)
    ref_loss, ref_gnorm = curves(reference["tiny-gpt"])
    np.testing.assert_allclose(loss, ref_loss, rtol=REL)
    np.testing.assert_allclose(gnorm, ref_gnorm, rtol=REL)


def test_bad_plans_are_refused_before_any_process_starts(tmp_path):
    bad = write_plan(tmp_path / "bad.json", "tiny-gpt", tp=3)   # 4 heads do not split over 3 ranks
    with pytest.raises(InputError, match=r"bad.json: .*tp"):
        launch(bad, tmp_path / "never")
    assert not (tmp_path / "never" / "launch.log").exists()
    big = write_plan(tmp_path / "big.json", "tiny-gpt", dp=64, global_batch=128)
    with pytest.raises(InputError, match=r"needs 64 ranks .* at most \d+ CPU processes \(2 per core on \d+ cores"):
        launch(big, tmp_path / "never")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(InputError, match=r"junk.json: line 1 column 2: malformed JSON"):
        read_plan(tmp_path / "junk.json")


def test_worker_error_is_reported_by_rank():
    log = "\n".join([
        "[rank1]: Traceback (most recent call last):",
        "[rank1]: ValueError: boom at step 3",
        "[rank0]: RuntimeError: connection closed by peer",
    ])
    assert first_worker_error(log) == "rank 1: ValueError: boom at step 3"
    killed = ("[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer\n"
              "  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 11)\n"
              "  rank      : 3 (local_rank: 3)\n  exitcode  : -9 (pid: 12)\n")
    assert first_worker_error(killed) == "rank 3: killed by signal 9"
    assert first_worker_error(killed.split("\n", 1)[1].replace("-9", "1")) == "rank 3: exited with code 1"


def test_data_is_split_the_same_way_for_every_layout():
    task = SyntheticTask(vocab=64, seq_len=8, seed=7)
    one = np.concatenate([t for t, _ in microbatches(task, step=3, global_batch=8, dp=1, dp_rank=0, micro_batch=2)])
    two = np.concatenate([t for r in range(2) for t, _ in
                          microbatches(task, step=3, global_batch=8, dp=2, dp_rank=r, micro_batch=1)])
    np.testing.assert_array_equal(one, two)
    tokens, labels = next(microbatches(task, step=0, global_batch=2, dp=1, dp_rank=0, micro_batch=2))
    np.testing.assert_array_equal(tokens[:, 1:], labels[:, :-1])
    follow = np.mean(task.successor[tokens[:, :-1]] == tokens[:, 1:])
    assert 0.6 < follow <= 1.0
    assert 0 < task.entropy_nats() < np.log(64) / 2


def test_autotune_runs_the_injected_ranking_and_skips_what_cannot_run_here():
    """autotune takes the planner's ranking as a function of the profile (it never imports the planner): the
    first runnable plans in that order, plans the executor refuses (tp 3 on 4 heads, FSDP) skipped."""
    from costmodel.profiles import load_profile
    from executor.autotune import ranked_runnable

    model, profile = get_model("tiny-gpt"), load_profile("H100")
    kw = {"global_batch": 8, "micro_batch": 2, "recompute": "none"}
    order = [(ParallelPlan(tp=3, **kw), 0.1), (ParallelPlan(**kw), 0.2),
             (ParallelPlan(dp=2, zero_stage=2, **kw), 0.25), (ParallelPlan(dp=2, **kw), 0.3),
             (ParallelPlan(pp=2, **kw), 0.4)]
    asked, taken = [], []

    def rank_plans(prof):
        asked.append(prof)
        for plan, t in order:
            taken.append(plan)
            yield plan, t

    assert ranked_runnable(rank_plans, model, profile, 2) == [order[1], order[3]]
    assert asked == [profile] and len(taken) == 4          # stops once it has enough


def test_autotune_closes_the_loop_on_this_machine(tmp_path):
    """plan profile (quick) -> plan autotune: trials measured, calibration lowers their error, the winner is
    the fastest measured trial and the full run trains."""
    import subprocess
    import sys

    prof, clus = tmp_path / "cpu.yaml", tmp_path / "cpu-cluster.yaml"
    subprocess.run([sys.executable, "-m", "planner.cli", "profile", "--out", str(prof), "--world-size", "2",
                    "--quick", "--json"], check=True, capture_output=True, timeout=600)
    out = subprocess.run([sys.executable, "-m", "planner.cli", "autotune", "--model", "tiny-gpt", "--cluster",
                          str(clus), "--trial-steps", "3", "--top-k", "3", "--steps", "5", "--run-dir",
                          str(tmp_path / "runs"), "--json"], check=True, capture_output=True, text=True, timeout=1200)
    res = json.loads(out.stdout)
    trials = res["trials"]
    assert len(trials) >= 3 and all(t["error"] is None for t in trials)
    assert all(t["plan"]["global_batch"] == 16 for t in trials)          # 8 sequences per CPU rank
    measured = [t["measured_s"] for t in trials]
    assert res["winner"]["measured_s"] == min(measured)
    cal = res["calibration"]
    assert cal["factors"] == ["gemm_efficiency", "layer_overhead_s", "comm_exposed"]
    assert cal["mape_after"] < cal["mape_before"]
    assert res["final"]["steps"] == 5 and res["final"]["final_loss"] < res["final"]["first_loss"]
    assert (tmp_path / "runs" / "final" / "metrics.jsonl").exists()


SDPA_CHECK = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from executor import cpu
cpu.apply()
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + sys.argv[1])
from megatron.core import parallel_state as ps, tensor_parallel
ps.initialize_model_parallel(1, 1)
tensor_parallel.model_parallel_cuda_manual_seed(1)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from executor.model import sdpa_core_attention

def pair(**cfg_kw):
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=8, num_query_groups=2,
                            attention_dropout=0.0, use_cpu_initialization=True, **cfg_kw)
    kw = dict(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return DotProductAttention(**kw), sdpa_core_attention()(**kw)

def diffs(ref, new):
    g = torch.Generator().manual_seed(0)
    s, b = 16, 3
    qkv = [torch.randn(s, b, h, 8, generator=g, dtype=torch.float64).float().requires_grad_() for h in (8, 2, 2)]
    out_ref = ref(*qkv, None)
    grads_ref = torch.autograd.grad(out_ref.square().sum(), qkv)
    out_new = new(*qkv, None)
    grads_new = torch.autograd.grad(out_new.square().sum(), qkv)
    # the causal mask matters: the first position sees only itself
    first = qkv[2][0].repeat_interleave(4, dim=1).reshape(b, -1)
    return {"shape": list(out_new.shape), "out": (out_ref - out_new).abs().max().item(),
            "grad": max((a - c).abs().max().item() for a, c in zip(grads_ref, grads_new)),
            "first_token": (out_new[0] - first).abs().max().item(), "scale": out_ref.abs().max().item()}

print(json.dumps({"plain": diffs(*pair()), "window": diffs(*pair(window_size=(4, 0)))}))
"""


def test_flash_core_attention_matches_megatron_core_local_attention(tmp_path):
    """The executor's core attention (torch scaled_dot_product_attention) gives megatron-core's local
    DotProductAttention's output and gradients for causal GQA (8 query heads, 2 groups), and a windowed
    layer (not handled by the fused path) goes through megatron-core's own code and gives the same."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = tmp_path / "sdpa_check.py"
    script.write_text(SDPA_CHECK)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                         timeout=300, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for case in ("plain", "window"):
        assert got[case]["shape"] == [16, 3, 64]
        assert got[case]["scale"] > 0.5
        assert got[case]["out"] < 1e-5, got
        assert got[case]["grad"] < 1e-4, got
    assert got["plain"]["first_token"] < 1e-5, got
