#!/usr/bin/env bash
# GPU check (README "GPU check"): measure one GPU with `plan profile` (GEMM sweep, HBM bandwidth), train a
# ~1.2B-parameter Llama-style plan with `plan run` on NCCL in bf16 for 50 steps, predict the same run from the
# fresh profile, and write profile, metrics and the predicted-vs-measured table under $OUT
# (default ./gpu_check_out), then run the same layout at a second micro-batch size, calibrate the profile on
# both runs and plan again (--no-loop skips this), and run the plan with its optimizer state in host memory where
# Transformer Engine imports (--no-offload skips it). About 5-6 minutes on one H200 (3.5 without the loop), about
# one more with the offload run.
#
#   OUT=/path/to/dir bash scripts/gpu_check.sh [--steps 50] [--global-batch 32] [--gpu 0]
#   bash scripts/gpu_check.sh --dry-run      # CPU, gloo, tiny model, 3 steps: the same code path (tests)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" "$ROOT/scripts/gpu_check.py" "$@"
