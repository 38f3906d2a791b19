"""An attention function for transformers that measures shifted copies as it attends.

The probe runs one text as a batch of copies that differ only in their position ids: copy 0 at
the reference shift Δ2, copies 1..K at shifts Δ1. In every layer this function computes the
probabilities as transformers' eager attention does (logits in the activation dtype, softmax in
FP32, cast back), adds |P_k − P_0| and the first key's logit difference |A_k[:, 0] − A_0[:, 0]|
into a `ShiftRecorder`, and returns the ordinary output, so the next layer sees what it would
have seen. Query rows go in blocks: no layer's full S×S map is ever held. Windows: docs/probe.md.

Shapes: B copies, H query heads, Hkv key/value heads, G = H // Hkv query heads per key/value
head, R query rows of a block, S keys (the sequence length), D head dim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

PROBE_ATTENTION = "evalkit_probe"
# Elements of one block's logits (all copies and heads): 2**26 FP32 values are 256 MiB, which
# keeps a 32-head 4096-token layer at 16 blocks while bounding peak memory on small machines.
DEFAULT_BLOCK_ELEMENTS = 2**26


def layer_type(window: int | None) -> str:
    """transformers' layer_types name of a layer with this window."""
    return "full_attention" if window is None else "sliding_attention"


def unmasked_per_column(seq_len: int, window: int | None, device=None) -> torch.Tensor:
    """[S] float64: how many query rows see key column j (0-based): S − j, or min(W, S − j) under a window."""
    counts = torch.arange(seq_len, 0, -1, dtype=torch.float64, device=device)
    return counts if window is None else counts.clamp(max=window)


@dataclass
class ShiftRecorder:
    """Per-layer, per-column |ΔP| sums (not yet weighted by n_j) and first-column |Δlogit| sums (of
    the rows that see key 0, A the scaled logits the softmax sees) of copies 1..K against copy 0, over
    heads and query rows; the window each layer attended with."""

    seq_len: int
    n_shifted: int
    device: torch.device
    qk_dtype: torch.dtype  # the dtype q and k must arrive in: proves the RoPE variant took effect
    block_elements: int = DEFAULT_BLOCK_ELEMENTS
    column_sums: dict[int, torch.Tensor] = field(init=False, default_factory=dict)
    first_logit_sums: dict[int, torch.Tensor] = field(init=False, default_factory=dict)
    layer_windows: dict[int, int | None] = field(init=False, default_factory=dict)  # None: full causal attention

    def check_inputs(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, window: int | None = None) -> None:
        if query.dtype != self.qk_dtype or key.dtype != self.qk_dtype:
            raise RuntimeError(
                f"layer {layer_idx}: q/k arrived as {query.dtype}/{key.dtype}, expected {self.qk_dtype}: this "
                "architecture does not apply RoPE the way Llama, Qwen2 and Mistral do in transformers"
            )
        if layer_idx in self.layer_windows:
            raise RuntimeError(f"layer {layer_idx} attended twice in one forward pass")
        self.layer_windows[layer_idx] = window
        self.column_sums[layer_idx] = torch.zeros(self.n_shifted, self.seq_len, dtype=torch.float64, device=self.device)
        self.first_logit_sums[layer_idx] = torch.zeros(self.n_shifted, dtype=torch.float64, device=self.device)

    def add_block(
        self, layer_idx: int, probs_BHRK: torch.Tensor, key_start: int, logits_first_BHR: torch.Tensor | None
    ) -> None:
        """Add one block of query rows: probabilities over keys key_start.., first-key logits of the rows
        that see key 0 (None when no row of the block does)."""
        shifted, reference = probs_BHRK[1:].float(), probs_BHRK[:1].float()
        key_stop = key_start + probs_BHRK.shape[-1]
        differences = (shifted - reference).abs().sum(dim=(1, 2), dtype=torch.float64)
        self.column_sums[layer_idx][:, key_start:key_stop] += differences
        if logits_first_BHR is not None:
            first = logits_first_BHR.float()
            self.first_logit_sums[layer_idx] += (first[1:] - first[:1]).abs().sum(dim=(1, 2), dtype=torch.float64)

    def layer_groups(self) -> dict[str, list[int]]:
        """The layers seen: "all", and by the kind of attention they ran (full_attention, sliding_attention)."""
        grouped: dict[str, list[int]] = {"all": sorted(self.layer_windows)}
        for layer in grouped["all"]:
            grouped.setdefault(layer_type(self.layer_windows[layer]), []).append(layer)
        return grouped

    def normalised_columns(self, layers: Iterable[int]) -> torch.Tensor:
        """[K, S] float64: Σ over the layers of column j weighted by n_j (run.MEASUREMENT: Eq. 4, windows)."""
        total = torch.zeros(self.n_shifted, self.seq_len, dtype=torch.float64, device=self.device)
        for layer in layers:
            total += self.column_sums[layer] / unmasked_per_column(self.seq_len, self.layer_windows[layer], self.device)
        return total

    def first_logit_means(self, layers: Iterable[int]) -> torch.Tensor:
        """[K] float64: D_logit summed over the layers (run.MEASUREMENT: Eq. 5, windows)."""
        total = torch.zeros(self.n_shifted, dtype=torch.float64, device=self.device)
        for layer in layers:
            window = self.layer_windows[layer]
            total += self.first_logit_sums[layer] / (self.seq_len if window is None else min(window, self.seq_len))
        return total


def _row_blocks(seq_len: int, batch: int, heads: int, block_elements: int) -> list[tuple[int, int]]:
    rows = max(1, block_elements // (batch * heads * seq_len))
    return [(start, min(start + rows, seq_len)) for start in range(0, seq_len, rows)]


def _grouped(query_BHRD: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, H, R, D] -> [B, Hkv, G, R, D]: query head h uses key/value head h // G, as repeat_kv does."""
    b, h, r, d = query_BHRD.shape
    return query_BHRD.view(b, kv_heads, h // kv_heads, r, d)


def visible_keys(rows: torch.Tensor, keys: torch.Tensor, window: int | None) -> torch.Tensor:
    """[R, K] bool: query i sees key j iff j <= i and, under a window W, i − W < j (transformers' definition)."""
    visible = keys[None, :] <= rows[:, None]
    if window is not None:
        visible &= keys[None, :] > rows[:, None] - window
    return visible


def _block_probabilities(query_BHRD, key_BHkvKD, scaling: float, row_start: int, key_start: int, window):
    """Logits and probabilities of one block of query rows over keys key_start.., as eager attention computes them."""
    b, h, r, _ = query_BHRD.shape
    kv_heads, keys = key_BHkvKD.shape[1], key_BHkvKD.shape[2]
    logits = torch.matmul(_grouped(query_BHRD, kv_heads), key_BHkvKD.unsqueeze(2).transpose(-1, -2))
    logits_BHRK = logits.reshape(b, h, r, keys) * scaling  # rounded twice in the activation dtype, as eager does
    rows = torch.arange(row_start, row_start + r, device=logits.device)
    visible = visible_keys(rows, torch.arange(key_start, key_start + keys, device=logits.device), window)
    masked = logits_BHRK.masked_fill(~visible, float("-inf"))
    probs_BHRK = torch.softmax(masked, dim=-1, dtype=torch.float32).to(query_BHRD.dtype)
    return logits_BHRK, probs_BHRK


def _first_key_logits(logits_BHRK: torch.Tensor, row_start: int, key_start: int, window: int | None):
    """The first key's logits of the block's rows that see it ([B, H, R'], R' possibly 0), or None."""
    if key_start > 0:
        return None
    rows = logits_BHRK.shape[2]
    seeing = rows if window is None else max(0, min(rows, window - row_start))  # rows i < W see key 0
    return logits_BHRK[:, :, :seeing, 0] if seeing else None


def _refuse_what_the_probe_does_not_compute(module: torch.nn.Module, kwargs: dict) -> None:
    """Attention the probe would silently compute differently: refused rather than measured wrong."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"the probe attention does not implement logit soft-capping (softcap={kwargs['softcap']})")
    if kwargs.get("s_aux") is not None:
        raise ValueError("the probe attention does not implement attention sinks (s_aux)")
    if getattr(module, "is_causal", True) is False:
        raise ValueError("the probe attention is causal; this layer attends bidirectionally")


def probe_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    probe_recorder: ShiftRecorder | None = None,
    sliding_window: int | None = None,
    **_kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: causal attention (within the layer's sliding window, if it has one),
    blockwise, recording into `probe_recorder`.

    query [B, H, S, D], key and value [B, Hkv, S, D]; returns the output as [B, S, H, D] like eager
    attention, and no weights (the full maps are exactly what the probe never holds).
    """
    if dropout and module.training:
        raise ValueError("the probe attention has no dropout: call the model in eval mode")
    _refuse_what_the_probe_does_not_compute(module, _kwargs)
    batch, heads, seq_len, head_dim = query.shape
    if probe_recorder is not None:
        # (ignore: layer_idx is an int; torch types Module attributes as Tensor | Module)
        layer: int = module.layer_idx  # type: ignore[assignment]
        probe_recorder.check_inputs(layer, query, key, sliding_window)
    # Under the fp32 RoPE variant q and k arrive rotated in FP32: this cast is their one rounding.
    query, key = query.to(value.dtype), key.to(value.dtype)
    scaling = head_dim**-0.5 if scaling is None else scaling
    block_elements = probe_recorder.block_elements if probe_recorder is not None else DEFAULT_BLOCK_ELEMENTS
    kv_heads = key.shape[1]
    out_BHSD = torch.empty_like(query)
    for start, stop in _row_blocks(seq_len, batch, heads, block_elements):
        # Rows below `stop` never see keys at or beyond it, and under a window none before the first
        # row's reach: the block's keys are exactly that span.
        key_start = 0 if sliding_window is None else max(0, start - sliding_window + 1)
        logits, probs = _block_probabilities(
            query[:, :, start:stop], key[:, :, key_start:stop], scaling, start, key_start, sliding_window
        )
        if probe_recorder is not None:
            first = _first_key_logits(logits, start, key_start, sliding_window)
            probe_recorder.add_block(layer, probs, key_start, first)
        values = value[:, :, key_start:stop].unsqueeze(2)
        out = torch.matmul(_grouped(probs, kv_heads), values)
        out_BHSD[:, :, start:stop] = out.reshape(batch, heads, stop - start, head_dim)
    return out_BHSD.transpose(1, 2).contiguous(), None


def register_probe_attention() -> None:
    """Register the probe attention with transformers (idempotent)."""
    from evalkit.attention.hf import no_padding_mask, register_attention

    register_attention(PROBE_ATTENTION, probe_attention_forward, no_padding_mask)  # the probe never pads
