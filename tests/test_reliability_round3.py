"""Reliability, third round: a resume that cannot resume exactly, shards of two different
checkpoints under one name, a checkpoint reached twice through a symlink, settings checked once
before any checkpoint, messages that say what was found and what to do, foreign logs, and a
checkpoint served with the attention it was trained under.

As in the earlier rounds, each case drives the CLI (in this process where that is enough) and
checks what a user sees (exit status, one `error:` line, no traceback) and what is left on disk.
"""

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_reliability import error_line
from tests.test_reliability_round2 import evalkit_here
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its content's digest: to show that nothing was touched."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


# ------------------------------------------------- 1. --resume without a trainer state


@pytest.fixture(scope="module")
def two_checkpoint_run(tmp_path_factory) -> Path:
    """A micro run of 4 steps: step-2 (no trainer state, pruned) and step-4 (with it)."""
    from tests.train.helpers import micro_args

    out = tmp_path_factory.mktemp("resume") / "run"
    assert run_quietly(micro_args(out, max_steps=4)) == 0
    assert sorted(p.name for p in out.glob("step-*")) == ["step-2", "step-4"]
    return out


def run_quietly(args: list[str]) -> int:
    """The CLI in this process, for a module-scoped fixture (which cannot have capsys)."""
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    try:
        return run_cli(args)
    finally:
        signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("older_has_state", [False, True])
def test_resume_refuses_a_newest_checkpoint_without_trainer_state_and_touches_nothing(
    two_checkpoint_run, tmp_path, capsys, older_has_state
):
    from tests.train.helpers import micro_args

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


# ------------------------------------------- 2. shards of one name, different weights


def test_merge_refuses_shards_of_one_run_name_over_different_weights(tmp_path, capsys):
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import run_ruler
    from evalkit.sweep.plan import Shard
    from tests.sweep.helpers import SHIPPED, tiny_settings

    # Three directories holding a run "myrun" at step 600: a, a copy of a, and b (another run's weights).
    checkpoints = {
        "a": SHIPPED / "tiny-long-full-shipped" / "step-600",
        "a-copy": SHIPPED / "tiny-long-full-shipped" / "step-600",
        "b": SHIPPED / "tiny-long-anchor-shipped" / "step-600",
    }
    for place, source in checkpoints.items():
        shutil.copytree(source, tmp_path / place / "myrun" / "step-600")
    settings = tiny_settings(samples=1, tasks=["niah_single_1", "qa_1"])  # one unit per shard
    for index, place in enumerate(["a", "b"]):
        refs = resolve_checkpoints([str(tmp_path / place / "myrun" / "step-600")])
        run_ruler(refs, settings, tmp_path / f"shard{index}-{place}", shard=Shard(index, 2))
    refs = resolve_checkpoints([str(tmp_path / "a-copy" / "myrun" / "step-600")])
    run_ruler(refs, settings, tmp_path / "shard1-a-copy", shard=Shard(1, 2))

    line = error_line(
        evalkit_here(capsys, "merge", tmp_path / "shard0-a", tmp_path / "shard1-b", "--out", tmp_path / "m")
    )
    assert "conflicting shards" in line and "myrun step 600 is different weights" in line
    assert str(tmp_path / "a" / "myrun" / "step-600") in line and str(tmp_path / "b" / "myrun" / "step-600") in line
    assert not (tmp_path / "m").exists()
    # The same weights in another directory (a copy staged on another node) are the same checkpoint.
    merged = evalkit_here(capsys, "merge", tmp_path / "shard0-a", tmp_path / "shard1-a-copy", "--out", tmp_path / "m")
    assert merged.returncode == 0, merged.stderr


# --------------------------------------------------- 3. a checkpoint reached twice


def test_a_symlinked_run_beside_its_target_is_evaluated_once(tmp_path, capsys):
    from tests.sweep.helpers import SHIPPED

    runs = tmp_path / "runs"
    shutil.copytree(SHIPPED / "tiny-long-full-shipped" / "step-600", runs / "myrun" / "step-600")
    (runs / "latest").symlink_to("myrun")
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", f"{runs}/*/", "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1"]
    result = evalkit_here(capsys, *args, "--out", out)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "same checkpoint directory" in line]
    # glob order: runs/latest comes first and keeps its name; myrun is the spelling skipped
    assert notes == [
        "note: myrun (step 600) is the same checkpoint directory as latest (a symlink?): "
        "skipped, evaluated once as latest"
    ]
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/step-*/ruler-summary.json")) == [
        "latest/step-600/ruler-summary.json"
    ]


# ------------------------------------------------------- 4. a malformed --ray-address


def test_a_ray_address_without_a_port_is_one_line_saying_the_forms(tmp_path, capsys):
    from tests.sweep.helpers import SHIPPED

    out = tmp_path / "out"
    ckpt = SHIPPED / "tiny-long-full-shipped" / "step-600"
    args = ["ruler", "--ckpts", ckpt, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--executor", "ray", "--ray-address", "nosuchhost"))
    assert "--ray-address 'nosuchhost' is not a Ray address" in line
    assert "HOST:PORT" in line and "ray://HOST:10001" in line and "auto" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("address", "valid"),
    [
        ("nosuchhost", False),
        ("host:", False),
        ("host:port", False),
        ("http://host:6379", False),
        ("head-node:6379", True),
        ("10.0.0.5:6379", True),
        ("[::1]:6379", True),
        ("ray://head-node:10001", True),
        ("ray://head-node", True),  # Ray Client's default port
        ("auto", True),
    ],
)
def test_ray_address_forms(address, valid):
    from evalkit.errors import UserError
    from evalkit.sweep.options import check_ray_address

    if valid:
        check_ray_address(address)
    else:
        with pytest.raises(UserError, match="is not a Ray address"):
            check_ray_address(address)


# ------------------------------------------ 5. a bad engine setting is the user's, said once


@pytest.mark.parametrize("value", ["sdpa=1", "no_such_kernel", "evalkit_sdpa"])
def test_a_bad_attention_setting_is_one_line_before_any_checkpoint(tmp_path, capsys, value):
    from tests.sweep.helpers import SHIPPED

    out = tmp_path / "out"
    run = SHIPPED / "tiny-long-full-shipped"  # two checkpoints: neither may be recorded as failed
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--engine-arg", f"attention={value}"))
    assert f"got {value!r}" in line or f"attention={value!r}" in line
    assert "sdpa" in line and "eager" in line  # what to use instead
    assert not out.exists()  # no ruler-failed.json, nothing at all


@pytest.mark.parametrize("value", ["sdpa", "eager"])
def test_transformers_attention_names_pass_the_check(value):
    from evalkit.engines import check_engine_settings

    check_engine_settings("hf", {"attention": value, "batch_size": 2})


# ------------------------------------------- 7. a leaderboard of failed checkpoints only


def test_a_leaderboard_of_failed_checkpoints_only_names_the_failure_records(tmp_path, capsys):
    from tests.sweep.helpers import SHIPPED
    from tests.test_reliability import truncate_weights

    run = shutil.copytree(SHIPPED / "tiny-long-full-shipped", tmp_path / "runs" / "broken")
    for step in ("step-550", "step-600"):
        truncate_weights(run / step)
    out = tmp_path / "results"
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    assert "2 of 2 checkpoints failed" in error_line(evalkit_here(capsys, *args))
    records = [out / "broken" / step / "ruler-failed.json" for step in ("step-550", "step-600")]
    assert all(record.is_file() for record in records)
    for form in ("csv", "json", "md"):
        board = tmp_path / f"board.{form}"
        line = error_line(evalkit_here(capsys, "leaderboard", out, "--format", form, "--out", board))
        assert "but 2 failure records" in line and all(str(record) in line for record in records), line
        assert "run evalkit ruler/general first" not in line
        assert not board.exists()


# ------------------------------------ 8. compare says which summary it could not read


def test_compare_names_a_summary_of_a_future_schema_it_left_out(tmp_path, capsys):
    import json

    from tests.sweep.helpers import SHIPPED

    out = tmp_path / "results"
    runs = [SHIPPED / "tiny-long-full-shipped", SHIPPED / "tiny-long-anchor-shipped"]  # two checkpoints each
    args = ["--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    assert evalkit_here(capsys, "ruler", "--ckpts", *runs, *args).returncode == 0
    future = out / "tiny-long-anchor-shipped" / "step-550" / "ruler-summary.json"
    summary = json.loads(future.read_text())
    future.write_text(json.dumps({**summary, "schema_version": 99}))

    result = evalkit_here(capsys, "compare", out, "--replicates", "100", "--out", tmp_path / "cmp")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(f"{future}: not read: its schema_version is 99") == 1, result.stderr
    assert f"{future}: not read" in (tmp_path / "cmp" / "compare.md").read_text()


# ------------------------------------- 9. a length beyond the limit: the model's window


def test_a_length_beyond_evalkits_limit_names_the_models_window_and_max_length(tmp_path, capsys):
    import json

    from tests.sweep.helpers import SHIPPED

    ckpt = SHIPPED / "tiny-long-full-shipped" / "step-600"
    window = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    args = ["ruler", "--ckpts", ckpt, "--tasks", "niah_single_1", "--lengths", "4k,1000000000", "--out", tmp_path]
    line = error_line(evalkit_here(capsys, *args))
    assert f"length 1000000000 is beyond the window of {ckpt} ({window} tokens, its max_position_embeddings)" in line
    assert "--max-length" in line and "evalkit's limit" not in line
    line = error_line(evalkit_here(capsys, *args, "--max-length", "8192"))
    assert "length 1000000000 is beyond --max-length 8192" in line
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------- 10. another trainer's metrics log

OTHER_TRAINERS_LOGS = {
    # HF Trainer's log_history entries, as its callbacks write them one per line
    "hf-trainer": [
        {"loss": 2.3046, "grad_norm": 1.8125, "learning_rate": 4.9e-05, "epoch": 0.01, "step": 10},
        {"loss": 2.1187, "grad_norm": 1.6875, "learning_rate": 4.8e-05, "epoch": 0.02, "step": 20},
    ],
    # torchtitan's metrics, as a JSONL logger of its metric names would write them
    "torchtitan": [
        {
            "step": 10,
            "loss_metrics/global_avg_loss": 7.81,
            "loss_metrics/global_max_loss": 7.95,
            "throughput(tps)": 8123.4,
            "memory/max_reserved(GiB)": 21.3,
        },
        {
            "step": 20,
            "loss_metrics/global_avg_loss": 6.92,
            "loss_metrics/global_max_loss": 7.1,
            "throughput(tps)": 8201.0,
            "memory/max_reserved(GiB)": 21.3,
        },
    ],  # fmt: skip
    "plain": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.4}],
}


@pytest.mark.parametrize("trainer", list(OTHER_TRAINERS_LOGS))
@pytest.mark.parametrize("resume", [False, True])
def test_another_trainers_metrics_log_is_refused_and_left_as_it_is(tmp_path, capsys, trainer, resume):
    import json

    from tests.train.helpers import micro_args

    out = tmp_path / "run"
    out.mkdir()
    text = "".join(json.dumps(record) + "\n" for record in OTHER_TRAINERS_LOGS[trainer])
    (out / "metrics.jsonl").write_text(text)
    line = error_line(evalkit_here(capsys, *micro_args(out, max_steps=2), *(["--resume"] if resume else [])))
    assert str(out / "metrics.jsonl") in line and "not written by evalkit" in line, line
    assert (out / "metrics.jsonl").read_text() == text
    assert [p.name for p in out.iterdir()] == ["metrics.jsonl"]  # nothing written


def test_a_run_from_before_the_marker_is_still_evalkits(two_checkpoint_run, tmp_path, capsys):
    """Runs trained before evalkit-run.json existed are recognised by their checkpoints' meta.json;
    resuming one marks it."""
    from tests.train.helpers import losses, micro_args

    run = shutil.copytree(two_checkpoint_run, tmp_path / "run")
    assert (run / "evalkit-run.json").is_file()  # written when the run started
    (run / "evalkit-run.json").unlink()
    result = evalkit_here(capsys, *micro_args(run, max_steps=6), "--resume")
    assert result.returncode == 0, result.stderr
    assert len(losses(run)) == 6 and (run / "evalkit-run.json").is_file()


def test_a_missing_engine_package_is_one_line_before_any_checkpoint(tmp_path, capsys):
    import importlib.util

    from tests.sweep.helpers import SHIPPED

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the message is for environments without it")
    out = tmp_path / "out"
    run = SHIPPED / "tiny-long-full-shipped"  # two checkpoints: neither may be recorded as failed
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--engine", "vllm"))
    assert line.startswith("error: the vllm engine needs vllm, which is not installed: pip install")
    assert not out.exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rope": "sideways"}, "rope must be one of"),
        ({"position_shift": -1}, "position_shift must be non-negative, got -1"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be at least 1, got 0"),
    ],
)
def test_the_vllm_engine_judges_its_settings_without_a_checkpoint(settings, message):
    """What check_engine_settings asks the vllm engine before a sweep (vLLM itself is not needed)."""
    from evalkit.engines.vllm import VLLMEngine
    from evalkit.errors import UserError

    VLLMEngine.check_settings({"rope": "cast", "position_shift": 0, "batch_size": 4})  # its defaults pass
    with pytest.raises(UserError, match=message):
        VLLMEngine.check_settings(settings)


@pytest.mark.parametrize("step", [None, [600], "six hundred"])
def test_a_meta_step_that_is_no_number_reads_as_step_zero(tmp_path, step):
    """A checkpoint directory not named step-N takes its step from meta.json; one that holds no
    number there (null, a list, a word) is step 0, as one without the field, never a traceback."""
    import json

    from evalkit.models.refs import resolve_checkpoints

    checkpoint = tmp_path / "mine"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "meta.json").write_text(json.dumps({"step": step}))
    ((ref,),) = [resolve_checkpoints([str(checkpoint)])]
    assert (ref.run, ref.step) == ("mine", 0)
