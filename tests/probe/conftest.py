"""Tiny models built from a config (never downloaded) and a saved tiny checkpoint for run_probe."""

import pytest
import torch
from transformers import AutoModel, LlamaConfig

from evalkit.corpus import builtin_tokenizer
from evalkit.probe import PROBE_ATTENTION, register_probe_attention
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

VOCAB = 256
MAX_POSITIONS = 256


def tiny_llama_config(**changes) -> LlamaConfig:
    """2 layers, 4 query heads sharing 2 key/value heads (GQA), head dim 16."""
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.05,  # peakier attention than the 0.02 default: BF16 errors show clearly
    )
    settings.update(changes)
    return LlamaConfig(**settings)


def build(config, dtype: torch.dtype, seed: int = 0, attention: str = PROBE_ATTENTION):
    """The same seeded weights in any dtype, built in that dtype (as loading a checkpoint does: a
    cast with .to() would also round RoPE's inverse frequencies, which transformers keeps in FP32)."""
    register_probe_attention()
    torch.manual_seed(seed)
    weights = AutoModel.from_config(config, dtype=torch.float32).state_dict()
    model = AutoModel.from_config(config, dtype=dtype, attn_implementation=attention).eval()
    model.load_state_dict(weights)
    return model


@pytest.fixture
def tiny_llama():
    """tiny_llama(dtype) -> a LlamaModel with the probe attention, the same weights for every dtype."""
    return lambda dtype, **changes: build(tiny_llama_config(**changes), dtype)


@pytest.fixture
def texts():
    """Two texts of 48 random token ids, the first token fixed as a BOS would be."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 48), generator=generator)
    ids[:, 0] = 1
    return ids


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A saved tiny Llama checkpoint with the built-in tokenizer, as `evalkit train` writes one."""
    from transformers import LlamaForCausalLM

    tokenizer = builtin_tokenizer()
    config = tiny_llama_config(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(1)  # not the random-init seed 0: the two conditions must differ
    directory = tmp_path_factory.mktemp("tiny-llama-ckpt")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
