"""How fast this host's CPU steps Adam against how fast it streams memory: the check behind
costmodel/compute.py HOST_STREAM_FRACTION (a CPU optimizer step runs at the DRAM's streaming rate).

Times the step megatron-core's HybridDeviceOptimizer runs on the offloaded state (executor.profile.cpu_adam_step:
torch.optim.AdamW fused, 28 bytes a parameter) and two STREAM kernels over arrays of the same size, counting
the bytes each really moves (a copy or triad writes a fresh array, which the CPU first reads: write-allocate,
so 12 and 16 bytes an element; Adam updates in place). A ratio near 1 says the step is a streaming kernel on
these cores; then its rate on a GPU server is HOST_STREAM_FRACTION of the DRAM's datasheet peak, as STREAM
reaches. `plan profile` on GPUs measures the step itself (host_memory_bandwidth_bytes_per_s).

    python scripts/cpu_adam_rate.py [--params 50000000] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.compute import CPU_ADAM_BYTES_PER_PARAM  # noqa: E402
from executor.profile import cpu_adam_step, host_cores  # noqa: E402


def _per_call_s(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=50_000_000, help="fp32 parameters (default 50M: 1.4 GB of state)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core of this process)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads or host_cores())
    n = args.params
    adam_s = _per_call_s(cpu_adam_step(n), args.repeats)
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    copy_s = _per_call_s(lambda: c.copy_(a), args.repeats)
    triad_s = _per_call_s(lambda: torch.add(a, b, alpha=3.0, out=c), args.repeats)
    out = {"threads": torch.get_num_threads(), "params": n,
           "adam_bytes_per_s": n * CPU_ADAM_BYTES_PER_PARAM / adam_s,
           "copy_bytes_per_s": n * 12 / copy_s, "triad_bytes_per_s": n * 16 / triad_s}
    out["adam_over_stream"] = out["adam_bytes_per_s"] / max(out["copy_bytes_per_s"], out["triad_bytes_per_s"])
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['threads']} threads, {n / 1e6:.0f}M parameters: Adam {out['adam_bytes_per_s'] / 1e9:.1f} GB/s, "
              f"copy {out['copy_bytes_per_s'] / 1e9:.1f} GB/s, triad {out['triad_bytes_per_s'] / 1e9:.1f} GB/s "
              f"(bytes moved, write-allocate counted); Adam / best STREAM {out['adam_over_stream']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
