"""Writing published-runs rows (dicts of the CSV's columns) to a CSV file, for the tests that read variants."""

from __future__ import annotations

import csv
from pathlib import Path


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a CSV at ``path`` (the columns of the first row), and the path."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
