"""The vLLM plugin's GPU check, as one short script for a CUDA machine without vLLM.

    PYTHONPATH=. python -m evalkit.vllm_plugin.gpu_check [--seq 32768] [--check-seq 8192] [--out F.md] [--results F]

The plugin's CUDA path is vLLM's FlashAttention backend plus evalkit's kernels for the document
queries of packed requests; the kernels need no vLLM, so this checks them where vLLM is absent:

1. Correctness over a paged KV cache (shuffled blocks of 16, grouped-query heads) against the
   dense reference (evalkit.attention.document_mask + SDPA in FP32): a whole packed prefill,
   the last chunk of a chunked one, and a single query; FlexAttention (compiled) in BF16 and
   FP32, and the blocked implementation.
2. The cache-layout learner (cache_layout.py) on a cache laid out as vLLM's FlashAttention
   backend lays it out ([NB, Hkv, BS, 2D], keys and values read through a transposed split),
   read back through the learned strided views into the prefix workspace (workspace.py), as the
   backend serves: equal to the written keys and values, and no memory allocated by the gather.
3. A long run of the serving path (`--steps` packed prefills of 8K-32K tokens, each with its
   own document layout, length and chunk, as a vLLM engine sees them): the graphs the serving
   FlexAttention function holds, all of them, against Dynamo's per-function recompile limit
   (past the limit FlexAttention would fall back to eager, which materialises the scores), and the peak memory of a step
   beyond its inputs against what the step must hold (the gathered K/V and the output).
4. Timing of a `--seq` packed prefill (BF16, Hq=32, Hkv=8, D=128, documents of exponential
   length, mean 2K) in anchor mode vs plain causal: the same gather + FlexAttention path with a
   single document (causal), and SDPA's causal flash kernel on contiguous K/V (what a stock
   backend does); with the ideal work ratio sum(d_i^2)/S^2.

Each result is appended to a JSONL file (--results, default OUT.jsonl) the moment it exists, so
a kill or an out-of-memory keeps what came before; the markdown report (--out) comes at the end.
Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from evalkit.attention import document_mask
from evalkit.attention.kernels import flex_compile_counts, recompile_limit
from evalkit.markdown import markdown_table
from evalkit.store.result_log import ResultLog
from evalkit.vllm_plugin.cache_layout import learn_layout
from evalkit.vllm_plugin.kernels import (
    anchor_attention,
    anchor_block_mask,
    anchor_document_ids,
    anchor_prefill_paged,
    gather_paged,
)
from evalkit.vllm_plugin.workspace import PrefixWorkspace, workspace_capacity

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


def check_correctness(
    length: int, device: str = "cuda", log: ResultLog | None = None, dtypes=(torch.bfloat16, torch.float32)
) -> list[tuple[str, float, bool]]:
    doc_ids = anchor_document_ids(1, document_lengths(length, 1024, seed=0)).to(device)
    rows = []
    for dtype in dtypes:
        key, value, key_cache, value_cache, block_table = paged_request(length, dtype, seed=1, device=device)
        for num_queries in (length, length // 3 + 5, 1):
            query = torch.randn(num_queries, HEADS, DIM, device=device).to(dtype)
            expected = reference(query, key, value, doc_ids)
            for impl in ("flex", "blocked"):
                out = anchor_prefill_paged(
                    query, key_cache, value_cache, block_table, doc_ids, scale=DIM**-0.5, impl=impl
                )
                error = float((out.float() - expected).abs().max())
                name = f"{impl} {str(dtype).removeprefix('torch.')} L={length} Q={num_queries}"
                rows.append((name, error, error <= TOLERANCE[dtype]))
                if log is not None:
                    log.write("vllm_kernel_correctness", check=name, max_error=error, passed=rows[-1][2])
    return rows


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
        anchor_prefill_paged(
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
        return anchor_prefill_paged(
            query, key_cache, value_cache, block_table, doc_ids, scale=scale, impl="flex", block_mask=anchor_mask
        )

    def causal():
        return anchor_prefill_paged(
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


def run_checks(
    log: ResultLog,
    check_seq: int,
    steps: int,
    lengths: tuple[int, int],
    device: str,
    dtypes=(torch.bfloat16, torch.float32),
) -> tuple:
    """The warmed-up serving check, the correctness checks, the layout check and the long run,
    each result logged as it exists. All under inference mode, as vLLM serves (Dynamo keeps
    separate graphs for inference and autograd tensors: the checks share the serving graphs)."""
    with torch.inference_mode():
        return _run_checks(log, check_seq, steps, lengths, device, dtypes)


# (queries, keys) of prefills served after the warm-up: whole, chunked, single-query, tiny, long.
# 128 queries: the CUDA lowering's flex-decoding boundary (kernels.FLEX_DECODING_QUERIES).
SERVED_AFTER_WARM_UP = (
    (700, 700), (1, 257), (37, 900), (128, 129), (128, 128), (127, 900), (60, 60), (1, 20), (300, 1000), (4096, 4096),
)  # fmt: skip


def check_warm_serving(device: str, log: ResultLog | None = None) -> tuple[str, float, bool]:
    """The backend's warm-up (kernels.warm_up_anchor_flex, what the impl runs when vLLM builds it),
    then prefills of other lengths and layouts under vLLM's fail-on-recompile stance: none may
    compile. Graphs held afterwards are reported beside the limit."""
    from evalkit.attention.kernels import flex_compile_counts
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
    graphs = max((n for key, n in flex_compile_counts().items() if "anchor" in key), default=0)
    name = f"served prefills of {len(shapes)} shapes after the warm-up, {graphs} graphs (limit {recompile_limit()})"
    shown = name if error is None else f"{name}: {error.splitlines()[0][:300]}"
    row = (shown, float(graphs), error is None and graphs < recompile_limit())
    if log is not None:
        log.write("vllm_warm_serving", check=row[0], graphs=graphs, limit=recompile_limit(), error=error, passed=row[2])
    return row


def _run_checks(log, check_seq, steps, lengths, device, dtypes) -> tuple:
    warm_row = check_warm_serving(device, log)
    correct = [warm_row, *check_correctness(check_seq, device, log=log, dtypes=dtypes)]
    layout_row = check_flash_layout(device=device) if device == "cuda" else check_flash_layout(200, device=device)
    log.write("vllm_cache_layout", check=layout_row[0], max_error=layout_row[1], passed=layout_row[2])
    result = long_run(steps, lengths, device)
    long_row = long_run_row(result, device)
    log.write("vllm_long_run", **result, passed=long_row[2])
    return correct, layout_row, long_row


def report(correct, layout_row, timings, ideal, num_docs, args, device_name: str, long_row=None) -> str:
    lines = [
        "# evalkit vLLM plugin: GPU check of the anchor-mode prefill kernels",
        "",
        f"{device_name}, torch {torch.__version__}; paged cache in blocks of {BLOCK}, "
        f"Hq={HEADS}, Hkv={KV_HEADS}, D={DIM}.",
        "",
        markdown_table(
            ["check", "max abs error", "pass"],
            [(name, f"{error:.2e}", "yes" if ok else "NO") for name, error, ok in [*correct, layout_row]],
        ),
        *(
            ["", markdown_table(["long run", "pass"], [(long_row[0], "yes" if long_row[2] else "NO")])]
            if long_row
            else []
        ),
        "",
        f"Prefill of {args.seq} tokens, BF16, {num_docs} documents (exponential, mean 2048), median of {args.repeats}:",
        "",
        markdown_table(["step", "ms"], [(name, f"{ms:.2f}") for name, ms in timings]),
        "",
        (
            f"anchor / causal (same FlexAttention path): {timings[2][1] / timings[3][1]:.3f}; "
            f"ideal sum(d_i^2)/S^2: {ideal:.3f}."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=32768, help="tokens of the timed packed prefill")
    parser.add_argument("--check-seq", type=int, default=8192, help="tokens of the correctness checks")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="packed prefills of the long run (recompiles, memory)")
    parser.add_argument("--out", default=None, help="also write the report to this file")
    parser.add_argument(
        "--results", default=None, help="JSONL file: each result appended the moment it exists (default: OUT.jsonl)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs one", file=sys.stderr)
        return 2
    from pathlib import Path

    log = ResultLog(args.results or (str(Path(args.out).with_suffix(".jsonl")) if args.out else None))
    log.write("machine", device=torch.cuda.get_device_name(), torch=torch.__version__)
    correct, layout_row, long_row = run_checks(log, args.check_seq, args.steps, (8192, 32768), "cuda")
    timings, ideal, num_docs = time_prefill(args.seq, args.repeats)
    log.write("vllm_prefill_timing", seq=args.seq, timings_ms=dict(timings), ideal=ideal, documents=num_docs)
    text = report(correct, layout_row, timings, ideal, num_docs, args, torch.cuda.get_device_name(), long_row)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0 if all(ok for *_, ok in [*correct, layout_row, long_row]) else 1


if __name__ == "__main__":
    sys.exit(main())
