"""scripts/compare_ruler_runs.py against differences computed here by hand."""

import importlib.util
import json
import math
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_ruler_runs.py"


def load_script():
    spec = importlib.util.spec_from_file_location("compare_ruler_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def write_log(run: Path, task: str, length: int, records: list[dict]) -> None:
    path = run / "ruler" / task / f"{length}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def record(index: int, reference: str, correct: bool, length: int) -> dict:
    prediction = reference if correct else "wrong"
    return {"index": index, "length": length, "prediction": prediction, "references": [reference],
            "score": 100.0 if correct else 0.0}  # fmt: skip


def test_same_samples_are_paired_and_other_samples_are_not(tmp_path):
    script = load_script()
    budget = 4096 - 128  # niah_single_1's generation budget is 128 tokens
    a_correct, b_correct = [True, False, False, True], [True, True, False, True]
    a = {i: record(i, f"n{i}", ok, budget) for i, ok in enumerate(a_correct)}
    b = {i: record(i, f"n{i}", ok, budget // 2) for i, ok in enumerate(b_correct)}
    paired = script.compare_task("niah_single_1", 4096, a, b)
    differences = [100.0 * (y - x) for x, y in zip(a_correct, b_correct)]  # 0, 100, 0, 0
    mean = sum(differences) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 3)
    assert paired.paired and paired.difference == mean == 25.0
    assert math.isclose(paired.error, sd / 2)
    assert paired.cells[0].startswith("4 | 1.00 | 50.0") and paired.cells[1].startswith("4 | 0.50 | 75.0")

    other = {i: record(i, f"m{i}", ok, budget) for i, ok in enumerate(b_correct)}  # other needles: not paired
    independent = script.compare_task("niah_single_1", 4096, a, other)
    error = lambda values: math.sqrt(  # noqa: E731  the standard error of one 0/100 score
        sum((v - sum(values) / 4) ** 2 for v in values) / 3 / 4
    )
    assert not independent.paired
    assert math.isclose(
        independent.error,
        math.hypot(error([100 * x for x in a_correct]), error([100 * y for y in b_correct])),
        abs_tol=0.01,
    )


def test_script_prints_the_table_with_the_average(tmp_path, capsys, monkeypatch):
    script = load_script()
    budget = 4096 - 128
    write_log(tmp_path / "a", "niah_single_1", 4096, [record(i, f"n{i}", i < 2, budget) for i in range(4)])
    write_log(tmp_path / "b", "niah_single_1", 4096, [record(i, f"n{i}", i < 3, budget) for i in range(4)])
    monkeypatch.setattr("sys.argv", ["x", str(tmp_path / "a"), str(tmp_path / "b"), "--length", "4096",
                                     "--names", "exact,nvidia"])  # fmt: skip
    script.main()
    out = capsys.readouterr().out
    assert "| niah_single_1 | 4 | 1.00 | 50.0 ± 28.9 | 4 | 1.00 | 75.0 ± 25.0 | +25.0 ± 25.0 | yes |" in out
    assert "**+25.00 ± 25.00**" in out


def test_several_directories_pool_pairing_kth_with_kth(tmp_path, capsys, monkeypatch):
    """Two seeds' evaluations: sample 0 of seed 1 is another sample than sample 0 of seed 0."""
    script = load_script()
    budget = 4096 - 128
    for seed, (a_ok, b_ok) in enumerate([([1, 0], [1, 1]), ([0, 0], [0, 1])]):
        write_log(
            tmp_path / f"a{seed}", "niah_single_1", 4096, [record(i, f"s{seed}n{i}", a_ok[i], budget) for i in (0, 1)]
        )
        write_log(
            tmp_path / f"b{seed}", "niah_single_1", 4096, [record(i, f"s{seed}n{i}", b_ok[i], budget) for i in (0, 1)]
        )
    runs = lambda side: ",".join(str(tmp_path / f"{side}{seed}") for seed in (0, 1))  # noqa: E731
    write_log(tmp_path / "a0", "fwe", 4096, [record(0, "x", True, budget)])  # in one pair only, and not asked for
    write_log(tmp_path / "b0", "fwe", 4096, [record(0, "x", False, budget)])
    monkeypatch.setattr("sys.argv", ["x", runs("a"), runs("b"), "--length", "4096", "--tasks", "niah_single_1"])
    script.main()
    # Paired over 4 samples: differences 0, 100, 0, 100 -> mean 50, sd 57.7, error 28.9.
    out = capsys.readouterr().out
    assert "| niah_single_1 | 4 | 1.00 | 25.0 ± 25.0 | 4 | 1.00 | 75.0 ± 25.0 | +50.0 ± 28.9 | yes |" in out
    assert "fwe" not in out and "average (1 tasks)" in out
