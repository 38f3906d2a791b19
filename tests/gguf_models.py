"""Tiny GGUF files of non-Llama architectures, written here from a model built from a config.

llama.cpp's converter is not a dependency, so the file is written with the gguf package the way
it would: tensors under llama.cpp's names (gguf's own name map), Gemma's norms stored as w + 1,
a byte-level BPE vocabulary (256 byte tokens, three specials, one merge). The source model is
returned too: an import is checked against it tensor for tensor.
"""

from __future__ import annotations

from pathlib import Path

# Gemma 3 text: five sliding layers (window 8) to one global, as llama.cpp's Gemma 3 files have
# them (the pattern of 6 is implied by the architecture; GGUF stores only the window).
GEMMA3 = dict(
    vocab_size=260,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    sliding_window=8,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)


def byte_level_vocabulary() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return ["<pad>", "<eos>", "<bos>", *bytes_to_unicode().values(), "\u0120t"]


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
    tokens = byte_level_vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))  # 3: control, 1: normal
    writer.add_token_merges(["\u0120 t"])
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
