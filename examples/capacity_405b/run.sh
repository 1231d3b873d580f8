#!/usr/bin/env bash
# 405B (Llama 3.1) on 15T tokens in 90 days: which of H100, H200 and B200 is cheapest, and at what size?
# Writes capacity_405b.png and capacity_405b.json next to this script. About 2 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
args=(--model 405b --tokens 15T --deadline 90d --global-batch 2048 --min-gpus 1024
      --cluster clusters/h100.yaml clusters/h200.yaml clusters/b200.yaml)
plan capacity "${args[@]}" --plot capacity_405b.png || true      # exit 1 would mean: deadline not met
plan capacity "${args[@]}" --json > capacity_405b.json || true
