"""Probe options: the paper's settings as defaults, checked before any model is loaded.

List options take either a sequence or the comma-separated string a user types on the command
line ("0,2,4", "bf16,fp32", "4k,8k"), so the CLI can pass its arguments straight through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.arglists import parse_list
from evalkit.errors import UserError
from evalkit.lengths import parse_lengths
from evalkit.models.precision import DTYPE_NAMES as DTYPES
from evalkit.models.precision import ROPE_VARIANTS

PROBE_KINDS = ("shift", "tokens", "length")
# The paper's settings (LLaMA-2-7B): T = 4096, N = 50, Δ2 = 16, and these Δ1 for Figure 1 left.
PAPER_SEQ_LEN = 4096
PAPER_N_TEXTS = 50
PAPER_DELTA2 = 16
PAPER_DELTA1 = (0, 2, 4, 6, 8, 10, 12, 14, 15, 17, 18, 20, 22, 50, 100, 200, 500, 1000, 2000)
PAPER_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # Eq. 5, Δ1 = 0 and Δ2 = 16
RANDOM_INIT_DTYPE = "bf16"  # the paper's third condition: the architecture freshly initialised, in BF16


def _names(value: str | Sequence[str], allowed: Sequence[str], option: str) -> tuple[str, ...]:
    items = parse_list(value, str.lower)
    for item in items:
        if item not in allowed:
            raise UserError(f"--{option}: unknown value {item!r}; use a comma-separated subset of {','.join(allowed)}")
    if not items:
        raise UserError(f"--{option}: give at least one of {','.join(allowed)}")
    return tuple(dict.fromkeys(items))


def _shifts(value: str | Sequence[int], option: str) -> tuple[int, ...]:
    parts = parse_list(value)
    shifts = []
    for part in parts:
        try:
            shift = int(part)
        except (TypeError, ValueError):
            raise UserError(f"--{option}: {part!r} is not an integer position shift") from None
        if shift < 0:
            raise UserError(f"--{option}: position shifts must be non-negative, got {shift}")
        shifts.append(shift)
    if not shifts:
        raise UserError(f"--{option}: give at least one position shift")
    return tuple(dict.fromkeys(shifts))


@dataclass(frozen=True)
class ProbePlan:
    """The options resolved against one model: exactly what a probe run measures."""

    kind: str
    delta1: tuple[int, ...]
    delta2: int
    lengths: tuple[int, ...]  # one T for shift and tokens; the lengths for length
    conditions: tuple[tuple[str, str], ...]  # (condition, dtype)
    window: int  # the model's window: max_position_embeddings
    notes: tuple[str, ...]  # where a default was adapted to the model


@dataclass(frozen=True)
class ProbeOptions:
    """What to measure. None means the kind's default, resolved against the model by `plan`."""

    texts: Path | None = None
    seq_len: int | None = None  # shift/tokens: T (None: the paper's 4096, capped at the model's window)
    n_texts: int = PAPER_N_TEXTS
    delta2: int = PAPER_DELTA2
    delta1: tuple[int, ...] | None = None  # None: the paper's list for shift, (0,) for tokens and length
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    rope: tuple[str, ...] = ("cast",)
    random_init: bool = False
    lengths: tuple[int, ...] | None = None  # length: None is 64..8192 doubling, capped at the window
    seed: int = 0  # the random-init weights
    device: str = "auto"  # auto: CUDA when available, else CPU
    shifts_per_batch: int = 1  # Δ1 copies per forward pass beside the Δ2 copy (more: faster, more memory)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the user's spellings once, here
        set_(self, "texts", Path(self.texts) if self.texts is not None else None)
        set_(self, "dtypes", _names(self.dtypes, DTYPES, "dtypes"))
        set_(self, "rope", _names(self.rope, ROPE_VARIANTS, "rope"))
        set_(self, "delta2", _shifts([self.delta2], "delta2")[0])
        if self.delta1 is not None:
            set_(self, "delta1", _shifts(self.delta1, "delta1"))
        if self.lengths is not None:
            lengths = parse_lengths(self.lengths) if isinstance(self.lengths, str) else list(self.lengths)
            set_(self, "lengths", tuple(sorted(set(self._checked_length(n, "lengths") for n in lengths))))
        if self.seq_len is not None:
            set_(self, "seq_len", self._checked_length(self.seq_len, "seq"))
        if not isinstance(self.n_texts, int) or self.n_texts < 1:
            raise UserError(f"--n: the number of texts must be a positive integer, got {self.n_texts!r}")
        if not isinstance(self.shifts_per_batch, int) or self.shifts_per_batch < 1:
            raise UserError(f"shifts_per_batch must be a positive integer, got {self.shifts_per_batch!r}")
        if self.texts is not None and not self.texts.is_file():
            raise UserError(f"--texts: file {self.texts} not found")

    @staticmethod
    def _checked_length(value: int | str, option: str) -> int:
        length = int(value) if not isinstance(value, str) else parse_lengths(value)[0]
        if length < 2:
            raise UserError(f"--{option}: a length must be at least 2 tokens, got {length}")
        return length

    def plan(self, kind: str, window: int, window_words: str) -> ProbePlan:
        """What one probe kind (checked by run_probe) will run on a model with this window; `window_words`
        says it in messages (run.describe_window)."""
        if kind == "length" and self.seq_len is not None:
            raise UserError("--seq does not apply to `probe length`: give --lengths")
        if kind != "length" and self.lengths is not None:
            raise UserError(f"--lengths applies to `probe length` only: give `probe {kind}` one --seq")
        delta1 = self.delta1 if self.delta1 is not None else (PAPER_DELTA1 if kind == "shift" else (0,))
        lengths, notes = self._lengths(kind, window, window_words)
        # The checkpoint in each dtype, then the paper's third condition if asked.
        conditions = [("pretrained", dtype) for dtype in self.dtypes]
        conditions += [("random_init", RANDOM_INIT_DTYPE)] if self.random_init else []
        return ProbePlan(kind, delta1, self.delta2, lengths, tuple(conditions), window, notes)

    def _lengths(self, kind: str, window: int, window_words: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The sequence lengths to measure, and a note where a default was capped at the window."""
        asked = self.lengths if kind == "length" else None if self.seq_len is None else (self.seq_len,)
        if asked is not None:
            beyond = [n for n in asked if n > window]
            if beyond:
                option = "lengths" if kind == "length" else "seq"
                raise UserError(f"--{option}: {beyond[0]} tokens is beyond the model's {window_words}")
            return asked, ()
        if kind == "length":
            kept = tuple(n for n in PAPER_LENGTHS if n <= window) or (window,)
            capped = len(kept) < len(PAPER_LENGTHS)
            return kept, (f"lengths capped at the model's {window}-token window",) if capped else ()
        if window < PAPER_SEQ_LEN:
            return (window,), (f"T = {window}, the model's window (the paper uses {PAPER_SEQ_LEN})",)
        return (PAPER_SEQ_LEN,), ()


def check_kind(kind: str) -> str:
    if kind not in PROBE_KINDS:
        raise UserError(f"unknown probe {kind!r}: use one of {', '.join(PROBE_KINDS)}")
    return kind
