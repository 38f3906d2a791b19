import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist (-n auto: one worker per core) each worker and the processes its tests
    # start use one thread: workers with a thread per core each would oversubscribe the cores,
    # and OpenMP threads spinning on a busy core slow a step many times over.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def pytest_addoption(parser):
    """The GPU checks' options (tests/gpu/conftest.py); here, where pytest reads options first."""
    group = parser.getgroup("gpu", "evalkit's GPU checks (tests/gpu)")
    group.addoption("--gpu-out", default=None, help="directory of gpu-checks.jsonl (default: a temporary one)")
    group.addoption(
        "--gpu-budget-s", type=float, default=None, help="no GPU check starts later than this after the first"
    )


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/evalkit."""
    cache = tmp_path_factory.mktemp("evalkit-cache")
    old = os.environ.get("EVALKIT_CACHE")
    os.environ["EVALKIT_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("EVALKIT_CACHE", None)
    else:
        os.environ["EVALKIT_CACHE"] = old


@pytest.fixture(scope="session")
def tokenizer():
    """The built-in byte-level BPE (vocab 2048, adds a BOS), trained locally once per session."""
    from evalkit.corpus import builtin_tokenizer

    return builtin_tokenizer()


@pytest.fixture(scope="session")
def smollm2_file():
    """The real model's GGUF file (tests/real_model.py); the test is skipped, with the reason, without it."""
    from tests.real_model import smollm2_gguf

    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def smollm2(smollm2_file):
    """SmolLM2-135M-Instruct as a plain fp32 checkpoint directory, imported once per file hash."""
    from tests.real_model import imported_smollm2

    return imported_smollm2(smollm2_file, "fp32")
