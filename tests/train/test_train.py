"""Training end to end on a micro model: loss falls, checkpoints load, resume is exact, FSDP agrees."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evalkit.attention import Paradigm
from evalkit.errors import UserError
from evalkit.train import checkpoint as ckpt
from evalkit.train import load_recipe
from evalkit.train.checkpoint import complete_checkpoints, load_model_state
from evalkit.train.loop import train
from tests.train.helpers import losses, micro_args, micro_config

EVALKIT = [sys.executable, "-m", "evalkit.cli"]


def test_loss_falls_and_checkpoints_load_and_generate(tmp_path):
    run = train(micro_config(tmp_path / "run", max_steps=30, paradigm="anchor"), show_progress=False)
    values = losses(run)
    assert len(values) == 30
    assert sum(values[-5:]) / 5 < sum(values[:5]) / 5 - 0.5
    # The evaluation window (last 2, 2 apart) is kept; resume-only checkpoints are pruned.
    assert [step for step, _ in ckpt.complete_checkpoints(run)] == [28, 30]
    assert not (run / "step-28" / ckpt.TRAINER_STATE).exists() and (run / "step-30" / ckpt.TRAINER_STATE).exists()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run / "step-30")
    tok = AutoTokenizer.from_pretrained(run / "step-30")
    ids = tok("Note that the number for", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 5
    meta = json.loads((run / "step-30" / "meta.json").read_text())
    assert meta["step"] == 30 and meta["paradigm"] == "anchor" and meta["tokens_seen"] == 30 * 4 * 128
    assert meta["config"]["seq_len"] == 128 and len(meta["data_fingerprint"]) == 16 and "git_hash" in meta


@pytest.mark.parametrize("paradigm", [p.value for p in Paradigm])
def test_every_paradigm_trains(paradigm, tmp_path):
    run = train(micro_config(tmp_path / paradigm, paradigm=paradigm, max_steps=3), show_progress=False)
    values = losses(run)
    assert len(values) == 3 and all(v == v and 0 < v < 20 for v in values)
    assert json.loads((run / "step-3" / "meta.json").read_text())["paradigm"] == paradigm


def test_existing_run_needs_resume(tmp_path):
    config = micro_config(tmp_path / "run", max_steps=2)
    train(config, show_progress=False)
    with pytest.raises(UserError, match="--resume"):
        train(config, show_progress=False)
    changed = micro_config(tmp_path / "run", "optim.lr=1e-2", max_steps=4)
    with pytest.raises(UserError, match="different config \\(optim\\)"):
        train(changed, resume=True, show_progress=False)


def test_a_run_saved_before_a_setting_existed_still_resumes(tmp_path):
    """Checkpoints written before evalkit gained a setting lack it; it takes its default."""
    run = train(micro_config(tmp_path / "run", max_steps=2), show_progress=False)
    for _, path in ckpt.complete_checkpoints(run):
        meta = json.loads((path / ckpt.META).read_text())
        del meta["config"]["data"]["retrieval_phrasing"]  # as written by an older evalkit
        (path / ckpt.META).write_text(json.dumps(meta))
    train(micro_config(run, max_steps=4), resume=True, show_progress=False)
    assert [s for s, _ in ckpt.complete_checkpoints(run)][-1] == 4
    with pytest.raises(UserError, match="different config \\(data\\)"):  # a changed value still refuses
        train(micro_config(run, "data.retrieval_phrasing=varied", max_steps=6), resume=True, show_progress=False)


@pytest.mark.parametrize("dtype", ["fp32", "bf16_full"])
def test_killed_run_resumes_to_identical_losses(dtype, tmp_path):
    """SIGKILL a training process mid-run, resume it, and compare every step's loss (bf16_full:
    the fp32 masters and AdamW state travel in the trainer state)."""
    steps = 12
    sets = ["checkpoint.every=3", f"dtype={dtype}"]
    reference = train(micro_config(tmp_path / "straight", *sets, max_steps=steps), show_progress=False)
    run_dir = tmp_path / "killed"
    args = micro_args(run_dir, *sets, max_steps=steps)
    proc = subprocess.Popen([*EVALKIT, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(losses(run_dir) if (run_dir / "metrics.jsonl").exists() else []) >= 7:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = losses(run_dir)
    assert 7 <= len(partial) < steps
    train(micro_config(run_dir, *sets, max_steps=steps), resume=True, show_progress=False)
    assert losses(run_dir) == losses(reference)  # exactly equal, step by step
    assert [s for s, _ in ckpt.complete_checkpoints(run_dir)] == [10, 12]


def test_kill_during_save_leaves_no_complete_looking_checkpoint(tmp_path, monkeypatch):
    config = micro_config(tmp_path / "run", "checkpoint.every=2", max_steps=4)
    real_save = torch.save
    calls = {"n": 0}

    def dying_save(obj, file, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint dies half-written
            file.write(b"partial")
            raise KeyboardInterrupt
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train(config, show_progress=False)
    monkeypatch.setattr(torch, "save", real_save)
    run = Path(config.out)
    assert [s for s, _ in ckpt.complete_checkpoints(run)] == [2]
    assert not (run / ".step-4.tmp").exists() and not (run / "step-4").exists()  # Ctrl-C cleans up
    (run / ".step-4.tmp").mkdir()  # what a SIGKILL mid-save leaves, which nothing could clean then
    (run / ".step-4.tmp" / ckpt.TRAINER_STATE).write_bytes(b"partial")
    train(config, resume=True, show_progress=False)
    assert not (run / ".step-4.tmp").exists()
    assert [s for s, _ in ckpt.complete_checkpoints(run)] == [2, 4]


def test_two_process_fsdp_matches_one_process(tmp_path):
    """torchrun, 2 CPU processes, gloo, FSDP2: the same losses as 1 process on the same global batch."""
    steps = 3
    single = train(micro_config(tmp_path / "one", max_steps=steps), show_progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533", "-m",
           "evalkit.cli", *micro_args(tmp_path / "two", max_steps=steps)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(tmp_path / "two") == pytest.approx(losses(single), rel=1e-5)
    two_meta = json.loads((tmp_path / "two" / f"step-{steps}" / "meta.json").read_text())
    assert two_meta["world_size"] == 2
    from safetensors.torch import load_file

    a = load_file(str(single / f"step-{steps}" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / f"step-{steps}" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_changes_nothing_and_bf16_trains(tmp_path):
    plain = train(micro_config(tmp_path / "plain", max_steps=2), show_progress=False)
    recomputed = train(micro_config(tmp_path / "gc", "grad_checkpointing=true", max_steps=2), show_progress=False)
    assert losses(recomputed) == pytest.approx(losses(plain), rel=1e-6)
    bf16 = train(micro_config(tmp_path / "bf16", "dtype=bf16", max_steps=2), show_progress=False)
    assert losses(bf16) == pytest.approx(losses(plain), rel=0.05)  # same model, bf16 compute
    assert losses(bf16) != losses(plain)


def test_rope_precision_is_recorded_in_each_checkpoint_and_changes_the_run(tmp_path):
    """The paper's variable: rotating in bf16 (its released code) is another run than in fp32."""
    runs = {
        rope: train(
            micro_config(tmp_path / rope, "dtype=bf16", f"rope_precision={rope}", max_steps=2), show_progress=False
        )
        for rope in ("fp32", "bf16")
    }
    for rope, run in runs.items():
        (_, checkpoint), *_ = complete_checkpoints(run)
        meta = json.loads((checkpoint / ckpt.META).read_text())
        precision = meta["precision"]
        assert (precision["dtype"], precision["rope"], precision["rotation"]) == ("bf16", rope, rope)
        assert precision["residual"] == precision["buffers"] == "fp32"  # autocast: fp32 weights and residual
        assert meta["config"]["rope_precision"] == rope
    assert losses(runs["bf16"]) != losses(runs["fp32"])
    assert losses(runs["bf16"]) == pytest.approx(losses(runs["fp32"]), rel=0.05)


def test_resume_without_checkpoint_starts_fresh(tmp_path, capsys):
    run = train(micro_config(tmp_path / "run", max_steps=2), resume=True, show_progress=False)
    assert len(losses(run)) == 2
    assert "starting from step 0" in capsys.readouterr().err


def test_continued_pretraining_starts_from_the_given_checkpoint(tmp_path):
    """model.path: the run starts from those weights (lr 0 keeps them) with that checkpoint's tokenizer."""
    base = complete_checkpoints(train(micro_config(tmp_path / "base", max_steps=2), show_progress=False))[-1][1]
    sets = [
        f"model.path={base}",
        "seq_len=128",
        "windows_per_step=2",
        "micro_batch=2",
        "optim.lr=0",
        "optim.warmup_steps=0",
        "checkpoint.every=1",
        "data.num_retrieval_docs=50",
    ]
    config = load_recipe("tiny-long", {"out": str(tmp_path / "long"), "max_steps": 1, "paradigm": "intra_doc"}, sets)
    continued = complete_checkpoints(train(config, show_progress=False))[-1][1]
    before, after = load_model_state(base), load_model_state(continued)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
    assert (continued / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()


def test_tokens_per_s_times_the_step_not_the_packing(tmp_path, monkeypatch):
    """A slow window builder shows in data_s, not in step_s or tokens_per_s (the model's speed).
    The trainer's clock is the real one plus 100 s for every window built, so the check reads no
    race between two real durations: data_s holds the 400 s of a step's 4 windows, step_s none."""
    from types import SimpleNamespace

    from evalkit.train import loop
    from evalkit.train.data import WindowStream

    late, real = [0.0], WindowStream.next_window

    def slow(self):
        late[0] += 100.0
        return real(self)

    monkeypatch.setattr(WindowStream, "next_window", slow)
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + late[0]))
    run = train(micro_config(tmp_path / "run", max_steps=2), show_progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert record["data_s"] >= 4 * 100.0  # 4 windows per step, each 100 s late
        assert record["tokens_per_s"] == pytest.approx(4 * 128 / record["step_s"])
        assert record["step_s"] < 100.0  # none of the windows' lateness
    meta = json.loads((run / "step-2" / "meta.json").read_text())
    assert meta["attention"]["implementation"] == "blocked"  # auto, resolved on the CPU


@pytest.mark.parametrize("paradigm", ["anchor_tag", "anchor_interleaved"])
def test_every_anchor_paradigm_records_its_anchor_token(paradigm, tmp_path):
    run = train(micro_config(tmp_path / "run", paradigm=paradigm, max_steps=2), show_progress=False)
    meta = json.loads((run / "step-2" / "meta.json").read_text())
    assert meta["anchor_token"]["why"] == "BOS" and isinstance(meta["anchor_token"]["id"], int)
