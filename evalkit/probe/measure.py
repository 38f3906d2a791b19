"""The measurements: shifted copies of each text through the model, reduced to the paper's numbers
(D of Eq. 4 per key column and in total, D_logit of Eq. 5, averaged over the texts; their exact
definitions are evalkit.probe.run.MEASUREMENT, stored with every result), also per layer type.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from evalkit.attention.features import layer_windows
from evalkit.attention.hf import rotary_modules, set_rope_precision
from evalkit.errors import UserError
from evalkit.probe.attention import DEFAULT_BLOCK_ELEMENTS, PROBE_ATTENTION, ShiftRecorder, layer_type


@dataclass(frozen=True)
class ShiftMeasurement:
    """One (Δ1, Δ2) pair over N texts of `seq_len` tokens, summed over `layers` ("all", or one layer type)."""

    delta1: int
    delta2: int
    seq_len: int
    columns: torch.Tensor  # [T] float64: the n_j-weighted difference per key column, mean over texts
    per_text_total: torch.Tensor  # [N] float64: D of each text (the sum of its columns)
    per_text_logit_first: torch.Tensor  # [N] float64: D_logit of each text
    layers: str = "all"
    by_layer_type: dict[str, ShiftMeasurement] = field(default_factory=dict)  # the same, per layer type
    layer_windows: dict[int, int | None] = field(default_factory=dict)  # each layer's window (None: full)

    @property
    def n_texts(self) -> int:
        return int(self.per_text_total.numel())

    @property
    def total(self) -> float:
        return float(self.per_text_total.mean())

    @property
    def logit_first(self) -> float:
        return float(self.per_text_logit_first.mean())

    @property
    def first_token_share(self) -> float:
        """The first key column's part of the total (of the means): 0 when there is no difference at all."""
        total = float(self.columns.sum())
        return float(self.columns[0]) / total if total > 0 else 0.0


@contextmanager
def rope_precision(model: torch.nn.Module, variant: str) -> Iterator[None]:
    """Within the block, every forward pass of `model` applies RoPE in `variant` (ProbeOptions checked
    it): `cast` (transformers, vLLM and the paper's code: cos/sin cast to the activation dtype, q and
    k rotated in it) or `fp32` (the paper's text: rotated in FP32, rounded once, afterwards). For
    `fp32` the trainer's hooks (attention.hf.set_rope_precision), removed on exit, keep the rotary
    module's cos/sin in FP32, so each layer's `q * cos + rotate_half(q) * sin` is promoted to FP32 on
    the exact (upcast) q and k; the probe attention casts them back, the one rounding, and checks per
    layer that they came in FP32. No model code is replaced."""
    if variant != "fp32":
        yield
        return
    if not rotary_modules(model):
        raise UserError(f"{type(model).__name__} has no rotary-embedding module: the fp32 RoPE variant needs one")
    handles = set_rope_precision(model, "fp32")
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def _measure_one(
    model, token_ids: torch.Tensor, delta1s: list[int], delta2: int, rope: str, block_elements: int
) -> ShiftRecorder:
    """One forward pass of [Δ2 copy, Δ1 copies...] of one text; returns the filled recorder."""
    embedding = model.get_input_embeddings().weight  # its dtype is the activations'
    device = embedding.device
    seq_len = token_ids.numel()
    recorder = ShiftRecorder(
        seq_len=seq_len,
        n_shifted=len(delta1s),
        device=device,
        qk_dtype=torch.float32 if rope == "fp32" else embedding.dtype,  # rotated in FP32, or in the activations
        block_elements=block_elements,
    )
    batch = len(delta1s) + 1
    input_ids = token_ids.to(device).unsqueeze(0).expand(batch, seq_len)
    model(
        input_ids=input_ids,
        position_ids=torch.arange(seq_len, device=device) + torch.tensor([delta2, *delta1s], device=device)[:, None],
        use_cache=False,
        probe_recorder=recorder,
    )
    # Every layer ran the probe attention with the window its config declares: else its numbers would be
    # missing, or filed under the wrong layer type, or the model slides where the probe assumed it does not.
    declared = dict(enumerate(layer_windows(model.config)))
    if recorder.layer_windows != declared:
        raise RuntimeError(f"the probe attention ran with layer windows {recorder.layer_windows}, not {declared}")
    return recorder


def measure_shifts(
    model: torch.nn.Module,
    texts_NT: torch.Tensor,
    delta1s: Sequence[int],
    delta2: int,
    *,
    rope: str = "cast",
    shifts_per_batch: int = 1,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    progress: Callable[[str], None] | None = None,
) -> list[ShiftMeasurement]:
    """D, its per-column breakdown and D_logit for every Δ1 against Δ2, averaged over the N texts of
    T token ids of `texts_NT`, by `model` in its dtype under the probe attention; each forward pass
    carries one text at Δ2 and up to `shifts_per_batch` Δ1 copies. Every measurement also holds its
    parts per layer type (`by_layer_type`), which add up to it."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != PROBE_ATTENTION:
        raise ValueError(f"load the model with attn_implementation={PROBE_ATTENTION!r} (it uses {implementation!r})")
    delta1s = list(dict.fromkeys(delta1s))  # a repeated Δ1 would be counted twice
    n_texts, seq_len = texts_NT.shape
    # Keyed by (layers, Δ1): the mean of the columns over the texts, each text's total and D_logit.
    columns: dict[tuple[str, int], torch.Tensor] = defaultdict(lambda: torch.zeros(seq_len, dtype=torch.float64))
    totals: dict[tuple[str, int], torch.Tensor] = defaultdict(lambda: torch.zeros(n_texts, dtype=torch.float64))
    logits: dict[tuple[str, int], torch.Tensor] = defaultdict(lambda: torch.zeros(n_texts, dtype=torch.float64))
    layer_windows: dict[int, int | None] = {}
    with rope_precision(model, rope):
        for text_index, token_ids in enumerate(texts_NT):
            if progress is not None:
                progress(f"text {text_index + 1}/{n_texts} ({seq_len} tokens)")
            for start in range(0, len(delta1s), shifts_per_batch):
                shifts = delta1s[start : start + shifts_per_batch]
                recorder = _measure_one(model, token_ids, shifts, delta2, rope, block_elements)
                layer_windows = recorder.layer_windows
                for layers, chosen in recorder.layer_groups().items():
                    normalised = recorder.normalised_columns(chosen).cpu()
                    first_logit = recorder.first_logit_means(chosen).cpu()
                    for k, delta1 in enumerate(shifts):
                        columns[layers, delta1] += normalised[k] / n_texts
                        totals[layers, delta1][text_index] = normalised[k].sum()
                        logits[layers, delta1][text_index] = first_logit[k]

    def measurement(layers: str, delta1: int, **parts) -> ShiftMeasurement:
        key = (layers, delta1)
        return ShiftMeasurement(delta1, delta2, seq_len, columns[key], totals[key], logits[key], layers, **parts)

    types = sorted({layer_type(window) for window in layer_windows.values()})
    return [
        measurement(
            "all",
            delta1,
            by_layer_type={name: measurement(name, delta1) for name in types},
            layer_windows=dict(layer_windows),
        )
        for delta1 in delta1s
    ]
