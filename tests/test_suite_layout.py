"""The test suite's own rule: shared builders and references live in tests/helpers.py, and no
test module imports the conftest of another folder (pytest loads conftests itself; importing one
from elsewhere runs its fixtures' module twice and ties two folders together)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_conftests(path: Path) -> list[str]:
    """The conftest modules `path` imports, as dotted names relative to tests/ ('.conftest' for its own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == "conftest":
            found.append("." * node.level + node.module)
    return found


def test_no_test_module_imports_the_conftest_of_another_folder():
    crossing = {}
    for path in TESTS.rglob("*.py"):
        folder = path.parent.relative_to(TESTS).parts
        own = {".conftest", ".".join(("tests", *folder, "conftest"))}
        foreign = [name for name in imported_conftests(path) if name not in own]
        if foreign:
            crossing[str(path.relative_to(TESTS))] = foreign
    assert crossing == {}


def test_the_check_sees_a_crossing_import(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("from tests.engines.conftest import build_checkpoint\nfrom .conftest import local\n")
    assert imported_conftests(module) == ["tests.engines.conftest", ".conftest"]
