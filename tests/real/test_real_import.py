"""`evalkit import` on the real GGUF file: what it writes, and that the weights are the model's."""

import json
import subprocess
import sys

import pytest

from evalkit.models.gguf_import import file_sha256

pytestmark = pytest.mark.real


def test_import_writes_a_plain_checkpoint_with_its_source(smollm2, smollm2_file):
    meta = json.loads((smollm2 / "meta.json").read_text())
    assert meta["source"]["kind"] == "gguf-import" and meta["source"]["dequantized"] is True
    assert meta["source"]["sha256"] == file_sha256(smollm2_file)
    assert meta["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and meta["source"]["file_type"] == "MOSTLY_Q4_1"
    assert meta["dtype"] == "fp32" and meta["parameters"] == 134_515_008
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config
    assert (
        config["model_type"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["max_position_embeddings"],
        config["vocab_size"],
    ) == ("llama", 30, 9, 3, 8192, 49152)
    assert config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]  # as save_pretrained writes it
    assert (smollm2 / "tokenizer.json").is_file() and (smollm2 / "model.safetensors").is_file()


def test_the_imported_model_answers_like_the_original(smollm2):
    """Greedy answers to a chat prompt through the hf engine: a dequantization or tokenizer error
    would not say this."""
    from transformers import AutoTokenizer

    from evalkit.engines import get_engine

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert tokenizer("Hello world").input_ids[0] != tokenizer.bos_token_id  # SmolLM2 adds no BOS
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    engine = get_engine("hf", smollm2, dtype="fp32", batch_size=1)
    (answer,) = engine.generate([prompt], 16)
    assert "Paris" in answer


def test_truncated_gguf_is_one_line_error_and_writes_nothing(smollm2_file, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_file, "rb") as source:
        cut.write_bytes(source.read(40_000_000))
    dest = tmp_path / "dest"
    result = subprocess.run(
        [sys.executable, "-m", "evalkit.cli", "import", str(cut), str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "truncated or corrupt" in result.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]
