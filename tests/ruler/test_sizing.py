"""Every task's lengths: exact with the evaluated tokenizer, never above the target, a clear error when none fits."""

import warnings

import pytest

from evalkit.ruler import SPECS, TASKS, TaskDoesNotFit, generate
from evalkit.ruler import generation as generate_module
from tests.helpers import exact_length


@pytest.mark.parametrize("task", TASKS)
def test_small_vocabulary_lengths_are_exact_and_within_target(task, small_tokenizer, qa_dir):
    length = 12000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the composed counts must hold: no fallback to full tokenisation
        samples = generate(task, small_tokenizer, length, 4, seed=11, qa_dir=qa_dir)
    assert len(samples) == 4
    for sample in samples:
        assert sample.outputs and all(sample.outputs)
        assert sample.length == exact_length(small_tokenizer, sample)
        assert sample.length + SPECS[task].max_new_tokens <= length


@pytest.mark.parametrize("task, length", [("vt", 600), ("cwe", 1024), ("niah_multikey_3", 300), ("fwe", 200)])
def test_too_small_a_length_names_the_length_that_fits(task, length, small_tokenizer):
    with pytest.raises(TaskDoesNotFit) as error:
        generate(task, small_tokenizer, length, 5)
    needed = error.value.min_length
    assert needed > length and f"at least {needed} tokens" in str(error.value)
    samples = generate(task, small_tokenizer, needed, 5)  # and that length does fit
    assert all(sample.length + SPECS[task].max_new_tokens <= needed for sample in samples)


def test_cwe_at_4k_does_not_fit_a_small_vocabulary_instead_of_emitting_empty_samples(small_tokenizer):
    with pytest.raises(TaskDoesNotFit, match="cwe at length 4096"):
        generate("cwe", small_tokenizer, 4096, 3)


def test_exact_mode_gives_exact_lengths(tokenizer):
    samples = generate("niah_multivalue", tokenizer, 3000, 3, exact_lengths=True)
    assert [s.length for s in samples] == [exact_length(tokenizer, s) for s in samples]
    assert all(s.length <= 3000 - 128 for s in samples)


def test_falls_back_to_full_tokenisation_when_composed_counts_disagree(tokenizer, monkeypatch):
    monkeypatch.setattr(generate_module, "_composed_counts_hold", lambda ctx, samples: False)
    with pytest.warns(UserWarning, match="tokenising every prompt in full"):
        samples = generate("vt", tokenizer, 2500, 3)
    assert [s.length for s in samples] == [exact_length(tokenizer, s) for s in samples]


def test_chat_format_counts_the_wrapped_prompt(tokenizer):
    from transformers import PreTrainedTokenizerFast

    from evalkit.ruler import PromptFormat

    chat = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, bos_token="<s>", eos_token="</s>")
    chat.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    fmt = PromptFormat.from_chat_template(chat)
    assert fmt.before == "<s><|user|>\n" and fmt.between == "</s>\n<|assistant|>\n" and not fmt.add_special_tokens
    samples = generate("niah_single_1", chat, 2048, 2, prompt_format=fmt)
    for sample in samples:
        prompt = fmt.render(sample.input, sample.answer_prefix)
        assert prompt.startswith("<s><|user|>\nA special magic number") and prompt.endswith("text is")
        assert sample.length == len(chat(prompt, add_special_tokens=False)["input_ids"]) <= 2048 - 128
