"""Where a vLLM attention backend keeps each key and value element: learned, not hard-coded.

vLLM's KV cache layouts are not part of its API: they differ between backends and versions (the
CPU backend stores each block's keys transposed for its SIMD loops; another ISA may tile them
differently). The anchor kernels read keys and values back as [NB blocks, BS tokens, H heads, D],
so the layout is learned once, copying no backend's code: probe values are written through the
backend's own cache writer into a two-block scratch cache, and where each element landed is
read back. Each probe value is one base-64 digit of the element's index, plus one (exact in
fp32, bf16 and fp16; 0 marks "not written"), so a few passes identify every element.

Where the learned offsets are affine in (token, head, dim), as for every backend seen so far,
the caches are zero-copy strided views; otherwise `gather` reads a request through the offsets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
"""write(key [T, H, D], value [T, H, D], kv_cache, slot_mapping [T]): the backend's cache update."""

_DIGIT_BASE = 64  # probe values 1..64 are exact in every cache dtype evalkit serves


@dataclass(frozen=True)
class LearnedLayout:
    """Logical positions (row-major within one block of the cache tensor) of every element."""

    block_shape: tuple[int, ...]  # the cache tensor's shape without its leading block dimension
    key_index_BHD: torch.Tensor  # long [BS, H, D]
    value_index_BHD: torch.Tensor  # long [BS, H, D]

    def _storage_offsets(self, index_BHD: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        """Storage offsets, from a block's first element, of the elements under the cache's strides."""
        strides = torch.tensor(kv_cache.stride()[1:])
        multi_index = torch.stack(torch.unravel_index(index_BHD, self.block_shape), dim=-1)
        return (multi_index * strides).sum(dim=-1)

    def views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Zero-copy key and value views [NB, BS, H, D] of `kv_cache`, or None when not strided."""
        views = []
        for index in (self.key_index_BHD, self.value_index_BHD):
            offsets = self._storage_offsets(index, kv_cache)
            strides = _affine_strides(offsets)
            if strides is None:
                return None
            size = (kv_cache.shape[0], *offsets.shape)
            base = kv_cache.storage_offset() + int(offsets[0, 0, 0])
            views.append(torch.as_strided(kv_cache, size, (kv_cache.stride(0), *strides), base))
        return views[0], views[1]

    def gather(self, kv_cache: torch.Tensor, block_table_row: torch.Tensor, length: int):
        """Keys and values [L, H, D] of one request's positions 0..L-1 (a copy), for any layout."""
        device = kv_cache.device
        positions = torch.arange(length, device=device)
        block_size = self.key_index_BHD.shape[0]
        blocks = block_table_row.to(device)[positions // block_size].long()
        storage_numel = kv_cache.untyped_storage().nbytes() // kv_cache.element_size()
        storage = torch.as_strided(kv_cache, (storage_numel,), (1,), 0)
        out = []
        for index in (self.key_index_BHD, self.value_index_BHD):
            offsets = self._storage_offsets(index, kv_cache).to(device)
            flat = blocks[:, None, None] * kv_cache.stride(0) + offsets[positions % block_size]
            out.append(storage[flat + kv_cache.storage_offset()])
        return out[0], out[1]


def _affine_strides(offsets_BHD: torch.Tensor) -> tuple[int, int, int] | None:
    """(token, head, dim) strides when offset = base + t*st + h*sh + d*sd everywhere, else None."""
    base = offsets_BHD[0, 0, 0]
    steps = ((1, 0, 0), (0, 1, 0), (0, 0, 1))  # one token, one head, one dim on
    strides = [int(offsets_BHD[step] - base) if size > 1 else 0 for step, size in zip(steps, offsets_BHD.shape)]
    grids = torch.meshgrid(*(torch.arange(n) for n in offsets_BHD.shape), indexing="ij")
    predicted = base + sum(grid * stride for grid, stride in zip(grids, strides))
    return (strides[0], strides[1], strides[2]) if torch.equal(predicted, offsets_BHD) else None


def _learn_part(write: Writer, scratch: torch.Tensor, shape: tuple[int, int, int], part: str) -> torch.Tensor:
    """Logical index within block 1 of every element of the key (or value) part."""
    block_size, heads, dim = shape
    num_elements = block_size * heads * dim
    num_digits = max(1, math.ceil(math.log(num_elements, _DIGIT_BASE)))
    slots = torch.arange(block_size, 2 * block_size, device=scratch.device)  # block 1: block 0 must stay untouched
    zeros = torch.zeros(shape, dtype=scratch.dtype, device=scratch.device)
    source = torch.zeros(scratch[1].numel(), dtype=torch.long)
    element = torch.arange(num_elements, device=scratch.device)
    for digit in range(num_digits):
        scratch.zero_()
        probe = ((element // _DIGIT_BASE**digit) % _DIGIT_BASE + 1).to(scratch.dtype).view(shape)
        write(probe, zeros, scratch, slots) if part == "key" else write(zeros, probe, scratch, slots)
        if bool(scratch[0].ne(0).any()):
            raise RuntimeError("the KV cache's first dimension is not its block dimension")
        landed = scratch[1].reshape(-1).float().cpu().long()
        if digit == 0:
            written = landed > 0
        source += (landed - 1).clamp(min=0) * _DIGIT_BASE**digit
    index = torch.full((num_elements,), -1, dtype=torch.long)
    index[source[written]] = written.nonzero().flatten()
    if int(written.sum()) != num_elements or bool((index < 0).any()):
        raise RuntimeError(f"the cache writer did not store each {part} element exactly once as written")
    return index.view(shape)


def learn_layout(
    write: Writer, block_shape: tuple[int, ...], dtype: torch.dtype, device, block_size: int, heads: int, dim: int
) -> LearnedLayout:
    """Learn where `write` puts keys and values in a cache whose blocks have shape `block_shape`."""
    scratch = torch.zeros((2, *block_shape), dtype=dtype, device=device)
    shape = (block_size, heads, dim)
    return LearnedLayout(
        block_shape=tuple(block_shape),
        key_index_BHD=_learn_part(write, scratch, shape, "key"),
        value_index_BHD=_learn_part(write, scratch, shape, "value"),
    )
