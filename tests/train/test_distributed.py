"""2-process gloo runs on CPU: resume reads on rank 0 only, saves survive a short collective timeout."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evalkit.train.loop import train
from tests.train.helpers import losses, micro_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, phases: list[dict], timeout_s: float = 4.0) -> list[dict]:
    """Run tests/train/dist_worker.py on 2 local processes; the per-rank reports, rank 0 first."""
    report_dir = tmp_path / f"reports-{_free_port()}"
    report_dir.mkdir()
    phases = [{**phase, "port": _free_port()} for phase in phases]
    spec = {"phases": phases, "timeout_s": timeout_s, "report_dir": str(report_dir)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "tests.train.dist_worker", json.dumps(spec)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((report_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


READS = {"load_model_state", "load_trainer_state", "load_pretrained", "build_model(weights=True)"}


def test_resume_reads_on_rank0_only_and_a_slow_save_outlasts_the_collective_timeout(tmp_path):
    """bf16, 2 processes, a 4 s collective timeout. One run straight to step 6; one to step 4 whose
    first save on rank 0 takes 8 s, resumed to step 6: the same losses, step by step, and in the
    resumed process rank 1 built its model without weights and read no checkpoint file."""
    sets = ["dtype=bf16", "checkpoint.every=2", "checkpoint.final_count=1"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    phases = [
        {"out": straight, "max_steps": 6, "sets": sets},
        {"out": resumed, "max_steps": 4, "sets": sets, "slow_save_s": 8},
        {"out": resumed, "max_steps": 6, "sets": sets, "resume": True},
        {"out": resumed, "max_steps": 8, "sets": [*sets, "optim.lr=1e-2"], "resume": True},  # refused
    ]
    rank0, rank1 = _torchrun(tmp_path, phases)
    # Rank 0 alone reads and checks the checkpoint; its one-line error stops every rank.
    assert "different config (optim)" in rank0["phases"][3]["error"]
    assert rank1["phases"][3]["error"] == rank0["phases"][3]["error"]
    assert all(p["error"] is None for p in rank0["phases"][:3])
    assert len(losses(straight)) == 6
    assert losses(resumed) == losses(straight)  # exactly equal, step by step
    resume0, resume1 = rank0["phases"][2]["calls"], rank1["phases"][2]["calls"]
    assert "load_trainer_state" in resume0 and not READS & set(resume1), (resume0, resume1)
    assert "build_model(weights=True)" in rank0["phases"][0]["calls"]  # the fresh model: built by rank 0 alone
    assert not READS & set(rank1["phases"][0]["calls"])
    assert rank0["phases"][0]["gathered_dtypes"] == ["torch.bfloat16"]  # the layers' FSDP2 policy
    # One process computes the same steps; the layers' norm weights rounded to bf16 are the difference.
    one = train(micro_config(tmp_path / "one", *sets, max_steps=6), show_progress=False)
    assert losses(straight) == pytest.approx(losses(one), rel=2e-3)
    from safetensors.torch import load_file

    final = Path(resumed) / "step-6"
    assert {t.dtype for t in load_file(str(final / "model.safetensors")).values()} == {torch.bfloat16}
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"


def test_one_process_bf16_checkpoints_evaluate_in_bf16_and_resume_exactly(tmp_path):
    """bf16 run: model.safetensors in bf16 for evaluators; resuming uses the fp32 master weights."""
    sets = ["dtype=bf16", "checkpoint.every=2"]
    straight = train(micro_config(tmp_path / "straight", *sets, max_steps=4), show_progress=False)
    first = train(micro_config(tmp_path / "resumed", *sets, max_steps=2), show_progress=False)
    train(micro_config(first, *sets, max_steps=4), resume=True, show_progress=False)
    assert losses(first) == losses(straight)
    from safetensors.torch import load_file

    from evalkit.train import checkpoint as ckpt

    weights = load_file(str(first / "step-4" / "model.safetensors"))
    master = torch.load(first / "step-4" / ckpt.TRAINER_STATE, weights_only=True)[ckpt.MASTER_WEIGHTS]
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert weights.keys() == master.keys()
    for name, tensor in master.items():
        assert tensor.dtype == torch.float32 and torch.equal(weights[name], tensor.to(torch.bfloat16)), name


@pytest.mark.slow
def test_rank1_load_memory_does_not_grow_with_the_full_state(tmp_path):
    """Peak RSS at the first step of a resumed 2-process run, for a model of 2 and of 26 layers:
    rank 0 grows by at least the full weights and AdamW state it reads (12 bytes a parameter);
    rank 1 by its shards of them (6 bytes a parameter) and slack, well under what it read before
    (the full state, a built model and its shards: more than rank 0). Measured here: full state
    288 MiB, rank 0 +486 MiB, rank 1 +196 MiB."""
    grown = {}
    for layers in (2, 26):
        sets = [f"model.num_layers={layers}", "model.hidden_size=256", "model.intermediate_size=1024",
                "model.num_heads=4", "model.num_kv_heads=4", "checkpoint.every=1",
                "checkpoint.final_count=1"]  # fmt: skip
        out = str(tmp_path / f"layers{layers}")
        _torchrun(tmp_path, [{"out": out, "max_steps": 1, "sets": sets}], timeout_s=60)
        ranks = _torchrun(tmp_path, [{"out": out, "max_steps": 2, "sets": sets, "resume": True}], timeout_s=60)
        grown[layers] = [r["phases"][0]["load_peak_rss_kb"] * 1024 for r in ranks]
    per_layer = 4 * 256 * 256 + 3 * 256 * 1024 + 2 * 256  # attention, MLP, two norms
    full_state = 12 * 24 * per_layer  # the extra 24 layers' fp32 weights and AdamW moments
    rank0, rank1 = (grown[26][r] - grown[2][r] for r in (0, 1))
    mib = 2**20
    print(f"full state {full_state / mib:.0f} MiB; RSS growth rank 0 {rank0 / mib:.0f}, rank 1 {rank1 / mib:.0f} MiB")
    assert rank0 >= full_state
    assert rank1 <= 0.8 * full_state and rank1 < 0.6 * rank0
