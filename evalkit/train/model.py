"""The model and tokenizer a run trains: a local HF checkpoint, or a small architecture from scratch."""

from __future__ import annotations

from pathlib import Path

import torch

from evalkit.attention import register_hf_attention
from evalkit.attention.features import check_attention_supported, windows_shorter_than
from evalkit.attention.hf import hf_name, set_rope_precision
from evalkit.attention.kernels import default_implementation
from evalkit.errors import UserError
from evalkit.models.check import check_checkpoint, load_pretrained, load_tokenizer
from evalkit.train.config import TrainConfig, model_directory


def attention_name(config: TrainConfig, device: torch.device) -> str:
    """The transformers attn_implementation for evalkit's attention (auto: blocked on CPU, flex on CUDA)."""
    impl = config.model.attention
    if impl == "auto":
        impl = default_implementation(device)
    if impl == "flex" and device.type != "cuda":
        raise UserError("model.attention=flex cannot train on CPU (FlexAttention has no CPU backward); use blocked")
    return hf_name(impl)


def recipe_tokenizer(config: TrainConfig):
    """The tokenizer named in data.tokenizer, else the checkpoint's own, else the built-in BPE."""
    name = config.data.tokenizer or model_directory(config)
    if name is None:
        from evalkit.corpus import builtin_tokenizer

        return builtin_tokenizer(config.data.vocab_size)
    if Path(name).is_dir():  # a local checkpoint: any fault in its files is one line naming the file
        return load_tokenizer(name, trust_remote_code=config.model.trust_remote_code)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=config.model.trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(f"could not load a tokenizer from {name!r}: {str(err).splitlines()[0]}") from None


def _scratch_config(config: TrainConfig, tokenizer):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    m = config.model
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        # 4 x seq_len by default (so RULER can go beyond the training length); never below seq_len,
        # as a continued checkpoint's (_checkpoint_config): config.json never claims less than trained on
        max_position_embeddings=max(m.max_position_embeddings or 4 * config.seq_len, config.seq_len),
        tie_word_embeddings=m.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attention_dropout=0.0,
    )
    if m.rope_theta is not None:
        common["rope_parameters"] = {"rope_type": "default", "rope_theta": m.rope_theta}
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[m.arch]
    hf_config = cls(**common)
    if m.arch == "mistral":
        hf_config.sliding_window = None  # the paradigms define attention; no sliding window on top
    return hf_config


def check_rope_theta(hf_config, theta: float | None) -> dict:
    """The config's rope_parameters (a copy), checked: one RoPE base (model.rope_theta) cannot
    stand for a model's several, one per layer type."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    per_layer_type = [k for k, v in params.items() if isinstance(v, dict)]  # Gemma 3
    if theta is not None and per_layer_type:
        raise UserError(
            f"model.rope_theta={theta} is one base, and this model declares one per layer type "
            f"({', '.join(per_layer_type)}); leave it unset: model.rope_theta=null"
        )
    return params


def _checkpoint_config(config: TrainConfig, path: Path):
    """The HF config of the checkpoint at `path` (model.path), with this run's RoPE base and window."""
    from transformers import AutoConfig

    m = config.model
    if Path(path).is_dir():  # before AutoConfig, which fails on a broken config.json with a traceback
        check_checkpoint(path, trust_remote_code=m.trust_remote_code)
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    check_attention_supported(hf_config, "evalkit train")  # before any weight is read
    if m.rope_theta is not None:
        params = check_rope_theta(hf_config, m.rope_theta)
        hf_config.rope_parameters = {"rope_type": "default", **params, "rope_theta": m.rope_theta}
    if getattr(hf_config, "max_position_embeddings", 0) < config.seq_len:
        hf_config.max_position_embeddings = config.seq_len
    return hf_config


def build_model(config: TrainConfig, tokenizer, device: torch.device, *, weights: bool = True, on_host: bool = False):
    """The model in fp32 (master weights) on `device`, with evalkit attention selected and q, k
    rotated in config.rope_precision under autocast. on_host=True: on the CPU, attention chosen for
    `device` (rank 0's full copy, which fills the other ranks' shards). weights=False: parameters on
    the meta device (no memory, model.path's weights unread), buffers (RoPE frequencies, in no state
    dict) real on the CPU, as the other ranks hold it until rank 0's weights reach them."""
    from transformers import AutoModelForCausalLM

    register_hf_attention()
    attn = attention_name(config, device)
    m = config.model
    directory = model_directory(config)  # a hub name's snapshot in the hub cache
    try:
        if directory is None:
            hf_config = _scratch_config(config, tokenizer)
        else:
            hf_config = _checkpoint_config(config, directory)
        if not weights:
            model = _model_without_weights(hf_config, attn, m.trust_remote_code)
        elif directory is None:
            torch.manual_seed(config.seed)  # the initialisation is part of the run's identity
            model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn)
        else:
            model = load_pretrained(
                AutoModelForCausalLM,
                directory,
                config=hf_config,
                dtype=torch.float32,
                attn_implementation=attn,
                trust_remote_code=m.trust_remote_code,
            )
    except OSError as err:
        raise UserError(f"could not load model {m.path!r}: {str(err).splitlines()[0]}") from None
    _check_windows_with(attn, model.config, config)  # sliding windows and per-layer RoPE as declared
    try:
        set_rope_precision(model, config.rope_precision)
    except ValueError as err:
        raise UserError(f"rope_precision: {err}") from None
    return model.to(device) if weights and not on_host else model


def _model_without_weights(hf_config, attn: str, trust_remote_code: bool):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            hf_config, attn_implementation=attn, trust_remote_code=trust_remote_code
        )
    model.tie_weights()  # on meta the tie is skipped at construction; FSDP must see one shared parameter
    return model


def _check_windows_with(attn: str, hf_config, config: TrainConfig) -> None:
    """What flash cannot window (docs/attention.md), refused before the first step rather than inside it."""
    windowed = windows_shorter_than(hf_config, config.seq_len)
    if attn == hf_name("flash") and windowed and (config.paradigm.has_anchor or config.paradigm.interleaves):
        raise UserError(
            f"model.attention=flash cannot apply this model's sliding windows under {config.paradigm}; "
            "use model.attention=flex (or auto)"
        )
