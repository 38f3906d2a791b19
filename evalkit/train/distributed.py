"""One code path for 1 process and for torchrun: FSDP2 (fully_shard) when WORLD_SIZE > 1 or in a
process group the caller joined; rank 0 alone reads and writes weights, the others waiting in a
gloo group of their own (docs/training.md's "Distributed").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from evalkit.arglists import environ_int
from evalkit.train.regime import BF16_DTYPES


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    io_group: Any = None  # the gloo group for waits on rank 0's reads and writes (open_io_group)
    distributed: bool = False  # in a process group: sharded (FSDP2) and collective, even with one rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistContext:
    world = environ_int("WORLD_SIZE", 1, fix="launch with torchrun, which sets it")
    cuda = torch.cuda.is_available()
    if world == 1 and not dist.is_initialized():
        return DistContext(device=torch.device("cuda" if cuda else "cpu"))
    local_rank = environ_int("LOCAL_RANK", 0, fix="launch with torchrun, which sets it")
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, distributed=True)


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def open_io_group(ctx: DistContext, timeout_minutes: float) -> None:
    """A CPU (gloo) group over all ranks, with its own timeout, for waits on rank 0's file work:
    NCCL's watchdog sees no NCCL collective in flight on a rank blocked in it (module docstring)."""
    if ctx.distributed and ctx.io_group is None:
        ctx.io_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=timeout_minutes))


def wait_for_rank0(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier(group=ctx.io_group)


def broadcast_object(value: Any, ctx: DistContext) -> Any:
    """Rank 0's `value` on every rank (a small picklable object: settings, RNG state, an error)."""
    if not ctx.distributed:
        return value
    holder = [value if ctx.is_main else None]
    dist.broadcast_object_list(holder, src=0, group=ctx.io_group)
    return holder[0]


def mixed_precision_policy(dtype: str, grad_accum_dtype: str = "fp32"):
    """FSDP2's policy for bf16 runs (docs/training.md): gradient reduction in grad_accum_dtype
    (regime.ACCUMULATION); inputs not cast, so the residual stream and RoPE's cos/sin stay as in one
    process. None for fp32 runs."""
    if dtype not in BF16_DTYPES:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    reduce_dtype = torch.bfloat16 if grad_accum_dtype == "bf16" else torch.float32
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, cast_forward_inputs=False)


def round_grads(model: torch.nn.Module) -> None:
    """Round the sharded gradients to bf16 in place: after each micro-batch, FSDP2's fp32 sum of
    its bf16 reductions becomes a bf16 accumulation (regime.ACCUMULATION)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                grad.copy_(grad.to(torch.bfloat16))


def shard(
    model: torch.nn.Module, ctx: DistContext, dtype: str = "fp32", grad_accum_dtype: str = "fp32"
) -> torch.nn.Module:
    """FSDP2 over the loss wrapper (train.loop.MaskedLMLoss, not imported: loop.py imports this
    module): each decoder layer its own unit, the root holds embeddings, norm, head. Under bf16
    autocast the root stays fp32 (an fp32 residual stream); under bf16_full it computes in bf16
    too, so the embeddings, the final norm and the head are bf16 as in the released regime."""
    if not ctx.distributed:
        return model
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision_policy(dtype, grad_accum_dtype)
    layer_policy = {} if policy is None else {"mp_policy": policy}
    decoder = cast(Any, model).lm.base_model
    for layer in cast(torch.nn.ModuleList, decoder.layers):  # HF decoders hold them in one
        fully_shard(layer, **layer_policy)
    fully_shard(model, **(layer_policy if dtype == "bf16_full" else {}))
    return model


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Allocate this rank's shards of a sharded model built on the meta device (values follow by
    broadcast); its buffers, real since construction and in no state dict, keep their values."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def all_reduce_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> tuple[dict, dict]:
    """(weights, optimizer state): unsharded, on CPU, so any world size can load them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=ctx.distributed)
    # A model's state dict holds only tensors (the type's other members are for optimizer states).
    weights = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    weights = {k: v.detach().cpu() for k, v in weights.items()}
    return weights, get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state(
    model, model_state: dict, ctx: DistContext, optimizer: torch.optim.Optimizer | None = None, optimizer_state=None
) -> None:
    """Load full_state's weights and, given an optimizer, its state (strict=False: tied weights are
    stored once). Distributed, only rank 0 holds them (the others pass {}): each tensor is broadcast
    from it and sharded on arrival."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=ctx.distributed)
    set_model_state_dict(model, model_state if ctx.is_main else {}, options=options)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state if ctx.is_main else {}, options=options)
