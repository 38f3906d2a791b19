"""Tiny GGUF files of non-Llama architectures, written here from a model built from a config.

llama.cpp's converter is not a dependency, so the file is written with the gguf package the way
it would: tensors under llama.cpp's names (gguf's own name map), Gemma's norms stored as w + 1,
sentencepiece vocabulary with byte fallback, as Gemma's files have. The source model is
returned too: an import is checked against it tensor for tensor.
"""

from __future__ import annotations

import string
from pathlib import Path

# Gemma 3 text: five sliding layers (window 8) to one global, as llama.cpp's Gemma 3 files have
# them (the pattern of 6 is implied by the architecture; GGUF stores only the window).
GEMMA3 = dict(
    vocab_size=329,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,  # vLLM's CPU attention serves head sizes from 32
    sliding_window=8,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    initializer_range=0.2,  # spread-out logits: greedy choices are clear, not near-ties
)


def sentencepiece_vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, llama.cpp token types): specials, 256 byte-fallback tokens, letters and a few
    merged pieces, as a Gemma GGUF spells its vocabulary ("\u2581" for a space)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    byte_tokens = [f"<0x{value:02X}>" for value in range(256)]
    pieces = ["\u2581", *string.ascii_letters, *string.digits, ".", ",", "\u2581t", "he", "\u2581the", "\u2581a"]
    types = [3, 3, 3, 2] + [6] * len(byte_tokens) + [1] * len(pieces)  # control, unknown, byte, normal
    return specials + byte_tokens + pieces, types


def write_gemma3_gguf(path: Path, seed: int = 0):
    """Writes a tiny Gemma 3 GGUF at `path`; returns the transformers model its weights are."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    spec = GEMMA3
    config = Gemma3TextConfig(**spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_block_count(spec["num_hidden_layers"])
    writer.add_context_length(spec["max_position_embeddings"])
    writer.add_embedding_length(spec["hidden_size"])
    writer.add_feed_forward_length(spec["intermediate_size"])
    writer.add_head_count(spec["num_attention_heads"])
    writer.add_head_count_kv(spec["num_key_value_heads"])
    writer.add_key_length(spec["head_dim"])
    writer.add_value_length(spec["head_dim"])
    writer.add_layer_norm_rms_eps(spec["rms_norm_eps"])
    writer.add_rope_freq_base(spec["rope_theta"])
    writer.add_sliding_window(spec["sliding_window"])
    tokens, types = sentencepiece_vocabulary()
    assert len(tokens) == spec["vocab_size"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(index) for index in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_unk_token_id(3)
    writer.add_bos_token_id(spec["bos_token_id"])
    writer.add_eos_token_id(spec["eos_token_id"])
    writer.add_pad_token_id(spec["pad_token_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, spec["num_hidden_layers"])
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":  # tied to the embedding; GGUF stores it once
            continue
        module, leaf = key.rsplit(".", 1)
        array = value.numpy().astype(np.float32)
        if "norm" in module:
            array = array + 1.0  # llama.cpp stores Gemma's zero-centred norms offset by one
        writer.add_tensor(f"{names.get_name(module)}.{leaf}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
