"""Print the README's accuracy tables (markdown) from `plan validate --cross-validate --json` output.

    plan validate data/validation/published_runs.csv --cross-validate --json /tmp/v.json
    python scripts/accuracy_table.py /tmp/v.json

First the held-out figures of every cross-validation scheme, then the error per source (in-sample and left
out of the fit) and per GPU type, and last the one-run calibration's same-model error split by what differs
between the calibrating run and the predicted one (GPU count; software release).
"""

from __future__ import annotations

import json
import math
import statistics
import sys

SCHEME_NAMES = {"source": "leave-one-source-out", "release": "leave-one-release-out",
                "gpu": "leave-one-GPU-type-out"}


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


def main(path: str) -> None:
    data = json.load(open(path))
    s = data["summary"]
    schemes = data.get("cross_validation", {}).get("schemes", {})
    if schemes:
        print("| held out | folds | rows | MAPE % | median % | p90 % |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, res in schemes.items():
            o = res["summary"]["overall"]
            print(f"| {SCHEME_NAMES.get(name, name)} | {len(res['folds'])} | {o['count']} | **{fmt(o['mape'])}** | "
                  f"{fmt(o['median_ape'])} | {fmt(o['p90_ape'])} |")
        o = s["overall"]
        print(f"| in-sample (nothing held out) | - | {o['count']} | {fmt(o['mape'])} | {fmt(o['median_ape'])} | "
              f"{fmt(o['p90_ape'])} |")
        print()
    cv = {f["left_out"]: f for f in schemes.get("source", {}).get("folds", [])}
    print("| source | rows | MAPE % | median % | p90 % | left out of the fit: MAPE % |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, st in s["by_source"].items():
        lo = fmt(cv[name]["mape"]) if name in cv else "-"
        print(f"| {name} | {st['count']} | {fmt(st['mape'])} | {fmt(st['median_ape'])} | {fmt(st['p90_ape'])} | {lo} |")
    o = s["overall"]
    cvo = schemes.get("source", {}).get("summary", {}).get("overall", {})
    print(f"| **all** | {o['count']} | **{fmt(o['mape'])}** | **{fmt(o['median_ape'])}** | {fmt(o['p90_ape'])} | "
          f"**{fmt(cvo.get('mape'))}** |")
    print()
    gcv = {f["left_out"]: f for f in schemes.get("gpu", {}).get("folds", [])}
    print("| GPU | rows | MAPE % | median % | p90 % | GPU type left out: MAPE % |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, st in s["by_gpu"].items():
        lo = fmt(gcv[name]["mape"]) if name in gcv else "-"
        print(f"| {name} | {st['count']} | {fmt(st['mape'])} | {fmt(st['median_ape'])} | {fmt(st['p90_ape'])} | {lo} |")
    one = data.get("cross_validation", {}).get("one_run_calibration", {}).get("same_model")
    if one:
        print()
        one_run_split(one, {r["row"]: r for r in data["rows"]})


def one_run_split(same_model: dict, rows: dict) -> None:
    """The same-model pairs of the one-run calibration (each group's first run calibrates, its other runs are
    predicted) by whether the predicted run has more, as many or fewer GPUs than the calibrating one and
    whether it is of the same software release: what one run transfers across scale, and what a new release
    moves."""
    targets = iter(same_model["residuals"])   # the groups' predicted runs, in group order
    split: dict[tuple[str, str], list[float]] = {}
    for g in same_model["groups"]:
        anchor = rows[g["anchor_row"]]
        for _ in range(g["after"]["count"]):
            t = next(targets)
            target = rows[t["row"]]
            n0, n1 = anchor["num_gpus"], target["num_gpus"]
            scale = "more GPUs" if n1 > n0 else "as many GPUs" if n1 == n0 else "fewer GPUs"
            release = "same release" if anchor.get("release") == target.get("release") else "another release"
            split.setdefault((scale, release), []).append(100 * abs(math.exp(-t["log_residual"]) - 1))
    print("| one-run calibration, same model: predicted run | pairs | MAPE % | median % |")
    print("|---|---:|---:|---:|")
    for (scale, release), errs in sorted(split.items()):
        print(f"| {scale}, {release} | {len(errs)} | {fmt(statistics.mean(errs))} | {fmt(statistics.median(errs))} |")


if __name__ == "__main__":
    main(sys.argv[1])
