"""Where RoPE's rounding happens: the probe's two variants, `cast` (transformers, vLLM and the
paper's code: cos/sin cast to the activation dtype, q and k rotated in it) and `fp32` (the paper's
text: rotated in FP32, rounded to the activation dtype once, afterwards).

For `fp32`, a forward pre-hook hands the rotary-embedding module (Llama, Qwen2, Mistral) an FP32
tensor: it casts its cos/sin tables to the dtype of that argument, so they stay FP32, and each
layer's `q * cos + rotate_half(q) * sin` is promoted to FP32 on the exact (upcast) q and k. The
probe attention casts them back, the one rounding, and checks per layer that they came in FP32.
No model code is replaced, and the hook is removed on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from evalkit.errors import UserError


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that compute RoPE's cos/sin tables (one per model in Llama, Qwen2, Mistral)."""
    return [module for module in model.modules() if type(module).__name__.endswith("RotaryEmbedding")]


def _tables_in_fp32(_module, args: tuple, kwargs: dict):
    """Forward pre-hook: the rotary module's dtype argument becomes FP32, so its tables stay FP32."""
    if args:
        return (args[0].float(), *args[1:]), kwargs
    return args, {**kwargs, "x": kwargs["x"].float()}


def _require_fp32_tables(module, _args, _kwargs, output) -> None:
    if any(table.dtype != torch.float32 for table in output):
        raise RuntimeError(f"{type(module).__name__} ignored the FP32 request; the fp32 RoPE variant cannot apply")


@contextmanager
def rope_precision(model: torch.nn.Module, variant: str) -> Iterator[None]:
    """Within the block, every forward pass of `model` applies RoPE in `variant` (ProbeOptions checked it)."""
    if variant != "fp32":
        yield
        return
    modules = rotary_modules(model)
    if not modules:
        raise UserError(f"{type(model).__name__} has no rotary-embedding module: the fp32 RoPE variant needs one")
    handles = []
    try:
        for module in modules:
            handles.append(module.register_forward_pre_hook(_tables_in_fp32, with_kwargs=True))
            handles.append(module.register_forward_hook(_require_fp32_tables, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
