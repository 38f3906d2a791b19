"""A hub name is a repo id and a revision, never a path: a name that breaks the hub's repo id rules
or git's ref-name rules is refused with one line naming it as typed, and whatever a revision (or a
damaged refs file) resolves to must be a snapshot of that repo in the hub cache."""

from __future__ import annotations

import shutil

import pytest

from evalkit.errors import UserError
from evalkit.models.check import checkpoint_source
from tests.test_hub import MAIN, REPO, TINY_BASE, add_snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An offline hub cache holding REPO at MAIN (refs/main), with a model outside it (tmp_path/elsewhere)
    and, outside it too, a file that reads as a refs file pointing there."""
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    add_snapshot(cache, REPO, MAIN, ("main",))
    shutil.copytree(TINY_BASE, tmp_path / "elsewhere")
    # storage/snapshots/<this> is tmp_path/elsewhere: what huggingface_hub joins a refs file's text to
    (tmp_path / "x").write_text("../../../elsewhere")
    return cache


@pytest.mark.parametrize(
    ("name", "part"),
    [
        (f"{REPO}@../../../x", "revision"),  # refs/../../../x is tmp_path/x: a path, not a revision
        (f"{REPO}@{{tmp}}/x", "revision"),  # an absolute revision replaces the refs folder
        (f"{REPO}@-x", "revision"),
        (f"{REPO}@", "revision"),
        (f"{REPO}@v 1", "revision"),
        (f"{REPO}@a//b", "revision"),
        (f"{REPO}@v1.lock", "revision"),
        (f"{REPO}@main/", "revision"),
        (f"{REPO}@.hidden", "revision"),
        ("someorg//tiny-hub", "repo"),  # not someorg/tiny-hub
        ("a/b/c@v1", "repo"),
        ("-org/name", "repo"),
        ("org/na--me", "repo"),
        ("ørg/name", "repo"),
    ],
)
def test_a_name_breaking_the_rules_is_one_line_naming_it_as_typed(cache, tmp_path, name, part):
    name = name.format(tmp=tmp_path)
    with pytest.raises(UserError) as caught:
        checkpoint_source(name)
    message = str(caught.value)
    assert "\n" not in message and repr(name) in message and f"the {part} " in message


def test_a_refs_file_pointing_out_of_the_cache_is_refused(cache, tmp_path):
    (cache / "models--someorg--tiny-hub" / "refs" / "moved").write_text("../../../elsewhere")
    with pytest.raises(UserError, match="not a snapshot in the hub cache"):
        checkpoint_source(f"{REPO}@moved")


@pytest.mark.parametrize("revision", ["v1.0", "refs/pr/1", "release-2024_01", MAIN])
def test_branches_tags_and_commits_still_resolve_to_their_snapshot(cache, revision):
    refs = cache / "models--someorg--tiny-hub" / "refs" / revision
    refs.parent.mkdir(parents=True, exist_ok=True)
    refs.write_text(MAIN)
    path, hub = checkpoint_source(f"{REPO}@{revision}")
    assert path == cache / "models--someorg--tiny-hub" / "snapshots" / MAIN
    assert hub is not None and (hub.repo, hub.revision, hub.commit) == (REPO, revision, MAIN)


def test_a_local_directory_with_a_hub_breaking_name_is_still_a_path(cache, tmp_path):
    (tmp_path / "runs" / "a@b c").mkdir(parents=True)
    path, hub = checkpoint_source("runs/a@b c")
    assert hub is None and path.resolve() == tmp_path / "runs" / "a@b c"
