"""Has a model learned in-context retrieval? Answer-token accuracy on held-out synthetic documents.

The command over evalkit.train.retrieval_check: each checkpoint (a run directory stands for its
checkpoints) measured as a row of a markdown table, printed as it is measured.

    python scripts/retrieval_check.py runs/tiny-cpu-anchor/step-300 [more checkpoints] [--max-tokens 1024]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalkit.markdown import markdown_row, markdown_table  # noqa: E402 - needs ROOT on sys.path
from evalkit.models.refs import is_checkpoint  # noqa: E402 - needs ROOT on sys.path
from evalkit.train.retrieval_check import EXAMPLES, check_retrieval  # noqa: E402 - needs ROOT on sys.path


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

        command = "python scripts/retrieval_check.py " + shlex.join(sys.argv[1:] if argv is None else argv)

        title = (
            f"# {args.kind} check: answer-token accuracy against the control, {args.documents} held-out documents "
            f"of up to {args.max_tokens} tokens"
        )
        report = [title, "", f"Command: `{command}`", "", markdown_table(header, table), "", *provenance_lines()]
        atomic_write_text(args.out, "\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
