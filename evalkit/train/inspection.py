"""`evalkit train --inspect DIR`: the first windows of a run, built exactly as training builds them,
written out (window.json, mask.png: docs/training.md) to be read before any training. No model is
built. The mask is evalkit's definition (evalkit.attention.masks.document_mask, what the dense
implementation attends with), never a second one; a layer's sliding window is not drawn.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from evalkit.attention import ANCHOR_DOC_ID, PAD_DOC_ID, PackedSequence, document_mask
from evalkit.errors import UserError
from evalkit.files import atomic_write_bytes, atomic_write_json, check_output_dir, refuse_foreign
from evalkit.train.config import TrainConfig, check_inputs
from evalkit.train.data import open_source
from evalkit.train.loop import build_stream
from evalkit.train.model import recipe_tokenizer

WINDOW_SCHEMA_VERSION = 1  # also what marks window.json as evalkit's own (files.written_by_evalkit)
WINDOW_FILE, MASK_FILE = "window.json", "mask.png"
OPTION = "--inspect"
MAX_WINDOWS = 32
ANCHOR_COLOUR, PAD_COLOUR, MASKED_COLOUR = (0.0, 0.0, 0.0), (0.6, 0.6, 0.6), (1.0, 1.0, 1.0)


def inspect_windows(configs: list[TrainConfig], out: Path, *, windows: int = 1, tokens: int = 256) -> list[Path]:
    """Write the first `windows` windows of each config into out/<paradigm>/; returns the files.
    The configs differ in their paradigm alone (the comma-separated --paradigm): the tokenizer and
    source load once."""
    for option, value in (("--inspect-windows", windows), ("--inspect-tokens", tokens)):
        if value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    if windows > MAX_WINDOWS:  # one panel each in one figure, all held in memory: a typo would run unbounded
        raise UserError(f"--inspect-windows is at most {MAX_WINDOWS} (panels of one figure), got {windows}")
    folders = [Path(out) / config.paradigm.value for config in configs]
    check_output_dir(Path(out), OPTION)
    for folder in folders:
        check_output_dir(folder, OPTION)
        refuse_foreign([folder / WINDOW_FILE, folder / MASK_FILE], OPTION)
    first = configs[0]
    check_inputs(first)
    tokenizer = recipe_tokenizer(first)
    source = open_source(first.data, first.seed, first.seq_len)
    written = []
    for config, folder in zip(configs, folders):
        stream = build_stream(config, tokenizer, source)[1]
        packed = [stream.next_window() for _ in range(windows)]
        record, png = window_record(config, packed, tokenizer, tokens), mask_png(config, packed, tokens)
        atomic_write_json(folder / WINDOW_FILE, record)
        atomic_write_bytes(folder / MASK_FILE, png)
        written += [folder / WINDOW_FILE, folder / MASK_FILE]
    return written


def shown_mask(window: PackedSequence, tokens: int) -> torch.Tensor:
    """Bool [n, n]: the attention mask of the window's first n = min(tokens, S) tokens. Causal, so
    the first n tokens' mask needs only their own document ids (never the whole S x S)."""
    n = min(tokens, window.seq_len)
    doc_ids = window.attention_doc_ids()
    return document_mask(None if doc_ids is None else doc_ids[:n], n)


def window_record(config: TrainConfig, packed: list[PackedSequence], tokenizer, tokens: int) -> dict:
    return {
        "schema_version": WINDOW_SCHEMA_VERSION,
        "recipe": config.name,
        "paradigm": config.paradigm.value,
        "window_start": config.data.window_start,
        "seq_len": config.seq_len,
        "mask_tokens": min(tokens, config.seq_len),
        "windows": [_window_entry(window, tokenizer, tokens) for window in packed],
    }


def _window_entry(window: PackedSequence, tokenizer, tokens: int) -> dict:
    ids = window.input_ids.tolist()
    anchors = (window.doc_ids == ANCHOR_DOC_ID).nonzero().flatten().tolist()
    return {
        "input_ids": ids,
        "tokens": tokenizer.batch_decode([[i] for i in ids]),  # each token's text, decoded alone
        "position_ids": window.position_ids.tolist(),
        "doc_ids": window.doc_ids.tolist(),
        "loss_mask": window.loss_mask.tolist(),
        "anchor_index": anchors[0] if anchors else None,
        "attention_mask": ["".join("1" if allowed else "0" for allowed in row) for row in shown_mask(window, tokens)],
    }


def _doc_colour(doc_id: int, palette: list) -> tuple[float, float, float]:
    if doc_id == ANCHOR_DOC_ID:
        return ANCHOR_COLOUR
    if doc_id == PAD_DOC_ID:
        return PAD_COLOUR
    return tuple(palette[(doc_id - 1) % len(palette)][:3])


def mask_image(window: PackedSequence, tokens: int, palette: list) -> torch.Tensor:
    """Float RGB [n, n, 3]: an allowed cell takes its key's document colour, a masked one is white."""
    allowed = shown_mask(window, tokens)
    n = allowed.shape[0]
    key_colours = torch.tensor([_doc_colour(d, palette) for d in window.doc_ids[:n].tolist()], dtype=torch.float32)
    image = torch.tensor(MASKED_COLOUR, dtype=torch.float32).expand(n, n, 3).clone()
    image[allowed] = key_colours.expand(n, n, 3)[allowed]
    return image


def mask_png(config: TrainConfig, packed: list[PackedSequence], tokens: int) -> bytes:
    """One panel per window, as the paper's Figure 2 (matplotlib's Agg canvas, imported here)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    # tab20 pairs a dark and a light shade of each hue: the dark ones first, so neighbours differ.
    palette = [colormaps["tab20"](i) for i in (*range(0, 20, 2), *range(1, 20, 2))]
    figure = Figure(figsize=(4.2 * len(packed), 4.6), layout="constrained")
    for k, window in enumerate(packed):
        axes = figure.add_subplot(1, len(packed), k + 1)
        image = mask_image(window, tokens, palette)
        axes.imshow(image.numpy(), interpolation="nearest")
        axes.set_title(f"window {k}: first {image.shape[0]} of {window.seq_len} tokens", fontsize=9)
        axes.set_xlabel("key (colour: its document; black: the anchor)", fontsize=8)
        axes.set_ylabel("query", fontsize=8)
    figure.suptitle(f"{config.name}: {config.paradigm.value}, window_start={config.data.window_start}", fontsize=10)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=150)
    return png.getvalue()
