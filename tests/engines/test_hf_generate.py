"""Greedy generation: equal to the slow no-cache loop, independent of batching, EOS and stops, no truncation."""

import pytest

from evalkit.engines import get_engine
from evalkit.errors import UserError
from tests.helpers import build_checkpoint, copy_with_config, decode, greedy_without_cache

PROMPTS = [
    "The grass is green.",
    "One",
    "Some special magic numbers are hidden within the following text. Make sure to memorize it.",
    "What are all the special magic numbers for",
    "Here we go. There and back again.",
    "A",
    "The sun is yellow. The sky is blue.",
]


def engine_for(checkpoint, **settings):
    path, _ = checkpoint
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


def test_generate_equals_greedy_loop_without_kv_cache(checkpoint, tokenizer):
    _, model = checkpoint
    engine = engine_for(checkpoint, batch_size=4)  # padded batches of different lengths
    outputs = engine.generate(PROMPTS, max_new_tokens=12)
    for prompt, output in zip(PROMPTS, outputs):
        expected = greedy_without_cache(model, tokenizer(prompt)["input_ids"], 12, {tokenizer.eos_token_id})
        assert output == decode(tokenizer, expected)


@pytest.mark.parametrize(
    ("architecture", "changes"),
    [
        ("mistral", {"sliding_window": 16}),
        ("qwen2", {}),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    ],
)
def test_other_architectures_generate_as_the_loop_without_a_cache(tokenizer, tmp_path, architecture, changes):
    """A padded batch (two prompt lengths) of each architecture family the engine serves."""
    model = build_checkpoint(tmp_path, tokenizer, architecture, **changes)
    model.set_attn_implementation("sdpa")
    prompts = [[tokenizer.bos_token_id, *range(300, 300 + n)] for n in (5, 11)]
    outputs = get_engine("hf", tmp_path, dtype="fp32", device="cpu", batch_size=2).generate(prompts, 8)
    for ids, output in zip(prompts, outputs):
        assert output == decode(tokenizer, greedy_without_cache(model, ids, 8, {tokenizer.eos_token_id}))


def test_batched_generation_equals_one_at_a_time(checkpoint):
    one = engine_for(checkpoint, batch_size=1).generate(PROMPTS, max_new_tokens=16)
    batched = engine_for(checkpoint, batch_size=3).generate(PROMPTS, max_new_tokens=16)
    everything = engine_for(checkpoint, batch_size=len(PROMPTS)).generate(PROMPTS, max_new_tokens=16)
    assert one == batched == everything


def test_token_id_prompts_are_fed_as_given(checkpoint, tokenizer):
    engine = engine_for(checkpoint)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    assert engine.generate(ids, max_new_tokens=6) == engine.generate(PROMPTS[:3], max_new_tokens=6)


def test_stop_strings_cut_the_output(checkpoint):
    engine = engine_for(checkpoint, batch_size=4)
    full = engine.generate(PROMPTS, max_new_tokens=20)
    stops = [text[len(text) // 2 : len(text) // 2 + 2] for text in full]  # a piece from the middle of each
    for prompt, text, stop in zip(PROMPTS, full, stops):
        assert stop, "the tiny model should produce some text"
        (cut,) = engine.generate([prompt], max_new_tokens=20, stop=[stop])
        assert cut == text[: text.index(stop)]
    assert engine.generate(PROMPTS[:2], max_new_tokens=20, stop=["\x00never"]) == full[:2]


def test_generation_stops_at_an_eos_token(checkpoint, tokenizer, tmp_path):
    path, model = checkpoint
    prompt_ids = tokenizer(PROMPTS[0])["input_ids"]
    free = greedy_without_cache(model, prompt_ids, 12, set())
    stop_at = next(i for i, token in enumerate(free) if i >= 2 and token not in free[:i])
    # Declare the token the model emits at step `stop_at` an EOS of the model (as Llama-3 lists several).
    eos_path = copy_with_config(path, tmp_path / "eos", eos_token_id=[tokenizer.eos_token_id, free[stop_at]])
    engine = get_engine("hf", eos_path, dtype="fp32", device="cpu")
    assert engine.generate([PROMPTS[0]], max_new_tokens=12) == [decode(tokenizer, free[:stop_at])]


def test_over_long_prompt_is_an_error_naming_the_lengths(checkpoint, tokenizer):
    engine = engine_for(checkpoint, max_length=40)
    long_prompt = [tokenizer.bos_token_id] + [300] * 29  # 30 tokens
    with pytest.raises(UserError, match=r"prompt of 30 tokens \+ 16 new tokens = 46 exceeds the model window of 40"):
        engine.generate(["short", long_prompt], max_new_tokens=16)
    assert len(engine.generate([long_prompt], max_new_tokens=10)[0]) > 0  # exactly 40: fits


def test_bf16_engine_generates(checkpoint):
    path, _ = checkpoint
    engine = get_engine("hf", path, dtype="bf16", device="cpu", batch_size=2)
    outputs = engine.generate(PROMPTS[:3], max_new_tokens=4)
    assert len(outputs) == 3 and all(isinstance(o, str) for o in outputs)


def test_padded_prefill_rows_get_the_positions_they_would_have_alone(checkpoint, monkeypatch):
    """RoPE makes a shifted row almost equal in fp32, which hides wrong positions; in bf16 they matter."""
    engine = engine_for(checkpoint, batch_size=len(PROMPTS), prefill="padded")
    calls = []
    original = engine.model.forward

    def recording_forward(*args, **kwargs):
        calls.append({k: kwargs[k] for k in ("position_ids", "attention_mask")})
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", recording_forward)
    engine.generate(PROMPTS, max_new_tokens=3)
    prefill, first_step = calls[0], calls[1]
    lengths = sorted((engine.count_tokens(p) for p in PROMPTS), reverse=True)  # rows are sorted longest first
    for row, length in enumerate(lengths):
        real = prefill["attention_mask"][row].bool()
        assert int(real.sum()) == length and bool(real[-length:].all())  # padding on the left only
        assert prefill["position_ids"][row][real].tolist() == list(range(length))
        assert first_step["position_ids"][row].tolist() == [length]


def test_growing_cache_layer_holds_what_concatenation_would():
    """The decode cache writes new columns in place; past its room it grows; dropped rows go."""
    import torch
    from transformers.cache_utils import DynamicLayer

    from evalkit.engines.hf import _growing_layer_class

    torch.manual_seed(0)
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    growing, reference = _growing_layer_class()(keys, values, room=2), DynamicLayer()
    reference.update(keys, values)
    for step in range(4):  # the third step outgrows the room of 2
        new_keys, new_values = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        got, expected = growing.update(new_keys, new_values), reference.update(new_keys, new_values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert growing.get_seq_length() == reference.get_seq_length() == 6 + step
    rows = torch.tensor([2, 0])
    growing.batch_select_indices(rows)
    reference.batch_select_indices(rows)
    assert torch.equal(growing.keys, reference.keys) and torch.equal(growing.values, reference.values)


def test_threads_setting_holds_while_the_engine_computes_and_is_restored(checkpoint, monkeypatch):
    """Several engines share a process in `python -m perf eval`: one's thread count must not leak."""
    import torch

    engine = engine_for(checkpoint, threads=2)
    seen = []
    forward = engine.model.forward
    monkeypatch.setattr(
        engine.model, "forward", lambda *a, **k: seen.append(torch.get_num_threads()) or forward(*a, **k)
    )
    before = torch.get_num_threads()
    engine.generate(PROMPTS[:2], max_new_tokens=3)
    engine.loglikelihood([("The grass", " is green.")])
    assert seen and set(seen) == {2} and torch.get_num_threads() == before == 1
    assert engine.engine_info()["threads"] == 2
    with pytest.raises(UserError, match="threads must be at least 1, got 0"):
        engine_for(checkpoint, threads=0)
