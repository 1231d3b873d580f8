"""Where the commands' text goes: the console every table and line prints through, and the one progress bar.

    console()                 rich Console on stdout (stderr=True: on stderr), made per call (no module state)
    progress_bar(what, total) a transient bar on stderr for long work; yields a Bar, or None when quiet
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

__all__ = ["PIPE_WIDTH", "Bar", "console", "progress_bar"]

PIPE_WIDTH = 200
"""Columns of tables written to a pipe or file (rich would wrap them at 80); COLUMNS overrides it."""


def console(stderr: bool = False) -> Console:
    """A console for the tables: the terminal's width, or PIPE_WIDTH when the stream is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH
    return Console(stderr=stderr, highlight=False, width=width)


class Bar:
    """The progress callbacks the planner's long functions take, each advancing one rich task."""

    def __init__(self, progress, task) -> None:
        self._progress, self._task = progress, task

    def count(self, done: int, total: int | None = None) -> None:
        """progress(done, total): done of total (total None keeps the bar's)."""
        if total is None:
            self._progress.update(self._task, completed=done)
        else:
            self._progress.update(self._task, completed=done, total=total)

    def labelled(self, label: str, done: int, total: int) -> None:
        """progress(label, done, total): done of total, the label beside the bar."""
        self._progress.update(self._task, completed=done, total=total, description=label)

    def step(self, message: str) -> None:
        """progress(message): one step further, the message beside the bar."""
        self._progress.update(self._task, advance=1, description=message)


@contextmanager
def progress_bar(description: str, total: int | None = None, *, quiet: bool = False) -> Iterator[Bar | None]:
    """A transient progress bar on stderr (description, bar, done/total, elapsed); None with ``quiet``
    (--json), so that the work runs without a callback."""
    if quiet:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as prog:
        yield Bar(prog, prog.add_task(description, total=total))
