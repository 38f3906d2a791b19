"""Reliability, as a user meets it on the command line: evalkit never destroys files it did not
write, keeps one writer per results directory, and refuses a broken checkpoint with one line.

Every case runs `evalkit` in a subprocess and checks what a user would see (exit status 2, one
`error:` line, no traceback) and what is left on disk (the user's files intact, no hidden
temporary directories, no duplicated sample lines). Checkpoints are copies of the shipped
checkpoints/tiny-base (an evalkit checkpoint with tied embeddings), broken on purpose.
"""

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalkit.errors import UserError
from evalkit.results.store import SampleLog
from evalkit.results_io import LOCK_NAME, output_lock
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = ROOT / "checkpoints" / "tiny-base"
EVALKIT = [sys.executable, "-m", "evalkit.cli"]


def evalkit(*args: str | Path) -> subprocess.CompletedProcess:
    # The timeout only stops a hung process; no assertion depends on time.
    return subprocess.run(
        [*EVALKIT, *map(str, args)], check=False, capture_output=True, text=True, timeout=900, cwd=ROOT
    )


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused command (asserting that it was refused that way)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def hidden_entries(directory: Path) -> list[str]:
    """Dot-files and dot-directories: where a temporary copy would be left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def copy_tiny_base(destination: Path) -> Path:
    shutil.copytree(TINY_BASE, destination)
    return destination


def edit_config(checkpoint: Path, **changes) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(changes)
    (checkpoint / "config.json").write_text(json.dumps(config))


def edit_weights(checkpoint: Path, change: Callable[[dict], dict]) -> None:
    weights = load_file(checkpoint / "model.safetensors")
    save_file(change(weights), checkpoint / "model.safetensors", metadata={"format": "pt"})


def truncate_weights(checkpoint: Path) -> None:
    data = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(data[: len(data) // 2])


# ---------------------------------------------------------------------- export never destroys


@pytest.fixture
def source(tmp_path) -> Path:
    return copy_tiny_base(tmp_path / "src" / "step-7000")


def test_export_refuses_a_directory_holding_the_users_files(source, tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my notes")
    line = error_line(evalkit("export", source, dest))
    assert str(dest) in line and "not an evalkit checkpoint" in line
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
    assert (dest / "notes.txt").read_text() == "my notes"
    assert hidden_entries(tmp_path) == []


def test_export_refuses_a_file_even_with_overwrite(source, tmp_path):
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"user data")
    line = error_line(evalkit("export", source, dest, "--overwrite"))
    assert str(dest) in line and "is a file" in line
    assert dest.read_bytes() == b"user data"
    assert hidden_entries(tmp_path) == []


def test_export_replaces_an_earlier_checkpoint_only_with_overwrite(source, tmp_path):
    dest = tmp_path / "shipped"
    assert evalkit("export", source, dest).returncode == 0
    (dest / "left-by-the-first-export.txt").write_text("x")  # tells the two exports apart

    line = error_line(evalkit("export", source, dest, "--dtype", "fp32"))
    assert "--overwrite" in line
    assert (dest / "left-by-the-first-export.txt").exists()
    assert json.loads((dest / "config.json").read_text())["dtype"] == "bfloat16"

    replaced = evalkit("export", source, dest, "--dtype", "fp32", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in source.iterdir() if p.name != "trainer_state.pt"
    )
    assert json.loads((dest / "config.json").read_text())["dtype"] == "float32"
    assert {w.dtype for w in load_file(dest / "model.safetensors").values()} == {torch.float32}
    assert hidden_entries(tmp_path) == []


def test_export_fills_an_empty_directory(source, tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir()
    assert evalkit("export", source, dest).returncode == 0
    assert (dest / "meta.json").read_text() == (source / "meta.json").read_text()
    assert hidden_entries(tmp_path) == []


@pytest.mark.parametrize("damage, fragment", [
    (truncate_weights, "model.safetensors is truncated or corrupt"),
    (lambda ckpt: (ckpt / "config.json").write_text('{"model_type": "llama",'), "config.json is not valid JSON"),
])  # fmt: skip
def test_a_failed_export_leaves_nothing_behind(source, tmp_path, damage, fragment):
    damage(source)
    dest = tmp_path / "out"
    line = error_line(evalkit("export", source, dest))
    assert fragment in line and str(source) in line
    assert not dest.exists()
    assert hidden_entries(tmp_path) == []


# ---------------------------------------------------------------------- one writer per results directory

HOLD_LOCK = """
import sys, time
from evalkit.results_io import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(3600)
"""


def test_the_lock_is_freed_when_its_holder_is_killed(tmp_path):
    out = tmp_path / "results"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"  # blocks until the child holds the lock
        refused = rf"another evalkit process \(pid {holder.pid}\) is writing to {out}"
        with pytest.raises(UserError, match=refused), output_lock(out):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    assert (out / LOCK_NAME).exists()  # the file stays; the kernel dropped the lock with the process
    with output_lock(out) as lock:
        assert lock == out / LOCK_NAME


def test_the_lock_refuses_a_second_holder_in_the_same_process_and_a_file(tmp_path):
    first = output_lock(tmp_path / "out")
    with first, pytest.raises(UserError, match="another evalkit process"), output_lock(tmp_path / "out"):
        pass
    with output_lock(tmp_path / "out"):  # released on leaving the block
        pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"), output_lock(tmp_path / "file"):
        pass


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return copy_tiny_base(tmp_path_factory.mktemp("ckpt") / "tiny-base")


def test_general_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "general"
    with output_lock(out):
        line = error_line(evalkit("general", "--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style",
                                  "--limit", "1", "--out", out))  # fmt: skip
    assert "another evalkit process" in line and str(out) in line
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing written


def test_quickstart_refuses_a_directory_another_process_writes(tmp_path):
    out, runs = tmp_path / "quick", tmp_path / "runs"
    with output_lock(out):
        line = error_line(evalkit("quickstart", "--out", out, "--runs", runs, "--recipe", "tiny-cpu", "--max-steps", "1",
                                  "--no-shipped"))  # fmt: skip
    assert "another evalkit process" in line and str(out) in line
    assert not runs.exists()  # refused before training


def test_ruler_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "ruler"
    with output_lock(out):
        result = evalkit("ruler", "--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1",
                         "--samples", "1", "--out", out)  # fmt: skip
    assert not list(out.rglob("*.jsonl"))  # no sample written beside the holder's
    line = error_line(result)
    assert "another evalkit process" in line and str(out) in line


def test_a_sample_log_with_duplicated_lines_keeps_the_first_of_each(tmp_path):
    path = tmp_path / "512.jsonl"
    lines = [
        {"index": 0, "prediction": "a", "data_key": "k"},
        {"index": 1, "prediction": "b", "data_key": "k"},
        {"index": 0, "prediction": "a-again", "data_key": "k"},  # a second writer's copy
        {"index": 2, "prediction": "c", "data_key": "k"},
        {"index": 1, "prediction": "b-again", "data_key": "k"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = SampleLog(path, "k")
    assert [(r["index"], r["prediction"]) for r in log.ordered()] == [(0, "a"), (1, "b"), (2, "c")]
    log.append([{"index": 3, "prediction": "d"}])
    on_disk = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["index"], r["prediction"]) for r in on_disk] == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]


# ---------------------------------------------------------------------- loading refuses broken checkpoints


def drop_layer_0(checkpoint: Path) -> None:
    edit_weights(checkpoint, lambda w: {k: v for k, v in w.items() if ".layers.0." not in k})


def add_stray_weight(checkpoint: Path) -> None:
    edit_weights(checkpoint, lambda w: {**w, "model.stray.weight": torch.zeros(3)})


def untie_without_head(checkpoint: Path) -> None:
    edit_config(checkpoint, tie_word_embeddings=False)  # the file stores no lm_head: it was tied


def pickle_only(checkpoint: Path) -> None:
    torch.save(load_file(checkpoint / "model.safetensors"), checkpoint / "pytorch_model.bin")
    (checkpoint / "model.safetensors").unlink()


def custom_code(checkpoint: Path) -> None:
    edit_config(checkpoint, model_type="mystery_lm",
                auto_map={"AutoConfig": "mystery.MysteryConfig", "AutoModelForCausalLM": "mystery.MysteryForCausalLM"})  # fmt: skip


BROKEN = {
    "missing-layer-0": (drop_layer_0, ["lacks 9 weights", "model.layers.0.input_layernorm.weight"]),
    "stray-weight": (add_stray_weight, ["holds 1 weight", "model.stray.weight"]),
    "untied-no-head": (untie_without_head, ["lacks 1 weight", "lm_head.weight"]),
    "truncated": (truncate_weights, ["model.safetensors is truncated or corrupt"]),
    "pickle-only": (pickle_only, ["pytorch_model.bin", "safetensors only", "save_pretrained"]),
    "custom-code": (custom_code, ["auto_map", "trust_remote_code"]),
    "invalid-config": (
        lambda ckpt: (ckpt / "config.json").write_text('{"model_type": "llama",'),
        ["config.json is not valid JSON"],
    ),
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("broken")
    made = {}
    for name, (damage, _fragments) in BROKEN.items():
        made[name] = copy_tiny_base(folder / name)
        damage(made[name])
    return made


@pytest.mark.parametrize("case", list(BROKEN))
def test_ruler_refuses_a_broken_checkpoint_with_one_line(broken, case, tmp_path):
    out = tmp_path / "ruler"
    result = evalkit("ruler", "--ckpts", broken[case], "--lengths", "512", "--tasks", "niah_single_1",
                     "--samples", "1", "--out", out)  # fmt: skip
    line = error_line(result)
    assert str(broken[case]) in line
    for fragment in BROKEN[case][1]:
        assert fragment in line
    assert not list(out.rglob("*.jsonl")) and not list(out.rglob("*summary.json"))  # nothing scored


def test_the_engine_loads_tied_embeddings_without_complaint():
    """The control for the refusals above: tiny-base stores no lm_head, and that is right."""
    from evalkit.engines import get_engine

    assert "lm_head.weight" not in load_file(TINY_BASE / "model.safetensors")
    engine = get_engine("hf", TINY_BASE, dtype="fp32", device="cpu")
    model = engine.model
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_the_probe_refuses_an_invalid_config_and_missing_weights(broken, tmp_path):
    bad_json = copy_tiny_base(tmp_path / "bad-json")
    (bad_json / "config.json").write_text('{"model_type": "llama",')
    line = error_line(evalkit("probe", "shift", "--ckpt", bad_json, "--out", tmp_path / "p1"))
    assert f"{bad_json}/config.json is not valid JSON" in line
    line = error_line(evalkit("probe", "shift", "--ckpt", broken["missing-layer-0"], "--seq", "16", "--n", "1",
                              "--dtypes", "bf16", "--delta1", "0", "--out", tmp_path / "p2"))  # fmt: skip
    assert "lacks 9 weights" in line and "layers.0.input_layernorm.weight" in line
    assert not (tmp_path / "p1").exists() and not (tmp_path / "p2").exists()


def test_train_refuses_to_continue_a_checkpoint_missing_weights(broken, tmp_path):
    out = tmp_path / "run"
    line = error_line(evalkit("train", "--config", "tiny-cpu", "--model", broken["missing-layer-0"], "--max-steps", "1",
                              "--out", out))  # fmt: skip
    assert str(broken["missing-layer-0"]) in line and "lacks 9 weights" in line
    assert not list(out.glob("step-*"))
