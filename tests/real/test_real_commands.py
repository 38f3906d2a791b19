"""Every evaluation command on the real model, as a user types it after `evalkit import`."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real


def evalkit(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "evalkit.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_ruler_niah_single_1_at_1k_retrieves(smollm2, tmp_path):
    """A real 135M model finds one needle in 1K tokens (measured: 20 of 20). A broken prompt,
    tokenizer, sizing, cache or decoding loop shows here as a collapse, not as a small drift."""
    out = tmp_path / "ruler"
    result = evalkit("ruler", "--ckpts", str(smollm2), "--lengths", "1k", "--tasks", "niah_single_1",
                     "--samples", "20", "--batch-size", "4", "--dtype", "fp32", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (summary_path,) = out.glob("*/*/ruler-summary.json")
    summary = json.loads(summary_path.read_text())
    (row,) = summary["rows"]
    assert (row["task"], row["length"], row["n"]) == ("niah_single_1", 1024, 20)
    assert row["value"] >= 90, row
    assert summary["provenance"]["checkpoint_meta"]["source"]["kind"] == "gguf-import"


def test_probe_shift_runs_on_the_real_model(smollm2, tmp_path):
    result = evalkit(
        "probe", "shift", "--ckpt", str(smollm2), "--seq", "512", "--n", "2", "--delta1", "0,32", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    stored = json.loads((tmp_path / "probe-shift.json").read_text())
    values = {(r["dtype"], r["delta1"]): r["value"] for r in stored["rows"] if r["rope"] == "cast"}
    assert values["bf16", 0] > 10 * values["fp32", 0] > 0  # the paper's first observation, on a real model
    assert stored["provenance"]["seq_len"] == 512


def test_general_fixtures_run_through_lm_eval(smollm2, tmp_path):
    out = tmp_path / "general"
    result = evalkit("general", "--ckpts", str(smollm2), "--tasks", "evalkit_fixture_hellaswag_style",
                     "--limit", "8", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (summary_path,) = out.glob("*/*/general-summary.json")
    rows = json.loads(summary_path.read_text())["rows"]
    assert {row["metric"] for row in rows} == {"acc", "acc_norm"}
    assert all(row["n"] == 8 and 0 <= row["value"] <= 1 for row in rows)
