#!/usr/bin/env bash
# 405B (Llama 3.1) on 15T tokens in 90 days: which of H100, H200 and B200 is cheapest, and at what size?
# Writes capacity_405b.png and capacity_405b.json next to this script. About 1 minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
args=(--model 405b --tokens 15T --deadline 90d --global-batch 2048 --min-gpus 1024
      --cluster clusters/h100.yaml clusters/h200.yaml clusters/b200.yaml)
# Exit 1 means "deadline not met" (still a full answer); any other failure stops the script.
ok() { "$@" || { rc=$?; [ "$rc" -eq 1 ] || exit "$rc"; }; }
ok plan capacity "${args[@]}" --plot capacity_405b.png
# Floats rounded to 6 significant digits, so that a rerun does not rewrite the tracked file with last-digit noise.
round6='import json, sys
def r(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [r(v) for v in x]
    return {k: r(v) for k, v in x.items()} if isinstance(x, dict) else x
print(json.dumps(r(json.load(sys.stdin)), indent=1))'
ok plan capacity "${args[@]}" --json > capacity_405b.json.tmp
python3 -c "$round6" < capacity_405b.json.tmp > capacity_405b.json.new && mv capacity_405b.json.new capacity_405b.json
rm -f capacity_405b.json.tmp
