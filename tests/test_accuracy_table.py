"""scripts/accuracy_table.py: the README's one-run calibration split by what differs between the calibrating
run and the predicted one."""

from __future__ import annotations

import math

from script_module import load_script


def test_one_run_pairs_split_by_scale_and_release(capsys):
    rows = {0: {"num_gpus": 8, "release": "25.09"}, 1: {"num_gpus": 64, "release": "25.09"},
            2: {"num_gpus": 8, "release": "26.02"}, 3: {"num_gpus": 8, "release": "25.09"},
            10: {"num_gpus": 64, "release": ""}, 11: {"num_gpus": 16, "release": ""}}
    # Predicted / published = exp(-log_residual): 1.1, 0.8, 1.05 in the first group, 0.98 in the second.
    residuals = [{"row": r, "log_residual": -math.log(x)} for r, x in ((1, 1.1), (2, 0.8), (3, 1.05), (11, 0.98))]
    same_model = {"groups": [{"anchor_row": 0, "after": {"count": 3}}, {"anchor_row": 10, "after": {"count": 1}}],
                  "residuals": residuals}
    load_script("accuracy_table").one_run_split(same_model, rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| as many GPUs, another release | 1 | 20.0 | 20.0 |",
                         "| as many GPUs, same release | 1 | 5.0 | 5.0 |",
                         "| fewer GPUs, same release | 1 | 2.0 | 2.0 |",
                         "| more GPUs, same release | 1 | 10.0 | 10.0 |"]
