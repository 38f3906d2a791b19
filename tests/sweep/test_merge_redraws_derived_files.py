"""Merged ppl shards are the unsharded ppl run: files derived from the results (the loss-by-position
plot) are drawn from the merged summaries, never compared between shards; ppl and ruler shards
merged together are each merged right."""

from __future__ import annotations

import json

from evalkit.ppl import builtin_documents
from tests.sweep.helpers import SHIPPED, SHIPPED_FULL, outputs_of, run_cli

TINY_BASE = SHIPPED.parent / "tiny-base"


def _ppl(data, out, *more: str) -> int:
    args = ["ppl", "--ckpts", str(TINY_BASE), "--lengths", "128,256", "--data", str(data), "--docs", "2"]
    return run_cli([*args, "--dtype", "fp32", *more, "--out", str(out)])


def _lengths(out) -> dict:
    return json.loads(next(out.rglob("ppl-summary.json")).read_text())["lengths"]


def test_ppl_shards_merge_to_the_unsharded_run_and_the_plot_is_drawn_after(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    prose = "\n\n".join(builtin_documents())
    data.write_text("".join(json.dumps({"text": prose[i * 3000 : (i + 1) * 3000]}) + "\n" for i in range(2)))
    assert _ppl(data, tmp_path / "whole") == 0
    for i in (0, 1):  # one length each
        assert _ppl(data, tmp_path / f"ppl{i}", "--shard", f"{i}/2") == 0
    shards = [str(tmp_path / f"ppl{i}") for i in (0, 1)]
    assert run_cli(["merge", *shards, "--out", str(tmp_path / "m")]) == 0
    merged, whole = outputs_of(tmp_path / "m"), outputs_of(tmp_path / "whole")
    assert merged == whole and len(next(iter(whole[0].values()))["rows"]) == 2 and whole[1]
    assert _lengths(tmp_path / "m") == _lengths(tmp_path / "whole")
    assert (tmp_path / "m" / "ppl-positions.png").stat().st_size and (tmp_path / "m" / "ppl-positions.svg").is_file()

    # A shard that scored other documents (another --data, the same plan) is refused, not joined.
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": prose[i * 3000 + 1 : (i + 1) * 3000 + 1]}) + "\n" for i in range(2)))
    assert _ppl(other, tmp_path / "other1", "--shard", "1/2") == 0
    assert run_cli(["merge", shards[0], str(tmp_path / "other1"), "--out", str(tmp_path / "mixed")]) == 2
    assert "eval_data" in capsys.readouterr().err and not (tmp_path / "mixed").exists()

    # Beside a ruler sweep's shards (one --out per benchmark and shard), each sweep merges as apart.
    ruler = ["ruler", "--ckpts", str(SHIPPED_FULL), "--lengths", "1k", "--samples", "1"]
    ruler += ["--tasks", "niah_single_1,niah_single_2"]
    for i in (0, 1):
        assert run_cli([*ruler, "--shard", f"{i}/2", "--out", str(tmp_path / f"ruler{i}")]) == 0
    both = [*shards, str(tmp_path / "ruler0"), str(tmp_path / "ruler1")]
    assert run_cli(["merge", *both, "--out", str(tmp_path / "both")]) == 0
    assert run_cli(["merge", *both[2:], "--out", str(tmp_path / "ruler")]) == 0
    apart = outputs_of(tmp_path / "ruler")
    assert outputs_of(tmp_path / "both") == ({**merged[0], **apart[0]}, {**merged[1], **apart[1]})
    assert (tmp_path / "both" / "ppl-positions.png").is_file()
