"""evalkit merge refuses, in one line naming both shards and both values, shards that ran at two
evalkit commits or with another torch, transformers or GPU: the merged summary would record the
first shard's for every row. Shards that differ only in how and where they ran (the CPU, a batch
size) merge, each one's own values recorded under merged_shards."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

import evalkit.store.provenance as provenance
from evalkit.ruler.runner import RulerBenchmark
from evalkit.sweep.pipeline import run_benchmark
from evalkit.sweep.plan import Shard
from tests.helpers import error_line, evalkit_here
from tests.sweep.helpers import run_cli, tiny_refs, tiny_settings

# One checkpoint, two units of equal cost: shard 0 scores niah_single_1, shard 1 niah_single_2.
SETTINGS = dict(samples=1, tasks=["niah_single_1", "niah_single_2"])


def _shard(out, index: int) -> None:
    run_benchmark(RulerBenchmark(tiny_settings(**SETTINGS)), tiny_refs()[:1], out, shard=Shard(index, 2))


@pytest.fixture(scope="module")
def shard0(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "s0"
    _shard(out, 0)
    return out


def _merge(shard0, shard1, dest) -> int:
    return run_cli(["merge", str(shard0), str(shard1), "--out", str(dest)])


@pytest.mark.parametrize(
    "change, named",
    [
        ("commit", 'evalkit commit "{ours}" and {s1} with "0123456789ab"'),
        ("torch", 'machine.torch "{torch}" and {s1} with "0.0.1"'),
        ("gpu", 'machine.gpu {gpu} and {s1} with "Another GPU"'),
        ("transformers", 'engine.transformers "{transformers}" and {s1} with "0.0.2"'),
    ],
)
def test_shards_that_computed_differently_are_refused_in_one_line(shard0, tmp_path, monkeypatch, capsys, change, named):
    import transformers

    real_machine = provenance.machine()
    ours = provenance.git_state()[0]
    with monkeypatch.context() as patch:
        if change == "commit":
            patch.setattr(provenance, "git_state", lambda: ("0123456789ab", ()))
        elif change in ("torch", "gpu"):
            other = {"torch": "0.0.1"} if change == "torch" else {"gpu": "Another GPU"}
            patch.setattr(provenance, "machine", lambda: {**real_machine, **other})
        else:
            patch.setattr(transformers, "__version__", "0.0.2")
        _shard(tmp_path / "s1", 1)
    capsys.readouterr()
    assert _merge(shard0, tmp_path / "s1", tmp_path / "m") == 2
    err = capsys.readouterr().err.strip().splitlines()
    ours_too = dict(torch=real_machine["torch"], gpu=json.dumps(real_machine.get("gpu")), ours=ours)
    expected = named.format(s1=tmp_path / "s1", transformers=transformers.__version__, **ours_too)
    assert len(err) == 1 and f"error: conflicting shards: {shard0} ran with {expected}" in err[0], err
    assert not (tmp_path / "m").exists()


def test_shards_that_ran_on_another_cpu_or_batch_size_merge_with_their_own_record(shard0, tmp_path, monkeypatch):
    real_machine = provenance.machine()
    with monkeypatch.context() as patch:
        patch.setattr(provenance, "machine", lambda: {**real_machine, "cpu": "Another CPU", "cores": 999})
        settings = replace(tiny_settings(**SETTINGS), batch_size=1)  # a rerun after an out-of-memory error
        run_benchmark(RulerBenchmark(settings), tiny_refs()[:1], tmp_path / "s1", shard=Shard(1, 2))
    assert _merge(shard0, tmp_path / "s1", tmp_path / "m") == 0
    summary = json.loads(next((tmp_path / "m").rglob("ruler-summary.json")).read_text())
    shards = summary["provenance"]["merged_shards"]
    assert [s.get("differs") for s in shards] == [
        None,
        {
            "machine.cpu": "Another CPU",
            "machine.cores": 999,
            "settings.batch_size": 1,
            "engine.batch_size": 1,
            "engine.packed_batch_size": 1,
        },
    ]
    assert summary["provenance"]["machine"] == real_machine and len(summary["rows"]) == 2


def test_merge_refuses_shards_of_one_run_name_over_different_weights(tmp_path, capsys):
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import RulerBenchmark
    from evalkit.sweep.pipeline import run_benchmark
    from evalkit.sweep.plan import Shard
    from tests.sweep.helpers import SHIPPED_ANCHOR, SHIPPED_FULL, tiny_settings

    # Three directories holding a run "myrun" at step 600: a, a copy of a, and b (another run's weights).
    checkpoints = {
        "a": SHIPPED_FULL / "step-600",
        "a-copy": SHIPPED_FULL / "step-600",
        "b": SHIPPED_ANCHOR / "step-600",
    }
    for place, source in checkpoints.items():
        shutil.copytree(source, tmp_path / place / "myrun" / "step-600")
    settings = tiny_settings(samples=1, tasks=["niah_single_1", "qa_1"])  # one unit per shard
    for index, place in enumerate(["a", "b"]):
        refs = resolve_checkpoints([str(tmp_path / place / "myrun" / "step-600")])
        run_benchmark(RulerBenchmark(settings), refs, tmp_path / f"shard{index}-{place}", shard=Shard(index, 2))
    refs = resolve_checkpoints([str(tmp_path / "a-copy" / "myrun" / "step-600")])
    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "shard1-a-copy", shard=Shard(1, 2))

    line = error_line(
        evalkit_here(capsys, "merge", tmp_path / "shard0-a", tmp_path / "shard1-b", "--out", tmp_path / "m")
    )
    assert "conflicting shards" in line and "myrun step 600 is different weights" in line
    assert str(tmp_path / "a" / "myrun" / "step-600") in line and str(tmp_path / "b" / "myrun" / "step-600") in line
    assert not (tmp_path / "m").exists()
    # The same weights in another directory (a copy staged on another node) are the same checkpoint.
    merged = evalkit_here(capsys, "merge", tmp_path / "shard0-a", tmp_path / "shard1-a-copy", "--out", tmp_path / "m")
    assert merged.returncode == 0, merged.stderr
