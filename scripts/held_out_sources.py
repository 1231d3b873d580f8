"""The command line the scripts that choose a one-run constant share: a CSV (default the shared published
runs), --json and --workers, and their per-source job run over every source in parallel
(costmodel.crossval.per_source) with a line on stderr as each source ends."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.crossval import per_source  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "validation" / "published_runs.csv"


def run(doc: str, job, json_help: str) -> tuple[argparse.Namespace, dict]:
    """Parse the arguments (``doc``'s first line as the description) and run ``job`` on every source:
    (the arguments, {source: result})."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    ap.add_argument("--json", help=json_help)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    return args, per_source(job, args.csv, args.workers, lambda s: print(f"{s}: done", file=sys.stderr, flush=True))
