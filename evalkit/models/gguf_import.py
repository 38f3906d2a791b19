"""`evalkit import`: a GGUF file (llama.cpp's format) as a plain Hugging Face checkpoint (docs/models.md).

transformers dequantizes a GGUF file's weights, but a model loaded that way refuses
`save_pretrained`: its state dict is checked against the same architecture built without the
quantization settings, then saved as safetensors beside the tokenizer, config and a meta.json,
assembled beside the destination and renamed into place (a failure leaves nothing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import atomic_write_json, check_replaceable, file_sha256, move_into_place, new_directory_beside
from evalkit.models.check import one_line
from evalkit.models.gguf_header import read_gguf_header
from evalkit.models.precision import check_dtype, torch_dtype
from evalkit.models.refs import META, checkpoint_meta

IMPORT_KIND = "gguf-import"  # meta.json's "source.kind": marks a directory this command wrote


def _load_dequantized(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    except Exception as err:  # the GGUF parser raises many kinds (struct, numpy, ValueError) on bad files
        raise UserError(f"cannot import {path}: {one_line(err)}") from None
    return model, tokenizer


def _plain_config(model):
    """The model's config without the GGUF quantization settings: what the saved weights are,
    with the `architectures` field save_pretrained would write. A GGUF-loaded config has none,
    and without it readers guess the model class (vLLM resolves Gemma 3 as a pooling model)."""
    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    return config


def _weights_to_save(model, config, dtype) -> dict[str, Any]:
    """The state dict, cast, tied output embedding dropped, checked key for key against a fresh
    model of the same config (built on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    state = {key: value.detach() for key, value in model.state_dict().items()}
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config)
    expected = set(fresh.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        head = fresh.get_output_embeddings()
        head_key = next((f"{n}.weight" for n, m in fresh.named_modules() if m is head), None)
        state.pop(head_key, None)
        expected.discard(head_key)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise UserError(
            f"the dequantized weights do not match a plain {config.model_type} model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); this architecture cannot be imported"
        )
    return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}


def _is_import(destination: Path) -> bool:
    source = checkpoint_meta(destination).get("source")
    return isinstance(source, dict) and source.get("kind") == IMPORT_KIND


def import_gguf(source: Path, destination: Path, dtype: str = "bf16", overwrite: bool = False) -> Path:
    from evalkit import __version__

    check_dtype(dtype, ("bf16", "fp32"))
    source, destination = Path(source), Path(destination)
    # All of the header first: gguf's own reader (in transformers) trusts its counts.
    version, file_type = read_gguf_header(source)
    check_replaceable(destination, _is_import, "a checkpoint written by evalkit import", overwrite)
    model, tokenizer = _load_dequantized(source)
    config = _plain_config(model)
    weights = _weights_to_save(model, config, torch_dtype(dtype))
    config.dtype = torch_dtype(dtype)

    tmp = new_directory_beside(destination)
    try:
        _save(tmp, weights, config, model, tokenizer)
        meta = {
            "model": source.stem,
            "source": {
                "kind": IMPORT_KIND,
                "file": source.name,
                "path": str(source.resolve()),
                "sha256": file_sha256(source),
                "bytes": source.stat().st_size,
                "gguf_version": version,
                "file_type": file_type,
                "dequantized": True,
            },
            "dtype": dtype,
            "parameters": sum(v.numel() for v in weights.values()),
            "evalkit_version": __version__,
        }
        atomic_write_json(tmp / META, meta)  # last: its presence marks the import complete
        move_into_place(tmp, destination)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return destination


def _save(folder: Path, weights: dict, config, model, tokenizer) -> None:
    from safetensors.torch import save_file

    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # from_pretrained's loading options end up in tokenizer_config.json; they describe this
    # import, not the tokenizer, and would bind every later reader to them.
    config_path = folder / "tokenizer_config.json"
    if config_path.is_file():
        settings = json.loads(config_path.read_text())
        for key in ("local_files_only", "is_local"):
            settings.pop(key, None)
        config_path.write_text(json.dumps(settings, indent=2) + "\n")
