"""GPU check: measure one GPU, train a ~1B-parameter plan on it, and compare the run with the cost model's
prediction from the fresh measurement. Run it through ``bash scripts/gpu_check.sh`` (README "GPU check").

    OUT=DIR bash scripts/gpu_check.sh [--steps 50] [--global-batch 32] [--gpu 0]
    bash scripts/gpu_check.sh --dry-run          # CPU, gloo, tiny model, 3 steps: the same code path, in CI

Four steps, each a ``plan`` command or the cost model, everything written under ``--out``:

1. ``plan profile --world-size 1 --base <shipped profile of this GPU>``: a GEMM sweep (fp32, tf32, bf16, fp16,
   fp8 on CUDA) and the HBM copy bandwidth of one GPU -> ``profile/gpu.yaml`` and ``profile/cluster.yaml``
   (one node, one GPU); one rank measures no collectives, so their curves are the base profile's (a one-GPU
   run has none to price).
2. ``plan --model model/config.json --cluster profile/cluster.yaml --out plan``: the best plan of a Llama-style
   1.2B model (16 layers, hidden 2048, SwiGLU 8192, GQA 32/8 heads, vocab 32,000, sequence 2,048) on that
   GPU -> ``plan/plan.json``.
3. ``plan run plan/plan.json --steps 50 --dtype bf16``: megatron-core on NCCL (Transformer Engine's layer
   spec when it is importable, the local one otherwise) -> ``run/metrics.jsonl``, ``run/summary.json``.
4. The cost model's estimate of that plan on the measured profile against the run: step time, tokens/s,
   MFU (against the measured bf16 peak) and peak memory -> ``predicted_vs_measured.{md,json}``.
5. The loop the product runs (skip with ``--no-loop``): the same layout at another micro-batch size for
   ``--extra-steps`` steps, ``plan calibrate`` on both runs (two micro-batch sizes of one layout fit the host
   time per layer and micro-batch beside one token-scaled factor) -> ``profile/calibrated.yaml``, the plan
   searched again on it -> ``plan_calibrated/plan.json``, and its pick run when no run above measured it;
   every run predicted before and after calibration -> the ``loop`` section of the table.

6. Optimizer offload (skip with ``--no-offload``; skipped on CPU and without Transformer Engine, which
   megatron-core's precision-aware optimizer needs): the plan with all of its optimizer state in host memory
   for ``--extra-steps`` steps, beside its prediction on the measured profile (whose host side step 1 measured:
   the pinned copies and the CPU Adam step) -> the ``offload`` section of the table.

``--dry-run`` runs the same steps on the CPU with gloo: a quick profile, a 2-layer model, 3 steps.
Exit status 0: every figure is finite; 1: a step failed or a figure is not finite; 2: bad input (no GPU
without --dry-run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A Llama-style model of ~1.2B parameters (untied embeddings, as executor/model.py builds it), bf16.
MODEL_1B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16,
            "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 2048, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# The dry run's model: the same family, small enough for two CPU cores.
MODEL_TINY = {**MODEL_1B, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 32}

GPU_DEFAULTS = {"steps": 50, "global_batch": 32, "extra_steps": 10}
DRY_DEFAULTS = {"steps": 3, "global_batch": 4, "extra_steps": 3}
FALLBACK_BASE = "H100"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                    help="output directory (default: $OUT, else ./gpu_check_out)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny model, 3 steps (for CI)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 50; dry run 3)")
    ap.add_argument("--global-batch", type=int, default=None, help="sequences per step (default 32; dry run 4)")
    ap.add_argument("--gpu", type=int, default=0, help="which visible GPU to use (default 0)")
    ap.add_argument("--base", default=None, help="profile whose collective curves the one-rank profile takes "
                                                 "(default: the shipped profile of this GPU, else H100)")
    ap.add_argument("--timeout", type=float, default=360.0, help="seconds allowed for the training run (default 360)")
    ap.add_argument("--no-loop", action="store_true",
                    help="stop after the table (no second micro-batch run, calibration or re-plan)")
    ap.add_argument("--no-offload", action="store_true", help="skip step 6 (the optimizer-offload run)")
    ap.add_argument("--extra-steps", type=int, default=None,
                    help="steps of each run of the loop (default 10; dry run 3)")
    args = ap.parse_args(argv)
    defaults = DRY_DEFAULTS if args.dry_run else GPU_DEFAULTS
    args.steps = args.steps or defaults["steps"]
    args.global_batch = args.global_batch or defaults["global_batch"]
    args.extra_steps = args.extra_steps or defaults["extra_steps"]
    if args.steps < 2 or args.extra_steps < 2:
        ap.error("--steps and --extra-steps must be at least 2 (the first step is warm-up)")
    return args


def say(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


def fail(msg: str, code: int = 1) -> None:
    print(f"gpu_check: error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def environment(args: argparse.Namespace) -> dict:
    """What this run is on: torch, CUDA, the GPU, NCCL, Transformer Engine."""
    import torch

    env = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "dry_run": args.dry_run,
           "python": sys.version.split()[0]}
    try:
        import transformer_engine

        env["transformer_engine"] = getattr(transformer_engine, "__version__", "importable")
    except ImportError:
        env["transformer_engine"] = None
    env["transformer_impl"] = "transformer_engine" if env["transformer_engine"] else "local"
    if args.dry_run:
        env.update(device="cpu", backend="gloo")
        return env
    if not torch.cuda.is_available():
        fail("no CUDA GPU visible to torch; run with --dry-run on a CPU machine", 2)
    if not 0 <= args.gpu < torch.cuda.device_count():
        fail(f"--gpu {args.gpu}: {torch.cuda.device_count()} GPU(s) visible", 2)
    props = torch.cuda.get_device_properties(args.gpu)
    env.update(device="cuda", backend="nccl", gpu_name=torch.cuda.get_device_name(args.gpu),
               compute_capability=f"{props.major}.{props.minor}", gpu_memory_bytes=int(props.total_memory),
               cuda=torch.version.cuda, nccl=_nccl_version(),
               bf16_supported=bool(torch.cuda.is_bf16_supported()))
    if not env["bf16_supported"]:
        fail(f"{env['gpu_name']} (compute capability {env['compute_capability']}) has no bf16; the check trains bf16")
    return env


def _nccl_version() -> str:
    import torch

    v = torch.cuda.nccl.version()   # a tuple (2, 21, 5) in current torch, an int 22105 in old ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def base_profile(args: argparse.Namespace, env: dict) -> str:
    from costmodel.profiles import InputError, load_profile

    if args.base:
        return args.base
    if env["device"] == "cuda":
        try:
            return load_profile(env["gpu_name"]).name
        except InputError:
            say(f"no shipped profile knows {env['gpu_name']!r}; collective curves from {FALLBACK_BASE}")
    return FALLBACK_BASE


def plan_cmd(*argv: str, json_out: Path | None = None, timeout: float | None = None,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m planner.cli ARGV`` in this checkout; stdout to ``json_out`` when given, stderr shown."""
    cmd = [sys.executable, "-m", "planner.cli", *argv]
    say("$ plan " + shlex.join(argv))
    child = dict(os.environ, **(env or {}))
    child["PYTHONPATH"] = str(ROOT) + os.pathsep + child.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=child, text=True, timeout=timeout,
                             stdout=subprocess.PIPE if json_out else None)
    except subprocess.TimeoutExpired:
        fail(f"`plan {argv[0]}` did not finish in {timeout:.0f} s")
    if res.returncode != 0:
        fail(f"`plan {shlex.join(argv)}` exited with {res.returncode}")
    if json_out is not None:
        json_out.write_text(res.stdout)
    say(f"  done in {time.perf_counter() - t0:.1f} s")
    return res


def measure_gpu(args, env: dict, out: Path, child_env: dict) -> dict:
    prof_dir = out / "profile"
    prof_dir.mkdir(parents=True, exist_ok=True)
    base = base_profile(args, env)
    argv = ["profile", "--out", str(prof_dir / "gpu.yaml"), "--cluster-out", str(prof_dir / "cluster.yaml"),
            "--name", "gpu-check", "--world-size", "1", "--backend", env["backend"], "--base", base,
            "--timeout", "300", "--json"]
    if args.dry_run:
        argv.append("--quick")
    plan_cmd(*argv, json_out=prof_dir / "profile_summary.json", env=child_env)
    summary = json.loads((prof_dir / "profile_summary.json").read_text())
    peaks = ", ".join(f"{dt} {v / 1e12:.3g}" for dt, v in sorted(summary["peak_flops"].items()))
    say(f"measured GEMM peaks (TFLOP/s): {peaks}; half-efficiency dimension "
        f"{summary['gemm_half_efficiency_dim']:.0f}, bf16 GEMM efficiency cap "
        f"{summary['gemm_max_efficiency'].get('bf16', float('nan')):.2f}")
    say(f"measured HBM copy bandwidth: {summary['hbm_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s; collective curves "
        f"from {base}")
    if "host_memory_bandwidth_bytes_per_s" in summary:
        say(f"measured host side: link {summary['host_link_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s (slower direction), "
            f"CPU Adam step {summary['host_memory_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s (what optimizer offload "
            f"streams at)")
    return summary


def make_plan(args, out: Path, child_env: dict) -> tuple[Path, dict]:
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL_TINY if args.dry_run else MODEL_1B, indent=1) + "\n")
    plan_dir = out / "plan"
    plan_cmd("--model", str(model_dir / "config.json"), "--cluster", str(out / "profile" / "cluster.yaml"),
             "--global-batch", str(args.global_batch), "--top", "3", "--out", str(plan_dir), "--json",
             json_out=out / "plan_search.json", env=child_env)
    data = json.loads((plan_dir / "plan.json").read_text())
    p = data["plan"]
    say(f"plan: tp{p['tp']} pp{p['pp']} dp{p['dp']}, micro-batch {p['micro_batch']}, global batch "
        f"{p['global_batch']} x {data['model']['seq_len']} tokens, recompute {p['recompute']}; "
        f"{params_b(data['model']):.3g}B parameters; predicted {data['estimate']['step_time_s'] * 1e3:.1f} ms/step")
    return plan_dir / "plan.json", data


def params_b(model: dict) -> float:
    from costmodel.flops import total_params
    from costmodel.specs import ModelSpec

    return float(total_params(ModelSpec.model_validate(model))) / 1e9


def train(args, plan_path: Path, out: Path, child_env: dict, name: str = "run", steps: int | None = None) -> dict:
    run_dir = out / name
    plan_cmd("run", str(plan_path), "--run-dir", str(run_dir), "--steps", str(steps or args.steps), "--dtype", "bf16",
             "--timeout", str(args.timeout), "--json", json_out=out / f"{name}_summary.json", env=child_env)
    summary = json.loads((run_dir / "summary.json").read_text())
    say(f"measured: {summary['steps']} steps on {summary['device']}, {summary['step_time_s'] * 1e3:.1f} ms/step "
        f"(median after the first), {summary['tokens_per_s']:.0f} tokens/s, loss {summary['first_loss']:.3f} -> "
        f"{summary['final_loss']:.3f}, peak memory {summary['peak_memory_bytes'] / 2**30:.2f} GiB")
    return summary


def compare(out: Path, plan_data: dict, run: dict, env: dict) -> dict:
    """The cost model's estimate of the plan on the fresh profile, beside the run's figures."""
    from costmodel.estimate import estimate
    from costmodel.profiles import load_cluster, load_profile
    from costmodel.specs import ModelSpec
    from costmodel.plan import ParallelPlan

    model = ModelSpec.model_validate(plan_data["model"])
    plan = ParallelPlan.model_validate(plan_data["plan"])
    cluster = load_cluster(out / "profile" / "cluster.yaml")
    est = estimate(model, cluster, plan)
    peak = load_profile(str(out / "profile" / "gpu.yaml")).peak("bf16")
    tokens = plan.global_batch * model.seq_len
    step = run["step_time_s"]
    rows = [
        ("step time (s)", est.step_time_s, step),
        ("tokens/s", tokens / est.step_time_s, run["tokens_per_s"]),
        ("MFU vs measured bf16 peak", est.model_flops_per_step / est.step_time_s / peak,
         est.model_flops_per_step / step / peak),
        ("peak memory (GiB)", max(est.peak_memory_bytes) / 2**30, run["peak_memory_bytes"] / 2**30),
    ]
    table = [{"quantity": q, "predicted": p, "measured": m, "measured_over_predicted": m / p if p else float("nan")}
             for q, p, m in rows]
    result = {"environment": env, "model": model.name, "plan": plan.model_dump(mode="json"),
              "measured_bf16_peak_flops": peak, "predicted_breakdown_s": est.breakdown_s,
              "predicted_bounds_s": [est.step_time_lower_s, est.step_time_upper_s],
              "memory_source": "cuda_allocator (max_memory_allocated)" if run["device"] == "cuda" else
              "process_rss (CPU)", "table": table}
    finite = all(math.isfinite(r[k]) for r in table for k in ("predicted", "measured", "measured_over_predicted"))
    result["finite"] = finite
    (out / "predicted_vs_measured.json").write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
    lines = [f"# GPU check: {model.name} on {env.get('gpu_name', 'CPU (dry run)')}", "",
             f"torch {env['torch']}, backend {env['backend']}, layer spec {env['transformer_impl']}, bf16, "
             f"{run['steps']} steps; prediction from the profile measured in this run.", "",
             "| quantity | predicted | measured | measured / predicted |", "|---|---:|---:|---:|"]
    lines += [f"| {r['quantity']} | {r['predicted']:.4g} | {r['measured']:.4g} | {r['measured_over_predicted']:.3f} |"
              for r in table]
    (out / "predicted_vs_measured.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), flush=True)
    return result


def other_micro_batch(plan: dict) -> int | None:
    """A micro-batch size for the loop's second run: 4x, 2x, 1/2 or 1/4 of the plan's, the first that divides
    the sequences each data-parallel rank takes per step."""
    per_rank, mb = plan["global_batch"] // plan["dp"], plan["micro_batch"]
    return next((m for m in (4 * mb, 2 * mb, mb // 2, mb // 4) if m >= 1 and per_rank % m == 0), None)


def close_loop(args, out: Path, plan_path: Path, plan_data: dict, first: dict, child_env: dict) -> dict | None:
    """Step 5 (module docstring): a second micro-batch size, calibration on both runs, the re-plan and its run."""
    from costmodel.estimate import estimate
    from costmodel.plan import ParallelPlan
    from costmodel.profiles import load_cluster, load_profile
    from costmodel.specs import ModelSpec

    other = other_micro_batch(plan_data["plan"])
    if other is None:
        say("loop skipped: no other micro-batch size divides the batch of a data-parallel rank")
        return None
    second_path = plan_path.with_name(f"plan_mb{other}.json")
    second_path.write_text(json.dumps({**plan_data, "plan": {**plan_data["plan"], "micro_batch": other}}, indent=1))
    runs = {"run": (plan_path, first), f"run_mb{other}": (second_path, train(
        args, second_path, out, child_env, name=f"run_mb{other}", steps=args.extra_steps))}
    prof_dir = out / "profile"
    plan_cmd("calibrate", "--measurements", *(str(out / name) for name in runs), "--profile",
             str(prof_dir / "gpu.yaml"), "--cluster", str(prof_dir / "cluster.yaml"), "--out",
             str(prof_dir / "calibrated.yaml"), "--json", json_out=out / "calibration.json", env=child_env)
    cal = json.loads((out / "calibration.json").read_text())
    say(f"calibrated {', '.join(f'{k} {v:.4g}' for k, v in cal['values'].items())}: step-time error on the two "
        f"runs {cal['mape_before']:.1f}% -> {cal['mape_after']:.1f}%")
    plan_cmd("--model", str(out / "model" / "config.json"), "--cluster", str(prof_dir / "cluster.yaml"),
             "--profile", str(prof_dir / "calibrated.yaml"), "--global-batch", str(args.global_batch), "--top", "3",
             "--out", str(out / "plan_calibrated"), "--json", json_out=out / "plan_calibrated_search.json",
             env=child_env)
    model = ModelSpec.model_validate(plan_data["model"])
    pick_path = out / "plan_calibrated" / "plan.json"
    pick = ParallelPlan.model_validate(json.loads(pick_path.read_text())["plan"])
    ran = {name: ParallelPlan.model_validate(json.loads(path.read_text())["plan"]) for name, (path, _) in runs.items()}
    pick_run = next((name for name, plan in ran.items() if plan == pick), None)
    if pick_run is None:
        pick_run, ran[pick_run] = "run_calibrated", pick
        runs[pick_run] = (pick_path, train(args, pick_path, out, child_env, name=pick_run, steps=args.extra_steps))
    cluster = load_cluster(prof_dir / "cluster.yaml")
    before, after = load_profile(str(prof_dir / "gpu.yaml")), load_profile(str(prof_dir / "calibrated.yaml"))
    rows = [{"run": name, "micro_batch": ran[name].micro_batch, "measured_s": summary["step_time_s"],
             "predicted_before_s": estimate(model, cluster, ran[name], profile=before).step_time_s,
             "predicted_after_s": estimate(model, cluster, ran[name], profile=after.for_model(model)).step_time_s}
            for name, (_, summary) in runs.items()]
    say(f"re-plan on the calibrated profile: micro-batch {pick.micro_batch}, recompute {pick.recompute} "
        f"({pick_run}); " + "; ".join(f"{r['run']}: measured {r['measured_s']:.4g} s, predicted "
                                      f"{r['predicted_before_s']:.4g} -> {r['predicted_after_s']:.4g} s" for r in rows))
    return {"calibration": {k: cal[k] for k in ("factors", "values", "mape_before", "mape_after")},
            "replan": {"plan": pick.model_dump(mode="json"), "run": pick_run}, "runs": rows}


def offload_run(args, out: Path, plan_data: dict, first: dict, env: dict, child_env: dict) -> dict | None:
    """Step 6 (module docstring): the plan with its optimizer state in host memory, run and predicted."""
    from costmodel.estimate import estimate
    from costmodel.plan import ParallelPlan
    from costmodel.profiles import load_cluster
    from costmodel.specs import ModelSpec

    if args.dry_run or not env.get("transformer_engine"):
        say("optimizer offload skipped: megatron-core steps it beside GPUs, with Transformer Engine "
            + ("(dry run on CPU)" if args.dry_run else "(not importable here)"))
        return None
    plan = {**plan_data["plan"], "optimizer_offload": 1.0, "zero_stage": max(1, plan_data["plan"]["zero_stage"]),
            "distributed_optimizer": True}
    path = out / "plan" / "plan_optimizer_offload.json"
    path.write_text(json.dumps({**plan_data, "plan": plan}, indent=1))
    try:
        run = train(args, path, out, child_env, name="run_optimizer_offload", steps=args.extra_steps)
    except SystemExit:   # the run's own error is above; the steps before it stand
        say("optimizer offload run failed (its error above); the table keeps the other steps")
        return {"failed": True}
    model = ModelSpec.model_validate(plan_data["model"])
    est = estimate(model, load_cluster(out / "profile" / "cluster.yaml"), ParallelPlan.model_validate(plan))
    row = {"measured_s": run["step_time_s"], "predicted_s": est.step_time_s,
           "predicted_cpu_step_s": est.breakdown_s.get("optimizer", math.nan),
           "measured_without_offload_s": first["step_time_s"],
           "measured_peak_memory_gib": run["peak_memory_bytes"] / 2**30,
           "predicted_peak_memory_gib": max(est.peak_memory_bytes) / 2**30}
    say(f"optimizer offload: measured {row['measured_s']:.4g} s/step ({row['measured_without_offload_s']:.4g} s "
        f"without), predicted {row['predicted_s']:.4g} s ({row['predicted_cpu_step_s']:.3g} s of it the CPU step); "
        f"peak memory {row['measured_peak_memory_gib']:.2f} GiB measured, {row['predicted_peak_memory_gib']:.2f} "
        f"predicted")
    return row


def offload_lines(row: dict) -> list[str]:
    """The optimizer-offload section of predicted_vs_measured.md."""
    return ["", "## Optimizer state in host memory (optimizer_offload 1)", "",
            "| quantity | predicted | measured |", "|---|---:|---:|",
            f"| step time (s) | {row['predicted_s']:.4g} | {row['measured_s']:.4g} |",
            f"| of it the CPU optimizer step (s) | {row['predicted_cpu_step_s']:.3g} | - |",
            f"| step time without offload (s) | - | {row['measured_without_offload_s']:.4g} |",
            f"| peak memory (GiB) | {row['predicted_peak_memory_gib']:.3g} | {row['measured_peak_memory_gib']:.3g} |"]


def add_section(out: Path, result: dict, key: str, data: dict, lines: list[str]) -> None:
    """A step's figures added to the table: ``result[key]`` in predicted_vs_measured.json, ``lines`` appended to
    predicted_vs_measured.md."""
    result[key] = data
    (out / "predicted_vs_measured.json").write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
    with open(out / "predicted_vs_measured.md", "a") as f:
        f.write("\n".join(lines) + "\n")


def loop_lines(loop: dict) -> list[str]:
    """The loop's section of predicted_vs_measured.md."""
    cal = loop["calibration"]
    lines = ["", f"## Calibrated on the runs: {', '.join(f'{k} {v:.4g}' for k, v in cal['values'].items())} "
             f"(step-time error {cal['mape_before']:.1f}% -> {cal['mape_after']:.1f}%); re-plan: micro-batch "
             f"{loop['replan']['plan']['micro_batch']} ({loop['replan']['run']})", "",
             "| run | micro-batch | measured s | predicted s, measured profile | predicted s, calibrated |",
             "|---|---:|---:|---:|---:|"]
    return lines + [f"| {r['run']} | {r['micro_batch']} | {r['measured_s']:.4g} | {r['predicted_before_s']:.4g} | "
                    f"{r['predicted_after_s']:.4g} |" for r in loop["runs"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = environment(args)
    (out / "environment.json").write_text(json.dumps(env, indent=1) + "\n")
    say(f"{'dry run on CPU (gloo)' if args.dry_run else env['gpu_name'] + ' (NCCL ' + env['nccl'] + ')'}, torch "
        f"{env['torch']}, layer spec: {env['transformer_impl']}; output in {out}")
    # One GPU: the children see only the chosen one; the dry run never touches CUDA.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    child_env = {"CUDA_VISIBLE_DEVICES": "" if args.dry_run else
                 (visible.split(",")[args.gpu] if visible else str(args.gpu))}
    measure_gpu(args, env, out, child_env)
    plan_path, plan_data = make_plan(args, out, child_env)
    run = train(args, plan_path, out, child_env)
    if not args.dry_run and run["device"] != "cuda":
        fail(f"the run went to {run['device']}, not the GPU")
    result = compare(out, plan_data, run, env)
    if not args.no_loop:
        loop = close_loop(args, out, plan_path, plan_data, run, child_env)
        if loop is not None:
            add_section(out, result, "loop", loop, loop_lines(loop))
    if not args.no_offload:
        row = offload_run(args, out, plan_data, run, env, child_env)
        if row is not None:
            add_section(out, result, "offload", row,
                        ["", "## Optimizer state in host memory: the run failed (see the log)"]
                        if row.get("failed") else offload_lines(row))
    say(f"finished in {time.perf_counter() - t0:.0f} s; profile, metrics and table under {out}")
    if not result["finite"]:
        fail("a figure of the table is not finite (see predicted_vs_measured.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
