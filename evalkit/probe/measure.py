"""The measurements: shifted copies of each text through the model, reduced to the paper's numbers.

For each text and each Δ1, D(X, Δ1, Δ2) = Σ_(l,h) Σ_j n_j Σ_i |ATTN_ij(Δ1) − ATTN_ij(Δ2)|
(Eq. 4, n_j = 1/(T − j + 1) for the 1-based key column j), kept per column j for the per-token
view, and D_logit = (1/T) Σ_i Σ_(l,h) |A_i1(Δ1) − A_i1(Δ2)| (Eq. 5) with A the scaled logits
q·k/sqrt(d), the logits the softmax sees. Both are averaged over the texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from evalkit.probe.attention import DEFAULT_BLOCK_ELEMENTS, PROBE_ATTENTION, ShiftRecorder
from evalkit.probe.rope import expected_qk_dtype, rope_precision


@dataclass(frozen=True)
class ShiftMeasurement:
    """One (Δ1, Δ2) pair over N texts of `seq_len` tokens."""

    delta1: int
    delta2: int
    seq_len: int
    columns: torch.Tensor  # [T] float64: the n_j-weighted difference per key column, mean over texts
    per_text_total: torch.Tensor  # [N] float64: D of each text (the sum of its columns)
    per_text_logit_first: torch.Tensor  # [N] float64: D_logit of each text
    # D and D_logit of each text over the layers of one type only (models with sliding layers)
    per_text_total_by_type: dict[str, torch.Tensor] = field(default_factory=dict)
    per_text_logit_first_by_type: dict[str, torch.Tensor] = field(default_factory=dict)

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


def _shift_batches(delta1s: Sequence[int], per_batch: int) -> list[list[int]]:
    return [list(delta1s[i : i + per_batch]) for i in range(0, len(delta1s), per_batch)]


def _positions(shifts: Sequence[int], seq_len: int, device: torch.device) -> torch.Tensor:
    base = torch.arange(seq_len, device=device)
    return torch.stack([base + shift for shift in shifts])


def _check_model(model: torch.nn.Module) -> None:
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != PROBE_ATTENTION:
        raise ValueError(f"load the model with attn_implementation={PROBE_ATTENTION!r} (it uses {implementation!r})")


def _activation_dtype(model: torch.nn.Module) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


@torch.inference_mode()
def _measure_one(
    model, token_ids: torch.Tensor, delta1s: list[int], delta2: int, rope: str, block_elements: int
) -> ShiftRecorder:
    """One forward pass of [Δ2 copy, Δ1 copies...] of one text; returns the filled recorder."""
    device = model.get_input_embeddings().weight.device
    seq_len = token_ids.numel()
    recorder = ShiftRecorder(
        seq_len=seq_len,
        n_shifted=len(delta1s),
        device=device,
        qk_dtype=expected_qk_dtype(_activation_dtype(model), rope),
        block_elements=block_elements,
    )
    batch = len(delta1s) + 1
    input_ids = token_ids.to(device).unsqueeze(0).expand(batch, seq_len)
    model(
        input_ids=input_ids,
        position_ids=_positions([delta2, *delta1s], seq_len, device),
        use_cache=False,
        probe_recorder=recorder,
    )
    layers = model.config.num_hidden_layers
    if len(recorder.layers_seen) != layers:
        raise RuntimeError(f"the probe attention ran in {len(recorder.layers_seen)} of {layers} layers")
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
    """D, its per-column breakdown and D_logit for every Δ1 against Δ2, averaged over the texts.

    `model` is a transformers model loaded with attn_implementation="evalkit_probe" (see
    `register_probe_attention`) in the dtype to measure; `texts_NT` holds N texts of T token ids.
    Each forward pass carries one text at Δ2 and up to `shifts_per_batch` Δ1 copies.
    """
    _check_model(model)
    delta1s = list(dict.fromkeys(delta1s))  # a repeated Δ1 would be counted twice
    if min([*delta1s, delta2]) < 0:
        raise ValueError(f"position shifts must be non-negative: Δ1 {delta1s}, Δ2 {delta2}")
    n_texts, seq_len = texts_NT.shape
    columns = {d: torch.zeros(seq_len, dtype=torch.float64) for d in delta1s}
    totals = {d: torch.zeros(n_texts, dtype=torch.float64) for d in delta1s}
    logits = {d: torch.zeros(n_texts, dtype=torch.float64) for d in delta1s}
    totals_by_type: dict[int, dict[str, torch.Tensor]] = {d: {} for d in delta1s}
    logits_by_type: dict[int, dict[str, torch.Tensor]] = {d: {} for d in delta1s}
    with rope_precision(model, rope):
        for text_index, token_ids in enumerate(texts_NT):
            if progress is not None:
                progress(f"text {text_index + 1}/{n_texts} ({seq_len} tokens)")
            for shifts in _shift_batches(delta1s, shifts_per_batch):
                recorder = _measure_one(model, token_ids, shifts, delta2, rope, block_elements)
                normalised = recorder.normalised_columns().cpu()
                first_logit = recorder.first_logit_means().cpu()
                for k, delta1 in enumerate(shifts):
                    columns[delta1] += normalised[k] / n_texts
                    totals[delta1][text_index] = normalised[k].sum()
                    logits[delta1][text_index] = first_logit[k]
                for layer_type in recorder.column_sums_by_type:
                    by_type = recorder.normalised_columns(layer_type).sum(dim=1).cpu()
                    first_by_type = recorder.first_logit_means(layer_type).cpu()
                    for k, delta1 in enumerate(shifts):
                        totals_by_type[delta1].setdefault(layer_type, torch.zeros(n_texts, dtype=torch.float64))
                        logits_by_type[delta1].setdefault(layer_type, torch.zeros(n_texts, dtype=torch.float64))
                        totals_by_type[delta1][layer_type][text_index] = by_type[k]
                        logits_by_type[delta1][layer_type][text_index] = first_by_type[k]
    return [
        ShiftMeasurement(
            delta1=d,
            delta2=delta2,
            seq_len=seq_len,
            columns=columns[d],
            per_text_total=totals[d],
            per_text_logit_first=logits[d],
            per_text_total_by_type=totals_by_type[d],
            per_text_logit_first_by_type=logits_by_type[d],
        )
        for d in delta1s
    ]
