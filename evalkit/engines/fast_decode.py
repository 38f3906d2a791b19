"""A greedy decoding step for Llama models without transformers' per-call machinery.

Shape legend: B rows, C cache slots filled so far, R slots of room, H hidden size, D head dim,
V vocabulary.

On a tiny model a decoding step of transformers' `model(...)` is mostly Python: decorators,
keyword plumbing, module calls, output objects and a causal mask built from the 2D padding mask
at every step (21-42% of generation CPU time on the shipped 1.3M-parameter checkpoints,
results/tiny-eval-speed/). This step performs the same tensor operations, on tensors of the
same shapes, in the same order, as transformers 5.x's LlamaForCausalLM does for one new token
per row (embedding, per layer RMSNorm, q/k/v projections, rotary, the cache write, the model's
own registered attention function, o_proj, residual, RMSNorm, SiLU MLP, residual; final norm,
lm_head), so its logits are those of the transformers path bit for bit (tested). What it does
once instead of at every step:

- the padding mask: a bool [B, 1, 1, C + R] buffer per batch, sliced to the filled slots (the
  4D mask transformers builds holds the same values: every cached slot precedes the query);
  None when no slot is padding, as transformers' SDPA mask is then;
- rotary cos/sin: one table per position, computed by the model's own rotary module for all
  positions at once (elementwise, so each row is the value a single position gets), gathered;
- the K/V write: the engine's growing cache layers already write in place.

It runs only where `refusal(...)` finds nothing it does not implement: an explicit allow-list
of the model class, module types, config fields and their values, the attention function, the
device and the absence of hooks. Anything else decodes through transformers, and the engine's
info says which path ran and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Config fields the step reads, each with the values it implements (None: any value).
_READ_FIELDS: dict[str, Any] = {
    "hidden_size": None,
    "intermediate_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "num_key_value_heads": None,
    "head_dim": None,
    "rms_norm_eps": None,
    "attention_bias": None,  # biases are passed to F.linear as nn.Linear does
    "mlp_bias": None,
    "tie_word_embeddings": None,  # lm_head's weight is read either way
    "vocab_size": None,
    "hidden_act": ("silu",),
    "pretraining_tp": (1,),
    "attention_dropout": None,  # dropout is off in eval mode (checked: model.training)
    "output_attentions": (False,),
    "output_hidden_states": (False,),
    "return_dict": None,
    "use_cache": None,
}
# Fields that never enter a forward's arithmetic: names, token ids, labels, bookkeeping.
_INERT_FIELDS = {
    "_name_or_path",
    "_model_name_or_path",
    "architectures",
    "model_type",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "unk_token_id",
    "initializer_range",
    "max_position_embeddings",  # transformers' default rotary computes any position alike
    "id2label",
    "label2id",
    "problem_type",
    "is_encoder_decoder",
    "chunk_size_feed_forward",
}
_ROPE_TYPES = ("default",)


def refusal(model, device: torch.device, attention: str, plain_cache: bool) -> str | None:
    """Why the fast step cannot decode this model (one phrase), or None where it applies."""
    from transformers.models.llama import modeling_llama as llama

    if type(model) is not llama.LlamaForCausalLM:
        return f"{type(model).__name__} is not LlamaForCausalLM"
    if device.type != "cpu":
        return f"device {device.type}: the fast step is only proven on CPU"
    if attention != "sdpa":
        return f"attention {attention!r}: the fast step implements sdpa only"
    if not plain_cache:
        return "the model's cache is not plain full attention"
    config = model.config
    for key, value in config.to_dict().items():
        if key in _INERT_FIELDS:
            continue
        if key == "rope_parameters":
            rope_type = (value or {}).get("rope_type")
            if rope_type not in _ROPE_TYPES or set(value) - {"rope_type", "rope_theta"}:
                return f"rope_parameters {value!r}: only plain RoPE (rope_type default, rope_theta) is implemented"
            continue
        if key not in _READ_FIELDS:
            return f"config field {key!r} is not implemented by the fast step"
        allowed = _READ_FIELDS[key]
        if allowed is not None and value not in allowed:
            return f"config {key}={value!r}: the fast step implements {', '.join(map(repr, allowed))}"
    if getattr(config, "quantization_config", None) is not None or getattr(model, "hf_quantizer", None) is not None:
        return "quantised weights"
    if model.training:
        return "the model is in training mode"
    return _module_refusal(model, llama)


def _module_refusal(model, llama) -> str | None:
    """The modules must be transformers' own Llama classes, unhooked, with plain Linear layers."""
    inner = model.model
    expected = [(inner.embed_tokens, torch.nn.Embedding), (inner.norm, llama.LlamaRMSNorm)]
    expected += [(inner.rotary_emb, llama.LlamaRotaryEmbedding), (model.lm_head, torch.nn.Linear)]
    if len(inner.layers) != model.config.num_hidden_layers:
        return "the model's layer count differs from its config"
    for layer in inner.layers:
        expected += [(layer, llama.LlamaDecoderLayer), (layer.self_attn, llama.LlamaAttention)]
        expected += [(layer.input_layernorm, llama.LlamaRMSNorm), (layer.post_attention_layernorm, llama.LlamaRMSNorm)]
        expected += [(layer.mlp, llama.LlamaMLP)]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            expected.append((getattr(layer.self_attn, name), torch.nn.Linear))
        for name in ("gate_proj", "up_proj", "down_proj"):
            expected.append((getattr(layer.mlp, name), torch.nn.Linear))
    for module, cls in expected:
        if type(module) is not cls:
            return f"{type(module).__name__} where the fast step implements {cls.__name__}"
        if "forward" in vars(module):
            return f"{cls.__name__} has a replaced forward"
    for module in model.modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return f"{type(module).__name__} has forward hooks (e.g. a RoPE precision setting)"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module hooks are registered"
    return None


@dataclass
class FastDecodeState:
    """A batch ready for its next greedy token, on the fast path."""

    cache: Any  # transformers Cache of the engine's growing layers (K/V written in place)
    slot_mask: torch.Tensor  # bool [B, 1, 1, C + R]: False on padding slots, True on the rest
    padded: bool  # whether any filled slot is padding (else SDPA takes no mask, as in transformers)
    next_positions: torch.Tensor  # long [B]
    logits: torch.Tensor  # [B, V]

    def select(self, rows: list[int]) -> FastDecodeState:
        index = torch.tensor(rows, device=self.slot_mask.device)
        self.cache.batch_select_indices(index)
        slot_mask = self.slot_mask[index]
        filled = self.cache.layers[0].length
        padded = not bool(slot_mask[:, :, :, :filled].all())
        return FastDecodeState(self.cache, slot_mask, padded, self.next_positions[index], self.logits[index])


@dataclass
class _Layer:
    attention_module: Any  # handed to the attention function, as transformers does
    input_norm: tuple[torch.Tensor, float]
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    post_norm: tuple[torch.Tensor, float]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def _linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _norm(module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def _rms_norm(hidden: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """LlamaRMSNorm.forward, operation for operation."""
    weight, eps = norm
    input_dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastLlamaDecoder:
    """The decoding step of a LlamaForCausalLM that `refusal` accepted."""

    def __init__(self, model) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.model = model
        inner = model.model
        self.attention_name = model.config._attn_implementation
        self.attention = ALL_ATTENTION_FUNCTIONS[self.attention_name]
        self.embedding = inner.embed_tokens.weight
        self.final_norm = _norm(inner.norm)
        self.head = _linear(model.lm_head)
        self.head_dim = inner.layers[0].self_attn.head_dim
        self.layers = [
            _Layer(
                layer.self_attn,
                _norm(layer.input_layernorm),
                _linear(layer.self_attn.q_proj),
                _linear(layer.self_attn.k_proj),
                _linear(layer.self_attn.v_proj),
                _linear(layer.self_attn.o_proj),
                _norm(layer.post_attention_layernorm),
                _linear(layer.mlp.gate_proj),
                _linear(layer.mlp.up_proj),
                _linear(layer.mlp.down_proj),
            )
            for layer in inner.layers
        ]
        self._cos = self._sin = self.embedding.new_empty(0, self.head_dim)

    def _rotary_table(self, positions: int) -> None:
        """cos/sin [positions, D] from the model's rotary module, for positions 0..positions-1."""
        if self._cos.shape[0] >= positions:
            return
        size = max(positions, 2 * self._cos.shape[0], 4096)
        position_ids = torch.arange(size, device=self.embedding.device)[None]
        cos, sin = self.model.model.rotary_emb(self.embedding[:1], position_ids=position_ids)
        self._cos, self._sin = cos[0], sin[0]

    def begin(self, cache, attention_mask: torch.Tensor, next_positions, logits, room: int) -> FastDecodeState:
        """The fast state of a batch whose cache holds `attention_mask`'s slots (long [B, C])."""
        if self.model.config._attn_implementation != self.attention_name:
            raise RuntimeError(f"attention changed to {self.model.config._attn_implementation} after the fast step")
        batch, filled = attention_mask.shape
        if any(layer.length != filled for layer in cache.layers):
            raise RuntimeError("the fast step needs every cache layer filled to the mask's length")
        slot_mask = torch.ones(batch, 1, 1, filled + room, dtype=torch.bool, device=attention_mask.device)
        slot_mask[:, 0, 0, :filled] = attention_mask.bool()
        self._rotary_table(int(next_positions.max()) + room + 1)
        padded = not bool(slot_mask[:, :, :, :filled].all())
        return FastDecodeState(cache, slot_mask, padded, next_positions, logits)

    def step(self, state: FastDecodeState, next_tokens: torch.Tensor) -> FastDecodeState:
        """Feed one token per row: the cache grows by one slot, the logits are the next token's."""
        batch = next_tokens.shape[0]
        positions = state.next_positions
        hidden = F.embedding(next_tokens[:, None], self.embedding)  # [B, 1, H]
        cos = self._cos[positions][:, None, None, :]  # [B, 1, 1, D], as apply_rotary_pos_emb unsqueezes it
        sin = self._sin[positions][:, None, None, :]
        filled = state.cache.layers[0].length + 1
        mask = state.slot_mask[:, :, :, :filled] if state.padded else None
        for layer, cache_layer in zip(self.layers, state.cache.layers):
            residual = hidden
            hidden = _rms_norm(hidden, layer.input_norm)
            shape = (batch, 1, -1, self.head_dim)
            query = F.linear(hidden, *layer.q).view(shape).transpose(1, 2)  # [B, heads, 1, D]
            key = F.linear(hidden, *layer.k).view(shape).transpose(1, 2)
            value = F.linear(hidden, *layer.v).view(shape).transpose(1, 2)
            query = (query * cos) + (_rotate_half(query) * sin)
            key = (key * cos) + (_rotate_half(key) * sin)
            keys, values = cache_layer.update(key, value)
            out, _ = self.attention(
                layer.attention_module, query, keys, values, mask, dropout=0.0, scaling=layer.attention_module.scaling
            )
            out = out.reshape(batch, 1, -1).contiguous()
            hidden = residual + F.linear(out, *layer.o)
            residual = hidden
            hidden = _rms_norm(hidden, layer.post_norm)
            hidden = F.linear(F.silu(F.linear(hidden, *layer.gate)) * F.linear(hidden, *layer.up), *layer.down)
            hidden = residual + hidden
        hidden = _rms_norm(hidden, self.final_norm)
        logits = F.linear(hidden, *self.head)[:, -1]
        return FastDecodeState(state.cache, state.slot_mask, state.padded, positions + 1, logits)
