"""Models named by their hub name (`org/name`, `org/name@revision`), offline against a hub cache
built here as huggingface_hub lays it out: models--org--name/snapshots/<commit>/ holding the
files, refs/<branch> holding the commit. HF_HUB_OFFLINE=1 in every test: nothing reaches the network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from evalkit.errors import UserError
from evalkit.models.check import checkpoint_source
from evalkit.models.refs import checkpoint_meta, resolve_checkpoints
from evalkit.store.result_format import describe_checkpoint
from tests.helpers import run_cli

TINY_BASE = Path(__file__).resolve().parents[1] / "evalkit" / "checkpoints" / "tiny-base"
REPO = "someorg/tiny-hub"
MAIN, V1 = "1" * 40, "2" * 40  # the commits refs/main and refs/v1 name


def add_snapshot(cache: Path, repo: str, commit: str, refs: tuple[str, ...], **config_changes) -> Path:
    """A snapshot of tiny-base as a hub model (its files without evalkit's meta.json) at `commit`,
    named by `refs`; `config_changes` make one snapshot differ from another."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        shutil.copy2(TINY_BASE / name, snapshot / name)
    if config_changes:
        config = json.loads((snapshot / "config.json").read_text())
        (snapshot / "config.json").write_text(json.dumps({**config, **config_changes}))
    (storage / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An offline hub cache holding REPO at two revisions: main and v1 (whose config differs)."""
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    add_snapshot(cache, REPO, MAIN, ("main",))
    add_snapshot(cache, REPO, V1, ("v1",), initializer_range=0.03)
    return cache


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_hub_name_resolves_to_its_snapshot_and_a_pinned_revision_to_its_own(hub):
    path, model = checkpoint_source(REPO)
    assert path == hub / "models--someorg--tiny-hub" / "snapshots" / MAIN
    assert model is not None and model.record() == {"repo": REPO, "revision": "main", "commit": MAIN}
    pinned, by_tag = checkpoint_source(f"{REPO}@v1")
    assert pinned.name == V1 and json.loads((pinned / "config.json").read_text())["initializer_range"] == 0.03
    assert by_tag is not None and by_tag.record() == {"repo": REPO, "revision": "v1", "commit": V1}
    assert checkpoint_source(f"{REPO}@{V1}")[0] == pinned  # a commit pins it too
    refs = resolve_checkpoints([REPO, f"{REPO}@v1"])
    assert [(ref.run, ref.step, ref.path.name) for ref in refs] == [("tiny-hub", 0, MAIN), ("tiny-hub@v1", 0, V1)]


def test_a_miss_is_one_line_naming_the_cache_and_the_command_that_fills_it(hub, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(["ruler", "--ckpts", "someorg/absent@v2", "--lengths", "512", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(hub) in line and "fill it with: hf download someorg/absent --revision v2" in line
    assert not out.exists()
    with pytest.raises(UserError, match=f"{REPO}@v9 is neither a local directory nor in the hub cache"):
        checkpoint_source(f"{REPO}@v9")


def test_a_local_directory_of_that_name_wins_with_a_one_line_note(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(TINY_BASE, tmp_path / REPO)
    refs = resolve_checkpoints([REPO])
    assert [ref.path for ref in refs] == [(tmp_path / REPO).resolve()] and refs[0].hub is None
    note = one_error_line(capsys.readouterr().err)
    assert note.startswith(f"note: {REPO} is the local directory") and str(hub) in note


def test_ruler_on_a_hub_name_records_the_commit_and_the_leaderboard_shows_it(hub, tmp_path):
    from evalkit.results.leaderboard import build_markdown

    out = tmp_path / "results"
    args = ["--lengths", "512", "--tasks", "niah_single_1", "--samples", "2", "--out", str(out)]
    assert run_cli(["ruler", "--ckpts", f"{REPO}@v1", *args]) == 0
    summary = json.loads((out / "tiny-hub@v1" / "step-0" / "ruler-summary.json").read_text())
    assert summary["provenance"]["checkpoint_meta"]["hub"] == {"repo": REPO, "revision": "v1", "commit": V1}
    markdown = build_markdown([out])[0]
    row = next(line for line in markdown.splitlines() if line.startswith("| tiny-hub@v1"))
    assert f"| pretrained | tiny-hub@{V1[:7]} | hub |" in row


def test_the_probe_takes_a_hub_name_and_records_its_commit(hub, tmp_path):
    from evalkit.probe import run_probe

    result = run_probe("tokens", REPO, tmp_path / "probe", seq_len=20, n_texts=1, dtypes="bf16")
    assert result["provenance"]["hub"] == {"repo": REPO, "revision": "main", "commit": MAIN}


def test_train_continues_from_a_hub_model_and_records_its_commit(hub, tmp_path):
    from evalkit.train.checkpoint import complete_checkpoints, load_model_state

    sets = ["seq_len=128", "windows_per_step=2", "micro_batch=2", "optim.lr=0", "data.num_retrieval_docs=50"]
    args = ["train", "--config", "tiny-long", "--model", REPO, "--paradigm", "full", "--max-steps", "2"]
    assert run_cli([*args, "--out", str(tmp_path / "run"), *(f"--set={one}" for one in sets)]) == 0
    step = complete_checkpoints(tmp_path / "run")[-1][1]
    meta = json.loads((step / "meta.json").read_text())
    assert meta["base_model"] == {"repo": REPO, "revision": "main", "commit": MAIN}
    assert meta["config"]["model"]["path"] == REPO  # the name as given: what a resume compares
    summary = {"provenance": {"checkpoint_meta": checkpoint_meta(step)}}
    assert describe_checkpoint(summary)[1] == f"tiny-hub@{MAIN[:7]}"  # the leaderboard's model column
    before = load_model_state(hub / "models--someorg--tiny-hub" / "snapshots" / MAIN)  # lr 0 keeps them
    assert all(torch.equal(load_model_state(step)[name], tensor.float()) for name, tensor in before.items())


def test_export_of_a_hub_model_writes_its_commit_in_meta(hub, tmp_path, capsys):
    dest = tmp_path / "exported"
    assert run_cli(["export", f"{REPO}@v1", str(dest), "--dtype", "fp32"]) == 0
    assert json.loads((dest / "meta.json").read_text()) == {"hub": {"repo": REPO, "revision": "v1", "commit": V1}}
    assert json.loads((dest / "config.json").read_text())["dtype"] == "float32"
    refs = resolve_checkpoints([str(dest)])  # the export, evaluated later, still names its origin
    assert refs[0].step == 0 and checkpoint_meta(refs[0].path)["hub"]["commit"] == V1


def test_the_quickstart_probes_a_hub_model_and_refuses_a_miss_before_any_work(hub, tmp_path):
    from rich.console import Console

    from evalkit.quickstart import QuickstartPlan, check_plan, probe_checkpoint

    checkpoint, what = probe_checkpoint(f"{REPO}@v1", Console(file=open(tmp_path / "log.txt", "w")))
    assert checkpoint.name == V1 and what == f"{REPO}@v1 (commit {V1[:7]})"
    with pytest.raises(UserError, match="fill it with: hf download someorg/absent"):
        check_plan(QuickstartPlan(probe="someorg/absent", out=tmp_path / "out", runs_dir=tmp_path / "runs"))
    assert not (tmp_path / "out").exists()


def test_bench_eval_takes_a_hub_name(hub):
    from perf import eval as bench

    rows = bench.run(REPO, ["hf"], ["niah_single_1"], [512], 1)
    assert [(row.engine, row.samples) for row in rows] == [("hf", 1)]


def test_general_on_a_hub_name_records_the_commit(hub, tmp_path):
    out = tmp_path / "general"
    args = ["--tasks", "evalkit_fixture_hellaswag_style", "--limit", "2", "--out", str(out)]
    assert run_cli(["general", "--ckpts", REPO, *args]) == 0
    summary = json.loads((out / "tiny-hub" / "step-0" / "general-summary.json").read_text())
    assert summary["provenance"]["checkpoint_meta"]["hub"] == {"repo": REPO, "revision": "main", "commit": MAIN}
