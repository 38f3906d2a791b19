"""The docs name only paths that exist: every `evalkit/...` or `tests/...` path in README.md and
docs/*.md, and every entry of docs/architecture.md's layout tree, is a file or folder of the
checkout (a moved or deleted module fails here until the page says where it went)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path of the package or the tests; not the tail of a longer path (results/tests/...).
PATH = re.compile(r"(?<![\w./-])(?:evalkit|tests)/[\w./-]*[\w/]")


def _named(page: Path) -> set[str]:
    return set(PATH.findall(page.read_text(encoding="utf-8")))


def _layout_entries() -> list[str]:
    """The entries of the layout tree: an indented line's name column (up to two spaces; names split
    by ", "), under the folder of the nearest line above it indented less. A line indented 20 or
    more continues a description."""
    tree = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## Layout")[1].split("```")[1]
    folders: list[tuple[int, str]] = []
    entries = []
    for line in tree.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= 20:
            continue
        folders = [(level, folder) for level, folder in folders if level < indent]
        base = folders[-1][1] if folders else ""
        names = re.split(r"\s{2,}", line.strip())[0].split(", ")
        entries += [base + name for name in names]
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, base + names[0]))
    return entries


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_path_a_page_names_exists(page):
    missing = sorted(path for path in _named(page) if not (ROOT / path).exists())
    assert not missing, f"{page.name} names paths that are not in the checkout: {missing}"


def test_every_entry_of_the_layout_tree_exists():
    entries = _layout_entries()
    assert {"evalkit/sweep/pipeline.py", "evalkit/ruler/kinds/", "evalkit/markdown.py", "tests/"} <= set(entries)
    missing = [entry for entry in entries if not (ROOT / entry).exists()]
    assert not missing, f"docs/architecture.md's layout names entries that are not in the checkout: {missing}"
