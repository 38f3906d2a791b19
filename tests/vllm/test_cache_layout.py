"""Learning a backend's KV-cache layout through its own writer, then reading requests back exactly.

Fake writers stand for layouts vLLM uses or might use (plain, per-block transposed keys as the
CPU 'vec' kernels store them, a scrambled one that no strided view can express); the last test
uses vLLM's real CPU writer when vLLM is installed.
"""

import pytest
import torch

from evalkit.vllm_plugin.cache_layout import learn_layout

from .conftest import requires_vllm

BLOCK, HEADS, DIM = 16, 2, 8


def plain_writer(key, value, cache, slots):
    """Cache [NB, BS, 2, H, D]: keys then values, as written."""
    cache[slots // BLOCK, slots % BLOCK, 0] = key
    cache[slots // BLOCK, slots % BLOCK, 1] = value


def transposed_writer(key, value, cache, slots):
    """Cache [NB, H, BS, 2D] seen as [NB, H, 2 BS, D]: per block and head, keys stored [D, BS], values [BS, D]."""
    keys, values = cache.view(cache.shape[0], HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)
    for i, slot in enumerate(slots.tolist()):
        for head in range(HEADS):
            keys[slot // BLOCK, head].view(DIM, BLOCK)[:, slot % BLOCK] = key[i, head]
            values[slot // BLOCK, head, slot % BLOCK] = value[i, head]


SCRAMBLE = torch.randperm(BLOCK * HEADS * DIM, generator=torch.Generator().manual_seed(0))


def scrambled_writer(key, value, cache, slots):
    """Cache [NB, 2, BS*H*D]: each block's elements in a fixed random order (no strides express it)."""
    for i, slot in enumerate(slots.tolist()):
        for part, tokens in ((0, key), (1, value)):
            flat = torch.zeros(BLOCK, HEADS, DIM, dtype=cache.dtype)
            flat[slot % BLOCK] = tokens[i]
            mine = torch.zeros(BLOCK, HEADS, DIM, dtype=torch.bool)
            mine[slot % BLOCK] = True
            block = cache[slot // BLOCK, part]
            block[SCRAMBLE[mine.flatten()]] = flat.flatten()[mine.flatten()]


WRITERS = {
    "plain": (plain_writer, (BLOCK, 2, HEADS, DIM)),
    "transposed": (transposed_writer, (HEADS, BLOCK, 2 * DIM)),
    "scrambled": (scrambled_writer, (2, BLOCK * HEADS * DIM)),
}


def filled_cache(writer, block_shape, dtype, length=50):
    """A 6-block cache holding one request of `length` tokens in blocks 4, 1, 5, 2; its K/V."""
    generator = torch.Generator().manual_seed(1)
    key, value = (torch.randn(length, HEADS, DIM, generator=generator).to(dtype) for _ in range(2))
    block_table = torch.tensor([4, 1, 5, 2])
    positions = torch.arange(length)
    cache = torch.zeros(6, *block_shape, dtype=dtype)
    writer(key, value, cache, block_table[positions // BLOCK] * BLOCK + positions % BLOCK)
    return cache, block_table, key, value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(WRITERS))
def test_learned_layout_reads_every_token_back(name, dtype):
    writer, block_shape = WRITERS[name]
    layout = learn_layout(writer, block_shape, dtype, "cpu", BLOCK, HEADS, DIM)
    cache, block_table, key, value = filled_cache(writer, block_shape, dtype)
    read_key, read_value = layout.gather(cache, block_table, key.shape[0])
    assert torch.equal(read_key, key) and torch.equal(read_value, value)
    views = layout.views(cache)
    if name == "scrambled":
        assert views is None  # no strided view: the gather path serves it
    else:
        positions = torch.arange(key.shape[0])
        blocks, offsets = block_table[positions // BLOCK], positions % BLOCK
        assert torch.equal(views[0][blocks, offsets], key) and torch.equal(views[1][blocks, offsets], value)


def test_views_follow_a_cache_that_is_itself_a_strided_view():
    """vLLM may hand a layer a permuted view of a larger allocation (HND layouts): strides are honoured."""
    writer, block_shape = WRITERS["plain"]
    layout = learn_layout(writer, block_shape, torch.float32, "cpu", BLOCK, HEADS, DIM)
    storage = torch.zeros(3, 6, *block_shape)  # the layer's cache is storage[1]: a non-zero offset
    cache = storage[1]
    _, block_table, key, value = filled_cache(writer, block_shape, torch.float32)
    positions = torch.arange(key.shape[0])
    writer(key, value, cache, block_table[positions // BLOCK] * BLOCK + positions % BLOCK)
    read_key, _ = layout.gather(cache, block_table, key.shape[0])
    assert torch.equal(read_key, key)
    assert torch.equal(layout.views(cache)[1][block_table[positions // BLOCK], positions % BLOCK], value)


def test_a_writer_that_loses_elements_is_refused():
    def lossy_writer(key, value, cache, slots):
        plain_writer(key, value, cache, slots)
        cache[:, 0] = 0  # the first token of every block is lost

    with pytest.raises(RuntimeError, match="exactly once"):
        learn_layout(lossy_writer, (BLOCK, 2, HEADS, DIM), torch.float32, "cpu", BLOCK, HEADS, DIM)


@requires_vllm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_cpu_writer_layout_is_learned(dtype):
    """vLLM's own CPU cache writer, whatever its ISA tiling: every key and value is read back exactly.

    The vec ISAs (AVX2/AVX-512, and fp32 everywhere) store each block's keys transposed: an affine
    layout, read through zero-copy views. The AMX ISA (bf16 on CPUs with AMX tiles) packs keys in
    tiles that no strides describe: `views` is None there and `gather` reads them instead, as the
    anchor backend does."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    heads, block, dim = 2, 32, 32
    isa = _get_attn_isa(dtype, block, dim)

    def write(key, value, cache, slots):
        key_cache, value_cache = cache.view(cache.shape[0], heads, block * 2, dim).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)

    layout = learn_layout(write, (heads, block, 2 * dim), dtype, "cpu", block, heads, dim)
    cache = torch.zeros(6, heads, block, 2 * dim, dtype=dtype)
    key, value = (torch.randn(100, heads, dim).to(dtype) for _ in range(2))
    block_table = torch.tensor([4, 1, 5, 2])
    positions = torch.arange(100)
    write(key, value, cache, block_table[positions // block] * block + positions % block)
    read_key, read_value = layout.gather(cache, block_table, 100)
    assert torch.equal(read_key, key) and torch.equal(read_value, value)
    views = layout.views(cache)
    if isa == "vec":  # the transposed-key layout: affine, so the zero-copy views serve it
        assert views is not None
    if views is not None:
        assert torch.equal(views[0][block_table[positions // block], positions % block], key)
        assert torch.equal(views[1][block_table[positions // block], positions % block], value)
