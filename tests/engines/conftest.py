"""The engines' tiny Llama checkpoint (tests/helpers.py builds it; the references are there too)."""

import pytest

from tests.helpers import build_checkpoint
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer):
    """(path, model): the saved tiny checkpoint and the in-memory model it was saved from."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    model = build_checkpoint(directory, tokenizer)
    model.set_attn_implementation("sdpa")
    return directory, model
