"""A third engine is the Engine interface and nothing else: PlainEngine, written here over plain
transformers (no KV cache of evalkit's, no batching), registered under a name of its own, runs
ruler, general and ppl through their normal pipelines with no other change, and scores what the
hf engine scores (an independent implementation of the same model: same answers, same accuracy,
the same perplexity to float rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import evalkit.engines
from evalkit.engines import Engine
from evalkit.engines import tokens as tok
from evalkit.engines.base import context_window
from evalkit.models.refs import resolve_checkpoints

TINY = Path(__file__).resolve().parents[2] / "evalkit" / "checkpoints" / "tiny-base"


class PlainEngine(Engine):
    """Greedy generation and scoring with one unpadded transformers forward per row, in fp32."""

    name = "plain"

    def __init__(
        self, model_path, *, dtype: str | None = None, batch_size: int = 1, max_length: int | None = None
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = Path(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.max_length = context_window(self.model.config, max_length)

    def engine_info(self) -> dict:
        from evalkit.corpus import tokenizer_fingerprint

        return {
            "engine": self.name,
            "model_path": str(self.model_path),
            "dtype": "fp32",
            "max_length": self.max_length,
            "tokenizer_fingerprint": tokenizer_fingerprint(self.tokenizer),
        }

    @torch.no_grad()
    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), V]: log P(next token | ids[:p + 1]) at each position p."""
        return torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)

    @torch.no_grad()
    def _generate_tokens(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[str]:
        texts = []
        for ids in prompts:
            eos = self.tokenizer.eos_token_id
            out = self.model.generate(
                torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )[0, len(ids) :].tolist()
            new = out[: out.index(eos)] if eos in out else out
            texts.append(tok.cut_at_stop(self.tokenizer.decode(new, skip_special_tokens=True), stop))
        return texts

    def _score_tokens(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        scores = []
        for context, continuation in requests:
            logprobs = self._logprobs(context + continuation[:-1])[len(context) - 1 :]
            target = torch.tensor(continuation)
            total = float(logprobs.gather(-1, target[:, None]).sum())
            scores.append((total, bool((logprobs.argmax(-1) == target).all())))
        return scores

    def token_logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        return [self._logprobs(row)[:-1].gather(-1, torch.tensor(row[1:])[:, None])[:, 0].tolist() for row in rows]


@pytest.fixture
def plain_engine(monkeypatch):
    """The engine registered as `plain`, as an engine module of evalkit's would be."""
    monkeypatch.setitem(evalkit.engines._ENGINES, "plain", (__name__, "PlainEngine", None, ""))


def _by_engine(run_with) -> dict[str, object]:
    return {engine: run_with(engine) for engine in ("plain", "hf")}


def test_ruler_with_a_new_engine(plain_engine, tmp_path):
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import run_benchmark

    def run(engine: str):
        tasks = ["niah_single_1", "niah_multikey_1"]
        settings = RulerSettings(tasks=tasks, lengths=[512], num_samples=2, engine=engine)
        settings.dtype = "fp32"
        return run_benchmark(RulerBenchmark(settings), resolve_checkpoints([str(TINY)]), tmp_path / engine)

    runs = _by_engine(run)
    assert runs["plain"].summaries[0]["provenance"]["engine"]["engine"] == "plain"
    logs = {engine: sorted((tmp_path / engine).rglob("*.jsonl")) for engine in runs}
    answers = {e: [line for f in files for line in f.read_text().splitlines()] for e, files in logs.items()}
    assert len(answers["plain"]) == 4
    for plain, hf in zip(answers["plain"], answers["hf"], strict=True):  # the same greedy answer per sample
        assert _answer(plain) == _answer(hf)
    scores = {e: [(r.task, r.value) for r in run.result_rows()] for e, run in runs.items()}
    assert len(scores["plain"]) == 2 and scores["plain"] == scores["hf"]


def _answer(line: str) -> str:
    import json

    return json.loads(line)["prediction"]


def test_general_with_a_new_engine(plain_engine, tmp_path):
    pytest.importorskip("lm_eval")
    from evalkit.general import GeneralBenchmark, GeneralSettings
    from evalkit.sweep.pipeline import run_benchmark

    tasks = ["evalkit_fixture_mmlu_style", "evalkit_fixture_hellaswag_style"]
    refs = resolve_checkpoints([str(TINY)])
    runs = _by_engine(
        lambda e: run_benchmark(
            GeneralBenchmark(GeneralSettings(tasks, engine=e, engine_settings={"dtype": "fp32"})), refs, tmp_path / e
        )
    )
    values = {e: {(r.task, r.metric): r.value for r in run.result_rows()} for e, run in runs.items()}
    assert len(values["plain"]) == 6 and values["plain"].keys() == values["hf"].keys()
    assert values["plain"] == {key: pytest.approx(value, abs=1e-6) for key, value in values["hf"].items()}


def test_ppl_with_a_new_engine(plain_engine, tmp_path):
    from evalkit import ppl
    from evalkit.sweep.pipeline import run_benchmark

    def run(engine: str):
        settings = ppl.PplSettings(lengths=[128, 512], docs=3, engine=engine, dtype="fp32", batch_size=2)
        return run_benchmark(ppl.PplBenchmark(settings), resolve_checkpoints([str(TINY)]), tmp_path / engine)

    runs = _by_engine(run)
    values = {e: {(r.length, r.metric): r.value for r in run.result_rows()} for e, run in runs.items()}
    assert sorted(values["plain"]) == [(128, "perplexity"), (512, "perplexity")]
    assert values["plain"] == {key: pytest.approx(value, rel=1e-5) for key, value in values["hf"].items()}


def test_a_new_engine_without_packed_requests_is_refused_the_anchor_encoding_before_any_load(plain_engine, tmp_path):
    from evalkit import ppl
    from evalkit.errors import UserError
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import run_benchmark

    refs = resolve_checkpoints([str(TINY)])
    anchor = {"lengths": [128], "engine": "plain", "encoding": "anchor", "doc_tokens": 64}
    for benchmark in (ppl.PplBenchmark(ppl.PplSettings(**anchor)), RulerBenchmark(RulerSettings(**anchor))):
        with pytest.raises(UserError, match=r"the plain engine cannot run packed requests \(--encoding anchor\)"):
            run_benchmark(benchmark, refs, tmp_path / "out")
        assert not (tmp_path / "out").exists()
