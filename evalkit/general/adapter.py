"""lm-evaluation-harness's model interface (`lm_eval.api.model.LM`) over an evalkit engine. Every request
of a call is checked against the window before anything is computed (RequestsExceedWindow), where lm-eval's
HF model would drop a context's start (--too-long: docs/general.md). Import lazily: it derives from lm_eval's LM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lm_eval.api.model import LM

from evalkit.engines import Engine
from evalkit.engines import tokens as tok
from evalkit.general.errors import RequestsExceedWindow, TaskCannotRun

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF model default, for tasks whose YAML sets no limit
REQUESTS_PER_CALL = 512  # requests per engine call: the unit of progress reports (the engine batches within it)


class EngineLM(LM):
    def __init__(self, engine: Engine, truncate_middle: bool = False) -> None:
        super().__init__()
        self.engine = engine
        # (request type, requests done, requests total); the runner sets it per task
        self.progress: Callable[[str, int, int], None] = lambda _kind, _done, _total: None
        self.truncate_middle = truncate_middle
        # --too-long middle: per lm-eval task, the documents whose generation prompt was cut, and all seen.
        self.cut: dict[str, set[int]] = {}
        self.seen: dict[str, set[int]] = {}

    # lm-eval reads these to record tokenizer facts in its result JSON.
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def eot_token_id(self) -> int | None:
        return self.engine.tokenizer.eos_token_id

    def get_model_info(self) -> dict[str, Any]:
        """Merged into the `config` of lm-eval's result JSON: what scored the task."""
        return {"evalkit_engine": self.engine.engine_info()}

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        # Split once, with the same rule every evalkit engine uses (tokens.encode_pair), so the
        # window check below sees exactly the tokens the engine will feed.
        encoded = [tok.encode_pair(self.engine.tokenizer, *request.args) for request in requests]
        fed = [len(context) + len(continuation) - 1 for context, continuation in encoded]  # the last is only predicted
        _refuse_overflow("loglikelihood", fed, self.engine.max_length, requests)
        order = sorted(range(len(encoded)), key=lambda i: -fed[i])  # similar lengths share engine batches
        results: list[tuple[float, bool]] = [(0.0, True)] * len(encoded)
        for start in range(0, len(order), REQUESTS_PER_CALL):
            chunk = order[start : start + REQUESTS_PER_CALL]
            scores = self.engine.loglikelihood_tokens([encoded[i] for i in chunk])
            for i, (logprob, greedy) in zip(chunk, scores):
                results[i] = (float(logprob), bool(greedy))
            self.progress("loglikelihood", start + len(chunk), len(order))
        return results

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        # The engine cuts long texts into windows that score every token once: nothing to refuse.
        texts = [request.args[0] for request in requests]
        results: list[float] = []
        for start in range(0, len(texts), REQUESTS_PER_CALL):
            results.extend(map(float, self.engine.loglikelihood_rolling(texts[start : start + REQUESTS_PER_CALL])))
            self.progress("loglikelihood_rolling", len(results), len(texts))
        return results

    def generate_until(self, requests: list[Any]) -> list[str]:
        settings = [_greedy_settings(request.args[1]) for request in requests]
        # Tokenized once, here, as the engine would (engine.encode): it feeds ids as given.
        prompts = [self.engine.encode(request.args[0]) for request in requests]
        if self.truncate_middle:
            prompts = [self._cut_middle(p, max_new, r) for p, (_stop, max_new), r in zip(prompts, settings, requests)]
        needed = [len(p) + max_new for p, (_stop, max_new) in zip(prompts, settings)]
        _refuse_overflow("generate_until", needed, self.engine.max_length, requests)
        outputs = [""] * len(prompts)
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}  # one engine call serves one setting
        for i, setting in enumerate(settings):
            groups.setdefault(setting, []).append(i)
        done = 0
        for (stop, max_new_tokens), indices in groups.items():
            indices.sort(key=lambda i: -needed[i])
            for start in range(0, len(indices), REQUESTS_PER_CALL):
                chunk = indices[start : start + REQUESTS_PER_CALL]
                texts = self.engine.generate([prompts[i] for i in chunk], max_new_tokens, stop=list(stop))
                for i, text in zip(chunk, texts):
                    outputs[i] = text
                done += len(chunk)
                self.progress("generate_until", done, len(prompts))
        return outputs

    def _cut_middle(self, ids: list[int], max_new_tokens: int, request: Any) -> list[int]:
        """The prompt's ids without their middle when they and the budget exceed the window
        (LongBench's truncation: the first and the last half of what fits)."""
        task, doc_id = request.task_name, request.doc_id
        if task is not None and doc_id is not None:
            self.seen.setdefault(task, set()).add(doc_id)
        room = self.engine.max_length - max_new_tokens
        if len(ids) <= room or room < 2:  # fits, or cannot fit at all (then refused below, as without the option)
            return ids
        if task is not None and doc_id is not None:
            self.cut.setdefault(task, set()).add(doc_id)
        head = room // 2
        return ids[:head] + ids[len(ids) - (room - head) :]


def _refuse_overflow(request_type: str, needed: list[int], window: int, requests: Sequence[Any]) -> None:
    """RequestsExceedWindow if any request needs more than `window` tokens, naming every request's
    (task, document) and those of the requests that do not fit."""
    too_long = [n for n in needed if n > window]
    if not too_long:
        return
    documents: dict[str, set[int]] = {}
    over: dict[str, set[int]] = {}
    for request, tokens in zip(requests, needed):
        if request.task_name is None or request.doc_id is None:
            continue
        documents.setdefault(request.task_name, set()).add(request.doc_id)
        if tokens > window:
            over.setdefault(request.task_name, set()).add(request.doc_id)
    raise RequestsExceedWindow(request_type, len(too_long), len(needed), max(too_long), window, documents, over)


def _greedy_settings(gen_kwargs: dict) -> tuple[tuple[str, ...], int]:
    """(stop strings, max new tokens) of one generate_until request; sampling is refused."""
    from lm_eval.models.utils import normalize_gen_kwargs

    # lm-eval's own normalisation: max_gen_toks and its aliases, do_sample implied by temperature.
    kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), DEFAULT_MAX_GEN_TOKS)
    if kwargs.get("do_sample"):
        raise TaskCannotRun(
            f"the task samples (generation settings {dict(gen_kwargs)}); evalkit's engines decode greedily only"
        )
    stop = tuple(s for s in kwargs["until"] if s)
    return stop, int(kwargs["max_gen_toks"])
