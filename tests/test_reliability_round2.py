"""Reliability, second round: crafted files, non-finite weights, sweeps that survive one bad
checkpoint, readers that refuse what they do not understand, duplicated arguments, foreign
files in an output directory, the anchor token on record, and errors naming the path that failed.

Like tests/test_reliability.py, every case drives `evalkit` in a subprocess (or the CLI's entry
point in-process where an error must be injected) and checks what a user sees and what is left
on disk.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.errors import UserError
from tests.test_reliability import ROOT, TINY_BASE, copy_tiny_base, edit_weights, error_line, truncate_weights
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

EVALKIT = [sys.executable, "-m", "evalkit.cli"]


def evalkit(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
    # The timeout only stops a hung process (a regression of case 1 would hang); no assertion
    # depends on time.
    return subprocess.run(
        [*EVALKIT, *map(str, args)], check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def evalkit_here(capsys, *args: str | Path) -> subprocess.CompletedProcess:
    """`evalkit ARGS` through the CLI's entry point in this process (no interpreter and torch start
    per case), seen as a subprocess would be: exit status and stderr."""
    import signal

    from evalkit.cli import main

    handler = signal.getsignal(signal.SIGTERM)
    capsys.readouterr()
    old_argv, sys.argv = sys.argv, ["evalkit", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = old_argv
        signal.signal(signal.SIGTERM, handler)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


# ------------------------------------------------------------- 1. crafted GGUF headers

STRING, ARRAY, INT32, UINT32 = 8, 9, 5, 4


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_file(path: Path, n_tensors: int, kvs: list[bytes], tail: bytes = b"", size: int = 130) -> Path:
    """A GGUF v3 file whose header declares `n_tensors` tensors and the given key/value entries,
    followed by `tail`, padded with zeros to `size` bytes."""
    body = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs)) + b"".join(kvs) + tail
    path.write_bytes(body.ljust(size, b"\0"))
    return path


def kv(key: str, value_type: int, value: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + value


ARCH = kv("general.architecture", STRING, gguf_string("llama"))

CRAFTED = {
    # The file: an int32 array of 2^40 items in a 130-byte file.
    "array of 2^40 int32": lambda: [ARCH, kv("x.lst", ARRAY, struct.pack("<IQ", INT32, 1 << 40))],
    "array of 2^40 strings": lambda: [ARCH, kv("x.list", ARRAY, struct.pack("<IQ", STRING, 1 << 40))],
    "nested array of 2^40": lambda: [
        ARCH,
        kv("x.list", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", UINT32, 1 << 40)),
    ],
    "string of 2^50 bytes": lambda: [ARCH, kv("x.text", STRING, struct.pack("<Q", 1 << 50))],
    "key of 2^50 bytes": lambda: [ARCH, struct.pack("<Q", 1 << 50)],
    "unknown value type": lambda: [ARCH, kv("x.odd", 77, b"")],
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_gguf_header_is_refused_in_one_line(case, tmp_path):
    pytest.importorskip("gguf")
    source = gguf_file(tmp_path / "crafted.gguf", 0, CRAFTED[case]())
    line = error_line(evalkit("import", source, tmp_path / "dest", timeout=60))
    assert str(source) in line and "corrupt" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted.gguf"]


def test_a_tensor_index_past_the_end_of_the_file_is_refused(tmp_path):
    pytest.importorskip("gguf")
    # 2^40 tensors declared; and, separately, one tensor of 2^30 float32 values in 130 bytes.
    many = gguf_file(tmp_path / "many.gguf", 1 << 40, [ARCH])
    assert "corrupt" in error_line(evalkit("import", many, tmp_path / "d1", timeout=60))
    info = gguf_string("w") + struct.pack("<IQQ", 2, 1 << 15, 1 << 15) + struct.pack("<IQ", 0, 0)
    huge = gguf_file(tmp_path / "huge.gguf", 1, [ARCH], tail=info, size=256)
    line = error_line(evalkit("import", huge, tmp_path / "d2", timeout=60))
    assert "corrupt" in line and "tensor" in line, line


# ------------------------------------------------------- 2. templates, tokenizers, configs


def edit_json(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def with_chat_template(template: str):
    return lambda ckpt: edit_json(ckpt / "tokenizer_config.json", lambda c: {**c, "chat_template": template})


def overwrite(name: str, text: str):
    return lambda ckpt: (ckpt / name).write_text(text)


# Each breaks one file that is read while a checkpoint's tokenizer, template or config is loaded;
# (how, the file the error line must name, --prompt-format).
BROKEN_FILES = {
    "template escaping the sandbox": (
        with_chat_template("{{ cycler.__init__.__globals__.os.system('touch PWNED') }}"),
        "tokenizer_config.json",
        "chat",
    ),
    "template that does not parse": (with_chat_template("{% for m in messages %}"), "tokenizer_config.json", "chat"),
    "template that raises": (
        with_chat_template("{{ raise_exception('no system role') }}"),
        "tokenizer_config.json",
        "chat",
    ),
    "template file that does not parse": (overwrite("chat_template.jinja", "{% if %}"), "chat_template.jinja", "chat"),
    "tokenizer_config.json not JSON": (
        overwrite("tokenizer_config.json", "{ not json"),
        "tokenizer_config.json",
        "base",
    ),
    "tokenizer.json not JSON": (overwrite("tokenizer.json", '{"model": '), "tokenizer.json", "base"),
    "tokenizer.json of another shape": (overwrite("tokenizer.json", '{"model": 5}'), "tokenizer.json", "base"),
    "config.json field of the wrong type": (
        lambda ckpt: edit_json(ckpt / "config.json", lambda c: {**c, "num_hidden_layers": "two"}),
        "config.json",
        "base",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_FILES))
def test_a_broken_template_tokenizer_or_config_is_one_line_naming_the_file(case, tmp_path, capsys):
    damage, file_name, prompt_format = BROKEN_FILES[case]
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    damage(ckpt)
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "256", "--samples", "1"]
    line = error_line(evalkit_here(capsys, *args, "--prompt-format", prompt_format, "--out", tmp_path / "out"))
    assert str(ckpt / file_name) in line, line
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()


# ---------------------------------------------------------------- 3. non-finite weights


def poison(ckpt: Path, value: float) -> Path:
    def change(weights: dict) -> dict:
        name = "model.layers.0.mlp.up_proj.weight"
        weights[name] = weights[name].clone()
        weights[name][0, :3] = value
        return weights

    edit_weights(ckpt, change)
    return ckpt


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory) -> Path:
    return poison(copy_tiny_base(tmp_path_factory.mktemp("nan") / "run" / "step-1"), float("nan"))


NON_FINITE = "holds NaN or infinite weights: model.layers.0.mlp.up_proj.weight (3 values)"


def test_ruler_refuses_nan_weights_before_scoring(nan_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["ruler", nan_checkpoint, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args))
    assert str(nan_checkpoint / "model.safetensors") in line and NON_FINITE in line, line
    assert not list(out.rglob("*summary.json")) and not list(out.rglob("*.jsonl"))  # nothing scored


def test_probe_and_train_refuse_infinite_weights(tmp_path, capsys):
    ckpt = poison(copy_tiny_base(tmp_path / "run" / "step-1"), float("-inf"))
    probe_args = ["probe", "shift", "--ckpt", ckpt, "--seq", "16", "--n", "1", "--delta1", "0"]
    probe = error_line(evalkit_here(capsys, *probe_args, "--out", tmp_path / "probe"))
    assert NON_FINITE in probe, probe
    train_args = ["train", "--config", "tiny-cpu", "--model", ckpt, "--max-steps", "1"]
    assert NON_FINITE in error_line(evalkit_here(capsys, *train_args, "--out", tmp_path / "train"))
    assert not list((tmp_path / "train").glob("step-*"))


def test_every_loader_shares_the_non_finite_check(nan_checkpoint):
    """The vllm engine runs check_checkpoint before vLLM starts (no vLLM here to start)."""
    from evalkit.engines import vllm as vllm_engine
    from evalkit.models.check import check_checkpoint

    with pytest.raises(UserError, match="NaN or infinite"):
        check_checkpoint(nan_checkpoint)
    assert "check_checkpoint(self.model_path" in Path(vllm_engine.__file__).read_text()


# ------------------------------------------------------ 4. a sweep survives a bad checkpoint


def test_a_sweep_records_a_broken_checkpoint_and_goes_on(tmp_path, capsys):
    good1, bad, good2 = (copy_tiny_base(tmp_path / "sweep" / f"step-{n}") for n in (1, 2, 3))
    truncate_weights(bad)
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", good1, bad, good2, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1"]
    line = error_line(evalkit_here(capsys, *args, "--out", out))
    assert "1 of 3 checkpoints failed" in line and "model.safetensors is truncated or corrupt" in line, line
    stored = sorted(p.parent.name for p in out.rglob("ruler-summary.json"))
    assert stored == ["step-1", "step-3"]  # the one after the bad one was evaluated too
    record = json.loads((out / "sweep" / "step-2" / "ruler-failed.json").read_text())
    assert record["step"] == 2 and "truncated or corrupt" in record["reason"]

    board = tmp_path / "board.md"
    assert evalkit_here(capsys, "leaderboard", out, "--out", board).returncode == 0
    failed = board.read_text().split("## Failed checkpoints")[1].split("##")[0]
    assert "sweep step 2 (ruler)" in failed and "truncated or corrupt" in failed

    shutil.copy(good1 / "model.safetensors", bad / "model.safetensors")  # mended: the rerun scores it
    assert evalkit_here(capsys, *args, "--out", out).returncode == 0
    assert not (out / "sweep" / "step-2" / "ruler-failed.json").exists()
    assert (out / "sweep" / "step-2" / "ruler-summary.json").is_file()


# ------------------------------------------------ 5. readers skip what they do not understand


def ruler_summary(run: str, score: float, **fields) -> dict:
    row = {"run": run, "step": 1, "task": "niah_single_1", "length": 512, "score": score}
    return {"benchmark": "ruler", "run": run, "step": 1, "rows": [row], "skipped": [], "provenance": {}, **fields}


def write_summary(out: Path, summary: dict, name: str = "ruler-summary.json") -> Path:
    path = out / summary["run"] / "step-1" / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    return path


def test_the_leaderboard_leaves_out_summaries_of_another_format_with_a_note(tmp_path, capsys):
    out = tmp_path / "results"
    write_summary(out, ruler_summary("current", 61.0, schema_version=1))
    write_summary(out, ruler_summary("older", 62.0))  # written before schema_version: version 1
    future = write_summary(out, ruler_summary("future", 99.0, schema_version=999))
    other = write_summary(out, ruler_summary("other", 98.0, benchmark="xyz"))
    board = tmp_path / "board.md"
    result = evalkit_here(capsys, "leaderboard", out, "--out", board)
    assert result.returncode == 0, result.stderr
    tables, unread = board.read_text().split("## Not read")
    assert "| current |" in tables and "| older |" in tables
    assert "future" not in tables and "99.00" not in tables and "other" not in tables and "98.00" not in tables
    assert f"{future}: not read: its schema_version is 999" in unread
    assert f"{other}: not read: its benchmark is 'xyz', but its file name says 'ruler'" in unread

    alone = tmp_path / "alone"
    write_summary(alone, ruler_summary("future", 99.0, schema_version="2.0"))
    line = error_line(evalkit_here(capsys, "leaderboard", alone, "--out", tmp_path / "alone.md"))
    assert "1 left out" in line and "schema_version is '2.0'" in line, line


def test_a_run_does_not_replace_a_summary_of_another_format(tmp_path, capsys):
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    future = write_summary(out, ruler_summary("run", 99.0, schema_version=999))
    before = future.read_text()
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args))
    assert str(future) in line and "schema_version is 999" in line and "not replaced" in line, line
    assert future.read_text() == before


def test_a_rerun_does_not_reuse_a_summary_of_another_format(tmp_path):
    from evalkit.store.result_format import SCHEMA_VERSION, read_summary

    path = write_summary(tmp_path, ruler_summary("r", 1.0, schema_version=SCHEMA_VERSION + 1))
    assert read_summary(path) is None
    path.write_text(json.dumps(ruler_summary("r", 1.0, schema_version=SCHEMA_VERSION)))
    assert read_summary(path) is not None


# ------------------------------------------------------------- 6. duplicates in lists


def test_a_length_or_task_given_twice_is_scored_and_stored_once(tmp_path, capsys):
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    twice = ["--tasks", "niah_single_1, niah_single_1", "--lengths", "512, 512,512", "--samples", "1"]
    assert evalkit_here(capsys, "ruler", ckpt, *twice, "--out", out).returncode == 0
    summary = json.loads((out / "run" / "step-1" / "ruler-summary.json").read_text())
    assert [(row["task"], row["length"]) for row in summary["rows"]] == [("niah_single_1", 512)]
    assert summary["provenance"]["settings"]["lengths"] == [512]
    assert summary["provenance"]["settings"]["tasks"] == ["niah_single_1"]
    samples = out / "run" / "step-1" / "ruler" / "niah_single_1" / "512.jsonl"
    assert len(samples.read_text().splitlines()) == 1
    result = evalkit_here(capsys, "leaderboard", out, "--out", tmp_path / "board.md")
    assert result.returncode == 0, result.stderr  # once, not "holds niah_single_1 512 twice"


@pytest.mark.parametrize(
    "parse, given, expected",
    [
        ("evalkit.lengths:parse_lengths", "4k,4096,,8k,4k", [4096, 8192]),
        ("evalkit.ruler.runner:parse_ruler_tasks", "vt,niah_single_1,vt", ["vt", "niah_single_1"]),
        ("evalkit.arglists:parse_list", "mmlu,hellaswag,mmlu", ["mmlu", "hellaswag"]),  # evalkit general --tasks
        ("benchmarks.eval:parse_engines", "hf, hf", ["hf"]),
    ],
)
def test_every_list_parser_keeps_each_value_once(parse, given, expected):
    import importlib

    module, name = parse.split(":")
    assert getattr(importlib.import_module(module), name)(given) == expected


def test_paradigms_and_dtypes_given_twice_are_used_once(tmp_path, capsys):
    from evalkit.probe.options import ProbeOptions

    assert ProbeOptions(dtypes="fp32,FP32,bf16", delta1="0,0,2").dtypes == ("fp32", "bf16")
    args = ["quickstart", "--paradigms", "full,full", "--max-steps", "-1", "--out", tmp_path / "q"]
    assert "--max-steps" in error_line(evalkit_here(capsys, *args))  # parsed (no error on full,full) first


# -------------------------------------------- 7. nothing of the user's in an output directory


def test_train_refuses_a_metrics_log_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own notes, line 1\nline 2\n")
    (out / "step-9").mkdir()
    (out / "step-9" / "weights.bin").write_bytes(b"mine")
    line = error_line(evalkit_here(capsys, "train", "--config", "tiny-cpu", "--max-steps", "1", "--out", out))
    assert str(out / "metrics.jsonl") in line and "not written by evalkit" in line, line
    assert (out / "metrics.jsonl").read_text() == "my own notes, line 1\nline 2\n"
    (out / "metrics.jsonl").unlink()
    line = error_line(evalkit_here(capsys, "train", "--config", "tiny-cpu", "--max-steps", "1", "--out", out))
    assert str(out / "step-9") in line and "not written by evalkit" in line, line
    assert (out / "step-9" / "weights.bin").read_bytes() == b"mine"
    assert sorted(p.name for p in out.iterdir()) == ["step-9"]  # nothing written: refused before any work


FOREIGN = {  # (command's output file, relative to --out) -> its arguments after the checkpoint
    "ruler summary": ("run/step-1/ruler-summary.json", "ruler"),
    "ruler failure record": ("run/step-1/ruler-failed.json", "ruler"),
    "ruler --avg table": ("ruler-avg.md", "ruler"),
    "probe markdown": ("probe-shift.md", "probe"),
    "probe figure": ("probe-shift.png", "probe"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_an_output_file_of_the_users_is_refused_before_any_work(case, tmp_path, capsys):
    name, command = FOREIGN[case]
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_text('{"mine": true}' if name.endswith(".json") else "# my notes\n")
    if command == "ruler":
        args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--avg"]
    else:
        args = ["probe", "shift", "--ckpt", ckpt, "--seq", "16", "--n", "1", "--delta1", "0"]
    line = error_line(evalkit_here(capsys, *args, "--out", out))
    assert str(out / name) in line and "not written by evalkit" in line, line
    assert (out / name).read_text() in ('{"mine": true}', "# my notes\n")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [name]


def test_the_leaderboard_never_replaces_a_markdown_file_of_the_users(tmp_path, capsys):
    results = tmp_path / "results"
    write_summary(results, ruler_summary("current", 61.0, schema_version=1))
    notes = tmp_path / "notes.md"
    notes.write_text("# My notes\n")
    line = error_line(evalkit_here(capsys, "leaderboard", results, "--out", notes))
    assert str(notes) in line and "not written by evalkit" in line
    assert notes.read_text() == "# My notes\n"
    board = tmp_path / "board.md"
    assert evalkit_here(capsys, "leaderboard", results, "--out", board).returncode == 0
    assert evalkit_here(capsys, "leaderboard", results, "--out", board).returncode == 0  # its own: replaced


def test_a_sample_log_with_a_foreign_line_is_refused_not_truncated(tmp_path):
    from evalkit.store.sample_log import SampleLog

    log = tmp_path / "512.jsonl"
    log.write_text("not a record\nnot one either\n")
    with pytest.raises(UserError, match="512.jsonl:1 is not a sample record"):
        SampleLog(log, "key")
    assert log.read_text() == "not a record\nnot one either\n"


# ------------------------------------------------------------ 8. the anchor token on record


def added_token_id(content: str) -> int:
    """The id tokenizer.json gives a special token: the reference the recorded anchor must match."""
    added = json.loads((TINY_BASE / "tokenizer.json").read_text())["added_tokens"]
    return next(token["id"] for token in added if token["content"] == content)


EOS_ANCHOR = {"token": "</s>", "why": "EOS: the tokenizer has no BOS"}
EOS_NOTE = "note: the anchor token is '</s>' (id {}, EOS: the tokenizer has no BOS)"


def without_bos(ckpt: Path) -> Path:
    edit_json(ckpt / "tokenizer_config.json", lambda c: {**c, "bos_token": None})
    return ckpt


def test_the_anchor_token_and_why_are_recorded_where_an_anchor_is_used(tmp_path, capsys):
    ckpt = without_bos(copy_tiny_base(tmp_path / "run" / "step-1"))
    out = tmp_path / "out"
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--encoding", "anchor"]
    result = evalkit_here(capsys, *args, "--doc-tokens", "128", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    eos = {"id": added_token_id("</s>"), **EOS_ANCHOR}
    summary = json.loads((out / "run" / "step-1" / "ruler-summary.json").read_text())
    assert summary["provenance"]["anchor"] == eos
    assert summary["provenance"]["engine"]["anchor_token"] == eos
    assert EOS_NOTE.format(added_token_id("</s>")) in result.stderr

    standard = copy_tiny_base(tmp_path / "std" / "step-1")  # with a BOS: the BOS, said so
    result = evalkit_here(capsys, *args[:1], standard, *args[2:], "--doc-tokens", "128", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "std" / "step-1" / "ruler-summary.json").read_text())
    assert summary["provenance"]["anchor"] == {"id": added_token_id("<s>"), "token": "<s>", "why": "BOS"}


def test_training_under_the_anchor_paradigm_records_its_anchor(tmp_path, capsys):
    ckpt = without_bos(copy_tiny_base(tmp_path / "base"))
    out = tmp_path / "run"
    args = ["train", "--config", "tiny-cpu", "--model", ckpt, "--max-steps", "1", "--set", "paradigm=anchor"]
    result = evalkit_here(capsys, *args, "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    assert EOS_NOTE.format(added_token_id("</s>")) in result.stderr
    (checkpoint,) = out.glob("step-*")
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["anchor_token"] == {"id": added_token_id("</s>"), **EOS_ANCHOR}


# ------------------------------------------------ 9. a full disk names the path that failed


def test_a_full_disk_names_the_file_and_tells_the_cache_from_out(tmp_path, capsys, monkeypatch):
    """ENOSPC injected where the data reaches the disk (fsync raises it with no file name, as the
    kernel does): the error names the file, and says EVALKIT_CACHE when the full disk was the cache's."""
    import errno

    cache, out = tmp_path / "cache", tmp_path / "out"
    monkeypatch.setenv("EVALKIT_CACHE", str(cache))
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    real_fsync = os.fsync

    def full(under: Path):
        def fsync(fd):
            if Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(under):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        return fsync

    monkeypatch.setattr(os, "fsync", full(cache))
    line = error_line(evalkit_here(capsys, *args))
    assert f"no space left on the device writing {cache}/ruler/" in line, line
    assert "EVALKIT_CACHE" in line and "--out" not in line, line

    monkeypatch.setattr(os, "fsync", full(out))  # the cache has room now; --out is full
    line = error_line(evalkit_here(capsys, *args))
    assert f"no space left on the device writing {out}/run/step-1/ruler/niah_single_1/512.jsonl" in line, line
    assert "--out" in line and "EVALKIT_CACHE" not in line, line


def test_quickstart_refuses_a_leaderboard_of_the_users_before_training(tmp_path, capsys):
    out = tmp_path / "q"
    out.mkdir()
    (out / "leaderboard.md").write_text("# my notes\n")
    line = error_line(evalkit_here(capsys, "quickstart", "--out", out, "--runs", tmp_path / "runs"))
    assert str(out / "leaderboard.md") in line and "not written by evalkit" in line, line
    assert [p.name for p in out.iterdir()] == ["leaderboard.md"] and not (tmp_path / "runs").exists()
