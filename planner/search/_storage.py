"""Studies on RDB storage, and what processes sharing one need: opening SQLite / PostgreSQL storages (WAL
mode, heartbeats), the study-wide lock, failing and retrying trials left RUNNING by dead processes, and the
claims and ownership marks that keep processes from running one configuration twice.

``storage`` None keeps a study in memory; an RDB URL ("sqlite:///plan.db", "postgresql+psycopg://...")
persists every trial as it finishes, and the same storage + study name resumes. Optuna commits each trial as
it ends, so a killed process loses only the trial that was running; RDB storages get Optuna heartbeats, so a
trial left RUNNING by a killed process is marked FAIL (and its configuration enqueued again) by the next
trial started more than GRACE_S after it died. What Optuna does not make atomic between processes is done
under ``StudyLock``: the schema is created, and the seeds enqueued, once; a polish step or a sampled
configuration that another process has running or waiting is not tried again.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import socket
import sqlite3
from pathlib import Path

import optuna

from costmodel.profiles import InputError

HEARTBEAT_S = 2
GRACE_S = 10
"""A running trial records a heartbeat every HEARTBEAT_S; one silent for GRACE_S belongs to a dead process."""
CLAIM = "planner_claim"
"""Trial system attribute: the configuration key a DistinctSampler drew for the trial, set as it starts
(before the objective suggests the parameters), so that processes sharing the study do not draw it too."""
OWNER_ATTR = "planner_owner"
"""User attribute of an enqueued trial: the process (host:pid) that enqueued it."""


def storage_url(url: str) -> str:
    """An RDB URL with its PostgreSQL driver made explicit: plain ``postgresql://`` (or ``postgres://``) runs
    on psycopg 3 (the ``[postgres]`` extra) when it is installed, else on psycopg2; without either, or with a
    ``+driver`` that is not installed, a one-line error says what to install."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return url
    dialect, _, driver = scheme.partition("+")
    have = {d: importlib.util.find_spec(m) is not None for d, m in (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))}
    if not driver:
        driver = next((d for d in ("psycopg", "psycopg2") if have[d]), "")
    if driver in have and not have[driver] or not driver:
        raise InputError(f"--storage {url}: the PostgreSQL driver {driver or 'psycopg'} is not installed; "
                         f"pip install -e \".[postgres]\" (psycopg 3) and use postgresql+psycopg://user@host/db")
    return f"postgresql+{driver}://{rest}"


def open_storage(storage):
    """None (in memory), an RDB URL, or an Optuna storage object. RDB storages get heartbeats: a trial that a
    killed process left RUNNING is marked FAIL by the next trial any process of the study starts more than
    GRACE_S after its last heartbeat, and enqueued again (``RetryHeartbeatStaleTrialCallback``) so that its
    configuration is still tried. Call it under ``StudyLock``: creating the tables is not safe against a
    second process doing the same."""
    if storage is None or not isinstance(storage, str):
        return storage
    kw = {}
    if storage.startswith("sqlite"):
        kw["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        sqlite_wal(storage)
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:
        kw["heartbeat_stale_trial_callback"] = retry(max_retry=1)
    else:   # Optuna < 4.9
        kw["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=1)
    return optuna.storages.RDBStorage(storage_url(storage), heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                      **kw)


def sqlite_wal(url: str) -> None:
    """Put an SQLite study file in write-ahead-log mode (a setting the file keeps): commits are cheaper and
    readers in other worker processes do not block the writer."""
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:" or not Path(path).parent.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as con:
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error:
        pass


class StudyLock:
    """A lock shared by every process of one RDB study, for what Optuna does not make atomic: creating the
    schema (two processes on an empty database both try: "table studies already exists", UniqueViolation on
    PostgreSQL), enqueueing the expert seeds and the polish steps once per study. SQLite: ``flock`` on the
    file ``DB.lock`` beside the database; PostgreSQL: a session advisory lock (``pg_advisory_lock``). Other
    storages are not locked. Re-entrant within a process."""

    KEY = 0x706C616E   # "plan": the advisory lock's key

    def __init__(self, storage):
        self.url = storage if isinstance(storage, str) else None
        self.kind = None
        self.depth = 0
        self._fh = self._con = None
        if self.url is None:
            return
        if self.url.startswith("sqlite"):
            path = self.url.split(":///", 1)[1].split("?", 1)[0] if ":///" in self.url else ""
            if path and path != ":memory:":
                self.kind, self.path = "sqlite", path + ".lock"
        elif self.url.split("+")[0].split(":")[0] in ("postgresql", "postgres"):
            self.kind = "postgresql"

    def __enter__(self):
        self.depth += 1
        if self.depth > 1 or self.kind is None:
            return self
        if self.kind == "sqlite":
            import fcntl

            try:
                self._fh = open(self.path, "a")
            except OSError:   # no such folder and the like: the storage itself reports it
                self._fh = None
                return self
            fcntl.flock(self._fh, fcntl.LOCK_EX)
        else:
            import sqlalchemy

            if self._con is None:
                engine = sqlalchemy.create_engine(storage_url(self.url), poolclass=sqlalchemy.pool.NullPool)
                try:
                    self._con = engine.connect()
                except sqlalchemy.exc.OperationalError as exc:
                    self.depth -= 1
                    why = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
                    raise InputError(f"--storage {self.url}: cannot connect to the PostgreSQL server ({why})") from None
            self._con.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self.KEY})
            self._con.commit()
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth > 0 or self.kind is None:
            return False
        if self._fh is not None:
            self._fh.close()   # releases the flock
            self._fh = None
        elif self._con is not None:
            import sqlalchemy

            self._con.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self.KEY})
            self._con.commit()
        return False

    def close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None


def locked_pop(study, lock: StudyLock) -> None:
    """Take waiting trials under the study's lock: on SQLite, Optuna's ``SELECT ... FOR UPDATE`` is a plain
    SELECT, so two processes could both take one enqueued trial, both run it and both count it. (Study's
    ``_pop_waiting_trial_id``, which ``Study.ask`` calls, is wrapped on this instance; where Optuna has no such
    method the race is caught in ``_trials.optimize``.)"""
    pop = getattr(study, "_pop_waiting_trial_id", None)
    if pop is None or lock.kind is None:
        return

    def locked():
        with lock:
            return pop()

    study._pop_waiting_trial_id = locked


def fail_unsampled_dead_trials(study) -> None:
    """Fail the RUNNING trials without parameters that started more than GRACE_S ago: a process killed between
    creating a trial and its first heartbeat (recorded as sampling starts) leaves one that Optuna's heartbeat
    check never sees. A live process samples a trial's parameters within milliseconds of creating it."""
    optuna.storages.fail_stale_trials(study)   # those with a heartbeat first: failed and retried
    storage = study._storage
    retry = (getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
             or getattr(storage, "get_failed_trial_callback", lambda: None)())   # Optuna < 4.9
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not t.params and t.datetime_start is not None and (now - t.datetime_start).total_seconds() > GRACE_S:
            try:
                failed = storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            except (RuntimeError, optuna.exceptions.StorageInternalError, optuna.exceptions.UpdateFinishedTrialError):
                failed = False
            if failed and retry is not None:   # retried like a stale one: an enqueued seed keeps its parameters
                retry(study, storage.get_trial(t._trial_id))


def n_complete(study) -> int:
    """Finished (COMPLETE) trials of the study, every process's."""
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def beat(study, trial) -> None:
    """Record a heartbeat of ``trial`` now, where the storage keeps them."""
    storage = study._storage
    if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
        storage.record_heartbeat(trial._trial_id)


def claim(study, trial, key) -> None:
    """Mark ``trial`` as running the configuration ``key`` (CLAIM), before its parameters are written."""
    study._storage.set_trial_system_attr(trial._trial_id, CLAIM, [int(x) for x in key])


def trial_key(codec, t):
    """The configuration key of a trial (``codec``: the study's ``KnobCodec``): its parameters, the fixed ones
    of a trial still waiting, or the one claimed for a trial that is starting."""
    if CLAIM in t.system_attrs:
        return tuple(t.system_attrs[CLAIM])
    # (a running trial's params are written one by one as the objective suggests them)
    return codec.key_of_params({**t.params, **t.system_attrs.get("fixed_params", {})})


def taken(study, codec, exclude: int | None = None) -> set:
    """Keys of every configuration the study has finished, running or waiting (all processes)."""
    S = optuna.trial.TrialState
    return {trial_key(codec, t) for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.RUNNING, S.PRUNED,
                                                                                  S.WAITING))
            if t.number != exclude}


def owner() -> str:
    """This process, as the OWNER_ATTR of the trials it enqueues (host:pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"
