"""The leaderboard's needle-depth view from hand-made niah logs: every bucket's accuracy, its count
of references and the paradigm difference checked against arithmetic done here by hand."""

import json
from pathlib import Path

from evalkit.results.leaderboard import write_leaderboard
from evalkit.store.sample_log import record_checksum
from tests.results.test_leaderboard import ruler_summary, write


def checkpoint(root: Path, run: str, step: int, paradigm: str, cells: dict) -> None:
    """cells: (task, length, n) -> records as (references, prediction, depths or None)."""
    scores, logs = {}, {}
    for (task, length, n), records in cells.items():
        lines = []
        for index, (references, prediction, depths) in enumerate(records):
            score = 100 * sum(r in prediction for r in references) / len(references)
            record = {"index": index, "length": length - 200, "prediction": prediction, "references": references,
                      "score": score, "prompt_sha": f"p{index}", **({"depths": depths} if depths else {})}  # fmt: skip
            lines.append(json.dumps({**record, "sha": record_checksum(record)}) + "\n")
        scores[(task, length)] = sum(json.loads(line)["score"] for line in lines[:n]) / n
        logs[(task, length)] = "".join(lines)
    summary = ruler_summary(run, step, scores, paradigm=paradigm)
    for row in summary["rows"]:
        row["n"] = next(n for (task, length, n) in cells if (task, length) == (row["task"], row["length"]))
    write(root, summary)
    for (task, length), text in logs.items():
        log = root / run / f"step-{step}" / "ruler" / task / f"{length}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)


def test_accuracy_by_depth_bucket_and_length_and_the_paradigm_difference(tmp_path):
    root = tmp_path / "ruler"
    checkpoint(root, "a-full", 1, "full", {
        ("niah_single_1", 1024, 2): [(["111"], "111", [5.0]), (["222"], "no", [95.0])],
        # 3333 at 5% and 5555 at 100% found, 4444 at 15% and 6666 at 9.99% not
        ("niah_multivalue", 1024, 1): [(["3333", "4444", "5555", "6666"], "3333 5555", [5.0, 15.0, 100.0, 9.99])],
        ("niah_single_1", 2048, 1): [(["777"], "777", [50.0]), (["888"], "x", [50.0])],  # the second beyond n
        ("vt", 1024, 1): [(["x1"], "x1", None)],  # no needles: not in the view
    })  # fmt: skip
    checkpoint(root, "a-full", 2, "full", {("niah_single_1", 1024, 2): [(["111"], "111", [5.0]), (["2"], "2", [95.0])]})
    checkpoint(root, "b-anchor", 1, "anchor", {
        ("niah_single_1", 1024, 2): [(["111"], "nope", [5.0]), (["222"], "222", [95.0])],
        ("niah_single_1", 2048, 1): [(["777"], "777", None)],  # logged before depths were: left out
    })  # fmt: skip
    out = tmp_path / "board.md"
    board = write_leaderboard([root], out).read_text()
    assert board.startswith("# Leaderboard\n")

    def table(heading: str) -> list[str]:
        """The table under the heading starting with `heading`."""
        body = board.split(f"### {heading}")[1].split("\n", 1)[1]
        return body.split("###")[0].split("\n## ")[0].strip().splitlines()

    # a-full, 1K: 0-10% found 2 of 3 at step 1 (111, 3333; not 6666), 1 of 1 at step 2: (66.67 + 100) / 2;
    # 10-20%: 0 of 1 (4444, step 1 only); 90-100%: 1 of 2 (5555; not 222), then 1 of 1: (50 + 100) / 2.
    # 2K: 50-60%: 1 of 1 (777) at step 1 only. In brackets: the most references of one checkpoint.
    full = table("a-full")
    assert full[0] == "| needle depth | 1K | 2K |"
    assert full[2] == "| 0-10% | 83.3 (3) | – |"
    assert full[3] == "| 10-20% | 0.0 (1) | – |"
    assert full[7] == "| 50-60% | – | 100.0 (1) |"
    assert full[11] == "| 90-100% | 75.0 (2) | – |"
    assert sum("(" in line for line in full) == 4
    anchor = table("b-anchor")
    assert (
        anchor[0] == "| needle depth | 1K |"
        and anchor[2] == "| 0-10% | 0.0 (1) |"
        and anchor[11] == "| 90-100% | 100.0 (1) |"
    )
    # anchor − full where both have the cell: 0 − 83.33 and 100 − 75.
    difference = table("anchor − full (llama 4x256, builtin, standard; 1 vs 1 runs)")
    assert difference[2] == "| 0-10% | -83.3 |" and difference[11] == "| 90-100% | +25.0 |"
    assert sum(line.endswith("| – |") for line in difference[2:]) == 8
    plots = tmp_path / "plots"
    assert all((plots / f"{stem}{suffix}").is_file() for stem in ("niah-depth", "niah-depth-difference")
               for suffix in (".png", ".svg"))  # fmt: skip


def test_no_depths_no_view(tmp_path):
    root = tmp_path / "ruler"
    checkpoint(root, "old", 1, "full", {("niah_single_1", 1024, 1): [(["111"], "111", None)]})
    board = write_leaderboard([root], tmp_path / "board.md").read_text()
    assert "Needle depth" not in board and not (tmp_path / "plots" / "niah-depth.png").exists()
