"""A replay of bad inputs through ``planner.cli.main`` in-process: one invocation per class of bad input
(paths, numbers, storage URLs, files that load but describe something impossible, misleading arguments).
Each must end with its documented exit code (2 for input errors; 1 for ``plan check`` on a layout that
does not fit), one line on stderr, and no traceback, within a time limit (no hangs).

``python tests/test_bad_input.py`` prints the tally (clean / traceback / wrong exit / hang) without pytest.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import signal
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.cli import main  # noqa: E402

PUBLISHED = ROOT / "data" / "validation" / "published_runs.csv"
HANG_S = 60

CLUSTER = """\
gpu: H100
nodes: {nodes}
gpus_per_node: {gpn}
{extra}
inter_node:
  nic_bandwidth_bytes_per_s: {nic}
"""

LLAMA = json.loads((ROOT / "examples" / "configs" / "llama3-8b" / "config.json").read_text())
QWEN_MOE = {**LLAMA, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 2048}


def _cluster(nodes="4", gpn="8", extra="", nic="50.0e+9") -> str:
    return CLUSTER.format(nodes=nodes, gpn=gpn, extra=extra, nic=nic)


def _csv(rows: list[dict]) -> str:
    with PUBLISHED.open(newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames
        good = next(r for r in reader if r["source_id"] == "KORTHIKANTI2022" and r["scored"] == "true")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for upd in rows:
        w.writerow({**good, **upd})
    return buf.getvalue()


def _plan_json(drop: str | None = None) -> str:
    from costmodel.catalog import get_model
    from costmodel.plan import ParallelPlan

    plan = ParallelPlan(global_batch=8, micro_batch=1).model_dump()
    if drop:
        plan.pop(drop)
    return json.dumps({"model": get_model("tiny-gpt").model_dump(), "cluster": {}, "plan": plan})


def _files() -> dict[str, str | bytes]:
    return {
        "dup.yaml": _cluster(extra="nodes: 8"),
        "nodes_true.yaml": _cluster(nodes="true"),
        "nodes_float.yaml": _cluster(nodes="4.5"),
        "nodes_big.yaml": _cluster(nodes=str(2**70)),
        "nodes_neg.yaml": _cluster(nodes="-1"),
        "gpn_huge.yaml": _cluster(gpn="1000000"),
        "nvl3.yaml": _cluster(extra="nvlink_domain_gpus: 3"),
        "nvl_big.yaml": _cluster(extra="nvlink_domain_gpus: 64"),
        "nic_inf.yaml": _cluster(nic=".inf"),
        "nic_tiny.yaml": _cluster(nic="1e-30"),
        "nic_nan.yaml": _cluster(nic=".nan"),
        "nic_text.yaml": _cluster(nic="fast"),
        "rails_big.yaml": _cluster(extra="").replace("inter_node:\n", "inter_node:\n  rails: 99999999999999999999999\n"),
        "price_neg.yaml": _cluster(extra="price_per_gpu_hour_usd: -1"),
        "price_inf.yaml": _cluster(extra="price_per_gpu_hour_usd: .inf"),
        "list.yaml": "- 1\n- 2\n",
        "bad.yaml": "gpu: [H100\n",
        "cluster_utf16.yaml": _cluster().encode("utf-16"),
        "cluster_bytes.yaml": bytes(range(256)) * 4,
        "hf_layers_huge/config.json": json.dumps({**LLAMA, "num_hidden_layers": 2**62}),
        "hf_hidden_big/config.json": json.dumps({**LLAMA, "hidden_size": 2**70}),
        "hf_heads30/config.json": json.dumps({**LLAMA, "num_attention_heads": 30, "num_key_value_heads": 10}),
        "hf_moe0/config.json": json.dumps({**QWEN_MOE, "moe_intermediate_size": 0}),
        "hf_mlponly/config.json": json.dumps({**QWEN_MOE, "mlp_only_layers": [0, "a"]}),
        "hf_seq_float/config.json": json.dumps({**LLAMA, "max_position_embeddings": 1e400}),
        "hf_vocab_neg/config.json": json.dumps({**LLAMA, "vocab_size": -5}),
        "hf_utf16/config.json": json.dumps(LLAMA).encode("utf-16"),
        "hf_bytes/config.json": bytes(range(256)) * 4,
        "hf_list.json": "[1, 2]",
        "routing_utf16.json": json.dumps({"moe_routing_histogram": [[1] * 128] * 48}).encode("utf-16"),
        "routing_bytes.json": bytes(range(256)) * 4,
        "routing_nan.json": '{"moe_routing_histogram": [[NaN, 1]]}',
        "routing_neg.json": json.dumps({"moe_routing_histogram": [[-1] * 128]}),
        "routing_text.json": json.dumps({"moe_routing_histogram": [["a"] * 128]}),
        "header.csv": _csv([]).splitlines()[0] + "\n",
        "text.csv": _csv([{"layers": "many"}]),
        "tp0.csv": _csv([{"tp": "0"}]),
        "step0.csv": _csv([{"step_time_s": "0"}]),
        "stepnan.csv": _csv([{"step_time_s": "nan"}]),
        "csv_utf16.csv": _csv([{}]).encode("utf-16"),
        "csv_bytes.csv": bytes(range(256)) * 4,
        "plan_number.json": "42",
        "plan_string.json": '"plan"',
        "plan_no_tp.json": _plan_json(drop="tp"),
        "plan_bytes.json": bytes(range(256)) * 4,
        "plan_dir/x": "",
        "good.csv": _csv([{}]),
        "adir/x": "",
    }


C = ["--model", "70b", "--cluster"]
M = [*C, "h100x512"]
CHECK = ["check", *M, "--tp", "8", "--pp", "4"]
CAP = ["capacity", "--model", "70b", "--tokens", "15T", "--cluster", "h100x512"]
MOE = ["--model", "qwen3-30b-a3b", "--cluster", "h100x512"]
HF = ["--cluster", "h100x512", "--model"]

# (label, argv with {d} for the files' directory, expected exit code)
CASES: list[tuple[str, list[str], int]] = [
    # paths
    ("cluster is a directory", [*C, "{d}/adir"], 2),
    ("cluster yaml is a list", [*C, "{d}/list.yaml"], 2),
    ("cluster yaml malformed", [*C, "{d}/bad.yaml"], 2),
    ("cluster utf-16", [*C, "{d}/cluster_utf16.yaml"], 2),
    ("cluster random bytes", [*C, "{d}/cluster_bytes.yaml"], 2),
    ("validate a directory", ["validate", "{d}/adir"], 2),
    ("validate --json directory", ["validate", "{d}/good.csv", "--json", "{d}/adir"], 2),
    ("validate --plot /proc", ["validate", "{d}/good.csv", "--plot", "/proc/x.png"], 2),
    ("validate --plot directory", ["validate", "{d}/good.csv", "--plot", "{d}/adir"], 2),
    ("validate --plot is --json", ["validate", "{d}/good.csv", "--plot", "{d}/v.out", "--json", "{d}/v.out"], 2),
    ("capacity --plot /proc", [*CAP, "--plot", "/proc/x.png"], 2),
    ("capacity --plot directory", [*CAP, "--plot", "{d}/adir"], 2),
    ("search --out is a file", [*M, "--out", "{d}/good.csv"], 2),
    ("routing utf-16", [*MOE, "--routing", "{d}/routing_utf16.json"], 2),
    ("routing random bytes", [*MOE, "--routing", "{d}/routing_bytes.json"], 2),
    ("routing NaN", [*MOE, "--routing", "{d}/routing_nan.json"], 2),
    ("routing negative", [*MOE, "--routing", "{d}/routing_neg.json"], 2),
    ("routing text", [*MOE, "--routing", "{d}/routing_text.json"], 2),
    ("hf utf-16", [*HF, "{d}/hf_utf16/config.json"], 2),
    ("hf random bytes", [*HF, "{d}/hf_bytes/config.json"], 2),
    ("hf a list", [*HF, "{d}/hf_list.json"], 2),
    # numbers in arguments
    ("check --tp 0", [*CHECK[:-4], "--tp", "0"], 2),
    ("check --pp 0", [*CHECK[:-4], "--pp", "0"], 2),
    ("check --cp 0", [*CHECK[:-4], "--cp", "0"], 2),
    ("check --dp 0", [*CHECK, "--dp", "0"], 2),
    ("check --micro-batch 0", [*CHECK, "--micro-batch", "0"], 2),
    ("check --tp huge", [*CHECK[:-4], "--tp", str(2**70)], 2),
    ("search --global-batch 0", [*M, "--global-batch", "0"], 2),
    ("search --global-batch -1", [*M, "--global-batch", "-1"], 2),
    ("search --seq-len 0", [*M, "--seq-len", "0"], 2),
    ("search --top 0", [*M, "--top", "0"], 2),
    ("search --top -5", [*M, "--top", "-5"], 2),
    ("search --trials 0", [*M, "--trials", "0"], 2),
    ("search --timeout 0", [*M, "--sampler", "tpe", "--timeout", "0"], 2),
    ("search --workers 0", [*M, "--sampler", "tpe", "--workers", "0"], 2),
    ("capacity --global-batch 0", [*CAP, "--global-batch", "0"], 2),
    # numbers in files
    ("hf num_hidden_layers 2**62", [*HF, "{d}/hf_layers_huge/config.json"], 2),
    ("hf hidden beyond int64", [*HF, "{d}/hf_hidden_big/config.json"], 2),
    ("hf 30 heads on 4096", [*HF, "{d}/hf_heads30/config.json"], 2),
    ("hf moe_intermediate_size 0", [*HF, "{d}/hf_moe0/config.json"], 2),
    ("hf mlp_only_layers [0, 'a']", [*HF, "{d}/hf_mlponly/config.json"], 2),
    ("hf max_position_embeddings 1e400", [*HF, "{d}/hf_seq_float/config.json"], 2),
    ("hf vocab -5", [*HF, "{d}/hf_vocab_neg/config.json"], 2),
    ("cluster nodes beyond int64", [*C, "{d}/nodes_big.yaml"], 2),
    ("cluster nodes -1", [*C, "{d}/nodes_neg.yaml"], 2),
    ("cluster rails beyond int64", [*C, "{d}/rails_big.yaml"], 2),
    # files that load but describe something impossible
    ("cluster duplicate key", [*C, "{d}/dup.yaml"], 2),
    ("cluster nodes: true", [*C, "{d}/nodes_true.yaml"], 2),
    ("cluster nodes: 4.5", [*C, "{d}/nodes_float.yaml"], 2),
    ("cluster gpus_per_node 1e6", [*C, "{d}/gpn_huge.yaml"], 2),
    ("cluster nvlink 3 of 8", [*C, "{d}/nvl3.yaml"], 2),
    ("cluster nvlink > cluster", [*C, "{d}/nvl_big.yaml"], 2),
    ("cluster nic .inf", [*C, "{d}/nic_inf.yaml"], 2),
    ("cluster nic 1e-30", [*C, "{d}/nic_tiny.yaml"], 2),
    ("cluster nic .nan", [*C, "{d}/nic_nan.yaml"], 2),
    ("cluster nic text", [*C, "{d}/nic_text.yaml"], 2),
    ("cluster price -1", [*C, "{d}/price_neg.yaml"], 2),
    ("cluster price .inf", [*C, "{d}/price_inf.yaml"], 2),
    # CSV reader
    ("validate header-only csv", ["validate", "{d}/header.csv"], 2),
    ("validate text in layers", ["validate", "{d}/text.csv"], 2),
    ("validate tp=0", ["validate", "{d}/tp0.csv"], 2),
    ("validate step time 0", ["validate", "{d}/step0.csv"], 2),
    ("validate step time nan", ["validate", "{d}/stepnan.csv"], 2),
    ("validate utf-16 csv", ["validate", "{d}/csv_utf16.csv"], 2),
    ("validate random bytes", ["validate", "{d}/csv_bytes.csv"], 2),
    # storage
    ("storage notadb://x", [*M, "--storage", "notadb://x"], 2),
    ("storage sqlite in a missing dir", [*M, "--storage", "sqlite:////nonexistent/x.db"], 2),
    # misleading
    ("check --group on a plain cluster", [*CHECK, "--group", "h100"], 2),
    ("check --group unknown", ["check", "--model", "13b", "--cluster", "a100-v100-mixed", "--tp", "2",
                               "--group", "h100"], 2),
    ("check a layout that does not fit", ["check", *M, "--tp", "1", "--pp", "1", "--recompute", "none"], 1),
    # plan.json reader (plan run fails before any process starts)
    ("run plan.json a number", ["run", "{d}/plan_number.json", "--run-dir", "{d}/r1", "--steps", "1"], 2),
    ("run plan.json a string", ["run", "{d}/plan_string.json", "--run-dir", "{d}/r2", "--steps", "1"], 2),
    ("run plan.json a directory", ["run", "{d}/plan_dir", "--run-dir", "{d}/r3", "--steps", "1"], 2),
    ("run plan.json without tp", ["run", "{d}/plan_no_tp.json", "--run-dir", "{d}/r4", "--steps", "1",
                                  "--timeout", "30"], 2),
    ("run plan.json random bytes", ["run", "{d}/plan_bytes.json", "--run-dir", "{d}/r5", "--steps", "1"], 2),
]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def make_files(d: Path) -> None:
    for name, content in _files().items():
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def replay(argv: list[str], d: Path) -> tuple[int | None, str, str]:
    """(exit code or None, stderr, verdict) of one invocation: verdict is clean, traceback, hang or the
    exit code seen."""
    argv = [a.replace("{d}", str(d)) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:   # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
    except _Hang:
        return None, err.getvalue(), "hang"
    except BaseException:   # noqa: BLE001 - the point is to count them
        return None, err.getvalue() + traceback.format_exc(), "traceback"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    return rc, text, ("traceback" if "Traceback" in text else "ran")


def verdict(rc, err: str, kind: str, expected: int) -> str:
    if kind != "ran":
        return kind
    if rc == 0 and expected != 0:
        return "wrong success"
    if rc != expected:
        return f"wrong exit {rc}"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("note:")]
    if expected == 2 and (len(lines) != 1 or not lines[0].startswith("plan")):
        return f"{len(lines)} lines"
    return "clean"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    make_files(d)
    return d


@pytest.mark.parametrize("label,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_replay(files, label, argv, expected):
    rc, err, kind = replay(argv, files)
    assert verdict(rc, err, kind, expected) == "clean", f"{label}: rc={rc}\n{err}"
    if expected == 2:
        line = [ln for ln in err.splitlines() if ln.strip()][0]
        assert len(line) < 600, line


if __name__ == "__main__":
    import tempfile
    from collections import Counter

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_files(d)
        tally = Counter()
        for label, argv, expected in CASES:
            rc, err, kind = replay(argv, d)
            v = verdict(rc, err, kind, expected)
            tally[v.split()[0] if v.startswith("wrong exit") else v] += 1
            last = (err.strip().splitlines() or [""])[-1][:150]
            print(f"{v:14s} {label:36s} rc={rc} {last}", flush=True)
        print(f"{len(CASES)} cases: " + ", ".join(f"{k} {v}" for k, v in tally.most_common()))


# Without the executor extra ---------------------------------------------------------------------------

HIDE_TORCH = '''\
# torch and megatron are not found, exactly as when they are not installed
import sys


class _Hide:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "megatron"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Hide(f) if getattr(f, "__name__", "") == "PathFinder" else f for f in sys.meta_path]
'''


@pytest.mark.parametrize("argv", [
    ["run", "{d}/plan.json", "--run-dir", "{d}/never"],
    ["profile", "--out", "{d}/p.yaml", "--quick"],
    ["autotune", "--model", "tiny-gpt", "--cluster", "h100x512", "--run-dir", "{d}/never"],
], ids=["run", "profile", "autotune"])
def test_executor_commands_without_torch_say_what_to_install(tmp_path, argv):
    import os
    import subprocess

    (tmp_path / "sitecustomize.py").write_text(HIDE_TORCH)
    (tmp_path / "plan.json").write_text(_plan_json())
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *[a.replace("{d}", str(tmp_path)) for a in argv]],
                          env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert lines == [f'plan: error: plan {argv[0]} needs the executor extra (' + lines[0].split("(", 1)[1]]
    assert lines[0].endswith('not installed): pip install -e ".[executor]"'), lines[0]
    assert "torch" in lines[0] and not (tmp_path / "never").exists() and not (tmp_path / "p.yaml").exists()
