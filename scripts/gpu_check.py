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

``--dry-run`` runs the same four steps on the CPU with gloo: a quick profile, a 2-layer model, 3 steps.
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

GPU_DEFAULTS = {"steps": 50, "global_batch": 32}
DRY_DEFAULTS = {"steps": 3, "global_batch": 4}
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
    args = ap.parse_args(argv)
    defaults = DRY_DEFAULTS if args.dry_run else GPU_DEFAULTS
    args.steps = args.steps or defaults["steps"]
    args.global_batch = args.global_batch or defaults["global_batch"]
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is warm-up)")
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


def train(args, plan_path: Path, out: Path, child_env: dict) -> dict:
    run_dir = out / "run"
    plan_cmd("run", str(plan_path), "--run-dir", str(run_dir), "--steps", str(args.steps), "--dtype", "bf16",
             "--timeout", str(args.timeout), "--json", json_out=out / "run_summary.json", env=child_env)
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
    say(f"finished in {time.perf_counter() - t0:.0f} s; profile, metrics and table under {out}")
    if not result["finite"]:
        fail("a figure of the table is not finite (see predicted_vs_measured.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
