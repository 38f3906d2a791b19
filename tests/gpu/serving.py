"""The vLLM plugin's kernels at a GPU check's sizes, without vLLM: paged requests, the dense
reference, the warmed-up serving check and the long run (tests/gpu/test_vllm_kernels.py; the
CPU-only compile tests of tests/vllm/test_warm_up.py use them too).

The plugin's CUDA path is vLLM's FlashAttention backend plus evalkit's kernels for the document
queries of packed requests; the kernels need no vLLM, so they are checked where vLLM is absent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from evalkit.attention import document_mask
from evalkit.attention.kernels import flex_compile_counts, recompile_limit
from evalkit.vllm_plugin.cache_layout import learn_layout
from evalkit.vllm_plugin.kernels import (
    anchor_attention,
    anchor_block_mask,
    anchor_document_ids,
    gather_paged,
)
from evalkit.vllm_plugin.workspace import PrefixWorkspace, workspace_capacity


def prefill_paged(query_QHD, key_cache, value_cache, block_table_row, doc_ids_L, **options) -> torch.Tensor:
    """Anchor attention of one request's document queries, its keys and values gathered from a paged
    cache [NB, BS, Hkv, D] (the backend's path: positions 0..L-1 through the block-table row)."""
    length = doc_ids_L.numel()
    key, value = gather_paged(key_cache, block_table_row, length), gather_paged(value_cache, block_table_row, length)
    return anchor_attention(query_QHD, key, value, doc_ids_L, **options)


BLOCK = 16  # vLLM's default block size on CUDA
HEADS, KV_HEADS, DIM = 32, 8, 128
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 2e-3}  # max abs error vs the FP32 reference


def document_lengths(total: int, mean: int, seed: int) -> list[int]:
    """Exponential lengths (at least 16) filling `total` tokens after the anchor."""
    generator = torch.Generator().manual_seed(seed)
    lengths, room = [], total - 1
    while room > 0:
        n = max(16, int(torch.empty(1).exponential_(1 / mean, generator=generator)))
        lengths.append(min(n, room))
        room -= lengths[-1]
    return lengths


def paged_request(length: int, dtype, seed: int, device: str):
    """Contiguous K/V [L, Hkv, D] and the same tokens in a [NB, BS, Hkv, D] cache of shuffled blocks."""
    generator = torch.Generator(device=device).manual_seed(seed)
    key, value = (torch.randn(length, KV_HEADS, DIM, device=device, generator=generator).to(dtype) for _ in range(2))
    num_blocks = -(-length // BLOCK)
    block_table = torch.randperm(num_blocks + 7, device=device, generator=generator)[:num_blocks].int()
    caches = []
    for tokens in (key, value):
        cache = torch.zeros(num_blocks + 7, BLOCK, KV_HEADS, DIM, device=device, dtype=dtype)
        padded = torch.zeros(num_blocks * BLOCK, KV_HEADS, DIM, device=device, dtype=dtype)
        padded[:length] = tokens
        cache[block_table.long()] = padded.view(num_blocks, BLOCK, KV_HEADS, DIM)
        caches.append(cache)
    return key, value, caches[0], caches[1], block_table


def reference(query, key, value, doc_ids) -> torch.Tensor:
    """FP32 SDPA with the dense reference mask, queries being the last Q positions: [Q, Hq, D]."""
    mask = document_mask(doc_ids, key.shape[0], query.shape[0])
    q, k, v = (t.float().transpose(0, 1)[None] for t in (query, key, value))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)


def check_correctness(length: int, device: str, dtype: torch.dtype) -> Iterator[tuple[str, float, bool]]:
    """A whole packed prefill, the last chunk of a chunked one and a single query over a paged
    cache, flex and blocked, against the FP32 reference: (name, max error, within tolerance),
    each yielded as it is measured."""
    doc_ids = anchor_document_ids(1, document_lengths(length, 1024, seed=0)).to(device)
    key, value, key_cache, value_cache, block_table = paged_request(length, dtype, seed=1, device=device)
    for num_queries in (length, length // 3 + 5, 1):
        query = torch.randn(num_queries, HEADS, DIM, device=device).to(dtype)
        expected = reference(query, key, value, doc_ids)
        for impl in ("flex", "blocked"):
            out = prefill_paged(query, key_cache, value_cache, block_table, doc_ids, scale=DIM**-0.5, impl=impl)
            error = float((out.float() - expected).abs().max())
            name = f"{impl} {str(dtype).removeprefix('torch.')} L={length} Q={num_queries}"
            yield (name, error, error <= TOLERANCE[dtype])


def check_flash_layout(length: int = 1000, device: str = "cuda") -> tuple[str, float, bool]:
    """The learner on vLLM's FlashAttention cache layout, through the kernels' paged entry point."""
    num_blocks = -(-length // BLOCK) + 3

    def write(key, value, cache, slots):  # vLLM's FA writer addresses kv_cache.transpose(1, 2).split(D, -1)
        key_cache, value_cache = cache.transpose(1, 2).split(DIM, dim=-1)
        key_cache[slots // BLOCK, slots % BLOCK] = key
        value_cache[slots // BLOCK, slots % BLOCK] = value

    layout = learn_layout(write, (KV_HEADS, BLOCK, 2 * DIM), torch.bfloat16, device, BLOCK, KV_HEADS, DIM)
    kv_cache = torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * DIM, device=device, dtype=torch.bfloat16)
    key, value = (torch.randn(length, KV_HEADS, DIM, device=device).bfloat16() for _ in range(2))
    block_table = torch.randperm(num_blocks, device=device)[: -(-length // BLOCK)].int()
    positions = torch.arange(length, device=device)
    write(key, value, kv_cache, block_table[positions // BLOCK].long() * BLOCK + positions % BLOCK)
    views = layout.views(kv_cache)
    if views is None:
        return ("FA cache layout: no strided view", float("inf"), False)
    workspace = PrefixWorkspace(workspace_capacity(length, BLOCK), KV_HEADS, DIM, torch.bfloat16, device)
    workspace.gather(views[0], views[1], block_table, length)  # warm-up
    grown = _bytes_allocated_by(lambda: workspace.gather(views[0], views[1], block_table, length), device)
    read_key, read_value = workspace.gather(views[0], views[1], block_table, length)
    read_back = torch.equal(read_key, key) and torch.equal(read_value, value)
    doc_ids = anchor_document_ids(1, document_lengths(length, 200, seed=2)).to(device)
    query = torch.randn(length, HEADS, DIM, device=device).bfloat16()
    out = anchor_attention(query, read_key, read_value, doc_ids, scale=DIM**-0.5, impl="flex")
    error = float((out.float() - reference(query, key, value, doc_ids)).abs().max())
    name = f"flex over learned FA-layout views via the prefix workspace, L={length}"
    if not read_back or grown:
        name += f" (workspace: {'read back' if read_back else 'NOT read back'}, {grown} B allocated by a gather)"
    return (name, error, error <= TOLERANCE[torch.bfloat16] and read_back and not grown)


def _bytes_allocated_by(function: Callable[[], object], device: str) -> int:
    """Peak CUDA memory a call adds (0 on a CPU: tests/vllm/test_workspace.py counts it there)."""
    if device != "cuda":
        function()
        return 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    function()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def serving_compile_count() -> int:
    """Graphs held by the most-compiled of the serving path's FlexAttention functions (one per
    dtype and head dim, dynamic shapes): the per-function count Dynamo's limit applies to. 0 where
    FlexAttention runs eager (a CPU without evalkit.attention.kernels.COMPILE_DEVICES naming it)."""
    counts = [n for key, n in flex_compile_counts().items() if "anchor" in key]
    return max(counts, default=0)


def long_run(steps: int, lengths: tuple[int, int], device: str = "cuda", seed: int = 5) -> dict[str, float]:
    """`steps` packed prefills through the serving path's kernels (a fresh BlockMask each step, as
    anchor_backend plans them): the graphs the serving FlexAttention function holds at the end
    (earlier calls in this process included: the limit counts them all), the limit, and the worst
    extra memory per step."""
    generator = torch.Generator().manual_seed(seed)
    peak_extra, peak_needed = 0, 0
    for step in range(steps):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=generator))
        num_queries = length if step % 3 else length // 2 + step  # whole prefills and chunked ones
        doc_ids = anchor_document_ids(1, document_lengths(length, 1024, seed=seed + step)).to(device)
        _key, _value, key_cache, value_cache, block_table = paged_request(length, torch.bfloat16, step, device)
        query = torch.randn(num_queries, HEADS, DIM, device=device).bfloat16()
        block_mask = anchor_block_mask(doc_ids, num_queries, check_order=False)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
        prefill_paged(
            query, key_cache, value_cache, block_table, doc_ids, scale=DIM**-0.5, impl="flex", block_mask=block_mask
        )
        if device == "cuda":
            torch.cuda.synchronize()
            peak_extra = max(peak_extra, torch.cuda.max_memory_allocated() - start)
        # What a step must hold beyond its inputs: K and V gathered contiguous, and the output.
        peak_needed = max(peak_needed, 2 * (2 * length * KV_HEADS * DIM + num_queries * HEADS * DIM))
    return {
        "steps": steps,
        "graphs": serving_compile_count(),  # per function, all its graphs: what the limit counts
        "limit": recompile_limit(),
        "peak_extra_mib": peak_extra / 2**20,
        "needed_mib": peak_needed / 2**20,
    }


def long_run_row(result: dict[str, float], device: str) -> tuple[str, float, bool]:
    """The long run as a check: compiled graphs under the limit; on CUDA, extra memory within
    four times what a step must hold (scores materialised would be Q x L x Hq, far beyond)."""
    memory_ok = device != "cuda" or result["peak_extra_mib"] <= 4 * result["needed_mib"]
    name = (
        f"long run: {result['steps']} packed prefills, {result['graphs']} graphs compiled (limit {result['limit']}), "
        f"peak extra {result['peak_extra_mib']:.0f} MiB vs {result['needed_mib']:.0f} MiB needed"
    )
    return (name, float(result["graphs"]), result["graphs"] < result["limit"] and memory_ok)


def median_ms(function: Callable[[], object], repeats: int, device: str) -> float:
    """Median milliseconds of `function` over `repeats` runs after two warm-ups (compilation)."""
    for _ in range(2):
        function()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            function()
            times.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(times)


def time_prefill(length: int, repeats: int, device: str = "cuda") -> tuple[list[tuple[str, float]], float, int]:
    lengths = document_lengths(length, 2048, seed=3)
    doc_ids = anchor_document_ids(1, lengths).to(device)
    causal_ids = anchor_document_ids(1, [length - 1]).to(device)  # one document: the rule is plain causal
    key, value, key_cache, value_cache, block_table = paged_request(length, torch.bfloat16, seed=4, device=device)
    query = torch.randn(length, HEADS, DIM, device=device).bfloat16()
    anchor_mask, causal_mask = anchor_block_mask(doc_ids, length), anchor_block_mask(causal_ids, length)
    scale = DIM**-0.5

    def anchor():
        return prefill_paged(
            query, key_cache, value_cache, block_table, doc_ids, scale=scale, impl="flex", block_mask=anchor_mask
        )

    def causal():
        return prefill_paged(
            query, key_cache, value_cache, block_table, causal_ids, scale=scale, impl="flex", block_mask=causal_mask
        )

    def sdpa_causal():
        q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def gather():
        return gather_paged(key_cache, block_table, length), gather_paged(value_cache, block_table, length)

    timings = [
        ("BlockMask build (anchor, per step)", median_ms(lambda: anchor_block_mask(doc_ids, length), repeats, device)),
        ("gather K and V from the paged cache", median_ms(gather, repeats, device)),
        ("anchor mode: gather + FlexAttention", median_ms(anchor, repeats, device)),
        ("plain causal: gather + FlexAttention", median_ms(causal, repeats, device)),
        ("plain causal: SDPA (flash on CUDA), contiguous K/V", median_ms(sdpa_causal, repeats, device)),
    ]
    ideal = (sum(n * n for n in lengths) + length) / length**2  # documents' squares plus the anchor column
    return timings, ideal, len(lengths)


# (queries, keys) of prefills served after the warm-up: whole, chunked, single-query, tiny, long.
# 128 queries: the CUDA lowering's flex-decoding boundary (kernels.FLEX_DECODING_QUERIES).
SERVED_AFTER_WARM_UP = (
    (700, 700), (1, 257), (37, 900), (128, 129), (128, 128), (127, 900), (60, 60), (1, 20), (300, 1000), (4096, 4096),
)  # fmt: skip


def check_warm_serving(device: str) -> dict:
    """The backend's warm-up (kernels.warm_up_anchor_flex, what the impl runs when vLLM builds it),
    then prefills of other lengths and layouts under vLLM's fail-on-recompile stance: none may
    compile. Graphs held afterwards are reported beside the limit."""
    from evalkit.vllm_plugin.kernels import warm_up_anchor_flex

    warm_up_anchor_flex(HEADS, KV_HEADS, DIM, DIM**-0.5, torch.bfloat16, device)
    error = None
    # On a CPU (the dry run) FlexAttention runs eager and materialises scores: small prefills only.
    shapes = SERVED_AFTER_WARM_UP if device == "cuda" else ((70, 70), (1, 25), (37, 90), (3, 3))
    try:
        with torch.compiler.set_stance("fail_on_recompile"), torch.inference_mode():  # as vLLM's model runner
            for num_queries, length in shapes:
                doc_ids = anchor_document_ids(1, document_lengths(length, max(16, length // 4), seed=length)).to(device)
                query = torch.randn(num_queries, HEADS, DIM, device=device).bfloat16()
                key, value = (torch.randn(length, KV_HEADS, DIM, device=device).bfloat16() for _ in range(2))
                block_mask = anchor_block_mask(doc_ids, num_queries, check_order=False)
                anchor_attention(query, key, value, doc_ids, scale=DIM**-0.5, impl="flex", block_mask=block_mask)
    except RuntimeError as err:
        error = str(err)  # whole: Dynamo names the guard that failed past the first line
    graphs = serving_compile_count()
    name = f"served prefills of {len(shapes)} shapes after the warm-up, {graphs} graphs (limit {recompile_limit()})"
    passed = error is None and graphs < recompile_limit()
    return {"check": name, "graphs": graphs, "limit": recompile_limit(), "error": error, "passed": passed}
