"""Dtypes and devices: the one place evalkit names them and turns names into torch objects.

evalkit's names (bf16, fp16, fp32) are used everywhere a user types or reads one: the CLI,
configs, results. Libraries call them otherwise: torch.bfloat16, "bfloat16" for vLLM and
lm-eval. torch is imported only when a torch object is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from evalkit.errors import UserError

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("bf16", "fp16", "fp32")
LONG_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch's, vLLM's, lm-eval's
# How RoPE's cos/sin tables meet a bf16 model: "cast" rounds them to the model's dtype, as stock
# models do (the paper's subject); "fp32" keeps them in float32. Used by the probe (evalkit.probe.rope)
# and by serving (evalkit.vllm_plugin.rope), which must not import the probe.
ROPE_VARIANTS = ("cast", "fp32")


def check_dtype(name: str, allowed: Sequence[str] = DTYPE_NAMES) -> str:
    """`name` if it is one of `allowed`, else a UserError listing them."""
    if name not in allowed:
        raise UserError(f"unknown dtype {name!r}; choose one of: {', '.join(allowed)}")
    return name


def engine_dtype(asked: str | None = None, device: str = "auto") -> str:
    """The dtype an engine computes in: the one asked for, else bf16 on CUDA and fp32 elsewhere.
    The engines resolve theirs here, and the benchmarks key a stored result by it before any
    engine is built (sweep.engine_choice.EngineChoice.dtype): the recorded one is the used one."""
    if asked:
        return check_dtype(asked)
    return "bf16" if resolve_device(device).type == "cuda" else "fp32"


def long_dtype_name(name: str) -> str:
    """ "bfloat16" for "bf16": what torch attributes, vLLM and lm-eval call evalkit's dtype names."""
    return LONG_DTYPE_NAMES[check_dtype(name)]


def torch_dtype(name: str) -> torch.dtype:
    """torch.bfloat16 for "bf16", and so on."""
    import torch

    return getattr(torch, long_dtype_name(name))


def resolve_device(name: str) -> torch.device:
    """auto (CUDA when torch sees one, else CPU), cpu, cuda or cuda:N, refused with one line if unusable."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but torch sees no CUDA device")
    return device
