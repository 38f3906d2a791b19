"""Can a tiny model of a recipe learn to copy at all? The prerequisite of in-context retrieval.

RULER needs a model that finds a key earlier in its context and copies what follows it: an
induction circuit. This script trains a fresh model of a recipe (default: tiny-cpu) on the
plainest form of that skill and reports, on held-out windows, the loss and accuracy on the
tokens that can only be predicted by copying:

    windows of   x  gap  x  x' gap' x' ...   where x, gap are random tokens of the vocabulary

  --offsets fixed      x is 64 tokens and there is no gap: the copy is always 64 positions back,
                       which attention can learn from position alone (no content matching).
  --offsets variable   x is 8-32 tokens and the gap 0-48: the copy source moves, so the model
                       must match content (the induction mechanism retrieval needs).

Chance is ln(alphabet) loss and 1/alphabet accuracy on the copyable tokens. --attention sdpa
trains through transformers' own attention instead of evalkit's, to rule evalkit out.

    python scripts/copy_task.py --offsets variable --steps 1500 [--attention sdpa] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

from evalkit.files import atomic_write_text
from evalkit.store.provenance import provenance_lines
from evalkit.train import load_recipe
from evalkit.train.loop import MaskedLMLoss
from evalkit.train.model import _scratch_config, build_model, recipe_tokenizer

FIRST_ID = 64  # past the special and domain-tag tokens of the built-in tokenizer


def copy_window(
    rng: random.Random, seq_len: int, alphabet: int, offsets: str, bos: int
) -> tuple[list[int], list[bool]]:
    """One window of repeated random segments; the mask marks the tokens predictable by copying.

    The first token of each repeat is copyable too: its source position is known (right after a
    fixed-offset segment, or after the gap in the variable case only by content).
    """
    ids, copyable = [bos], [False]
    while len(ids) < seq_len:
        if offsets == "fixed":
            length, gap = 64, 0
        else:
            length, gap = rng.randint(8, 32), rng.randint(0, 48)
        segment = [rng.randrange(FIRST_ID, FIRST_ID + alphabet) for _ in range(length)]
        filler = [rng.randrange(FIRST_ID, FIRST_ID + alphabet) for _ in range(gap)]
        ids += segment + filler + segment
        copyable += [False] * (length + gap) + [True] * length
    return ids[:seq_len], copyable[:seq_len]


def batch(rng: random.Random, size: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [copy_window(rng, args.seq, args.alphabet, args.offsets, args.bos) for _ in range(size)]
    return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def build(args):
    sets = [
        f"model.hidden_size={args.hidden}",
        f"model.num_layers={args.layers}",
        f"model.intermediate_size={4 * args.hidden}",
        f"data.vocab_size={args.vocab}",
    ]
    config = load_recipe(args.recipe, {"seq_len": args.seq, "seed": args.seed}, sets)
    tokenizer = recipe_tokenizer(config)
    if args.attention == "sdpa":
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(_scratch_config(config, tokenizer), attn_implementation="sdpa")
    else:
        config.model.attention = args.attention
        model = build_model(config, tokenizer, torch.device("cpu"))
    return model, tokenizer


def evaluate(loss_module: MaskedLMLoss, ids: torch.Tensor, copyable: torch.Tensor) -> tuple[float, float]:
    """(mean loss, accuracy) on the copyable tokens of a fixed held-out batch."""
    loss_module.eval()
    with torch.no_grad():
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        logits = loss_module.lm(input_ids=ids, position_ids=positions).logits[:, :-1].float()
    loss_module.train()
    targets, mask = ids[:, 1:], copyable[:, 1:]
    picked = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    return float(-picked[mask].mean()), float((logits.argmax(-1) == targets)[mask].float().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--offsets", choices=("fixed", "variable"), default="variable")
    parser.add_argument("--attention", choices=("blocked", "dense", "sdpa"), default="blocked")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16, help="windows per step")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512, help="the built-in BPE's size (the model's vocabulary)")
    parser.add_argument("--alphabet", type=int, default=400, help="distinct random tokens the segments use")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.alphabet + FIRST_ID > args.vocab:
        parser.error(
            f"--alphabet {args.alphabet} does not fit a vocabulary of {args.vocab} (at most {args.vocab - FIRST_ID})"
        )

    model, tokenizer = build(args)
    args.bos = tokenizer.bos_token_id
    loss_module = MaskedLMLoss(model)
    loss_module.train()
    optimizer = torch.optim.AdamW(loss_module.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    train_rng, held_out = random.Random(args.seed), batch(random.Random(10_000 + args.seed), 32, args)
    lines = ["| step | tokens | copy loss | copy accuracy | seconds |", "|---|---|---|---|---|"]
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:  # 50 warm-up steps, then constant
            group["lr"] = args.lr * min(1.0, step / 50)
        ids, _ = batch(train_rng, args.batch, args)
        every_token = torch.ones_like(ids, dtype=torch.bool)
        positions = torch.arange(args.seq).expand_as(ids)
        loss = loss_module(ids, positions, None, every_token) / every_token[:, 1:].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == args.steps:
            copy_loss, accuracy = evaluate(loss_module, *held_out)
            line = (
                f"| {step} | {step * args.batch * args.seq / 1e6:.2f}M | {copy_loss:.3f} | {accuracy:.3f} | "
                f"{time.perf_counter() - started:.0f} |"
            )
            lines.append(line)
            print(line, flush=True)
    report = [
        f"# Copy task: {args.offsets} offsets, {args.attention} attention",
        "",
        (
            f"Model: {args.layers} layers, width {args.hidden}, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocabulary {args.vocab}; "
            f"{args.batch} windows of {args.seq} tokens per step, lr {args.lr}. Random segments over "
            f"{args.alphabet} tokens: chance is loss {math.log(args.alphabet):.3f}, accuracy {1 / args.alphabet:.4f}."
        ),
        "",
        "Command: `python "
        + " ".join(["scripts/copy_task.py", *sys.argv[1:]])
        + f"` (took {time.perf_counter() - started:.0f} s)",
        "",
        *lines,
        "",
        *provenance_lines(),
    ]
    if args.out:
        atomic_write_text(args.out, "\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
