"""Tiny probe models built from a config (never downloaded; tests/helpers.py) and a saved tiny checkpoint."""

import pytest
import torch

from tests.helpers import PROBE_VOCAB, build_checkpoint, probe_config, probe_model
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


@pytest.fixture
def tiny_llama():
    """tiny_llama(dtype) -> a LlamaModel with the probe attention, the same weights for every dtype."""
    return lambda dtype, **changes: probe_model(probe_config(**changes), dtype)


@pytest.fixture
def texts():
    """Two texts of 48 random token ids, the first token fixed as a BOS would be."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, PROBE_VOCAB, (2, 48), generator=generator)
    ids[:, 0] = 1
    return ids


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A saved tiny Llama checkpoint with the built-in tokenizer, as `evalkit train` writes one."""
    from evalkit.corpus import builtin_tokenizer

    directory = tmp_path_factory.mktemp("tiny-llama-ckpt")
    # Seed 1, not the random-init seed 0: the two conditions must differ. The probe's peakier init.
    build_checkpoint(directory, builtin_tokenizer(), seed=1, initializer_range=0.05, pad_token_id=None)
    return directory
