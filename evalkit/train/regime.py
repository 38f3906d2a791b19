"""The precision regime a run trains in: `dtype` (fp32, bf16 autocast, bf16_full: the released code's
bf16 weights, buffers and residual stream over fp32 masters), `rope_precision` and
`grad_accum_dtype`. Which tensor is in which dtype under each: docs/training.md's table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

DTYPES = ("fp32", "bf16", "bf16_full")
BF16_DTYPES = ("bf16", "bf16_full")  # the runs that compute in bf16 (and write bf16 checkpoints)
GRAD_ACCUM_DTYPES = ("fp32", "bf16")

# ACCUMULATION: the released trainer's order (DeepSpeed v0.14.0, bf16 with ZeRO-3 and
# data_types.grad_accum_dtype unset), which grad_accum_dtype=bf16 follows:
#  1. the loss, in fp32, is divided by the number of micro-batches before backward
#     (runtime/engine.py 1951-1952, _scale_loss_by_gas 1769-1773); evalkit divides it by the
#     global count of target tokens there instead (its normalisation, the same in either dtype);
#  2. each micro-batch's bf16 gradient is reduced across ranks at once, in bf16
#     (communication_data_type defaults to the model's dtype, engine.py 826-837): divided by the
#     world size in bf16, then reduce-scattered (zero/stage3.py 1327-1343 -> comm/
#     coalesced_collectives.py 124-128); evalkit multiplies the loss by the world size and FSDP2
#     averages, the same values for a power-of-two world size (dividing by it in bf16 is exact);
#  3. the reduced partition is copied (first micro-batch) or added into a bf16 buffer
#     (zero/stage3.py 1433-1448, on the GPU also for the CPU buffer of the released config's
#     offload_optimizer; the buffer is bf16 because engine.py 898-902 picks the model's dtype for
#     grad_accum_dtype under ZeRO), so the sum is rounded to bf16 after each add;
#  4. at the step the buffer is cast to fp32 (stage3.py 1462-1467 offloaded, 2261 and 2330 not)
#     for clipping and AdamW on the fp32 masters.
# So the reduction comes before the accumulation, once per micro-batch: one process accumulates
# bf16 gradients in bf16 (bf16_weights); under FSDP2 the policy reduces in bf16 and the sharded
# gradients, accumulated by FSDP2 in fp32, are rounded to bf16 after every micro-batch
# (distributed.round_grads): fp32(a) + fp32(b) rounded to bf16 is the bf16 sum a + b. Across 2
# ranks a bf16 reduction is one rounding of a + b in any backend (gloo's too); across more, the
# order of the rounded partial sums is the collective's own (NCCL's ring, as DeepSpeed's).


def record(dtype: str, rope_precision: str, grad_accum_dtype: str = "fp32") -> dict[str, str]:
    """What each kind of tensor was in, for meta.json (the leaderboard and the probe read it).

    `dtype` and `rope` are the keys runs recorded before the regime was spelled out; runs recorded
    before `grad_accum` accumulated in fp32."""
    if dtype not in BF16_DTYPES:
        everything = ("weights", "buffers", "residual", "rotation", "master", "grad_accum")
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
        "grad_accum": grad_accum_dtype,
    }


@contextmanager
def bf16_weights(model: torch.nn.Module, accumulate: torch.dtype = torch.float32) -> Iterator[None]:
    """One process under bf16_full, for one optimizer step's forwards and backwards: the parameters
    hold bf16 copies of the fp32 masters, each bf16 gradient added into one of dtype `accumulate`
    as soon as it is made (ACCUMULATION). On exit they hold the fp32 masters again, with fp32
    gradients, for clipping and AdamW. Swapping the tensors behind the same Parameter objects
    keeps the optimizer, its state dict and the checkpoints as in an fp32 run: the masters are the
    parameters. (Under FSDP2 the same regime is its mixed-precision policy: train.distributed.)"""
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.data for p in params]
    grads: dict[int, torch.Tensor] = {}

    def fold(param: torch.Tensor) -> None:
        assert param.grad is not None  # the hook runs once a gradient has been accumulated
        grad = param.grad.to(accumulate)
        grads[id(param)] = grad if id(param) not in grads else grads[id(param)].add_(grad)
        param.grad = None

    for param in params:
        if param.grad is not None:  # a gradient from before: kept
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
            grad = grads.get(id(param))
            param.grad = None if grad is None else grad.float()
