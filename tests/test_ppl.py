"""`evalkit ppl` against an independent computation: a plain transformers forward over each whole
document cut to L, the loss by hand; buckets, skips, resume, shards and the anchor encoding
(LongPPL: tests/test_longppl_follows_the_reference.py)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from evalkit import ppl
from evalkit.engines import hf
from evalkit.engines.hf import HFEngine
from evalkit.models.refs import resolve_checkpoints
from evalkit.sweep.pipeline import run_benchmark
from tests.sweep.helpers import SHIPPED_ANCHOR, SHIPPED_FULL

TINY = Path(__file__).resolve().parents[1] / "evalkit" / "checkpoints" / "tiny-base"


def _reference(path: Path, texts: list[str], length: int) -> tuple[float, int, dict[int, list[float]]]:
    """(perplexity, documents used, position -> each used document's loss there), written out by
    hand: one forward over the document's first `length` tokens, BOS first if the tokenizer has one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    total, count, used, losses = 0.0, 0, 0, {}
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id, *ids]
        if len(ids) < length:
            continue
        x = torch.tensor([ids[:length]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=x).logits[0].double(), dim=-1)
        nll = -logprobs[torch.arange(length - 1), x[0, 1:]]
        total, count, used = total + float(nll.sum()), count + length - 1, used + 1
        for position, value in enumerate(nll.tolist(), start=1):
            losses.setdefault(position, []).append(value)
    return math.exp(total / count), used, losses


def _data(tmp_path: Path, sizes: tuple[int, ...]) -> tuple[Path, list[str]]:
    """A JSONL of built-in prose documents of about `sizes` characters each (different lengths)."""
    prose = "\n\n".join(ppl.builtin_documents())
    texts, start = [], 0
    for size in sizes:
        texts.append(prose[start : start + size])
        start += size
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, texts


def _run(checkpoint: Path, data: Path, out: Path, lengths: list[int], shard=None, dtype: str | None = "fp32", **more):
    """dtype=None for a run with a precision record: it is served as it trained."""
    settings = ppl.PplSettings(lengths=lengths, data=str(data), docs=10, dtype=dtype, batch_size=2, **more)
    return run_benchmark(ppl.PplBenchmark(settings), resolve_checkpoints([str(checkpoint)]), out, shard=shard)


def _values(run, metric: str = "perplexity") -> dict[int, tuple[float, int]]:
    return {row.length: (row.value, row.n) for row in run.result_rows() if row.metric == metric}


def test_tiny_model_equals_a_plain_forward_at_each_length_and_buckets_add_up(tmp_path):
    data, texts = _data(tmp_path, (900, 2500, 5000))
    lengths = [128, 512, 1024, 4096]
    run = _run(TINY, data, tmp_path / "out", lengths)
    values = _values(run)
    for length in lengths[:3]:
        expected, used, losses = _reference(TINY, texts, length)
        assert values[length][1] == used and used >= 1
        assert values[length][0] == pytest.approx(expected, rel=1e-4)
        detail = run.summaries[0]["lengths"][str(length)]
        assert detail["documents_used"] == used and detail["documents_read"] == 3
        for label, mean in detail["position_loss"].items():  # each bucket: the mean over its positions
            low, high = map(int, label.split("-"))
            by_hand = [v for p in range(low, min(high, length - 1) + 1) for v in losses[p]]
            assert mean == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-4)
    assert values[128][1] > values[1024][1]  # the shortest document is not used at 1K
    assert [s["length"] for s in run.skipped] == [4096] and "no document of the 3 reaches 4096" in run.skipped[0][
        "reason"
    ]
    log = tmp_path / "out" / "tiny-base" / "step-7000" / "ppl" / "ppl" / "512.jsonl"
    for record in map(json.loads, log.read_text().splitlines()):  # the buckets sum back to the total
        assert sum(nll for nll, _ in record["buckets"]) == pytest.approx(record["nll"], rel=1e-12)
        assert sum(tokens for _, tokens in record["buckets"]) == record["tokens"] == 511


def test_a_killed_run_resumes_computing_only_what_was_not_logged(tmp_path, monkeypatch):
    data, _ = _data(tmp_path, (3000, 3000, 3000, 3000))
    whole = _values(_run(TINY, data, tmp_path / "whole", [256, 512]))
    scored, real = [], HFEngine.token_logprobs

    def killed_on_the_third_batch(engine, rows):
        scored.append(len(rows))
        if len(scored) == 3:
            raise KeyboardInterrupt  # a kill: no Python error the pipeline would record
        return real(engine, rows)

    monkeypatch.setattr(HFEngine, "token_logprobs", killed_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        _run(TINY, data, tmp_path / "out", [256, 512])
    scored.clear()
    monkeypatch.setattr(HFEngine, "token_logprobs", lambda engine, rows: scored.append(len(rows)) or real(engine, rows))
    resumed = _values(_run(TINY, data, tmp_path / "out", [256, 512]))
    assert sum(scored) == 4  # 256 was done (4 documents); 512's first batch never finished: 4 left
    assert {n: (pytest.approx(v, rel=1e-6), used) for n, (v, used) in whole.items()} == resumed
    scored.clear()
    assert _values(_run(TINY, data, tmp_path / "out", [256, 512])) == resumed and scored == []


def test_smollm2_equals_a_plain_forward_at_each_length(tmp_path, smollm2):
    data, texts = _data(tmp_path, (1500, 6000))
    lengths = [256, 1024]
    values = _values(_run(smollm2, data, tmp_path / "out", lengths))
    for length in lengths:
        expected, used, _ = _reference(smollm2, texts, length)
        assert values[length] == (pytest.approx(expected, rel=1e-4), used)


def test_bad_data_is_one_line(tmp_path):
    from evalkit.errors import UserError

    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"title": "no text"}\n')
    with pytest.raises(UserError, match="line 2: not a JSON object with a string `text` field"):
        ppl.load_documents(str(tmp_path / "bad.jsonl"))
    with pytest.raises(UserError, match="no such file"):
        ppl.load_documents(str(tmp_path / "missing.jsonl"))


def test_compare_reads_perplexity_as_loss_lower_is_better(tmp_path):
    """compare pairs the runs' documents and says which way is better; its value is the mean over
    checkpoints of log(perplexity), as the summaries report it."""
    from evalkit.results.compare import compare
    from evalkit.results.compare_report import differences_table
    from evalkit.results.leaderboard import build_markdown
    from evalkit.results.samples import load_series

    data, _ = _data(tmp_path, (1500, 1500, 1500))
    full, anchor = SHIPPED_FULL.name, SHIPPED_ANCHOR.name
    rows = {}
    for run_path in (SHIPPED_FULL, SHIPPED_ANCHOR):
        run = _run(run_path, data, tmp_path / "out", [128, 256], dtype=None)
        rows[run_path.name] = {(r.step, r.length): r.value for r in run.result_rows()}
    series = load_series([str(tmp_path / "out")])
    comparison = compare(series, [full, anchor], replicates=200)
    assert {(d.length, d.metric) for d in comparison.differences} == {(128, "loss"), (256, "loss")}
    for d in comparison.differences:
        by_run = {
            name: statistics.fmean(math.log(v) for (_, n), v in values.items() if n == d.length)
            for name, values in rows.items()
        }
        assert d.baseline_value == pytest.approx(by_run[full], rel=1e-9)
        assert d.difference == pytest.approx(by_run[anchor] - by_run[full])
        assert d.pairing_detail.startswith("paired")
    assert "loss (lower is better)" in differences_table(comparison)
    board = build_markdown([tmp_path / "out"])[0]  # the leaderboard's own table, titled with the direction
    assert "## Perplexity (lower is better) (mean over checkpoints)\n" in board  # no stderr: ppl rows have none
    section = board.split("## Perplexity (lower is better)")[1].split("##")[0]
    anchor_line = next(line for line in section.splitlines() if line.startswith(f"| {anchor}"))
    mean_at_128 = statistics.fmean(v for (_, n), v in rows[anchor].items() if n == 128)
    assert f"{mean_at_128:.4f}" in anchor_line


def test_chunks_through_the_kv_cache_equal_one_forward_and_more_docs_reuse_the_logged(tmp_path, monkeypatch):
    """Chunks of 100 tokens (a small logit budget) give the plain forward's perplexity; a second
    run with one more document scores only that one (--docs is not part of a record's key)."""
    data, texts = _data(tmp_path, (2000, 2000, 2000))
    monkeypatch.setattr(hf, "LOGIT_BUDGET", 2 * 2048 * 100)  # batch 2 x vocab 2048 x 100 positions
    scored, real = [], HFEngine.token_logprobs
    monkeypatch.setattr(HFEngine, "token_logprobs", lambda engine, rows: scored.append(len(rows)) or real(engine, rows))
    settings = ppl.PplSettings(lengths=[512], data=str(data), docs=2, dtype="fp32", batch_size=2)
    refs = resolve_checkpoints([str(TINY)])
    run_benchmark(ppl.PplBenchmark(settings), refs, tmp_path / "out")
    settings.docs = 3
    run = run_benchmark(ppl.PplBenchmark(settings), refs, tmp_path / "out")
    assert scored == [2, 1]
    assert _values(run)[512] == (pytest.approx(_reference(TINY, texts, 512)[0], rel=1e-4), 3)


def test_data_from_a_text_file_a_saved_dataset_and_builtin(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "book.txt").write_text("one long document\n\nin two paragraphs")
    assert ppl.load_documents(str(tmp_path / "book.txt")) == ["one long document\n\nin two paragraphs"]
    datasets.Dataset.from_dict({"text": ["a", "b"], "id": [1, 2]}).save_to_disk(str(tmp_path / "saved"))
    assert ppl.load_documents(str(tmp_path / "saved")) == ["a", "b"]
    datasets.Dataset.from_dict({"body": ["a"]}).save_to_disk(str(tmp_path / "no-text"))
    with pytest.raises(Exception, match="has no `text` column"):
        ppl.load_documents(str(tmp_path / "no-text"))
    builtin = ppl.load_documents("builtin")
    assert len(builtin) >= 8 and all(len(doc) >= ppl.BUILTIN_DOC_CHARS for doc in builtin)


def test_an_edited_record_is_refused_and_one_without_a_checksum_is_computed_again(tmp_path):
    """Each logged document carries a sha256 of its content: a changed value is one line naming the
    file and line; a record without one (written before checksums) is never trusted, only redone."""
    from evalkit.errors import UserError

    data, _ = _data(tmp_path, (3000, 3000))
    first = _values(_run(TINY, data, tmp_path / "out", [256]))
    (log,) = (tmp_path / "out").rglob("256.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and all("sha" in r for r in records)
    edited = [{**records[0], "nll": records[0]["nll"] / 2}, records[1]]
    log.write_text("".join(json.dumps(r) + "\n" for r in edited))
    with pytest.raises(UserError, match=r"256\.jsonl:1 does not match its checksum"):
        _run(TINY, data, tmp_path / "out", [256])
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "sha"}) + "\n" for r in records))
    assert _values(_run(TINY, data, tmp_path / "out", [256])) == {256: (pytest.approx(first[256][0], rel=1e-6), 2)}
    assert len(log.read_text().splitlines()) == 4  # the two unsealed lines kept, two sealed ones added


# ---- --encoding anchor ----------------------------------------------------------------------------


def _anchor_reference(path: Path, row: list[int], doc_tokens: int, eos: int) -> list[float]:
    """Each scored token's log-probability under --encoding anchor, written out by hand: the row's
    tokens after the anchor (row[0], the BOS) in pieces of doc_tokens, piece k fed at positions
    1 + k * (doc_tokens + 1) onwards (each piece and its EOS), one plain causal forward of
    [anchor] + piece k + [EOS] per piece at those positions; a piece's first token read at the
    EOS closing the piece before (the first piece's at the anchor)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    content = row[1:]
    pieces = [content[start : start + doc_tokens] for start in range(0, len(content), doc_tokens)]
    scores, previous = [], None  # previous: the log-probabilities read at the EOS closing the piece before
    for k, piece in enumerate(pieces):
        first = 1 + k * (doc_tokens + 1)
        positions = [0, *range(first, first + len(piece) + 1)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[row[0], *piece, eos]]), position_ids=torch.tensor([positions]))
        logprobs = torch.log_softmax(logits.logits[0].double(), dim=-1)
        scores.append(float((logprobs[0] if previous is None else previous)[piece[0]]))
        scores += [float(logprobs[j][piece[j]]) for j in range(1, len(piece))]
        previous = logprobs[len(piece) + 1]
    return scores


def _check_anchor_against_reference(path: Path, monkeypatch, tolerance: float) -> None:
    """hf anchor scores, read through the KV cache in chunks of 50 tokens (crossing pieces), against
    _anchor_reference: every one of the L-1 tokens, the pieces' first among them, within `tolerance`
    per token (fp32; evalkit's attention against transformers' own) and the document's mean loss to 1e-5."""
    from evalkit.engines import get_engine

    with get_engine("hf", path, dtype="fp32", batch_size=2) as engine:
        vocab = engine.model.config.get_text_config().vocab_size
        monkeypatch.setattr(hf, "LOGIT_BUDGET", 2 * vocab * 50)  # batch 2 x vocab x 50 positions
        bos, eos = engine.tokenizer.bos_token_id, engine.tokenizer.eos_token_id
        assert bos is not None  # the reference takes the BOS as the anchor
        rows = [[bos, *range(10 + shift, 309 + shift)] for shift in (0, 700)]  # L = 300: pieces 64 x 4 + 43
        served = ppl.anchor_logprobs(engine, rows, 64)
    for row, scores in zip(rows, served):
        expected = _anchor_reference(path, row, 64, eos)
        assert len(scores) == len(expected) == 299
        assert max(abs(a - b) for a, b in zip(scores, expected)) < tolerance
        assert sum(scores) / 299 == pytest.approx(sum(expected) / 299, rel=1e-5)


def test_anchor_encoding_equals_a_plain_forward_of_the_anchor_and_each_piece(monkeypatch):
    _check_anchor_against_reference(TINY, monkeypatch, 1e-4)


def test_smollm2_anchor_encoding_equals_a_plain_forward_of_the_anchor_and_each_piece(smollm2, monkeypatch):
    # 30 layers of fp32 rounding in two attention implementations: up to 1.2e-4 per token measured
    _check_anchor_against_reference(smollm2, monkeypatch, 5e-4)


def test_anchor_layout_by_hand_with_and_without_a_bos():
    """Pieces of 2 after the anchor, each closed by EOS (3), positions running on; the scored tokens are
    document positions 1..L-1. Without a BOS the EOS is the anchor and token 0 opens the first piece, unscored."""
    from types import SimpleNamespace

    with_bos = SimpleNamespace(bos_token_id=2, eos_token_id=3)
    assert ppl.anchor_layout(with_bos, [2, 10, 11, 12, 13, 14], 2) == (
        [2, 10, 11, 3, 12, 13, 3, 14, 3],
        [0, 1, 1, 1, 2, 2, 2, 3, 3],
        [1, 2, 4, 5, 7],  # 10 11 | 12 13 | 14
    )
    without = SimpleNamespace(bos_token_id=None, eos_token_id=3)
    assert ppl.anchor_layout(without, [10, 11, 12, 13, 14], 2) == (
        [3, 10, 11, 3, 12, 13, 3, 14, 3],
        [0, 1, 1, 1, 2, 2, 2, 3, 3],
        [2, 4, 5, 7],  # 11 | 12 13 | 14: token 0 (10) is not scored, as in standard
    )


def test_anchor_with_one_piece_equals_standard_and_a_second_piece_changes_only_its_token():
    """doc_tokens >= L-1: one piece, [anchor] d EOS, d attending causally to itself and the anchor at
    positions 0..L-1 as in standard; the trailing EOS is seen by no scored token: the same scores
    (to float rounding: the packed path runs evalkit's attention). doc_tokens = L-2: the last token is
    a piece of its own, read at the EOS after the first: only its score changes."""
    from evalkit.engines import get_engine

    with get_engine("hf", TINY, dtype="fp32", batch_size=2) as engine:
        rows = [[engine.tokenizer.bos_token_id, *range(30 + shift, 229 + shift)] for shift in (0, 500)]  # L = 200
        standard = engine.token_logprobs(rows)
        for doc_tokens in (199, 512):
            anchor = ppl.anchor_logprobs(engine, rows, doc_tokens)
            assert [pytest.approx(s, abs=1e-5) for s in standard] == anchor
        split = ppl.anchor_logprobs(engine, rows, 198)
    for one, two in zip(standard, split):
        assert two[:-1] == [pytest.approx(s, abs=1e-5) for s in one[:-1]] and abs(two[-1] - one[-1]) > 1e-3


def test_bad_encoding_or_doc_tokens_is_one_line_and_leaves_no_output(tmp_path):
    import subprocess
    import sys

    for args, message in (
        (["--encoding", "anchr"], "--encoding must be one of standard, anchor, got 'anchr'"),
        (["--encoding", "anchor", "--doc-tokens", "0"], "--doc-tokens must be a positive number of tokens, got 0"),
    ):
        out = tmp_path / "out"
        result = subprocess.run(
            [sys.executable, "-m", "evalkit.cli", "ppl", str(TINY), "--lengths", "128", *args, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2 and not out.exists()
        assert result.stderr.strip().splitlines() == [f"error: {message}"] or (
            message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        ), result.stderr
        assert "Traceback" not in result.stderr


def test_both_encodings_into_one_out_are_one_summary_two_series_and_compare_pairs_them(tmp_path):
    """The CLI on the shipped tiny-long anchor run, standard then anchor into one --out: one summary
    per checkpoint holding both (the anchor records under their own key in the same log), the
    leaderboard's ppl table and --avg with the two as separate series, and compare pairing anchor
    against standard per length by checkpoint and document; standard again keeps the anchor cells."""
    import subprocess
    import sys

    from evalkit.results.compare import compare
    from evalkit.results.leaderboard import build_markdown
    from evalkit.results.samples import load_series

    data, _ = _data(tmp_path, (1500, 1500, 1500))
    run = SHIPPED_ANCHOR
    out = tmp_path / "out"
    common = ["--lengths", "128,256", "--data", str(data), "--docs", "3", "--out", str(out)]  # served as trained
    for encoding in ("standard", "anchor", "standard"):  # the third: all read back, nothing dropped
        cli = [sys.executable, "-m", "evalkit.cli", "ppl", str(run), "--encoding", encoding, "--doc-tokens", "50"]
        result = subprocess.run([*cli, *common, "--avg"], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
    anchor = f"{run.name} [anchor, 50-token docs]"
    for step in (550, 600):
        summary = json.loads((out / run.name / f"step-{step}" / "ppl-summary.json").read_text())
        cells = sorted((r["length"], r.get("encoding"), r.get("doc_tokens")) for r in summary["rows"])
        assert cells == [(128, "anchor", 50), (128, "standard", None), (256, "anchor", 50), (256, "standard", None)]
        assert set(summary["lengths"]) == {"128", "256", "128@anchor-50", "256@anchor-50"}
        log = out / run.name / f"step-{step}" / "ppl" / "ppl" / "256.jsonl"
        assert len({json.loads(line)["key"] for line in log.read_text().splitlines()}) == 2
    averages = json.loads((out / "ppl-avg.json").read_text())
    assert {r["run"] for r in averages["averages"]} == {run.name, anchor}
    section = build_markdown([out])[0].split("## Perplexity (lower is better)")[1].split("##")[0]
    assert [line.split(" | ")[0] for line in section.splitlines() if line.startswith(f"| {run.name}")] == [
        f"| {run.name}",
        f"| {anchor}",
    ]
    series = load_series([str(out)])
    comparison = compare(series, [run.name, anchor], replicates=200)
    assert {(d.baseline, d.other, d.length) for d in comparison.differences} == {
        (run.name, anchor, 128),
        (run.name, anchor, 256),
    }
    assert all(d.pairing == "checkpoints+samples" for d in comparison.differences)


def test_a_record_appended_after_a_killed_runs_torn_line_is_read_back(tmp_path):
    """A kill can tear the last line of a shared log (ppl's, never rewritten): the next run's first
    record must start a line of its own, not continue the torn one and be lost to every later read."""
    from evalkit.store.sample_log import SampleLog

    path = tmp_path / "1024.jsonl"
    path.write_text('{"doc": 0, "text_sha": "ab')  # a kill mid-line

    def opened() -> SampleLog:
        return SampleLog(path, "k", identify=lambda record: record.get("doc"), shared=True)

    opened().append([{"doc": 1, "loss": 2.5}])
    assert {doc: record["loss"] for doc, record in opened().records.items()} == {1: 2.5}
    assert path.read_text().startswith('{"doc": 0, "text_sha": "ab\n')  # the torn line is kept, not rewritten


@pytest.mark.parametrize("damage", ["edited", "missing"])
def test_compare_refuses_a_damaged_or_missing_perplexity_log_in_one_line(tmp_path, damage):
    """compare's documents come from the log: an edited record or a lost log is an error naming the file."""
    from evalkit.errors import UserError
    from evalkit.results.samples import load_series

    data, _ = _data(tmp_path, (1500, 1500))
    _run(SHIPPED_FULL, data, tmp_path / "out", [128], dtype=None)
    log = sorted((tmp_path / "out").rglob("ppl/ppl/128.jsonl"))[0]
    if damage == "missing":
        log.unlink()
    else:
        lines = log.read_text().splitlines()
        record = json.loads(lines[0])
        record["nll"] += 1.0
        log.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    with pytest.raises(UserError, match="is missing" if damage == "missing" else "does not match its checksum") as err:
        load_series([str(tmp_path / "out")])
    assert str(log) in str(err.value)
