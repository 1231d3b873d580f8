"""The training loop one worker process runs: megatron-core schedules, DDP and optimizer; metrics; checkpoints.

Started by ``torchrun`` (see executor/launch.py), one process per rank:

    torchrun --nproc-per-node 4 -m executor.train --plan plan.json --run-dir runs/x --steps 20

Rank 0 appends one JSON line per step to ``RUN_DIR/metrics.jsonl`` (step time, forward / backward / optimizer
split, loss, grad norm, tokens/s, peak memory, and with experts the step's routing counts) and writes
``RUN_DIR/summary.json`` at the end. Every ``--checkpoint-every`` steps each rank saves its shard under
``RUN_DIR/checkpoints/step_N/`` and rank 0 its manifest (sha256 of every shard); the last two are kept, and a
restart resumes from the newest one whose shards match (``executor.checkpoints``; launch passes it as
--resume-from). A failed write (full disk, read-only filesystem) ends the rank with an OSError naming the path.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from costmodel.plan import ParallelPlan
from costmodel.rules import MANUAL_GC_INTERVAL_STEPS
from costmodel.specs import ModelSpec
from executor.checkpoints import disk_error, write_atomic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="executor.train", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan.json written by `plan --out`")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="bf16")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data", default=None, help="token file (.npy or raw .bin); default: the synthetic task")
    ap.add_argument("--data-dtype", default="uint16", help="dtype of a raw .bin token file")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps (0: never)")
    ap.add_argument("--init", choices=("canonical", "megatron"), default="canonical",
                    help="canonical: identical weights for every layout of the model; megatron: its own init")
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--resume-from", default="auto",
                    help="checkpoint folder to resume from, none, or auto (the newest usable one)")
    return ap.parse_args(argv)


# Process set-up ---------------------------------------------------------------------------------------
def _init_distributed(plan: ParallelPlan):
    import datetime

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        from executor import cpu

        cpu.apply()
        torch.set_num_threads(max(1, int(os.environ.get("PLAN_EXECUTOR_THREADS", "1"))))
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if plan.optimizer_offload:
            torch.set_num_threads(cpu_step_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo",
                                         timeout=datetime.timedelta(seconds=int(os.environ.get(
                                             "PLAN_EXECUTOR_TIMEOUT_S", "300"))))
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(
        tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
        context_parallel_size=plan.cp, expert_model_parallel_size=plan.ep,
        expert_tensor_parallel_size=plan.etp)
    return cuda


def _build(model: ModelSpec, plan: ParallelPlan, args, cuda: bool):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from executor.model import build_chunks, canonical_init, megatron_config, padded_vocab

    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed)
    overrides = dict(hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=not cuda,
                     moe_grouped_gemm=False,
                     gradient_accumulation_fusion=False, masked_softmax_fusion=False,
                     bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                     persist_layer_norm=False, add_bias_linear=False)
    if plan.vpp > 1:
        # Interleaved schedule with pp=2 is silently wrong with batched p2p (see executor/README facts).
        overrides.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if model.is_moe:
        overrides.update(moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                         moe_token_dispatcher_type="alltoall" if plan.ep > 1 or plan.tp > 1 else "allgather")
    config = megatron_config(model, plan, dtype=args.dtype, **overrides)
    vocab = padded_vocab(model.vocab, plan.tp)
    chunks = build_chunks(model, plan, config, vocab_size=vocab)
    if args.init == "canonical":
        canonical_init(chunks, seed=args.seed, gated=model.gated_mlp)
    if cuda:
        chunks = [c.cuda() for c in chunks]
    # Gradients in the parameters' dtype, as the plan's Megatron-LM flags run them (--grad-reduce-in-bf16; with
    # --fp16 Megatron-LM never reduces in fp32) and the estimate prices them (costmodel/memory.py GRAD_BYTES_CORE).
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=False,
                                               use_distributed_optimizer=plan.distributed_optimizer)
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c,
                                      disable_bucketing=i > 0) for i, c in enumerate(chunks)]
    config.finalize_model_grads_func = finalize_model_grads
    opt_config = OptimizerConfig(**optimizer_config_kwargs(plan, args, config.params_dtype))
    optimizer = get_megatron_optimizer(opt_config, chunks)
    return config, chunks, optimizer, vocab


def optimizer_config_kwargs(plan: ParallelPlan, args, params_dtype) -> dict:
    """megatron-core OptimizerConfig of a plan: Adam without weight decay, the run's dtype, the distributed
    optimizer where the plan shards its state, and, where it keeps a share of that state in host memory
    (optimizer_offload F), the HybridDeviceOptimizer as planner/outputs.py writes it for Megatron-LM
    (--optimizer-cpu-offload --optimizer-offload-fraction F --use-precision-aware-optimizer
    --overlap-cpu-optimizer-d2h-h2d): that share steps on the CPU, its copies to and from the host overlapping
    the step."""
    kw = dict(optimizer="adam", lr=args.lr, weight_decay=0.0, bf16=args.dtype == "bf16", fp16=args.dtype == "fp16",
              params_dtype=params_dtype, use_distributed_optimizer=plan.distributed_optimizer,
              clip_grad=args.clip_grad)
    if plan.optimizer_offload:
        kw.update(optimizer_cpu_offload=True, optimizer_offload_fraction=float(plan.optimizer_offload),
                  use_precision_aware_optimizer=True, overlap_cpu_optimizer_d2h_h2d=True)
    return kw


def cpu_step_threads(local_ranks: int) -> int:
    """Torch threads for a rank whose optimizer steps on the CPU: its share of the cores this process may use
    (torchrun and the launcher start a rank with one, and one core streams far less than the DRAM the cost model
    prices the step at; the launch scripts set OMP_NUM_THREADS the same way)."""
    from executor.profile import host_cores

    return max(1, host_cores() // max(1, local_ranks))


# Checkpoints --------------------------------------------------------------------------------------------
def _sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _rank_file(ckpt_dir: Path) -> Path:
    import torch

    return ckpt_dir / f"rank{torch.distributed.get_rank():05d}.pt"


def save_checkpoint(run_dir: Path, step: int, chunks, optimizer, plan: ParallelPlan) -> None:
    """Each rank writes its shard (through a temporary file, fsynced, renamed); rank 0 then writes the
    manifest with every shard's sha256, which makes the step complete, and keeps the last two checkpoints
    (``executor.checkpoints``). A failed write removes its temporary file and names the path."""
    import torch

    from executor import checkpoints

    ckpt = run_dir / "checkpoints" / f"step_{step}"
    try:
        ckpt.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise checkpoints.disk_error(exc, ckpt, "the checkpoint folder") from None
    subs = []
    for sub in _sub_optimizers(optimizer):
        state = {"state": sub.state_dict()}
        if hasattr(sub, "get_parameter_state_dp_reshardable"):
            state["param_state"] = sub.get_parameter_state_dp_reshardable()
        subs.append(state)
    state = {"step": step, "model": [c.state_dict() for c in chunks], "optimizer": subs,
             "rng": torch.get_rng_state()}
    final = _rank_file(ckpt)
    tmp = final.with_name(final.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        digest = checkpoints.sha256_file(final)
    except OSError as exc:
        checkpoints.remove_quietly(tmp)
        raise checkpoints.disk_error(exc, final, "the checkpoint") from None
    digests = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(digests, (final.name, digest))
    if torch.distributed.get_rank() == 0:
        checkpoints.write_manifest(ckpt, step, plan, dict(digests))
        checkpoints.prune(run_dir)
    torch.distributed.barrier()


def load_checkpoint(ckpt: Path, chunks, optimizer) -> int:
    import torch

    state = torch.load(_rank_file(ckpt), weights_only=False)
    for c, sd in zip(chunks, state["model"]):
        c.load_state_dict(sd)
    for sub, sd in zip(_sub_optimizers(optimizer), state["optimizer"]):
        sub.load_state_dict(sd["state"])
        if "param_state" in sd:
            # megatron-core 0.16's loader expects the 'padding' mark its sharded save path adds.
            for key, by_dtype in sd["param_state"].items():
                if isinstance(key, int):
                    for buckets in by_dtype.values():
                        for bucket in buckets:
                            for elem in bucket:
                                elem.setdefault("padding", False)
            with torch.no_grad():
                sub.load_parameter_state_from_dp_reshardable(sd["param_state"])
        # Without Apex / TE, megatron-core 0.16 gives every parameter the same `step` tensor on load, and
        # torch's Adam then advances it once per parameter: give each its own.
        inner = getattr(sub, "optimizer", None)
        for st in (inner.state.values() if inner is not None else ()):
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()
    torch.set_rng_state(state["rng"])
    return int(state["step"])


# Measurement helpers ------------------------------------------------------------------------------------
class RoutingCounter:
    """Counts tokens routed to each expert of each MoE layer (forward hooks on the routers)."""

    def __init__(self, chunks, num_layers: int, num_experts: int, moe_layers: list[int]):
        import torch

        from megatron.core.transformer.moe.router import TopKRouter

        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.float64)
        self.total = self.counts.clone()
        self._handles = []
        self.moe_layers = moe_layers   # 1-based, layers with experts
        for chunk in chunks:
            for layer in chunk.module.decoder.layers:
                router = getattr(getattr(layer, "mlp", None), "router", None)
                if isinstance(router, TopKRouter):
                    self._handles.append(router.register_forward_hook(self._hook(layer.layer_number - 1)))

    def _hook(self, index: int):
        def hook(module, inputs, output):
            if module.training and not getattr(module, "_counting_recompute", False):
                routing_map = output[1]
                self.counts[index] += routing_map.detach().to("cpu").double().sum(0)
        return hook

    def step_counts(self, duplicated_by: int):
        """All ranks' counts of this step, summed (each token once), then reset."""
        import torch

        counts = self.counts.clone().to(_device())
        torch.distributed.all_reduce(counts)
        counts = (counts.cpu() / duplicated_by).round()
        self.total += counts
        self.counts.zero_()
        return self.moe_rows(counts)

    def moe_rows(self, counts) -> list[list[int]]:
        return [[int(x) for x in counts[n - 1].tolist()] for n in self.moe_layers]


def _device():
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and \
        isinstance(torch.cuda.current_device(), int) else torch.device("cpu")


def _peak_memory_bytes() -> float:
    import torch

    if _device().type == "cuda":
        return float(torch.cuda.max_memory_allocated())
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0   # Linux reports KiB


def _reduce(values: list[float], op: str) -> list[float]:
    import torch

    t = torch.tensor(values, dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(t, op={"sum": torch.distributed.ReduceOp.SUM,
                                        "max": torch.distributed.ReduceOp.MAX}[op])
    return t.cpu().tolist()


# The loop -----------------------------------------------------------------------------------------------
def train(args: argparse.Namespace, after_step: Callable[[int], None] | None = None) -> dict:
    """Train ``args.steps`` steps of the plan in ``args.plan`` on this rank; rank 0 returns the summary.

    ``after_step(step)``, when given, runs on this rank after each step is recorded and checkpointed (the
    fault tests install one that kills a rank: tests/kill_worker.py)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from executor.data import SyntheticTask, TokenFile, microbatches

    from executor.launch import read_plan

    model, plan = read_plan(args.plan)
    cuda = _init_distributed(plan)
    world = torch.distributed.get_world_size()
    if world != plan.world_size:
        raise SystemExit(f"{args.plan}: plan needs {plan.world_size} processes (tp*pp*dp*cp), launched {world}")
    config, chunks, optimizer, vocab = _build(model, plan, args, cuda)
    run_dir = Path(args.run_dir)
    rank = torch.distributed.get_rank()
    source = (TokenFile(args.data, model.seq_len, vocab=model.vocab, dtype=args.data_dtype) if args.data
              else SyntheticTask(model.vocab, model.seq_len, seed=args.seed))
    start = 0
    if args.resume_from == "auto":   # started by hand: the newest usable checkpoint (launch chooses it itself)
        from executor.checkpoints import choose_resume

        ckpt = choose_resume(run_dir, plan, args.plan)[0]
    else:
        ckpt = None if args.resume_from == "none" else Path(args.resume_from)
    if ckpt is not None:
        start = load_checkpoint(ckpt, chunks, optimizer)
    counter = RoutingCounter(chunks, model.layers, model.num_experts,
                             [i + 1 for i, moe in enumerate(model.moe_mask()) if moe]) if model.is_moe else None
    dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    fwd_bwd = get_forward_backward_func()
    timing = {"forward_s": 0.0}
    device = _device()

    def forward_step(data_iterator, chunk):
        t0 = time.perf_counter()
        tokens, labels = next(data_iterator)
        tokens = torch.as_tensor(tokens, device=device)
        labels = torch.as_tensor(labels, device=device)
        position_ids = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
        output = chunk(tokens, position_ids, None, labels=labels)
        timing["forward_s"] += time.perf_counter() - t0

        def loss_func(output_tensor):
            loss = output_tensor.float().mean()
            return loss, {"lm loss": loss.detach().clone()}

        return output, loss_func

    metrics_path = run_dir / "metrics.jsonl"
    if rank == 0:
        if start == 0:
            write_atomic(metrics_path, "", "metrics")
        else:   # drop lines of steps after the checkpoint (they will be recomputed)
            kept = [ln for ln in metrics_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= start]
            write_atomic(metrics_path, "".join(k + "\n" for k in kept), "metrics")
    tokens_per_step = plan.global_batch * model.seq_len
    last_stage_reporter = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0 \
        and ps.get_context_parallel_rank() == 0
    with _manual_gc():
        for step in range(start, args.steps):
            t0 = time.perf_counter()
            timing["forward_s"] = 0.0
            for c in chunks:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            its = [microbatches(source, step=step, global_batch=plan.global_batch, dp=dp, dp_rank=dp_rank,
                                micro_batch=plan.micro_batch) for _ in chunks]
            losses = fwd_bwd(forward_step_func=forward_step, data_iterator=its if len(its) > 1 else its[0],
                             model=chunks, num_microbatches=plan.num_microbatches, seq_length=model.seq_len,
                             micro_batch_size=plan.micro_batch, forward_only=False)
            t1 = time.perf_counter()
            _, grad_norm, _ = optimizer.step()
            t2 = time.perf_counter()
            loss = float(np.mean([x["lm loss"].item() for x in losses])) if last_stage_reporter and losses else 0.0
            loss_sum, = _reduce([loss / dp if last_stage_reporter else 0.0], "sum")
            step_time, fwd, peak = _reduce([t2 - t0, timing["forward_s"], _peak_memory_bytes()], "max")
            record = {"step": step + 1, "loss": loss_sum, "grad_norm": float(grad_norm or 0.0),
                      "step_time_s": step_time, "forward_s": fwd, "backward_s": max(0.0, (t1 - t0) - fwd),
                      "optimizer_s": t2 - t1, "tokens_per_s": tokens_per_step / step_time,
                      "peak_memory_bytes": peak, "memory_source": "cuda_allocator" if cuda else "process_rss"}
            if counter is not None:
                dup = 1 if config.sequence_parallel else plan.tp
                record["routing_counts"] = counter.step_counts(dup * plan.cp)
            if rank == 0:
                try:
                    with metrics_path.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                except OSError as exc:
                    raise disk_error(exc, metrics_path, "metrics") from None
            if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                save_checkpoint(run_dir, step + 1, chunks, optimizer, plan)
            if after_step is not None:
                after_step(step + 1)
            if (step + 1) % MANUAL_GC_INTERVAL_STEPS == 0:
                gc.collect()
    summary = summarize(metrics_path, model, plan, cuda) if rank == 0 else {}
    if rank == 0:
        cluster = json.loads(Path(args.plan).read_text()).get("cluster")
        if cluster is not None:
            summary["cluster"] = cluster   # what `plan calibrate` estimates the run on
    if counter is not None and rank == 0:
        summary["moe_routing_histogram"] = counter.moe_rows(counter.total)
        summary["moe_layers"] = counter.moe_layers
    if rank == 0:
        summary["resumed_from_step"] = start
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n", "the summary")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return summary


@contextlib.contextmanager
def _manual_gc():
    """Megatron-LM --manual-gc, as the planner's flags write it: Python's collector off while training, run by the
    loop on every rank at the same steps (costmodel.rules.MANUAL_GC_INTERVAL_STEPS), not whenever one rank's
    allocations trip it; restored afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize(metrics_path: Path, model: ModelSpec, plan: ParallelPlan, cuda: bool) -> dict:
    """Median step time (first step excluded as warm-up when there are several), final loss and peaks."""
    rows = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln]
    timed = rows[1:] if len(rows) > 1 else rows
    med = float(np.median([r["step_time_s"] for r in timed])) if timed else float("nan")
    return {"steps": len(rows), "step_time_s": med,
            "tokens_per_s": plan.global_batch * model.seq_len / med if timed else float("nan"),
            "first_loss": rows[0]["loss"] if rows else None, "final_loss": rows[-1]["loss"] if rows else None,
            "peak_memory_bytes": max((r["peak_memory_bytes"] for r in rows), default=0.0),
            "device": "cuda" if cuda else "cpu", "plan": plan.model_dump(mode="json"),
            "model": model.model_dump(mode="json")}


def main(argv: list[str] | None = None, after_step: Callable[[int], None] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from executor.launch import die_with_parent

    # A worker never outlives torchrun (killed, or stopped by `plan`), even one torchrun started just before.
    die_with_parent(signal.SIGKILL, parent_runs="torch" if "TORCHELASTIC_RUN_ID" in os.environ else None)
    args = parse_args(argv)
    record(train)(args, after_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
