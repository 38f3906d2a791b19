"""Choosing a sample's haystack size: the largest size whose prompt fits the token budget.

A plan (kinds.KindPlan) maps a size (noise lines, essay words, documents ...) to the prompt's
pieces. `estimate` is a cheap, nearly monotone count to search on; `measure` is the count the
sample is held to (composed piece counts, or a full tokenisation in exact mode). The search
brackets the answer from a guess, bisects on the estimate, then steps down until the measured
prompt fits: table look-ups per step, no whole-text tokenisation.

Two sizings (SIZINGS, docs/ruler.md --sizing): `exact` fits every sample on its own (`fit`);
`nvidia` searches one size per task and length (`shared_size`), each sample stepped down from it (`step_down`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

SIZINGS = ("exact", "nvidia")
DEFAULT_SIZING = "exact"


class Plan(Protocol):
    """What is sized (kinds.KindPlan, declared here so that fitting does not import the kinds)."""

    min_size: int
    max_size: int | None

    def guess(self, budget: int) -> int: ...

    def estimate(self, size: int) -> int: ...


@dataclass(frozen=True)
class TooLong(Exception):
    """Even the plan's smallest size needs `tokens` prompt tokens."""

    tokens: int


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from the parts' text: the same in every process (no hash randomisation)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def search(estimate: Callable[[int], int], budget: int, low: int, guess: int, high: int | None) -> int | None:
    """The largest size in [low, high] with estimate(size) <= budget, or None if low does not fit.
    The estimate is near linear: two secant steps from the guess land within a few units of the
    answer; doubling steps then bracket it and bisection finishes."""
    seen: dict[int, int] = {}

    def fits(size: int) -> bool:
        if size not in seen:
            seen[size] = estimate(size)
        return seen[size] <= budget

    def clamp(size: int) -> int:
        return max(low, size if high is None else min(size, high))

    if not fits(low):
        return None
    x0, x1 = low, clamp(max(guess, low + 1))
    fits(x1)
    for _ in range(2):
        if seen[x1] == seen[x0]:
            break
        x2 = clamp(x1 + int((budget - seen[x1]) * (x1 - x0) / (seen[x1] - seen[x0])))
        if x2 == x1:
            break
        x0, x1 = x1, x2
        fits(x1)
    step = 1
    if fits(x1):
        good, bad = x1, None
        while bad is None and (high is None or good < high):
            probe = clamp(good + step)
            if fits(probe):
                good, step = probe, step * 2
            else:
                bad = probe
        if bad is None:
            return good
    else:
        bad, good = x1, None
        while good is None:
            probe = clamp(bad - step)
            if fits(probe):
                good = probe
            else:
                bad, step = probe, step * 2
    assert good is not None and bad is not None  # both ends of the bracket were found above
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def fit(plan: Plan, budget: int, measure: Callable[[int], int], high: int | None = None) -> tuple[int, int]:
    """(size, measured tokens) for the largest size (at most `high`, if given) that fits; TooLong if none does."""
    high = min((bound for bound in (high, plan.max_size) if bound is not None), default=None)
    size = search(plan.estimate, budget, plan.min_size, plan.guess(budget), high)
    if size is None:
        raise TooLong(measure(plan.min_size))
    too_big = None
    while True:
        tokens = measure(size)
        if tokens <= budget:
            break
        if size <= plan.min_size:
            raise TooLong(tokens)
        # The estimate was short by (tokens - estimate): search again with that much less room.
        too_big = size
        shortfall = tokens - plan.estimate(size)
        smaller = search(plan.estimate, budget - shortfall, plan.min_size, size - 1, size - 1)
        size = plan.min_size if smaller is None else min(size - 1, smaller)
    if too_big is not None:  # the step down may have gone further than needed: bisect back up
        while too_big - size > 1:
            middle = (size + too_big) // 2
            middle_tokens = measure(middle)
            if middle_tokens <= budget:
                size, tokens = middle, middle_tokens
            else:
                too_big = middle
    return size, tokens


@dataclass(frozen=True)
class Coarse:
    """NVIDIA's coarse step for one task at one length, in the task's size unit. `origin` (fwe
    only): freq_words_extraction.py climbs from it in steps and keeps the last that fits."""

    step: int
    origin: int | None = None


def check_sizing(sizing: str) -> str:
    from evalkit.errors import UserError

    if sizing not in SIZINGS:
        raise UserError(f"unknown RULER sizing {sizing!r}: choose from {', '.join(SIZINGS)}")
    return sizing


def shared_size(plan: Plan, budget: int, measure: Callable[[int], int], coarse: Coarse) -> int:
    """The one size of a task and length under NVIDIA's sizing: the largest at which this (the first)
    sample fits, as NVIDIA bisects on one sample; fwe's snapped to NVIDIA's climbing grid (the last
    point that fits, else one step below the origin). TooLong if none fits."""
    size, _ = fit(plan, budget, measure)
    if coarse.origin is not None:
        origin, step = coarse.origin, max(1, coarse.step)
        size = origin + (size - origin) // step * step if size >= origin else origin - step
    return size


def step_down(plan: Plan, budget: int, measure: Callable[[int], int], start: int, step: int) -> tuple[int, int]:
    """(size, measured tokens) of a sample under NVIDIA's sizing: from the shared size, down by `step`
    while it overflows; below the smallest size (NVIDIA's loop never ends), the largest that fits."""
    size = max(start, plan.min_size)
    if plan.max_size is not None:
        size = min(size, plan.max_size)
    step = max(1, step)
    tokens = measure(size)
    while tokens > budget:
        if size - step < plan.min_size:
            return fit(plan, budget, measure, high=size - 1)
        size -= step
        tokens = measure(size)
    return size, tokens
