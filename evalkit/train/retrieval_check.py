"""Has a model learned in-context retrieval? Answer-token accuracy on held-out synthetic documents.

RULER scores stay at 0 until a model retrieves well enough to reproduce a whole value, so they
cannot guide the tuning of a small training recipe. This check is the finer signal: on
synthetic retrieval documents the model never saw (indices far beyond the training stream's),
it measures teacher-forced next-token accuracy and loss on the digits of each answer, and, as
the control, on the digits of the same value where it is first stated (a random number nobody
can predict). A model that retrieves scores well above the control on answers; one that does
not scores the same on both.

    python -m evalkit.train.retrieval_check runs/tiny-cpu-anchor/step-300 [more checkpoints] [--max-tokens 1024]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from evalkit.markdown import markdown_row, markdown_table
from evalkit.models.refs import is_checkpoint
from evalkit.train.synthetic import PHRASINGS, RetrievalExample, copy_example, retrieval_example


def retrieval_kind(phrasing: str) -> str:
    """The check's kind for documents in `phrasing`: retrieval (plain), retrieval-varied, ..."""
    return "retrieval" if phrasing == "plain" else f"retrieval-{phrasing}"


EXAMPLES: dict[str, Callable[[int, int, int], RetrievalExample]] = {
    **{retrieval_kind(phrasing): partial(retrieval_example, phrasing=phrasing) for phrasing in PHRASINGS},
    "copy": copy_example,
}

HELD_OUT_FROM = 10_000_000  # document indices the training stream (num_retrieval_docs) never reaches
HELD_OUT_SEED = 12_345


def span_tokens(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of the tokens lying inside the character span, except a first token (no context)."""
    start, end = span
    return [t for t, (a, b) in enumerate(offsets) if t > 0 and b > a and a >= start and b <= end]


def answer_accuracy(
    model, tokenizer, *, max_tokens: int, documents: int = 64, seed: int = HELD_OUT_SEED, kind: str = "retrieval"
) -> dict:
    """Teacher-forced accuracy and mean NLL on answer tokens and on first-statement tokens.

    kind "retrieval" / "retrieval-varied" / "retrieval-broad": the synthetic retrieval documents
    in plain, varied or broad phrasing; "copy": the copy documents, whose answers are the repeated segments and whose
    control is their first occurrence.

    `model(input_ids)` must return an object with `.logits` [1, T, V]; `tokenizer` must give
    offset mappings (a fast tokenizer). Documents longer than `max_tokens` are skipped.
    """
    make_example = EXAMPLES[kind]
    tally = {"answer": [0, 0, 0.0], "fact": [0, 0, 0.0]}  # correct, tokens, summed NLL
    used = 0
    for index in range(HELD_OUT_FROM, HELD_OUT_FROM + documents):
        example = make_example(index, seed, max_tokens)
        encoded = tokenizer(example.text, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        if len(ids) > max_tokens:
            continue
        used += 1
        with torch.no_grad():
            log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        for role, spans in (("answer", example.answers), ("fact", example.facts)):
            for span in spans:
                for t in span_tokens(offsets, span):
                    tally[role][0] += int(log_probs[t - 1].argmax()) == ids[t]
                    tally[role][1] += 1
                    tally[role][2] -= float(log_probs[t - 1, ids[t]])
    result: dict[str, float | int] = {"documents": used}
    for role, (correct, tokens, nll) in tally.items():
        result[f"{role}_tokens"] = tokens
        result[f"{role}_accuracy"] = correct / tokens if tokens else math.nan
        result[f"{role}_nll"] = nll / tokens if tokens else math.nan
    return result


def check_retrieval(path: Path, max_tokens: int, documents: int, device: str = "cpu", kind: str = "retrieval") -> dict:
    """answer_accuracy of a checkpoint directory, run in FP32 on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    # (ignore: transformers wraps PreTrainedModel.to with functools.wraps, which mypy types as unbound)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(device).eval()  # type: ignore[arg-type]

    def forward(input_ids: torch.Tensor):
        return model(input_ids.to(device))

    return answer_accuracy(forward, tokenizer, max_tokens=max_tokens, documents=documents, kind=kind)


def _expand(paths: Sequence[Path]) -> list[Path]:
    """Checkpoints as given; a run directory stands for its complete checkpoints, oldest first."""
    from evalkit.train.checkpoint import complete_checkpoints

    out = []
    for path in paths:
        steps = [] if is_checkpoint(path) else complete_checkpoints(path) if path.is_dir() else []
        out += [ckpt for _, ckpt in steps] or [path]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoints", nargs="+", type=Path, help="checkpoints, or run directories (all their checkpoints)"
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="document size (the training window)")
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument(
        "--kind",
        choices=sorted(EXAMPLES),
        default="retrieval",
        help="retrieval documents (plain, varied or broad phrasing), or copy documents (the induction skill alone)",
    )
    parser.add_argument(
        "--out", type=Path, help="also write the table, with the command and machine, to this markdown file"
    )
    args = parser.parse_args(argv)
    checkpoints = _expand(args.checkpoints)
    missing = [str(p) for p in checkpoints if not is_checkpoint(p)]
    if missing:
        print(f"error: not a checkpoint (no config.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    header = ["checkpoint", "documents", "answer acc", "answer NLL", "control acc", "control NLL"]
    print(markdown_table(header, []), flush=True)  # the header now, each row as soon as it is measured
    table = []
    for path in checkpoints:
        r = check_retrieval(path, args.max_tokens, args.documents, kind=args.kind)
        table.append(
            [
                path,
                r["documents"],
                f"{r['answer_accuracy']:.3f}",
                f"{r['answer_nll']:.3f}",
                f"{r['fact_accuracy']:.3f}",
                f"{r['fact_nll']:.3f}",
            ]
        )
        print(markdown_row(table[-1]), flush=True)
    if args.out:
        import shlex

        from evalkit.files import atomic_write_text
        from evalkit.store.provenance import provenance_lines

        command = "python -m evalkit.train.retrieval_check " + shlex.join(sys.argv[1:] if argv is None else argv)

        title = (
            f"# {args.kind} check: answer-token accuracy against the control, {args.documents} held-out documents "
            f"of up to {args.max_tokens} tokens"
        )
        report = [title, "", f"Command: `{command}`", "", markdown_table(header, table), "", *provenance_lines()]
        atomic_write_text(args.out, "\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
