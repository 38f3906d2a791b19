"""`generate`: samples for one task and length, sized with the evaluated tokenizer.

Each sample's random choices come from its own seeded generator and its haystack size is fitted
to the budget with composed token counts (sized as `sizing` says: evalkit.ruler.fitting). A few
prompts of every batch are checked against a full tokenisation; if any disagrees (tokens that
cross the pieces' junctions), the batch is regenerated with every prompt tokenised in full.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from evalkit.ruler.context import Context
from evalkit.ruler.counting import TokenCounter, compose_count, compose_text
from evalkit.ruler.errors import TaskDataMissing, TaskDoesNotFit
from evalkit.ruler.fitting import DEFAULT_SIZING, TooLong, check_sizing, fit, shared_size, step_down
from evalkit.ruler.kinds import KindPlan, KindTask, generator_class
from evalkit.ruler.prompt import BASE, PromptFormat
from evalkit.ruler.sample import Sample
from evalkit.ruler.spec import DEFAULT_SEED, TaskSpec, as_spec

_COUNTERS: weakref.WeakKeyDictionary[object, dict[bool, TokenCounter]] = weakref.WeakKeyDictionary()


def counter_for(tokenizer, add_special_tokens: bool = True) -> TokenCounter:
    """The process-wide counter of this tokenizer, so piece counts are shared across tasks and lengths."""
    try:
        per_tokenizer = _COUNTERS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no sharing
        return TokenCounter(tokenizer, add_special_tokens)
    if add_special_tokens not in per_tokenizer:
        per_tokenizer[add_special_tokens] = TokenCounter(tokenizer, add_special_tokens)
    return per_tokenizer[add_special_tokens]


def forget_counts(tokenizer) -> None:
    """Drop this tokenizer's memoised piece counts (the timing programs, perf/, measure from a cold start)."""
    try:
        _COUNTERS.pop(tokenizer, None)
    except TypeError:
        pass


def generate(
    task: str | TaskSpec,
    tokenizer,
    length: int,
    num_samples: int,
    seed: int = DEFAULT_SEED,
    *,
    essays: str | Path | None = None,
    qa_dir: str | Path | None = None,
    prompt_format: PromptFormat | None = None,
    exact_lengths: bool = False,
    sizing: str = DEFAULT_SIZING,
    first: Sequence[Sample] = (),
) -> list[Sample]:
    """`num_samples` samples of `task` whose prompts plus generation budget fit in `length` tokens;
    sample i never depends on `num_samples`. `first`: samples 0..k-1 generated before with the same
    arguments (a cache file), kept; only the rest are generated."""
    check_sizing(sizing)
    spec = as_spec(task)
    fmt = prompt_format or BASE
    counter = counter_for(tokenizer, fmt.add_special_tokens)
    ctx = Context(spec, counter, int(length), int(seed), fmt, essays, qa_dir)
    first = list(first[:num_samples])
    try:
        generator = _generator(ctx)
        missing = range(len(first), num_samples)
        samples = first + _fit_samples(generator, missing, exact=exact_lengths, sizing=sizing)
        if exact_lengths or _composed_counts_hold(ctx, samples):
            return samples
        warnings.warn(
            f"{spec.name}: this tokenizer's counts do not add up piece by piece; "
            "tokenising every prompt in full (slower)",
            stacklevel=2,
        )
        # The stored ones stay as they are: answers stored for them must keep meaning them.
        return first + _fit_samples(generator, missing, exact=True, sizing=sizing)
    except (TooLong, TaskDoesNotFit):
        raise TaskDoesNotFit(spec.name, length, _smallest_length(ctx, num_samples)) from None


def _generator(ctx: Context) -> KindTask:
    from evalkit.ruler.essay import EssayError
    from evalkit.ruler.words import WordListsMissing

    spec = ctx.spec
    if ctx.budget <= 0:
        raise TaskDoesNotFit(spec.name, ctx.length, spec.max_new_tokens + 1, "the generation budget alone fills it")
    try:
        return generator_class(spec.kind)(ctx)
    except (EssayError, WordListsMissing) as error:
        raise TaskDataMissing(spec.name, ctx.length, str(error)) from error


def _smallest_length(ctx: Context, num_samples: int) -> int:
    """The smallest length at which every sample's smallest haystack fits, found by iterating:
    a task's setup can depend on the length (fwe's vocabulary, cwe's list shape, pool sizes)."""
    candidate = ctx.length + 1
    for _ in range(16):
        try:
            generator = _generator(replace(ctx, length=candidate))
            plans = [generator.plan(index) for index in range(num_samples)]
        except TaskDoesNotFit as too_short:
            candidate = max(candidate + 1, too_short.min_length)
            continue
        needed = max(compose_count(ctx.counter, plan.items(plan.min_size)) for plan in plans) + ctx.spec.max_new_tokens
        if needed <= candidate:
            return candidate
        candidate = needed
    return candidate


def _measure(ctx: Context, plan: KindPlan, exact: bool):
    counter = ctx.counter
    if exact:
        return lambda size: counter.exact([compose_text(plan.items(size))])[0]
    return lambda size: compose_count(counter, plan.items(size))


def _fit_samples(generator: KindTask, indices: range, exact: bool, sizing: str) -> list[Sample]:
    """Each sized on its own (exact), or from one size searched on sample 0 (nvidia)."""
    ctx = generator.ctx
    if sizing != "nvidia" or not indices:
        return [_fit_sample(ctx, generator.plan(index), index, exact) for index in indices]
    coarse = generator.coarse()
    first = generator.plan(0)
    start = shared_size(first, ctx.budget, _measure(ctx, first, exact), coarse)
    return [_fit_sample(ctx, generator.plan(index), index, exact, start, coarse.step) for index in indices]


def _fit_sample(
    ctx: Context, plan: KindPlan, index: int, exact: bool, start: int | None = None, step: int = 1
) -> Sample:
    """At its largest size that fits, or (with `start`) at `start` less as many `step`s as it needs."""
    measure = _measure(ctx, plan, exact)
    if start is None:
        size, tokens = fit(plan, ctx.budget, measure)
    else:
        size, tokens = step_down(plan, ctx.budget, measure, start, step)
    plan.check_fit(size, tokens)
    prompt = compose_text(plan.items(size))
    end = len(prompt) - len(ctx.fmt.between) - len(plan.prefix)
    assert prompt.startswith(ctx.fmt.before) and prompt[end:] == ctx.fmt.between + plan.prefix
    if not plan.outputs or not all(plan.outputs):
        raise AssertionError(f"{ctx.spec.name}: sample {index} has no answers")  # never written out
    text = prompt[len(ctx.fmt.before) : end]
    return Sample(index, text, plan.prefix, list(plan.outputs), tokens, plan.answer_depths(size))


def _composed_counts_hold(ctx: Context, samples: list[Sample]) -> bool:
    """Full tokenisation of the first, middle and last prompts equals their composed counts."""
    if not samples:
        return True
    chosen = sorted({0, len(samples) // 2, len(samples) - 1})
    prompts = [ctx.fmt.render(samples[i].input, samples[i].answer_prefix) for i in chosen]
    return ctx.counter.exact(prompts) == [samples[i].length for i in chosen]
