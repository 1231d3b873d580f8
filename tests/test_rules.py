"""Megatron-core validity rules (costmodel.rules) on real model shapes."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from costmodel.profiles import InputError
from costmodel.rules import (
    PlanError,
    check_plan,
    divisors,
    schedule_notes,
    valid_mask,
    valid_values,
    violations,
)
from costmodel.specs import ModelSpec
from costmodel.plan import ParallelPlan

# Llama-3-70B (Meta's config.json): 80 layers, h=8192, ffn=28672, 64 heads, 8 KV heads.
LLAMA3_70B = ModelSpec(
    name="llama3-70b",
    layers=80,
    hidden=8192,
    ffn_hidden=28672,
    heads=64,
    kv_heads=8,
    vocab=128256,
    seq_len=8192,
)

# Mixtral-8x7B: 32 layers, h=4096, 32 heads, 8 KV heads, 8 experts top-2, expert ffn 14336.
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b",
    layers=32,
    hidden=4096,
    ffn_hidden=14336,
    heads=32,
    kv_heads=8,
    vocab=32000,
    seq_len=4096,
    num_experts=8,
    moe_topk=2,
    moe_ffn_hidden=14336,
)

# GPT-3 175B (Brown et al. 2020): 96 layers, h=12288, 96 heads, MHA, s=2048.
GPT3_175B = ModelSpec(
    name="gpt3-175b",
    layers=96,
    hidden=12288,
    ffn_hidden=4 * 12288,
    heads=96,
    vocab=50257,
    seq_len=2048,
    gated_mlp=False,
    learned_position_embeddings=True,
)

# DeepSeek-V3-like: 61 layers (3 dense), 256 routed + 1 shared expert, MLA.
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    layers=61,
    hidden=7168,
    ffn_hidden=18432,
    heads=128,
    head_dim=128,
    vocab=129280,
    seq_len=4096,
    num_experts=256,
    moe_topk=8,
    moe_ffn_hidden=2048,
    shared_experts=1,
    dense_layers=3,
    mla_kv_lora_rank=512,
    mla_q_lora_rank=1536,
)


def plan(**kw) -> ParallelPlan:
    kw.setdefault("global_batch", 1024)
    return ParallelPlan(**kw)


# Helpers ----------------------------------------------------------------------------------


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64]
    assert divisors(80) == [1, 2, 4, 5, 8, 10, 16, 20, 40, 80]
    assert divisors(0) == []
    assert valid_values(range(1, 10), lambda x: 12 % x == 0) == [1, 2, 3, 4, 6]


# Llama-3-70B -------------------------------------------------------------------------------


def test_llama70b_tp8_pp4_dp16_on_512_accepted():
    p = plan(tp=8, pp=4, dp=16, global_batch=1024)
    assert violations(LLAMA3_70B, p, 512) == []
    check_plan(LLAMA3_70B, p, 512)  # does not raise


def test_llama70b_tp16_rejected_for_kv_heads():
    # The megatron-core 0.15 rule (kv_heads % tp == 0), still available with kv_head_replication=False.
    p = plan(tp=16, pp=4, dp=8)
    found = violations(LLAMA3_70B, p, 512, kv_head_replication=False)
    assert len(found) == 1, found
    msg = found[0]
    assert "tp=16" in msg and "kv_heads=8" in msg
    assert "valid tp: 1, 2, 4, 8" in msg
    # heads=64 alone would allow tp=16: only the kv rule fires.
    assert "heads=64" not in msg


def test_kv_head_replication_switch_accepts_tp_multiple_of_kv_heads():
    # megatron-core 0.16 (PR #2565) also allows tp % kv_heads == 0: the default, as 0.16.1 is pinned.
    p = plan(tp=16, pp=4, dp=8)
    assert violations(LLAMA3_70B, p, 512) == []
    assert violations(LLAMA3_70B, p, 512, kv_head_replication=True) == []
    found = violations(LLAMA3_70B, plan(tp=3, dp=1), kv_head_replication=True)
    assert any("kv_heads=8" in m and "valid tp: 1, 2, 4, 8, 16, 32, 64" in m for m in found)


def test_llama70b_pp3_rejected_with_valid_pp_list():
    p = plan(tp=8, pp=3, dp=16, global_batch=1536)
    found = violations(LLAMA3_70B, p)
    assert len(found) == 1, found
    assert "pp=3" in found[0] and "layers=80" in found[0]
    assert "valid pp: 1, 2, 4, 5, 8, 10, 16, 20, 40, 80" in found[0]


def test_a_pp_that_divides_with_the_embedding_and_loss_counted_names_that_split():
    # 80 + 2 over pp 3 does not divide: no suggestion. 126 + 2 over pp 16 (Llama 3.1 405B) does: the message gives
    # the split Megatron's --account-for-embedding/loss-in-pipeline-split runs, which the rules then accept.
    found = violations(LLAMA3_70B, plan(tp=8, pp=3, dp=16, global_batch=1536))
    assert "embedding and loss" not in found[0]
    m405 = LLAMA3_70B.model_copy(update={"layers": 126})
    found = violations(m405, plan(tp=8, pp=16, dp=4, global_batch=1536))
    assert len(found) == 1
    assert found[0].endswith("with the embedding and loss counted as a layer each it divides: layers_per_stage "
                             "7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7)")
    split = (7,) + (8,) * 14 + (7,)
    assert sum(split) == 126
    assert violations(m405, plan(tp=8, pp=16, dp=4, global_batch=1536, layers_per_stage=split)) == []


def test_llama70b_uneven_split_accepts_pp3():
    p = plan(tp=8, pp=3, dp=16, global_batch=1536, layers_per_stage=(26, 27, 27))
    assert violations(LLAMA3_70B, p) == []


def test_tp_not_dividing_heads_message():
    found = violations(LLAMA3_70B, plan(tp=3))
    assert "tp=3 does not divide heads=64; valid tp: 1, 2, 4, 8, 16, 32, 64" in found
    # ffn 28672 = 2^12 * 7 is not a multiple of 3 either
    assert any("ffn_hidden=28672" in m for m in found)


def test_vpp_with_pp1_rejected():
    found = violations(LLAMA3_70B, plan(tp=8, pp=1, vpp=2, dp=1))
    assert len(found) == 1, found
    assert "vpp=2" in found[0] and "pp=1" in found[0]


def test_vpp_must_divide_layers_per_stage():
    # 80 / 4 = 20 layers per stage; vpp=3 does not divide 20
    found = violations(LLAMA3_70B, plan(tp=8, pp=4, vpp=3, dp=16))
    assert len(found) == 1, found
    assert "vpp=3" in found[0] and "pp=4" in found[0]
    assert "valid vpp for pp=4: 1, 2, 4, 5, 10, 20" in found[0]
    assert violations(LLAMA3_70B, plan(tp=8, pp=4, vpp=5, dp=16)) == []


def test_interleaved_schedule_needs_microbatches_multiple_of_pp():
    # dp=16, mb=1, gbs=96 -> 6 micro-batches, not a multiple of pp=4
    bad = plan(tp=8, pp=4, vpp=2, dp=16, global_batch=96)
    found = violations(LLAMA3_70B, bad, 512)
    assert len(found) == 1, found
    for name in ("vpp=2", "pp=4", "dp=16", "micro_batch=1", "global_batch=96"):
        assert name in found[0]
    assert "multiples of 64" in found[0]
    # 8 micro-batches is fine; 2 (< pp) is not
    assert violations(LLAMA3_70B, plan(tp=8, pp=4, vpp=2, dp=16, global_batch=128), 512) == []
    assert violations(LLAMA3_70B, plan(tp=8, pp=4, vpp=2, dp=16, global_batch=32), 512)
    # Without interleaving, 6 micro-batches on pp=4 is allowed.
    assert violations(LLAMA3_70B, plan(tp=8, pp=4, dp=16, global_batch=96), 512) == []


def test_global_batch_not_divisible_rejected():
    p = plan(tp=8, pp=4, dp=16, micro_batch=2, global_batch=1000)
    found = violations(LLAMA3_70B, p, 512)
    assert len(found) == 1, found
    msg = found[0]
    assert "global_batch=1000" in msg and "dp=16" in msg and "micro_batch=2" in msg
    assert "multiples of 32" in msg and "992, 1024" in msg


def test_world_size_message_names_every_degree_and_product():
    found = violations(LLAMA3_70B, plan(tp=8, pp=4, dp=8), 512)
    assert len(found) == 1, found
    msg = found[0]
    for name in ("tp=8", "pp=4", "dp=8", "cp=1", "num_gpus=512", "= 256"):
        assert name in msg
    assert "valid dp for tp=8, pp=4, cp=1: 16" in msg


def test_check_plan_raises_one_line_with_all_violations():
    p = plan(tp=3, pp=3, dp=7, global_batch=1000)
    with pytest.raises(PlanError) as err:
        check_plan(LLAMA3_70B, p, 512)
    assert isinstance(err.value, InputError)
    text = str(err.value)
    assert "\n" not in text
    found = violations(LLAMA3_70B, p, 512)
    assert len(found) >= 4
    assert "; ".join(found) in text


def test_context_parallel_sequence_rules():
    # 8192 % (2*3) != 0
    found = violations(LLAMA3_70B, plan(tp=8, cp=3, dp=1))
    assert any("cp=3" in m and "seq_len=8192" in m and "2*cp=6" in m for m in found)
    assert violations(LLAMA3_70B, plan(tp=8, cp=4, dp=1)) == []


def test_sequence_parallel_needs_seq_divisible_by_tp_and_cp():
    m = LLAMA3_70B.model_copy(update={"seq_len": 8200})  # 8200 % 8 == 0 but 8200/4 % 8 != 0
    found = violations(m, plan(tp=8, cp=4, dp=1))
    assert any("tp=8" in x and "cp=4" in x and "sequence_parallel" in x for x in found), found
    # Without sequence parallel the tp split of the sequence is not needed.
    assert not any(
        "sequence_parallel" in x
        for x in violations(m, plan(tp=8, cp=4, dp=1, sequence_parallel=False))
    )


def test_sequence_parallel_with_tp1_is_not_an_error():
    assert violations(LLAMA3_70B, plan(tp=1, pp=8, dp=64, sequence_parallel=True), 512) == []


# MoE ---------------------------------------------------------------------------------------


def test_moe_tp2_without_sequence_parallel_rejected():
    for ep in (1, 2):
        p = plan(tp=2, ep=ep, dp=4, sequence_parallel=False)
        found = violations(MIXTRAL_8X7B, p, 8)
        assert len(found) == 1, found
        assert "tp=2" in found[0] and "sequence_parallel=False" in found[0]
        assert "num_experts=8" in found[0]
    assert violations(MIXTRAL_8X7B, plan(tp=2, ep=2, dp=4, sequence_parallel=True), 8) == []


def test_ep_not_dividing_experts_rejected():
    p = plan(tp=1, ep=3, dp=6, global_batch=96)
    found = violations(MIXTRAL_8X7B, p, 6)
    assert len(found) == 1, found
    assert "ep=3" in found[0] and "num_experts=8" in found[0]
    assert "valid ep: 1, 2, 4, 8" in found[0]


def test_expert_grid_ep_times_etp_must_divide_tp_cp_dp():
    p = plan(tp=2, ep=4, etp=2, dp=2)  # ep*etp = 8 does not divide tp*cp*dp = 4
    found = violations(MIXTRAL_8X7B, p, 4)
    assert len(found) == 1, found
    for name in ("ep=4", "etp=2", "tp=2", "cp=1", "dp=2"):
        assert name in found[0]
    assert violations(MIXTRAL_8X7B, plan(tp=2, ep=4, etp=1, dp=2), 4) == []


def test_ep_on_dense_model_rejected():
    found = violations(LLAMA3_70B, plan(tp=8, ep=2, dp=2))
    assert any("ep=2" in m and "num_experts=0" in m and "valid ep: 1" in m for m in found)


def test_expert_ffn_must_divide_by_etp():
    found = violations(MIXTRAL_8X7B, plan(tp=1, ep=1, etp=3, dp=3))
    assert any("etp=3" in m and "moe_ffn_hidden=14336" in m for m in found), found


def test_deepseek_v3_uneven_pipeline_and_mla():
    # 61 layers on pp=16 via an uneven split; MLA has no kv-head rule.
    lps = (1,) + (4,) * 15
    p = plan(tp=2, pp=16, ep=64, dp=32, global_batch=8192, layers_per_stage=lps)
    assert violations(DEEPSEEK_V3, p, 1024) == []
    found = violations(DEEPSEEK_V3, plan(tp=2, pp=16, ep=64, dp=32, global_batch=8192), 1024)
    assert any("pp=16" in m and "layers=61" in m for m in found)


# Uneven pipeline, recompute, optimizer, rank order ----------------------------------------


def test_layers_per_stage_rules():
    bad_sum = plan(tp=8, pp=4, dp=16, layers_per_stage=(20, 20, 20, 19))
    assert any("sums to 79" in m and "layers=80" in m for m in violations(LLAMA3_70B, bad_sum))
    empty_middle = plan(tp=8, pp=4, dp=16, layers_per_stage=(40, 0, 20, 20))
    assert any("middle" in m for m in violations(LLAMA3_70B, empty_middle))
    empty_last = plan(tp=8, pp=4, dp=16, layers_per_stage=(26, 27, 27, 0))
    assert violations(LLAMA3_70B, empty_last) == []
    # An explicit split is emitted as a pipeline_model_parallel_layout string, whose virtual stages may
    # differ in size: counts that are not multiples of vpp are accepted (megatron-core parses them).
    odd_vpp = plan(tp=8, pp=4, vpp=2, dp=16, layers_per_stage=(19, 21, 20, 20))
    assert violations(LLAMA3_70B, odd_vpp) == []


def test_recompute_layers_rules():
    sel = plan(tp=8, pp=4, dp=16, recompute="selective", recompute_layers=4)
    assert any("recompute='full'" in m for m in violations(LLAMA3_70B, sel))
    too_many = plan(tp=8, pp=4, dp=16, recompute="full", recompute_layers=21)
    found = violations(LLAMA3_70B, too_many)
    assert any("recompute_layers=21" in m and "pp=4" in m and "0..20" in m for m in found)
    ok = plan(tp=8, pp=4, dp=16, recompute="full", recompute_layers=20)
    assert violations(LLAMA3_70B, ok) == []


def test_distributed_optimizer_implies_zero_stage():
    found = violations(LLAMA3_70B, plan(tp=8, pp=4, dp=16, zero_stage=0))
    assert any("distributed_optimizer=True" in m and "zero_stage=0" in m for m in found)
    ok = plan(tp=8, pp=4, dp=16, zero_stage=0, distributed_optimizer=False)
    assert violations(LLAMA3_70B, ok) == []
    # The other way round: priced sharded, but the flags would leave --use-distributed-optimizer out.
    for stage in (1, 3):
        found = violations(LLAMA3_70B, plan(tp=8, pp=1, dp=64, zero_stage=stage, distributed_optimizer=False))
        assert [m for m in found if "distributed_optimizer=False" in m] == [
            f"zero_stage={stage} shards optimizer states (Megatron's distributed optimizer) but "
            "distributed_optimizer=False; valid: distributed_optimizer=True, or zero_stage=0"]


def test_rank_order_rules():
    bad = plan(tp=8, pp=4, dp=16, rank_order="tp-dp-pp")  # no cp/ep, sizes 1 -> fine
    assert violations(LLAMA3_70B, bad) == []
    missing = plan(tp=8, pp=4, cp=2, dp=8, rank_order="tp-dp-pp")
    assert any("omits cp=2" in m for m in violations(LLAMA3_70B, missing))
    typo = plan(tp=8, pp=4, dp=16, rank_order="tp-xp-dp-pp")
    assert any("unknown tokens xp" in m for m in violations(LLAMA3_70B, typo))
    # not pp-last with pp > 1: expert dp (tp*cp*dp/(ep*etp) = 2*1*4/8 = 1) must equal dp=4
    moe = plan(tp=2, pp=2, ep=8, dp=4, global_batch=64, rank_order="tp-cp-ep-pp-dp")
    found = violations(MIXTRAL_8X7B, moe, 16)
    assert any("not pp-last" in m and "ep=8" in m and "dp=4" in m for m in found), found


def test_schedule_notes():
    notes = schedule_notes(plan(tp=8, pp=2, vpp=2, dp=32))
    assert len(notes) == 1
    assert "overlap_p2p_comm=True" in notes[0] and "batch_p2p_comm=False" in notes[0]
    assert schedule_notes(plan(tp=8, pp=4, vpp=2, dp=16)) == []
    assert schedule_notes(plan(tp=8, pp=2, dp=32)) == []


# Vectorised mask ---------------------------------------------------------------------------


def _random_columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "tp": rng.choice([1, 2, 3, 4, 8, 16], n),
        "pp": rng.choice([1, 2, 3, 4, 8, 16], n),
        "vpp": rng.choice([1, 1, 2, 3, 4, 5], n),
        "dp": rng.choice([1, 2, 4, 6, 8, 16, 32], n),
        "cp": rng.choice([1, 1, 2, 3, 4], n),
        "ep": rng.choice([1, 1, 2, 3, 4, 8], n),
        "etp": rng.choice([1, 1, 2, 4], n),
        "micro_batch": rng.choice([1, 2, 3, 4], n),
        "global_batch": rng.choice([64, 96, 128, 256, 512, 1000, 1024, 1536], n),
        "sequence_parallel": rng.random(n) < 0.7,
    }


@pytest.mark.parametrize("model", [LLAMA3_70B, MIXTRAL_8X7B, GPT3_175B, DEEPSEEK_V3],
                         ids=lambda m: m.name)
@pytest.mark.parametrize("num_gpus", [None, 64, 512])
def test_valid_mask_agrees_with_violations(model, num_gpus):
    rng = np.random.default_rng(zlib.crc32(f"{model.name}/{num_gpus}".encode()))
    n = 400
    cols = _random_columns(rng, n)
    if num_gpus is not None:
        # Put about half the rows on the cluster size so the world rule is not always False.
        fit = num_gpus // (cols["tp"] * cols["pp"] * cols["cp"])
        on = (rng.random(n) < 0.5) & (fit >= 1)
        cols["dp"] = np.where(on, np.maximum(fit, 1), cols["dp"])
    mask = valid_mask(model, cols, num_gpus)
    assert mask.shape == (n,) and mask.dtype == bool
    for i in range(n):
        p = ParallelPlan(
            **{k: (bool(v[i]) if k == "sequence_parallel" else int(v[i])) for k, v in cols.items()}
        )
        scalar_ok = violations(model, p, num_gpus) == []
        assert scalar_ok == bool(mask[i]), (i, p, violations(model, p, num_gpus))
    assert 0 < mask.sum() < n  # the sample exercises both outcomes


def test_valid_mask_defaults_and_bad_columns():
    m = valid_mask(LLAMA3_70B, {"tp": np.array([8, 16, 3]), "global_batch": np.array([64] * 3)},
                   None, kv_head_replication=False)
    assert m.tolist() == [True, False, False]
    m = valid_mask(LLAMA3_70B, {"tp": np.array([8, 16, 3]), "global_batch": np.array([64] * 3)}, None)
    assert m.tolist() == [True, True, False]
    assert valid_mask(LLAMA3_70B, {"tp": np.array([8]), "dp": np.array([0]),
                                   "global_batch": np.array([64])}, None).tolist() == [False]
    with pytest.raises(InputError):
        valid_mask(LLAMA3_70B, {"tp": np.array([8]), "gbs": np.array([1])}, None)
    with pytest.raises(InputError):
        valid_mask(LLAMA3_70B, {"tp": np.array([8])}, None)
    # the kv-replication switch also applies to the mask
    m2 = valid_mask(LLAMA3_70B, {"tp": np.array([16]), "global_batch": np.array([64])}, None,
                    kv_head_replication=True)
    assert m2.tolist() == [True]
