"""Worker processes of ``optuna_search(workers=N)``: N spawned processes that share the study's RDB storage,
run their share of the trials, report back on a queue and end with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time

import optuna

from planner.search._storage import n_complete
from planner.search._study import open_study, quiet_optuna_warnings
from planner.search._trials import optimize

PR_SET_PDEATHSIG = 1
JOIN_AFTER_INTERRUPT_S = 30


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send this process ``sig`` when its parent dies (Linux ``PR_SET_PDEATHSIG``; elsewhere
    a thread that watches the parent's pid)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
                if os.getppid() != parent:   # the parent died before the call
                    os.kill(os.getpid(), sig)
                return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, daemon=True).start()


def worker(args: dict, out) -> None:
    """One worker process: load the shared study and run its trials."""
    die_with_parent()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    quiet_optuna_warnings()
    try:
        opened = open_study(args["model"], args["cluster"], args["global_batch"], args["objectives"],
                            args["sampler"], args["storage"], args["study_name"], args["seed"], args["n_trials"],
                            args["cost"], enqueue=False, rank_by=args.get("rank_by", "p50"),
                            space_kw=args.get("space_kw"))
        finished, interrupted = optimize(opened.study, opened.obj, args["n_trials"], args["timeout_s"], None,
                                         target=args["target"])
        opened.obj.lock.close()
        out.put((finished, interrupted, opened.obj.evaluations, None))
    except KeyboardInterrupt:
        out.put((0, True, 0, None))
    except BaseException as exc:  # reported by the parent
        out.put((0, False, 0, f"{type(exc).__name__}: {exc}"))


def run_workers(study, model, cluster, global_batch, cost, sampler, n_trials, objectives, storage, study_name,
                seed, progress, timeout_s, workers, target=None, rank_by: str = "p50",
                space_kw: dict | None = None) -> tuple[int, bool, int]:
    """Run ``n_trials`` trials of ``study`` in ``workers`` processes (seeds seed, seed + 1, ...); returns
    (trials the study gained, interrupted, cost-model evaluations made by the workers)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = n_complete(study)
    shares = [n_trials // workers + (1 if i < n_trials % workers else 0) for i in range(workers)]
    procs = []
    for i, share in enumerate(shares):
        if share == 0:
            continue
        args = dict(model=model, cluster=cluster, global_batch=global_batch, cost=cost, sampler=sampler,
                    n_trials=share, objectives=objectives, storage=storage, study_name=study_name,
                    seed=seed + i, timeout_s=timeout_s, target=target, rank_by=rank_by, space_kw=space_kw)
        p = ctx.Process(target=worker, args=(args, out), daemon=False)
        p.start()
        procs.append(p)
    interrupted = False
    results = []
    try:
        while any(p.is_alive() for p in procs) or len(results) < len(procs):
            try:
                results.append(out.get(timeout=0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    break
            if progress is not None:
                progress(min(n_complete(study) - start, n_trials), n_trials)
    except KeyboardInterrupt:
        interrupted = True
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)
        deadline = time.monotonic() + JOIN_AFTER_INTERRUPT_S
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        p.join()
    while True:
        try:
            results.append(out.get_nowait())
        except queue.Empty:
            break
    errors = [r[3] for r in results if r[3]]
    if errors and not interrupted:
        raise RuntimeError("optuna_search worker failed: " + "; ".join(errors))
    return n_complete(study) - start, interrupted or any(r[1] for r in results), sum(r[2] for r in results)
