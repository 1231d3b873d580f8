"""scripts/blank_columns.py: the shared runs with columns blanked read back near their published layouts."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("blank_columns", ROOT / "scripts" / "blank_columns.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_blank_sequence_parallelism_and_recompute_cost_nothing_and_break_no_row(tmp_path):
    mod = _script()
    with mod.DATA.open() as f:
        rows = list(csv.DictReader(f))
    published = mod.blanked(rows, (), tmp_path / "a.csv")
    assert published["rows"] == 342 and published["errors"] == 0 and published["not_fit"] == 0
    for columns in (("sp",), ("recompute",)):
        got = mod.blanked(rows, columns, tmp_path / "b.csv")
        assert got["rows"] == 342 and got["errors"] == 0 and got["not_fit"] == 0, columns
        assert abs(got["mape"] - published["mape"]) < 0.05, (columns, got, published)
