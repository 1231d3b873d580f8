"""costmodel/plan.py: the one definition of a plan and of the values derived from its degrees."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.plan import (PlanArrays, ParallelPlan, data_parallel, default_global_batch, even_split,
                            num_microbatches)


def test_data_parallel_fills_the_cluster_ints_and_arrays():
    assert data_parallel(512, 4, 4) == 32 and isinstance(data_parallel(512, 4, 4), int)
    assert data_parallel(512, 8, 4, 2) == 8
    assert data_parallel(8, 8, 2) == 1   # fewer GPUs than one replica: at least 1
    np.testing.assert_array_equal(data_parallel(np.array([512, 64]), np.array([4, 8]), np.array([4, 1])), [32, 8])


def test_num_microbatches_as_megatron_counts_them():
    assert num_microbatches(512, 32, 1) == 16
    assert num_microbatches(1536, 16, 2) == 48
    assert num_microbatches(8, 16, 1) == 1
    np.testing.assert_array_equal(num_microbatches(np.array([512.0, 64.0]), np.array([32.0, 8.0]), 2), [8, 4])
    assert ParallelPlan(tp=4, pp=4, dp=32, micro_batch=2, global_batch=512).num_microbatches == 8


def test_even_split_puts_a_remainder_after_the_first_stage():
    assert even_split(80, 4) == (20, 20, 20, 20)
    assert even_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert even_split(10, 4) == (2, 3, 3, 2)
    assert even_split(61, 8) == (7, 8, 8, 8, 8, 8, 7, 7)


def test_default_global_batch_is_about_4m_tokens_and_divides_odd_clusters():
    assert default_global_batch(8192, 512) == 512          # 4M tokens of 8k sequences
    assert default_global_batch(4096, 512) == 1024
    assert default_global_batch(8192, 576) % 9 == 0         # 576 = 9 x 64 GPUs


def test_plan_arrays_round_trip_with_and_without_a_split():
    plans = [ParallelPlan(tp=8, pp=4, vpp=5, dp=16, global_batch=512, recompute="full", recompute_layers=2),
             ParallelPlan(tp=8, pp=16, dp=128, global_batch=2048, layers_per_stage=(7,) + (8,) * 14 + (7,))]
    arrays = PlanArrays.from_plans(plans)
    assert [arrays.plan(i) for i in range(2)] == plans
    assert arrays.plan(1, split=False).layers_per_stage is None
    np.testing.assert_array_equal(arrays.num_microbatches, [32, 16])


def test_with_even_split_writes_the_split_out_once():
    p = ParallelPlan(tp=1, pp=4, dp=2, global_batch=64)
    assert p.with_even_split(10).layers_per_stage == (2, 3, 3, 2)
    q = ParallelPlan(tp=1, pp=2, dp=2, global_batch=64, layers_per_stage=(3, 7))
    assert q.with_even_split(10) is q
    with pytest.raises(ValueError, match="layers_per_stage has 1 entries but pp=2"):
        ParallelPlan(tp=1, pp=2, global_batch=64, layers_per_stage=(10,))
