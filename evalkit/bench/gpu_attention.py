"""The GPU check of the attention specification, as one short script for a lent CUDA machine.

    PYTHONPATH=. python -m evalkit.bench.gpu_attention [--out results/gpu-attention.md]

1. Correctness: for every paradigm, FlexAttention (compiled) forward and backward on CUDA, and
   the blocked implementation, against textbook float64 attention with the reference mask
   (grouped-query heads, several random packs, decoding with fewer queries than keys).
2. Timings: forward+backward of full causal SDPA (flash backend) vs each document-masked
   paradigm under FlexAttention at 16K, 32K and 64K tokens (bf16, B=1, H=32, Hkv=8, D=128,
   documents with exponential lengths of mean 1K), with the ideal ratio sum(d_i^2)/S^2.
Needs only torch with CUDA: no evalkit install, no transformers, no vLLM.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from evalkit.arglists import parse_list
from evalkit.attention import Paradigm, document_attention, document_mask, pack
from evalkit.markdown import markdown_table


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


def check_correctness(lines: list[str]) -> bool:
    ok = True
    device = "cuda"
    # Written by hand, not by markdown_table: the header's |out - ref| would come out escaped as \|out - ref\|.
    lines.append("| paradigm | impl | Sq | max |out - ref| | max |grad - ref| | pass |")
    lines.append("|---|---|---|---|---|---|")
    for paradigm in Paradigm:
        for seed in range(2):
            tags = [7] * 64 if paradigm.uses_tags else None
            docs = _docs(1024, 96, seed)
            packed = pack(
                docs, 1024, paradigm, bos_id=1, eos_id=2, domain_tags=tags[: len(docs)] if tags else None, seed=seed
            )
            doc_ids = packed.attention_doc_ids()
            doc_ids = None if doc_ids is None else doc_ids[None].to(device)
            for impl in ("flex", "blocked"):
                for sq in (1024, 17):
                    g = torch.Generator(device="cpu").manual_seed(seed)
                    q = torch.randn(1, 8, sq, 64, generator=g).to(device).requires_grad_()
                    k = torch.randn(1, 2, 1024, 64, generator=g).to(device).requires_grad_()
                    v = torch.randn(1, 2, 1024, 64, generator=g).to(device).requires_grad_()
                    out = document_attention(q, k, v, doc_ids, impl=impl)
                    mask = document_mask(doc_ids, 1024, sq).to(device)
                    mask = mask if mask.dim() == 3 else mask[None]
                    ref = _naive(q, k, v, mask)
                    gout = torch.randn_like(out)
                    grads = torch.autograd.grad(out, (q, k, v), gout)
                    refs = torch.autograd.grad(ref, (q, k, v), gout.double())
                    err = (out.double() - ref).abs().max().item()
                    gerr = max((a.double() - b).abs().max().item() for a, b in zip(grads, refs))
                    passed = err < 1e-4 and gerr < 1e-4
                    ok &= passed
                    lines.append(
                        f"| {paradigm} (seed {seed}) | {impl} | {sq} | {err:.2e} | {gerr:.2e} | "
                        f"{'yes' if passed else 'NO'} |"
                    )
    return ok


def _time(fn, q, k, v, repeats: int = 5) -> float:
    for _ in range(2):
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def time_paradigms(lines: list[str], lengths: list[int]) -> None:
    import torch.nn.functional as F

    table = []
    for seq_len in lengths:
        g = torch.Generator(device="cpu").manual_seed(0)
        make = lambda h: torch.randn(1, h, seq_len, 128, generator=g).to("cuda", torch.bfloat16).requires_grad_()  # noqa: E731
        q, k, v = make(32), make(8), make(8)
        full = _time(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), q, k, v)
        table.append([seq_len, "full (SDPA causal)", f"{full * 1e3:.1f}", "1.000", "1.000"])
        docs = _docs(seq_len, 1024, 0)
        for paradigm in (Paradigm.INTRA_DOC, Paradigm.ANCHOR, Paradigm.ANCHOR_INTERLEAVED):
            packed = pack(docs, seq_len, paradigm, bos_id=1, eos_id=2, seed=0)
            doc_ids = packed.doc_ids[None].cuda()
            t = _time(lambda q, k, v: document_attention(q, k, v, doc_ids, impl="flex"), q, k, v)
            ideal = sum(n * n for n in packed.doc_lengths) / seq_len**2
            table.append([seq_len, f"{paradigm} (flex)", f"{t * 1e3:.1f}", f"{t / full:.3f}", f"{ideal:.3f}"])
    header = ["S", "paradigm", "fwd+bwd ms", "/ full causal", "ideal Σd²/S²"]
    lines.extend(markdown_table(header, table).splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="Also write the report to this markdown file.")
    parser.add_argument("--lengths", default="16384,32768,65536")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    lines = [
        f"# GPU attention check\n\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}\n",
        "## Correctness\n",
    ]
    ok = check_correctness(lines)
    lines.append("\n## Timings (bf16, B=1, H=32, Hkv=8, D=128, median of 5 after 2 warm-ups)\n")
    time_paradigms(lines, parse_list(args.lengths, int))
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
