"""The README is a guide that links its reference (docs/), evidence (results/) and the GPU checks' and
timing programs' pages: every relative link there, and in those pages, names a file that exists and,
with a #fragment, a heading that file has (GitHub's anchor rule)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
PAGES += ["perf/README.md", "tests/gpu/README.md", "results/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link in code is not a link)."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not this test's to fetch
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif fragment and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", prose(linked.read_text(encoding="utf-8")), flags=re.M)
            if fragment not in {anchor(h) for h in headings}:
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_of_the_guide_and_its_pages_resolves():
    broken = [line for page in PAGES for line in broken_links(ROOT / page)]
    assert broken == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# On a GPU: `x`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#on-a-gpu-x) [gone](nope.md) [bad](other.md#nowhere) [web](https://x.org)\n"
        "```\n[code](in-code.md)\n```\n"
    )
    assert broken_links(page) == ["page.md: nope.md (no such file)", "page.md: other.md#nowhere (no such heading)"]


def test_the_readme_links_every_reference_page():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall((ROOT / "README.md").read_text())}
    pages = [*(ROOT / "docs").glob("*.md"), ROOT / "perf/README.md", ROOT / "tests/gpu/README.md"]
    assert sorted(str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked) == []
