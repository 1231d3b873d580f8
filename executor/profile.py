"""Measure this machine for ``plan profile``: GEMM rates by shape and dtype, memory copy bandwidth, and
collective bus bandwidth by message and group size, with torch.distributed on local worker processes.

One code path for both kinds of machine: NCCL with one process per GPU when CUDA is available, gloo with
``world_size`` CPU processes otherwise. Every rank runs every measurement at the same time (a training
run keeps all its ranks busy too): GEMMs and copies run on each rank concurrently, and a collective over
groups of g ranks runs in all world_size/g groups at once. Timings are agreed between ranks (iteration
counts from the slowest rank's probe) and averaged over ranks, as nccl-tests reports them.

torch is imported inside functions only; the workers are started with torch.multiprocessing (spawn) and
watched with a deadline, so a worker that dies or hangs fails the command with its error.
"""

from __future__ import annotations

import os
import platform
import queue as queue_mod
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from costmodel.profiles import InputError
from executor.nccl_tests import busbw_factor

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
KIB, MIB = 1024, 1024 * 1024


class ProfileError(RuntimeError):
    """The measurement failed (a worker died, hung or could not start)."""


@dataclass(frozen=True)
class SweepConfig:
    """What to measure and how long to spend on each point."""

    world_size: int
    backend: str
    """gloo (CPU processes) or nccl (one process per GPU)."""
    threads: int
    """torch intra-op threads per CPU process (ignored on GPUs)."""
    gemm_dtypes: tuple[str, ...]
    gemm_shapes: tuple[tuple[int, int, int], ...]
    """(m, n, k), in increasing FLOPs; a dtype stops at the first shape predicted to exceed max_call_s."""
    message_sizes: tuple[int, ...]
    collectives: tuple[str, ...]
    group_sizes: tuple[int, ...]
    copy_bytes: int
    target_s: float = 0.1
    """Timed loop length per point (iterations = target / probe, at least 1)."""
    max_call_s: float = 1.0
    max_iters: int = 200
    timeout_s: float = 900.0
    """Deadline for the whole measurement."""
    host_rates: bool = False
    """Also measure the host side of each GPU (GPUs only): pinned copies to and from it and a CPU Adam step."""
    adam_params: int = 64 * 1024 * 1024
    """fp32 parameters of the CPU Adam step timed (1 GiB of weight, gradient and moments, 1.75 GiB moved a step:
    well past any CPU cache)."""

    @property
    def steps(self) -> int:
        return (len(self.gemm_dtypes) * len(self.gemm_shapes) + 1 + int(self.host_rates)
                + len(self.collectives) * len(self.group_sizes) * len(self.message_sizes))


def _powers(lo: int, hi: int, factor: int) -> tuple[int, ...]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= factor
    return tuple(out)


def _group_sizes(world_size: int) -> tuple[int, ...]:
    sizes = {g for g in _powers(2, world_size, 2) if world_size % g == 0} | {world_size}
    return tuple(sorted(s for s in sizes if s >= 2))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_config(world_size: int | None = None, quick: bool = False, backend: str = "auto",
                   threads: int | None = None, collectives: bool = True, timeout_s: float = 900.0) -> SweepConfig:
    """The sweep for this machine: larger GEMMs and messages on GPUs, a budget that suits 2 CPU cores."""
    cuda = cuda_available() if backend == "auto" else backend == "nccl"
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if world_size is None:
        world_size = _device_count() if cuda else 2
    if world_size < (2 if collectives else 1):
        raise InputError(f"--world-size {world_size}: the collective sweep needs at least 2 ranks")
    if threads is not None and threads < 1:
        raise InputError(f"--threads {threads}: give at least 1")
    if cuda:
        dtypes = ("fp32", "tf32", "bf16", "fp16", "fp8")
        dims = (1024, 4096) if quick else (256, 512, 1024, 2048, 4096, 8192)
        sizes = _powers(KIB, 64 * MIB, 64) if quick else _powers(KIB, 1024 * MIB, 4)
        copy = 256 * MIB if quick else 1024 * MIB
    else:
        dtypes = ("fp32", "bf16")
        dims = (64, 256) if quick else (64, 128, 256, 512, 1024, 2048)
        sizes = (1 * KIB, 64 * KIB, 1 * MIB) if quick else _powers(256, 64 * MIB, 4)
        copy = 64 * MIB
    shapes = tuple((d, d, d) for d in dims)
    if not quick:
        # Narrow GEMMs as training has them (few tokens or a thin projection), by smallest dimension.
        big = dims[-2]
        shapes += tuple((big, big, d) for d in dims[:2])
    shapes = tuple(sorted(shapes, key=lambda s: s[0] * s[1] * s[2]))
    if threads is None:
        threads = max(1, int(os.environ.get("PLAN_EXECUTOR_THREADS", "1")))
    return SweepConfig(
        world_size=world_size, backend=backend, threads=threads, gemm_dtypes=dtypes, gemm_shapes=shapes,
        message_sizes=sizes, collectives=COLLECTIVES if collectives and world_size >= 2 else (),
        group_sizes=_group_sizes(world_size) if collectives else (), copy_bytes=copy,
        target_s=0.05 if quick else 0.1, max_call_s=0.5 if quick else 1.0, timeout_s=timeout_s, host_rates=cuda,
        adam_params=(16 if quick else 64) * 1024 * 1024)


def _device_count() -> int:
    import torch

    return torch.cuda.device_count()


# Worker side ----------------------------------------------------------------------------------------
@dataclass
class _Ctx:
    rank: int
    cfg: SweepConfig
    device: object
    ctrl: object
    """gloo group over all ranks for agreeing on iteration counts and averaging times."""
    sync: Callable[[], None]
    report: Callable[[str], None]
    results: dict = field(default_factory=dict)


def _agree(ctx: _Ctx, value: float, op: str) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=ctx.ctrl)
    return float(t.item()) / (ctx.cfg.world_size if op == "mean" else 1)


def _timed(ctx: _Ctx, fn: Callable[[], None]) -> float:
    """Seconds per call of ``fn``, run on every rank at once, averaged over ranks."""
    import torch.distributed as dist

    fn()
    ctx.sync()
    t0 = time.perf_counter()
    fn()
    ctx.sync()
    probe = _agree(ctx, time.perf_counter() - t0, "max")
    iters = int(min(max(ctx.cfg.target_s / max(probe, 1e-9), 1), ctx.cfg.max_iters))
    dist.barrier(group=ctx.ctrl)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    ctx.sync()
    return _agree(ctx, (time.perf_counter() - t0) / iters, "mean")


def _gemm_fn(ctx: _Ctx, dtype: str, m: int, n: int, k: int) -> Callable[[], None]:
    import torch

    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                   "fp16": torch.float16}.get(dtype)
    if dtype == "fp8":
        a = torch.randn(m, k, device=ctx.device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=ctx.device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device=ctx.device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=ctx.device, dtype=torch_dtype)
    b = torch.randn(k, n, device=ctx.device, dtype=torch_dtype)
    c = torch.empty(m, n, device=ctx.device, dtype=torch_dtype)
    if ctx.device.type == "cuda":
        tf32 = dtype == "tf32"

        def run():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.mm(a, b, out=c)
        return run
    return lambda: torch.mm(a, b, out=c)


def _gemm_sweep(ctx: _Ctx) -> None:
    points, skipped = [], []
    for dtype in ctx.cfg.gemm_dtypes:
        rate, unsupported = None, ""
        for m, n, k in ctx.cfg.gemm_shapes:
            flops = 2.0 * m * n * k
            label = f"GEMM {dtype} {m}x{n}x{k}"
            why = unsupported or (f"one call would take ~{flops / rate:.2f} s at {rate / 1e9:.2f} GFLOP/s"
                                  if rate is not None and flops / rate > ctx.cfg.max_call_s else "")
            fn = None
            if not why:
                fn, err = _try_gemm(ctx, dtype, m, n, k)
                if _agree(ctx, 0.0 if fn is None else 1.0, "mean") < 1.0:
                    why = unsupported = err or "fails on another rank"
            if why:
                skipped.append({"dtype": dtype, "m": m, "n": n, "k": k, "reason": why})
                ctx.report(f"{label} (skipped)")
                continue
            t = _timed(ctx, fn)
            rate = flops / t
            points.append({"dtype": dtype, "m": m, "n": n, "k": k, "time_s": t, "flops_per_s": rate})
            ctx.report(f"{label}: {rate / 1e9:.1f} GFLOP/s")
    ctx.results["gemm"] = points
    ctx.results["gemm_skipped"] = skipped


def _try_gemm(ctx: _Ctx, dtype: str, m: int, n: int, k: int):
    """The GEMM call and "" where this build and device run it, else None and the error."""
    try:
        fn = _gemm_fn(ctx, dtype, m, n, k)
        fn()
        return fn, ""
    except (RuntimeError, TypeError, AttributeError) as exc:  # dtype not supported by this build/device
        return None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def _copy_bandwidth(ctx: _Ctx) -> None:
    """STREAM-style copy: a read and a write of copy_bytes per call."""
    import torch

    n = ctx.cfg.copy_bytes // 4
    src = torch.ones(n, device=ctx.device)
    dst = torch.empty_like(src)
    t = _timed(ctx, lambda: dst.copy_(src))
    ctx.results["copy"] = {"bytes": ctx.cfg.copy_bytes, "time_s": t, "bytes_per_s": 2.0 * ctx.cfg.copy_bytes / t}
    ctx.report(f"memory copy: {2.0 * ctx.cfg.copy_bytes / t / 1e9:.1f} GB/s")


def cpu_adam_step(params: int) -> Callable[[], None]:
    """One CPU optimizer step over ``params`` fp32 parameters as megatron-core's HybridDeviceOptimizer steps the
    offloaded share (torch.optim.AdamW with fused=True, on the host): it reads the weight, the gradient and both
    moments and writes the weight and both moments, costmodel.compute.CPU_ADAM_BYTES_PER_PARAM bytes a
    parameter. Returns the step to time."""
    import torch

    weight = torch.nn.Parameter(torch.zeros(params))
    weight.grad = torch.full((params,), 1e-3)
    return torch.optim.AdamW([weight], lr=1e-4, fused=True).step


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def _host_rates(ctx: _Ctx) -> None:
    """The host side of each GPU, what offloading streams through, every rank at once (so a PCIe switch or the
    DRAM channels the GPUs share are shared as in training): pinned copies of copy_bytes to and from the GPU,
    and a CPU Adam step (cpu_adam_step) on this rank's share of the host's cores."""
    import torch

    from costmodel.compute import CPU_ADAM_BYTES_PER_PARAM

    n = ctx.cfg.copy_bytes // 4
    pinned = torch.empty(n, dtype=torch.float32).pin_memory()
    dev = torch.empty(n, dtype=torch.float32, device=ctx.device)
    t_h2d = _timed(ctx, lambda: dev.copy_(pinned, non_blocking=True))
    t_d2h = _timed(ctx, lambda: pinned.copy_(dev, non_blocking=True))
    del pinned, dev
    rates = {"h2d_bytes_per_s": ctx.cfg.copy_bytes / t_h2d, "d2h_bytes_per_s": ctx.cfg.copy_bytes / t_d2h}
    threads = max(1, host_cores() // ctx.cfg.world_size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        step = cpu_adam_step(ctx.cfg.adam_params)
    except (RuntimeError, TypeError, ValueError) as exc:   # a torch without the fused CPU AdamW (before 2.4)
        step, rates["adam_skipped"] = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
    try:
        if step is not None:
            t_adam = _timed(ctx, step)
            rates.update(adam_params=ctx.cfg.adam_params, adam_threads=threads, adam_step_s=t_adam,
                         adam_bytes_per_s=ctx.cfg.adam_params * CPU_ADAM_BYTES_PER_PARAM / t_adam)
    finally:
        torch.set_num_threads(before)
    ctx.results["host_rates"] = rates
    adam = (f"CPU Adam {rates['adam_bytes_per_s'] / 1e9:.1f} GB/s on {threads} cores" if step is not None
            else f"CPU Adam not measured ({rates['adam_skipped']})")
    ctx.report(f"host link {rates['h2d_bytes_per_s'] / 1e9:.1f} / {rates['d2h_bytes_per_s'] / 1e9:.1f} GB/s "
               f"(to / from the GPU); {adam}")


def _collective_fn(ctx: _Ctx, collective: str, group, members: list[int], nbytes: int):
    """The call for one rank and the bytes nccl-tests would report for it (fp32 elements)."""
    import torch
    import torch.distributed as dist

    g = len(members)
    numel = max(nbytes // (4 * g), 1) * g
    x = torch.ones(numel, device=ctx.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if collective == "all_reduce":
        fn = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif collective == "all_gather":
        shard = torch.ones(numel // g, device=ctx.device)
        fn = lambda: gather(x, shard, group=group)  # noqa: E731
    elif collective == "reduce_scatter":
        shard = torch.empty(numel // g, device=ctx.device)
        fn = lambda: scatter(shard, x, group=group)  # noqa: E731
    elif collective == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
    else:
        i = members.index(ctx.rank)
        nxt, prv = members[(i + 1) % g], members[(i - 1) % g]
        buf = torch.empty_like(x)

        def fn():
            ops = [dist.P2POp(dist.isend, x, nxt, group), dist.P2POp(dist.irecv, buf, prv, group)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
    return fn, numel * 4


def _collective_sweep(ctx: _Ctx) -> None:
    import torch.distributed as dist

    ws = ctx.cfg.world_size
    points = []
    for g in ctx.cfg.group_sizes:
        # Every rank creates every group, in the same order (torch.distributed requires it).
        layout = [list(range(i, i + g)) for i in range(0, ws, g)]
        handles = [dist.new_group(ranks) if g < ws else dist.group.WORLD for ranks in layout]
        mine = ctx.rank // g
        for collective in ctx.cfg.collectives:
            for size in ctx.cfg.message_sizes:
                fn, nbytes = _collective_fn(ctx, collective, handles[mine], layout[mine], size)
                t = _timed(ctx, fn)
                algbw = nbytes / t
                busbw = algbw * busbw_factor(collective, g)
                points.append({"collective": collective, "group_size": g, "groups": len(layout),
                               "bytes": nbytes, "time_s": t, "algbw_bytes_per_s": algbw,
                               "busbw_bytes_per_s": busbw})
                ctx.report(f"{collective} x{g} {human_bytes(nbytes)}: {busbw / 1e9:.3f} GB/s busbw")
    ctx.results["collectives"] = points


def human_bytes(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _worker(rank: int, cfg: SweepConfig, init_file: str, out_q) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    if cfg.backend == "nccl":
        torch.cuda.set_device(rank)
        device, sync = torch.device("cuda", rank), torch.cuda.synchronize
    else:
        torch.set_num_threads(cfg.threads)
        device, sync = torch.device("cpu"), (lambda: None)
    timeout = dt.timedelta(seconds=max(60.0, cfg.timeout_s))
    dist.init_process_group(cfg.backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=cfg.world_size, timeout=timeout)
    try:
        ctrl = dist.new_group(backend="gloo") if cfg.backend != "gloo" else dist.group.WORLD
        report = (lambda msg: out_q.put(("step", msg))) if rank == 0 else (lambda msg: None)
        ctx = _Ctx(rank, cfg, device, ctrl, sync, report)
        start = time.perf_counter()
        _gemm_sweep(ctx)
        _copy_bandwidth(ctx)
        if cfg.host_rates:
            _host_rates(ctx)
        if cfg.collectives:
            _collective_sweep(ctx)
        if rank == 0:
            if cfg.backend == "nccl":
                ctx.results["device_name"] = torch.cuda.get_device_name(rank)
                props = torch.cuda.get_device_properties(rank)
                ctx.results["device_memory_bytes"] = props.total_memory
                ctx.results["sm_count"] = props.multi_processor_count
            else:
                ctx.results["device_name"] = _cpu_model()
            ctx.results["elapsed_s"] = time.perf_counter() - start
            out_q.put(("result", ctx.results))
        dist.barrier(group=ctrl)
    finally:
        dist.destroy_process_group()


# Launcher side --------------------------------------------------------------------------------------
def launch_workers(fn: Callable, nprocs: int, args: tuple, timeout_s: float,
                   on_message: Callable[[str, object], None]) -> None:
    """Run ``fn(rank, *args, queue)`` in ``nprocs`` spawned processes; relay ``queue`` messages
    (kind, payload) to ``on_message`` while they run. A worker that raises or dies ends the others and
    raises ProfileError with its error; so does passing ``timeout_s``."""
    import torch.multiprocessing as mp

    q = mp.get_context("spawn").Queue()
    pctx = mp.start_processes(fn, args=(*args, q), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    last = "starting the workers"

    def drain():
        nonlocal last
        while True:
            try:
                kind, payload = q.get_nowait()
            except queue_mod.Empty:
                return
            if kind == "step":
                last = str(payload)
            on_message(kind, payload)

    try:
        while True:
            drain()
            try:
                if pctx.join(timeout=0.2):
                    break
            except mp.ProcessRaisedException as exc:
                raise ProfileError(f"worker {exc.error_index} failed: {_last_line(str(exc))}") from None
            except mp.ProcessExitedException as exc:
                raise ProfileError(f"worker {exc.error_index} died (exit code {exc.exit_code}) "
                                   f"after: {last}") from None
            if time.monotonic() > deadline:
                raise ProfileError(f"no result after {timeout_s:.0f} s (last step: {last}); "
                                   "a worker hangs or the sweep is too large for --timeout")
        drain()
    finally:
        _stop(pctx)


def _stop(pctx) -> None:
    for p in pctx.processes:
        if p.is_alive():
            p.terminate()
    for p in pctx.processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def measure(cfg: SweepConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Run the sweep on ``cfg.world_size`` local workers; the raw results of rank 0 plus the set-up."""
    if cfg.backend == "nccl" and cfg.world_size > _device_count():
        raise ProfileError(f"--world-size {cfg.world_size} needs as many GPUs; this machine has {_device_count()}")
    box: dict = {}

    def on_message(kind, payload):
        if kind == "result":
            box["result"] = payload
        elif progress is not None:
            progress(str(payload))

    with tempfile.TemporaryDirectory(prefix="plan-profile-") as tmp:
        started = time.perf_counter()
        load = os.getloadavg()
        launch_workers(_worker, cfg.world_size, (cfg, str(Path(tmp) / "rendezvous")), cfg.timeout_s, on_message)
    if "result" not in box:
        raise ProfileError("the workers finished without sending their measurements")
    res = box["result"]
    res.update(setup(cfg), wall_s=time.perf_counter() - started, load_average_before=list(load),
               load_average_after=list(os.getloadavg()))
    return res


def setup(cfg: SweepConfig) -> dict:
    """Where and how the measurement ran (for the profile's sources table)."""
    import torch

    return {
        "config": asdict(cfg),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": _meminfo("MemTotal"),
        "memory_available_bytes": _meminfo("MemAvailable"),
        "torch_version": torch.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo(key: str) -> int:
    """A /proc/meminfo field in bytes (falls back to physical pages where /proc is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
