"""Checkpoints of a run directory on disk, without torch: writing files so that a failed write leaves nothing
behind, the manifest (step, layout, sha256 of every rank's shard) that makes a checkpoint complete, choosing
the checkpoint a restart resumes from, and keeping the last two.

    RUN_DIR/checkpoints/step_N/rank00000.pt ...   one shard per rank (executor/train.py writes them)
    RUN_DIR/checkpoints/step_N/manifest.json      written by rank 0 once every shard is on disk
    RUN_DIR/checkpoints/step_N/COMPLETE           written after the manifest (for people and older tools)

A checkpoint is usable when its manifest lists a file for every rank and each file's sha256 matches; one
that is not (a flipped bit, a shard missing, a write cut short) is reported and the previous one is used.
The manifest, not COMPLETE, decides: a deleted COMPLETE marker does not make a run start over.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from costmodel.plan import ParallelPlan
from costmodel.profiles import InputError

MANIFEST = "manifest.json"
KEEP = 2
"""Complete checkpoints kept per run: the newest and the one before it (the fallback when the newest is damaged)."""
LAYOUT_FIELDS = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "distributed_optimizer", "layers_per_stage")


def disk_error(exc: OSError, path: Path | str, what: str) -> OSError:
    """The same OSError, saying what was being written and where: one line, e.g.
    "[Errno 28] No space left on device (ENOSPC) writing the checkpoint: '/runs/x/checkpoints/step_2/rank00000.pt'"."""
    name = errno.errorcode.get(exc.errno or 0, "")
    return type(exc)(exc.errno, f"{exc.strerror or exc}{f' ({name})' if name else ''} writing {what}", str(path))


def write_atomic(path: Path, data: bytes | str, what: str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed over it once flushed to
    disk; on an error the temporary file is removed and the OSError names ``what`` and the path."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise disk_error(exc, path, what) from None


def remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def layout_of(plan: ParallelPlan) -> dict:
    d = plan.model_dump(mode="json")
    return {k: d[k] for k in LAYOUT_FIELDS}


def layout_text(layout: dict) -> str:
    degrees = " ".join(f"{k}{layout[k]}" for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "etp") if k in layout)
    extra = "" if layout.get("distributed_optimizer", True) else ", no distributed optimizer"
    split = f", stages {list(layout['layers_per_stage'])}" if layout.get("layers_per_stage") else ""
    return degrees + extra + split


def write_manifest(ckpt: Path, step: int, plan: ParallelPlan, files: dict[str, str]) -> None:
    """Mark ``ckpt`` complete: its step, layout and every shard's sha256, then COMPLETE."""
    manifest = {"step": step, "world_size": plan.world_size, "layout": layout_of(plan), "sha256": files}
    write_atomic(ckpt / MANIFEST, json.dumps(manifest, indent=1) + "\n", "the checkpoint manifest")
    write_atomic(ckpt / "COMPLETE", str(step), "the checkpoint marker")


def step_dirs(run_dir: Path) -> list[Path]:
    """checkpoints/step_N folders, newest first."""
    root = Path(run_dir) / "checkpoints"
    dirs = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(dirs, key=lambda p: int(p.name[5:]), reverse=True)


def problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed from (None: it can): no manifest, a shard missing or damaged."""
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
        files = manifest["sha256"]
    except FileNotFoundError:
        if (ckpt / "COMPLETE").exists():   # written before manifests existed: usable, unverified
            return None
        return "incomplete (no manifest: the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest ({type(exc).__name__})"
    for name, digest in sorted(files.items()):
        f = ckpt / name
        if not f.exists():
            return f"{name} is missing"
        try:
            if sha256_file(f) != digest:
                return f"{name} is damaged (sha256 differs from the manifest)"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror})"
    return None


def manifest_layout(ckpt: Path) -> tuple[dict | None, int]:
    """The layout a checkpoint was saved with (None for one without a manifest) and its number of shards."""
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
        return manifest["layout"], int(manifest["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, len(list(ckpt.glob("rank*.pt")))


def metrics_steps(run_dir: Path) -> int:
    path = Path(run_dir) / "metrics.jsonl"
    try:
        if not path.is_file():
            return 0
        with path.open(errors="replace") as f:
            return sum(1 for ln in f if ln.strip())
    except OSError:
        return 0


def choose_resume(run_dir: Path, plan: ParallelPlan, plan_path: str) -> tuple[Path | None, list[str]]:
    """The checkpoint a launch of ``plan`` in ``run_dir`` resumes from (None: start at step 0) and notes on
    the checkpoints passed over. Refuses (InputError, one line) a checkpoint saved with another layout, and a
    run directory whose metrics.jsonl has steps but no usable checkpoint (starting over would overwrite
    them)."""
    run = Path(run_dir)
    notes, chosen = [], None
    for ckpt in step_dirs(run):
        why = problem(ckpt)
        if why is None:
            chosen = ckpt
            break
        notes.append(f"{ckpt}: {why}; not resumed from")
    if chosen is not None:
        saved, shards = manifest_layout(chosen)
        now = layout_of(plan)
        if (saved is not None and saved != now) or (saved is None and shards != plan.world_size):
            was = layout_text(saved) if saved is not None else f"{shards} ranks"
            raise InputError(f"{chosen}: saved with {was} but {plan_path} is {layout_text(now)}; checkpoints are "
                             f"not resharded: resume with the plan it was saved with, or start this one in another "
                             f"--run-dir")
        if notes:
            notes.append(f"resuming from {chosen.name}")
        return chosen, notes
    done = metrics_steps(run)
    if done:
        why = "; ".join(n.split(": ", 1)[1].removesuffix("; not resumed from") for n in notes) or "none was saved"
        raise InputError(f"{run}: metrics.jsonl has {done} steps but no usable checkpoint ({why}); starting over "
                         f"would overwrite them: remove {run / 'metrics.jsonl'} and {run / 'checkpoints'} to start "
                         f"over, or use another --run-dir")
    return None, notes


def prune(run_dir: Path, keep: int = KEEP) -> None:
    """Remove all but the newest ``keep`` usable checkpoints, and unfinished ones older than the newest."""
    kept = 0
    for ckpt in step_dirs(run_dir):
        usable = (ckpt / MANIFEST).exists() or (ckpt / "COMPLETE").exists()
        if usable and kept < keep:
            kept += 1
        elif kept:
            shutil.rmtree(ckpt, ignore_errors=True)
