"""A run that goes non-finite stops at that step in one line, keeps its finite checkpoints, and
never saves non-finite weights: a NaN or infinite gradient is caught before the optimizer step,
even while the loss is still finite."""

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evalkit.errors import UserError
from evalkit.train import checkpoint as ckpt
from evalkit.train import loop
from evalkit.train.loop import train
from tests.helpers import error_line, evalkit_here
from tests.train.helpers import losses, micro_args, micro_config


def finite_checkpoints(run: Path) -> list[int]:
    """The steps of the run's checkpoints, asserting each loadable and finite and no temporary left."""
    from transformers import AutoModelForCausalLM

    assert not list(run.glob(".step-*")), sorted(run.iterdir())
    for _step, path in ckpt.complete_checkpoints(run):
        assert all(t.isfinite().all() for t in load_file(str(path / "model.safetensors")).values()), path
        AutoModelForCausalLM.from_pretrained(path)
    return [step for step, _path in ckpt.complete_checkpoints(run)]


def test_a_huge_learning_rate_stops_at_the_step_that_diverged(tmp_path, capsys):
    run = tmp_path / "run"
    line = error_line(evalkit_here(capsys, *micro_args(run, "optim.lr=1e30", "checkpoint.every=1", max_steps=8)))
    stopped = int(re.search(r"at step (\d+)", line).group(1))
    logged = losses(run)  # the steps before it, each finite; the diverged one is not logged
    assert len(logged) == stopped - 1 and all(torch.tensor(logged).isfinite()), (line, logged)
    assert finite_checkpoints(run)[-1] == stopped - 1, line  # a checkpoint every step until then


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[0] = float("inf")
    return tensor


def _poisoned_from(step: int, what: str, monkeypatch) -> None:
    """From optimizer step `step` on, one element of the embedding's gradient is infinite (the
    loss, computed before it, stays finite), or the optimizer's update leaves it infinite (the
    gradients stay finite)."""
    count = {"step": 0}
    real_step, real_build = loop.optimizer_step, loop.build_training

    def counted(*args, **kwargs):
        count["step"] += 1
        return real_step(*args, **kwargs)

    def build(*args, **kwargs):
        model, optimizer, scheduler = real_build(*args, **kwargs)
        embedding = model.lm.get_input_embeddings().weight
        if what == "gradient":
            embedding.register_hook(lambda grad: _poison(grad) if count["step"] >= step else grad)
        else:
            update = optimizer.step

            def overflowing_update(*a, **k):
                update(*a, **k)
                if count["step"] >= step:
                    with torch.no_grad():
                        embedding.copy_(_poison(embedding))

            optimizer.step = overflowing_update
        return model, optimizer, scheduler

    monkeypatch.setattr(loop, "optimizer_step", counted)
    monkeypatch.setattr(loop, "build_training", build)


@pytest.mark.parametrize("what", ["gradient", "update"])
def test_a_nonfinite_gradient_or_update_is_never_applied_nor_saved(what, tmp_path, capsys, monkeypatch):
    """Step 4, a checkpoint step, gets an infinite gradient or an update that overflows a weight:
    the run stops naming step 4 and keeps step-2 as an unpoisoned run writes it."""
    reference = train(micro_config(tmp_path / "reference", "checkpoint.every=2", max_steps=2), show_progress=False)
    _poisoned_from(4, what, monkeypatch)
    run = tmp_path / "run"
    line = error_line(evalkit_here(capsys, *micro_args(run, "checkpoint.every=2", max_steps=6)))
    assert "at step 4" in line, line
    assert finite_checkpoints(run) == [2]
    kept, expected = (load_file(str(r / "step-2" / "model.safetensors")) for r in (run, reference))
    assert kept.keys() == expected.keys() and all(torch.equal(kept[k], expected[k]) for k in kept)
    assert losses(run)[:2] == losses(reference)


@pytest.mark.parametrize(("lr", "refused"), [(1e38, True), (3e37, False)])
def test_a_learning_rate_beyond_float32_in_adamws_step_is_refused_in_one_line(lr, refused, tmp_path):
    """AdamW's first step size is lr / (1 - beta1) = 10 lr (beta1 0.9), a float32 scalar whose
    largest value is 3.4e38: torch fails with a traceback beyond it (1e39), not at 3e38."""
    sets = (f"optim.lr={lr}", "optim.weight_decay=0")
    if refused:
        with pytest.raises(UserError, match="optim.lr=1e\\+38 is too large"):
            micro_config(tmp_path / "run", *sets, max_steps=1)
    else:  # it trains a step (and diverges at the next: one line, not a traceback)
        with pytest.raises(UserError, match="at step 2 "):
            train(micro_config(tmp_path / "run", *sets, max_steps=2), show_progress=False)
