"""The executor's data sources without torch: a user's token file is windowed by global sample number, and
bad files get one-line errors naming the file."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.profiles import InputError
from executor.data import TokenFile, microbatches


def test_token_file_windows_follow_the_sample_number(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16) % 97
    np.save(tmp_path / "t.npy", tokens)
    src = TokenFile(str(tmp_path / "t.npy"), seq_len=16, vocab=128)
    np.testing.assert_array_equal(src.sample(0), tokens[:17])
    np.testing.assert_array_equal(src.sample(3), tokens[48:65])
    span = 1000 - 16 - 1
    np.testing.assert_array_equal(src.sample(100), tokens[(100 * 16) % span:(100 * 16) % span + 17])
    tokens.tofile(tmp_path / "t.bin")
    raw = TokenFile(str(tmp_path / "t.bin"), seq_len=16, vocab=128, dtype="uint16")
    np.testing.assert_array_equal(raw.sample(5), src.sample(5))
    x, y = next(microbatches(src, step=1, global_batch=4, dp=2, dp_rank=1, micro_batch=2))
    np.testing.assert_array_equal(x[0], tokens[6 * 16: 6 * 16 + 16])       # sample 4 + 2 = 6
    np.testing.assert_array_equal(y[0], tokens[6 * 16 + 1: 6 * 16 + 17])


def test_bad_token_files_are_refused(tmp_path):
    with pytest.raises(InputError, match=r"missing.npy: data file not found"):
        TokenFile(str(tmp_path / "missing.npy"), seq_len=8, vocab=10)
    np.save(tmp_path / "big.npy", np.array([1, 2, 300] * 10))
    with pytest.raises(InputError, match=r"big.npy: token id 300 is outside the model's vocabulary of 256"):
        TokenFile(str(tmp_path / "big.npy"), seq_len=8, vocab=256)
    np.save(tmp_path / "short.npy", np.arange(5))
    with pytest.raises(InputError, match=r"short.npy: need a 1-D array of at least seq_len \+ 2 = 10 tokens"):
        TokenFile(str(tmp_path / "short.npy"), seq_len=8, vocab=256)


def test_plan_run_refuses_bad_plans_with_one_line(tmp_path, capsys):
    from planner.cli import main

    (tmp_path / "junk.json").write_text("{nope")
    assert main(["run", str(tmp_path / "junk.json"), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("plan: error: ") and "junk.json: line 1 column 2: malformed JSON" in err and "\n" not in err
    assert main(["run", str(tmp_path / "none.json"), "--run-dir", str(tmp_path / "r")]) == 2
    assert "none.json: plan file not found" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
