"""The ``plan`` command: parse arguments, dispatch, print. Nothing else lives here.

    plan --model 70b --cluster h100x512.yaml         search layouts, print the ranked table
    plan check --model 70b --cluster ... --tp 8 ...  predict one layout and check it against every rule
    plan validate PATH.csv [--json OUT]              score the cost model against published runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from costmodel.profiles import InputError

SUBCOMMANDS = ("check", "validate")
# Up to this many valid layouts, a plain `plan` scores them all instead of sampling.
EXHAUSTIVE_LIMIT = 50_000


def _write_json_atomic(path: str, data: dict) -> None:
    """Write JSON next to its destination and rename, so a failure never leaves half a file."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise InputError(f"{path}: directory {target.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=target.parent or ".", prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _model_cluster(args):
    from costmodel.catalog import get_model
    from costmodel.profiles import load_cluster

    model = get_model(args.model, seq_len=args.seq_len, precision=args.precision)
    cluster = load_cluster(args.cluster)
    return model, cluster


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="catalog name (e.g. 70b, 405b, deepseek-v3) or a HF config.json")
    p.add_argument("--cluster", required=True, help="cluster YAML (a path or a file in hardware_profiles/clusters/)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--precision", default=None, help="bf16, fp8, mxfp8, nvfp4 (default: the model's)")
    p.add_argument("--global-batch", type=int, default=None, help="sequences per step (default: ~4M tokens)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def cmd_search(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="plan", description="Search parallel layouts for a model on a cluster.")
    _common(ap)
    ap.add_argument("--top", type=int, default=10, help="plans to show")
    ap.add_argument("--exhaustive", action="store_true", help="score every valid layout instead of searching")
    ap.add_argument("--sampler", choices=("tpe", "cmaes", "nsga2"), default=None,
                    help="Optuna sampler (default tpe; nsga2 for several objectives)")
    ap.add_argument("--objectives", default="time", help="comma list of time, memory, gpus (Pareto front)")
    ap.add_argument("--trials", type=int, default=None, help="Optuna trials (default 10%% of the layouts, >= 50)")
    ap.add_argument("--storage", default=None, help="Optuna storage URL, e.g. sqlite:///study.db (resumable)")
    ap.add_argument("--study-name", default=None, help="study to create or resume in --storage")
    ap.add_argument("--workers", type=int, default=1, help="processes sharing --storage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    ap.add_argument("--out", metavar="DIR", help="write plan.json, megatron_args.txt, launch.sh, launch.sbatch and "
                                                  "report.png for the best plan into DIR")
    args = ap.parse_args(argv)
    from planner.report import console, plan_row, ranked_table
    from planner.search import exhaustive, optuna_search
    from planner.space import default_global_batch

    model, cluster = _model_cluster(args)
    gbs = args.global_batch or default_global_batch(model, cluster.num_gpus)
    objectives = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    if args.storage and not args.study_name and args.workers > 1:
        raise InputError("--workers needs --study-name so that every process joins the same study")
    # The vectorised cost model scores a few thousand layouts in well under a second, faster and exactly;
    # Optuna is used when asked for (sampler, several objectives, storage) or when the space is large.
    wants_optuna = bool(args.sampler or args.storage or args.trials or objectives != ("time",))
    if args.exhaustive or not wants_optuna:
        from planner.space import valid_plans

        n_valid = len(valid_plans(model, cluster, gbs))
        if args.exhaustive or n_valid <= EXHAUSTIVE_LIMIT:
            args.exhaustive = True
    if args.exhaustive:
        res = exhaustive(model, cluster, gbs)
    else:
        res = _run_optuna(optuna_search, model, cluster, gbs, args, objectives)
    if res.evaluated == 0:
        raise InputError(f"no layout of {model.name} ({model.layers} layers) on {cluster.num_gpus} GPUs with "
                         f"global batch {gbs} passes Megatron's rules; try a global batch that is a multiple of "
                         f"the data-parallel size, or a GPU count that divides by the pipeline depth")
    rows = [plan_row(res, r) for r in range(min(args.top, len(res.order)))]
    if args.out and res.any_fits:
        _write_plan_dir(args.out, model, cluster, best_plan(res))
    how = "exhaustive" if args.exhaustive else f"optuna {getattr(res, 'sampler', '')}".strip()
    if args.json:
        out = {"model": model.name, "cluster": cluster.name, "global_batch": gbs, "search": how,
               "evaluated": res.evaluated, "plans": rows}
        if getattr(res, "study_name", None):
            out["study_name"] = res.study_name
        if not res.any_fits:
            from planner.search import explain_no_fit

            out["no_fit"] = explain_no_fit(model, cluster, gbs, res)
        print(json.dumps(out, indent=1))
        return 0 if res.any_fits else 1
    con = console()
    con.print(ranked_table(rows, f"{model.name} on {cluster.name} ({cluster.num_gpus} x {cluster.gpu}), "
                                 f"global batch {gbs} x {model.seq_len} tokens; {res.evaluated} layouts scored ({how})"))
    if not res.any_fits:
        from planner.search import explain_no_fit

        con.print(f"[red]{explain_no_fit(model, cluster, gbs, res)}[/red]")
        return 1
    return 0


def _run_optuna(optuna_search, model, cluster, gbs, args, objectives):
    """Optuna search with a progress bar on stderr (none with --json)."""
    kw = dict(sampler=args.sampler, n_trials=args.trials, objectives=objectives, storage=args.storage,
              study_name=args.study_name, seed=args.seed, timeout_s=args.timeout, workers=args.workers)
    if args.json:
        return optuna_search(model, cluster, gbs, **kw)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.report import console

    with Progress(TextColumn("searching layouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as prog:
        task = prog.add_task("search", total=None)
        res = optuna_search(model, cluster, gbs, progress=lambda done, total: prog.update(task, completed=done,
                                                                                          total=total), **kw)
    if getattr(res, "interrupted", False):
        console(stderr=True).print("interrupted: finished trials are kept; showing the best so far")
    return res


def best_plan(res):
    """The best plan of a search result, with its uneven stage split when it has one."""
    import numpy as np

    plan = res.plan(0)
    sl = res.plans.stage_layers
    i = int(res.order[0])
    if sl is not None and not np.isnan(sl[i, 0]):
        plan = plan.model_copy(update={"layers_per_stage": tuple(int(x) for x in sl[i, : plan.pp])})
    return plan


def _write_plan_dir(out: str, model, cluster, plan) -> None:
    """Outputs of one plan; the figure is drawn first so that a failure leaves nothing behind."""
    from costmodel.estimate import estimate
    from planner.outputs import write_outputs
    from planner.report import save_report_png

    est = estimate(model, cluster, plan)
    fd, tmp_png = tempfile.mkstemp(suffix=".png")
    os.close(fd)
    try:
        save_report_png(tmp_png, est, f"{model.name} on {cluster.name}: tp{plan.tp} pp{plan.pp} vpp{plan.vpp} "
                                      f"dp{plan.dp} cp{plan.cp} ep{plan.ep}", plan.num_microbatches)
        write_outputs(out, model, cluster, plan, est)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_png, 0o666 & ~umask)
        os.replace(tmp_png, Path(out) / "report.png")
    finally:
        Path(tmp_png).unlink(missing_ok=True)


def cmd_check(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="plan check", description="Predict and check one layout.")
    _common(ap)
    for deg in ("tp", "pp", "vpp", "dp", "cp", "ep", "etp"):
        ap.add_argument(f"--{deg}", type=int, default=None if deg == "dp" else 1)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--recompute", choices=("none", "selective", "full"), default="selective")
    ap.add_argument("--recompute-layers", type=int, default=None)
    ap.add_argument("--no-sequence-parallel", action="store_true")
    ap.add_argument("--no-distributed-optimizer", action="store_true")
    args = ap.parse_args(argv)
    from costmodel.estimate import estimate
    from costmodel.rules import check_plan
    from costmodel.specs import ParallelPlan
    from planner.report import console, estimate_table
    from planner.space import default_global_batch

    model, cluster = _model_cluster(args)
    dp = args.dp or max(1, cluster.num_gpus // (args.tp * args.pp * args.cp))
    gbs = args.global_batch or default_global_batch(model, cluster.num_gpus)
    plan = ParallelPlan(tp=args.tp, pp=args.pp, vpp=args.vpp, dp=dp, cp=args.cp, ep=args.ep, etp=args.etp,
                        sequence_parallel=not args.no_sequence_parallel, micro_batch=args.micro_batch,
                        global_batch=gbs, recompute=args.recompute, recompute_layers=args.recompute_layers,
                        distributed_optimizer=not args.no_distributed_optimizer,
                        zero_stage=0 if args.no_distributed_optimizer else 1)
    check_plan(model, plan, cluster.num_gpus)
    est = estimate(model, cluster, plan)
    from costmodel.comm import group_links

    from planner.check import diagnose, format_findings

    links = group_links(cluster, plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp)
    findings = diagnose(model, cluster, plan)
    if args.json:
        print(json.dumps({"plan": plan.model_dump(), "estimate": est.model_dump(), "groups": links,
                          "findings": [f.model_dump() for f in findings]}, indent=1))
        return 0
    con = console()
    con.print(estimate_table(est, f"{model.name} on {cluster.name}: tp{plan.tp} pp{plan.pp} vpp{plan.vpp} "
                                  f"dp{plan.dp} cp{plan.cp} ep{plan.ep}, mbs {plan.micro_batch}, {plan.recompute}"))
    for name, info in links.items():
        con.print(f"{name} group {info['ranks']}: crosses {', '.join(info['links'])} (up to {info['max_hops']} hops)")
    for f, line in zip(findings, format_findings(findings)):
        colour = "yellow" if f.severity == "warn" else "cyan"
        con.print(f"[{colour}]{f.severity}[/{colour}]: {line}")
    if not findings:
        con.print("no findings: every checked figure is in its healthy range")
    return 0


def cmd_validate(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="plan validate",
                                 description="Predict every scored row of a published-runs CSV.")
    ap.add_argument("csv", help="CSV with the columns of data/validation/published_runs.csv")
    ap.add_argument("--json", metavar="OUT", help="write rows and summary as JSON to OUT")
    ap.add_argument("--cross-validate", action="store_true",
                    help="also refit the profiles without each source in turn and predict it")
    args = ap.parse_args(argv)
    from planner.report import console, validation_tables
    from costmodel.validate import cross_validate, validate

    result = validate(args.csv)
    con = console()
    for t in validation_tables(result["summary"]):
        con.print(t)
    if args.cross_validate:
        from rich.progress import Progress

        sources = sorted({r["source_id"] for r in result["rows"]})
        with Progress(console=console(stderr=True), transient=True) as prog:
            task = prog.add_task("leave-one-source-out folds", total=len(sources))
            cv = cross_validate(args.csv, progress=lambda _: prog.advance(task))
        result["cross_validation"] = cv
        from rich.table import Table

        t = Table(title="Leave-one-source-out (profiles refitted without the source)", header_style="bold")
        for col in ("left out", "rows", "MAPE %", "median %", "p90 %"):
            t.add_column(col, justify="left" if col == "left out" else "right")
        for f in cv["folds"]:
            t.add_row(f["left_out"], str(f["count"]), f"{f['mape']:.1f}", f"{f['median_ape']:.1f}", f"{f['p90_ape']:.1f}")
        o = cv["summary"]["overall"]
        t.add_row("all folds", str(o["count"]), f"{o['mape']:.1f}", f"{o['median_ape']:.1f}", f"{o['p90_ape']:.1f}",
                  style="bold")
        con.print(t)
    if args.json:
        rows = [{k: r.get(k) for k in ("row", "source_id", "gpu_type", "predicted_step_time_s",
                                        "published_step_time_s", "predicted_peak_memory_bytes", "fits", "error",
                                        "assumed")} for r in result["rows"]]
        out = {"rows": rows, "summary": result["summary"]}
        if "cross_validation" in result:
            out["cross_validation"] = result["cross_validation"]
        _write_json_atomic(args.json, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "check":
            return cmd_check(argv[1:])
        if argv and argv[0] == "validate":
            return cmd_validate(argv[1:])
        return cmd_search(argv)
    except InputError as exc:
        print(f"plan: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"]) or exc.title
        print(f"plan: error: {exc.title} field '{loc}': {e['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
