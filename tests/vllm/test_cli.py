"""`evalkit ruler --engine vllm` end to end on a tiny checkpoint: the same answers as `--engine hf`.

Runs the real command in a subprocess (vLLM starts its own processes; the CLI must be safe
to spawn from). Needs vLLM.
"""

import json
import subprocess
import sys

from .conftest import requires_vllm

pytestmark = requires_vllm


def run_ruler(checkpoint, out, engine: str, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", str(checkpoint), "--engine", engine,
               "--lengths", "512", "--tasks", "niah_single_1", "--samples", "3", "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(command, check=False, cwd=out.parent, capture_output=True, text=True, timeout=600)


def predictions(out, log_name: str = "512.jsonl") -> list[str]:
    (log,) = out.glob(f"**/ruler/niah_single_1/{log_name}")
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


def test_anchor_encoding_with_the_vllm_engine_answers_as_the_hf_engine(checkpoint, tmp_path):
    """--encoding anchor: vLLM's packed requests (evalkit's backend) give the hf engine's answers,
    which tests/ruler/test_encoding.py holds to greedy decoding under the reference mask."""
    vllm_out, hf_out = tmp_path / "vllm", tmp_path / "hf"
    anchor = ("--encoding", "anchor", "--doc-tokens", "64")
    result = run_ruler(checkpoint, vllm_out, "vllm", *anchor)
    assert result.returncode == 0, result.stderr[-3000:]
    assert run_ruler(checkpoint, hf_out, "hf", *anchor).returncode == 0
    (summary_path,) = vllm_out.glob("**/ruler-summary.json")
    (row,) = json.loads(summary_path.read_text())["rows"]
    assert row["encoding"] == "anchor" and row["documents"] > 2
    assert predictions(vllm_out, "512.anchor-64.jsonl") == predictions(hf_out, "512.anchor-64.jsonl")


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


def engine_core_pids() -> set[int]:
    """Processes vLLM names VLLM::EngineCore (its engine-core and worker processes set their titles)."""
    from pathlib import Path

    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"VLLM::"):
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def test_sigterm_stops_vllm_processes_with_the_command(checkpoint, tmp_path):
    """`kill` (SIGTERM) mid-evaluation: the command exits 143 and leaves no vLLM process running."""
    import signal
    import time

    before = engine_core_pids()
    out = tmp_path / "out"
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", str(checkpoint), "--engine", "vllm",
               "--lengths", "512,1024", "--tasks", "all", "--samples", "40", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (engine_core_pids() - before) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(1)
    assert engine_core_pids() - before, "vLLM never started"
    time.sleep(5)  # well into the engine's start-up or first requests
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=180) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while (engine_core_pids() - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not (engine_core_pids() - before), "vLLM processes outlived the command"
