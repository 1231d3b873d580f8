"""Launch a training run of a plan with torchrun, refuse bad plans before any process starts, and turn a
dead worker into that worker's error.

The same call runs on a GPU node (NCCL, one process per GPU) and on a CPU-only machine (gloo, one process
per rank). Multi-node runs use the launch.sh / launch.sbatch written by ``plan --out``; this module starts
single-node runs, which is what trial runs, tests and the CPU closed loop need.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from costmodel.profiles import InputError
from costmodel.rules import violations
from costmodel.specs import ModelSpec, ParallelPlan

# CPU runs: one process per rank; more than this many on one machine is refused.
CPU_MAX_PROCESSES = 16


class LaunchError(RuntimeError):
    """A launch that failed after it started: carries the first failing worker's error."""


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict
    metrics: list[dict]


# Fields a plan.json's plan must state: a missing degree would silently train another layout.
REQUIRED_PLAN_FIELDS = ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch")


def read_plan(path: str | os.PathLike) -> tuple[ModelSpec, ParallelPlan]:
    """Model and plan of a plan.json, with a one-line error naming the file when it is not one."""
    from costmodel.profiles import read_text, validation_line

    p = Path(path)
    try:
        data = json.loads(read_text(p, "plan file"))
    except InputError as exc:
        if not p.exists():
            raise InputError(f"{path}: plan file not found (write one with `plan ... --out DIR`)") from None
        raise exc from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise InputError(f"{path}: not JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with model, cluster and plan (as `plan --out` writes), "
                         f"got {type(data).__name__}")
    for key in ("model", "plan"):
        if not isinstance(data.get(key), dict):
            what = "missing" if key not in data else f"not an object ({type(data[key]).__name__})"
            raise InputError(f"{path}: key '{key}' {what} (plan.json from `plan --out` has model, cluster, plan)")
    missing = [k for k in REQUIRED_PLAN_FIELDS if k not in data["plan"]]
    if missing:
        raise InputError(f"{path}: field 'plan.{missing[0]}' missing (required: {', '.join(REQUIRED_PLAN_FIELDS)})")
    from pydantic import ValidationError

    def parse(key: str, spec):
        try:
            return spec.model_validate(data[key])
        except ValidationError as exc:
            names = {*data[key], *spec.model_fields}
            raise InputError(f"{path}: {validation_line(exc, {k: f'{key}.{k}' for k in map(str, names)})}") from None

    return parse("model", ModelSpec), parse("plan", ParallelPlan)


def available_processes() -> tuple[int, str]:
    """How many ranks this machine can run, and on what (GPUs, else CPU processes)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), "GPUs"
    except ImportError:
        pass
    return CPU_MAX_PROCESSES, "CPU processes"


def preflight(model: ModelSpec, plan: ParallelPlan, *, source: str = "plan") -> None:
    """Refuse a plan the model cannot take or this machine cannot run, before any process starts."""
    bad = violations(model, plan)
    if bad:
        raise InputError(f"{source}: {bad[0]}")
    if plan.cp > 1:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise InputError(f"{source}: cp={plan.cp} needs Transformer Engine's attention, which is not "
                             f"installed here; use cp=1") from None
    if plan.zero_stage > 1:
        raise InputError(f"{source}: zero_stage={plan.zero_stage} (FSDP) is not run by the executor; "
                         f"use zero_stage 0 or 1 (distributed optimizer)")
    have, what = available_processes()
    if plan.world_size > have:
        raise InputError(f"{source}: the plan needs {plan.world_size} ranks (tp*pp*dp*cp = {plan.tp}*{plan.pp}*"
                         f"{plan.dp}*{plan.cp}) but this machine runs at most {have} {what}")


_ERROR = re.compile(r"^\[rank(\d+)\]:\s*((?:[\w.]+Error|[\w.]+Exception|SystemExit)\b.*)$")


# Errors a worker raises because another one died: they point at the peer, not at the cause.
_SECONDARY = re.compile(r"Connection (reset|closed|refused)|pair\.cc|Broken pipe|[Tt]imed? ?out|NCCL.*(remote|abort)")
_EXIT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def first_worker_error(log: str) -> str | None:
    """The failing worker's error, as 'rank N: Error: message'.

    A worker's own exception comes first; then a worker killed by a signal other than torchrun's SIGTERM;
    errors that only say a peer went away (connection reset, timeouts) come last.
    """
    errors: dict[str, str] = {}
    for line in log.splitlines():
        m = _ERROR.match(line.strip())
        if m and "During handling" not in line:
            errors.setdefault(m.group(1), m.group(2))
    primary = [(r, e) for r, e in errors.items() if not _SECONDARY.search(e)]
    if primary:
        return f"rank {primary[0][0]}: {primary[0][1]}"
    exits = [(r, int(c)) for r, c in _EXIT.findall(log)]
    killed = [(r, c) for r, c in exits if c < 0 and c != -15]
    if killed:
        return f"rank {killed[0][0]}: killed by signal {-killed[0][1]}"
    failed = [(r, c) for r, c in exits if c > 0]
    if failed:
        return f"rank {failed[0][0]}: exited with code {failed[0][1]}"
    if errors:
        rank, err = next(iter(errors.items()))
        return f"rank {rank}: {err}"
    if exits:
        return f"rank {exits[0][0]}: exited with code {exits[0][1]}"
    return None


def default_dtype(model: ModelSpec) -> str:
    """The training dtype a model's precision asks for (fp8/fp4 recipes train in bf16 here: no Transformer
    Engine path in the executor yet)."""
    return {"fp32": "fp32", "fp16": "fp16"}.get(model.precision, "bf16")


def launch(plan_path: str | os.PathLike, run_dir: str | os.PathLike, *, steps: int = 10, dtype: str | None = None,
           lr: float = 3e-3, seed: int = 1234, data: str | None = None, checkpoint_every: int = 0,
           init: str = "canonical", timeout_s: float | None = None, env: dict[str, str] | None = None,
           quiet: bool = True) -> RunResult:
    """Run ``executor.train`` for a plan under torchrun on this machine and return its summary.

    Raises InputError before starting when the plan is invalid or does not fit the machine, and
    LaunchError naming the failing worker's error when a worker dies (torchrun stops the others).
    """
    model, plan = read_plan(plan_path)
    preflight(model, plan, source=str(plan_path))
    dtype = dtype or default_dtype(model)
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={plan.world_size}",
           "-m", "executor.train", "--plan", str(Path(plan_path).resolve()), "--run-dir", str(run.resolve()),
           "--steps", str(steps), "--dtype", dtype, "--lr", str(lr), "--seed", str(seed),
           "--checkpoint-every", str(checkpoint_every), "--init", init]
    if data:
        cmd += ["--data", str(Path(data).resolve())]
    child_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = root + os.pathsep + child_env.get("PYTHONPATH", "")
    log_path = run / "launch.log"
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{run}: no result after {timeout_s:.0f} s; workers stopped (log: {log_path})") from None
    if proc.returncode != 0:
        err = first_worker_error(log_path.read_text(errors="replace")) or f"torchrun exited with {proc.returncode}"
        raise LaunchError(f"{run}: {err} (log: {log_path})")
    return read_run(run)


def read_run(run_dir: str | os.PathLike) -> RunResult:
    run = Path(run_dir)
    summary = json.loads((run / "summary.json").read_text())
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln]
    return RunResult(run, summary, metrics)
