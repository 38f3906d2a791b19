"""The commands' checkpoint: a copy of the shipped tiny-base (tests/helpers.py breaks others on purpose)."""

from pathlib import Path

import pytest

from tests.helpers import copy_tiny_base
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return copy_tiny_base(tmp_path_factory.mktemp("ckpt") / "tiny-base")
