"""The retrieval check's spans and token alignment, against oracle and blind stand-in models."""

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evalkit.train.config import DataConfig
from evalkit.train.data import BuiltinSource
from evalkit.train.retrieval_check import HELD_OUT_FROM, answer_accuracy, span_tokens
from evalkit.train.synthetic import copy_example, retrieval_example


@pytest.mark.parametrize("index", range(0, 400, 7))
def test_spans_name_each_asked_value_stated_before_it_is_asked(index):
    example = retrieval_example(index, seed=3, max_tokens=1024)
    trained = BuiltinSource(DataConfig(retrieval_fraction=1.0, num_retrieval_docs=400), seed=3, seq_len=1024)
    assert example.text == trained[index][0]  # the document training reads
    assert example.answers and len(example.facts) == len(example.answers)
    questions_start = example.text.rindex("\n", 0, example.answers[0][0]) + 1
    for (a, b), (c, d) in zip(example.facts, example.answers):
        assert re.fullmatch(r"\d{7}", example.text[a:b])
        assert example.text[a:b] == example.text[c:d]
        assert b <= questions_start <= c  # stated in the body, repeated in the closing questions


def test_span_tokens_keep_only_tokens_inside_the_span():
    offsets = [(0, 0), (0, 3), (3, 4), (4, 8), (8, 10), (10, 10)]
    assert span_tokens(offsets, (3, 10)) == [2, 3, 4]  # not the empty special token at the end
    assert span_tokens(offsets, (2, 9)) == [2, 3]  # a token crossing either edge is left out


class Oracle:
    """Knows the document: puts its whole mass on each true next token."""

    def __call__(self, input_ids):
        ids = input_ids[0]
        logits = torch.zeros(1, len(ids), 4096)
        logits[0, torch.arange(len(ids) - 1), ids[1:]] = 20.0
        return SimpleNamespace(logits=logits)


class Blind:
    """Uniform over the vocabulary: every token has NLL ln(V)."""

    def __call__(self, input_ids):
        return SimpleNamespace(logits=torch.zeros(1, input_ids.shape[1], 4096))


def test_an_oracle_scores_one_and_a_blind_model_chance(tokenizer):
    oracle = answer_accuracy(Oracle(), tokenizer, max_tokens=512, documents=12)
    assert oracle["documents"] > 0 and oracle["answer_tokens"] > 0 and oracle["fact_tokens"] > 0
    assert oracle["answer_accuracy"] == 1.0 and oracle["fact_accuracy"] == 1.0
    assert oracle["answer_nll"] < 1e-3
    blind = answer_accuracy(Blind(), tokenizer, max_tokens=512, documents=12)
    assert blind["answer_nll"] == pytest.approx(math.log(4096), rel=1e-5)
    assert blind["answer_tokens"] == oracle["answer_tokens"]


def test_a_model_right_on_answers_only_beats_the_control(tokenizer):
    """Right where the document repeats a value (it looks it up), blind where it is first stated."""
    documents = 8
    knows = {}  # per document's token ids: the rows whose next token the model predicts
    for index in range(HELD_OUT_FROM, HELD_OUT_FROM + documents):
        example = retrieval_example(index, 12_345, 512)
        encoded = tokenizer(example.text, return_offsets_mapping=True)
        rows = torch.zeros(len(encoded["input_ids"]), dtype=torch.bool)
        for span in example.answers:
            for t in span_tokens(encoded["offset_mapping"], span):
                rows[t - 1] = True
        knows[tuple(encoded["input_ids"])] = rows

    class AnswersOnly(Oracle):
        def __call__(self, input_ids):
            out = super().__call__(input_ids)
            out.logits[0, ~knows[tuple(input_ids[0].tolist())]] = 0.0
            return out

    result = answer_accuracy(AnswersOnly(), tokenizer, max_tokens=512, documents=documents)
    assert result["documents"] > 0
    assert result["answer_accuracy"] == 1.0
    assert result["fact_nll"] == pytest.approx(math.log(4096), rel=1e-5)


@pytest.mark.parametrize("phrasing", ["varied", "broad"])
@pytest.mark.parametrize("index", range(0, 200, 9))
def test_varied_phrasing_keeps_every_asked_value_stated_before_and_answered_last(index, phrasing):
    example = retrieval_example(index, 0, 512, phrasing)
    assert example.text != retrieval_example(index, 0, 512).text
    lines = example.text.split("\n")
    assert len(lines) - 1 == len(example.answers)
    for (a, b), (c, d), line in zip(example.facts, example.answers, lines[1:]):
        value = example.text[c:d]
        assert re.fullmatch(r"\d{7}", value) and example.text[a:b] == value and b <= len(lines[0]) < c
        assert line.endswith(value + ".")


def test_broad_phrasing_is_its_own_stream_with_the_wider_wording():
    varied = [retrieval_example(i, 0, 512, "varied").text for i in range(300)]
    broad = [retrieval_example(i, 0, 512, "broad").text for i in range(300)]
    assert not set(varied) & set(broad)
    joined = "\n".join(broad)
    for wording in ("special magic number", "One of the ", " mentioned in the provided text"):
        assert wording in joined and wording not in "\n".join(varied)


def test_copy_spans_are_exact_repeats_of_their_first_occurrence():
    trained = BuiltinSource(DataConfig(retrieval_fraction=0.0, copy_fraction=1.0, num_retrieval_docs=20), 0, 512)
    for index in range(20):
        example = copy_example(index, 0, 512)
        assert example.text == trained[index][0]  # the document training reads
        assert len(example.facts) == len(example.answers) >= 1
        for (a, b), (c, d) in zip(example.facts, example.answers):
            assert b <= c and example.text[a:b] == example.text[c:d] and example.text[a:b].strip()
            assert example.text[c - 1] == " "  # the repeat starts at an item boundary


def test_the_copy_check_scores_an_oracle_one_and_a_blind_model_chance(tokenizer):
    oracle = answer_accuracy(Oracle(), tokenizer, max_tokens=512, documents=8, kind="copy")
    assert oracle["answer_tokens"] > 50 and oracle["answer_accuracy"] == 1.0
    blind = answer_accuracy(Blind(), tokenizer, max_tokens=512, documents=8, kind="copy")
    assert blind["answer_nll"] == pytest.approx(math.log(4096), rel=1e-5)


def _command():
    """scripts/retrieval_check.py's main (a script, not a module of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "retrieval_check", Path(__file__).parents[2] / "scripts" / "retrieval_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_the_command_refuses_a_path_without_a_checkpoint(tmp_path, capsys):
    main = _command()
    assert main([str(tmp_path)]) == 2
    assert "not a checkpoint" in capsys.readouterr().err


def test_a_run_directory_stands_for_its_checkpoints_and_the_report_names_the_command(tmp_path, capsys):
    from evalkit.train import train
    from tests.train.helpers import micro_config

    main = _command()
    run = train(micro_config(tmp_path / "run", max_steps=4), show_progress=False)  # checkpoints at 2 and 4
    out = tmp_path / "check.md"
    assert main([str(run), "--max-tokens", "128", "--documents", "4", "--kind", "copy", "--out", str(out)]) == 0
    report = out.read_text()
    assert "step-2 |" in report and "step-4 |" in report
    assert f"python scripts/retrieval_check.py {run} --max-tokens 128" in report and "Machine:" in report
