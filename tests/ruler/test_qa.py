"""qa_1 / qa_2 from local SQuAD v2 and HotpotQA files; missing data is a TaskDataMissing, never a 0."""

import json
import re

import pytest

from evalkit.ruler import TaskDataMissing, generate
from tests.helpers import exact_length

DOCUMENT = re.compile(r"(?:^|\n\n)Document (\d+):\n(.*?)(?=\n\nDocument \d+:\n|\n\nAnswer the question based)", re.S)


def documents_of(sample):
    context = sample.input.split("The following are given documents.\n\n", 1)[1]
    found = DOCUMENT.findall(context)
    assert [int(i) for i, _ in found] == list(range(1, len(found) + 1))
    return [text for _, text in found]


def test_squad_gold_paragraph_is_among_distractors(tokenizer, qa_dir):
    squad = json.loads((qa_dir / "dev-v2.0.json").read_text())
    answerable = [
        (qa["question"], p["context"], [a["text"] for a in qa["answers"]])
        for article in squad["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
        if not qa["is_impossible"]
    ]
    samples = generate("qa_1", tokenizer, 4096, 6, qa_dir=qa_dir)
    for sample, (question, gold, answers) in zip(samples, answerable):  # sample i asks answerable question i
        assert sample.input.endswith(f"\n\nQuestion: {question}")
        assert sample.answer_prefix == " Answer:"
        assert sample.outputs == answers
        documents = documents_of(sample)
        assert gold in documents and len(documents) > 5
        assert all(answer in gold for answer in answers)
        assert sample.length == exact_length(tokenizer, sample) <= 4096 - 32


def test_hotpotqa_keeps_all_ten_paragraphs_of_the_question(tokenizer, qa_dir):
    hotpot = json.loads((qa_dir / "hotpot_dev_distractor_v1.json").read_text())
    samples = generate("qa_2", tokenizer, 8192, 4, qa_dir=qa_dir)
    for sample, item in zip(samples, hotpot):
        documents = documents_of(sample)
        for title, sentences in item["context"]:
            assert f"{title}\n{''.join(sentences)}" in documents
        assert len(documents) > 10
        assert sample.outputs == [item["answer"]]
        assert sample.length == exact_length(tokenizer, sample) <= 8192 - 32


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_missing_qa_data_is_reported_with_the_reason(task, tokenizer, tmp_path):
    with pytest.raises(TaskDataMissing, match="qa_dir="):
        generate(task, tokenizer, 4096, 2)
    with pytest.raises(TaskDataMissing, match="not found") as missing:
        generate(task, tokenizer, 4096, 2, qa_dir=tmp_path)
    assert missing.value.task == task and missing.value.length == 4096


def test_a_file_in_the_wrong_format_is_reported(tokenizer, tmp_path):
    (tmp_path / "dev-v2.0.json").write_text(json.dumps({"data": [{"title": "x"}]}))
    with pytest.raises(TaskDataMissing, match="not in the SQuAD v2 dev format"):
        generate("qa_1", tokenizer, 4096, 2, qa_dir=tmp_path)


def test_the_data_key_follows_the_files_content_not_where_it_lies(tokenizer, qa_dir, tmp_path):
    """A QA file copied elsewhere (or staged anew on each node of a cluster: another path, another
    mtime) is the same data, with the same key; one byte changed is other data."""
    import os
    import shutil

    from evalkit.ruler.cache import cache_key

    copy = tmp_path / "staged"
    shutil.copytree(qa_dir, copy)
    for path in copy.iterdir():
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    here = cache_key("qa_1", tokenizer, 1024, qa_dir=str(qa_dir))
    assert cache_key("qa_1", tokenizer, 1024, qa_dir=str(copy)) == here
    squad = copy / "dev-v2.0.json"
    squad.write_bytes(squad.read_bytes().replace(b"?", b"!", 1))
    assert cache_key("qa_1", tokenizer, 1024, qa_dir=str(copy)) != here
    assert cache_key("qa_2", tokenizer, 1024, qa_dir=str(copy)) == cache_key(
        "qa_2", tokenizer, 1024, qa_dir=str(qa_dir)
    )
