"""The house's one writer of files a user keeps (plans, launch scripts, reports, profiles, JSON): every file
of a call to a temporary file beside its target, synced, then renamed into place, so that a failure leaves
nothing half-written; errors are one-line InputErrors naming the path. Used by planner and executor alike
(executor may import only costmodel). Checkpoints of a running job have their own writer
(executor/checkpoints.py), whose errors say which step's file failed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from costmodel.profiles import InputError

Writer = Callable[[Path], None] | str
"""A file's content: text, or a function that writes the file at the path it is given."""


def write_files_atomic(directory: str | os.PathLike, files: dict[str, Writer], *, executable: tuple[str, ...] = (),
                       create: bool = False) -> list[Path]:
    """Write ``files`` (name -> content) into ``directory``: each to a temporary file in that directory
    (so every rename stays on one filesystem), synced, then all renamed into place. A failure before the
    renames leaves the directory as it was (and removes it when ``create`` made it); errors are one-line
    InputErrors naming the path. The project's only writer of user-facing output files (several directories:
    :func:`write_paths_atomic`)."""
    out = Path(directory)
    what = check_target(out, tuple(files), create=create)
    umask = os.umask(0)
    os.umask(umask)
    made = done = False
    temps: dict[str, Path] = {}
    try:
        if not out.is_dir():
            out.mkdir(mode=0o777)
            made = True
        for name, content in files.items():
            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.tmp-", suffix=Path(name).suffix)
            temps[name] = Path(tmp)
            if callable(content):
                os.close(fd)
                content(temps[name])
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
            else:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(content)
                    fh.flush()
                    os.fsync(fh.fileno())
            mode = 0o666 & ~umask
            if name in executable:
                mode |= 0o111 & ~umask
            os.chmod(tmp, mode)
        for name, tmp in temps.items():
            os.replace(tmp, out / name)
        done = True
    except OSError as exc:
        raise InputError(f"{what}: cannot write ({exc.strerror or exc})") from None
    finally:
        if not done:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
            if made:
                shutil.rmtree(out, ignore_errors=True)
    return [out / name for name in files]


def check_target(directory: str | os.PathLike, names: tuple[str, ...], *, create: bool = False) -> str:
    """Refuse, as a one-line InputError, a destination :func:`write_files_atomic` could not write: a file
    where the directory should be, a missing directory (or parent, with ``create``), a directory where a
    file should be, a directory no temporary file can be made in. Returns the path to name in errors.
    Commands call it before long work, so that a bad ``--out`` / ``--json`` / ``--plot`` fails at once."""
    out = Path(directory)
    what = f"{out}" if create else f"{out / names[0]}"
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    if not out.is_dir() and (not create or not out.parent.is_dir()):
        raise InputError(f"{what}: directory {out if not create else out.parent} does not exist")
    for name in names:
        if (out / name).is_dir():
            raise InputError(f"{out / name}: is a directory; give a file name")
    parent = out if out.is_dir() else out.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what}: directory {parent} is not writable")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".probe.tmp-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"{what}: cannot write in {parent} ({exc.strerror or exc})") from None
    return what


def write_file_atomic(path: str | os.PathLike, content: Writer) -> Path:
    """One file written by :func:`write_files_atomic` (its directory must exist)."""
    p = Path(path)
    return write_files_atomic(p.parent, {p.name: content})[0]


def write_paths_atomic(files: dict[str | os.PathLike, Writer]) -> list[Path]:
    """Files in existing directories, possibly several: every directory is checked before anything is written,
    then each directory's files go through :func:`write_files_atomic`. (Renames in two directories cannot be
    one step: a failure in the second leaves the first written; the checks make that a full-disk case.)"""
    by_dir: dict[Path, dict[str, Writer]] = {}
    for path, content in files.items():
        p = Path(path)
        by_dir.setdefault(p.parent, {})[p.name] = content
    for d, named in by_dir.items():
        check_target(d, tuple(named))
    return [p for d, named in by_dir.items() for p in write_files_atomic(d, named)]
