"""Standard against anchor encoding (`evalkit ruler --encoding anchor`), paired sample by sample.

    python scripts/compare_encodings.py OUT/RUN/step-N [OUT/RUN/step-M ...] --length 1024 --doc-tokens 128

Each directory is a checkpoint's results, `<out>/<run>/step-<N>`, holding both encodings' per-sample
logs (`ruler/<task>/<length>.jsonl` and `<length>.anchor-<doc-tokens>.jsonl`). Reads only the logs,
never re-runs anything. Both encodings answered the same samples, so the difference is paired:
per task, the mean of the per-sample score differences and its standard error (their standard
deviation over the square root of n); over tasks, the mean of the task differences with the
tasks' errors combined as independent. Also the share of samples answered identically. Prints
markdown: one line per checkpoint, then one per checkpoint and task.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def read_log(path: Path) -> dict[int, dict]:
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {int(record["index"]): record for record in records}


def paired(standard: dict[int, dict], anchor: dict[int, dict]) -> dict | None:
    """Scores, paired difference ± standard error and identical answers over the samples both hold."""
    shared = sorted(set(standard) & set(anchor))
    if not shared:
        return None
    a = [float(standard[i]["score"]) for i in shared]
    b = [float(anchor[i]["score"]) for i in shared]
    differences = [y - x for x, y in zip(a, b)]
    error = statistics.stdev(differences) / math.sqrt(len(shared)) if len(shared) > 1 else 0.0
    same = sum(standard[i]["prediction"] == anchor[i]["prediction"] for i in shared)
    documents = [anchor[i].get("documents") for i in shared if anchor[i].get("documents") is not None]
    return {
        "n": len(shared),
        "standard": statistics.fmean(a),
        "anchor": statistics.fmean(b),
        "difference": statistics.fmean(differences),
        "error": error,
        "identical": same / len(shared),
        "documents": statistics.fmean(documents) if documents else float("nan"),
    }


def compare(directory: Path, length: int, doc_tokens: int) -> dict[str, dict]:
    results = {}
    for task_dir in sorted((directory / "ruler").iterdir()):
        standard = read_log(task_dir / f"{length}.jsonl")
        anchor = read_log(task_dir / f"{length}.anchor-{doc_tokens}.jsonl")
        result = paired(standard, anchor)
        if result is not None:
            results[task_dir.name] = result
    return results


def label(directory: Path) -> str:
    return f"{directory.parent.name} step {directory.name.removeprefix('step-')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, nargs="+")
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--doc-tokens", type=int, default=512)
    args = parser.parse_args()
    compared = {directory: compare(directory, args.length, args.doc_tokens) for directory in args.checkpoints}
    print("| checkpoint | tasks | samples each | standard | anchor | anchor − standard | identical answers |")
    print("|---|---|---|---|---|---|---|")
    for directory, tasks in compared.items():
        if not tasks:
            continue
        difference = statistics.fmean(t["difference"] for t in tasks.values())
        error = math.sqrt(sum(t["error"] ** 2 for t in tasks.values())) / len(tasks)
        print(
            f"| {label(directory)} | {len(tasks)} | {min(t['n'] for t in tasks.values())} | "
            f"{statistics.fmean(t['standard'] for t in tasks.values()):.2f} | "
            f"{statistics.fmean(t['anchor'] for t in tasks.values()):.2f} | {difference:+.2f} ± {error:.2f} | "
            f"{statistics.fmean(t['identical'] for t in tasks.values()):.0%} |"
        )
    print()
    print("| checkpoint | task | n | documents | standard | anchor | anchor − standard | identical answers |")
    print("|---|---|---|---|---|---|---|---|")
    for directory, tasks in compared.items():
        for task, t in tasks.items():
            print(
                f"| {label(directory)} | {task} | {t['n']} | {t['documents']:.1f} | {t['standard']:.1f} | "
                f"{t['anchor']:.1f} | {t['difference']:+.1f} ± {t['error']:.1f} | {t['identical']:.0%} |"
            )


if __name__ == "__main__":
    main()
