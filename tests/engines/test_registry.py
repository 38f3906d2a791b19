"""Choosing engines by name: lazy imports, one-line errors, validated settings, recorded facts."""

import importlib.util

import pytest
import torch

from evalkit.corpus import tokenizer_fingerprint
from evalkit.engines import ENGINE_NAMES, get_engine
from evalkit.errors import UserError
from evalkit.models.precision import DTYPE_NAMES, check_dtype
from tests.helpers import TINY_WINDOW as MAX_POSITIONS


def test_vllm_without_vllm_installed_says_how_to_install(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):  # vllm absent even where it is installed
        return None if name == "vllm" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(UserError) as err:
        get_engine("vllm", tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "pip install 'evalkit[vllm]'" in message


def test_unknown_engine_lists_the_choices(tmp_path):
    with pytest.raises(UserError, match="unknown engine 'tgi'; choose one of: hf, vllm"):
        get_engine("tgi", tmp_path)
    assert ENGINE_NAMES == ("hf", "vllm")


def test_unknown_setting_is_a_user_error(checkpoint):
    path, _ = checkpoint
    with pytest.raises(UserError, match="unknown setting.*batchsize.*known: dtype"):
        get_engine("hf", path, batchsize=4)


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no checkpoint directory"):
        get_engine("hf", tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["bfloat16", "float32", "fp8", "auto"])
def test_dtype_names_are_validated(checkpoint, name):
    path, _ = checkpoint
    with pytest.raises(UserError, match=f"unknown dtype '{name}'; choose one of: bf16, fp16, fp32"):
        check_dtype(name)
    with pytest.raises(UserError, match="unknown dtype"):
        get_engine("hf", path, dtype=name)


TORCH_DTYPES = [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]


@pytest.mark.parametrize("name, torch_dtype", TORCH_DTYPES)
def test_every_dtype_name_loads_that_dtype(checkpoint, name, torch_dtype):
    path, _ = checkpoint
    engine = get_engine("hf", path, dtype=name, device="cpu")
    assert name in DTYPE_NAMES
    assert engine.engine_info()["dtype"] == name
    assert next(engine.model.parameters()).dtype == torch_dtype


def test_engine_info_records_what_a_result_needs(checkpoint, tokenizer):
    path, _ = checkpoint
    engine = get_engine("hf", path, dtype="fp32", device="cpu", batch_size=3)
    info = engine.engine_info()
    assert info["engine"] == "hf"
    assert info["model_path"] == str(path.resolve())
    assert (info["dtype"], info["batch_size"], info["device"]) == ("fp32", 3, "cpu")
    assert info["max_length"] == MAX_POSITIONS == engine.max_length
    assert (info["attention"], info["packed_attention"]) == ("sdpa", "evalkit")
    assert info["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)
    from evalkit.engines.base import RESULT_FACTS

    assert all(info.get(fact) is not None for fact in RESULT_FACTS)  # what results are compared by


def test_max_length_setting_overrides_the_config(checkpoint):
    path, _ = checkpoint
    assert get_engine("hf", path, max_length=32).max_length == 32
    assert get_engine("hf", path, max_length=4 * MAX_POSITIONS).max_length == 4 * MAX_POSITIONS  # extrapolation


def test_token_counts_include_the_bos_the_tokenizer_adds(checkpoint, tokenizer):
    path, _ = checkpoint
    engine = get_engine("hf", path)
    text = "The grass is green."
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert engine.encode(text) == [tokenizer.bos_token_id, *content]
    assert engine.count_tokens(text) == len(content) + 1
    assert engine.encode(content) == content  # token ids are fed as given
    assert engine.encode("<s>" + text) == engine.encode(text)  # a template's own BOS is not doubled


def test_plain_attention_must_take_padding_masks(checkpoint):
    path, _ = checkpoint
    with pytest.raises(UserError, match="left-padded"):
        get_engine("hf", path, attention="evalkit")
    with pytest.raises(UserError, match="packed_attention must be one of"):
        get_engine("hf", path, packed_attention="sdpa")


def test_packed_vllm_requests_refuse_what_the_backend_cannot_serve_before_vllm_starts():
    """Checked from the HF config alone (no vLLM needed): the packed backend serves plain softmax attention."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    from evalkit.engines.vllm import packed_support_problems

    llama = LlamaConfig(max_position_embeddings=4096)
    assert packed_support_problems(llama, "fp32", "cpu", 4096) == []
    assert packed_support_problems(llama, "bf16", "cuda", 4096) == []
    assert packed_support_problems(llama, "fp32", "cuda", 4096) == [
        "fp32 on CUDA (FlashAttention serves bf16 and fp16)"
    ]
    windowed = MistralConfig(sliding_window=1024)
    assert packed_support_problems(windowed, "bf16", "cpu", 4096) == ["sliding-window attention (a 1024-token window)"]
    assert packed_support_problems(windowed, "bf16", "cpu", 1024) == []  # a window as wide as every context is none
    # Qwen2 declares a window but applies it to no layer (max_window_layers = every layer): nothing slides
    unwindowed = Qwen2Config(use_sliding_window=True, sliding_window=8, num_hidden_layers=2, max_window_layers=2)
    assert packed_support_problems(unwindowed, "bf16", "cpu", 4096) == []
    assert "attention logit soft-capping (attn_logit_softcapping=50.0)" in packed_support_problems(
        Gemma2Config(), "bf16", "cpu", 4096
    )


def test_the_vllm_cpu_kv_cache_default_holds_batch_size_full_windows():
    from transformers import LlamaConfig

    from evalkit.engines.vllm import _cpu_kv_cache_gib

    config = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    per_token_bf16 = 2 * 30 * 3 * 64 * 2  # K and V, layers, key-value heads, head dim, bytes: 23,040
    assert per_token_bf16 * 8193 * 8 / 2**30 == pytest.approx(1.406, abs=1e-3)
    assert _cpu_kv_cache_gib(config, "bf16", 8, 8193) == 2  # whole GiB, rounded up
    assert _cpu_kv_cache_gib(config, "fp32", 8, 8193) == 3  # twice the bytes: 2.81 GiB
    assert _cpu_kv_cache_gib(config, "fp16", 1, 1025) == 1  # at least 1 GiB


def test_an_engine_used_as_a_context_manager_is_closed_however_its_block_ends(checkpoint, monkeypatch):
    from evalkit.engines.hf import HFEngine

    path, _ = checkpoint
    closed = []
    monkeypatch.setattr(HFEngine, "close", lambda self: closed.append(self))
    with get_engine("hf", path, device="cpu") as engine:
        pass
    assert closed == [engine]
    with pytest.raises(RuntimeError, match="a task failed"), get_engine("hf", path, device="cpu") as failing:
        raise RuntimeError("a task failed")
    assert closed == [engine, failing]


def test_the_ruler_runner_closes_its_engine_when_a_task_fails(checkpoint, monkeypatch, tmp_path):
    from evalkit.engines.hf import HFEngine
    from evalkit.models.refs import CheckpointRef
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import evaluate_checkpoint

    path, _ = checkpoint
    closed = []
    monkeypatch.setattr(HFEngine, "close", lambda self: closed.append(self))

    def failing_task(self, engine, *_args):
        engine.get()  # the engine is built, then the task fails
        raise RuntimeError("a task failed")

    monkeypatch.setattr(RulerBenchmark, "evaluate", failing_task)
    settings = RulerSettings(tasks=["niah_single_1"], lengths=[MAX_POSITIONS], num_samples=1, dtype="fp32")
    with pytest.raises(RuntimeError, match="a task failed"):
        evaluate_checkpoint(RulerBenchmark(settings), CheckpointRef("run", 1, path), tmp_path)
    assert len(closed) == 1 and isinstance(closed[0], HFEngine)
