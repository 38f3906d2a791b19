"""A cold 64K static BlockMask build (the anchor paradigm's, as training builds it) in a process
of its own under a time limit: the build's seconds, or "timed out after N s" (pytorch#182060: a
multi-minute Inductor compile on torch <= 2.12). The mask's kept blocks must equal the reference
mask's (tests/gpu/mask_build.py). The dry run builds a short mask eagerly on the CPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_a_cold_static_block_mask_build(device, sizes, record):
    command = [sys.executable, "-m", "tests.gpu.mask_build", str(sizes.mask_length), device]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    limit = sizes.mask_limit_s
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        record("block_mask_build", seq_len=sizes.mask_length, outcome=f"timed out after {limit:.0f} s", passed=False)
        raise AssertionError(
            f"a cold {sizes.mask_length}-token BlockMask build timed out after {limit:.0f} s"
        ) from None
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    passed = result["blocks_differing"] == 0
    record("block_mask_build", seq_len=sizes.mask_length, **result, outcome=f"{result['cold_s']:.1f} s", passed=passed)
    assert passed, result
