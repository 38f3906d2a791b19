"""`evalkit ruler` end to end on a tiny model trained by `evalkit train`: outputs, --avg, resume."""

import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.train.loop import train
from tests.train.helpers import micro_config

EVALKIT = [sys.executable, "-m", "evalkit.cli"]
TASKS = "niah_single_1,niah_multikey_2,fwe,cwe"  # cwe cannot fit 512/1024 with this tokenizer: skipped


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two checkpoints (steps 2 and 4) of a micro model whose window is 1024 tokens."""
    out = tmp_path_factory.mktemp("runs") / "micro-anchor"
    config = micro_config(out, "model.max_position_embeddings=1024", max_steps=4)
    return train(config, show_progress=False)


def ruler(*args, **kwargs):
    return subprocess.run([*EVALKIT, "ruler", *args], capture_output=True, text=True, timeout=600, **kwargs)


def summaries(out: Path) -> dict[int, dict]:
    return {
        int(p.parent.name.split("-")[1]): json.loads(p.read_text()) for p in out.glob("*/step-*/ruler-summary.json")
    }


def test_end_to_end_outputs_and_average(tiny_run, tmp_path):
    out = tmp_path / "results"
    result = ruler("--ckpts", str(tiny_run), "--lengths", "512,1024", "--tasks", TASKS, "--samples", "3", "--avg",
                   "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = summaries(out)
    assert sorted(found) == [2, 4]
    for step, summary in found.items():
        assert summary["run"] == "micro-anchor" and summary["step"] == step
        assert {(r["task"], r["length"]) for r in summary["rows"]} == {
            (t, n) for t in ("niah_single_1", "niah_multikey_2", "fwe") for n in (512, 1024)
        }
        assert all(r["n"] == 3 and 0 <= r["value"] <= 100 for r in summary["rows"])
        assert {(s["task"], s["length"]) for s in summary["skipped"]} == {("cwe", 512), ("cwe", 1024)}
        assert all(s["min_length"] > 1024 for s in summary["skipped"])
        provenance = summary["provenance"]
        assert provenance["engine"]["engine"] == "hf" and provenance["engine"]["dtype"] == "fp32"
        assert provenance["git_hash"] and provenance["evalkit_version"]
        assert set(provenance["data_keys"]) == {f"{r['task']}@{r['length']}" for r in summary["rows"]}
        log = out / "micro-anchor" / f"step-{step}" / "ruler" / "niah_single_1" / "512.jsonl"
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["index"] for r in records] == [0, 1, 2]
        assert all(r["length"] + 128 <= 512 and r["references"] for r in records)
        assert all(len(r["depths"]) == len(r["references"]) for r in records)  # where each needle was
        fwe = (log.parent.parent / "fwe" / "512.jsonl").read_text().splitlines()
        assert not any("depths" in json.loads(line) for line in fwe)  # no needles, no depths

    # The --avg table against a computation from the summaries, done here by hand.
    table = (out / "ruler-avg.md").read_text()
    for length in (512, 1024):
        per_checkpoint = [
            statistics.fmean(r["value"] for r in found[step]["rows"] if r["length"] == length) for step in (2, 4)
        ]
        expected = f"{statistics.fmean(per_checkpoint):.2f} ± {statistics.pstdev(per_checkpoint):.2f}"
        assert expected in table
    assert "| micro-anchor | 2, 4 |" in table
    assert "skipped cwe @ 512" in result.stderr


@pytest.mark.slow
def test_rerun_computes_nothing_and_kill_resume_equals_straight_run(tiny_run, tmp_path):
    args = ["--ckpts", str(tiny_run / "step-4"), "--lengths", "1024", "--tasks", "niah_single_1,fwe", "--samples", "40",
            "--batch-size", "4"]  # fmt: skip
    straight = tmp_path / "straight"
    assert ruler(*args, "--out", str(straight)).returncode == 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*EVALKIT, "ruler", *args, "--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log = killed / "micro-anchor" / "step-4" / "ruler" / "niah_single_1" / "1024.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (log.exists() and log.read_text().count("\n") >= 32):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = log.read_text().count("\n") if log.exists() else 0
    assert 0 < partial < 40  # killed mid-task, after the first durable chunk

    resumed = ruler(*args, "--out", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    lines = lambda root: (root / "micro-anchor/step-4/ruler/niah_single_1/1024.jsonl").read_text().splitlines()  # noqa: E731
    by_index = lambda root: {json.loads(l)["index"]: json.loads(l) for l in lines(root)}  # noqa: E731,E741
    assert by_index(killed) == by_index(straight)  # no sample lost, none different
    assert summaries(killed)[4]["rows"] == summaries(straight)[4]["rows"]

    before, stamped = log.stat().st_mtime_ns, summaries(killed)[4]["provenance"]["created"]
    again = ruler(*args, "--out", str(killed))
    assert again.returncode == 0 and log.stat().st_mtime_ns == before  # nothing recomputed
    assert summaries(killed)[4]["provenance"]["created"] == stamped  # nor claimed by the rerun


def test_stored_results_and_skips_load_no_model(tiny_run, tmp_path, monkeypatch):
    """A rerun over complete sample logs, and a task skipped for missing data or size, answer
    from the tokenizer alone: the engine is never built, and the summary is the first one's."""
    import evalkit.engines
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import run_benchmark

    (ref,) = resolve_checkpoints([str(tiny_run / "step-4")])
    settings = RulerSettings(tasks=["niah_single_1", "qa_1", "cwe"], lengths=[512], num_samples=2)
    (first,) = run_benchmark(RulerBenchmark(settings), [ref], tmp_path / "out").summaries
    assert [row["task"] for row in first["rows"]] == ["niah_single_1"]

    def no_engine(*_args, **_kwargs):
        raise AssertionError("an engine was built for results already on disk")

    monkeypatch.setattr(evalkit.engines, "get_engine", no_engine)
    (again,) = run_benchmark(RulerBenchmark(settings), [ref], tmp_path / "out").summaries
    assert again["rows"] == first["rows"] and again["skipped"] == first["skipped"]
    assert {skip["task"] for skip in again["skipped"]} == {"qa_1", "cwe"}
    assert again["provenance"]["engine"] == first["provenance"]["engine"]  # the engine that answered
    assert again["provenance"]["engine"]["engine"] == "hf"
    assert again["provenance"]["created"] == first["provenance"]["created"]

    # One sample more to answer: now the engine is needed, and asked for.
    with pytest.raises(AssertionError, match="already on disk"):
        run_benchmark(
            RulerBenchmark(RulerSettings(tasks=["niah_single_1"], lengths=[512], num_samples=3)),
            [ref],
            tmp_path / "out",
        )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ckpts", "/no/such/run"], "no checkpoint at /no/such/run"),
        (["--tasks", "niah_single_9"], "unknown RULER task 'niah_single_9'"),
        (["--lengths", "4q"], "could not read length '4q'"),
        (["--lengths", "2048"], "length 2048 is beyond the window"),
    ],
)
def test_bad_input_is_one_line_error(tiny_run, tmp_path, args, message):
    if "--ckpts" not in args:
        args = ["--ckpts", str(tiny_run), *args]
    result = ruler(*args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_checkpoint_without_tokenizer_is_refused(tiny_run, tmp_path):
    import shutil

    bare = tmp_path / "bare" / "step-4"
    shutil.copytree(tiny_run / "step-4", bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    result = ruler("--ckpts", str(bare), "--lengths", "512", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "has no tokenizer files" in result.stderr


@pytest.mark.slow
def test_lengths_run_in_pieces_add_up_in_one_summary(tiny_run, tmp_path):
    """`--lengths 512` then `--lengths 1024` into one --out: the summary holds both (as one run of
    512,1024 would); a piece evaluated otherwise (other sample count) replaces, never mixes."""
    out, whole = tmp_path / "pieces", tmp_path / "whole"
    common = ["--ckpts", str(tiny_run), "--last", "1", "--tasks", "niah_single_1,cwe", "--samples", "2"]
    for lengths, target in (("512", out), ("1024", out), ("512,1024", whole)):
        result = ruler(*common, "--lengths", lengths, "--out", str(target))
        assert result.returncode == 0, result.stderr
        if lengths == "512":  # the engine record as evalkit wrote it while it had a fast decoding step
            (first,) = out.glob("*/step-*/ruler-summary.json")
            written = json.loads(first.read_text())
            written["provenance"]["engine"].update(decode_path="fast", decode_path_reason="a Llama model")
            first.write_text(json.dumps(written))
    (pieces,), (reference,) = summaries(out).values(), summaries(whole).values()
    assert pieces["rows"] == reference["rows"] and pieces["skipped"] == reference["skipped"]
    assert [(r["task"], r["length"]) for r in pieces["rows"]] == [("niah_single_1", 512), ("niah_single_1", 1024)]
    assert pieces["provenance"]["settings"]["lengths"] == [512, 1024]
    assert pieces["provenance"]["data_keys"] == reference["provenance"]["data_keys"]
    first_stamp = pieces["provenance"]["earlier_cells_stamps"][0]
    assert first_stamp["command"].endswith(f"--lengths 512 --out {out}")
    # A third piece (512 again: nothing to compute) keeps both earlier pieces' stamps, oldest first.
    assert ruler(*common, "--lengths", "512", "--out", str(out)).returncode == 0
    (again,) = summaries(out).values()
    assert again["provenance"]["earlier_cells_stamps"] == [
        first_stamp,
        {k: pieces["provenance"][k] for k in first_stamp},
    ]

    result = ruler(*common[:-1], "3", "--lengths", "1024", "--out", str(out))
    assert result.returncode == 0, result.stderr
    (changed,) = summaries(out).values()
    assert [(r["task"], r["length"], r["n"]) for r in changed["rows"]] == [("niah_single_1", 1024, 3)]


CHAT_TEMPLATE = (
    "{% for m in messages %}[USER] {{ m['content'] }}{% endfor %}{% if add_generation_prompt %} [ASSISTANT]{% endif %}"
)


def with_chat_template(checkpoint: Path, destination: Path) -> Path:
    import shutil

    shutil.copytree(checkpoint, destination)
    config_path = destination / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return destination


def test_chat_prompt_format_feeds_the_template_once_with_one_bos(tiny_run, tmp_path, monkeypatch):
    import evalkit.engines
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import run_benchmark

    chat_checkpoint = with_chat_template(sorted(tiny_run.glob("step-*"))[-1], tmp_path / "chat-run" / "step-4")
    fed = []
    real_get_engine = evalkit.engines.get_engine

    def recording_engine(*args, **kwargs):
        engine = real_get_engine(*args, **kwargs)
        real_generate = engine.generate
        engine.generate = lambda prompts, *a, **k: fed.extend(prompts) or real_generate(prompts, *a, **k)
        return engine

    monkeypatch.setattr(evalkit.engines, "get_engine", recording_engine)
    (ref,) = resolve_checkpoints([str(chat_checkpoint)])
    settings = RulerSettings(tasks=["niah_single_1"], lengths=[512], num_samples=2, prompt_format="chat")
    (summary,) = run_benchmark(RulerBenchmark(settings), [ref], tmp_path / "out").summaries
    engine_tokenizer = real_get_engine("hf", chat_checkpoint, dtype="fp32").tokenizer
    assert len(fed) == 2
    for ids in fed:
        assert (
            isinstance(ids, list)
            and ids.count(engine_tokenizer.bos_token_id) == 1
            and ids[0] == engine_tokenizer.bos_token_id
        )
        text = engine_tokenizer.decode(ids, skip_special_tokens=True)
        assert text.startswith("[USER] ") and " [ASSISTANT]" in text
        assert len(ids) + 128 <= 512  # sized with the template around it
    assert summary["provenance"]["settings"]["prompt_format"] == "chat" and summary["rows"][0]["n"] == 2

    # Base into the same --out afterwards: different prompts, so the chat cells are not mixed in.
    base = RulerSettings(tasks=["niah_single_1"], lengths=[512], num_samples=2)
    (base_summary,) = run_benchmark(RulerBenchmark(base), [ref], tmp_path / "out").summaries
    assert base_summary["provenance"]["settings"]["prompt_format"] == "base"
    assert base_summary["provenance"]["data_keys"] != summary["provenance"]["data_keys"]


def test_chat_prompt_format_without_a_template_is_one_line(tiny_run, tmp_path):
    result = ruler("--ckpts", str(sorted(tiny_run.glob("step-*"))[-1]), "--lengths", "512", "--tasks", "niah_single_1",
                   "--samples", "2", "--prompt-format", "chat", "--out", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no chat template" in result.stderr
    result = ruler("--ckpts", str(tiny_run), "--prompt-format", "instruct", "--out", str(tmp_path / "out2"))
    assert result.returncode == 2 and "--prompt-format must be one of base, chat" in result.stderr
