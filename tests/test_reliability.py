"""Reliability, as a user meets it on the command line: evalkit never destroys files it did not
write, keeps one writer per results directory, and refuses a broken checkpoint with one line.

Every case runs `evalkit` in a subprocess and checks what a user would see (exit status 2, one
`error:` line, no traceback) and what is left on disk (the user's files intact, no hidden
temporary directories, no duplicated sample lines). Checkpoints are copies of the shipped
checkpoints/tiny-base (an evalkit checkpoint with tied embeddings), broken on purpose.
"""

import json
import os
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
from evalkit.files import LOCK_NAME, output_lock
from evalkit.store.sample_log import SampleLog
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = ROOT / "evalkit" / "checkpoints" / "tiny-base"
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


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (truncate_weights, "model.safetensors is truncated or corrupt"),
        (lambda ckpt: (ckpt / "config.json").write_text('{"model_type": "llama",'), "config.json is not valid JSON"),
    ],
)
def test_a_failed_export_leaves_nothing_behind(source, tmp_path, damage, fragment):
    damage(source)
    dest = tmp_path / "out"
    line = error_line(evalkit("export", source, dest))
    assert fragment in line and str(source) in line
    assert not dest.exists()
    assert hidden_entries(tmp_path) == []


# An export killed with SIGKILL at a chosen moment: after writing part of its copy (in_copy), or
# after setting the earlier destination aside and before moving the new one in (in_swap).
KILLED_EXPORT = """
import os, signal, sys, time
from pathlib import Path
from evalkit.train import checkpoint
from evalkit import files as storage
moment, source, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
write_export, rename = checkpoint._write_export, Path.rename
def write_then_die(*args):
    write_export(*args)
    os.kill(os.getpid(), signal.SIGKILL)
def rename_then_die(self, target):
    moved = rename(self, target)
    if str(target).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)
    return moved
if moment == "in_copy":
    checkpoint._write_export = write_then_die
else:
    Path.rename = rename_then_die
checkpoint.export_checkpoint(source, dest, overwrite=True)
"""


def killed_export(moment: str, source: Path, dest: Path) -> None:
    died = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, moment, str(source), str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]


def test_the_next_export_cleans_what_an_export_killed_mid_copy_left(source, tmp_path):
    dest = tmp_path / "out"
    killed_export("in_copy", source, dest)
    left = hidden_entries(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.") and left[0].endswith(".tmp")  # what kill -9 leaves
    assert not dest.exists()
    done = evalkit("export", source, dest)
    assert done.returncode == 0, done.stderr
    assert hidden_entries(tmp_path) == [] and (dest / "meta.json").is_file()


def test_an_export_killed_between_set_aside_and_move_in_loses_nothing(source, tmp_path):
    dest = tmp_path / "out"
    assert evalkit("export", source, dest).returncode == 0
    (dest / "left-by-the-first-export.txt").write_text("x")
    killed_export("in_swap", source, dest)
    assert not dest.exists() and len(hidden_entries(tmp_path)) == 2  # the earlier one set aside, the new one built
    # The next writer puts the earlier checkpoint back first, then treats it as any earlier one:
    line = error_line(evalkit("export", source, dest))
    assert "--overwrite" in line
    assert (dest / "left-by-the-first-export.txt").exists() and hidden_entries(tmp_path) == []


def test_a_live_writers_build_is_left_alone(source, tmp_path):
    """Only a dead process's leftovers are cleaned: a build whose pid runs is someone's work in progress."""
    from evalkit.files import new_directory_beside

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        in_progress = tmp_path / f".out.{sleeper.pid}.abcd1234.tmp"
        in_progress.mkdir()
        built = new_directory_beside(tmp_path / "out")
        assert in_progress.is_dir() and built.name.startswith(f".out.{os.getpid()}.")
    finally:
        sleeper.kill()
        sleeper.wait()
    new_directory_beside(tmp_path / "out")
    assert not in_progress.exists()  # its writer is gone now


# ---------------------------------------------------------------------- one writer per results directory

HOLD_LOCK = """
import sys, time
from evalkit.files import output_lock
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


def test_train_refuses_a_run_directory_another_process_trains(tmp_path):
    from tests.train.helpers import micro_args

    out = tmp_path / "run"
    with output_lock(out):
        line = error_line(evalkit(*micro_args(out, max_steps=2)))
    assert "another evalkit process" in line and str(out) in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # no checkpoint, no metrics
    assert evalkit(*micro_args(out, max_steps=2)).returncode == 0  # once the holder is gone


def test_quickstart_refuses_a_directory_another_process_writes(tmp_path):
    out, runs = tmp_path / "quick", tmp_path / "runs"
    with output_lock(out):
        line = error_line(
            evalkit(
                "quickstart", "--out", out, "--runs", runs, "--recipe", "tiny-cpu", "--max-steps", "1", "--no-shipped"
            )
        )
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


def test_probe_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "probe"
    with output_lock(out):
        result = evalkit(
            "probe", "shift", "--ckpt", checkpoint, "--seq", "16", "--n", "1", "--delta1", "0", "--out", out
        )
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written beside the holder's
    line = error_line(result)
    assert "another evalkit process" in line and str(out) in line


def test_a_sample_log_with_duplicated_lines_keeps_the_first_of_each(tmp_path):
    path = tmp_path / "512.jsonl"
    from evalkit.store.sample_log import record_checksum

    lines = [
        {"index": 0, "prediction": "a", "key": "k"},
        {"index": 1, "prediction": "b", "key": "k"},
        {"index": 0, "prediction": "a-again", "key": "k"},  # a second writer's copy
        {"index": 2, "prediction": "c", "key": "k"},
        {"index": 1, "prediction": "b-again", "key": "k"},
    ]
    path.write_text("".join(json.dumps({**line, "sha": record_checksum(line)}) + "\n" for line in lines))
    log = SampleLog(path, "k")
    assert [(i, r["prediction"]) for i, r in sorted(log.records.items())] == [(0, "a"), (1, "b"), (2, "c")]
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
    edit_config(
        checkpoint,
        model_type="mystery_lm",
        auto_map={"AutoConfig": "mystery.MysteryConfig", "AutoModelForCausalLM": "mystery.MysteryForCausalLM"},
    )


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
    result = evalkit(
        "ruler", "--ckpts", broken[case], "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1", "--out", out
    )
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
    line = error_line(
        evalkit("train", "--config", "tiny-cpu", "--model", broken["missing-layer-0"], "--max-steps", "1", "--out", out)
    )
    assert str(broken["missing-layer-0"]) in line and "lacks 9 weights" in line
    assert not list(out.glob("step-*"))


# ---------------------------------------------------------------------- training input checked before training


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def record(text: str = "a few words of a training document " * 4) -> bytes:
    return json.dumps({"text": text, "domain": "web"}).encode()


BAD_JSONL = {
    # case: (the file's lines, the line the error names, what the error says)
    "invalid-json-line-3-of-5": (
        [record(), record(), b'{"text": "cut here', record(), record()],
        3,
        "is not valid JSON",
    ),
    "no-text-field-lines-2-5": ([record(), *[json.dumps({"body": "x"}).encode()] * 4], 2, "has no field 'text'"),
    "not-utf8": ([record(), b'{"text": "caf\xe9"}', record()], 2, "byte 0xe9 at column 14 is not UTF-8"),
    "text-not-a-string": (
        [record(), record(), json.dumps({"text": 7}).encode()],
        3,
        "field 'text' holds a value of type int, not a string",
    ),
    "not-an-object": ([record(), b'["a list"]'], 2, "is a JSON list, not an object"),
}


@pytest.mark.parametrize(
    "case, paradigm",
    [
        *[(case, "anchor") for case in BAD_JSONL],
        ("invalid-json-line-3-of-5", "anchor_tag"),  # reads every line for its domains: a traceback before
    ],
)
def test_a_bad_jsonl_line_is_refused_before_the_first_step(case, paradigm, tmp_path):
    from tests.train.helpers import micro_args

    lines, number, fragment = BAD_JSONL[case]
    data = write_lines(tmp_path / "data.jsonl", lines)
    out = tmp_path / "run"
    line = error_line(evalkit(*micro_args(out, f"data.source={data}", paradigm=paradigm, max_steps=5)))
    assert f"{data}, line {number}" in line and fragment in line
    if "field" in fragment:
        assert "data.text_field" in line  # how to point at another field
    assert not out.exists()  # no metrics, no checkpoint


def test_a_jsonl_with_blank_lines_and_a_bom_reads_every_record(tmp_path):
    """The control for the refusals above: what is valid still loads, with its lines counted right."""
    from evalkit.train.data import JsonlSource

    path = write_lines(
        tmp_path / "d.jsonl", [b"\xef\xbb\xbf" + record("one"), b"", record("two"), b"  ", record("three")]
    )
    source = JsonlSource(path, "text", "domain")
    assert [source[i] for i in range(len(source))] == [("one", "web"), ("two", "web"), ("three", "web")]
    assert source.domains() == ["web"]
    path.write_bytes(path.read_bytes().replace(b'"three"', b'"three'))  # changed after opening: still one line
    with pytest.raises(UserError, match=r"d\.jsonl, line 5 is not valid JSON"):
        source[2]


MICRO_RUN_SETS = ("model.max_position_embeddings=64",)  # below seq_len=128: raised to it


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory) -> Path:
    """A 4-step micro run (checkpoints at steps 2 and 4) whose model asked for fewer positions than it trains on."""
    from tests.train.helpers import micro_args

    out = tmp_path_factory.mktemp("micro") / "run"
    result = evalkit(*micro_args(out, *MICRO_RUN_SETS, max_steps=4))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def resume_args(out: Path, max_steps: int = 6) -> list[str]:
    from tests.train.helpers import micro_args

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


# ---------------------------------------------------------------------- every argument checked before work starts


@pytest.mark.parametrize(
    "lengths, fragment",
    [
        ("²", "could not read length '²'"),  # str.isdigit() says yes, int() says no
        ("１２", "could not read length '１２'"),  # int() would read 12
        ("0", "could not read length '0'"),
        ("-1k", "could not read length '-1k'"),
        ("4k,0", "could not read length '0'"),
        ("", "no lengths given"),
        (" , ", "no lengths given"),
    ],
)
def test_ruler_refuses_unreadable_lengths(checkpoint, lengths, fragment, tmp_path):
    line = error_line(evalkit("ruler", "--ckpts", checkpoint, "--lengths", lengths, "--out", tmp_path / "out"))
    assert fragment in line
    assert not (tmp_path / "out").exists()


def test_quickstart_refuses_empty_lengths_instead_of_using_the_default(tmp_path):
    line = error_line(evalkit("quickstart", "--lengths", "", "--out", tmp_path / "q", "--runs", tmp_path / "runs"))
    assert "no lengths given" in line
    assert not (tmp_path / "q").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--set", "max_steps=--5"], "max_steps: expected int, got '--5'"),
        (["--set", "optim.lr=-1"], "optim.lr must be at least 0 (0 keeps the weights as they are), got -1.0"),
        (["--set", "optim.lr=nan"], "optim.lr must be a finite number, got nan"),
        (["--set", "optim.weight_decay=inf"], "optim.weight_decay must be a finite number, got inf"),
        (["--set", "optim.beta2=1.5"], "optim.beta1 and optim.beta2 must be in [0, 1)"),
        (["--set", "optim.grad_clip=-1"], "optim.grad_clip must be at least 0"),
        (["--max-steps", "0"], "max_steps must be at least 1, got 0"),
        (["--max-steps", "-3"], "max_steps must be at least 1, got -3"),
        (["--seq-len", "0"], "seq_len must be at least 16, got 0"),
        (["--set", "model.num_heads=3"], "model.hidden_size (256) must be a multiple of model.num_heads (3)"),
    ],
)
def test_train_refuses_bad_numbers_naming_the_field(args, fragment, tmp_path):
    out = tmp_path / "run"
    line = error_line(evalkit("train", "--config", "tiny-cpu", "--out", out, *args))
    assert fragment in line
    assert not out.exists()


def test_a_learning_rate_as_digits_still_reads():
    """The control: the stricter integer and float checks still take what users write."""
    from evalkit.train import load_recipe

    config = load_recipe("tiny-cpu", {"max_steps": 7}, ["optim.lr=2e-5", "seed=+3"])
    assert (config.optim.lr, config.seed, config.max_steps) == (2e-5, 3, 7)


@pytest.mark.parametrize("command", ["ruler", "general", "quickstart"])
def test_last_below_one_is_refused(checkpoint, command, tmp_path):
    out = tmp_path / "out"
    args = {
        "ruler": ["--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1"],
        "general": ["--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style", "--limit", "1"],
        "quickstart": ["--runs", tmp_path / "runs", "--recipe", "tiny-cpu", "--max-steps", "1", "--no-shipped"],
    }[command]
    line = error_line(evalkit(command, *args, "--last", "0", "--out", out))
    assert "--last 0" in line and "at least 1" in line
    assert not out.exists() and not (tmp_path / "runs").exists()  # the quickstart trained nothing


@pytest.mark.parametrize("limit", ["inf", "nan", "-1", "0", "2.5"])
def test_general_refuses_a_limit_that_is_no_count_or_fraction(checkpoint, limit, tmp_path):
    out = tmp_path / "out"
    line = error_line(
        evalkit(
            "general",
            "--ckpts",
            checkpoint,
            "--tasks",
            "evalkit_fixture_hellaswag_style",
            "--limit",
            limit,
            "--out",
            out,
        )
    )
    assert "--limit" in line
    assert not out.exists()


def out_commands(checkpoint: Path, tmp_path: Path) -> dict[str, list]:
    """Each command that takes --out, with arguments it would otherwise run with."""
    results = tmp_path / "results"
    (results / "run" / "step-1").mkdir(parents=True)  # an (empty) results directory for the leaderboard
    return {
        "train": ["train", "--config", "tiny-cpu", "--max-steps", "1"],
        "ruler": ["ruler", "--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1"],
        "general": ["general", "--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style", "--limit", "1"],
        "probe": ["probe", "shift", "--ckpt", checkpoint, "--seq", "16", "--n", "1", "--delta1", "0"],
        "leaderboard": ["leaderboard", results],
    }


OUT_COMMANDS = ["train", "ruler", "general", "probe", "leaderboard"]


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_out_under_a_file_is_refused_before_any_work(checkpoint, command, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    out = blocker / "out" / ("board.md" if command == "leaderboard" else "")
    line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
    assert f"lies under {blocker}, which is a file" in line
    assert blocker.read_text() == "mine"
    assert hidden_entries(tmp_path) == []


@pytest.mark.parametrize("command", [c for c in OUT_COMMANDS if c != "leaderboard"])
def test_out_that_is_a_file_is_refused_before_any_work(checkpoint, command, tmp_path):
    out = tmp_path / "a-file"
    out.write_text("mine")
    line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
    assert f"{out} is a file" in line
    assert out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "results"]


def test_leaderboard_out_that_is_a_directory_is_refused(checkpoint, tmp_path):
    args = out_commands(checkpoint, tmp_path)["leaderboard"]
    line = error_line(evalkit(*args, "--out", tmp_path))
    assert f"{tmp_path} is a directory" in line
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_out_in_an_unwritable_directory_is_refused_before_any_work(checkpoint, command, tmp_path):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root (with CAP_DAC_OVERRIDE) writes anywhere
            pytest.skip(f"a 0o500 directory stays writable for this user (euid {os.geteuid()}, e.g. root)")
        out = locked / ("board.md" if command == "leaderboard" else "out")
        line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
        assert f"{locked} is not writable" in line
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_an_unwritable_output_directory_is_refused_without_running_as_another_user(tmp_path, monkeypatch):
    """The permission branch, for machines where the test above is skipped (root writes anywhere)."""
    import os

    from evalkit.files import check_output_dir, check_output_file

    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(UserError, match=f"--out {tmp_path / 'new' / 'out'}: {tmp_path} is not writable"):
        check_output_dir(tmp_path / "new" / "out")
    with pytest.raises(UserError, match=f"--out {tmp_path / 'board.md'}: {tmp_path} is not writable"):
        check_output_file(tmp_path / "board.md")
    (tmp_path / "sub").mkdir()
    check_output_dir(tmp_path / "sub" / "out")  # a writable place: accepted


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["ruler", "--lengths", "512", "--samples", "0"], "--samples and --batch-size must be at least 1"),
        (["ruler", "--lengths", "512", "--batch-size", "0"], "--samples and --batch-size must be at least 1"),
        (["ruler", "--lengths", "512", "--max-length", "0"], "--max-length must be at least 2 tokens"),
        (["ruler", "--lengths", "512", "--max-length", "1"], "--max-length must be at least 2 tokens"),
        (
            ["general", "--tasks", "evalkit_fixture_hellaswag_style", "--max-length", "1"],
            "--max-length must be at least 2",
        ),
        (
            ["general", "--tasks", "evalkit_fixture_hellaswag_style", "--batch-size", "0"],
            "--batch-size must be at least 1",
        ),
        (["quickstart", "--samples", "0"], "--samples must be at least 1"),
        (["probe", "shift", "--n", "0"], "--n: the number of texts must be a positive integer"),
        (["probe", "shift", "--seq", "1"], "--seq: a length must be at least 2 tokens"),
        (["probe", "length", "--lengths", "1"], "--lengths: a length must be at least 2 tokens"),
    ],
)
def test_counts_below_one_are_refused(checkpoint, args, fragment, tmp_path):
    out = tmp_path / "out"
    where = (
        ["--ckpt" if args[0] == "probe" else "--ckpts", checkpoint]
        if args[0] != "quickstart"
        else ["--runs", tmp_path / "runs"]
    )
    line = error_line(evalkit(*args, *where, "--out", out))
    assert fragment in line
    assert not out.exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------- a full disk


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device", "/data/out/ruler-summary.json"),
        RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: ... })"),
        ValueError("could not save"),  # not a full disk: must stay a traceback, not be disguised
    ],
)
def test_a_full_disk_is_one_line_and_other_errors_are_not_hidden(capsys, error):
    import evalkit.cli as cli

    def failing_app():
        raise error

    if isinstance(error, ValueError):
        with pytest.raises(ValueError):
            cli.main(failing_app)
        return
    with pytest.raises(SystemExit) as exited:
        cli.main(failing_app)
    assert exited.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and message.startswith("error: no space left on the device")
    assert ("writing /data/out/ruler-summary.json" in message) == isinstance(error, OSError)


def test_a_write_that_fails_midway_leaves_no_file_behind(tmp_path, monkeypatch):
    """ENOSPC when the data reaches the disk (fsync): neither the target nor a temporary file remains."""
    import errno

    from evalkit import files as storage

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", full_disk)
    with pytest.raises(OSError):
        storage.atomic_write_text(tmp_path / "summary.json", "x" * 10_000)
    assert list(tmp_path.iterdir()) == []
