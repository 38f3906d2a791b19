"""One code path for 1 process and for torchrun: FSDP2 (fully_shard) when WORLD_SIZE > 1.

On CUDA the process group uses NCCL, on CPU gloo (which is how the tests run 2 processes).
Full (unsharded) state dicts are gathered to CPU for checkpoints, so a checkpoint written by
8 GPUs loads in 1 process and the other way round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistContext:
    """Join the torchrun process group if there is one; pick this process's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world == 1:
        return DistContext(device=torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def shard(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """FSDP2 over the loss wrapper: each decoder layer its own unit, the root holds embeddings, norm, head."""
    if not ctx.distributed:
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in model.lm.base_model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def all_reduce_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def _full_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: torch.nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    """Unsharded weights on CPU, keyed by parameter name, in any world size."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_full_options(cpu_offload=ctx.distributed))
    return {k: v.detach().cpu() for k, v in state.items()}


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> dict:
    """Unsharded optimizer state keyed by parameter name, so any world size can load it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=ctx.distributed))


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict, ctx: DistContext) -> None:
    """Load unsharded weights and optimizer state (as saved by a run of any world size)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = _full_options(strict=False)  # tied weights are stored once
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
