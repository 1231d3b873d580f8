"""Executor faults on CPU (gloo, tiny-gpt, one or two ranks): a second `plan run` on a busy run directory is
refused naming the holder's pid; killing `plan` (SIGKILL), killing torchrun or SIGTERM to `plan` leaves no
worker running; launch.log keeps every attempt under its own header; the last two checkpoints are kept with
sha256 manifests, a damaged one is reported and the previous one resumed on the same curve, a deleted
COMPLETE marker does not start the run over, a layout mismatch and metrics without checkpoints are refused in
one line; a full disk ends the launch with the path and leaves no .tmp file; plan.json without tp is
refused; the process cap comes from the machine.

Skipped where torch / megatron-core are not installed (the `executor` extra; .ci/run installs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from costmodel.profiles import InputError  # noqa: E402
from executor import checkpoints  # noqa: E402
from executor.launch import LaunchError, available_processes, launch, read_plan  # noqa: E402
from tests.test_executor import write_plan  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _procs(run: Path, module: str) -> list[int]:
    """pids of the live processes running ``module`` for this run directory."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        # a worker: python -u -m executor.train ...; torchrun: python -m torch.distributed.run ... -m executor.train
        i = cmd.index(module) if module in cmd else -1
        if i > 0 and cmd[i - 1] == "-m" and "torch.distributed.run" not in cmd[:i] and str(run) in " ".join(cmd) \
                and state != "Z":
            out.append(int(d.name))
    return out


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _plan_run(plan: str, run: Path, steps: int = 100000) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "planner.cli", "run", plan, "--run-dir", str(run), "--steps",
                             str(steps), "--checkpoint-every", "2", "--dtype", "fp32"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _steps(run: Path) -> int:
    return checkpoints.metrics_steps(run)


def _gone(pids: list[int]) -> bool:
    return not [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_lock_kills_and_log_per_attempt(tmp_path):
    """Three attempts on one run directory: (1) `plan` SIGKILLed, after a second `plan run` was refused;
    (2) torchrun SIGKILLed; (3) SIGTERM to `plan`. After each, no worker is left; launch.log has one header
    per attempt and keeps the earlier attempts' output."""
    plan, run = write_plan(tmp_path / "plan.json", "tiny-gpt"), tmp_path / "run"
    first = _plan_run(plan, run)
    try:
        _wait(lambda: _steps(run) >= 3, 300, "the first steps")
        workers = _procs(run, "executor.train")
        assert len(workers) == 1
        # A second launch on the same directory is refused in one line naming the holder.
        second = subprocess.run([sys.executable, "-m", "planner.cli", "run", plan, "--run-dir", str(run)],
                                cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert second.stderr.strip() == (f"plan: error: {run}: in use by another `plan run` (pid {first.pid}, "
                                         f"lock {run / '.lock'}); wait for it to end or use another --run-dir")
        first.kill()                                              # SIGKILL: nothing of plan's own code runs
        first.wait()
        _wait(lambda: _gone(workers) and not _procs(run, "torch.distributed.run"), 30, "the workers to end")
        n1 = _steps(run)
        assert n1 >= 3
    finally:
        if first.poll() is None:
            first.kill()

    # (2) torchrun killed: plan reports the dead worker in one line, no worker is left.
    second = _plan_run(plan, run)
    try:
        _wait(lambda: _procs(run, "executor.train") and _steps(run) > n1 - 2, 300, "the resumed steps")
        workers = _procs(run, "executor.train")
        (torchrun,) = _procs(run, "torch.distributed.run")
        os.kill(torchrun, signal.SIGKILL)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert len(err.strip().splitlines()) == 1 and err.startswith(f"plan run: failed: {run}: ")
        _wait(lambda: _gone(workers), 30, "the workers to end after torchrun")
    finally:
        if second.poll() is None:
            second.kill()

    # (3) SIGTERM to plan: stopped like Ctrl-C, exit 130, no worker left.
    third = _plan_run(plan, run)
    try:
        _wait(lambda: _procs(run, "executor.train"), 120, "the third attempt's workers")
        workers = _procs(run, "executor.train")
        third.send_signal(signal.SIGTERM)
        out, err = third.communicate(timeout=60)
        assert third.returncode == 130 and err.strip() == "plan: interrupted"
        _wait(lambda: _gone(workers) and not _procs(run, "torch.distributed.run"), 30, "the workers to end")
    finally:
        if third.poll() is None:
            third.kill()
    log = (run / "launch.log").read_text()
    headers = [ln for ln in log.splitlines() if ln.startswith("==== plan run attempt")]
    assert [h.split()[4] for h in headers] == ["1", "2", "3"]
    assert "from step 0" in headers[0] and "resuming from step_" in headers[1]
    # The first attempt's output is still there, before the second header.
    assert log.index(headers[0]) < log.index(headers[1]) and log.index(headers[1]) < log.index(headers[2])
    assert not list(run.rglob("*.tmp"))


def test_checkpoints_kept_verified_and_resumed(tmp_path):
    """Two checkpoints kept with sha256 manifests; the newest damaged by one flipped bit and the other's
    COMPLETE marker deleted: the run resumes from the older one (reported) and recomputes the same step 4;
    another layout, and metrics with no checkpoint left, are refused in one line."""
    plan, run = write_plan(tmp_path / "plan.json", "tiny-gpt"), tmp_path / "run"
    res = launch(plan, run, steps=4, dtype="fp32", checkpoint_every=1)
    assert [p.name for p in checkpoints.step_dirs(run)] == ["step_4", "step_3"]   # steps 1 and 2 pruned
    for ckpt in checkpoints.step_dirs(run):
        manifest = json.loads((ckpt / "manifest.json").read_text())
        assert manifest["layout"]["tp"] == 1 and manifest["world_size"] == 1
        assert manifest["sha256"] == {"rank00000.pt": checkpoints.sha256_file(ckpt / "rank00000.pt")}
    before = res.metrics
    shard = run / "checkpoints" / "step_4" / "rank00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10                                   # one bit
    shard.write_bytes(bytes(data))
    (run / "checkpoints" / "step_3" / "COMPLETE").unlink()
    res = launch(plan, run, steps=6, dtype="fp32", checkpoint_every=1)
    assert res.summary["resumed_from_step"] == 3
    assert res.notes == (f"{run / 'checkpoints' / 'step_4'}: rank00000.pt is damaged (sha256 differs from the "
                         f"manifest); not resumed from", "resuming from step_3")
    assert [r["step"] for r in res.metrics] == [1, 2, 3, 4, 5, 6]
    assert res.metrics[:3] == before[:3]                           # kept, not rewritten
    for k in ("loss", "grad_norm"):                                # step 4 recomputed from step 3: the same
        assert res.metrics[3][k] == before[3][k]
    assert [p.name for p in checkpoints.step_dirs(run)] == ["step_6", "step_5"]
    again = launch(plan, run, steps=6, dtype="fp32", checkpoint_every=1)    # finished: returned, not rerun
    assert again.metrics == res.metrics and again.notes[0].endswith("already trained 6 steps with this plan "
                                                                    "(summary.json); nothing run")

    other = write_plan(tmp_path / "dp2.json", "tiny-gpt", dp=2)
    with pytest.raises(InputError) as e:
        launch(other, run, steps=8, checkpoint_every=1)
    assert str(e.value) == (f"{run / 'checkpoints' / 'step_6'}: saved with tp1 pp1 vpp1 dp1 cp1 ep1 etp1 but {other} "
                            f"is tp1 pp1 vpp1 dp2 cp1 ep1 etp1; checkpoints are not resharded: resume with the plan "
                            f"it was saved with, or start this one in another --run-dir")
    for ckpt in checkpoints.step_dirs(run):
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()
    with pytest.raises(InputError, match=r"metrics.jsonl has 6 steps but no usable checkpoint \(none was saved\); "
                                         r"starting over would overwrite them"):
        launch(plan, run, steps=8)
    assert _steps(run) == 6                                        # nothing was wiped


def test_full_disk_names_the_path_and_leaves_no_tmp(tmp_path):
    """The checkpoint shard and launch.log on a full device (/dev/full: every write fails with ENOSPC): the
    error names the rank, the errno and the shard's path, says the log could not be written, and no .tmp
    file is left."""
    plan, run = write_plan(tmp_path / "plan.json", "tiny-gpt"), tmp_path / "run"
    ckpt = run / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "rank00000.pt.tmp").symlink_to("/dev/full")
    (run / "launch.log").symlink_to("/dev/full")
    with pytest.raises(LaunchError) as e:
        launch(plan, run, steps=2, dtype="fp32", checkpoint_every=1, timeout_s=300)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{run}: rank 0: OSError: [Errno 28] No space left on device (ENOSPC) writing the "
                          f"checkpoint: '{run.resolve() / 'checkpoints' / 'step_1' / 'rank00000.pt'}'")
    assert msg.endswith(f"(log: {run / 'launch.log'} could not be written: No space left on device)")
    assert not list(run.rglob("*.tmp"))


def test_plan_fields_are_required_and_the_process_cap_is_the_machines(tmp_path):
    path = Path(write_plan(tmp_path / "plan.json", "tiny-gpt", dp=2))
    data = json.loads(path.read_text())
    del data["plan"]["tp"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"plan.json: plan field 'tp' is missing \(a plan.json from `plan --out` "
                                         r"states tp, pp, vpp, dp"):
        read_plan(path)
    n, what = available_processes()
    cores = len(os.sched_getaffinity(0))
    assert n <= 2 * cores and f"2 per core on {cores} cores" in what
