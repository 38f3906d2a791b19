"""FSDP2 on one GPU: the trainer in a one-rank process group (NCCL; gloo on a CPU) shards the
model with fully_shard, and 3 steps match the unsharded run's (tests/gpu/fsdp_run.py, in a
process of its own: the process group, and a CUDA error, stay there).

Tolerances. fp32: with one rank FSDP2's all-gather and reduce-scatter are copies and its gradient
division is by 1, so the two runs compute the same operations; only the order of atomic additions
in CUDA backward kernels (the embedding's) may differ, ~1e-7 relative per step: losses within
1e-5 relative and final weights apart by at most 1e-3 of how far the steps moved them. bf16: the
layers' FSDP2 policy casts every weight to bf16 (norm weights too, which autocast leaves fp32 in
the unsharded run): losses within 2e-3 relative, as the 2-process CPU run measured against one
process (tests/train/test_distributed.py), and weights apart by at most 5% of their movement.
A shard that lost its gradients (weights unmoved) or its optimizer state is 100% apart.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = {"fp32": (1e-5, 1e-3), "bf16": (2e-3, 0.05)}  # (losses relative, weights apart per moved)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_rank_fsdp2_matches_the_unsharded_run_for_3_steps(dtype, device, sizes, record, tmp_path):
    steps = 3
    sets = [
        *sizes.fsdp_sets,
        f"dtype={dtype}",
        f"max_steps={steps}",
        "optim.warmup_steps=0",  # full steps from the first: the weights move
        "optim.schedule=constant",
        "checkpoint.every=1",
        "checkpoint.keep_periodic=true",
    ]
    spec = {"device": device, "sets": sets, "out": str(tmp_path)}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run's gloo group, even where CUDA exists
    command = [sys.executable, "-m", "tests.gpu.fsdp_run", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    losses_rel, weights_rel = TOLERANCE[dtype]
    pairs = list(zip(result["losses_sharded"], result["losses_plain"]))
    loss_apart = max(abs(a - b) / abs(b) for a, b in pairs)
    passed = result["sharded_parameters"] == [True, False] and len(pairs) == steps
    passed = passed and loss_apart <= losses_rel and result["weights_apart_per_moved"] <= weights_rel
    record("fsdp2_one_rank", dtype=dtype, steps=steps, **result, loss_max_relative_apart=loss_apart, passed=passed)
    assert result["sharded_parameters"] == [True, False]  # fully_shard ran (DTensors), then did not
    assert len(pairs) == steps and loss_apart <= losses_rel, pairs
    assert result["weights_apart_per_moved"] <= weights_rel, result
