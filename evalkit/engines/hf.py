"""The transformers engine: a local checkpoint, batched greedy decoding with a KV cache.

Shapes: B rows in a batch, S tokens fed in one forward, C cache slots (every token fed so far,
padding included), V vocabulary.

Plain prompts (and log-likelihood requests) are prefilled one of two ways (setting `prefill`):

- "shared": prompts sorted as token sequences (docs/ruler.md), each row prefilled alone, unpadded,
  from the K/V of the prefix it shares with the row before. A row alone needs no attention mask
  (SDPA's fused causal kernel), and a query's attention and MLP do not depend on which forward
  computed which earlier keys, so the logits are those of the row alone (tested bit for bit in fp32).
- "padded": rows batched by length (longest first, so a batch too large for memory fails at
  once), LEFT-padded under an attention mask, one forward per batch.

"auto" (the default) is "shared" on CPU, where a padded batch's masked attention is the slow
path (1.7x the time of the same rows alone, SmolLM2-135M at 4K), and on CUDA when prompts
average 1,024 tokens or more (one such row already fills the GPU); else "padded". Models whose
cache is not plain full attention (sliding windows, linear attention) always take "padded".

Generation then decodes LEFT-padded, position ids counting only real tokens, so a padded row
computes what it would alone; finished rows leave the batch and cache (_greedy_decode).

Packed requests (base.PackedRequest) take two forwards before decoding: the anchor and documents
under evalkit's document attention, filling the KV cache; then the question under plain causal
attention over that cache. Rows are right-padded in the first forward (_prefill_documents) and
left-padded in the second, so the cache has holes that every later step's attention mask hides.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evalkit.attention import HF_NAMES, PAD_DOC_ID, register_hf_attention
from evalkit.attention.anchor import anchor_record
from evalkit.attention.features import check_attention_supported, trained_window_anchor, windows_shorter_than
from evalkit.attention.hf import (
    GROUPED_SDPA,
    cast_buffers,
    register_anchor_sink_sdpa,
    register_grouped_sdpa,
    set_rope_precision,
)
from evalkit.corpus import tokenizer_fingerprint
from evalkit.engines import tokens as tok
from evalkit.engines.base import (
    PackedEngine,
    PackedRequest,
    check_at_least_one,
    check_one_of,
    context_window,
)
from evalkit.errors import UserError
from evalkit.models.check import check_checkpoint, checkpoint_directory, load_pretrained, load_tokenizer
from evalkit.models.precision import SERVINGS, Serving, resolve_device, served_regime, torch_dtype

LOGPROB_CHUNK = 1024  # positions per log-softmax: bounds the float32 copy of [positions, V] logits
LOGIT_BUDGET = 2**26  # floats of one token_logprobs chunk's logits (B x chunk x V): 256 MiB in fp32
PREFILL_MODES = ("auto", "shared", "padded")
SHARED_PREFILL_MIN_MEAN_LENGTH_ON_CUDA = 1024


@dataclass
class GenerationStats:
    """What plain generation has cost so far: prompt tokens, how many were computed, and time."""

    prompts: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens run through the model: the rest came from a shared prefix
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


@dataclass
class _PrefilledRow:
    """The last row prefilled alone: its ids and per-layer K/V [1, kv heads, len(ids), head dim]."""

    ids: list[int] = field(default_factory=list)
    keys_values: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class _DecodeState:
    """A batch ready for its next greedy token."""

    cache: Any  # transformers Cache holding the K/V of every slot fed so far
    attention_mask: torch.Tensor  # long [B, C]: 1 where a cache slot holds a real token
    next_positions: torch.Tensor  # long [B]: position id the next token of each row will have
    logits: torch.Tensor  # [B, V]: the distribution of each row's next token

    def select(self, rows: list[int]) -> _DecodeState:
        index = torch.tensor(rows, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)  # in place: the rows we drop are freed
        return _DecodeState(self.cache, self.attention_mask[index], self.next_positions[index], self.logits[index])


@functools.cache
def _growing_layer_class():
    """A DynamicLayer whose K/V live in a buffer with room to grow (built lazily: transformers is imported late)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """Full-attention K/V in a buffer with `room` spare columns: a decoding step writes its new
        column in place, where DynamicLayer's torch.cat copies the whole cache every step (60% of a
        decoding step of SmolLM2-135M at 4K, batch 8, on CPU). `keys`/`values` are views of the
        filled part, so everything that reads them (attention, get_seq_length) is unchanged."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self.room = max(room, 1)
            self.length = keys.shape[-2]
            self._keys, self._values = self._buffer(keys), self._buffer(values)
            self._views()

        def _buffer(self, states: torch.Tensor) -> torch.Tensor:
            batch, heads, length, dim = states.shape
            buffer = states.new_empty(batch, heads, length + self.room, dim)
            buffer[:, :, :length] = states
            return buffer

        def _views(self) -> None:
            self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

        def update(self, key_states, value_states, *args, **kwargs):
            new = key_states.shape[-2]
            if self.length + new > self._keys.shape[-2]:  # out of room: one copy into a larger buffer
                self._keys, self._values = self._buffer(self.keys), self._buffer(self.values)
            self._keys[:, :, self.length : self.length + new] = key_states
            self._values[:, :, self.length : self.length + new] = value_states
            self.length += new
            self._views()
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()

    return GrowingLayer


class _StopWatcher:
    """Whether a row's text now contains a stop string, decoding only its last few tokens per step:
    a stop of n bytes that just completed lies within the last n tokens (every non-special token
    is at least one byte). A tail's first characters can decode mangled (half a UTF-8 character,
    a SentencePiece leading space), so a tail hit is confirmed on the full text; a stop the tail
    misses only costs extra tokens, as outputs are cut at the earliest stop of the full text.
    """

    def __init__(self, decode, stop: Sequence[str]):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.tail = max((len(s.encode()) for s in self.stop), default=0) + 4

    def hit(self, generated: list[int]) -> bool:
        return bool(self.stop) and self._has_stop(generated[-self.tail :]) and self._has_stop(generated)

    def _has_stop(self, token_ids: list[int]) -> bool:
        text = self.decode(token_ids)
        return any(s in text for s in self.stop)


def _computing(method):
    """Run an engine method under torch.inference_mode, with the engine's torch thread count (setting
    `threads`) restored after: several engines may share one process (python -m perf eval)."""

    @functools.wraps(method)
    @torch.inference_mode()
    def wrapper(self, *args, **kwargs):
        if self.threads is None:
            return method(self, *args, **kwargs)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return method(self, *args, **kwargs)
        finally:
            torch.set_num_threads(previous)

    return wrapper


class HFEngine(PackedEngine):
    """A transformers causal LM loaded from a local checkpoint directory (safetensors weights).

    Settings: dtype (models.precision.served_regime); batch_size (rows per forward); max_length
    (default config.max_position_embeddings, may be set above it to test length extrapolation);
    attention (transformers' implementation for plain prompts); packed_attention (evalkit's, for
    packed prefills); prefill (module docstring); threads (torch CPU threads while this engine
    computes, default one per core); serving (trained, the default, or stock: docs/training.md).
    """

    name = "hf"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str | None = None,
        device: str = "auto",
        batch_size: int = 8,
        max_length: int | None = None,
        attention: str = "sdpa",
        packed_attention: str = "evalkit",
        prefill: str = "auto",
        threads: int | None = None,
        serving: str = "trained",
        trust_remote_code: bool = False,
    ) -> None:
        self.model_path = checkpoint_directory(model_path, "the hf engine")
        # Before the tokenizer too: AutoTokenizer reads config.json and would fail with a traceback.
        check_checkpoint(self.model_path, trust_remote_code=trust_remote_code)
        self.device = resolve_device(device)
        self.served = served_regime(self.model_path, serving, dtype, str(self.device))
        self.dtype = self.served.dtype
        register_hf_attention()  # evalkit's implementations, which packed_attention names
        self.batch_size = batch_size
        self.threads = threads
        self.attention = attention
        self.packed_attention = packed_attention
        self.prefill = prefill
        self.stats = GenerationStats()
        self.tokenizer = load_tokenizer(self.model_path, trust_remote_code=trust_remote_code)
        self.model = load_model(self.model_path, self.served, self.device, attention, trust_remote_code)
        self.max_length = context_window(self.model.config, max_length)
        self.off_regime_kl = (
            off_regime_kl(self.model_path, self, self.device, attention, trust_remote_code)
            if self.served.off_regime
            else None
        )
        self._eos_ids = tok.end_of_generation_ids(self.tokenizer, self.model.config, self.model_path)
        # Any valid id will do: padded slots are masked out, never attended to.
        self._pad_id = next(
            int(v) for v in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0) if v is not None
        )
        # transformers renamed the model's `past_key_values` argument to `cache` during 5.x.
        forward_parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward_parameters else "past_key_values"
        self._fingerprint = tokenizer_fingerprint(self.tokenizer)
        from transformers.cache_utils import DynamicLayer

        # Only plain full-attention layers (K/V of every position, nothing else kept) can share a prefix.
        self._plain_cache = all(type(layer) is DynamicLayer for layer in self._new_cache().layers)
        # Sliding layers count their window in cache slots, which a packed batch's padding holes would
        # take: such models take packed requests one at a time (said once, and kept in engine_info).
        windows = windows_shorter_than(self.model.config, self.max_length)
        self._packed_one_by_one = bool(windows)
        self._packed_batch_note = (
            f"--batch-size {batch_size} taken as 1 for packed (anchor) requests: {len(windows)} sliding-window "
            f"layers (window {min(windows)} < {self.max_length} tokens) would count a batch's padding as window slots"
            if windows and batch_size > 1
            else None
        )
        self._packed_note_said = False
        # How the anchor meets those windows, as trained (meta.json): see _packed_reading.
        self.window_anchor = trained_window_anchor(self.model_path)
        self._sink_beyond_windows = self.window_anchor == "sink" and self._packed_one_by_one

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> None:
        check_at_least_one(settings, "batch_size", "threads")
        if settings.get("attention") is not None:
            _check_plain_attention(settings["attention"])
        check_one_of(settings, "packed_attention", HF_NAMES)
        check_one_of(settings, "prefill", PREFILL_MODES)
        check_one_of(settings, "serving", SERVINGS)

    def engine_info(self) -> dict[str, Any]:
        import transformers

        return {
            "engine": self.name,
            "model_path": str(self.model_path),
            "dtype": self.dtype,
            **self.served.record(),
            **({"off_regime_kl": self.off_regime_kl} if self.off_regime_kl is not None else {}),
            "batch_size": self.batch_size,
            "packed_batch_size": 1 if self._packed_one_by_one else self.batch_size,
            **({"packed_batch_note": self._packed_batch_note} if self._packed_batch_note else {}),
            "max_length": self.max_length,
            "attention": self.attention,
            "packed_attention": self.packed_attention,
            "window_anchor": self.window_anchor,  # the reading packed requests are served under (the checkpoint's)
            "prefill": self.prefill,
            "threads": self.threads or torch.get_num_threads(),
            "device": str(self.device),
            "tokenizer_fingerprint": self._fingerprint,
            "anchor_token": anchor_record(self.tokenizer),  # of packed requests (--encoding anchor)
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }

    @_computing
    def position_logprobs(self, tokens: list[int]) -> torch.Tensor:
        return model_logprobs(self.model, tokens, self.device)

    @_computing
    def _generate_tokens(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[str]:
        outputs: list[str] = [""] * len(prompts)
        shared = self._prefills_shared(prompts)
        # shared: sorted by ids, the chain of shared prefixes runs across batches
        batches = self._sorted_batches(prompts if shared else [-len(p) for p in prompts])
        last = _PrefilledRow()
        for batch in batches:
            started = time.perf_counter()
            if shared:
                state, last = self._prefill_rows([prompts[i] for i in batch], last)
            else:
                state = self._prefill([prompts[i] for i in batch])
            decoding = time.perf_counter()
            texts = self._greedy_decode(state, max_new_tokens, stop)
            self.stats.prefill_seconds += decoding - started
            self.stats.decode_seconds += time.perf_counter() - decoding
            for i, text in zip(batch, texts):
                outputs[i] = text
        return outputs

    def _prefills_shared(self, prompts: list[list[int]]) -> bool:
        if self.prefill != "auto" or not self._plain_cache:
            return self.prefill == "shared" and self._plain_cache
        if self.device.type == "cpu":
            return True
        return sum(len(p) for p in prompts) >= SHARED_PREFILL_MIN_MEAN_LENGTH_ON_CUDA * len(prompts)

    @_computing
    def _score_tokens(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        fed = [context + continuation[:-1] for context, continuation in requests]
        if self._prefills_shared(fed):
            return self._score_rows(fed, [continuation for _, continuation in requests])
        results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
        for batch in self._sorted_batches([-len(f) for f in fed]):
            input_ids, attention_mask, position_ids = self._left_padded([fed[i] for i in batch])
            # Left padding ends every row in the last column: the continuation's predictions are
            # the last len(continuation) logits of each row, so only those are computed.
            keep = max(len(requests[i][1]) for i in batch)
            logits_BKV = self._forward(input_ids, attention_mask, position_ids, logits_to_keep=keep)
            for row, i in enumerate(batch):
                continuation = requests[i][1]
                results[i] = _continuation_score(logits_BKV[row, keep - len(continuation) :], continuation)
        return results

    def _score_rows(self, fed: list[list[int]], continuations: list[list[int]]) -> list[tuple[float, bool]]:
        """Each request alone, from the prefix it shares with the one before in sorted order (the
        choices of one question share its context); the continuation's logits are always computed."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(fed)
        last = _PrefilledRow()
        for i in sorted(range(len(fed)), key=lambda i: fed[i]):
            logits, last = self._forward_after_shared_prefix(fed[i], last, len(continuations[i]))
            results[i] = _continuation_score(logits[0], continuations[i])
        return results

    def _prefill(self, prompts: list[list[int]]) -> _DecodeState:
        input_ids, attention_mask, position_ids = self._left_padded(prompts)
        cache = self._new_cache()
        logits = self._forward(input_ids, attention_mask, position_ids, cache=cache)[:, -1]
        self._count_prefill(prompts, sum(len(p) for p in prompts))
        return _DecodeState(cache, attention_mask, position_ids[:, -1] + 1, logits)

    def _prefill_rows(self, prompts: list[list[int]], last: _PrefilledRow) -> tuple[_DecodeState, _PrefilledRow]:
        """Each row alone from the prefix it shares with the row before; the K/V then left-padded into one batch."""
        width = max(len(p) for p in prompts)
        padded_kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer [B, kv heads, width, head dim]
        logits = []
        for row, ids in enumerate(prompts):
            row_logits, last = self._forward_after_shared_prefix(ids, last, 1)
            logits.append(row_logits[0, -1])
            if not padded_kv:
                rows = len(prompts)
                padded_kv = [
                    (k.new_zeros(rows, k.shape[1], width, k.shape[3]), v.new_zeros(rows, v.shape[1], width, v.shape[3]))
                    for k, v in last.keys_values
                ]
            for (keys, values), (row_keys, row_values) in zip(padded_kv, last.keys_values):
                keys[row, :, width - len(ids) :] = row_keys[0]
                values[row, :, width - len(ids) :] = row_values[0]
        cache = self._new_cache()
        for layer, (keys, values) in zip(cache.layers, padded_kv):
            layer.update(keys, values)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        attention_mask = (torch.arange(width, device=self.device)[None, :] >= width - lengths[:, None]).long()
        return _DecodeState(cache, attention_mask, lengths, torch.stack(logits)), last

    def _forward_after_shared_prefix(self, ids: list[int], last: _PrefilledRow, logits_to_keep: int):
        """Logits [1, logits_to_keep, V] of `ids` alone, unpadded, with the K/V of the prefix it shares
        with `last` taken from it (the last `logits_to_keep` tokens are always fed; `stats` counts what
        is fed); and `ids` as the new last row."""
        reused = min(len(os.path.commonprefix([last.ids, ids])), len(ids) - logits_to_keep)
        cache = self._new_cache()
        for layer, (keys, values) in zip(cache.layers, last.keys_values if reused else []):
            layer.update(keys[:, :, :reused], values[:, :, :reused])
        new_ids = torch.tensor([ids[reused:]], device=self.device)
        positions = torch.arange(reused, len(ids), device=self.device)[None]
        logits = self._forward(new_ids, None, positions, cache=cache, logits_to_keep=logits_to_keep)
        self._count_prefill([ids], len(ids) - reused)
        return logits, _PrefilledRow(ids, [(layer.keys, layer.values) for layer in cache.layers])

    def _count_prefill(self, prompts: list[list[int]], computed: int) -> None:
        self.stats.prompts += len(prompts)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.prefill_tokens += computed

    @_computing
    def _generate_layouts(self, layouts: list[tok.PackedLayout], max_new_tokens: int, stop: list[str]) -> list[str]:
        outputs: list[str] = [""] * len(layouts)
        for batch in self._packed_batches(layouts):
            with self._packed_reading():
                state = self._prefill_packed([layouts[i] for i in batch])
                for i, text in zip(batch, self._greedy_decode(state, max_new_tokens, stop)):
                    outputs[i] = text
        return outputs

    @_computing
    def logits_packed(self, requests: Sequence[PackedRequest]) -> torch.Tensor:
        layouts = [self._checked_layout(request, 0) for request in requests]
        logits: list[torch.Tensor] = [torch.empty(0)] * len(layouts)
        for batch in self._packed_batches(layouts):
            with self._packed_reading():
                state = self._prefill_packed([layouts[i] for i in batch])
            for row, i in enumerate(batch):
                logits[i] = state.logits[row].float().log_softmax(-1).cpu()  # as vLLM returns them
        return torch.stack(logits)

    @_computing
    def token_logprobs(self, rows: list[list[int]], doc_ids: list[list[int]] | None = None) -> list[list[float]]:
        """The rows as one unpadded batch, chunk by chunk through the KV cache (LOGIT_BUDGET's logits at a time)."""
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        batch, length = ids.shape
        chunk = max(16, LOGIT_BUDGET // (batch * self.model.config.get_text_config().vocab_size))
        docs = None if doc_ids is None else torch.tensor(doc_ids, dtype=torch.long, device=self.device)
        # evalkit's attention reads every key its doc ids name (and applies the windows itself): keep them all
        cache, scored = self._new_cache(every_key=docs is not None), []
        with nullcontext() if docs is None else self._attention_implementation(self.packed_attention):
            for start in range(0, length - 1, chunk):
                end = min(start + chunk, length - 1)  # the last token predicts nothing: never fed
                positions = torch.arange(start, end, device=self.device).expand(batch, -1)
                more = {} if docs is None else {"doc_ids": docs[:, :end], "window_anchor": self.window_anchor}
                logits = self._forward(ids[:, start:end], None, positions, cache=cache, logits_to_keep=0, **more)
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                scored.append(logprobs.gather(-1, ids[:, start + 1 : end + 1, None])[..., 0])
        return torch.cat(scored, dim=1).cpu().tolist()

    def _packed_batches(self, layouts: list[tok.PackedLayout]) -> list[list[int]]:
        """Batches of packed requests; refuses a model whose attention evalkit's cannot reproduce."""
        check_attention_supported(self.model.config, "packed (anchor) requests on the hf engine")
        if self._packed_batch_note is not None and not self._packed_note_said:
            print(self._packed_batch_note, file=sys.stderr)
            self._packed_note_said = True
        return self._sorted_batches([-len(layout.input_ids) for layout in layouts], self._packed_one_by_one)

    def _packed_reading(self) -> AbstractContextManager:
        """Under the sink reading on a windowed model, the question and decoded tokens see the anchor
        beyond the window too (attention.hf.register_anchor_sink_sdpa, over a cache that keeps it);
        the documents get it from evalkit's attention (window_anchor, _prefill_documents)."""
        if not self._sink_beyond_windows:
            return nullcontext()
        return self._attention_implementation(register_anchor_sink_sdpa())

    def _prefill_packed(self, layouts: list[tok.PackedLayout]) -> _DecodeState:
        """Documents under document attention, then the question under causal attention over all of them."""
        # A sliding layer's cache keeps only its window, the anchor gone: under the sink reading every key stays.
        cache = self._new_cache(every_key=self._sink_beyond_windows)
        self._prefill_documents(layouts, cache)
        document_lengths = torch.tensor([layout.num_document_tokens for layout in layouts])
        width = int(document_lengths.max())
        document_slots = (torch.arange(width)[None, :] < document_lengths[:, None]).long().to(self.device)
        question_ids, question_mask, question_positions = self._left_padded([layout.question_ids for layout in layouts])
        attention_mask = torch.cat([document_slots, question_mask], dim=1)  # the documents' padding is a hole
        position_ids = question_positions + document_lengths[:, None].to(self.device)  # continuing the documents'
        logits = self._forward(question_ids, attention_mask, position_ids, cache=cache)[:, -1]
        return _DecodeState(cache, attention_mask, position_ids[:, -1] + 1, logits)

    def _prefill_documents(self, layouts: list[tok.PackedLayout], cache) -> None:
        """Anchor and documents into the cache under document attention, rows right-padded: padding
        carries PAD_DOC_ID, a document no real token attends to (evalkit's attention takes no mask)."""
        width = max(layout.num_document_tokens for layout in layouts)
        input_ids = torch.full((len(layouts), width), self._pad_id, dtype=torch.long)
        doc_ids = torch.full((len(layouts), width), PAD_DOC_ID, dtype=torch.long)
        for row, layout in enumerate(layouts):
            n = layout.num_document_tokens
            input_ids[row, :n] = torch.tensor(layout.input_ids[:n])
            doc_ids[row, :n] = torch.tensor(layout.doc_ids)
        position_ids = torch.arange(width, device=self.device).expand(len(layouts), -1)  # continuous, the anchor at 0
        options = {"cache": cache, "doc_ids": doc_ids.to(self.device), "window_anchor": self.window_anchor}
        with self._attention_implementation(self.packed_attention):
            self._forward(input_ids.to(self.device), None, position_ids, **options)

    @contextmanager
    def _attention_implementation(self, name: str) -> Iterator[None]:
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(name)
        try:
            yield
        finally:
            self.model.set_attn_implementation(previous)

    def _greedy_decode(self, state: _DecodeState, max_new_tokens: int, stop: list[str]) -> list[str]:
        """Greedy tokens until EOS, a stop string or max_new_tokens; texts cut at the earliest stop."""
        self._give_room(state.cache, max_new_tokens)
        generated: list[list[int]] = [[] for _ in range(state.logits.shape[0])]
        active = list(range(len(generated)))  # the original row of each row still in the batch
        watcher = _StopWatcher(self.decode, stop)
        for step in range(max_new_tokens):
            next_tokens = state.logits.argmax(dim=-1)
            continuing = []
            for row, token in enumerate(next_tokens.tolist()):
                if token in self._eos_ids:
                    continue
                generated[active[row]].append(token)
                if not watcher.hit(generated[active[row]]):
                    continuing.append(row)
            if not continuing or step == max_new_tokens - 1:
                break
            if len(continuing) < len(active):
                state = state.select(continuing)
                next_tokens = next_tokens[continuing]
                active = [active[row] for row in continuing]
            attention_mask = torch.cat([state.attention_mask, torch.ones_like(state.attention_mask[:, :1])], dim=1)
            positions = state.next_positions
            logits = self._forward(next_tokens[:, None], attention_mask, positions[:, None], cache=state.cache)[:, -1]
            state = _DecodeState(state.cache, attention_mask, positions + 1, logits)
        self.stats.new_tokens += sum(len(tokens) for tokens in generated)
        return [tok.cut_at_stop(self.decode(tokens), stop) for tokens in generated]

    def _give_room(self, cache, room: int) -> None:
        """Plain cache layers replaced by growing ones with `room` spare columns (_growing_layer_class)."""
        from transformers.cache_utils import DynamicLayer

        growing = _growing_layer_class()
        for i, layer in enumerate(getattr(cache, "layers", [])):
            if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.numel():
                cache.layers[i] = growing(layer.keys, layer.values, room)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        *,
        cache=None,
        logits_to_keep: int = 1,
        **attention_kwargs,
    ) -> torch.Tensor:
        """Logits [B, logits_to_keep, V] of one forward; with `cache`, its K/V are appended to it."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            logits_to_keep=logits_to_keep,
            **{self._cache_argument: cache},
            **attention_kwargs,
        )
        return out.logits

    def _new_cache(self, *, every_key: bool = False):
        """transformers' cache for this model (sliding layers keep their window); `every_key`: plain
        layers throughout, keeping every key (the masks still apply each layer's window)."""
        from transformers import DynamicCache

        return DynamicCache() if every_key else DynamicCache(config=self.model.config)

    def _left_padded(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask and position_ids [B, S] on the device, rows left-padded."""
        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            input_ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
            attention_mask[row, width - len(sequence) :] = 1
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # real tokens count from 0
        return input_ids.to(self.device), attention_mask.to(self.device), position_ids.to(self.device)

    def _sorted_batches(self, keys: Sequence[Any], one_by_one: bool = False) -> list[list[int]]:
        """Indices sorted by `keys`, in batches: by negated lengths, similar lengths together, longest
        first (padding waste is small, OOM shows early); by token ids, shared prefixes together."""
        order, size = sorted(range(len(keys)), key=keys.__getitem__), 1 if one_by_one else self.batch_size
        return [order[start : start + size] for start in range(0, len(order), size)]


def _check_plain_attention(attention: str) -> None:
    """transformers' own names (eager and its attention registry's), but evalkit's: those take no padding mask."""
    if attention in HF_NAMES:
        raise UserError(
            f"attention={attention!r} cannot run plain prompts: they are left-padded and evalkit's "
            "implementations take no padding mask; use sdpa (or eager, flash_attention_2) for attention "
            "and choose the evalkit implementation of packed requests with packed_attention"
        )
    from transformers import AttentionInterface

    internal = {*HF_NAMES, GROUPED_SDPA}  # evalkit's own registrations
    known = ["eager", *(name for name in AttentionInterface().valid_keys() if name not in internal)]
    if attention not in known:
        raise UserError(f"attention must be one of transformers' {', '.join(known)}, got {attention!r}")


def load_model(path: Path, served: Serving, device: torch.device, attention: str, trust_remote_code: bool):
    """The model served as `served` says, refused with one line if any weight is missing, unexpected
    or mis-shaped (load_pretrained)."""
    from transformers import AutoModelForCausalLM

    model = load_pretrained(
        AutoModelForCausalLM,
        path,
        # Evaluations load one checkpoint after another under evalkit's own progress display;
        # transformers' per-load "Loading weights" bar would interleave with it.
        progress_bar=False,
        dtype=torch_dtype(served.dtype),
        attn_implementation=attention,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
        device_map=str(device),  # weights go straight to the device, not through CPU memory first
    )
    if attention == "sdpa":  # the same SDPA, without copying key-value heads at decoding (register_grouped_sdpa)
        model.set_attn_implementation(register_grouped_sdpa())
    if served.frequencies == "bf16":  # the bf16 buffers a bf16_full run trained with (transformers loads fp32 ones)
        cast_buffers(model, "bf16")
    if served.rotation == "fp32":
        set_rope_precision(model, "fp32")
    return model.eval()


def model_logprobs(model, tokens: list[int], device: torch.device) -> torch.Tensor:
    """Next-token log-probabilities [T, V] of one unpadded row, in one forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], device=device), use_cache=False).logits[0]
    return logits.float().log_softmax(-1).cpu()


def _continuation_score(logits_KV: torch.Tensor, continuation: list[int]) -> tuple[float, bool]:
    """(sum of log-probs of `continuation`, all of it greedy) from the logits that predict it."""
    targets = torch.tensor(continuation, device=logits_KV.device)
    total = torch.zeros((), dtype=torch.float64, device=logits_KV.device)
    greedy = True
    for start in range(0, len(continuation), LOGPROB_CHUNK):
        logprobs = logits_KV[start : start + LOGPROB_CHUNK].float().log_softmax(dim=-1)
        chunk_targets = targets[start : start + LOGPROB_CHUNK]
        total += logprobs.gather(-1, chunk_targets[:, None]).double().sum()
        greedy = greedy and bool((logprobs.argmax(dim=-1) == chunk_targets).all())
    return float(total), greedy


OFF_REGIME_PROBE = 512  # positions the off-regime line's KL is measured over


def probe_tokens(tokenizer, length: int) -> list[int]:
    """`length` tokens of the built-in prose (evalkit.corpus), after the BOS where the tokenizer has
    one: the same text for every engine and checkpoint of a tokenizer."""
    from evalkit.corpus.prose import prose_text

    bos = [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
    ids = tokenizer(prose_text()[: 16 * length], add_special_tokens=False)["input_ids"]
    return (bos + list(ids))[:length]


def divergence(reference: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of two [T, V] log-probability tensors: KL(reference ‖ other) in nats, and
    whether the two most likely tokens are the same."""
    probabilities = reference.exp()
    gap = torch.where(probabilities > 0, reference - other, torch.zeros_like(reference))
    return (probabilities * gap).sum(-1).clamp_min(0), reference.argmax(-1) == other.argmax(-1)


def off_regime_kl(
    path: Path, engine: PackedEngine, device: torch.device, attention: str = "sdpa", trust_remote_code: bool = False
) -> float:
    """An engine serving `path` stock off the trained regime (engine.served.off_regime): the mean KL of
    its next-token distributions from a transformers twin's served as trained, said in one line."""
    served = engine.served
    tokens = probe_tokens(engine.tokenizer, min(engine.max_length, OFF_REGIME_PROBE))
    twin = load_model(path, served_regime(path, "trained"), device, attention, trust_remote_code)
    reference = model_logprobs(twin, tokens, device)
    del twin
    kl = float(divergence(reference, engine.position_logprobs(tokens))[0].mean())
    print(
        f"note: {path} is served stock ({served.describe()}), off the regime it trained in "
        f"({served.off_regime}): KL {kl:.2g} nats/token from it over {len(tokens)} tokens "
        f"(evalkit parity {path} measures it per position)",
        file=sys.stderr,
    )
    return kl
