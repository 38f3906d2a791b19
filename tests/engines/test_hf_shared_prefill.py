"""The shared-prefix prefill: each row alone, continuing from the K/V of the prefix it shares with
the row before. Checked against the slow no-cache loop, the padded prefill, and counts by hand."""

import pytest
import torch

from evalkit.engines import get_engine
from evalkit.errors import UserError
from tests.helpers import decode, full_logits, greedy_without_cache

PREFIX = list(range(300, 340))  # 40 tokens every prompt below starts with (after BOS)


def prompts_sharing_a_prefix(tokenizer) -> list[list[int]]:
    bos = tokenizer.bos_token_id
    return [
        [bos, *PREFIX, 500, 501, 502],
        [bos, *PREFIX[:25], 600, 601],  # shares only 1 + 25 tokens with the others
        [bos, *PREFIX, 500, 501, 502],  # a duplicate: everything but its last token is reused
        [bos, *PREFIX, 500],  # a prefix of the first
        [bos, *PREFIX, 700, 701, 702, 703, 704],
        [bos, 900, 901],  # shares only BOS
    ]


def engine_for(checkpoint, **settings):
    path, _ = checkpoint
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


@pytest.mark.parametrize("batch_size", [1, 2, 6])
def test_shared_prefill_equals_the_greedy_loop_without_a_cache(checkpoint, tokenizer, batch_size):
    _, model = checkpoint
    prompts = prompts_sharing_a_prefix(tokenizer)
    outputs = engine_for(checkpoint, batch_size=batch_size, prefill="shared").generate(prompts, max_new_tokens=10)
    for ids, output in zip(prompts, outputs):
        assert output == decode(tokenizer, greedy_without_cache(model, ids, 10, {tokenizer.eos_token_id}))


def test_shared_and_padded_prefill_give_the_same_outputs(checkpoint, tokenizer):
    prompts = prompts_sharing_a_prefix(tokenizer)
    shared = engine_for(checkpoint, batch_size=4, prefill="shared").generate(prompts, max_new_tokens=12)
    padded = engine_for(checkpoint, batch_size=4, prefill="padded").generate(prompts, max_new_tokens=12)
    assert shared == padded


def test_each_row_gets_the_logits_of_a_full_forward_alone(checkpoint, tokenizer):
    _, model = checkpoint
    engine = engine_for(checkpoint, batch_size=3, prefill="shared")
    prompts = sorted(prompts_sharing_a_prefix(tokenizer))
    with torch.inference_mode():
        state, _ = engine._prefill_rows(prompts[:3], engine._prefill_rows(prompts[3:], _last_row())[1])
    for row, ids in enumerate(prompts[:3]):
        torch.testing.assert_close(state.logits[row], full_logits(model, ids)[-1], rtol=0, atol=1e-5)


def _last_row():
    from evalkit.engines.hf import _PrefilledRow

    return _PrefilledRow()


def test_only_the_unshared_tokens_are_computed(checkpoint, tokenizer, monkeypatch):
    engine = engine_for(checkpoint, batch_size=2, prefill="shared")
    prompts = prompts_sharing_a_prefix(tokenizer)
    prefills = []
    original = engine.model.forward

    def recording_forward(*args, **kwargs):
        if kwargs["attention_mask"] is None:  # a row's prefill; decoding steps carry the batch's mask
            prefills.append((kwargs["input_ids"][0].tolist(), kwargs["position_ids"][0].tolist()))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", recording_forward)
    engine.generate(prompts, max_new_tokens=2)
    b, p = tokenizer.bos_token_id, PREFIX
    # Sorted as token sequences (P starts at 300 < 600 < 900), each row and what it shares with the one before:
    expected = [
        ([b, *p, 500], 0),  # nothing before it: all 42 computed
        ([b, *p, 500, 501, 502], 42),
        ([b, *p, 500, 501, 502], 43),  # the duplicate: all shared, but its last token is fed for the logits
        ([b, *p, 700, 701, 702, 703, 704], 41),
        ([b, *p[:25], 600, 601], 26),
        ([b, 900, 901], 1),  # BOS
    ]
    assert prefills == [(ids[shared:], list(range(shared, len(ids)))) for ids, shared in expected]
    assert engine.stats.prompt_tokens == sum(len(ids) for ids in prompts)
    assert engine.stats.prefill_tokens == 42 + 2 + 1 + 5 + 2 + 2
    assert engine.stats.prompts == len(prompts)


def test_an_unknown_prefill_mode_is_refused(checkpoint):
    with pytest.raises(UserError, match="prefill must be one of auto, shared, padded"):
        engine_for(checkpoint, prefill="fast")


def test_auto_prefill_shares_on_cpu_and_the_choice_is_recorded(checkpoint, tokenizer):
    engine = engine_for(checkpoint)
    assert engine.engine_info()["prefill"] == "auto"
    prompts = prompts_sharing_a_prefix(tokenizer)
    engine.generate(prompts, max_new_tokens=1)
    assert engine.stats.prefill_tokens < engine.stats.prompt_tokens


def test_a_sliding_window_model_takes_the_padded_prefill(tmp_path, tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        sliding_window=8,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    MistralForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = get_engine("hf", tmp_path, dtype="fp32", device="cpu", prefill="shared")
    prompts = prompts_sharing_a_prefix(tokenizer)
    engine.generate(prompts, max_new_tokens=2)
    assert engine.stats.prefill_tokens == engine.stats.prompt_tokens  # nothing reused: windows keep no full prefix
