"""The ``plan`` command: parse arguments, build the request, call, print. Nothing else lives here: the defaults
are planner/request.py's, the console and progress bar planner/terminal.py's, the files planner/outputs.py's.

    plan --model 70b --cluster h100x512.yaml         search layouts, print the ranked table
    plan check --model 70b --cluster ... --tp 8 ...  predict one layout and check it against every rule
    plan validate PATH.csv [--json OUT]              score the cost model against published runs
    plan capacity --model 70b --tokens 15T --cluster h100x512.yaml [--deadline 30d | --budget $10M]
    plan whatif --model 70b --cluster h100x512.yaml --vary gpus=256,512,1024 [--vary gpu=H100,B200]
    plan profile --out hardware_profiles/NAME.yaml [--world-size 4] [--quick]   measure this machine
    plan profile --import-nccl-tests LOG... (--into P.yaml | --out P.yaml [--base H100])
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from pydantic import ValidationError

from costmodel.profiles import InputError, gpu_label
from costmodel.specs import INT64_MAX

SUBCOMMANDS = ("check", "validate", "capacity", "whatif", "profile", "run", "calibrate", "autotune", "models")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as the project's one-line input errors (exit 2, no usage block)."""

    def error(self, message: str):
        raise InputError(f"{self.prog}: {message} (see {self.prog} --help)")


def _number(kind, lo, *, strict_lo: bool = False, hi=None):
    """An argparse type: a finite number of ``kind`` >= lo (> lo with strict_lo), <= hi."""
    hi = INT64_MAX if kind is int and hi is None else hi
    what = ("an integer" if kind is int else "a number") + (f" > {lo:g}" if strict_lo else f" >= {lo:g}")

    def parse(text: str):
        try:
            v = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v != v or v in (float("inf"), float("-inf")) or v < lo or (strict_lo and v == lo):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"expected {what} and <= {hi}, got {text!r}")
        return v
    parse.__name__ = kind.__name__
    return parse


_count = _number(int, 1)
_count0 = _number(int, 0)
_positive = _number(float, 0, strict_lo=True)
_rate = _number(float, 0)
_share = _number(float, 0, hi=1)


def _named(model) -> str:
    """The model's name for a title, saying LoRA when the step trains adapters only and Muon when it steps with
    Muon."""
    said = [w for w, on in (("LoRA", model.finetune == "lora"), ("Muon", model.optimizer == "muon")) if on]
    return f"{model.name} ({', '.join(said)})" if said else model.name


def _unexpressed_line(model) -> str | None:
    """The facts of the model no ModelSpec field holds (a catalog entry's or a config.json's), which every
    estimate leaves out; None when there are none."""
    if not model.unexpressed:
        return None
    return f"not in the cost model for {model.name} (priced without them): {'; '.join(model.unexpressed)}"


def _check_file_target(path: str | None) -> None:
    """Fail at once, before any long work, when ``path`` (--json OUT, --plot PNG) could not be written."""
    if path:
        from costmodel.files import check_target

        check_target(Path(path).parent, (Path(path).name,))


def _request(cls, args, **given):
    """A planner.request request from the parsed flags: each field from the flag of the same dest, where the
    command has that flag."""
    from dataclasses import fields

    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.name not in given and hasattr(args, f.name)},
               **given)


def _profile_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--profile", dest="profile_file", metavar="FILE", default=None,
                    help="calibrated profile YAML (as `plan calibrate --out` writes it): replaces the shipped "
                         "profile of its GPU type")


def _model_flags(ap: argparse.ArgumentParser, then=lambda ap: None) -> None:
    """The flags naming the model, shared by every planning command (``then`` adds the command's own flags
    after --model, where --help lists them)."""
    ap.add_argument("--model", required=True, help="catalog name (e.g. 70b, 405b, deepseek-v3) or a HF config.json")
    then(ap)
    ap.add_argument("--seq-len", type=_count, default=None, help="sequence length (default: the model's)")
    ap.add_argument("--precision", default=None, help="bf16, fp8, mxfp8, nvfp4 (default: the model's)")
    ap.add_argument("--finetune", default="full", help="full (pretraining, SFT: every weight trains) or lora "
                    "(adapters on frozen weights: no weight gradients, gradient reduction or optimizer state)")
    ap.add_argument("--optimizer", default="adam", help="adam, or muon (megatron-core's Muon: Newton-Schulz-"
                    "orthogonalised momentum on the weight matrices, one fp32 moment; --optimizer dist_muon with the "
                    "distributed optimizer)")
    ap.add_argument("--moe-token-drop", action="store_true",
                    help="MoE layers drop tokens over an expert capacity and pad to it (megatron-core "
                         "--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): static shapes, so "
                         "no per-layer host sync (default: dropless)")
    ap.add_argument("--global-batch", type=_count, default=None, help="sequences per step (default: ~4M tokens)")


def _json_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _common(p: argparse.ArgumentParser) -> None:
    _model_flags(p, lambda ap: ap.add_argument("--cluster", required=True,
                                               help="cluster YAML (a path or a file in hardware_profiles/clusters/)"))
    _json_flag(p)


def _search_parser() -> _Parser:
    ap = _Parser(prog="plan", description="Search parallel layouts for a model on a cluster.")
    _common(ap)
    ap.add_argument("--top", type=_count, default=10, help="plans to show")
    ap.add_argument("--exhaustive", action="store_true", help="score every valid layout instead of searching")
    ap.add_argument("--sampler", choices=("tpe", "cmaes", "nsga2"), default=None,
                    help="Optuna sampler (default tpe; nsga2 for several objectives)")
    ap.add_argument("--objectives", default="time", help="comma list of time, memory, gpus (Pareto front)")
    ap.add_argument("--trials", type=_count, default=None, help="finished Optuna trials the study should have "
                    "(default 10%% of the layouts, >= 50); a resumed study runs only the rest")
    ap.add_argument("--storage", default=None, help="Optuna storage URL, e.g. sqlite:///study.db or "
                    "postgresql+psycopg://user@host/db (resumable, shareable by several processes)")
    ap.add_argument("--study-name", default=None, help="study to create or resume in --storage")
    ap.add_argument("--workers", type=_count, default=1, help="processes sharing --storage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=_positive, default=None, help="stop starting trials after this many seconds")
    ap.add_argument("--rank-by", choices=("p50", "p90"), default="p50",
                    help="rank plans by the predicted step time (p50) or its P90, which prefers plans the "
                         "validated runs support (default p50)")
    ap.add_argument("--out", metavar="DIR", help="write plan.json, megatron_args.txt, launch.sh, launch.sbatch and "
                                                  "report.png for the best plan into DIR")
    ap.add_argument("--optimizer-offload", type=_share, default=0.0, metavar="F",
                    help="search only layouts that keep this share of the optimizer state in host memory, stepped by "
                         "the CPU (megatron-core --optimizer-cpu-offload --optimizer-offload-fraction F; sharded "
                         "layouts, exhaustively or with Optuna); default 0")
    _routing_args(ap, placement_default="best")
    _profile_arg(ap)
    return ap


def cmd_search(argv: list[str]) -> int:
    args = _search_parser().parse_args(argv)
    from planner.request import PlanRequest
    from planner.search import choose_strategy

    if args.out:
        from costmodel.files import check_target
        from planner.outputs import OUTPUT_FILES

        check_target(args.out, (*OUTPUT_FILES, "report.png"), create=True)
    if args.storage:
        _check_storage(args.storage)

    req = _request(PlanRequest, args)
    target = req.resolve()
    model, cluster, gbs = target.model, target.cluster, target.global_batch
    objectives = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    if args.storage and not args.study_name and args.workers > 1:
        raise InputError("--workers needs --study-name so that every process joins the same study")
    # Optuna is used when asked for (sampler, several objectives, storage) or when the space is large
    # (planner.search.choose_strategy).
    wants_optuna = bool(args.sampler or args.storage or args.trials or objectives != ("time",))
    routing = req.load_routing(model)
    if (routing is not None or cluster.device_groups) and wants_optuna:
        raise InputError("--routing and clusters with device_groups are searched exhaustively; drop --sampler, "
                         "--storage, --trials and --objectives")
    if cluster.device_groups:
        return _search_hetero(args, model, cluster, gbs, routing)
    if routing is not None:
        return _search_routed(args, model, cluster, gbs, routing)
    strategy = choose_strategy(model, cluster, gbs, exhaustive_only=args.exhaustive, sample=wants_optuna,
                               space_kw=_space_kw(args))
    args.exhaustive = strategy.name == "exhaustive"
    if args.exhaustive:
        res = strategy.search(model, cluster, gbs, rank_by=args.rank_by)
    else:
        res = _run_optuna(strategy.search, model, cluster, gbs, args, objectives)
    return _print_search(args, model, cluster, gbs, res)


def _print_search(args, model, cluster, gbs: int, res) -> int:
    """The ranked plans of a homogeneous search (a table, or JSON with --json); --out written for the best."""
    from planner.report import best_supported, plan_row, ranked_table
    from planner.terminal import console

    if res.evaluated == 0:
        raise InputError(f"no layout of {model.name} ({model.layers} layers) on {cluster.num_gpus} GPUs with "
                         f"global batch {gbs} passes Megatron's rules; try a global batch that is a multiple of "
                         f"the data-parallel size, or a GPU count that divides by the pipeline depth")
    rows = [plan_row(res, r) for r in range(min(args.top, len(res.order)))]
    if args.out and res.any_fits:
        _write_plan_dir(args.out, model, cluster, res.split_plan(0))
    how = "exhaustive" if args.exhaustive else f"optuna {getattr(res, 'sampler', '')}".strip()
    alt = best_supported(res) if res.any_fits else None
    scope = _calibration_scope(cluster, model)
    if args.json:
        out = {"model": model.name, "cluster": cluster.name, "global_batch": gbs, "search": how,
               "rank_by": args.rank_by, "evaluated": res.evaluated, "plans": rows}
        if alt is not None:
            out["best_supported"] = alt
        if scope is not None:
            out["calibration"] = scope
        if model.unexpressed:
            out["unexpressed"] = list(model.unexpressed)
        if getattr(res, "study_name", None):
            out["study_name"] = res.study_name
        if hasattr(res, "interrupted"):
            out["interrupted"] = bool(res.interrupted)
            out["trials"] = {"this_run": res.n_trials, "in_study": res.total_trials}
        if not res.any_fits:
            from planner.search import explain_no_fit

            out["no_fit"] = explain_no_fit(model, cluster, gbs, res, **_space_kw(args))
        print(json.dumps(out, indent=1))
        return 0 if res.any_fits else 1
    con = console()
    con.print(ranked_table(rows, f"{_named(model)} on {cluster.name} ({cluster.num_gpus} x {gpu_label(cluster.gpu)}), "
                                 f"global batch {gbs} x {model.seq_len} tokens; {res.evaluated} layouts scored ({how}"
                                 f"{', ranked by P90' if args.rank_by == 'p90' else ''})"))
    if alt is not None:
        con.print(alt["message"])
    for line in (scope, _unexpressed_line(model)):
        if line is not None:
            con.print(line, markup=False, highlight=False)
    if not res.any_fits:
        from planner.search import explain_no_fit

        con.print(f"[red]{explain_no_fit(model, cluster, gbs, res, **_space_kw(args))}[/red]")
        return 1
    return 0


def _space_kw(args) -> dict:
    """The candidate-space keywords a search's flags set (planner.space.candidate_columns)."""
    f = getattr(args, "optimizer_offload", 0.0)
    return {"optimizer_offload": f} if f else {}


def _check_storage(url: str) -> None:
    """A one-line error for an Optuna storage URL SQLAlchemy cannot open: a malformed URL, an unknown
    dialect or a missing driver, an SQLite file in a directory that does not exist."""
    if url.startswith(("redis://", "journal:")):
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except NoSuchModuleError:
        raise InputError(f"--storage {url}: SQLAlchemy has no dialect {parsed.drivername!r}; valid: sqlite:///PATH, "
                         f"postgresql://..., mysql://...") from None
    except ArgumentError:
        raise InputError(f"--storage {url}: not a database URL; valid: sqlite:///study.db, "
                         f"postgresql://user@host/db, mysql://user@host/db") from None
    except ImportError as exc:
        raise InputError(f"--storage {url}: the database driver is not installed ({exc})") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        where = Path(parsed.database).expanduser().parent
        if not where.is_dir():
            raise InputError(f"--storage {url}: directory {where} does not exist")
        if Path(parsed.database).is_dir():
            raise InputError(f"--storage {url}: {parsed.database} is a directory, not an SQLite file")


def _run_optuna(optuna_search, model, cluster, gbs, args, objectives):
    """Optuna search with a progress bar on stderr (none with --json)."""
    kw = dict(sampler=args.sampler, n_trials=args.trials, objectives=objectives, storage=args.storage,
              study_name=args.study_name, seed=args.seed, timeout_s=args.timeout, workers=args.workers,
              rank_by=args.rank_by)
    from planner.terminal import console, progress_bar

    with progress_bar("searching layouts", quiet=args.json) as bar:
        res = optuna_search(model, cluster, gbs, progress=bar and bar.count, **kw)
    if getattr(res, "interrupted", False) and args.json:
        print("plan: interrupted: finished trials are kept; showing the best so far", file=sys.stderr)
    elif getattr(res, "interrupted", False):
        console(stderr=True).print("interrupted: finished trials are kept; showing the best so far")
    return res


def _write_plan_dir(out: str, model, cluster, plan, est=None, extra: dict | None = None) -> None:
    """Outputs of one plan, report.png with them (every file through costmodel.files.write_files_atomic)."""
    from costmodel.estimate import estimate
    from costmodel.trust import plan_trust
    from planner.outputs import write_outputs
    from planner.report import save_report_png

    est = est or estimate(model, cluster, plan)
    trust = plan_trust(model, cluster, plan, est.step_time_s)
    title = f"{_named(model)} on {cluster.name}: tp{plan.tp} pp{plan.pp} vpp{plan.vpp} dp{plan.dp} cp{plan.cp} ep{plan.ep}"
    write_outputs(out, model, cluster, plan, est, extra={**trust, **(extra or {})},
                  figures={"report.png": lambda path: save_report_png(path, est, title, plan.num_microbatches,
                                                                      trust=trust)})


def _check_parser() -> _Parser:
    ap = _Parser(prog="plan check", description="Predict and check one layout.")
    _common(ap)
    for deg in ("tp", "pp", "vpp", "dp", "cp", "ep", "etp"):
        ap.add_argument(f"--{deg}", type=_count, default=None if deg == "dp" else 1)
    ap.add_argument("--micro-batch", type=_count, default=1)
    ap.add_argument("--recompute", choices=("none", "selective", "full", "offload"), default=None,
                    help="activation memory: none, selective or full recomputation, or offload to host memory "
                         "(megatron-core --cpu-offloading: pp 1, no recomputation); default selective where "
                         "megatron-core runs it as priced (MoE models, GPUs without Transformer Engine), else none")
    ap.add_argument("--recompute-layers", type=_count0, default=None,
                    help="full recompute: layers per stage recomputed (default all); offload: layers offloaded "
                         "(default all but the last)")
    ap.add_argument("--no-sequence-parallel", action="store_true")
    ap.add_argument("--no-distributed-optimizer", action="store_true")
    ap.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                    help="data-parallel sharding: 1 distributed optimizer (default), 2/3 Megatron-FSDP optim_grads / "
                         "optim_grads_params (3 = FSDP, pp 1), 0 none (= --no-distributed-optimizer)")
    ap.add_argument("--dist-opt-instances", type=_count, default=1, metavar="R",
                    help="replicas of the sharded state (megatron-core --num-distributed-optimizer-instances; with "
                         "--zero-stage 3 HSDP): shard over dp x cp / R neighbouring ranks, all-reduce over R (default 1)")
    ap.add_argument("--optimizer-offload", type=_share, default=0.0, metavar="F",
                    help="share of the optimizer state kept in host memory and stepped by the CPU (megatron-core "
                         "--optimizer-cpu-offload --optimizer-offload-fraction F; needs --zero-stage 1-3); default 0")
    ap.add_argument("--moe-a2a-overlap", action="store_true",
                    help="overlap each MoE layer's all-to-all with another micro-batch's compute (megatron-core "
                         "--overlap-moe-expert-parallel-comm: ep > 1, vpp > 1 when pp > 1, no full recompute)")
    ap.add_argument("--group", help="with a cluster of device groups: check the layout on this group alone")
    split = ap.add_mutually_exclusive_group()
    split.add_argument("--layers-per-stage", metavar="N,N,...",
                       help="decoder layers on each pipeline rank, e.g. 7,8,...,8,7 (pp counts summing to the "
                            "model's layers; for a pp that does not divide them)")
    split.add_argument("--pipeline-layout", metavar="LAYOUT",
                       help="Megatron's --pipeline-model-parallel-layout string, e.g. 'Et*3|(tt|)*29,m|L' "
                            "(pp x vpp stages; vpp follows from it)")
    _routing_args(ap, placement_default="contiguous")
    _profile_arg(ap)
    return ap


def _calibration_scope(cluster, model) -> str | None:
    """How a calibrated --profile applies to the model (HardwareProfile.calibration_scope); None for shipped
    profiles and mixed clusters."""
    if cluster.device_groups:
        return None
    from costmodel.profiles import load_profile

    return load_profile(cluster.gpu).calibration_scope(model)


def cmd_check(argv: list[str]) -> int:
    args = _check_parser().parse_args(argv)
    from costmodel.comm import group_links
    from costmodel.trust import plan_trust
    from planner.check import diagnose, predict
    from planner.request import CheckRequest

    t = _request(CheckRequest, args).resolve()
    plan, load = t.plan, t.load
    est = predict(t.model, t.cluster, plan, load)
    links = group_links(t.cluster, plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp)
    findings = diagnose(t.model, t.cluster, plan, routing=t.routing,
                        placement=load.placement if load else "contiguous", load=load, est=est)
    trust = plan_trust(t.model, t.cluster, plan, est.step_time_s)
    scope = _calibration_scope(t.cluster, t.model)
    if args.json:
        out = {"plan": plan.model_dump(), "estimate": est.model_dump(), "trust": trust, "groups": links,
               "findings": [f.model_dump() for f in findings]}
        if t.layout is not None:
            out["pipeline_layout"] = t.layout
        if load is not None:
            out["routing"] = {**t.routing.summary(), "load": load.summary()}
        if scope is not None:
            out["calibration"] = scope
        if t.model.unexpressed:
            out["unexpressed"] = list(t.model.unexpressed)
        print(json.dumps(out, indent=1))
        return 0 if est.fits else 1
    _print_check(t, est, links, findings, trust)
    from planner.terminal import console

    for line in (scope, _unexpressed_line(t.model)):
        if line is not None:
            console().print(line, markup=False, highlight=False)
    return 0 if est.fits else 1


def _print_check(t, est, links: dict, findings: list, trust: dict) -> None:
    """plan check's tables and lines: the estimate, the split, the groups' links, the findings."""
    from planner.check import format_findings
    from planner.report import estimate_table, zero_label
    from planner.terminal import console

    model, cluster, plan = t.model, t.cluster, t.plan
    con = console()
    con.print(estimate_table(est, f"{_named(model)} on {cluster.name}: tp{plan.tp} pp{plan.pp} vpp{plan.vpp} "
                                  f"dp{plan.dp} cp{plan.cp} ep{plan.ep}, mbs {plan.micro_batch}, {plan.recompute}, "
                                  f"{zero_label(plan.zero_stage)}" + (
                                      f", {plan.dist_opt_instances} replicas of {plan.shard_group}"
                                      f"-rank shards" if plan.dist_opt_instances > 1 else "")
                                  + (", all-to-all overlapped" if plan.moe_a2a_overlap else "")
                                  + (f", optimizer {plan.optimizer_offload:.0%} on the CPU"
                                     if plan.optimizer_offload else ""), trust))
    if t.layers_per_stage is not None:
        con.print(f"layers per pipeline rank: {','.join(str(x) for x in t.layers_per_stage)}; Megatron layout: "
                  f"{t.layout}", markup=False, highlight=False)
    for name, info in links.items():
        con.print(f"{name} group {info['ranks']}: crosses {', '.join(info['links'])} (up to {info['max_hops']} hops)")
    for f, line in zip(findings, format_findings(findings)):
        colour = "yellow" if f.severity == "warn" else "cyan"
        con.print(f"[{colour}]{f.severity}[/{colour}]: {line}")
    if not findings:
        con.print("no findings: every checked figure is in its healthy range")
    if not est.fits:
        con.print(f"[red]does not fit: peak {max(est.peak_memory_bytes) / 1e9:.1f} GB per GPU against "
                  f"{est.memory_capacity_bytes / 1e9:.1f} GB usable (exit 1)[/red]")


def _routing_args(ap: argparse.ArgumentParser, placement_default: str) -> None:
    ap.add_argument("--routing", metavar="FILE", help="MoE routing histogram (JSON/YAML, key moe_routing_histogram: "
                                                      "token counts per layer and expert; a run's summary.json or "
                                                      "its directory)")
    ap.add_argument("--placement", choices=("best", "contiguous", "lpt"), default=placement_default,
                    help=f"expert placement on the EP ranks with --routing (default {placement_default}; contiguous "
                         f"is Megatron's, lpt balances the measured load)")
    ap.add_argument("--capacity-factor", type=_positive, default=None,
                    help="MoE expert capacity factor with --routing (tokens over it are dropped)")


def _search_routed(args, model, cluster, gbs: int, routing) -> int:
    """plan --routing on a homogeneous cluster: ep, etp and placement searched under the histogram."""
    from planner.report import plan_row, ranked_table
    from planner.routing import routed_search, routing_lines
    from planner.terminal import console

    rs = routed_search(model, cluster, gbs, routing, **_space_kw(args))
    res = rs.result
    if res.evaluated == 0:
        raise InputError(f"no layout of {model.name} on {cluster.num_gpus} GPUs with global batch {gbs} passes "
                         f"Megatron's rules")
    rows = [plan_row(res, r) for r in range(min(args.top, len(res.order)))]
    for r, row in zip(range(len(rows)), rows):
        load = rs.load_of(int(res.order[r]))
        row["expert_load"] = {k: v for k, v in load.summary().items() if k != "experts_by_rank"}
    best = rs.load_of(int(res.order[0]))
    if args.out and res.any_fits:
        from costmodel.routing import estimate_one_routed

        plan = res.split_plan(0)
        _write_plan_dir(args.out, model, cluster, plan, estimate_one_routed(model, cluster, plan, best),
                        extra={"routing": {**routing.summary(), "load": best.summary()}})
    if args.json:
        print(json.dumps({"model": model.name, "cluster": cluster.name, "global_batch": gbs, "search": "exhaustive",
                          "evaluated": res.evaluated, "routing": {**routing.summary(), "load": best.summary()},
                          "plans": rows}, indent=1))
        return 0 if res.any_fits else 1
    con = console()
    con.print(ranked_table(rows, f"{_named(model)} on {cluster.name} ({cluster.num_gpus} x {gpu_label(cluster.gpu)}), "
                                 f"global batch {gbs} x {model.seq_len} tokens; {res.evaluated} layouts (with etp) "
                                 f"scored under the routing histogram"))
    for line in routing_lines(rs):
        con.print(line)
    if not res.any_fits:
        con.print("[red]no layout fits[/red]")
        return 1
    return 0


def _search_hetero(args, model, cluster, gbs: int, routing) -> int:
    """plan on a cluster with device_groups: stages placed on the groups (planner/hetero.py)."""
    from planner.hetero import comparison, hetero_search, plan_dict, write_hetero_outputs
    from planner.terminal import progress_bar

    kw = dict(top=args.top, scorer=routing.scorer() if routing else None, cost=routing.cost if routing else None,
              optimizer_offload=getattr(args, "optimizer_offload", 0.0))
    with progress_bar("placing stages on device groups", quiet=args.json) as bar:
        res = hetero_search(model, cluster, gbs, progress=bar and bar.count, **kw)
    if not res.ranked:
        raise InputError(f"no layout of {model.name} ({model.layers} layers) on the device groups of {cluster.name} "
                         f"with global batch {gbs} passes Megatron's rules; try another global batch")
    plans = [plan_dict(s) for s in res.ranked[: args.top]]
    cmp = comparison(res, model, cluster) if res.any_fits else {}
    launch = res.best_launchable()
    load = {s.plan.ep: routing.load(s.plan.ep).summary() for s in (res.ranked[0], launch) if s} if routing else {}
    if args.out:
        if launch is None:
            raise InputError(f"{args.out}: no plan that fits can run as one Megatron job; nothing written")
        write_hetero_outputs(args.out, model, cluster, launch,
                             extra={"routing": {**routing.summary(), "load": load[launch.plan.ep]}} if routing else None)
    if args.json:
        out = {"model": model.name, "cluster": cluster.name, "global_batch": gbs, "search": "heterogeneous",
               "counts": res.counts, "plans": plans, "comparison": cmp,
               "best_launchable": plan_dict(launch) if launch else None}
        if routing:
            out["routing"] = {**routing.summary(), "load_by_ep": {str(k): v for k, v in load.items()}}
        print(json.dumps(out, indent=1))
        return 0 if res.any_fits else 1
    return _print_hetero(model, cluster, gbs, routing, res, plans, cmp, launch, load)


def _print_hetero(model, cluster, gbs: int, routing, res, plans: list, cmp: dict, launch, load: dict) -> int:
    """The tables and lines of a heterogeneous search."""
    from planner.hetero import plan_dict
    from planner.report import group_table, hetero_table, stage_balance_table
    from planner.terminal import console

    con = console()
    sizes = ", ".join(f"{g.name}: {g.num_gpus} x {gpu_label(g.gpu)}" for g in cluster.device_groups)
    con.print(hetero_table(plans, f"{_named(model)} on {cluster.name} ({sizes}), global batch {gbs} x {model.seq_len} "
                                  f"tokens; {res.counts['valid']} mixed layouts, {res.counts['scored']} split and "
                                  f"scored exactly"))
    if not res.any_fits:
        con.print("[red]no layout fits in memory on these groups[/red]")
        return 1
    best = plans[0]
    con.print(stage_balance_table(best, f"stage balance of #1: {best['layout']}"))
    con.print(group_table(best["estimate"]["groups"], "device groups in #1"))
    if best["launch_issue"]:
        con.print(f"#1 is not one Megatron job: {best['launch_issue']}")
    if launch is not None and launch is not res.ranked[0]:
        con.print(f"best plan one Megatron job can run: #{res.ranked.index(launch) + 1} {plan_dict(launch)['layout']} "
                  f"({launch.est.step_time_s:.3f} s)")
    for g, v in cmp["alone"].items():
        con.print(f"{g} alone: " + (f"{v['layout']}, {v['step_time_s']:.3f} s" if v else "nothing fits"))
    if cmp["uniform"]:
        con.print(f"uniform split over all GPUs: {cmp['uniform']['layout']}, {cmp['uniform']['step_time_s']:.3f} s "
                  f"(#1 is {cmp['speedup_vs_uniform']:.2f}x faster)")
    if "slow_group_effect" in cmp:
        con.print(cmp["slow_group_effect"])
    usd = {k: v["usd_per_million_tokens"] for k, v in (("#1", cmp["best"]), *cmp["alone"].items()) if v and
           v["usd_per_million_tokens"] is not None}
    if usd:
        con.print("cost per million tokens: " + ", ".join(f"{k} ${v:.2f}" for k, v in usd.items()))
    if routing:
        ld = load[res.ranked[0].plan.ep]
        con.print(f"routing histogram {routing.path}: #1 runs ep{ld['ep']} with {ld['placement']} placement, hottest "
                  f"EP rank {ld['time_factor']:.2f}x the mean token load ({ld['memory_factor']:.2f}x for memory)")
    return 0


def cmd_validate(argv: list[str]) -> int:
    ap = _Parser(prog="plan validate",
                                 description="Predict every scored row of a published-runs CSV.")
    ap.add_argument("csv", nargs="?", help="CSV with the columns of data/validation/published_runs.csv")
    ap.add_argument("--json", metavar="OUT", nargs="?", const="-",
                    help="write rows and summary as JSON to OUT; without OUT (or with -) print the JSON on "
                         "stdout and the tables on stderr")
    ap.add_argument("--cross-validate", action="store_true",
                    help="also refit the profiles without each source, each software release and each GPU type "
                         "in turn and predict what was left out")
    ap.add_argument("--plot", metavar="PNG",
                    help="write a parity figure: predicted against published step time with each run's P10-P90 "
                         "(with --cross-validate, a second panel of the leave-one-source-out predictions)")
    _profile_arg(ap)
    args = ap.parse_args(argv)
    if args.csv is None and args.json not in (None, "-") and args.json.lower().endswith(".csv") \
            and Path(args.json).is_file():
        args.csv, args.json = args.json, "-"    # `plan validate --json RUNS.csv`: the CSV, JSON on stdout
    if args.csv is None:
        ap.error("the following arguments are required: csv")
    to_stdout = args.json == "-"
    if args.json and not to_stdout and Path(args.json).resolve() == Path(args.csv).resolve():
        raise InputError(f"--json {args.json}: that is the CSV being validated; give another file to write")
    from costmodel.validate import interval_coverage, validate
    from planner.report import validation_tables, worst_rows_table
    from planner.request import validate_profiles
    from planner.terminal import console

    _check_file_target(None if to_stdout else args.json)
    _check_file_target(args.plot)
    if args.plot and args.json and not to_stdout and Path(args.json).resolve() == Path(args.plot).resolve():
        raise InputError(f"--plot {args.plot}: the same file as --json; give two files")
    override = validate_profiles(args.profile_file)
    result = validate(args.csv, profiles=override)
    if override and not any(r["gpu_type"] in override for r in result["rows"]):
        gpus = sorted({str(r["gpu_type"]) for r in result["rows"]})
        raise InputError(f"--profile {args.profile_file}: {args.csv} has no scored row on {', '.join(override)} "
                         f"(GPU types there: {', '.join(gpus) or 'none'})")
    con = console(stderr=to_stdout)
    for t in validation_tables(result["summary"]):
        con.print(t)
    worst = worst_rows_table(result["rows"])
    if worst is not None:
        con.print(worst)
    for gpu, prof in (override or {}).items():
        con.print(f"{gpu} rows predicted with --profile {args.profile_file} ({prof.calibration.fitted_by})")
    result["interval_coverage"] = interval_coverage(result["rows"])
    con.print(_coverage_line("published step times inside their P10-P90", result["interval_coverage"]))
    no_fit = [r for r in result["rows"] if r.get("fits") is False]
    con.print(_no_fit_line(no_fit, sum(1 for r in result["rows"] if r.get("fits") is not None)), markup=False,
              highlight=False)
    for line in _unexpressed_lines(result["rows"]):
        con.print(line, markup=False, highlight=False)
    if args.cross_validate:
        result["cross_validation"] = _cross_validate(args.csv, con)
    if args.plot:
        _validation_plot(args, result)
        con.print(f"plot written to {args.plot}")
    if args.json:
        rows = [{k: r.get(k) for k in ("row", "source_id", "gpu_type", "model_name", "num_gpus", "moe",
                                        "zero_stage", "pp", "cp", "ep", "precision", "release",
                                        "predicted_step_time_s", "predicted_p10_step_time_s",
                                        "predicted_p90_step_time_s", "support_runs", "published_step_time_s",
                                        "predicted_peak_memory_bytes", "fits", "error", "assumed", "unexpressed")}
                for r in result["rows"]]
        out = {"rows": rows, "summary": result["summary"], "interval_coverage": result["interval_coverage"],
               "predicted_not_to_fit": [r["row"] for r in no_fit]}
        if override:
            out["profile"] = {gpu: args.profile_file for gpu in override}
        if "cross_validation" in result:
            out["cross_validation"] = result["cross_validation"]
        if args.plot:
            out["plot"] = args.plot
        if to_stdout:
            print(json.dumps(out, indent=1))
        else:
            from costmodel.files import write_file_atomic

            write_file_atomic(args.json, json.dumps(out, indent=1))
    return 0


def _unexpressed_lines(rows: list[dict]) -> list[str]:
    """One line per set of facts the cost model leaves out of predicted rows (the facts of their models no field
    holds: gpt-oss's attention sinks, ...), with how many rows and which models they are."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("unexpressed"):
            groups.setdefault(tuple(r["unexpressed"]), []).append(r)
    return [f"{len(rs)} row(s) of {', '.join(dict.fromkeys(str(r['model_name']) for r in rs))}: not in the cost "
            f"model (priced without them): {'; '.join(facts)}" for facts, rs in groups.items()]


def _validation_plot(args, result: dict) -> None:
    """plan validate --plot: the parity figure of the rows as predicted and, after --cross-validate, of the
    leave-one-source-out predictions."""
    from costmodel.files import write_file_atomic
    from planner.parity import save_parity_png

    shipped = "with --profile " + Path(args.profile_file).name if args.profile_file else "shipped profiles"
    panels = [(f"as predicted ({shipped})", result["rows"])]
    cv = result.get("cross_validation")
    if cv and "source" in cv["schemes"]:
        panels.append(("leave-one-source-out (profiles refitted without the run's source)",
                       cv["schemes"]["source"]["rows"]))
    write_file_atomic(args.plot, lambda p: save_parity_png(p, panels, f"plan validate {Path(args.csv).name}"))


def _no_fit_line(no_fit: list[dict], predicted: int) -> str:
    """How many predicted rows the model says would not fit their GPUs (a published run ran, so each is a miss of
    the memory model), the first few named with their predicted peak."""
    if not no_fit:
        return f"predicted to fit: all {predicted} predicted rows"
    from costmodel.validate import HOST_SHORT

    def short(r: dict) -> str:
        host = next((a for a in r.get("assumed") or [] if a.startswith(HOST_SHORT)), None)
        return host.split(",")[0] if host else f"{(r.get('predicted_peak_memory_bytes') or 0) / 1e9:.0f} GB per GPU"

    named = "; ".join(f"row {r['row']} {r['model_name']} on {r['num_gpus']} {r['gpu_type']}: {short(r)}"
                      for r in no_fit[:5])
    more = f"; and {len(no_fit) - 5} more" if len(no_fit) > 5 else ""
    return f"predicted not to fit: {len(no_fit)} of {predicted} predicted rows ({named}{more})"


def _cross_validate(csv: str, con) -> dict:
    """plan validate --cross-validate: the folds (a progress bar on stderr), their tables and coverage lines."""
    from costmodel.crossval import cross_validate
    from costmodel.validate import interval_coverage, nested_interval_coverage
    from planner.report import CV_TITLES, cross_validation_tables, one_run_source_table, one_run_table
    from planner.terminal import progress_bar

    with progress_bar("cross-validation folds") as bar:
        cv = cross_validate(csv, progress=lambda label, done, total: bar.labelled(f"cross-validation: {label}",
                                                                                  done, total))
    for t in cross_validation_tables(cv):
        con.print(t)
    if "one_run_calibration" in cv:
        con.print(one_run_table(cv["one_run_calibration"]))
        by_source = one_run_source_table(cv["one_run_calibration"])
        if by_source is not None:
            con.print(by_source)
    for scheme, res in cv["schemes"].items():
        res["interval_coverage"] = interval_coverage(res["rows"])
        res["nested_interval_coverage"] = nested_interval_coverage(csv, res["rows"])
        con.print(_coverage_line(f"{CV_TITLES.get(scheme, scheme).split(' (')[0]}: held-out step times inside "
                                 f"the shipped P10-P90", res["interval_coverage"]))
        con.print(_coverage_line("  inside P10-P90 refitted without their fold too",
                                 res["nested_interval_coverage"]))
    return cv


def _coverage_line(what: str, c: dict) -> str:
    if not c["rows"]:
        if c.get("with_interval") and not c.get("published"):
            return f"{what}: no row publishes a step time to compare"
        return f"{what}: no intervals (hardware_profiles/trust/ missing; see scripts/fit_intervals.py)"
    return (f"{what}: {c['inside']} of {c['rows']} ({100 * c['fraction']:.0f}%; {c['below_p10']} below P10, "
            f"{c['above_p90']} above P90)")


def _capacity_args(ap: argparse.ArgumentParser) -> None:
    _model_flags(ap, lambda ap: ap.add_argument("--tokens", default=None, help="tokens to train on: 15T, 300B, 2e12 "
                                                                             "(default: 20 per parameter)"))
    ap.add_argument("--compression", default="none", help="DP gradient compression: none, int8, int4 (error feedback)")
    ap.add_argument("--price-per-gpu-hour", default=None, help="$ per GPU-hour, instead of the cluster files' price")
    ap.add_argument("--failure-scale", type=_rate, default=1.0, help="multiply the default failure rates (Llama 3)")
    ap.add_argument("--failures-per-gpu-hour", type=_rate, default=None, help="GPU faults per GPU-hour")
    ap.add_argument("--failures-per-node-hour", type=_rate, default=None, help="other faults per node-hour")
    ap.add_argument("--restart", default=None, help="overhead per failure before the checkpoint load (default 10m)")
    ap.add_argument("--checkpoint-interval", default=None, help="fixed checkpoint interval, e.g. 1h (default: optimal)")
    ap.add_argument("--async-checkpoint", action="store_true", help="asynchronous checkpoint saves")
    _json_flag(ap)
    ap.add_argument("--plot", metavar="PNG", help="write the figure (time, cost, goodput, throughput, MFU, Pareto)")
    _profile_arg(ap)


def _sweep_with_progress(scenarios, assumptions, quiet: bool):
    from planner.capacity import sweep
    from planner.terminal import progress_bar

    with progress_bar("planning", len(scenarios), quiet=quiet) as bar:
        return sweep(scenarios, assumptions, progress=bar and bar.count)


def _muon_checkpoint_note(model, policy) -> str:
    """'(10 on Muon's matrices) ' where the default checkpoint size applies to a Muon model (goodput.checkpoint_bytes)."""
    from costmodel.goodput import muon_matrix_bytes

    matrix = muon_matrix_bytes(model, policy)
    return "" if matrix is None else f"({matrix:g} on Muon's matrices) "


def _capacity_output(args, kind, model, a, points, dims, series, decision, title, deadline=None, budget=None) -> int:
    from planner.capacity import pareto
    from planner.capacity_report import capacity_table, save_capacity_png
    from costmodel.files import write_file_atomic

    if args.plot:
        write_file_atomic(args.plot, lambda p: save_capacity_png(p, points, dims[0], series, title, deadline, budget,
                                                                 decision.best))
    if args.json:
        front = pareto(points)
        out = {"command": kind, "model": model.name, "tokens": a.tokens, "deadline_s": deadline, "budget_usd": budget,
               "failures": a.failures.model_dump(), "checkpoint": a.checkpoint.model_dump(),
               "points": [p.to_dict() for p in points], "met": decision.met, "message": decision.message,
               "best": points.index(decision.best) if decision.best else None,
               "closest": points.index(decision.closest) if decision.closest else None,
               "pareto": [points.index(p) for p in front]}
        if args.plot:
            out["plot"] = args.plot
        if model.unexpressed:
            out["unexpressed"] = list(model.unexpressed)
        print(json.dumps(out, indent=1))
        return 0 if decision.best else 1
    from planner.terminal import console

    con = console()
    con.print(capacity_table(points, title, dims + ([series] if series and series not in dims else []),
                             decision.best))
    colour = "green" if decision.met and decision.best else "red"
    con.print(f"[{colour}]{decision.message}[/{colour}]")
    for gpu, p in decision.smallest_by_gpu.items() if deadline or budget else ():
        if len(decision.smallest_by_gpu) > 1:
            con.print(f"  smallest {gpu} cluster meeting it: {p.gpus} GPUs, {p.wall_time_s / 86400:.1f} d")
    f, c = a.failures, a.checkpoint
    con.print(f"failures: {f.per_gpu_hour:.3g}/GPU-h + {f.per_node_hour:.3g}/node-h, restart {f.restart_overhead_s / 60:.0f} "
              f"min + checkpoint load; checkpoint {c.bytes_per_param:g} B/param "
              f"{_muon_checkpoint_note(model, c)}"
              f"{'asynchronous' if c.asynchronous else 'synchronous'}, interval "
              f"{'optimal (Daly)' if c.interval_s is None else f'{c.interval_s:.0f} s'}")
    line = _unexpressed_line(model)
    if line is not None:
        con.print(line, markup=False, highlight=False)
    if args.plot:
        con.print(f"plot written to {args.plot}")
    return 0 if decision.best else 1


def cmd_capacity(argv: list[str]) -> int:
    ap = _Parser(prog="plan capacity", description="Time, cost and goodput to train a model; "
                                 "with --deadline or --budget, the cluster size and GPU type that meet it.")
    _capacity_args(ap)
    ap.add_argument("--cluster", required=True, nargs="+", help="cluster YAML(s); several = several GPU types")
    ap.add_argument("--deadline", default=None, help="wall-time target, e.g. 30d, 12h")
    ap.add_argument("--budget", default=None, help="cost ceiling, e.g. $10M, 800k")
    ap.add_argument("--gpus", default=None, help="GPU counts to try, e.g. 256,512,1024 (default with a target: "
                                                 "powers of two of whole nodes up to 16,384)")
    ap.add_argument("--min-gpus", type=_count, default=None)
    ap.add_argument("--max-gpus", type=_count, default=None)
    args = ap.parse_args(argv)
    from costmodel.profiles import load_cluster
    from planner.capacity import (REFINE_STEPS, Scenario, capacity_scenarios, decide, parse_duration, parse_money,
                                  parse_vary, refine_sizes)
    from planner.request import CapacityRequest, scenarios_with_profile

    model, comp, a = _request(CapacityRequest, args).resolve()
    _check_file_target(args.plot)
    if len(set(args.cluster)) != len(args.cluster):
        raise InputError(f"--cluster: a file is given twice ({' '.join(args.cluster)})")
    clusters = [load_cluster(c) for c in args.cluster]
    many = len(clusters) > 1
    bases = [Scenario(model, cl, args.global_batch, comp, (("cluster", cl.name),) if many else (), src)
             for cl, src in zip(clusters, args.cluster)]
    # An empty value ('--budget ""', a script's unset variable) is an error, not an option left out.
    deadline = parse_duration(args.deadline) if args.deadline is not None else None
    budget = parse_money(args.budget) if args.budget is not None else None
    if args.gpus is not None and not args.gpus.strip():
        raise InputError("--gpus '': expected GPU counts such as 256,512,1024")
    gpus = parse_vary(f"gpus={args.gpus}")[1] if args.gpus is not None else None
    searching = bool(deadline or budget or args.min_gpus or args.max_gpus)
    points = _sweep_with_progress(scenarios_with_profile(capacity_scenarios(bases, gpus, args.min_gpus, args.max_gpus,
                                                                            searching), args.profile_file),
                                  a, args.json)
    for _ in range(REFINE_STEPS if searching and not gpus else 0):
        extra = refine_sizes(points, deadline, budget)
        if extra:
            points += _sweep_with_progress(extra, a, args.json)
    points.sort(key=lambda p: (args.cluster.index(p.scenario.source), p.gpus))
    decision = decide(points, deadline, budget)
    title = (f"{_named(model)} on {a.tokens / 1e12:g}T tokens" + ("" if args.tokens else " (20 per parameter)")
             + f", seq {model.seq_len}, {model.precision}" + (f", {comp.name} DP compression" if comp else "")
             + (f", global batch {args.global_batch}" if args.global_batch else ""))
    return _capacity_output(args, "capacity", model, a, points, ["gpus"], "cluster" if many else None, decision,
                            title, deadline, budget)


def cmd_whatif(argv: list[str]) -> int:
    ap = _Parser(prog="plan whatif",
                 description="Re-plan a model on a cluster while one or two quantities vary: gpus, gpu, bandwidth, "
                             "oversubscription, seq_len, global_batch, precision, compression, finetune, optimizer, "
                             "optimizer_offload.")
    _capacity_args(ap)
    ap.add_argument("--cluster", required=True, help="cluster YAML (a path or a file in hardware_profiles/clusters/)")
    ap.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="quantity to sweep (first: x axis; a second one: one line per value)")
    args = ap.parse_args(argv)
    from costmodel.profiles import load_cluster
    from planner.capacity import Scenario, decide, parse_vary, whatif_scenarios
    from planner.request import CapacityRequest, scenarios_with_profile

    model, comp, a = _request(CapacityRequest, args).resolve()
    _check_file_target(args.plot)
    if len(args.vary) > 2:
        raise InputError(f"--vary given {len(args.vary)} times: at most two quantities (x axis and series)")
    cluster = load_cluster(args.cluster)
    dims = [parse_vary(v) for v in args.vary]
    scenarios = whatif_scenarios(Scenario(model, cluster, args.global_batch, comp, (), args.cluster), dims)
    points = _sweep_with_progress(scenarios_with_profile(scenarios, args.profile_file), a, args.json)
    decision = decide(points)
    names = [d for d, _ in dims]
    title = (f"what if: {_named(model)} on {a.tokens / 1e12:g}T tokens, {cluster.name} varied by {' x '.join(names)}")
    return _capacity_output(args, "whatif", model, a, points, names[:1], names[1] if len(names) > 1 else None,
                            decision, title)


def cmd_profile(argv: list[str]) -> int:
    ap = _Parser(prog="plan profile", description="Measure this machine (GEMMs, memory bandwidth, "
                                 "collectives) into a hardware profile and a one-node cluster, or import nccl-tests logs.")
    ap.add_argument("--out", help="profile YAML to write, e.g. hardware_profiles/NAME.yaml")
    ap.add_argument("--cluster-out", help="one-node cluster YAML to write (default: OUT-cluster.yaml beside the profile)")
    ap.add_argument("--name", help="profile name (default: the file stem of --out)")
    ap.add_argument("--world-size", type=_count, default=None, help="worker processes (default: the GPUs, else 2)")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl with CUDA, else gloo")
    ap.add_argument("--threads", type=_count, default=None,
                    help="torch threads per CPU process (default: $PLAN_EXECUTOR_THREADS or 1, as the executor trains)")
    ap.add_argument("--quick", action="store_true", help="a few shapes and sizes (smoke checks, tests)")
    ap.add_argument("--timeout", type=_positive, default=900.0, help="fail after this many seconds (default 900)")
    ap.add_argument("--import-nccl-tests", nargs="+", metavar="LOG", help="nccl-tests output to take the busbw curves from")
    ap.add_argument("--into", metavar="P.yaml", help="add the imported curves to this existing profile")
    ap.add_argument("--base", metavar="PROFILE", help="with --import-nccl-tests --out: copy this profile's other numbers "
                                                     "instead of measuring them; without logs: measure GEMMs and "
                                                     "memory here and take the collective curves from it (one rank, "
                                                     "e.g. --world-size 1 on a one-GPU machine)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if bool(args.out) == bool(args.into):
        raise InputError("plan profile needs exactly one of --out NEW.yaml or --into EXISTING.yaml")
    if args.into and not args.import_nccl_tests:
        raise InputError("--into takes its curves from --import-nccl-tests LOG...")
    if args.cluster_out and (args.into or (args.base and args.import_nccl_tests)):
        raise InputError("--cluster-out goes with a measurement (--out without --into, or --base without logs)")
    import shlex

    from executor import profile_build as pb
    from executor.profile import ProfileError, default_config
    from executor.profile_report import headline, summary, tables
    from planner.terminal import console

    command = "plan profile " + shlex.join(argv)
    if args.into:
        result = pb.import_into(Path(args.into), args.import_nccl_tests, command)
    elif args.base and args.import_nccl_tests:
        result = pb.import_with_base(Path(args.out), args.base, args.import_nccl_tests, args.name or Path(args.out).stem,
                                     command)
    else:
        if args.base:
            pb.base_collectives(args.base)   # an unknown base fails here, before the progress bar
        _need_executor("profile", ("torch",))
        cfg = default_config(args.world_size, args.quick, args.backend, args.threads,
                             collectives=not (args.import_nccl_tests or args.base), timeout_s=args.timeout)
        try:
            result = _with_steps(lambda progress: pb.measure_profile(
                Path(args.out), Path(args.cluster_out) if args.cluster_out else None, cfg,
                args.name or Path(args.out).stem, command, args.import_nccl_tests, progress, base=args.base),
                cfg.steps, f"starting {cfg.world_size} {cfg.backend} workers", args.json)
        except ProfileError as exc:
            print(f"plan profile: error: {exc}", file=sys.stderr)
            return 1
    s = summary(result)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    con = console()
    for t in tables(s):
        con.print(t)
    con.print(headline(s))
    return 0


def _need_executor(command: str, modules: tuple[str, ...] = ("torch", "megatron.core")) -> None:
    """The executor's commands need the executor extra; without it, one line saying what to install."""
    from importlib.util import find_spec

    missing = []
    for name in modules:
        try:
            found = find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name.split(".")[0].replace("megatron", "megatron-core"))
    if missing:
        raise InputError(f"plan {command} needs the executor extra ({' and '.join(missing)} not installed): "
                         f'pip install -e ".[executor]"')


def _with_steps(run, total: int, first: str, quiet: bool):
    """run(progress) with a rich progress bar on stderr that advances on each progress(message)."""
    from planner.terminal import progress_bar

    with progress_bar(first, total, quiet=quiet) as bar:
        return run(bar and bar.step)


def _train_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                    help="training dtype (default: the model's precision; fp8 recipes train in bf16)")
    ap.add_argument("--data", default=None, help="tokens (.npy or raw uint16 .bin); default: a synthetic learnable task")


def cmd_run(argv: list[str]) -> int:
    ap = _Parser(prog="plan run", description="Train with a plan on megatron-core (torchrun on this "
                                 "machine: one process per GPU, or per rank on CPU with gloo) and record every step.")
    ap.add_argument("plan", help="plan.json written by `plan --out DIR`")
    ap.add_argument("--run-dir", required=True, help="metrics.jsonl, summary.json, checkpoints/ and launch.log go here")
    ap.add_argument("--steps", type=_count0, default=20)
    ap.add_argument("--checkpoint-every", type=_count0, default=0, help="save every N steps; a rerun resumes from the last")
    ap.add_argument("--timeout", type=_positive, default=None, help="stop the workers after this many seconds")
    ap.add_argument("--json", action="store_true")
    _train_args(ap)
    args = ap.parse_args(argv)
    from executor.launch import LaunchError, launch, read_plan

    read_plan(args.plan)   # a bad plan file is the first thing to say, with or without torch
    _need_executor("run")

    try:
        res = launch(args.plan, args.run_dir, steps=args.steps, dtype=args.dtype, data=args.data,
                     checkpoint_every=args.checkpoint_every, timeout_s=args.timeout)
    except LaunchError as e:
        print(f"plan run: failed: {e}", file=sys.stderr)
        return 1
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    s = res.summary
    if args.json:
        print(json.dumps({k: v for k, v in s.items() if k not in ("model", "plan", "cluster")}, indent=1))
    else:
        print(f"{s['steps']} steps on {s['device']}: {s['step_time_s'] * 1e3:.1f} ms/step (median after the first), "
              f"{s['tokens_per_s']:.0f} tokens/s, loss {s['first_loss']:.4f} -> {s['final_loss']:.4f}, "
              f"peak memory {s['peak_memory_bytes'] / 2**20:.0f} MiB; {args.run_dir}/metrics.jsonl")
    return 0


def cmd_calibrate(argv: list[str]) -> int:
    ap = _Parser(prog="plan calibrate", description="Fit a hardware profile's efficiency factors "
                                 "to measured runs and write a calibrated copy (use it with --profile FILE): one "
                                 "factor from one run, more from more.")
    ap.add_argument("--measurements", nargs="+", required=True,
                    help="executor run directories (or their metrics.jsonl), CSVs in the schema of "
                         "data/validation/published_runs.csv, or Megatron-LM / Megatron-Bridge / NeMo training logs")
    ap.add_argument("--profile", required=True, help="profile YAML (or a shipped GPU name) to calibrate")
    ap.add_argument("--out", required=True, help="calibrated profile YAML to write")
    ap.add_argument("--cluster", default=None, help="cluster the runs ran on (default: the one in each run's plan; "
                                                   "for a log, the profile's GPU in nodes of 8)")
    ap.add_argument("--gpu", default=None, help="GPU type of the logged runs when the log does not name it "
                                               "(default: the profile's)")
    ap.add_argument("--warmup-iterations", type=int, default=3,
                    help="first iterations of a log left out of the median (default 3)")
    ap.add_argument("--factors", default=None, help="comma list of factors to fit (default: as many as the runs "
                                                   "determine)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from costmodel.fit import FACTORS
    from executor.calibrate import run_calibrate

    factors = [f.strip() for f in args.factors.split(",") if f.strip()] if args.factors else None
    bad = [f for f in factors or [] if f not in FACTORS]
    if bad:
        raise InputError(f"--factors {bad[0]}: unknown factor; valid: {', '.join(FACTORS)}")
    if args.warmup_iterations < 0:
        raise InputError(f"--warmup-iterations {args.warmup_iterations}: expected 0 or more")
    report = run_calibrate(args.measurements, args.profile, args.out, cluster_path=args.cluster, factors=factors,
                           gpu=args.gpu, warmup_iterations=args.warmup_iterations)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    from executor.report import calibration_table
    from planner.terminal import console

    calibration_table(report, console())
    return 0


def cmd_autotune(argv: list[str]) -> int:
    ap = _Parser(prog="plan autotune", description="Plan, run the top plans for a few steps, "
                                 "calibrate on the measurements, re-plan, and launch the best measured plan.")
    _common(ap)
    ap.add_argument("--trial-steps", type=_count, default=4, help="steps per trial run (the first is warm-up)")
    ap.add_argument("--top-k", type=_count, default=4, help="plans to try")
    ap.add_argument("--steps", type=_count0, default=20, help="steps of the full run of the winner (0: no full run)")
    ap.add_argument("--run-dir", default="runs/autotune")
    ap.add_argument("--profile", default=None, help="hardware profile to start from (default: the cluster's)")
    ap.add_argument("--trial-timeout", type=_positive, default=900.0, help="seconds before a trial is stopped and "
                                                                        "counted as failed (default 900)")
    _train_args(ap)
    args = ap.parse_args(argv)
    if args.finetune.strip().lower() != "full":
        raise InputError(f"plan autotune --finetune {args.finetune}: the executor trains every weight; valid: full "
                         f"(plan LoRA with `plan --finetune lora`)")
    if args.optimizer.strip().lower() != "adam":
        raise InputError(f"plan autotune --optimizer {args.optimizer}: the executor steps with Adam; valid: adam "
                         f"(plan Muon with `plan --optimizer muon`)")
    _need_executor("autotune")
    from costmodel.estimate import estimate_arrays
    from executor.autotune import autotune, result_json
    from executor.report import autotune_table
    from planner.terminal import console
    from planner.request import PlanRequest
    from planner.search import exhaustive

    target = _request(PlanRequest, args, start_profile=args.profile, host_batch=True).resolve()
    model, cluster, prof, gb = target.model, target.cluster, target.profile, target.global_batch
    say = (lambda msg: None) if args.json else (lambda msg: print(msg, flush=True))

    def rank_plans(profile):
        """The plans that fit under ``profile``, fastest predicted first, with their predicted step times."""
        found = exhaustive(model, cluster, gb, lambda m, c, p: estimate_arrays(m, c, p, profile=profile))
        for rank, i in enumerate(found.order):
            if not found.scores["fits"][i]:
                return
            yield found.split_plan(rank), float(found.scores["step_time_s"][i])

    res = autotune(model, cluster, global_batch=gb, rank_plans=rank_plans, run_dir=args.run_dir,
                   trial_steps=args.trial_steps, top_k=args.top_k, steps=args.steps, dtype=args.dtype, profile=prof,
                   data=args.data, say=say, trial_timeout_s=args.trial_timeout)
    if args.json:
        print(json.dumps(result_json(res), indent=1))
    else:
        autotune_table(res, console())
    return 0


def cmd_models(argv: list[str]) -> int:
    ap = _Parser(prog="plan models", description="List the catalog's models (what --model and a CSV row's "
                 "model_name take): size, shape and what each leaves unexpressed.")
    ap.add_argument("match", nargs="?", default=None,
                    help="only models whose name or an alias contains this (case and punctuation ignored)")
    _json_flag(ap)
    args = ap.parse_args(argv)
    from planner.models import model_rows

    rows = model_rows(args.match)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    _print_models(rows)
    return 0


def _print_models(rows: list[dict]) -> None:
    """plan models: a table of the models; one model's aliases and unexpressed facts in full below it."""
    from rich.table import Table

    from planner.terminal import console

    t = Table(title=f"{len(rows)} catalog model(s); --model takes the name or any alias")
    for col, just in (("model", "left"), ("params", "right"), ("active", "right"), ("layers", "right"),
                      ("hidden", "right"), ("heads (kv)", "right"), ("experts", "left"), ("seq", "right"),
                      ("notes", "left")):
        t.add_column(col, justify=just)
    for r in rows:
        experts = (f"{r['experts']} top-{r['moe_topk']} x {r['expert_ffn']}"
                   + (f" +{r['shared_experts']} shared" if r["shared_experts"] else "")) if r["experts"] else ""
        notes = []
        if r["hybrid_layers"]:
            notes.append(", ".join(f"{n} {k}" for k, n in r["hybrid_layers"].items()))
        if r["dense_layers"]:
            notes.append(f"first {r['dense_layers']} dense")
        if r["moe_layer_step"]:
            notes.append(f"MoE every {r['moe_layer_step']} layers ({r['moe_layers']} of {r['layers']})")
        if r["mtp_layers"]:
            notes.append(f"{r['mtp_layers']} MTP")
        if r["unexpressed"]:
            notes.append(f"{len(r['unexpressed'])} fact(s) unexpressed")
        t.add_row(r["name"], f"{r['params'] / 1e9:.1f}B",
                  f"{r['active_params'] / 1e9:.1f}B" if r["active_params"] is not None else "",
                  str(r["layers"]), str(r["hidden"]), f"{r['heads']} ({r['kv_heads']})", experts, str(r["seq_len"]),
                  "; ".join(notes))
    con = console()
    con.print(t)
    con.print("active: parameters a token passes through, embeddings excluded", markup=False, highlight=False)
    if len(rows) == 1:
        r = rows[0]
        con.print(f"aliases: {', '.join(r['aliases']) or 'none'}", markup=False, highlight=False)
        for fact in r["unexpressed"]:
            con.print(f"not in the cost model: {fact}", markup=False,
                      highlight=False)


def main(argv: list[str] | None = None) -> int:
    """The ``plan`` command (planner.request.PlanNote is the note warning); PlanNote warnings raised on the way are printed as notes at the end, unless the
    command ends in a one-line input error (exit 2)."""
    from planner.request import PlanNote

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlanNote)
        rc = _dispatch(argv)
    for w in caught:
        if not issubclass(w.category, PlanNote):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        elif rc != 2:
            print(f"note: {w.message}", file=sys.stderr)
    return rc


def _sigterm_as_interrupt():
    """SIGTERM (a scheduler's or `kill`'s stop) is handled like Ctrl-C: every command stops cleanly, a
    search keeps its finished trials, `plan run` stops its workers. Returns the handler to restore."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(*_):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _dispatch(argv: list[str] | None) -> int:
    import signal

    argv = list(sys.argv[1:] if argv is None else argv)
    previous = _sigterm_as_interrupt()
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return globals()[f"cmd_{argv[0]}"](argv[1:])   # plan SUBCOMMAND ...: cmd_SUBCOMMAND
        return cmd_search(argv)
    except InputError as exc:
        print(f"plan: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        from costmodel.profiles import validation_line

        print(f"plan: error: {exc.title} {validation_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
