"""`python -m perf attention`: forward+backward time of document-masked attention vs full causal.

For each sequence length: full causal SDPA (the baseline), then every document-masked paradigm
on every implementation that can run forward and backward here, on one packed window whose
document lengths are drawn from an exponential distribution (mean --mean-doc tokens). The
ideal ratio is sum(d_i^2) / S^2: the share of full causal work a kernel that skips every
cross-document block would do.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from evalkit.attention import Paradigm, available_implementations, document_attention, pack
from evalkit.markdown import markdown_table
from evalkit.models import precision


@dataclass
class BenchRow:
    seq_len: int
    paradigm: str
    impl: str
    seconds: float  # median forward+backward
    ratio_to_full: float
    ideal_ratio: float
    num_docs: int


def draw_documents(seq_len: int, mean_len: int, seed: int) -> list[list[int]]:
    """Documents with exponential lengths (at least 1 token) whose content alone overfills a window."""
    rng = random.Random(seed)
    docs, total = [], 0
    while total <= seq_len:
        n = max(1, round(rng.expovariate(1 / mean_len)))
        docs.append([3] * n)
        total += n
    return docs


def time_forward_backward(fn: Callable, shapes: tuple, dtype: torch.dtype, device: str, repeats: int) -> float:
    """Median seconds of fn(q, k, v) and its backward, after one untimed warm-up."""
    (b, hq, s, d), hkv = shapes
    gen = torch.Generator(device="cpu").manual_seed(0)
    make = lambda h: torch.randn(b, h, s, d, generator=gen).to(device, dtype).requires_grad_()  # noqa: E731
    q, k, v = make(hq), make(hkv), make(hkv)
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    times = []
    for i in range(repeats + 1):
        for t in (q, k, v):
            t.grad = None
        synchronize()
        start = time.perf_counter()
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(
    seq_lens: list[int],
    *,
    heads: int = 8,
    kv_heads: int | None = None,
    head_dim: int = 64,
    dtype: str = "fp32",
    mean_doc: int = 1024,
    repeats: int = 3,
    paradigms: list[Paradigm] | None = None,
    impls: list[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[BenchRow]:
    kv_heads = kv_heads or heads
    torch_dtype = precision.torch_dtype(dtype)
    paradigms = paradigms or [p for p in Paradigm if p.masks_documents]
    impls = impls or available_implementations(device)
    gqa = heads != kv_heads
    rows = []
    for seq_len in seq_lens:
        shapes = ((1, heads, seq_len, head_dim), kv_heads)
        docs = draw_documents(seq_len, mean_doc, seed)
        progress(f"S={seq_len}: full causal")
        full = partial(F.scaled_dot_product_attention, is_causal=True, enable_gqa=gqa)
        full_time = time_forward_backward(full, shapes, torch_dtype, device, repeats)
        rows.append(BenchRow(seq_len, "full", "sdpa-causal", full_time, 1.0, 1.0, 1))
        for paradigm in paradigms:
            tags = [7] * len(docs) if paradigm.uses_tags else None
            packed = pack(docs, seq_len, paradigm, bos_id=1, eos_id=2, domain_tags=tags, seed=seed)
            doc_ids = packed.doc_ids[None].to(device)
            ideal = sum(n * n for n in packed.doc_lengths) / seq_len**2
            num_docs = len(packed.doc_lengths)
            for impl in impls:
                progress(f"S={seq_len}: {paradigm} / {impl}")
                fn = partial(document_attention, doc_ids=doc_ids, impl=impl)
                seconds = time_forward_backward(fn, shapes, torch_dtype, device, repeats)
                rows.append(BenchRow(seq_len, paradigm.value, impl, seconds, seconds / full_time, ideal, num_docs))
    return rows


def to_markdown(rows: list[BenchRow]) -> str:
    header = ["S", "paradigm", "implementation", "docs", "fwd+bwd s", "/ full causal", "ideal Σd²/S²", "/ ideal"]
    table = [
        [r.seq_len, r.paradigm, r.impl, r.num_docs]
        + [f"{value:.3f}" for value in (r.seconds, r.ratio_to_full, r.ideal_ratio)]
        + [f"{r.ratio_to_full / r.ideal_ratio:.2f}"]
        for r in rows
    ]
    return markdown_table(header, table)
