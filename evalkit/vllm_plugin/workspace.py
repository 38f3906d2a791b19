"""A preallocated buffer for the prefix keys and values [L, H, D] that the anchor kernels read back
from the paged KV cache, made while vLLM builds the model so that its memory profile counts it
(docs/vllm.md): serving allocates nothing."""

from __future__ import annotations

import math

import torch


class PrefixWorkspace:
    """Keys and values of the first L tokens of one request, gathered whole blocks at a time into
    buffers made once: a gather writes into them (index_select with out=) and returns views."""

    def __init__(self, capacity_tokens: int, heads: int, dim: int, dtype: torch.dtype, device) -> None:
        shape = (capacity_tokens, heads, dim)
        self.key = torch.empty(shape, dtype=dtype, device=device)
        self.value = torch.empty(shape, dtype=dtype, device=device)

    @property
    def capacity_tokens(self) -> int:
        return self.key.shape[0]

    def gather(
        self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table_row: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [L, H, D] of positions 0..L-1, read from paged caches [NB, BS, H, D] (views
        of vLLM's cache are fine) through the request's block-table row. The results are views of
        this workspace: valid until the next gather."""
        block_size = key_cache.shape[1]
        num_blocks = math.ceil(length / block_size)
        if num_blocks * block_size > self.capacity_tokens:
            raise RuntimeError(
                f"a packed request of {length} tokens in blocks of {block_size} needs "
                f"{num_blocks * block_size} tokens of prefix workspace, built for {self.capacity_tokens}"
            )
        blocks = block_table_row[:num_blocks].to(key_cache.device)  # no copy where it is already there
        shape = (num_blocks, block_size, *self.key.shape[1:])
        # The block table lists a request's blocks in position order, so whole blocks side by side
        # are its positions 0, 1, ... in order: the first L rows are the prefix.
        torch.index_select(key_cache, 0, blocks, out=self.key[: num_blocks * block_size].view(shape))
        torch.index_select(value_cache, 0, blocks, out=self.value[: num_blocks * block_size].view(shape))
        return self.key[:length], self.value[:length]


def workspace_capacity(max_tokens: int, block_size: int) -> int:
    """Tokens a workspace needs for any request of up to max_tokens, in blocks of up to block_size."""
    return max_tokens + block_size - 1


_shared: dict[tuple, PrefixWorkspace] = {}


def shared_prefix_workspace(
    max_tokens: int, block_size: int, heads: int, dim: int, dtype: torch.dtype, device
) -> PrefixWorkspace:
    """The process's workspace for this (device, dtype, heads, dim), made at the first call (the
    first layer built) and returned to every later one; a larger demand replaces it (at build time)."""
    device = torch.device(device)
    key = (str(device), dtype, heads, dim)
    capacity = workspace_capacity(max_tokens, block_size)
    workspace = _shared.get(key)
    if workspace is None or workspace.capacity_tokens < capacity:
        workspace = _shared[key] = PrefixWorkspace(capacity, heads, dim, dtype, device)
    return workspace
