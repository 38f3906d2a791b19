"""The GPU checks' harness (tests/gpu/conftest.py), run on the CPU: a failing check costs its own
row only and leaves its error whole, every row is on disk before the next check starts, a CUDA
error is named by the failures after it, and no check starts after the budget."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.conftest import ABSENT_ON_THE_IMAGE, RESULTS
from tests.gpu.results import read_results

ROOT = Path(__file__).resolve().parents[2]
KERNELS = "tests/gpu/test_vllm_kernels.py"
# A plugin for the run under test: the cache-layout learner dies with a CUDA error, and the timed
# prefill runs out of memory (the timing test comes two checks after the layout's).
RAISING = """
import torch

def pytest_configure(config):
    from tests.gpu import serving

    def illegal_access(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\\nCompile with TORCH_USE_CUDA_DSA")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 GiB")

    serving.learn_layout = illegal_access
    serving.time_prefill = out_of_memory
"""


def _pytest(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"}
    env["EVALKIT_GPU_DRY_RUN"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--gpu-out", str(out)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    return done, read_results(out / RESULTS)


def _outcomes(rows: list[dict]) -> dict[str, dict]:
    return {row["test"].split("::")[1]: row for row in rows if row["kind"] == "outcome"}


def test_a_failing_check_costs_its_own_row_and_its_error_is_kept_whole(tmp_path):
    (tmp_path / "raising_kernels.py").write_text(RAISING)
    done, rows = _pytest(tmp_path, "-p", "raising_kernels", KERNELS)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert rows[0]["kind"] == "machine"
    outcomes = _outcomes(rows)
    layout = outcomes["test_the_flash_cache_layout_is_read_through_the_workspace"]
    assert layout["outcome"] == "failed"
    # whole: both lines of the message, and the traceback down to the raising frame
    assert "an illegal memory access was encountered" in layout["error"] and "TORCH_USE_CUDA_DSA" in layout["error"]
    assert "raising_kernels.py" in layout["error"] and "check_flash_layout" in layout["error"]
    # the checks before and after it ran, their rows written
    assert [row["passed"] for row in rows if row["kind"] == "vllm_kernel_correctness"] == [True] * 12
    assert outcomes["test_a_long_run_stays_under_the_recompile_limit"]["outcome"] == "passed"
    assert any(row["kind"] == "vllm_long_run" for row in rows)
    timing = outcomes["test_prefill_timing_anchor_against_causal"]
    assert "Tried to allocate 256.00 GiB" in timing["error"]
    assert timing["after_cuda_error"].endswith("test_the_flash_cache_layout_is_read_through_the_workspace")
    assert "after_cuda_error" not in outcomes["test_a_long_run_stays_under_the_recompile_limit"]  # passed


def test_no_check_starts_after_the_budget_and_an_earlier_results_file_is_refused(tmp_path):
    done, rows = _pytest(tmp_path, "--gpu-budget-s", "0.5", KERNELS)  # the first check takes longer
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = list(_outcomes(rows).values())
    assert outcomes[0]["outcome"] == "passed" and len(outcomes) == 6
    assert all(row["outcome"] == "skipped" and row["reason"] == "deadline" for row in outcomes[1:])
    again, _ = _pytest(tmp_path, KERNELS)  # the same --gpu-out
    assert again.returncode != 0 and "give a new --gpu-out" in again.stderr


@pytest.mark.gpu
def test_the_dry_run_cannot_import_what_the_gpu_image_lacks(device):
    if device == "cuda":
        pytest.skip("the dry run's guard")
    for name in ABSENT_ON_THE_IMAGE:
        with pytest.raises(ImportError):
            __import__(name)
