"""`python -m perf eval`: engines timed on the same RULER samples, with what each computed."""

import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.ruler.cache import load_or_generate
from perf import eval as bench
from tests.helpers import build_checkpoint

ROOT = Path(__file__).resolve().parents[2]  # `python -m perf` runs from the repository's root


@pytest.fixture(scope="module")
def checkpoint_512(tmp_path_factory, tokenizer):
    """A tiny Llama whose window holds RULER at 512 tokens."""
    directory = tmp_path_factory.mktemp("tiny-512")
    build_checkpoint(directory, tokenizer, max_position_embeddings=512, initializer_range=0.02, pad_token_id=None)
    return directory


def adjacent_shared_tokens(prompts: list[list[int]]) -> int:
    """Tokens a row can take from the one before it, rows in sorted order, one token always fed."""
    order = sorted(prompts)
    total = 0
    for before, row in pairwise(order):
        common = 0
        while common < min(len(before), len(row)) and before[common] == row[common]:
            common += 1
        total += min(common, len(row) - 1)
    return total


def test_engines_answer_the_same_samples_and_sharing_is_counted(checkpoint_512, tokenizer):
    rows = bench.run(checkpoint_512, ["hf", "hf-padded"], ["niah_single_2", "qa_1"], [512], 6, batch_size=4)
    by_engine = {(r.engine, r.task): r for r in rows}
    shared, padded = by_engine["hf", "niah_single_2"], by_engine["hf-padded", "niah_single_2"]
    samples = load_or_generate("niah_single_2", tokenizer, 512, 6, 42)
    prompts = [tokenizer(s.input + s.answer_prefix)["input_ids"] for s in samples]
    assert shared.prompt_tokens == padded.prompt_tokens == sum(len(p) for p in prompts)
    assert padded.computed_tokens == padded.prompt_tokens  # nothing shared
    saved = adjacent_shared_tokens(prompts)
    assert saved > 0 and shared.computed_tokens == shared.prompt_tokens - saved
    assert shared.same_as_first == padded.same_as_first == 6  # the same predictions either way
    assert shared.score == padded.score
    assert shared.seconds > 0 and shared.prefill_seconds + shared.decode_seconds <= shared.seconds
    assert by_engine["hf", "qa_1"].skipped  # no QA files given: a row saying why, not an error
    table = bench.to_markdown(rows)
    assert "| hf-padded | niah_single_2 | 512 | 6 |" in table and "6/6" in table
    assert "Skipped: qa_1 at 512" in table and "Total wall time per engine" in table


def test_unknown_or_repeated_engine_variants_are_refused():
    with pytest.raises(
        UserError, match="unknown engine variant.*fast.*choose from: hf, hf-1thread, hf-padded, vllm.*lm-eval"
    ):
        bench.parse_engines("hf,fast")
    assert bench.parse_engines("hf,vllm,hf") == ["hf", "vllm"]  # every list option keeps each value once


def test_the_command_refuses_bad_input_in_one_line(checkpoint_512, tmp_path):
    result = subprocess.run([sys.executable, "-m", "perf", "eval", "--ckpt", str(checkpoint_512),
                             "--engines", "hf,turbo", "--out", str(tmp_path / "r.md")],
                            capture_output=True, text=True, check=False, cwd=ROOT)  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "unknown engine variant(s) turbo" in result.stderr and not (tmp_path / "r.md").exists()


def test_the_command_writes_its_report_with_conditions(checkpoint_512, tmp_path):
    report = tmp_path / "eval.md"
    result = subprocess.run([sys.executable, "-m", "perf", "eval", "--ckpt", str(checkpoint_512),
                             "--engines", "hf,hf-padded", "--lengths", "512", "--tasks", "niah_single_1",
                             "--samples", "2", "--dtype", "fp32", "--out", str(report)],
                            capture_output=True, text=True, check=False, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    text = report.read_text()
    assert "Command: `python -m perf eval" in text and "2 RULER samples per task and length" in text
    assert "| hf | niah_single_1 | 512 | 2 |" in text and "| hf-padded | niah_single_1 | 512 | 2 |" in text


def test_lm_eval_runs_its_own_ruler_port_beside_the_engines(checkpoint_512):
    """lm-eval's RULER port with its HF model: timed on its own samples, its score on the 0-100 scale;
    a task whose data lm-eval downloads is a skipped row, not an error."""
    rows = bench.run(checkpoint_512, ["hf", "lm-eval"], ["niah_single_1", "niah_single_2"], [512], 2, batch_size=2)
    by_engine = {(r.engine, r.task): r for r in rows}
    ours = by_engine["lm-eval", "niah_single_1"]
    assert ours.samples == 2 and ours.seconds > 0 and 0.0 <= ours.score <= 100.0
    assert ours.same_as_first is None and ours.prefill_seconds is None  # its samples, not ours
    assert 0 < ours.prompt_tokens / ours.samples <= 512
    assert by_engine["lm-eval", "niah_single_2"].skipped.startswith("lm-eval downloads")
    table = bench.to_markdown(rows)
    assert "| lm-eval | niah_single_1 | 512 | 2 |" in table and "own samples" in table
    assert "Skipped: niah_single_2 at 512 (lm-eval downloads" in table
