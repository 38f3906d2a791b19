"""A memory model of one training step per GPU, from a recipe: what `evalkit train --memory-estimate`
prints before anything is loaded (docs/training.md). Per GPU, for FSDP2 over N GPUs: fp32 weights,
gradients and AdamW's two moments sharded N ways; working copies, unsharded for part of each step:
the root unit (embeddings, head, final norm) with its gradient, two decoder layers gathered at once
(prefetch) and one layer's gradient before its reduce-scatter; activations at micro_batch x seq_len
tokens. A model, checked against measured tensor bytes on CPU at small sizes
(tests/train/test_memory.py), not measured on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import UserError
from evalkit.models.check import checkpoint_source
from evalkit.train.config import TrainConfig

GiB = 2**30
FP32, BF16 = 4, 2
LOSS_CHUNK = 4096  # target tokens per chunk of the loss's output projection (loop.py; bounds logits memory)

# Bytes per token of one decoder layer's saved tensors and in-flight gradients, as
# (per hidden unit, per KV unit, per MLP unit): counted from a Llama decoder layer.
# bf16 autocast: norm outputs and residual sums fp32; projections' inputs and outputs bf16;
# RoPE-rotated q and k fp32; the kernel's bf16 q, k, v and output; gate, up, SiLU, product
# in bf16; gradients: two fp32 hidden-sized and two bf16 MLP-sized tensors.
# bf16_full: the same tensors with the residual stream, norms and gradients in bf16 as well.
ACTIVATION_BYTES = {"bf16": (42, 10, 12), "bf16_full": (22, 6, 12), "fp32": (44, 12, 24)}


@dataclass(frozen=True)
class Architecture:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_width
        attention = 2 * h * h + 2 * h * kv + (h + 2 * kv if self.qkv_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h  # + MLP + two norms

    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()


# The paper's base models (their published config.json), for recipes naming a hub model
# that is not on this machine: hidden, layers, heads, kv_heads, intermediate, vocab, tied.
KNOWN_ARCHITECTURES = {
    "meta-llama/Llama-2-7b-hf": Architecture(4096, 32, 32, 32, 11008, 32000, False),
    "meta-llama/Meta-Llama-3-8B": Architecture(4096, 32, 32, 8, 14336, 128256, False),
    "mistralai/Mistral-7B-v0.3": Architecture(4096, 32, 32, 8, 14336, 32768, False),
    "Qwen/Qwen1.5-1.8B": Architecture(2048, 24, 16, 16, 5504, 151936, False, qkv_bias=True),
}


def architecture(config: TrainConfig, vocab: int | None = None) -> Architecture:
    """The recipe's model: built from scratch (vocab: the tokenizer's size, default data.vocab_size),
    a known hub model, else model.path's config.json (a hub name's from the hub cache)."""
    m = config.model
    if m.path is None:
        return Architecture(
            hidden=m.hidden_size,
            layers=m.num_layers,
            heads=m.num_heads,
            kv_heads=m.num_kv_heads,
            intermediate=m.intermediate_size,
            vocab=vocab or config.data.vocab_size,
            tied=m.tie_embeddings,
            qkv_bias=m.arch == "qwen2",
        )
    if m.path in KNOWN_ARCHITECTURES and not Path(m.path).expanduser().exists():
        return KNOWN_ARCHITECTURES[m.path]  # sized without fetching it
    # A hub name's config.json from the hub cache: an estimate never downloads a model.
    config_json = checkpoint_source(m.path, cache_only=True)[0] / "config.json"
    if config_json.is_file():
        return _from_config_json(config_json)
    raise UserError(
        f"cannot size {m.path!r}: no config.json there and not one of {', '.join(KNOWN_ARCHITECTURES)}; "
        "give --model a checkpoint directory or a hub name"
    )


def _from_config_json(path: Path) -> Architecture:
    try:
        c = json.loads(path.read_text())
        heads = c["num_attention_heads"]
        return Architecture(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads,
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"cannot size the model from {path}: {err!r}") from None


@dataclass(frozen=True)
class MemoryEstimate:
    params: float  # bytes per GPU, as every field
    grads: float
    optimizer: float
    working: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.working + self.activations


def activation_bytes(arch: Architecture, config: TrainConfig) -> float:
    tokens = config.micro_batch * config.seq_len
    per_hidden, per_kv, per_mlp = ACTIVATION_BYTES[config.dtype]
    layer = tokens * (per_hidden * arch.hidden + per_kv * arch.kv_width + per_mlp * arch.intermediate)
    residual = BF16 if config.dtype == "bf16_full" else FP32  # the stream between layers (train.regime)
    final_norm = 3 * tokens * arch.hidden * residual  # its input and output, and the targets' rows of it
    chunk = min(LOSS_CHUNK, tokens)
    cast = BF16 if config.dtype != "fp32" else 0  # bf16 logits before the fp32 loss
    loss = chunk * arch.vocab * (FP32 + FP32 + cast)  # logits, grad, cast
    if not config.grad_checkpointing:  # every layer's set is held when the loss's backward starts
        return arch.layers * layer + final_norm + loss
    # The layers' inputs are held throughout; the loss's backward (first) and one layer's
    # recomputation (later) never overlap, so the peak is the larger of the two.
    return arch.layers * tokens * arch.hidden * residual + max(layer, final_norm + loss)


def working_bytes(arch: Architecture, config: TrainConfig, gpus: int) -> float:
    """Autocast casts one layer's weights and the head at a time; bf16_full computes with a bf16
    copy of every weight (one process: all of them for the whole step; FSDP2: the gathered units)."""
    autocast, full = config.dtype == "bf16", config.dtype == "bf16_full"
    casts = BF16 * (arch.layer_params() + arch.vocab * arch.hidden) if autocast else 0
    if gpus == 1:
        return BF16 * arch.params() if full else casts
    gathered = BF16 if autocast or full else FP32  # the layers' FSDP2 policy (distributed.mixed_precision_policy)
    root = 2 * (BF16 if full else FP32) * arch.root_params()  # the root unit and its gradient
    layers = arch.layer_params() * (2 * gathered + gathered + (FP32 if autocast or full else 0))
    return root + layers + casts


def estimate(config: TrainConfig, arch: Architecture, gpus: int) -> MemoryEstimate:
    if gpus < 1:
        raise UserError(f"--gpus must be at least 1, got {gpus}")
    p = arch.params()
    return MemoryEstimate(
        params=FP32 * p / gpus,
        grads=FP32 * p / gpus,
        optimizer=2 * FP32 * p / gpus,
        working=working_bytes(arch, config, gpus),
        activations=activation_bytes(arch, config),
    )


def report(config: TrainConfig, arch: Architecture, gpus: int) -> str:
    est = estimate(config, arch, gpus)
    tokens = config.micro_batch * config.seq_len
    lines = [
        f"memory estimate per GPU (a model, not a measurement): {arch.params() / 1e9:.2f}B parameters, "
        f"{gpus} GPU(s), {tokens} tokens per micro-batch, {config.dtype}, "
        f"gradient checkpointing {'on' if config.grad_checkpointing else 'off'}",
    ]
    rows = [*dataclasses.asdict(est).items(), ("total", est.total)]
    lines += [f"  {name:<12}{value / GiB:8.1f} GiB" for name, value in rows]
    lines.append("  not counted: attention kernel workspace, CUDA context, allocator fragmentation, NCCL buffers")
    return "\n".join(lines)
