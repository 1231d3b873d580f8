"""Parse nccl-tests output (``all_reduce_perf`` and friends) into bus-bandwidth curves. Pure: no torch.

nccl-tests (github.com/NVIDIA/nccl-tests) prints one table per run: a ``# Using devices`` block with one
``#  Rank  N ... on HOST device D [...] NAME`` line per rank, a header naming the columns, and one row per
message size with the out-of-place and in-place time, algbw and busbw. Bus bandwidth follows
doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter
and all-to-all, x 1 for send/recv (see ``BUSBW_FACTOR``), in GB/s of 1e9 bytes.

Columns are located by the header line, so the layouts of several nccl-tests versions parse: with or
without the ``redop``/``root`` columns, ``#wrong`` or ``error``/``res`` columns, ``size`` or ``bytes``.
One file may hold several runs (``# Collective test starting: NAME`` ... ``concluded``, as the
``run_all`` scripts print them); which test wrote a run is read from that line, else from the file
name (``all_gather_perf.log``), else from a command line echoed in the file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from costmodel.profiles import InputError

# nccl-tests binary -> collective name of the profile schema (costmodel.profiles.Collective).
COLLECTIVE_OF_TEST = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "sendrecv_perf": "send_recv",
}
# Binaries whose output parses but whose collective the cost model has no curve for.
OTHER_TESTS = ("broadcast_perf", "reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf",
               "alltoallv_perf")
# Underscores separate words in file names (h100x8_all_reduce_perf.txt), so \b will not do.
_TEST_RE = re.compile(r"(?<![A-Za-z0-9])(" + "|".join([*COLLECTIVE_OF_TEST, *OTHER_TESTS]) + r")(?![A-Za-z0-9])")
_START_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
# mpirun --tag-output prefixes every line with "[job,rank]<stdout>:".
_TAG_RE = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
# "#  Rank  0 Group  0 Pid 1006102 on pool0-01806 device  0 [0000:19:00] NVIDIA H100 80GB HBM3"
# "#   Rank  0 on       ncrh device  0 [0x05] GeForce RTX 2080 Ti"
_RANK_RE = re.compile(r"^#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)\s*(?:\[[^\]]*\])?\s*(.*?)\s*$")


def busbw_factor(collective: str, n: int) -> float:
    """busbw / algbw for a group of n ranks (nccl-tests doc/PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class Row:
    """One message size of a run (out-of-place columns)."""

    size_bytes: int
    dtype: str
    op: str
    time_s: float | None
    """Out-of-place time of one call; None where the log does not state the unit."""
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True)
class Run:
    """One nccl-tests table: which test, on which ranks and hosts, and its rows."""

    path: str
    line: int
    """Line of the table header in the file (1-based)."""
    test: str
    """nccl-tests binary, e.g. all_reduce_perf."""
    ranks: int
    hosts: tuple[str, ...]
    devices: tuple[str, ...]
    """Distinct device names as nccl-tests printed them."""
    rows: tuple[Row, ...]

    @property
    def collective(self) -> str | None:
        return COLLECTIVE_OF_TEST.get(self.test)

    @property
    def scope(self) -> str:
        """intra = every rank on one host; inter = the run spans hosts."""
        return "intra" if len(self.hosts) <= 1 else "inter"

    def sweep(self) -> tuple[Row, ...]:
        """Rows of the first (type, op) the run printed, one per size, increasing size."""
        if not self.rows:
            return ()
        first = (self.rows[0].dtype, self.rows[0].op)
        rows = {r.size_bytes: r for r in self.rows if (r.dtype, r.op) == first}
        return tuple(rows[s] for s in sorted(rows))

    def points(self) -> list[tuple[int, float]]:
        """(bytes, busbw bytes/s) above nccl-tests' print resolution (it prints 0.00 for tiny messages)."""
        return [(r.size_bytes, r.busbw_bytes_per_s) for r in self.sweep() if r.busbw_bytes_per_s > 0]

    def latency_s(self) -> float | None:
        """Time of the smallest message: the collective's small-message latency."""
        rows = self.sweep()
        return rows[0].time_s if rows else None


def _num(tok: str, path: str, lineno: int, col: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise InputError(f"{path}:{lineno}: column '{col}': {tok!r} is not a number "
                         "(expected nccl-tests output rows)") from None


class _Section:
    def __init__(self, start: int, test: str | None):
        self.start = start
        self.test = test
        self.ranks: dict[int, tuple[str, str]] = {}
        self.header: list[str] | None = None
        self.header_line = 0
        self.time_scale: float | None = None
        self.rows: list[Row] = []


def _header_columns(line: str) -> list[str] | None:
    toks = line.lstrip("#").split()
    if toks and toks[0] in ("size", "bytes") and "busbw" in toks and "time" in toks and "algbw" in toks:
        return toks
    return None


def _parse_row(sec: _Section, toks: list[str], path: str, lineno: int) -> Row:
    cols = sec.header
    idx = {name: cols.index(name) for name in ("time", "algbw", "busbw")}
    if len(toks) <= max(idx.values()):
        raise InputError(f"{path}:{lineno}: row has {len(toks)} columns, the header at line "
                         f"{sec.header_line} names {len(cols)}")
    dtype = toks[cols.index("type")] if "type" in cols else ""
    op_col = "redop" if "redop" in cols else "op" if "op" in cols else None
    op = toks[cols.index(op_col)] if op_col else ""
    t = _num(toks[idx["time"]], path, lineno, "time") if toks[idx["time"]] != "N/A" else None
    return Row(
        size_bytes=int(_num(toks[0], path, lineno, cols[0])),
        dtype=dtype,
        op=op,
        time_s=None if t is None or sec.time_scale is None else t * sec.time_scale,
        algbw_bytes_per_s=_num(toks[idx["algbw"]], path, lineno, "algbw") * 1e9,
        busbw_bytes_per_s=_num(toks[idx["busbw"]], path, lineno, "busbw") * 1e9,
    )


def _sections(text: str, path: str) -> list[_Section]:
    sections: list[_Section] = []
    cur: _Section | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _TAG_RE.sub("", raw).strip()
        m = _START_RE.match(line)
        if m or line.startswith("# nThread") or (cur is None and line.startswith("#") and "Using devices" in line):
            # A new run starts; "# Collective test starting" is followed by its own "# nThread" line.
            if m or cur is None or cur.header is not None or cur.ranks:
                # Binaries built with MPI=1 are named all_reduce_perf_mpi and so on.
                cur = _Section(lineno, m.group(1).removesuffix("_mpi") if m else None)
                sections.append(cur)
            continue
        if cur is None:
            continue
        rm = _RANK_RE.match(line)
        if rm:
            cur.ranks[int(rm.group(1))] = (rm.group(2), rm.group(4))
            continue
        cols = _header_columns(line)
        if cols:
            cur.header, cur.header_line = cols, lineno
            continue
        if line.startswith("#") and cur.header and cur.time_scale is None and "(GB/s)" in line:
            cur.time_scale = 1e-6 if "(us)" in line else 1e-3 if "(ms)" in line else None
            continue
        toks = line.split()
        if cur.header and toks and not line.startswith("#") and toks[0].isdigit():
            cur.rows.append(_parse_row(cur, toks, path, lineno))
    return [s for s in sections if s.rows]


def _test_from_context(path: Path, text: str) -> str | None:
    """The binary named by the file name, else by a command line echoed in the file (exactly one)."""
    for candidate in (path.name, text):
        names = set(_TEST_RE.findall(candidate))
        if len(names) == 1:
            return names.pop()
    return None


def parse_text(text: str, path: str | Path = "<text>") -> list[Run]:
    """Every table in nccl-tests output. Raises InputError (naming the file and line) on bad input."""
    path = Path(path)
    sections = _sections(text, str(path))
    if not sections:
        raise InputError(f"{path}: no nccl-tests result rows found (expected the table that "
                         "all_reduce_perf and friends print: '#  size  count  type ... busbw' and rows)")
    fallback = _test_from_context(path, text)
    runs = []
    for sec in sections:
        test = sec.test or fallback
        if test is None:
            raise InputError(f"{path}:{sec.header_line}: cannot tell which nccl-tests binary wrote this table; "
                             f"name the file after it (e.g. all_gather_perf.log) or keep nccl-tests' "
                             f"'# Collective test starting:' line")
        if not sec.ranks:
            raise InputError(f"{path}:{sec.header_line}: no '#  Rank N ... on HOST device D' lines before the "
                             "table, so the group size is unknown; keep nccl-tests' '# Using devices' block")
        hosts = tuple(sorted({h for h, _ in sec.ranks.values()}))
        devices = tuple(sorted({d for _, d in sec.ranks.values() if d}))
        runs.append(Run(str(path), sec.header_line, test, len(sec.ranks), hosts, devices, tuple(sec.rows)))
    return runs


def parse_log(path: str | Path) -> list[Run]:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        raise InputError(f"{p}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory; pass the nccl-tests log files") from None
    return parse_text(text, p)


def source_id(path: str | Path) -> str:
    """A sources-table id for one log file: NCCLTESTS_<FILE STEM>."""
    stem = re.sub(r"[^A-Za-z0-9]+", "_", Path(path).stem).strip("_").upper()
    return f"NCCLTESTS_{stem}"


def citation(path: str | Path, runs: list[Run], imported_on: str) -> str:
    """Citation text of one log file for a profile's sources table."""
    p = Path(path)
    digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    parts = []
    for r in runs:
        hosts = f"{len(r.hosts)} host(s) ({', '.join(r.hosts[:4])}{', ...' if len(r.hosts) > 4 else ''})"
        parts.append(f"{r.test} {r.ranks} ranks on {hosts}, {', '.join(r.devices) or 'device not named'}, "
                     f"{r.sweep()[0].size_bytes} B - {r.sweep()[-1].size_bytes} B")
    return (f"nccl-tests output {p.name} (sha256 {digest}): {'; '.join(parts)}; out-of-place busbw; "
            f"imported by `plan profile --import-nccl-tests` on {imported_on}")


@dataclass
class Imported:
    """Curves, latencies and sources taken from a set of logs, ready to merge into a profile."""

    curves: list[dict]
    sources: dict[str, str]
    latency_by_op_s: dict[str, float]
    notes: list[str]


def import_logs(paths: list[str | Path], imported_on: str) -> Imported:
    """Parse logs into profile curves (schema dicts of costmodel.profiles.BusBwCurve).

    Two logs giving the same (collective, scope, group size) are an error: the curve would be ambiguous.
    The latency of a collective is the smallest message's time of its largest intra-host run.
    """
    curves: dict[tuple, dict] = {}
    origin: dict[tuple, str] = {}
    sources: dict[str, str] = {}
    latency: dict[str, tuple[int, float]] = {}
    notes: list[str] = []
    for path in paths:
        runs = parse_log(path)
        sid = source_id(path)
        used = False
        for run in runs:
            where = f"{path}:{run.line}"
            if run.collective is None:
                notes.append(f"{where}: {run.test} has no curve in the profile schema; skipped")
                continue
            pts = run.points()
            if len(pts) < 2:
                notes.append(f"{where}: {run.test} has {len(pts)} size(s) with busbw > 0; a curve needs two")
                continue
            key = (run.collective, run.scope, run.ranks)
            if key in curves:
                raise InputError(f"{where}: {run.test} {run.scope} x{run.ranks} is already given by "
                                 f"{origin[key]}; import one sweep per collective, scope and group size")
            curves[key] = {"collective": run.collective, "scope": run.scope, "group_size": run.ranks,
                           "points": [[b, bw] for b, bw in pts], "source": sid}
            origin[key] = where
            used = True
            lat = run.latency_s()
            if run.scope == "intra" and lat is not None and run.ranks >= latency.get(run.collective, (0, 0.0))[0]:
                latency[run.collective] = (run.ranks, lat)
        if used:
            if sid in sources:
                raise InputError(f"{path}: another log has the same file name stem; rename one of them")
            sources[sid] = citation(path, runs, imported_on)
    if not curves:
        raise InputError(f"no curve in {', '.join(str(p) for p in paths)}: "
                         + ("; ".join(notes) if notes else "no usable nccl-tests table"))
    ordered = sorted(curves.values(), key=lambda c: (c["scope"] != "intra", c["collective"], c["group_size"]))
    return Imported(ordered, sources, {k: v for k, (_, v) in sorted(latency.items())}, notes)
