"""The interface every inference engine offers, and the policy all of them share: what they feed
(tokens.py), and a request that does not fit the window is an error naming the lengths, never a
silent truncation. A subclass implements only the token-level work (`_generate_tokens`,
`_score_tokens`, `token_logprobs`) and `engine_info`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from evalkit.attention.anchor import anchor_token_id
from evalkit.engines import tokens as tok
from evalkit.errors import UserError
from evalkit.lengths import check_max_length

if TYPE_CHECKING:
    from evalkit.models.precision import Serving

# What every engine's engine_info() holds that it resolved and that decides an answer: results made
# under other values of these are other results (the rest of an info says how it ran).
RESULT_FACTS = ("engine", "model_path", "dtype", "max_length", "tokenizer_fingerprint")

Prompt = str | Sequence[int]


def context_window(config, max_length: int | None) -> int:
    """The engine's window: the max_length setting, else the model's max_position_embeddings."""
    if max_length is not None:
        check_max_length(max_length, "max_length")
        return max_length
    trained = getattr(config.get_text_config(), "max_position_embeddings", None)
    if trained is None:
        raise UserError("the model config has no max_position_embeddings: set max_length")
    return int(trained)


def check_at_least_one(settings: dict[str, Any], *names: str) -> None:
    """A UserError for a count setting below 1 (None: not given)."""
    for name in names:
        value = settings.get(name)
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")


def check_one_of(settings: dict[str, Any], name: str, choices: Collection[str]) -> None:
    """A UserError for a setting outside its choices (None: not given)."""
    value = settings.get(name)
    if value is not None and value not in choices:
        raise UserError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


@dataclass
class PackedRequest:
    """Documents behind one shared anchor, then a question: text (no special tokens added) or ids, laid
    out as tokens.PackedLayout. In the prefill each document attends to itself and the anchor only;
    the question and all generated tokens attend to everything (the anchor paradigm at inference)."""

    documents: Sequence[Prompt]
    question: Prompt


class Engine(ABC):
    """Greedy generation and log-likelihoods over one model; see the module docstring."""

    name: ClassVar[str]
    tokenizer: Any  # a transformers tokenizer: the one whose ids the engine feeds
    max_length: int  # the window: prompt + generated tokens (or fed scoring tokens) must fit in it
    served: Serving  # the dtype and RoPE regime it serves the checkpoint in (models.precision.served_regime)

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> None:  # noqa: B027  (a hook, empty by default)
        """Refuse (UserError) a setting's value no checkpoint could run with (None: not given), before
        any is loaded: a bad setting is the user's error, said once, not every checkpoint's failure.
        get_engine asks it before the constructor, which can then take its settings as valid."""

    @abstractmethod
    def engine_info(self) -> dict[str, Any]:
        """Facts a result must record: engine, dtype, batch size, max length, attention, device,
        model path, tokenizer fingerprint."""

    @abstractmethod
    def _generate_tokens(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[str]:
        """Greedy continuations of prompts already checked to fit, cut at EOS or the first stop string."""

    @abstractmethod
    def _score_tokens(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), every continuation token is the argmax) per
        (context ids, continuation ids); context + continuation minus its last token fits."""

    @abstractmethod
    def token_logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        """log P(row[p] | row[:p]), p = 1..L-1, of each row (one length L <= max_length) in float32 (evalkit.ppl);
        a PackedEngine's takes doc_ids too (tokens.PackedLayout's): a token sees the anchor and its document."""

    def position_logprobs(self, tokens: list[int]) -> Any:
        """Next-token log-probabilities [T, V] (a float32 torch tensor on the CPU) of one row: row t
        is the distribution after tokens[: t + 1] (evalkit parity)."""
        raise UserError(f"the {self.name} engine gives no whole next-token distributions, which evalkit parity reads")

    def close(self) -> None:  # a hook: most engines hold nothing that outlives them
        """Release what outlives the object (processes, device memory); the engine is unusable after."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info) -> None:
        """`with get_engine(...) as engine:` closes it however the block ends (a second vLLM engine
        would not fit beside the first on one GPU, and its processes would outlive a failed run)."""
        self.close()

    def encode(self, prompt: Prompt) -> list[int]:
        """The token ids the engine feeds for `prompt`: text gets the tokenizer's specials (BOS), ids are kept."""
        return tok.encode_prompt(self.tokenizer, prompt)

    def decode(self, token_ids: list[int]) -> str:
        """The text of generated ids, special tokens left out, spacing as the tokenizer produced it."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def count_tokens(self, prompt: Prompt) -> int:
        """len(encode(prompt)): what RULER sizes its samples with."""
        return len(self.encode(prompt))

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int, stop: list[str] | None = None) -> list[str]:
        """Greedy continuation of each prompt, ended by EOS, a stop string (cut off) or max_new_tokens.
        A prompt whose length + max_new_tokens exceeds max_length is a UserError naming the lengths."""
        check_max_new_tokens(max_new_tokens)
        encoded = [self._checked_prompt(self.encode(p), max_new_tokens) for p in prompts]
        return self._generate_tokens(encoded, max_new_tokens, list(stop or []))

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) per pair, as lm-eval defines them, split into
        tokens by tokens.encode_pair."""
        return self.loglikelihood_tokens([tok.encode_pair(self.tokenizer, *pair) for pair in pairs])

    def loglikelihood_tokens(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation ids | context ids), every continuation token is the argmax).
        A request needing more than max_length tokens of input is a UserError naming the lengths
        (lm-eval would silently drop the start of the context).
        An empty continuation scores (0.0, True): log p(nothing) = 0."""
        pairs = [([int(t) for t in context], [int(t) for t in continuation]) for context, continuation in requests]
        for context, continuation in pairs:
            self._check_pair(context, continuation)
        scores = iter(self._score_tokens([pair for pair in pairs if pair[1]]))
        return [next(scores) if continuation else (0.0, True) for _, continuation in pairs]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Total log-likelihood of each text, every token scored once, in windows of max_length
        (tokens.rolling_windows): nothing is truncated."""
        prefix = anchor_token_id(self.tokenizer)  # what conditions a text's first token
        windows_per_text = [
            tok.rolling_windows(tok.encode_prompt(self.tokenizer, text, specials=False), prefix, self.max_length)
            for text in texts
        ]
        flat = [window for windows in windows_per_text for window in windows]
        scores = iter(self._score_tokens(flat))
        return [sum(next(scores)[0] for _ in windows) for windows in windows_per_text]

    def _checked_prompt(self, ids: list[int], max_new_tokens: int) -> list[int]:
        if not ids:
            raise UserError(
                "empty prompt: no token to condition on (text gets a BOS only where the tokenizer adds one)"
            )
        if len(ids) + max_new_tokens > self.max_length:
            raise UserError(
                f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens = {len(ids) + max_new_tokens} exceeds "
                f"the model window of {self.max_length} tokens; shorten the prompt or set max_length "
                "(evalkit never truncates silently)"
            )
        return ids

    def _check_pair(self, context: list[int], continuation: list[int]) -> None:
        if not context:
            raise ValueError("a loglikelihood request needs at least one context token to condition on")
        fed = len(context) + len(continuation) - 1  # the last continuation token is predicted, never fed
        if fed > self.max_length:
            raise UserError(
                f"context of {len(context)} tokens + continuation of {len(continuation)} tokens needs {fed} tokens "
                f"of input, more than the model window of {self.max_length}; shorten it or set max_length "
                "(evalkit never truncates silently)"
            )


class PackedEngine(Engine):
    """An engine that can also run the anchor paradigm's packed multi-document requests."""

    def generate_packed(
        self, requests: Sequence[PackedRequest], max_new_tokens: int, stop: list[str] | None = None
    ) -> list[str]:
        """Greedy answers to packed requests (PackedRequest describes the attention pattern); one whose
        tokens + max_new_tokens exceed max_length is a UserError naming the lengths."""
        check_max_new_tokens(max_new_tokens)
        layouts = [self._checked_layout(request, max_new_tokens) for request in requests]
        return self._generate_layouts(layouts, max_new_tokens, list(stop or []))

    @abstractmethod
    def _generate_layouts(self, layouts: list[tok.PackedLayout], max_new_tokens: int, stop: list[str]) -> list[str]:
        """generate_packed for layouts already checked to fit."""

    def _checked_layout(self, request: PackedRequest, max_new_tokens: int) -> tok.PackedLayout:
        """The request's token layout; a UserError naming the lengths when it does not fit the window."""
        layout = tok.packed_layout(self.tokenizer, request.documents, request.question)
        total = len(layout.input_ids) + max_new_tokens
        if total > self.max_length:
            raise UserError(
                f"packed request of {len(layout.input_ids)} tokens ({layout.num_document_tokens} for the anchor and "
                f"{len(request.documents)} documents, {len(layout.question_ids)} for the question) + {max_new_tokens} "
                f"new tokens = {total} exceeds the model window of {self.max_length} tokens"
            )
        return layout

    @abstractmethod
    def logits_packed(self, requests: Sequence[PackedRequest]) -> Any:
        """Float32 next-token log-probabilities [N, vocab] (a torch tensor on the CPU) after each
        request's last question token: log-softmaxed logits, the same quantity from every engine."""

    @abstractmethod
    def token_logprobs(self, rows: list[list[int]], doc_ids: list[list[int]] | None = None) -> list[list[float]]:
        """Engine.token_logprobs, with `doc_ids` as it describes."""
