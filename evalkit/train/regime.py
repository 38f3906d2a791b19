"""The precision regime a run trains in (`dtype`): which tensors are bf16 and which stay fp32.

    fp32       everything in fp32.
    bf16       autocast over fp32 weights: matmuls in bf16; weights, buffers (RoPE's frequencies)
               and the residual stream between layers stay fp32.
    bf16_full  the paper's released regime (DeepSpeed's bf16 mode, which casts the whole model):
               the model computes with bf16 weights and bf16 buffers, so the residual stream is
               bf16 too, while the optimizer keeps fp32 master weights and fp32 AdamW moments;
               gradients are accumulated (and, under FSDP2, reduced) in fp32.

`rope_precision` (bf16 runs) says how q and k are rotated: `bf16` casts cos/sin to bf16 first (the
released code; under bf16_full they are computed from bf16 frequencies, as the released stack
computes them), `fp32` rotates in fp32 (the paper's text: under bf16_full the frequencies stay
fp32 as well, and q and k are rounded to bf16 once, at the attention kernel).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

DTYPES = ("fp32", "bf16", "bf16_full")
BF16_DTYPES = ("bf16", "bf16_full")  # the runs that compute in bf16 (and write bf16 checkpoints)


def record(dtype: str, rope_precision: str) -> dict[str, str]:
    """What each kind of tensor was in, for meta.json (the leaderboard and the probe read it).

    `dtype` and `rope` are the keys runs recorded before the regime was spelled out."""
    if dtype not in BF16_DTYPES:
        everything = ("weights", "buffers", "residual", "rotation", "master")
        return {"dtype": "fp32", "rope": "fp32", **dict.fromkeys(everything, "fp32")}
    full = dtype == "bf16_full"
    return {
        "dtype": dtype,
        "rope": rope_precision,
        "weights": "bf16" if full else "fp32 (bf16 casts under autocast)",
        "buffers": ("bf16" if rope_precision == "bf16" else "bf16, RoPE frequencies fp32") if full else "fp32",
        "residual": "bf16" if full else "fp32",
        "rotation": rope_precision,
        "master": "fp32",
    }


def cast_buffers(model: torch.nn.Module, rope_precision: str) -> None:
    """bf16_full: every floating buffer to bf16, as casting the whole model does; RoPE's
    frequencies (computed in fp32 at construction, as the model computes them) are cast too,
    unless the rotation is to be fp32."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and rope_precision == "fp32":
            continue
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point():
                setattr(module, name, buffer.to(torch.bfloat16))


@contextmanager
def bf16_weights(model: torch.nn.Module) -> Iterator[None]:
    """One process under bf16_full, for one optimizer step's forwards and backwards: the parameters
    hold bf16 copies of the fp32 masters, each bf16 gradient added into an fp32 one as soon as it is
    made (as DeepSpeed's bf16 optimizer accumulates). On exit they hold the fp32 masters again, with
    fp32 gradients, for clipping and AdamW. Swapping the tensors behind the same Parameter objects
    keeps the optimizer, its state dict and the checkpoints as in an fp32 run: the masters are the
    parameters. (Under FSDP2 the same regime is its mixed-precision policy: train.distributed.)"""
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.data for p in params]
    grads: dict[int, torch.Tensor] = {}

    def fold(param: torch.Tensor) -> None:
        assert param.grad is not None  # the hook runs once a gradient has been accumulated
        grad = param.grad.float()
        grads[id(param)] = grad if id(param) not in grads else grads[id(param)].add_(grad)
        param.grad = None

    for param in params:
        if param.grad is not None:  # a gradient from before: kept, in fp32
            fold(param)
    handles = [param.register_post_accumulate_grad_hook(fold) for param in params]
    for param in params:
        param.data = param.data.to(torch.bfloat16)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for param, master in zip(params, masters):
            param.data = master
            param.grad = grads.get(id(param))
