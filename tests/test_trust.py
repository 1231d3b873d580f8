"""Intervals and support (costmodel/trust.py): the conformal quantiles and their coverage on a synthetic
residual set, the class fallback, the shipped files on a real plan, --rank-by p90 and plan validate's
interval fields."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from costmodel import trust
from costmodel.catalog import get_model
from costmodel.estimate import estimate_arrays
from costmodel.plan import ParallelPlan, PlanArrays
from costmodel.profiles import load_cluster
from planner.cli import main
from planner.search import exhaustive, optuna_search, ranked
from csv_rows import write_rows

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "data" / "validation" / "published_runs.csv"


# ---- the conformal fit on synthetic residuals ------------------------------------------------------

def test_conformal_quantile_ranks_and_coverage():
    """n = 19: P10 is the floor(20 x 0.1) = 2nd smallest, P90 the ceil(20 x 0.9) = 18th; 17 of 19 inside."""
    r = np.arange(1, 20, dtype=float) / 100          # 0.01 .. 0.19, shuffled
    rng = np.random.default_rng(0)
    rng.shuffle(r)
    assert trust.conformal_quantile(r, 0.1) == pytest.approx(0.02)
    assert trust.conformal_quantile(r, 0.9) == pytest.approx(0.18)
    assert trust.conformal_quantile(r, 0.5) == pytest.approx(0.10)
    cov = trust.coverage(r, np.full(19, 0.02), np.full(19, 0.18))
    assert cov == {"rows": 19, "inside": 17, "fraction": round(17 / 19, 4), "below_p10": 1, "above_p90": 1}
    # n = 8: rank ceil(9 x 0.9) = 9 does not exist, so P90 is undefined (the class must fall back).
    assert math.isnan(trust.conformal_quantile(r[:8], 0.9))


def test_class_fallback_and_blending():
    """A class too small for the finite-sample rank takes its parent's quantile; a larger one is blended
    n / (n + prior); a class with no residuals at all is looked up as its parent."""
    big = [("hopper/dense/65-1024", "hopper/dense", "hopper", "all")] * 19
    tiny = [("hopper/moe/le64", "hopper/moe", "hopper", "all")] * 3
    res = np.concatenate([np.linspace(-0.2, 0.2, 19), [0.5, 0.6, 0.7]])
    cls = trust.class_quantiles(res, big + tiny, prior_rows=19.0)
    assert cls["all"]["n"] == 22 and cls["hopper/moe/le64"]["n"] == 3
    root = cls["all"]["q"]
    assert root[0] == pytest.approx(np.sort(res)[1], abs=1e-5)       # floor(23 x 0.1) = 2nd
    assert root[2] == pytest.approx(np.sort(res)[20], abs=1e-5)      # ceil(23 x 0.9) = 21st
    # the 3-row class: ranks 0 and 4 do not exist -> its parent's P10 / P90 (the parent, as small, takes the
    # generation's, widened to cover its own residuals 0.5-0.7), blended median
    tiny_q, parent_q, gen_q = cls["hopper/moe/le64"]["q"], cls["hopper/moe"]["q"], cls["hopper"]["q"]
    assert tiny_q[0] == parent_q[0] == gen_q[0] and tiny_q[2] == parent_q[2] == max(gen_q[2], 0.7)
    assert gen_q[2] < 0.7
    assert tiny_q[1] == pytest.approx((3 * 0.6 + 19 * parent_q[1]) / 22, abs=1e-5)
    # the 19-row class: raw P90 is the 18th of linspace(-0.2, 0.2, 19), blended half-half with "hopper/dense"
    raw = np.linspace(-0.2, 0.2, 19)[17]
    assert cls["hopper/dense/65-1024"]["q"][2] == pytest.approx((19 * raw + 19 * cls["hopper/dense"]["q"][2]) / 38,
                                                                abs=1e-5)
    name, q = trust.lookup(cls, ("volta/dense/le64", "volta/dense", "volta", "all"))
    assert name == "all" and q == root


def test_thin_width_factor_reaches_the_target():
    """Thin rows spread twice as wide as their class interval need a factor of about 2 to hold 80%."""
    q = [[-0.1, 0.0, 0.1]] * 10
    r = np.linspace(-0.2, 0.2, 10)
    f = trust.thin_width_factor(r, q, np.ones(10, dtype=bool))
    inside = np.mean(np.abs(r) <= 0.1 * f + 1e-12)
    assert inside >= 0.8 and 1.5 <= f <= 2.0
    assert trust.thin_width_factor(r, q, np.zeros(10, dtype=bool)) == 1.0



def test_a_given_thin_factor_replaces_the_measured_one():
    """fit_intervals with thin_factor ships that factor (the script chooses it by nested quantile loss); a thin
    row's bounds are the class interval widened by it, a supported row's by the width factor."""
    rng = np.random.default_rng(0)
    res = rng.normal(0.0, 0.1, 60)
    paths = [("hopper/dense/le64", "hopper/dense", "hopper", "all")] * 60
    support = np.array([0] * 30 + [10] * 30)
    fit = trust.fit_intervals(res, paths, support, 20.0, width_factor=1.0, thin_factor=1.7)
    assert fit["thin_width_factor"] == 1.7 and trust.width_factors(fit) == (1.0, 1.7)
    lo, hi = trust.row_bounds(fit, paths[:2], np.array([0, 10]))
    q = fit["classes"]["hopper/dense/le64"]["q"]
    assert hi[0] - q[1] == pytest.approx(1.7 * (q[2] - q[1])) and hi[1] - q[1] == pytest.approx(q[2] - q[1])
    assert lo[0] - q[1] == pytest.approx(1.7 * (q[0] - q[1]))

# ---- the shipped files on real plans ---------------------------------------------------------------

@pytest.fixture(scope="module")
def m70():
    return get_model("70b"), load_cluster("h100x512")


def test_70b_h100x512_has_a_finite_interval(m70):
    model, cluster = m70
    res = exhaustive(model, cluster, 512)
    i = int(res.order[0])
    s = res.scores
    p10, p50, p90 = s["step_time_p10_s"][i], s["step_time_s"][i], s["step_time_p90_s"][i]
    assert np.isfinite([p10, p50, p90]).all() and 0 < p10 < p50 < p90
    plan = res.plan(0)
    t = trust.plan_trust(model, cluster, plan, float(p50))
    assert t["predicted_p10_step_time_s"] == pytest.approx(p10) and t["predicted_p90_step_time_s"] == pytest.approx(p90)
    assert t["interval_class"] == "hopper/dense/65-1024"
    assert t["support_runs"] == int(s["support_runs"][i])


def _independent_support(model, cluster, plan) -> int:
    """Support counted with a plain loop over the shipped table (not the vectorised code)."""
    n = 0
    for r in trust.validated_runs()["runs"]:
        n += (r["generation"] == "hopper" and r["software"] == "megatron" and r["moe"] == (model.num_experts > 0)
              and cluster.num_gpus / 4 <= r["num_gpus"] <= cluster.num_gpus * 4
              and (r["zero_stage"] >= 2) == (plan.zero_stage >= 2) and (r["pp"] > 1) == (plan.pp > 1)
              and (r["cp"] > 1) == (plan.cp > 1) and (r["ep"] > 1) == (plan.ep > 1))
    return n


def test_support_of_known_plans(m70):
    """The NVIDIA recipe layout of 70B on 512 H100 (tp4 pp4 vpp5 cp2, distributed optimizer) against
    Megatron-FSDP tp2 on the same cluster, which no validated Megatron run on Hopper resembles (the FSDP
    runs there are Paxml's, or 8 GPUs)."""
    model, cluster = m70
    recipe = ParallelPlan(tp=4, pp=4, vpp=5, cp=2, dp=8, micro_batch=1, global_batch=512, recompute="none")
    fsdp = ParallelPlan(tp=2, pp=1, dp=256, micro_batch=1, global_batch=512, recompute="none", zero_stage=3)
    counts = trust.support_counts(model, cluster, PlanArrays.from_plans([recipe, fsdp]))
    assert counts.tolist() == [_independent_support(model, cluster, recipe), _independent_support(model, cluster, fsdp)]
    assert counts.tolist() == [RECIPE_SUPPORT, 0]
    near = trust.nearest_runs(model, cluster, recipe)
    assert len(near) == min(5, RECIPE_SUPPORT)
    assert all(128 <= r["num_gpus"] <= 2048 and "cp" in r["layout"] and "pp1 " not in r["layout"] for r in near)
    iv = trust.step_intervals(model, cluster, PlanArrays.from_plans([recipe, fsdp]), np.array([6.0, 6.0]))
    width = iv["step_time_p90_s"] - iv["step_time_p10_s"]
    assert width[1] > width[0]                      # thin support: the wider interval


RECIPE_SUPPORT = 21  # validated runs near the recipe layout in the shipped table


# ---- ranking by P90 --------------------------------------------------------------------------------

def test_rank_by_p90_changes_order_constructed():
    """Two plans: A is faster at P50 but has the wider interval; P90 ranking puts B first."""
    plans = PlanArrays.from_plans([ParallelPlan(tp=8, dp=1, global_batch=8), ParallelPlan(tp=4, pp=2, dp=1, global_batch=8)])
    scores = {"fits": np.array([True, True]), "step_time_s": np.array([1.0, 1.1]),
              "step_time_p10_s": np.array([0.8, 1.0]), "step_time_p90_s": np.array([1.6, 1.3]),
              "peak_memory_bytes": np.ones((2, 1)), "support_runs": np.array([0, 9])}
    assert ranked(plans, scores).order.tolist() == [0, 1]
    assert ranked(plans, scores, "p90").order.tolist() == [1, 0]


def _fsdp_penalised_cost(model, cluster, plans):
    """The cost model with a P90 that triples the spread of FSDP plans (a constructed case)."""
    out = estimate_arrays(model, cluster, plans)
    t = out["step_time_s"]
    wide = np.where(plans.zero_stage >= 2, 3.0, 1.1)
    return {**out, "step_time_p10_s": t * 0.9, "step_time_p90_s": t * wide,
            "support_runs": np.where(plans.zero_stage >= 2, 0, 10)}


def test_rank_by_p90_changes_exhaustive_and_optuna(m70):
    model, cluster = m70
    p50 = exhaustive(model, cluster, 512, cost=_fsdp_penalised_cost)
    p90 = exhaustive(model, cluster, 512, cost=_fsdp_penalised_cost, rank_by="p90")
    assert p50.plan(0).zero_stage == 3          # FSDP is the fastest point estimate on 70b / h100x512
    assert p90.plan(0).zero_stage < 2
    t90 = p90.scores["step_time_p90_s"][p90.order[: int(p90.scores["fits"].sum())]]
    assert (np.diff(t90) >= 0).all()
    opt = optuna_search(model, cluster, 512, cost=_fsdp_penalised_cost, n_trials=60, seed=0, rank_by="p90")
    assert opt.plan(0).zero_stage < 2
    assert opt.scores["step_time_p90_s"][opt.order[0]] < p50.scores["step_time_p90_s"][p50.order[0]]


# ---- plan validate and plan check ------------------------------------------------------------------

def test_validate_json_has_interval_fields(tmp_path, capsys):
    rows = list(csv.DictReader(PUBLISHED.read_text().splitlines()))
    small = write_rows(tmp_path / "runs.csv", [r for r in rows if r["scored"] == "true"][:6])
    out = tmp_path / "v.json"
    assert main(["validate", str(small), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    cov = data["interval_coverage"]
    assert cov["rows"] == 6 and f"{cov['inside']} of 6" in text
    for r in data["rows"]:
        assert 0 < r["predicted_p10_step_time_s"] < r["predicted_step_time_s"] < r["predicted_p90_step_time_s"]
        assert isinstance(r["support_runs"], int)
    inside = sum(r["predicted_p10_step_time_s"] <= r["published_step_time_s"] <= r["predicted_p90_step_time_s"]
                 for r in data["rows"])
    assert cov["inside"] == inside
    # Rows that publish no step time are predicted with intervals, and the line says there is nothing to
    # compare (it said the interval files were missing).
    blank = write_rows(tmp_path / "blank.csv", [{**r, "step_time_s": "", "measured_metric": "", "measured_value": ""}
                                                for r in rows if r["scored"] == "true"][:2])
    assert main(["validate", str(blank), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no row publishes a step time to compare" in text and "missing" not in text
    assert all(r["predicted_p10_step_time_s"] for r in json.loads(out.read_text())["rows"])


def test_parity_stats_count_errors_bands_and_interval_hits():
    """The figure's panel figures from the rows: 3 scored rows (one without a published time and one whose
    prediction is infinite are left out), errors 5%, 20% and 50%."""
    from planner.parity import parity_stats

    rows = [{"predicted_step_time_s": 1.05, "published_step_time_s": 1.0, "predicted_p10_step_time_s": 0.9,
             "predicted_p90_step_time_s": 1.2},
            {"predicted_step_time_s": 2.4, "published_step_time_s": 2.0, "predicted_p10_step_time_s": 2.1,
             "predicted_p90_step_time_s": 2.8},
            {"predicted_step_time_s": 6.0, "published_step_time_s": 4.0, "predicted_p10_step_time_s": None,
             "predicted_p90_step_time_s": None},
            {"predicted_step_time_s": 3.0, "published_step_time_s": None},
            {"predicted_step_time_s": math.inf, "published_step_time_s": 3.0}]
    st = parity_stats(rows)
    assert st["rows"] == 3
    assert st["mape"] == pytest.approx(25.0) and st["median_ape"] == pytest.approx(20.0)
    assert st["within"] == {"10%": 1, "25%": 2}
    assert (st["interval_rows"], st["inside"]) == (2, 1)    # 2.0 lies below 2.1
    assert parity_stats([])["rows"] == 0


def test_worst_rows_table_lists_the_largest_misses_first():
    """Rows ordered by |predicted / published - 1| (a 0.5 ratio before a 1.3 one), whether the published time is
    inside, below or above the interval, rows without a published time left out, and no table for one row."""
    from rich.console import Console

    from planner.report import worst_rows_table

    def row(i, pred, pub, lo=None, hi=None):
        return {"row": i, "source_id": "S", "model_name": "m", "num_gpus": 8, "gpu_type": "H100",
                "precision": "bf16", "release": "", "predicted_step_time_s": pred, "published_step_time_s": pub,
                "predicted_p10_step_time_s": lo, "predicted_p90_step_time_s": hi}

    rows = [row(0, 1.3, 1.0, 1.1, 1.5), row(1, 1.0, 2.0, 0.9, 1.2), row(2, 1.02, 1.0), row(3, 2.0, None)]
    con = Console(width=200, record=True)
    con.print(worst_rows_table(rows, n=2))
    text = con.export_text()
    assert "2 of 3 scored rows" in text
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("│")]
    assert len(lines) == 2
    assert "0.50" in lines[0] and "above P90" in lines[0]
    assert "1.30" in lines[1] and "below P10" in lines[1]
    assert worst_rows_table([row(0, 1.0, 1.0)]) is None


def test_validate_plot_writes_the_parity_figure(tmp_path, capsys):
    rows = list(csv.DictReader(PUBLISHED.read_text().splitlines()))
    small = write_rows(tmp_path / "runs.csv", [r for r in rows if r["scored"] == "true"][:6])
    png, out = tmp_path / "parity.png", tmp_path / "v.json"
    assert main(["validate", str(small), "--plot", str(png), "--json", str(out)]) == 0
    assert f"plot written to {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert json.loads(out.read_text())["plot"] == str(png)
    # A plot path in a missing folder fails before any prediction and writes nothing.
    assert main(["validate", str(small), "--plot", str(tmp_path / "no" / "p.png")]) == 2
    assert not (tmp_path / "no").exists()


def test_check_and_search_show_intervals(capsys, tmp_path):
    assert main(["check", "--model", "70b", "--cluster", "h100x512.yaml", "--tp", "4", "--pp", "4", "--vpp", "5",
                 "--cp", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    t = data["trust"]
    assert t["predicted_p10_step_time_s"] < data["estimate"]["step_time_s"] < t["predicted_p90_step_time_s"]
    assert t["support_runs"] == RECIPE_SUPPORT
    out = tmp_path / "p"
    assert main(["--model", "70b", "--cluster", "h100x512.yaml", "--top", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "support" in text and " (" in text
    assert "best supported: #" in text                 # #1 is Megatron-FSDP, which no Hopper run supports
    saved = json.loads((out / "plan.json").read_text())
    assert saved["predicted_p10_step_time_s"] < saved["estimate"]["step_time_s"] < saved["predicted_p90_step_time_s"]
    assert isinstance(saved["support_runs"], int) and isinstance(saved["thin_support"], bool)


def test_cli_rank_by_p90_ranks_by_p90_and_widens_thin_plans(capsys):
    """70B on 512 H100: by P50 the thinly supported Megatron-FSDP layouts lead and the best supported one is
    named; by P90 the table is sorted by P90 and starts with a supported plan, whose interval is relatively
    narrower than a thin plan's (the thin-support factor of the shipped intervals)."""
    assert main(["--model", "70b", "--cluster", "h100x512.yaml", "--json", "--top", "5"]) == 0
    by50 = json.loads(capsys.readouterr().out)
    assert main(["--model", "70b", "--cluster", "h100x512.yaml", "--json", "--top", "8", "--rank-by", "p90"]) == 0
    by90 = json.loads(capsys.readouterr().out)
    assert by90["rank_by"] == "p90" and by50["rank_by"] == "p50"
    assert by50["plans"][0]["thin_support"] and by50["best_supported"]["support_runs"] >= 3
    p90s = [r["predicted_p90_step_time_s"] for r in by90["plans"]]
    assert p90s == sorted(p90s)
    assert not by90["plans"][0]["thin_support"] and "best_supported" not in by90
    assert by90["plans"][0]["predicted_p90_step_time_s"] < by50["plans"][0]["predicted_p90_step_time_s"]
    thin = next(r for r in by50["plans"] if r["thin_support"])
    ok = by90["plans"][0]
    assert (thin["predicted_p90_step_time_s"] / thin["step_time_s"]
            > ok["predicted_p90_step_time_s"] / ok["step_time_s"] * 1.03)

def test_a_profile_calibrated_on_the_model_narrows_its_interval_by_the_fitted_factor(tmp_path):
    """plan calibrate measured the 8B: its predictions' P10-P90 shrink about P50 by intervals.json's
    calibrated_width_factor (fitted by scripts/fit_intervals.py to one-run calibrated held-out predictions,
    below 1), through the profile passed or a --profile path in the cluster's gpu field; the 70B, not measured,
    keeps the shipped width."""
    import yaml

    from costmodel.profiles import load_profile

    factor = trust.intervals_data()[trust.CALIBRATED_KEY]
    assert 0.3 <= factor < 1.0
    shipped = load_profile("H100")
    small, big = get_model("8b"), get_model("70b")
    cal = shipped.model_copy(update={"calibration": shipped.calibration.model_copy(
        update={"measured_models": (small.architecture_key(),), "other_models_weight": 0.2})})
    path = tmp_path / "h100_cal.yaml"
    path.write_text(yaml.safe_dump(json.loads(cal.model_dump_json())))
    cluster = load_cluster("h100x512")
    plans = PlanArrays.from_plans([ParallelPlan(tp=2, dp=256, global_batch=512)])

    def log_width(model, **kw):
        iv = trust.step_intervals(model, kw.pop("cluster", cluster), plans, np.array([10.0]), **kw)
        return math.log(iv["step_time_p90_s"][0] / iv["step_time_p10_s"][0])

    assert log_width(small, profile=cal) == pytest.approx(factor * log_width(small), rel=1e-9)
    assert log_width(small, cluster=cluster.model_copy(update={"gpu": str(path)})) == \
        pytest.approx(factor * log_width(small), rel=1e-9)
    assert log_width(big, profile=cal) == pytest.approx(log_width(big), rel=1e-12)
    trusted = trust.plan_trust(small, cluster.model_copy(update={"gpu": str(path)}),
                               ParallelPlan(tp=2, dp=256, global_batch=512), 10.0)
    assert f"narrowed x{factor:g}: the profile was calibrated on this model" in trusted["interval_class"]
