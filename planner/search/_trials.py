"""Running trials in this process: Optuna's optimize loop stopped at a study-wide target, on Ctrl-C or on
SIGTERM, the drain of the trials this process enqueued, and the progress and deadline helpers of the phases.

Ctrl-C (SIGINT) and SIGTERM ask the study to stop after the trial in flight, the way Optuna's own
``study.stop()`` ends a run: a KeyboardInterrupt raised inside Optuna's storage code can be lost or leave it
half-way, and the trial RUNNING.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import optuna

from planner.search._objective import Objective
from planner.search._storage import OWNER_ATTR, n_complete, owner

STOP_SIGNALS = ("SIGINT", "SIGTERM")
MAX_POP_RACES = 100
"""Lost races for an enqueued trial (SQLite ignores SELECT ... FOR UPDATE) tolerated before giving up."""
DRAIN_ROUNDS = 10


@contextlib.contextmanager
def on_stop_signals(handler):
    """Install ``handler`` for SIGINT and SIGTERM (main thread only) and restore the previous ones after."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in STOP_SIGNALS:
            sig = getattr(signal, name)
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def raise_interrupt(*_):
    raise KeyboardInterrupt


def shifted(progress, offset: int, total: int):
    """A progress callback of a later phase: its own count offset by the trials of the earlier ones."""
    return None if progress is None else (lambda done, _n: progress(offset + done, total))


def remaining(deadline):
    """Seconds left before ``deadline`` (time.monotonic; None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def optimize(study, obj: Objective, n_trials: int, timeout_s, progress, target: int | None = None,
             run_first: bool = False) -> tuple[int, bool]:
    """Run up to n_trials new trials, stopping early once the study (every process's trials) has ``target``
    finished ones (checked after each trial, and before the first unless ``run_first``: a polish step this
    process just enqueued is run, not left waiting); returns (trials finished here, interrupted)."""
    finished = 0
    stop = threading.Event()

    def reached(study_) -> bool:
        return target is not None and n_complete(study_) >= target

    def cb(study_, trial_):
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished, n_trials)
        if stop.is_set() or reached(study_):
            study_.stop()

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    races = 0
    first = run_first
    with on_stop_signals(lambda *_: stop.set()):
        while finished < n_trials and not stop.is_set() and (first or not reached(study)):
            first = False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                study.optimize(obj, n_trials=n_trials - finished, timeout=left, callbacks=[cb])
                break
            except KeyboardInterrupt:
                return finished, True
            except ValueError as exc:
                # Two processes popped the same enqueued trial (SQLite ignores Optuna's SELECT ... FOR UPDATE);
                # the other one finished it first. Nothing is lost: go on with the remaining trials.
                races += 1
                if not str(exc).startswith("Cannot tell a") or races > MAX_POP_RACES:
                    raise
                first = True   # run one more even at the target: the trial this process enqueued is waiting
    return finished, stop.is_set()


def drain(study, obj: Objective, timeout_s) -> tuple[int, bool]:
    """Run the trials this process enqueued that are still waiting (in a shared study, another process can
    take the one it enqueued and leave it to run another's), so that none is left behind. Returns
    (finished, interrupted)."""
    done = 0
    for _ in range(DRAIN_ROUNDS):
        waiting = sum(t.user_attrs.get(OWNER_ATTR) == owner() for t in
                      study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        if not waiting:
            break
        finished, interrupted = optimize(study, obj, waiting, timeout_s, None, run_first=True)
        done += finished
        if interrupted or not finished:
            return done, interrupted
    return done, False
