"""`evalkit ruler --engine vllm` end to end on a tiny checkpoint: the same answers as `--engine hf`.

Runs the real command in a subprocess (vLLM starts its own processes; the CLI must be safe
to spawn from). Needs vLLM.
"""

import json
import subprocess
import sys

from .conftest import requires_vllm

pytestmark = requires_vllm


def run_ruler(checkpoint, out, engine: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", str(checkpoint), "--engine", engine,
               "--lengths", "512", "--tasks", "niah_single_1", "--samples", "3", "--out", str(out)]  # fmt: skip
    return subprocess.run(command, check=False, cwd=out.parent, capture_output=True, text=True, timeout=600)


def predictions(out) -> list[str]:
    (log,) = out.glob("**/ruler/niah_single_1/512.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [record["prediction"] for record in sorted(records, key=lambda r: r["index"])]


def test_ruler_command_with_the_vllm_engine(checkpoint, tmp_path):
    vllm_out, hf_out = tmp_path / "vllm", tmp_path / "hf"
    result = run_ruler(checkpoint, vllm_out, "vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    (summary_path,) = vllm_out.glob("**/ruler-summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["provenance"]["engine"]["engine"] == "vllm"
    assert [(row["task"], row["length"], row["n"]) for row in summary["rows"]] == [("niah_single_1", 512, 3)]
    assert run_ruler(checkpoint, hf_out, "hf").returncode == 0
    assert predictions(vllm_out) == predictions(hf_out)


def run_general(checkpoint, out, engine: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "evalkit.cli", "general", "--ckpts", str(checkpoint), "--engine", engine,
               "--tasks", "evalkit_fixture_hellaswag_style,evalkit_fixture_mmlu_style_arithmetic", "--limit", "4",
               "--out", str(out)]  # fmt: skip
    return subprocess.run(command, check=False, cwd=out.parent, capture_output=True, text=True, timeout=600)


def scores(out) -> list[tuple]:
    (summary_path,) = out.glob("**/general-summary.json")
    summary = json.loads(summary_path.read_text())
    return summary, sorted((row["task"], row["metric"], row["n"], row["value"]) for row in summary["rows"])


def test_general_command_with_the_vllm_engine(checkpoint, tmp_path):
    """lm-eval's log-likelihood tasks through the vllm engine score as through the hf engine."""
    vllm_out, hf_out = tmp_path / "vllm", tmp_path / "hf"
    result = run_general(checkpoint, vllm_out, "vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    assert run_general(checkpoint, hf_out, "hf").returncode == 0
    vllm_summary, vllm_scores = scores(vllm_out)
    assert vllm_summary["provenance"]["engine"]["engine"] == "vllm"
    assert vllm_scores == scores(hf_out)[1] and len(vllm_scores) >= 3


def test_a_truncated_checkpoint_is_one_line_before_vllm_starts(checkpoint, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    result = run_ruler(broken, tmp_path / "out", "vllm")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "model.safetensors is truncated or corrupt" in line
    assert not list((tmp_path / "out").rglob("*.jsonl"))
