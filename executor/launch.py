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
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from costmodel.plan import ParallelPlan
from costmodel.profiles import InputError
from costmodel.rules import violations
from costmodel.specs import ModelSpec

# CPU runs: one process per rank, at most RANKS_PER_CORE per core this process may run on and one per
# CPU_RANK_BYTES of available memory (a tiny-gpt rank peaks at 0.40 GiB resident: torch, megatron-core, gloo).
RANKS_PER_CORE = 2
CPU_RANK_BYTES = 512 * 2**20


class LaunchError(RuntimeError):
    """A launch that failed after it started: carries the first failing worker's error."""


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict
    metrics: list[dict]
    notes: tuple[str, ...] = ()   # checkpoints passed over (damaged, incomplete) and which one was resumed


# Fields a plan.json must state: a missing degree would silently train another layout (tp 1, ...).
REQUIRED_PLAN_FIELDS = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "sequence_parallel", "micro_batch",
                        "global_batch", "recompute", "distributed_optimizer", "zero_stage")


def read_plan(path: str | os.PathLike) -> tuple[ModelSpec, ParallelPlan]:
    """Model and plan of a plan.json, with a one-line error naming the file when it is not one."""
    from costmodel.profiles import parse_json, read_text, validation_line

    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: plan file not found (write one with `plan ... --out DIR`)")
    data = parse_json(read_text(p, "plan file"), path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with model, cluster and plan (as `plan --out` writes), "
                         f"got {type(data).__name__}")
    for key in ("model", "plan"):
        if not isinstance(data.get(key), dict):
            what = "missing" if key not in data else f"not an object ({type(data[key]).__name__})"
            raise InputError(f"{path}: key '{key}' {what} (plan.json from `plan --out` has model, cluster, plan)")
    missing = [k for k in REQUIRED_PLAN_FIELDS if k not in data["plan"]]
    if missing:
        raise InputError(f"{path}: plan field '{missing[0]}' is missing (a plan.json from `plan --out` states "
                         f"{', '.join(REQUIRED_PLAN_FIELDS)})")
    from pydantic import ValidationError

    def parse(key: str, spec):
        try:
            return spec.model_validate(data[key])
        except ValidationError as exc:
            names = {*data[key], *spec.model_fields}
            raise InputError(f"{path}: {validation_line(exc, {k: f'{key}.{k}' for k in map(str, names)})}") from None

    model = parse("model", ModelSpec)
    if model.finetune != "full":
        raise InputError(f"{path}: model.finetune is {model.finetune!r}; the executor trains every weight "
                         f"(finetune 'full'): plan LoRA here, run it with Megatron-Bridge's PEFT")
    if model.optimizer != "adam":
        raise InputError(f"{path}: model.optimizer is {model.optimizer!r}; the executor steps with Adam (Muon needs "
                         f"NVIDIA's emerging_optimizers package): run this plan with Megatron-LM's --optimizer "
                         f"dist_muon, as megatron_args.txt writes it; valid here: optimizer 'adam'")
    plan = parse("plan", ParallelPlan)
    if plan.recompute == "offload" and available_processes()[1] != "GPUs":
        raise InputError(f"{path}: plan.recompute is 'offload': activation offloading runs through Transformer "
                         f"Engine on GPUs, and this machine has none; valid here: none, selective or full")
    return model, plan


def available_processes() -> tuple[int, str]:
    """How many ranks this machine can run, and on what (GPUs, else CPU processes: RANKS_PER_CORE per core
    this process may use, within the available memory at CPU_RANK_BYTES a rank)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), "GPUs"
    except ImportError:
        pass
    cores = _usable_cores()
    n = RANKS_PER_CORE * cores
    memory = _available_memory_bytes()
    if memory is not None:
        n = min(n, int(memory // CPU_RANK_BYTES))
    mem = "" if memory is None else f", {CPU_RANK_BYTES / 2**30:.1f} GiB each of {memory / 2**30:.1f} GiB available"
    return max(1, n), f"CPU processes ({RANKS_PER_CORE} per core on {cores} cores{mem})"


def _usable_cores() -> int:
    """Cores this process may run on: its affinity, within a cgroup v2 CPU quota when there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _available_memory_bytes() -> float | None:
    """MemAvailable (Linux), within a cgroup v2 memory limit when there is one; None where unknown."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            avail = min(avail if avail is not None else float("inf"), float(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def die_with_parent(sig: int = signal.SIGTERM, parent_runs: str | None = None) -> None:
    """Have the kernel send this process ``sig`` when its parent dies (Linux ``PR_SET_PDEATHSIG``, which
    survives exec; used as torchrun's preexec_fn and by every worker). When the parent died before the call
    (it is no longer the one at the start of the call, or its command line lacks ``parent_runs``: a worker
    whose torchrun is already gone has been handed to init), ``sig`` is sent at once. Elsewhere a no-op:
    there, `plan` stops torchrun's process group itself."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0) != 0:   # 1: PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    orphan = os.getppid() != parent
    if parent_runs is not None and not orphan:
        try:
            orphan = parent_runs not in Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            orphan = True
    if orphan:
        os.kill(os.getpid(), sig)


def preflight(model: ModelSpec, plan: ParallelPlan, *, source: str = "plan") -> None:
    """Refuse a plan the model cannot take or this machine cannot run, before any process starts."""
    bad = violations(model, plan)
    if bad:
        raise InputError(f"{source}: {bad[0]}")
    if model.hybrid_pattern:
        # megatron-core's MambaModel needs the mamba_ssm and causal_conv1d CUDA kernels; the executor builds GPTModel.
        raise InputError(f"{source}: model {model.name} is a hybrid Mamba model (hybrid_pattern); the executor builds "
                         f"transformers (megatron-core GPTModel) only; run it with Megatron-LM's pretrain_mamba.py "
                         f"and the plan's launch.sh")
    if plan.cp > 1:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise InputError(f"{source}: cp={plan.cp} needs Transformer Engine's attention, which is not "
                             f"installed here; use cp=1") from None
    if plan.zero_stage > 1:
        raise InputError(f"{source}: zero_stage={plan.zero_stage} (FSDP) is not run by the executor; "
                         f"use zero_stage 0 or 1 (distributed optimizer)")
    if plan.dist_opt_instances > 1:
        # megatron-core's partial distributed optimizer overlaps its replica all-reduce on a CUDA stream of its own.
        raise InputError(f"{source}: dist_opt_instances={plan.dist_opt_instances} (optimizer state sharded inside "
                         f"replicas) is not run by the executor; use dist_opt_instances 1")
    if plan.optimizer_offload:
        # megatron-core's HybridDeviceOptimizer copies between the GPU and pinned host memory on CUDA streams, and
        # runs with the precision-aware optimizer, whose configuration asks Transformer Engine for its version.
        if available_processes()[1] != "GPUs":
            raise InputError(f"{source}: optimizer_offload={plan.optimizer_offload:g} (megatron-core "
                             f"--optimizer-cpu-offload) steps host memory beside GPUs, and this machine has none; "
                             f"valid here: optimizer_offload 0")
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise InputError(f"{source}: optimizer_offload={plan.optimizer_offload:g} needs Transformer Engine "
                             f"(megatron-core's precision-aware optimizer), which is not installed here; use "
                             f"optimizer_offload 0") from None
    if plan.moe_a2a_overlap:
        # megatron-core's combined 1F1B schedule runs the all-to-all on a CUDA stream of its own.
        raise InputError(f"{source}: moe_a2a_overlap (megatron-core --overlap-moe-expert-parallel-comm) is not run by "
                         f"the executor; use moe_a2a_overlap false")
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
    return {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}.get(model.precision, "bf16")


def launch(plan_path: str | os.PathLike, run_dir: str | os.PathLike, *, steps: int = 10, dtype: str | None = None,
           lr: float = 3e-3, seed: int = 1234, data: str | None = None, checkpoint_every: int = 0,
           init: str = "canonical", timeout_s: float | None = None, env: dict[str, str] | None = None,
           quiet: bool = True, worker: str | os.PathLike | None = None) -> RunResult:
    """Run ``executor.train`` for a plan under torchrun on this machine and return its summary.

    ``worker``: a Python file torchrun runs on each rank instead (it takes executor.train's arguments and
    calls ``executor.train.main``; the fault tests pass tests/kill_worker.py).

    Raises InputError before starting when the plan is invalid or does not fit the machine, when another
    launch holds the run directory (``RunLock``), or when its checkpoints cannot be resumed with this plan
    (``executor.checkpoints.choose_resume``); LaunchError naming the failing worker's error when a worker
    dies (torchrun stops the others). torchrun runs in a process group of its own that ends with this
    process: SIGINT / SIGTERM / a timeout stop it and its workers (SIGTERM, then SIGKILL after STOP_GRACE_S),
    and the kernel kills it and them if this process dies. Each attempt appends to ``launch.log`` under a
    header line, so the log of a failed attempt is still there after a resume.
    """
    from executor.checkpoints import choose_resume

    model, plan = read_plan(plan_path)
    preflight(model, plan, source=str(plan_path))
    dtype = dtype or default_dtype(model)
    run = Path(run_dir)
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{run}: cannot create the run directory ({exc.strerror}); choose a writable --run-dir") from None
    with RunLock(run):
        done = _finished(run, plan, steps)
        if done is not None:
            return done
        resume, notes = choose_resume(run, plan, str(plan_path))
        script = ["-m", "executor.train"] if worker is None else [str(Path(worker).resolve())]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={plan.world_size}",
               *script, "--plan", str(Path(plan_path).resolve()), "--run-dir", str(run.resolve()),
               "--steps", str(steps), "--dtype", dtype, "--lr", str(lr), "--seed", str(seed),
               "--checkpoint-every", str(checkpoint_every), "--init", init,
               "--resume-from", str(resume.resolve()) if resume is not None else "none"]
        if data:
            cmd += ["--data", str(Path(data).resolve())]
        child_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
        root = str(Path(__file__).resolve().parent.parent)
        child_env["PYTHONPATH"] = root + os.pathsep + child_env.get("PYTHONPATH", "")
        log = _AttemptLog(run / "launch.log")
        log.header(f"pid {os.getpid()}, {'resuming from ' + resume.name if resume else 'from step 0'}: "
                   + " ".join(cmd), notes)
        rc = _run_torchrun(cmd, child_env, log, timeout_s, run)
        if rc != 0:
            err = first_worker_error(log.text()) or f"torchrun exited with {rc}"
            raise LaunchError(f"{run}: {err} ({log.where()})")
        res = read_run(run)
    return RunResult(res.run_dir, res.summary, res.metrics, tuple(notes))


def _finished(run: Path, plan: ParallelPlan, steps: int) -> RunResult | None:
    """The run already in ``run`` when it trained this plan for at least ``steps`` steps (summary.json and
    metrics.jsonl agree): rerunning a finished command returns it instead of training again."""
    from executor.checkpoints import metrics_steps

    try:
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("plan") != plan.model_dump(mode="json"):
        return None
    if not isinstance(summary.get("steps"), int) or summary["steps"] < steps or metrics_steps(run) != summary["steps"]:
        return None
    res = read_run(run)
    return RunResult(res.run_dir, res.summary, res.metrics,
                     (f"{run}: already trained {summary['steps']} steps with this plan (summary.json); nothing run",))


STOP_GRACE_S = 20.0


def _run_torchrun(cmd: list[str], env: dict, log: "_AttemptLog", timeout_s: float | None, run: Path) -> int:
    """torchrun in its own session (pgid = its pid) that dies with this process; its output copied to the
    log. SIGINT / SIGTERM here, or the timeout, stop the group and raise (KeyboardInterrupt / LaunchError)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=die_with_parent)
    reader = threading.Thread(target=log.copy, args=(proc.stdout,), daemon=True)
    reader.start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def interrupt(*_):
            raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise LaunchError(f"{run}: no result after {timeout_s:.0f} s; workers stopped ({log.where()})") from None
        except KeyboardInterrupt:
            _stop_group(proc)
            raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:   # any other exception on the way out
            _stop_group(proc)
        reader.join(timeout=10)
        _remove_partial_writes(run)
    return rc


def _remove_partial_writes(run: Path) -> None:
    """Temporary files of writes a killed worker did not finish (checkpoint shards, metrics): once torchrun's
    group has ended nothing will rename them, and the checkpoint without its manifest is passed over."""
    for tmp in (run / "checkpoints").rglob("*.tmp") if (run / "checkpoints").is_dir() else ():
        try:
            tmp.unlink()
        except OSError:
            pass


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun's process group (torchrun passes it on to its workers), SIGKILL after STOP_GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class _AttemptLog:
    """launch.log, appended to: a header line per attempt, then torchrun's output. The attempt's output is
    also kept in memory, so that a worker's error is reported even when the log cannot be written (a full
    disk); a write error is remembered and named in the launch error instead."""

    HEADER = "==== plan run attempt"

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[str] = []
        self.error: str | None = None
        self._f = None
        try:
            self._f = path.open("a")
        except OSError as exc:
            self.error = f"{exc.strerror}"

    def _write(self, text: str) -> None:
        if self._f is None:
            return
        try:
            self._f.write(text)
            self._f.flush()
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None

    def header(self, what: str, notes: list[str]) -> None:
        n = 1
        try:
            if self.path.is_file():   # (not a device or a pipe someone put there)
                with self.path.open(errors="replace") as f:
                    n += sum(1 for ln in f if ln.startswith(self.HEADER))
        except OSError:
            pass
        self._write(f"{self.HEADER} {n} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {what}\n")
        for note in notes:
            self._write(f"note: {note}\n")

    def copy(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            self.lines.append(line)
            self._write(line)
        stream.close()
        if self._f is not None:
            try:
                self._f.close()
            except OSError as exc:
                self.error = exc.strerror or str(exc)

    def text(self) -> str:
        return "".join(self.lines)

    def where(self) -> str:
        if self.error:
            return f"log: {self.path} could not be written: {self.error}"
        return f"log: {self.path}"


class RunLock:
    """An exclusive lock on a run directory (``flock`` on RUN_DIR/.lock, which holds the owner's pid): a second
    launch on the same directory is refused with a one-line error naming the process that holds it. The
    kernel releases it when the holder exits, however it exits."""

    def __init__(self, run: Path):
        self.path = Path(run) / ".lock"
        self._f = None

    def __enter__(self):
        import fcntl

        try:
            self._f = open(self.path, "a+")
        except OSError as exc:
            raise InputError(f"{self.path.parent}: cannot write the run directory ({exc.strerror}); choose a "
                             f"writable --run-dir") from None
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = self._f.read().strip() or "unknown"
            self._f.close()
            raise InputError(f"{self.path.parent}: in use by another `plan run` (pid {holder}, lock {self.path}); "
                             f"wait for it to end or use another --run-dir") from None
        try:
            self._f.seek(0)
            self._f.truncate()
            self._f.write(f"{os.getpid()}\n")
            self._f.flush()
        except OSError:
            pass   # the lock holds without the pid
        return self

    def __exit__(self, *exc):
        try:
            self._f.seek(0)
            self._f.truncate()
        except OSError:
            pass
        self._f.close()   # releases the flock
        return False


def read_run(run_dir: str | os.PathLike) -> RunResult:
    run = Path(run_dir)
    summary = json.loads((run / "summary.json").read_text())
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln]
    return RunResult(run, summary, metrics)
