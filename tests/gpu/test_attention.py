"""The attention specification on a GPU: every paradigm against float64 attention, and timings.

1. Correctness: for every paradigm, FlexAttention (compiled on CUDA) forward and backward, and the
   blocked implementation, against textbook float64 attention with the reference mask
   (grouped-query heads, two random packs, decoding with fewer queries than keys). On a CPU
   FlexAttention has no backward: its rows there are forward only.
2. Timings: forward+backward of full causal SDPA (flash backend) vs each document-masked paradigm
   under FlexAttention at 16K, 32K and 64K tokens (bf16, B=1, H=32, Hkv=8, D=128, documents with
   exponential lengths of mean 1K), with the ideal ratio sum(d_i^2)/S^2.
"""

from __future__ import annotations

import time

import pytest
import torch

from evalkit.attention import Paradigm, document_attention, document_mask, pack
from tests.gpu.conftest import sync

pytestmark = pytest.mark.gpu


def _naive(q, k, v, mask):
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


def _docs(seq_len: int, mean: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    docs, total = [], 0
    while total <= seq_len:
        n = max(1, int(torch.empty(1).exponential_(1 / mean, generator=g)))
        docs.append([5] * n)
        total += n
    return docs


@pytest.mark.parametrize("paradigm", list(Paradigm), ids=str)
def test_paradigm_against_float64(paradigm, device, sizes, record):
    length = sizes.spec_length
    failed = []
    for seed in range(2):
        tags = [7] * 64 if paradigm.uses_tags else None
        docs = _docs(length, 96 * length // 1024, seed)
        packed = pack(
            docs, length, paradigm, bos_id=1, eos_id=2, domain_tags=tags[: len(docs)] if tags else None, seed=seed
        )
        doc_ids = packed.attention_doc_ids()
        doc_ids = None if doc_ids is None else doc_ids[None].to(device)
        for impl in ("flex", "blocked"):
            backward = impl != "flex" or device != "cpu"
            for sq in (length, 17):
                g = torch.Generator(device="cpu").manual_seed(seed)
                q = torch.randn(1, 8, sq, 64, generator=g).to(device).requires_grad_(backward)
                k = torch.randn(1, 2, length, 64, generator=g).to(device).requires_grad_(backward)
                v = torch.randn(1, 2, length, 64, generator=g).to(device).requires_grad_(backward)
                with torch.set_grad_enabled(backward):
                    out = document_attention(q, k, v, doc_ids, impl=impl)
                mask = document_mask(doc_ids, length, sq).to(device)
                mask = mask if mask.dim() == 3 else mask[None]
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                ref = _naive(*leaves, mask)  # type: ignore[call-arg]  # mypy cannot count leaves: q, k, v
                err = (out.double() - ref).abs().max().item()
                gerr = None
                if backward:
                    gout = torch.randn_like(out)
                    grads = torch.autograd.grad(out, (q, k, v), gout)
                    refs = torch.autograd.grad(ref, leaves, gout.double())
                    gerr = max((a.double() - b).abs().max().item() for a, b in zip(grads, refs))
                passed = err < 1e-4 and (gerr is None or gerr < 1e-4)
                failed += [] if passed else [(seed, impl, sq, err, gerr)]
                record(
                    "attention_correctness",
                    paradigm=str(paradigm),
                    seed=seed,
                    impl=impl,
                    queries=sq,
                    keys=length,
                    max_out_error=err,
                    max_grad_error=gerr,
                    passed=passed,
                )
    assert not failed, failed


def _time(fn, q, k, v, repeats: int = 5, device: str = "cuda") -> float:
    for _ in range(2):
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["16K", "32K", "64K"])
def test_timings_against_full_causal(which, device, sizes, record):
    """Forward+backward of full causal SDPA and each document-masked paradigm (flex on CUDA,
    blocked on a CPU): a measurement, each row written as it is measured."""
    import torch.nn.functional as F

    if which >= len(sizes.timed_lengths):
        pytest.skip("the dry run times one length")
    seq_len = sizes.timed_lengths[which]
    impl = "flex" if device == "cuda" else "blocked"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    make = lambda h: torch.randn(1, h, seq_len, 128, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    q, k, v = make(32), make(8), make(8)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    full = _time(sdpa, q, k, v, sizes.repeats, device)
    record("attention_timing", seq_len=seq_len, paradigm="full (SDPA causal)", ms=full * 1e3)
    docs = _docs(seq_len, 1024, 0)
    for paradigm in (Paradigm.INTRA_DOC, Paradigm.ANCHOR, Paradigm.ANCHOR_INTERLEAVED):
        packed = pack(docs, seq_len, paradigm, bos_id=1, eos_id=2, seed=0)
        doc_ids = packed.doc_ids[None].to(device)
        t = _time(lambda q, k, v: document_attention(q, k, v, doc_ids, impl=impl), q, k, v, sizes.repeats, device)
        ideal = sum(n * n for n in packed.doc_lengths) / seq_len**2
        record(
            "attention_timing",
            seq_len=seq_len,
            paradigm=f"{paradigm} ({impl})",
            ms=t * 1e3,
            per_full=t / full,
            ideal=ideal,
        )
        assert t > 0 and 0 < ideal <= 1
