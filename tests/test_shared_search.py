"""Shared and interrupted searches through the CLI: two `plan` processes started together on one study, from an
empty PostgreSQL database (a real server: Debian's `postgresql` package, started here as the `postgres` user
on 127.0.0.1) and from a fresh SQLite file, both finish with no crash, no lost trial and at most 2% duplicate
configurations; SIGTERM stops a search like Ctrl-C and `--json` says it was interrupted; `--workers` processes
end with their parent."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TRIALS = 60
DUPLICATE_LIMIT = 0.02


def _pg_bin() -> Path | None:
    """The folder holding initdb and pg_ctl (on PATH, or Debian's /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    dirs = ([Path(found).resolve().parent] if found else []) + \
        [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    return next((d for d in dirs if (d / "initdb").exists() and (d / "pg_ctl").exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of its own in a temporary folder on a free port of 127.0.0.1; yields a function
    that creates an empty database and returns its URL. PostgreSQL refuses to run as root: as root the server
    runs as the `postgres` user the package creates."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql "
                    "(.ci/run does)")
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="plan-pg-"))
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", _free_port()

    def run(*cmd):
        return subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True, timeout=120)

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "-t", "60", "-o",
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    except subprocess.CalledProcessError as exc:
        log = (base / "server.log").read_text() if (base / "server.log").exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {exc.stderr or exc.stdout}{log}") from None
    made = []

    def new_database(name: str) -> str:
        run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", name)
        made.append(name)
        return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"

    try:
        yield new_database
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def _plan(url: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "planner.cli", "--model", "13b", "--cluster", "h100x512.yaml", "--trials",
           str(TRIALS), "--storage", url, "--study-name", "shared", "--json", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _key(t) -> tuple:
    return tuple(sorted(t.params.items()))


def two_processes_on_one_study(url: str) -> float:
    """Start two `plan` processes at once on an empty storage; returns the share of duplicate configurations."""
    # On PostgreSQL the second process is given plain postgresql://, which runs on psycopg 3 too.
    urls = [url, url.replace("postgresql+psycopg://", "postgresql://")]
    procs = [_plan(u, "--seed", str(i)) for i, u in enumerate(urls)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        outs.append(json.loads(out))
    trials = optuna.load_study(study_name="shared", storage=url).get_trials()
    states = Counter(t.state.name for t in trials)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    # No lost trial: every trial either process reports finished is in the study, none is left running,
    # waiting or failed; the study has the N finished trials asked for (each process stops once it has them,
    # so at most the trials in flight in both processes go past).
    assert states == {"COMPLETE": len(complete)}, states
    assert len(complete) == sum(o["trials"]["this_run"] for o in outs)
    assert TRIALS <= len(complete) <= TRIALS + 2
    assert all(o["trials"]["in_study"] >= o["trials"]["this_run"] for o in outs)
    assert all(not o["interrupted"] and o["plans"] for o in outs)
    keys = Counter(_key(t) for t in complete)
    dup = sum(n - 1 for n in keys.values()) / len(complete)
    print(f"{url.split(':')[0]}: {len(complete)} trials, {sum(n - 1 for n in keys.values())} duplicates "
          f"({100 * dup:.1f}%), trials per process {[o['trials']['this_run'] for o in outs]}")
    assert dup <= DUPLICATE_LIMIT, keys.most_common(3)
    # The seeds were enqueued once (a marker in the study), and the schema made once.
    study = optuna.load_study(study_name="shared", storage=url)
    assert study.user_attrs["planner_seeded"] is True
    return dup


def test_two_processes_on_a_fresh_postgresql_database(postgres):
    two_processes_on_one_study(postgres("shared_search"))


def test_two_processes_on_a_fresh_sqlite_file(tmp_path):
    two_processes_on_one_study(f"sqlite:///{tmp_path / 'shared.db'}")


def test_sigterm_stops_a_search_like_ctrl_c(tmp_path):
    """SIGTERM mid-search: exit 0 with the best so far, `"interrupted": true`, a message on stderr, every
    finished trial kept and none left RUNNING; rerunning with the same --trials completes the study to N."""
    url = f"sqlite:///{tmp_path / 'term.db'}"
    cmd = [sys.executable, "-m", "planner.cli", "--model", "70b", "--cluster", "h100x512.yaml", "--trials",
           "100000", "--storage", url, "--study-name", "t", "--json"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None and time.monotonic() < deadline
            try:
                n = len(optuna.load_study(study_name="t", storage=url).get_trials(
                    states=(optuna.trial.TrialState.COMPLETE,)))
            except KeyError:
                n = 0
            if n >= 10:
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-2000:]
    res = json.loads(out)
    assert res["interrupted"] is True and res["trials"]["this_run"] >= 10 and res["plans"]
    assert "interrupted" in err and "Traceback" not in err
    trials = optuna.load_study(study_name="t", storage=url).get_trials()
    # Nothing RUNNING or FAIL; expert seeds enqueued but not yet started stay WAITING for the next run.
    waiting = [t for t in trials if t.state.name == "WAITING"]
    assert {t.state.name for t in trials} <= {"COMPLETE", "WAITING"}
    assert all("fixed_params" in t.system_attrs for t in waiting)
    complete = len(trials) - len(waiting)
    assert res["trials"]["in_study"] == complete
    # --trials N: N finished trials in the study, not N more.
    n = complete + 5
    again = subprocess.run([*cmd[:8], str(n), *cmd[9:]], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    res = json.loads(again.stdout)
    assert res["trials"] == {"this_run": 5, "in_study": n} and res["interrupted"] is False


WORKERS_CHILD = """
import sys
from costmodel.catalog import get_model
from costmodel.profiles import load_cluster
from planner.search import optuna_search
optuna_search(get_model("70b"), load_cluster("h100x512"), 512, n_trials=100000, storage=sys.argv[1],
              study_name="w", workers=2)
"""


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ps --ppid")
def test_workers_end_with_their_parent(tmp_path):
    """SIGKILL the parent of --workers 2 while its workers run: the workers end within a few seconds."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    p = subprocess.Popen([sys.executable, "-c", WORKERS_CHILD, url], cwd=ROOT, env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            # spawn's resource tracker is a child too; the workers are the ones running trials
            workers = [c for c in _children(p.pid) if "resource_tracker" not in
                       Path(f"/proc/{c}/cmdline").read_text(errors="replace")] if p.poll() is None else []
            try:
                n = len(optuna.load_study(study_name="w", storage=url).get_trials(
                    states=(optuna.trial.TrialState.COMPLETE,)))
            except KeyError:
                n = 0
            if len(workers) == 2 and n >= 16:   # past the seeds the parent runs: the workers' trials
                break
            time.sleep(0.3)
        assert len(workers) == 2, p.stderr.read() if p.poll() is not None else "no workers"
        p.kill()
        p.wait()
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers)
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


def test_postgresql_urls_name_their_driver(monkeypatch):
    import importlib.util

    from costmodel.profiles import InputError
    from planner.search._storage import storage_url

    assert storage_url("sqlite:///x.db") == "sqlite:///x.db"
    real = importlib.util.find_spec
    have = {"psycopg": True, "psycopg2": True}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if have.get(name) else
                        (None if name in have else real(name, *a)))
    assert storage_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert storage_url("postgres://u@h:5/db") == "postgresql+psycopg://u@h:5/db"
    assert storage_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    have["psycopg"] = False
    assert storage_url("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    with pytest.raises(InputError, match=r"driver psycopg is not installed; pip install -e \"\.\[postgres\]\""):
        storage_url("postgresql+psycopg://u@h/db")
    have["psycopg2"] = False
    with pytest.raises(InputError, match=r"^--storage postgresql://u@h/db: .*\[postgres\]") as e:
        storage_url("postgresql://u@h/db")
    assert "\n" not in str(e.value)
