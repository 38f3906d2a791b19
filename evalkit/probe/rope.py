"""Where RoPE's rounding happens: the probe's two variants, `cast` (transformers, vLLM and the
paper's code: cos/sin cast to the activation dtype, q and k rotated in it) and `fp32` (the paper's
text: rotated in FP32, rounded to the activation dtype once, afterwards).

For `fp32`, the trainer's hooks (attention.hf.set_rope_precision) keep the rotary-embedding
module's cos/sin tables in FP32, so each layer's `q * cos + rotate_half(q) * sin` is promoted to
FP32 on the exact (upcast) q and k. The probe attention casts them back, the one rounding, and
checks per layer that they came in FP32. No model code is replaced, and the hooks are removed on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from evalkit.attention.hf import rotary_modules, set_rope_precision
from evalkit.errors import UserError


@contextmanager
def rope_precision(model: torch.nn.Module, variant: str) -> Iterator[None]:
    """Within the block, every forward pass of `model` applies RoPE in `variant` (ProbeOptions checked it)."""
    if variant != "fp32":
        yield
        return
    modules = rotary_modules(model)
    if not modules:
        raise UserError(f"{type(model).__name__} has no rotary-embedding module: the fp32 RoPE variant needs one")
    handles = set_rope_precision(model, "fp32")
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
