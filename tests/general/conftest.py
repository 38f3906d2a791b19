"""A tiny run of two checkpoints (tests/helpers.py builds them; the direct references are there too)."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from evalkit.engines import get_engine
from evalkit.general import GeneralBenchmark, GeneralSettings
from tests.helpers import build_checkpoint
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)

WINDOW = 1024  # room for the mmlu-style fixture's 5-shot prompts (about 200 tokens)
RUN = "tiny-run"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tokenizer) -> Path:
    """runs/tiny-run/step-1 and step-2: two differently initialised checkpoints of one architecture."""
    run = tmp_path_factory.mktemp("runs") / RUN
    for step in (1, 2):
        build_checkpoint(run / f"step-{step}", tokenizer, seed=step, max_position_embeddings=WINDOW)
    return run


@pytest.fixture(scope="session")
def model(tiny_run) -> LlamaForCausalLM:
    """The step-1 model, loaded as saved, for direct computations."""
    return LlamaForCausalLM.from_pretrained(tiny_run / "step-1", dtype=torch.float32).eval()


def engine_for(path: Path, **settings):
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


def general(tasks: list[str], **settings) -> GeneralBenchmark:
    """The general benchmark on `tasks` (GeneralSettings' other fields as keywords), for run_benchmark."""
    return GeneralBenchmark(GeneralSettings(list(tasks), **settings))
