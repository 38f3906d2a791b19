"""`train --resume` continues exactly or not at all: a torn last metrics line is dropped, a torn
line in the middle, a truncated checkpoint or a newest checkpoint without its trainer state is
refused in one line that says what to do, and nothing is touched then. (A killed run resuming to
identical losses: tests/train/test_train.py.)"""

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.helpers import error_line, evalkit, evalkit_here, run_cli, snapshot, truncate_weights
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from tests.train.helpers import losses, micro_args

MICRO_RUN_SETS = ("model.max_position_embeddings=64",)  # below seq_len=128: raised to it


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory) -> Path:
    """A 4-step micro run (checkpoints at steps 2 and 4) whose model asked for fewer positions than it trains on."""
    out = tmp_path_factory.mktemp("micro") / "run"
    result = evalkit(*micro_args(out, *MICRO_RUN_SETS, max_steps=4))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def resume_args(out: Path, max_steps: int = 6) -> list[str]:
    return [*micro_args(out, *MICRO_RUN_SETS, max_steps=max_steps), "--resume"]


def test_a_scratch_model_states_at_least_the_length_it_trains_on(micro_run):
    config = json.loads((micro_run / "step-4" / "config.json").read_text())
    assert config["max_position_embeddings"] == 128  # seq_len; the recipe asked for 64


def logged_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_drops_a_torn_last_metrics_line(micro_run, tmp_path):
    run = shutil.copytree(micro_run, tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as log:
        log.write('{"step": 5, "loss": 7.6')  # killed while logging step 5
    result = evalkit(*resume_args(run))
    assert result.returncode == 0, result.stderr[-3000:]
    assert logged_steps(run) == [1, 2, 3, 4, 5, 6]


def test_resume_refuses_a_torn_metrics_line_in_the_middle(micro_run, tmp_path):
    run = shutil.copytree(micro_run, tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:12]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    before = (run / "metrics.jsonl").read_bytes()
    line = error_line(evalkit(*resume_args(run)))
    assert f"{run / 'metrics.jsonl'}, line 2" in line and "corrupt" in line
    assert (run / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in run.glob("step-*")) == ["step-2", "step-4"]


def test_resume_refuses_a_truncated_checkpoint(micro_run, tmp_path):
    run = shutil.copytree(micro_run, tmp_path / "run")
    truncate_weights(run / "step-4")
    before = (run / "metrics.jsonl").read_bytes()
    line = error_line(evalkit(*resume_args(run)))
    assert f"{run / 'step-4' / 'model.safetensors'} is truncated or corrupt" in line
    assert (run / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in run.glob("step-*")) == ["step-2", "step-4"]


@pytest.fixture(scope="module")
def two_checkpoint_run(tmp_path_factory) -> Path:
    """A micro run of 4 steps: step-2 (no trainer state, pruned) and step-4 (with it)."""
    out = tmp_path_factory.mktemp("resume") / "run"
    assert run_quietly(micro_args(out, max_steps=4)) == 0
    assert sorted(p.name for p in out.glob("step-*")) == ["step-2", "step-4"]
    return out


def run_quietly(args: list[str]) -> int:
    """The CLI in this process, for a module-scoped fixture (which cannot have capsys)."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return run_cli(args)
    finally:
        signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("older_has_state", [False, True])
def test_resume_refuses_a_newest_checkpoint_without_trainer_state_and_touches_nothing(
    two_checkpoint_run, tmp_path, capsys, older_has_state
):
    run = shutil.copytree(two_checkpoint_run, tmp_path / "run")
    if older_has_state:  # the newest lost its trainer state; an older one still has one
        shutil.copy2(run / "step-4" / "trainer_state.pt", run / "step-2" / "trainer_state.pt")
    (run / "step-4" / "trainer_state.pt").unlink()
    before = snapshot(run)
    result = evalkit_here(capsys, *micro_args(run, max_steps=8), "--resume")
    line = error_line(result)
    assert f"{run / 'step-4'} has no trainer_state.pt" in line
    if older_has_state:
        assert f"move {run / 'step-4'} aside to resume from {run / 'step-2'}" in line
    else:
        assert f"--set model.path={run / 'step-4'}" in line
    assert snapshot(run) == before  # metrics.jsonl kept, no checkpoint pruned, nothing new


def test_a_run_from_before_the_marker_is_still_evalkits(two_checkpoint_run, tmp_path, capsys):
    """Runs trained before evalkit-run.json existed are recognised by their checkpoints' meta.json;
    resuming one marks it."""
    run = shutil.copytree(two_checkpoint_run, tmp_path / "run")
    assert (run / "evalkit-run.json").is_file()  # written when the run started
    (run / "evalkit-run.json").unlink()
    result = evalkit_here(capsys, *micro_args(run, max_steps=6), "--resume")
    assert result.returncode == 0, result.stderr
    assert len(losses(run)) == 6 and (run / "evalkit-run.json").is_file()
