"""Continued pretraining of sliding-window models keeps their architecture.

A tiny Gemma 3 (layers sliding a 16-token window mixed with global ones, a RoPE base per layer
type) and a tiny Qwen2 (use_sliding_window with layer_types) are built from a config here with
random weights. They train under full, intra_doc and anchor and resume; the saved config is
the one declared; the trained weights, read by plain transformers with its own sliding-window
mask (sdpa), give the logits evalkit's attention gives (full: one forward; intra_doc: each
document alone). A model whose attention evalkit cannot reproduce is refused in one line.
"""

import json

import pytest
import torch

from evalkit.errors import UserError
from evalkit.train import checkpoint as ckpt
from evalkit.train import load_recipe
from evalkit.train.loop import train
from tests.train.helpers import losses

WINDOW = 16
SETS = ["seq_len=128", "windows_per_step=2", "micro_batch=2", "optim.lr=1e-3", "optim.warmup_steps=0",
        "optim.schedule=constant", "checkpoint.every=2", "checkpoint.final_count=1", "data.num_retrieval_docs=50",
        "model.rope_theta=null"]  # fmt: skip # Gemma 3 declares a base per layer type: no one-base override
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def gemma3_config(vocab: int, tokenizer):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, attention_dropout=0.0,
    )  # fmt: skip


def qwen2_config(vocab: int, tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, use_sliding_window=True, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, attention_dropout=0.0,
    )  # fmt: skip


CONFIGS = {"gemma3": gemma3_config, "qwen2": qwen2_config}


def base_checkpoint(folder, arch: str, tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = CONFIGS[arch](len(tokenizer), tokenizer)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    from evalkit.corpus import builtin_tokenizer

    tokenizer = builtin_tokenizer()
    return {arch: base_checkpoint(tmp_path_factory.mktemp(arch), arch, tokenizer) for arch in CONFIGS}


def continued(base, out, paradigm: str, max_steps: int, *sets: str):
    overrides = {"out": str(out), "max_steps": max_steps, "paradigm": paradigm}
    return load_recipe("tiny-long", overrides, [f"model.path={base}", *SETS, *sets])


def attention_config(config_dict: dict) -> dict:
    keys = ("sliding_window", "layer_types", "rope_parameters", "use_sliding_window", "architectures", "model_type")
    return {key: config_dict.get(key) for key in keys}


@pytest.mark.parametrize("paradigm", ["full", "intra_doc", "anchor"])
def test_a_sliding_window_model_trains_resumes_and_keeps_its_architecture(bases, tmp_path, paradigm):
    from transformers import AutoModelForCausalLM

    base = bases["gemma3"]
    straight = train(continued(base, tmp_path / "straight", paradigm, 4), show_progress=False)
    run = train(continued(base, tmp_path / "run", paradigm, 2), show_progress=False)
    train(continued(base, run, paradigm, 4), resume=True, show_progress=False)
    assert losses(run) == losses(straight)  # resumed exactly
    (_, saved), *_ = reversed(ckpt.complete_checkpoints(run))
    declared = json.loads((base / "config.json").read_text())
    written = json.loads((saved / "config.json").read_text())
    assert attention_config(written) == attention_config(declared)
    meta = json.loads((saved / ckpt.META).read_text())
    assert meta["attention"] == {
        "implementation": "blocked",
        "layer_windows": [WINDOW, None, WINDOW],
        "window_anchor": "window",
    }
    model = AutoModelForCausalLM.from_pretrained(saved)  # plain transformers, strict: every weight present
    assert model.config.layer_types == LAYER_TYPES and model.config.sliding_window == WINDOW


def evalkit_logits(model, input_ids, position_ids, doc_ids):
    from evalkit.attention import register_hf_attention

    register_hf_attention()
    model.set_attn_implementation("evalkit_blocked")
    try:
        return model(input_ids=input_ids, position_ids=position_ids, doc_ids=doc_ids).logits
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_evalkit_attention_on_windowed_layers_equals_transformers_own_mask(bases, arch):
    """The reference is transformers' sdpa path with its own sliding-window mask: one forward for
    plain causal attention, and each document alone (at its packed positions) for intra_doc."""
    from transformers import AutoModelForCausalLM

    from evalkit.attention import Paradigm
    from tests.helpers import random_pack

    model = AutoModelForCausalLM.from_pretrained(bases[arch], attn_implementation="sdpa").eval()
    ids = torch.randint(10, 90, (1, 96), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(96)[None]
    with torch.no_grad():
        plain = model(input_ids=ids, position_ids=positions).logits
        ours = evalkit_logits(model, ids, positions, None)
        torch.testing.assert_close(ours, plain, atol=1e-4, rtol=1e-4)

        packed = random_pack(Paradigm.INTRA_DOC, 96, seed=4)
        ids, positions, docs = packed.input_ids[None], packed.position_ids[None], packed.doc_ids[None]
        ours = evalkit_logits(model, ids, positions, docs)
        for doc in docs.unique():
            where = (docs[0] == doc).nonzero().flatten()
            alone = model(input_ids=ids[:, where], position_ids=positions[:, where]).logits
            torch.testing.assert_close(ours[:, where], alone, atol=1e-4, rtol=1e-4)
        assert len(docs.unique()) > 2 and int(max((docs[0] == d).sum() for d in docs.unique())) > WINDOW


def test_a_model_whose_attention_evalkit_cannot_reproduce_is_refused_before_any_work(tmp_path):
    from transformers import Gemma2Config

    from evalkit.corpus import builtin_tokenizer

    folder = tmp_path / "gemma2"
    folder.mkdir()
    Gemma2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                 head_dim=32, intermediate_size=64).save_pretrained(folder)  # fmt: skip
    builtin_tokenizer().save_pretrained(folder)
    with pytest.raises(UserError, match=r"attention logit soft-capping \(attn_logit_softcapping=50.0\)"):
        train(continued(folder, tmp_path / "run", "anchor", 2), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_one_rope_base_is_refused_on_a_model_with_one_per_layer_type(bases, tmp_path):
    with pytest.raises(UserError, match="declares one per layer type"):
        train(continued(bases["gemma3"], tmp_path / "run", "anchor", 2, "model.rope_theta=500000"), show_progress=False)
    assert not (tmp_path / "run").exists()  # refused before any work


def test_flash_with_windows_under_the_anchor_is_refused_before_the_first_step(tmp_path):
    from evalkit.corpus import builtin_tokenizer
    from evalkit.train.model import _check_windows_with

    windowed = gemma3_config(64, builtin_tokenizer())
    base = tmp_path / "base"
    for paradigm in ("anchor", "intra_doc_interleaved"):
        with pytest.raises(UserError, match="flash cannot apply this model's sliding windows"):
            _check_windows_with("evalkit_varlen", windowed, continued(base, tmp_path / "run", paradigm, 2))
    for paradigm, attn in (("intra_doc", "evalkit_varlen"), ("anchor", "evalkit_flex")):
        _check_windows_with(attn, windowed, continued(base, tmp_path / "run", paradigm, 2))


def test_a_run_trained_with_the_sink_reading_is_served_under_it(bases, tmp_path):
    """The trainer's record (meta.json attention.window_anchor) is what the hf engine reads: a run
    trained with model.window_anchor=sink answers packed requests under the sink reading."""
    from evalkit.engines import PackedRequest, get_engine

    run = train(
        continued(bases["gemma3"], tmp_path / "sink", "anchor", 2, "model.window_anchor=sink"), show_progress=False
    )
    (_, saved), *_ = reversed(ckpt.complete_checkpoints(run))
    assert json.loads((saved / ckpt.META).read_text())["attention"]["window_anchor"] == "sink"
    engine = get_engine("hf", saved, dtype="fp32", device="cpu")
    assert engine.engine_info()["window_anchor"] == "sink"
    assert engine.generate_packed([PackedRequest(["The sky is blue. " * 8, "Grass is green. " * 8], " Sky?")], 3)
