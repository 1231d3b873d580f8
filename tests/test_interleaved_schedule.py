"""The interleaved 1F1B schedule run op by op (costmodel/pipeline.py interleaved_schedule_s) against the closed form
the estimate uses, and what follows for the planner: chunkings that split the heaviest stages unevenly are not
offered, and the last rank's chunk holding the loss is its lightest."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.pipeline import interleaved_schedule_s, pipeline_time_s
from costmodel.plan import megatron_layout
from costmodel.profiles import load_cluster
from planner.space import valid_plans


def _closed_form(stage_s: list[float], m: int, vpp: int) -> float:
    t = np.array([stage_s])
    return float(pipeline_time_s(t, np.ones_like(t), m, vpp)[0][0])


@pytest.mark.parametrize("pp,vpp,m", [(4, 1, 8), (4, 2, 8), (8, 5, 32), (16, 7, 64), (16, 4, 16)])
def test_equal_chunks_reproduce_the_closed_form(pp, vpp, m):
    f = np.full((pp, vpp), 0.3)
    assert interleaved_schedule_s(f, 2 * f, m) == pytest.approx(_closed_form([0.9 * vpp] * pp, m, vpp), rel=1e-12)


def test_a_heavier_last_stage_is_what_the_closed_form_prices():
    """The output layer on the last chunk of the last rank makes that stage the slowest: exactly the closed form."""
    pp, vpp, m = 8, 5, 32
    f = np.full((pp, vpp), 2.0)
    f[-1, -1] += 1.2
    stage = [3.0 * row.sum() for row in f]
    assert interleaved_schedule_s(f, 2 * f, m) == pytest.approx(_closed_form(stage, m, vpp), rel=1e-12)


def test_unequal_chunks_on_the_heaviest_stages_run_slower_than_priced():
    """8 layers on each of 16 ranks in 7 chunks (6 of one layer, one of two, as a layout string writes them):
    the same stage totals, 9.8% slower than the closed form; in 4 chunks of 2, as priced."""
    m = 64
    uneven = np.array([[1.0] * 6 + [2.0]] * 16)
    even = np.full((16, 4), 2.0)
    closed = _closed_form([24.0] * 16, m, 7)
    assert interleaved_schedule_s(uneven, 2 * uneven, m) / closed == pytest.approx(1.098, abs=0.002)
    assert interleaved_schedule_s(even, 2 * even, m) == pytest.approx(_closed_form([24.0] * 16, m, 4), rel=1e-12)


def test_the_planner_offers_only_chunkings_that_split_the_heaviest_stages_evenly():
    model, cluster = get_model("405b"), load_cluster("h100x8192")      # 126 layers: pp 16 gives stages of 7 and 8
    plans = valid_plans(model, cluster, 2048)
    uneven = ~np.isnan(plans.stage_layers[:, 0])
    assert uneven.any()
    heaviest = np.nanmax(plans.stage_layers[uneven], axis=1)
    assert np.all(heaviest % plans.vpp[uneven] == 0)
    pp16 = set(plans.vpp[uneven & (plans.pp == 16)].astype(int))
    assert 4 in pp16 and 2 in pp16 and not pp16 & {3, 5, 6, 7}


def test_the_loss_chunk_of_the_last_rank_is_its_lightest():
    """405B on pp 16 at vpp 4 (7 layers on the edge ranks, 8 between): the last rank's remainder goes to its
    earlier chunks, and the schedule of that layout (output layer about 0.66 of a layer) runs as priced."""
    split = (7,) + (8,) * 14 + (7,)
    assert megatron_layout(split, vpp=4) == "Et|(t*2|)*62,tL"
    f = np.full((16, 4), 2.0)
    f[0, 0], f[-1, -1] = 1.0, 1.66
    stage = [3.0 * row.sum() for row in f]
    assert interleaved_schedule_s(f, 2 * f, 64) == pytest.approx(_closed_form(stage, 64, 4), rel=0.01)
    heavy_last = f.copy()
    heavy_last[-1] = [1.0, 2.0, 2.0, 2.66]      # the remainder on the later chunks, as before: 7% slower
    assert interleaved_schedule_s(heavy_last, 2 * heavy_last, 64) / _closed_form(stage, 64, 4) > 1.06


def test_plan_check_warns_of_unequal_chunks_and_names_the_even_ones():
    from costmodel.plan import ParallelPlan
    from planner.check import diagnose, format_findings

    model, cluster = get_model("405b"), load_cluster("h100x8192")
    split = (7,) + (8,) * 14 + (7,)
    plan = ParallelPlan(tp=8, pp=16, vpp=7, dp=32, cp=2, micro_batch=1, global_batch=2048, recompute="none",
                        layers_per_stage=split)
    found = [f for f in diagnose(model, cluster, plan) if f.kind == "uneven_chunks"]
    assert len(found) == 1 and found[0].severity == "warn"
    before, after = found[0].predicted["schedule_over_priced"]
    assert before == 1.0 and 1.04 < after < 1.10
    line = format_findings(found)[0]
    assert "(1/1/1/1/1/1/2)" in line and "vpp 2, 4 splits them evenly" in line
    even = plan.model_copy(update={"vpp": 4})
    assert not [f for f in diagnose(model, cluster, even) if f.kind == "uneven_chunks"]
    # The chunk times come from the estimate's stages, the edge stages' embedding and output layer on their edge
    # chunks: with the last rank's 8 layers (1/1/1/1/1/1/2 and the output layer) that rank is the heaviest stage,
    # which the estimate prices; counted in layers alone the schedule looked 11% slower than priced.
    heavy_end = plan.model_copy(update={"layers_per_stage": (7,) + (8,) * 13 + (7, 8)})
    found = [f for f in diagnose(model, cluster, heavy_end) if f.kind == "uneven_chunks"]
    assert len(found) == 1 and 1.02 < found[0].predicted["schedule_over_priced"][1] < 1.08
