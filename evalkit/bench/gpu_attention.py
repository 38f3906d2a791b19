"""The GPU check of the attention specification, as one short script for a lent CUDA machine.

    PYTHONPATH=. python -m evalkit.bench.gpu_attention [--out results/gpu-attention.md] [--results FILE.jsonl]

Each result is appended to the JSONL file the moment it is measured (a kill or an out-of-memory
keeps what came before); the markdown report is written at the end.

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
from pathlib import Path

import torch

from evalkit.arglists import parse_list
from evalkit.attention import Paradigm, document_attention, document_mask, pack
from evalkit.markdown import markdown_table
from evalkit.store.result_log import ResultLog


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


def check_correctness(
    log: ResultLog, device: str = "cuda", length: int = 1024, paradigms=tuple(Paradigm)
) -> tuple[bool, list[dict]]:
    """Every paradigm, flex and blocked, against float64 attention; one record per case, written
    as it is measured. On a CPU FlexAttention has no backward: its rows there are forward only."""
    ok, records = True, []
    for paradigm in paradigms:
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
                    gerr = float("nan")
                    if backward:
                        gout = torch.randn_like(out)
                        grads = torch.autograd.grad(out, (q, k, v), gout)
                        refs = torch.autograd.grad(ref, leaves, gout.double())
                        gerr = max((a.double() - b).abs().max().item() for a, b in zip(grads, refs))
                    passed = err < 1e-4 and (not backward or gerr < 1e-4)
                    ok &= passed
                    record = log.write(
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
                    records.append(record)
    return ok, records


def correctness_lines(records: list[dict]) -> list[str]:
    # Written by hand, not by markdown_table: the header's |out - ref| would come out escaped as \|out - ref\|.
    lines = ["| paradigm | impl | Sq | max |out - ref| | max |grad - ref| | pass |", "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(
            f"| {r['paradigm']} (seed {r['seed']}) | {r['impl']} | {r['queries']} | {r['max_out_error']:.2e} | "
            f"{float(r['max_grad_error']):.2e} | {'yes' if r['passed'] else 'NO'} |"
        )
    return lines


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, q, k, v, repeats: int = 5, device: str = "cuda") -> float:
    for _ in range(2):
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def time_paradigms(log: ResultLog, lengths: list[int], device: str = "cuda", repeats: int = 5) -> list[dict]:
    """Forward+backward of full causal SDPA and each document-masked paradigm (flex on CUDA,
    blocked elsewhere), one record per measurement, written as it is measured."""
    import torch.nn.functional as F

    impl = "flex" if device == "cuda" else "blocked"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    records = []
    for seq_len in lengths:
        g = torch.Generator(device="cpu").manual_seed(0)
        make = lambda h: torch.randn(1, h, seq_len, 128, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
        q, k, v = make(32), make(8), make(8)
        sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
        full = _time(sdpa, q, k, v, repeats, device)
        records.append(log.write("attention_timing", seq_len=seq_len, paradigm="full (SDPA causal)", ms=full * 1e3))
        docs = _docs(seq_len, 1024, 0)
        for paradigm in (Paradigm.INTRA_DOC, Paradigm.ANCHOR, Paradigm.ANCHOR_INTERLEAVED):
            packed = pack(docs, seq_len, paradigm, bos_id=1, eos_id=2, seed=0)
            doc_ids = packed.doc_ids[None].to(device)
            t = _time(lambda q, k, v: document_attention(q, k, v, doc_ids, impl=impl), q, k, v, repeats, device)
            ideal = sum(n * n for n in packed.doc_lengths) / seq_len**2
            records.append(
                log.write(
                    "attention_timing",
                    seq_len=seq_len,
                    paradigm=f"{paradigm} ({impl})",
                    ms=t * 1e3,
                    per_full=t / full,
                    ideal=ideal,
                )
            )
    return records


def timing_lines(records: list[dict]) -> list[str]:
    table = [
        [r["seq_len"], r["paradigm"], f"{r['ms']:.1f}", f"{r.get('per_full', 1.0):.3f}", f"{r.get('ideal', 1.0):.3f}"]
        for r in records
    ]
    header = ["S", "paradigm", "fwd+bwd ms", "/ full causal", "ideal Σd²/S²"]
    return markdown_table(header, table).splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="Also write the report to this markdown file.")
    parser.add_argument(
        "--results", default=None, help="JSONL file: each result appended the moment it exists (default: OUT.jsonl)"
    )
    parser.add_argument("--lengths", default="16384,32768,65536")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    results = args.results or (str(Path(args.out).with_suffix(".jsonl")) if args.out else None)
    log = ResultLog(results)
    log.write("machine", device=torch.cuda.get_device_name(0), torch=torch.__version__)
    ok, correctness = check_correctness(log)
    timings = time_paradigms(log, parse_list(args.lengths, int))
    lines = [
        f"# GPU attention check\n\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}\n",
        "## Correctness\n",
        *correctness_lines(correctness),
        "\n## Timings (bf16, B=1, H=32, Hkv=8, D=128, median of 5 after 2 warm-ups)\n",
        *timing_lines(timings),
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
