"""RoPE at serving time: FP32 rotation with one rounding, bf16 frequencies, a constant position
shift, long windows.

The precision variants are the BF16 probe's (probe.measure.rope_precision), runnable in vLLM: `cast` is
vLLM's own rotary embedding, untouched (cos/sin cast to the model dtype, q and k rotated in it,
as transformers does); `fp32` rotates q and k in FP32 with FP32 cos/sin, rounded once.
`frequencies` "bf16" builds the cos/sin table from the inverse frequencies rounded to bf16, as a
bf16 trainer held them (models.precision.Serving), the angles and cos/sin computed in FP32 from them.

`position_shift` adds a constant to every position id before the rotation (the probe's Δ; the
anchor moves to the shift). Windows beyond the checkpoint's max_position_embeddings (allowed to
test extrapolation, as in the hf engine) grow the cos/sin table beyond what vLLM builds.
Options reach the model through the HF config (hf_overrides), under CONFIG_NAMES.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

CONFIG_NAMES = {
    "variant": "evalkit_rope",
    "position_shift": "evalkit_position_shift",
    "frequencies": "evalkit_rope_frequencies",
}
# Rotary classes whose tables are a plain function of the position: their tables can be
# extended and shifted. (Dynamic NTK, YaRN and multi-factor linear scaling are not.)
EXTENDABLE_ROTARY_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding")


@dataclass(frozen=True)
class RopeOptions:
    variant: str = "cast"
    position_shift: int = 0  # both judged where the user gives them (VLLMEngine.check_settings)
    frequencies: str = "fp32"  # fp32 | bf16: the served regime's (models.precision.served_regime)

    def hf_overrides(self) -> dict[str, object]:
        return {CONFIG_NAMES[name]: value for name, value in asdict(self).items()}

    @classmethod
    def from_config(cls, hf_config) -> RopeOptions:
        return cls(**{name: getattr(hf_config, key) for name, key in CONFIG_NAMES.items() if hasattr(hf_config, key)})


class ServingRotaryEmbedding(nn.Module):
    """Stands in for a vLLM rotary embedding: same call, (positions, query, key) -> (query, key)."""

    cos_sin_fp32: torch.Tensor  # a buffer (variant fp32)

    def __init__(self, original: Any, options: RopeOptions, num_positions: int) -> None:  # vLLM's RotaryEmbedding
        super().__init__()
        if type(original).__name__ not in EXTENDABLE_ROTARY_CLASSES:
            raise NotImplementedError(
                f"RoPE options and windows beyond the checkpoint's need one of {', '.join(EXTENDABLE_ROTARY_CLASSES)}, "
                f"and this model uses {type(original).__name__}"
            )
        self.variant = options.variant
        self.position_shift = options.position_shift
        self.head_size = original.head_size
        self.rotary_dim = original.rotary_dim
        self.is_neox_style = original.is_neox_style
        # The module's own frequencies (Llama 3's scaling included), rounded as a bf16 trainer held them.
        inv_freq = original._compute_inv_freq(original.base)
        if options.frequencies == "bf16":
            inv_freq = inv_freq.to(torch.bfloat16)
        # The FP32 cos|sin table [positions, rotary_dim]: vLLM's RotaryEmbedding._compute_cos_sin_cache.
        positions = torch.arange(num_positions + options.position_shift, dtype=torch.float, device=inv_freq.device)
        angles = torch.einsum("i,j -> ij", positions, inv_freq.float())
        table = torch.cat((angles.cos(), angles.sin()), dim=-1)
        if self.variant == "cast":
            # vLLM's own kernels, on a table long enough for the shifted positions.
            original.cos_sin_cache = table.to(original.cos_sin_cache.dtype)
            original.max_position_embeddings = table.shape[0]
            self.original = original
        else:
            self.register_buffer("cos_sin_fp32", table, persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        positions = positions + self.position_shift
        if self.variant == "cast":
            return self.original(positions, query, key)
        return self._rotate_fp32(positions, query), None if key is None else self._rotate_fp32(positions, key)

    def _rotate_fp32(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads * head_size] rotated in FP32 and rounded to its dtype once."""
        shape = x.shape
        x = x.view(positions.numel(), -1, self.head_size)
        cos, sin = self.cos_sin_fp32.index_select(0, positions.flatten()).unsqueeze(1).chunk(2, dim=-1)
        rotated = x[..., : self.rotary_dim].float()
        if self.is_neox_style:  # halves: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
            x1, x2 = rotated.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:  # interleaved pairs, GPT-J style
            x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rotated.to(x.dtype), x[..., self.rotary_dim :]), dim=-1).reshape(shape)


def install_rope_options(model: nn.Module, options: RopeOptions, max_model_len: int) -> int:
    """Replace the model's rotary embeddings where the options or the window need it; returns how many.

    Layers sharing one rotary module (vLLM caches them) keep sharing one replacement.
    """
    owners = [module for module in model.modules() if isinstance(getattr(module, "rotary_emb", None), nn.Module)]
    replacements: dict[int, ServingRotaryEmbedding] = {}
    for owner in owners:
        rotary: Any = owner.rotary_emb  # a vLLM rotary embedding (untyped here)
        if isinstance(rotary, ServingRotaryEmbedding):
            continue
        if id(rotary) not in replacements:  # (a replacement resizes the shared original's table)
            if options == RopeOptions() and max_model_len <= rotary.max_position_embeddings:
                continue
            replacements[id(rotary)] = ServingRotaryEmbedding(rotary, options, max_model_len)
        owner.rotary_emb = replacements[id(rotary)]
    return len(replacements)
