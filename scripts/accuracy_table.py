"""Print the README's accuracy tables (markdown) from `plan validate --json` output.

    plan validate data/validation/published_runs.csv --cross-validate --json /tmp/v.json
    python scripts/accuracy_table.py /tmp/v.json
"""

from __future__ import annotations

import json
import sys


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


def main(path: str) -> None:
    data = json.load(open(path))
    s = data["summary"]
    cv = {f["left_out"]: f for f in data.get("cross_validation", {}).get("folds", [])}
    print("| source | rows | MAPE % | median % | p90 % | left out of the fit: MAPE % |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, st in s["by_source"].items():
        lo = fmt(cv[name]["mape"]) if name in cv else "-"
        print(f"| {name} | {st['count']} | {fmt(st['mape'])} | {fmt(st['median_ape'])} | {fmt(st['p90_ape'])} | {lo} |")
    o = s["overall"]
    cvo = data.get("cross_validation", {}).get("summary", {}).get("overall", {})
    print(f"| **all** | {o['count']} | **{fmt(o['mape'])}** | **{fmt(o['median_ape'])}** | {fmt(o['p90_ape'])} | "
          f"**{fmt(cvo.get('mape'))}** |")
    print()
    print("| GPU | rows | MAPE % | median % | p90 % |")
    print("|---|---:|---:|---:|---:|")
    for name, st in s["by_gpu"].items():
        print(f"| {name} | {st['count']} | {fmt(st['mape'])} | {fmt(st['median_ape'])} | {fmt(st['p90_ape'])} |")


if __name__ == "__main__":
    main(sys.argv[1])
