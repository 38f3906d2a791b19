"""The prefix K/V workspace (evalkit/vllm_plugin/workspace.py): made once, reused, never outgrown.

The reference for every gather is kernels.gather_paged, which reads position by position into a
fresh tensor. Allocations are counted with torch's profiler (profile_memory): it sees the fresh
tensor of gather_paged, so a zero for the workspace is a measurement, not an absence of one.
No vLLM needed but for the last test (the backend's check of the cache dtypes it has a workspace for).
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from evalkit.vllm_plugin import workspace as ws
from evalkit.vllm_plugin.kernels import gather_paged
from tests.vllm.conftest import requires_vllm

HEADS, DIM, BLOCK, NUM_BLOCKS = 2, 32, 16, 40
MAX_TOKENS = 300


def paged_caches(dtype=torch.float32):
    """Key and value caches [NB, BS, H, D] as strided views of one [NB, 2, BS, H, D] tensor (as vLLM's
    FlashAttention cache is laid out), and a shuffled block table (int32, as vLLM's)."""
    generator = torch.Generator().manual_seed(0)
    cache = torch.randn(NUM_BLOCKS, 2, BLOCK, HEADS, DIM, generator=generator).to(dtype)
    return cache[:, 0], cache[:, 1], torch.randperm(NUM_BLOCKS, generator=generator).to(torch.int32)


def bytes_allocated(function) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    return sum(event.cpu_memory_usage for event in profiler.events() if event.cpu_memory_usage > 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gather_equals_a_fresh_gather_of_the_same_positions(dtype):
    key_cache, value_cache, block_table = paged_caches(dtype)
    workspace = ws.PrefixWorkspace(ws.workspace_capacity(MAX_TOKENS, BLOCK), HEADS, DIM, dtype, "cpu")
    for length in (1, BLOCK - 1, BLOCK, BLOCK + 1, 100, MAX_TOKENS, 7):  # shorter after longer: no stale rows
        key, value = workspace.gather(key_cache, value_cache, block_table, length)
        assert key.shape == (length, HEADS, DIM)
        assert torch.equal(key, gather_paged(key_cache, block_table, length))
        assert torch.equal(value, gather_paged(value_cache, block_table, length))


def test_after_the_first_gather_nothing_is_allocated_and_the_buffers_stay():
    key_cache, value_cache, block_table = paged_caches()
    workspace = ws.PrefixWorkspace(ws.workspace_capacity(MAX_TOKENS, BLOCK), HEADS, DIM, torch.float32, "cpu")
    pointers = (workspace.key.data_ptr(), workspace.value.data_ptr())
    workspace.gather(key_cache, value_cache, block_table, MAX_TOKENS)  # warm-up
    for length in (MAX_TOKENS, 123, 1):
        allocated = bytes_allocated(lambda n=length: workspace.gather(key_cache, value_cache, block_table, n))
        assert allocated == 0
        key, value = workspace.gather(key_cache, value_cache, block_table, length)
        assert (key.data_ptr(), value.data_ptr()) == pointers  # views of the buffers, from their start
    assert (workspace.key.data_ptr(), workspace.value.data_ptr()) == pointers
    # The measurement sees a fresh gather's copy (the path the workspace replaces).
    assert bytes_allocated(lambda: gather_paged(key_cache, block_table, MAX_TOKENS)) >= MAX_TOKENS * HEADS * DIM * 4


def test_the_bound_is_max_tokens_plus_a_block_less_one_for_keys_and_values():
    capacity = ws.workspace_capacity(MAX_TOKENS, BLOCK)
    assert capacity == MAX_TOKENS + BLOCK - 1
    workspace = ws.PrefixWorkspace(capacity, HEADS, DIM, torch.bfloat16, "cpu")
    assert workspace.key.nbytes + workspace.value.nbytes == 2 * (MAX_TOKENS + BLOCK - 1) * HEADS * DIM * 2
    # Every request of up to MAX_TOKENS fits, whatever the cache's block size up to BLOCK.
    for block_size in (1, 5, 7, BLOCK):
        num_blocks = -(-MAX_TOKENS // block_size)
        cache = torch.randn(num_blocks, block_size, HEADS, DIM).to(torch.bfloat16)
        table = torch.arange(num_blocks, dtype=torch.int32).flip(0)
        key, _ = workspace.gather(cache, cache, table, MAX_TOKENS)
        assert torch.equal(key, gather_paged(cache, table, MAX_TOKENS))
    # Past the bound it says so instead of allocating: blocks of 32 round 300 tokens up to 320 > 315.
    cache = torch.zeros(16, 32, HEADS, DIM, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="needs 320 tokens of prefix workspace, built for 315"):
        workspace.gather(cache, cache, torch.arange(16, dtype=torch.int32), MAX_TOKENS)


def test_layers_share_one_workspace_per_device_dtype_and_shape(monkeypatch):
    monkeypatch.setattr(ws, "_shared", {})
    first = ws.shared_prefix_workspace(MAX_TOKENS, BLOCK, HEADS, DIM, torch.float32, "cpu")
    assert ws.shared_prefix_workspace(MAX_TOKENS, BLOCK, HEADS, DIM, torch.float32, "cpu") is first
    assert ws.shared_prefix_workspace(100, BLOCK, HEADS, DIM, torch.float32, "cpu") is first  # smaller: fits
    other = ws.shared_prefix_workspace(MAX_TOKENS, BLOCK, HEADS, DIM, torch.bfloat16, "cpu")
    assert other is not first and other.key.dtype == torch.bfloat16
    larger = ws.shared_prefix_workspace(2 * MAX_TOKENS, BLOCK, HEADS, DIM, torch.float32, "cpu")
    assert larger.capacity_tokens == 2 * MAX_TOKENS + BLOCK - 1
    assert ws.shared_prefix_workspace(MAX_TOKENS, BLOCK, HEADS, DIM, torch.float32, "cpu") is larger


@requires_vllm  # the backend module imports vLLM's request types
def test_packed_requests_refuse_exactly_the_cache_dtypes_the_workspace_has_no_dtype_for():
    """The cache dtypes the workspace is built in ("auto" and _CACHE_DTYPES, "half" among them) are
    served; any other is refused as a quantized cache."""
    from evalkit.vllm_plugin.anchor_backend import _CACHE_DTYPES, AnchorAttentionImplMixin

    class Impl(AnchorAttentionImplMixin):
        def __init__(self, kv_cache_dtype):  # what the stock impl sets, as far as the check reads it
            self.kv_cache_dtype = kv_cache_dtype

    for name in ("auto", "half", *_CACHE_DTYPES):
        Impl(name)._check_packed_supported(num_keys=16)
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        with pytest.raises(NotImplementedError, match="a quantized KV cache"):
            Impl(name)._check_packed_supported(num_keys=16)
