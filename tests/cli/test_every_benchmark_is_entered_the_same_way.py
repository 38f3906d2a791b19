"""One entry shape (README, "Where to add things"): every Benchmark subclass in evalkit/ has its
command in cli/<name>.py, registered in COMMAND_MODULES, which hands the benchmark, built from its
settings, to options.run_command (and so to run_benchmark); no module of the package runs a
benchmark any other way. An AST scan: nothing is imported or run."""

import ast
import functools
from pathlib import Path

from evalkit.cli import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[2] / "evalkit"


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ROOT.rglob("*.py"))}


def _benchmarks(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """Class name -> its `name` attribute, for every direct subclass of Benchmark."""
    found = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Benchmark" for b in node.bases):
                names = [
                    statement.value.value
                    for statement in node.body
                    if isinstance(statement, ast.Assign)
                    and [getattr(t, "id", None) for t in statement.targets] == ["name"]
                    and isinstance(statement.value, ast.Constant)
                ]
                found[node.name] = names[0]
    return found


def _called(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)


def test_every_benchmark_has_its_command_module_which_hands_it_to_run_command():
    trees = _trees()
    benchmarks = _benchmarks(trees)
    assert {"RulerBenchmark", "GeneralBenchmark", "PplBenchmark"} <= set(benchmarks)  # the scan sees them
    for cls, name in benchmarks.items():
        assert name in COMMAND_MODULES, f"{cls}: add {name} to evalkit/cli/__init__.py's COMMAND_MODULES"
        command = trees[ROOT / "cli" / f"{name}.py"]
        calls = [node for node in ast.walk(command) if isinstance(node, ast.Call)]
        (built,) = [call for call in calls if _called(call) == cls]
        (run,) = [call for call in calls if _called(call) == "run_command"]
        bound = {
            target.id: node.value
            for node in ast.walk(command)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        handed = bound.get(run.args[0].id) if isinstance(run.args[0], ast.Name) else run.args[0]
        assert handed is built, f"cli/{name}.py must hand {cls}(settings) to options.run_command"


def test_only_the_pipeline_and_its_callers_run_a_benchmark():
    """The pipeline's inner steps are called from sweep/ alone; run_benchmark from the commands'
    run_command and the quickstart."""
    callers: dict[str, set[str]] = {}
    for path, tree in _trees().items():
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and _called(call) in ("run_benchmark", "evaluate_checkpoint"):
                callers.setdefault(_called(call), set()).add(path.relative_to(ROOT).as_posix())
    assert callers["run_benchmark"] == {"cli/options.py", "quickstart.py"}
    assert {path.split("/")[0] for path in callers["evaluate_checkpoint"]} == {"sweep"}
