"""Tiny Llama checkpoints built from a config (never downloaded), and independent references.

The references compute what the engine must return with plain full forwards of the model: no
KV cache, no padding, no batching, masks written out by hand.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

MAX_POSITIONS = 128


def build_checkpoint(directory: Path, tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,  # spread-out logits: greedy choices are clear, not near-ties
        attention_dropout=0.0,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer):
    """(path, model): the saved tiny checkpoint and the in-memory model it was saved from."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    model = build_checkpoint(directory, tokenizer)
    model.set_attn_implementation("sdpa")
    return directory, model


def copy_with_config(source: Path, destination: Path, **changes) -> Path:
    """A copy of a checkpoint with some config.json fields changed."""
    shutil.copytree(source, destination)
    config = json.loads((destination / "config.json").read_text())
    config.update(changes)
    (destination / "config.json").write_text(json.dumps(config))
    generation_config = destination / "generation_config.json"
    if generation_config.exists():
        generation_config.unlink()  # it would carry the old eos_token_id
    return destination


@torch.no_grad()
def full_logits(model, ids: list[int], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [S, V] of one unpadded forward at positions 0..S-1 (mask: bool [S, S], True = may attend)."""
    input_ids = torch.tensor([ids])
    positions = torch.arange(len(ids))[None]
    attention_mask = None if mask is None else mask[None, None]
    return model(input_ids=input_ids, position_ids=positions, attention_mask=attention_mask).logits[0]


def greedy_without_cache(model, ids: list[int], max_new_tokens: int, eos_ids: set[int], mask_for=None) -> list[int]:
    """Greedy decoding the slow way: the whole sequence re-run for every token, no KV cache.

    mask_for(n) gives the attention mask of an n-token sequence (None: plain causal).
    """
    sequence, generated = list(ids), []
    for _ in range(max_new_tokens):
        mask = None if mask_for is None else mask_for(len(sequence))
        token = int(full_logits(model, sequence, mask)[-1].argmax())
        if token in eos_ids:
            break
        generated.append(token)
        sequence.append(token)
    return generated


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
