"""Calibration from executor runs (no torch needed): the fit recovers known factors from steps the model
itself generated, refuses too few runs, reads run directories and writes a profile that loads; fp32
training and CPU-host profiles are priced as such."""

from __future__ import annotations

import json

import numpy as np
import pytest

from costmodel.catalog import get_model
from costmodel.estimate import estimate
from costmodel.fit import Measurement
from costmodel.plan import ParallelPlan
from costmodel.profiles import Calibration, InputError, load_cluster, load_profile
from executor.calibrate import calibrate, load_measurement, run_calibrate

LAYOUTS = [dict(dp=4), dict(pp=2, dp=2), dict(pp=2, vpp=2, dp=2), dict(tp=2, dp=2), dict(tp=2, pp=2),
           dict(pp=4), dict(tp=4)]


def host_setup():
    """A 4-'GPU' host: H100 numbers marked as a CPU host (kind host), one node of 4."""
    prof = load_profile("H100").model_copy(update={"kind": "host", "name": "host-test"})
    cluster = load_cluster("h100x512").model_copy(update={"nodes": 1, "gpus_per_node": 4, "nvlink_domain_gpus": 4})
    return prof, cluster


def plans():
    return [ParallelPlan(global_batch=8, micro_batch=1, recompute="none", **kw) for kw in LAYOUTS]


def test_fit_recovers_the_factors_that_generated_the_steps():
    prof, cluster = host_setup()
    model = get_model("small-gpt")
    truth = prof.model_copy(update={"calibration": Calibration(gemm_efficiency=0.8, layer_overhead_s=4e-3)})
    ms = [Measurement(model=model, cluster=cluster, plan=p,
                      step_time_s=estimate(model, cluster, p, profile=truth).step_time_s) for p in plans()]
    fitted, report = calibrate(ms, prof, factors=["gemm_efficiency", "layer_overhead_s"])
    assert report["mape_before"] > 20
    assert report["mape_after"] < 1.0
    assert fitted.calibration.layer_overhead_s == pytest.approx(4e-3, rel=0.05)
    assert len(report["runs"]) == len(LAYOUTS)


def test_too_few_runs_for_the_factors_named_is_refused_and_by_default_fit_as_many_as_runs():
    prof, cluster = host_setup()
    model = get_model("small-gpt")
    ms = [Measurement(model=model, cluster=cluster, plan=p, step_time_s=0.5) for p in plans()[:2]]
    with pytest.raises(InputError, match=r"2 measurement\(s\) for 4 factor\(s\).*need at least 4"):
        calibrate(ms, prof, factors=["gemm_efficiency", "layer_overhead_s", "comm_exposed",
                                     "memory_bound_efficiency"])
    # Without --factors: the first two host factors, recovered from two micro-batch sizes of one layout.
    truth = prof.model_copy(update={"calibration": Calibration(gemm_efficiency=0.8, layer_overhead_s=4e-3)})
    pair = [ParallelPlan(global_batch=8, micro_batch=mb, recompute="none") for mb in (1, 4)]
    ms = [Measurement(model=model, cluster=cluster, plan=p,
                      step_time_s=estimate(model, cluster, p, profile=truth).step_time_s) for p in pair]
    fitted, report = calibrate(ms, prof)
    assert report["factors"] == ["gemm_efficiency", "layer_overhead_s"] and report["mape_after"] < 1.0
    assert fitted.calibration.layer_overhead_s == pytest.approx(4e-3, rel=0.05)
    _, one = calibrate(ms[:1], prof)
    assert one["factors"] == ["gemm_efficiency"]


def test_host_profiles_overlap_nothing():
    prof, cluster = host_setup()
    model = get_model("small-gpt")
    plan = ParallelPlan(tp=4, global_batch=8, micro_batch=1, recompute="none")
    gpu = estimate(model, cluster, plan, profile=prof.model_copy(update={"kind": "gpu"}))
    host = estimate(model, cluster, plan, profile=prof)
    # megatron-core on GPUs hides up to 3/4 of the TP collectives behind the GEMMs (here the GEMMs are
    # shorter than the collectives, so it hides what they last); gloo on CPU processes hides none.
    host_tp, gpu_tp = host.breakdown_s["tp_comm_exposed"], gpu.breakdown_s["tp_comm_exposed"]
    assert gpu_tp < host_tp
    assert gpu_tp >= 0.25 * host_tp * (1 - 1e-9)


def test_fp32_training_uses_fp32_rates_and_bytes():
    cluster = load_cluster("h100x512")
    bf16, fp32 = get_model("8b"), get_model("8b", precision="fp32")
    plan = ParallelPlan(tp=2, dp=256, global_batch=512, micro_batch=1, recompute="none")
    a, b = estimate(bf16, cluster, plan), estimate(fp32, cluster, plan)
    # H100: 67 TFLOP/s fp32 (no tensor cores) against 989 bf16.
    assert b.step_time_s > 8 * a.step_time_s
    # Layer activations double, and so do the logits: Transformer Engine's fused cross-entropy keeps them in
    # the model's dtype (2 B in bf16, 4 B in fp32; costmodel/memory.py LOGITS_BYTES_TE_FUSED).
    ratio = b.memory_breakdown_bytes["activations"] / a.memory_breakdown_bytes["activations"]
    assert ratio == pytest.approx(2.0, rel=1e-9)


def write_run(run, model, plan, cluster, times):
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "step_time_s": t}) + "\n"
                                               for i, t in enumerate(times)))
    (run / "summary.json").write_text(json.dumps({"model": model.model_dump(mode="json"),
                                                  "plan": plan.model_dump(mode="json"),
                                                  "cluster": cluster.model_dump(mode="json")}))


def test_runs_are_read_and_the_calibrated_profile_loads(tmp_path):
    prof, cluster = host_setup()
    model = get_model("small-gpt")
    truth = prof.model_copy(update={"calibration": Calibration(gemm_efficiency=0.9, layer_overhead_s=2e-3)})
    paths = []
    for i, p in enumerate(plans()):
        t = estimate(model, cluster, p, profile=truth).step_time_s
        write_run(tmp_path / f"r{i}", model, p, cluster, [5 * t, t, 1.01 * t, 0.99 * t])   # warm-up first
        paths.append(str(tmp_path / f"r{i}" / "metrics.jsonl"))
    m = load_measurement(paths[0])
    assert m.step_time_s == pytest.approx(estimate(model, cluster, plans()[0], profile=truth).step_time_s)
    src = tmp_path / "host.yaml"
    import yaml

    src.write_text(yaml.safe_dump(json.loads(prof.model_dump_json())))
    out = tmp_path / "host_cal.yaml"
    report = run_calibrate(paths, str(src), str(out), factors=["gemm_efficiency", "layer_overhead_s"])
    assert report["mape_after"] < 2.0
    loaded = load_profile(str(out))
    assert loaded.calibration.layer_overhead_s == pytest.approx(2e-3, rel=0.1)
    assert "plan calibrate" in loaded.calibration.fitted_by
    with pytest.raises(InputError, match="no summary.json"):
        load_measurement(str(tmp_path))
    assert np.isfinite(report["mape_before"])


@pytest.mark.parametrize("summary, metrics, message", [
    ("[1]", None, "summary.json: not an executor summary; expected a JSON object with fields 'model' and 'plan'"),
    ("{nope", None, "summary.json: not an executor summary (malformed JSON"),
    ({"model": {"name": "x"}}, None, "summary.json: 'model': field 'layers': Field required"),
    (None, '{"step": 1, "step_time_s": "fast"}\n', "metrics.jsonl: line 1: field 'step_time_s': expected"),
    (None, '{"step": 1}\n', "metrics.jsonl: line 1: field 'step_time_s': expected"),
    (None, '{"step": 1, "step_time_s": -2}\n', "metrics.jsonl: line 1: field 'step_time_s' = -2.0: expected a time"),
    (None, "\n", "metrics.jsonl: no steps recorded"),
])
def test_a_broken_run_directory_is_a_one_line_error_naming_the_file(tmp_path, summary, metrics, message):
    # These raised TypeError / KeyError / ValueError with a traceback (plan calibrate --measurements RUN_DIR).
    prof, cluster = host_setup()
    run = tmp_path / "r"
    write_run(run, get_model("small-gpt"), plans()[0], cluster, [1.0, 1.0])
    if summary is not None:
        good = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps({**good, **summary}))
    if metrics is not None:
        (run / "metrics.jsonl").write_text(metrics)
    with pytest.raises(InputError) as err:
        load_measurement(str(run))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
