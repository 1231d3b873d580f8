"""What ``plan profile`` prints: the measured figures as rich tables, or as JSON-ready data."""

from __future__ import annotations

from rich.table import Table

from executor.profile import human_bytes


def summary(result: dict) -> dict:
    """JSON-ready figures of a written profile (and of the raw measurement where there was one)."""
    prof = result["profile"]
    out = {"profile_path": result["profile_path"], "cluster_path": result.get("cluster_path"),
           "kind": prof.get("kind", "gpu"),
           "peak_flops": {d: v["value"] for d, v in prof["peak_flops"].items()},
           "gemm_max_efficiency": {d: v["value"] for d, v in prof["gemm_max_efficiency"].items()},
           "gemm_half_efficiency_dim": prof.get("gemm_half_efficiency_dim"),
           "hbm_bandwidth_bytes_per_s": prof["hbm_bandwidth_bytes_per_s"]["value"],
           "collective_latency_by_op_s": prof.get("collective_latency_by_op_s", {}),
           "curves": [{k: c[k] for k in ("collective", "scope", "group_size", "points", "source")}
                      for c in prof.get("curves") or []]}
    for key in ("host_link_bandwidth_bytes_per_s", "host_memory_bandwidth_bytes_per_s"):
        if prof.get(key):
            out[key] = prof[key]["value"]
    raw = result.get("raw")
    if raw:
        out.update(wall_s=raw["wall_s"], measure_s=raw["elapsed_s"], gemm=raw["gemm"], gemm_skipped=raw["gemm_skipped"],
                   world_size=raw["config"]["world_size"], backend=raw["config"]["backend"],
                   threads=raw["config"]["threads"], load_average_before=raw["load_average_before"])
    if result.get("imported"):
        out["notes"] = result["imported"].notes
    return out


def _three(points) -> list:
    return [points[0], points[len(points) // 2], points[-1]]


def _short(nbytes: float) -> str:
    return human_bytes(nbytes).replace(" ", "")


def tables(s: dict) -> list[Table]:
    """GEMM rates, and busbw / latency per collective."""
    out = []
    if s.get("gemm"):
        t = Table(title=f"GEMMs ({s['backend']}, {s['world_size']} ranks at once"
                        + (f", {s['threads']} thread(s) each)" if s["backend"] == "gloo" else ")"),
                  header_style="bold")
        for col in ("dtype", "m x n x k", "TFLOP/s per rank", "of peak"):
            t.add_column(col, justify="left" if col == "dtype" else "right")
        for p in s["gemm"]:
            t.add_row(p["dtype"], f"{p['m']}x{p['n']}x{p['k']}", f"{p['flops_per_s'] / 1e12:.4g}",
                      f"{p['flops_per_s'] / s['peak_flops'][p['dtype']]:.0%}")
        for p in s.get("gemm_skipped", []):
            t.add_row(p["dtype"], f"{p['m']}x{p['n']}x{p['k']}", "-", p["reason"][:40], style="dim")
        out.append(t)
    picks = [_three(c["points"]) for c in s["curves"]]
    same = len({tuple(b for b, _ in p) for p in picks}) == 1
    heads = [f"@{_short(b)}" for b, _ in picks[0]] if same and picks else ["smallest", "middle", "largest"]
    t = Table(title="Collective busbw, GB/s, by message size (lat. = time of the smallest)",
              header_style="bold")
    for col in ("collective", "scope", "ranks", "lat. us", *heads):
        t.add_column(col, justify="left" if col in ("collective", "scope") else "right", no_wrap=True)
    lat = s.get("collective_latency_by_op_s", {})
    for c, pts in zip(s["curves"], picks):
        latency = f"{lat[c['collective']] * 1e6:.0f}" if c["collective"] in lat and c["scope"] == "intra" else "-"
        t.add_row(c["collective"], c["scope"], str(c["group_size"]), latency,
                  *(f"{bw / 1e9:.3g}" + ("" if same else f"@{_short(b)}") for b, bw in pts))
    out.append(t)
    return out


def headline(s: dict) -> str:
    """One line: where the files went and the headline figures."""
    peaks = ", ".join(f"{d} {v / 1e12:.4g} TFLOP/s" for d, v in s["peak_flops"].items())
    files = s["profile_path"] + (f" and {s['cluster_path']}" if s.get("cluster_path") else "")
    took = f" in {s['wall_s']:.0f} s" if "wall_s" in s else ""
    host = (f"; host link {s['host_link_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s, CPU Adam "
            f"{s['host_memory_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s" if "host_memory_bandwidth_bytes_per_s" in s else "")
    return (f"wrote {files}{took}: peak {peaks}; memory {s['hbm_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s; "
            f"{len(s['curves'])} busbw curve(s){host}")
