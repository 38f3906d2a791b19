"""A tiny run of two checkpoints built from a config (never downloaded), and direct references.

The references compute log-likelihoods with plain full forwards of the model: no engine, no
padding, no batching, no lm-eval.
"""

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evalkit.engines import get_engine
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

WINDOW = 1024  # room for the mmlu-style fixture's 5-shot prompts (about 200 tokens)
RUN = "tiny-run"


def build_checkpoint(directory: Path, tokenizer, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=WINDOW,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,  # spread-out logits: argmax choices are clear, not near-ties
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    model.set_attn_implementation("sdpa")
    return model


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tokenizer) -> Path:
    """runs/tiny-run/step-1 and step-2: two differently initialised checkpoints of one architecture."""
    run = tmp_path_factory.mktemp("runs") / RUN
    for step in (1, 2):
        build_checkpoint(run / f"step-{step}", tokenizer, seed=step)
    return run


@pytest.fixture(scope="session")
def model(tiny_run) -> LlamaForCausalLM:
    """The step-1 model, loaded as saved, for direct computations."""
    return LlamaForCausalLM.from_pretrained(tiny_run / "step-1", dtype=torch.float32).eval()


def engine_for(path: Path, **settings):
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


@torch.no_grad()
def direct_logprob(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """(sum_t log p(continuation_t | all before it), every continuation token the argmax): one unpadded forward."""
    ids = context + continuation
    logits = model(input_ids=torch.tensor([ids]), position_ids=torch.arange(len(ids))[None]).logits[0]
    logprobs = logits.double().log_softmax(-1)
    positions = range(len(context) - 1, len(ids) - 1)
    total = sum(float(logprobs[p, token]) for p, token in zip(positions, continuation))
    greedy = all(int(logprobs[p].argmax()) == token for p, token in zip(positions, continuation))
    return total, greedy
