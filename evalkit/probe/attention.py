"""An attention function for transformers that measures shifted copies as it attends.

The probe runs one text as a batch of copies that differ only in their position ids: copy 0
at the reference shift Δ2, copies 1..K at shifts Δ1. In every layer this function computes
the attention probabilities exactly as transformers' eager attention does (logits in the
activation dtype, softmax in FP32, probabilities cast back to the activation dtype), adds
|P_k − P_0| and the first-key-column logit difference |A_k[:, 0] − A_0[:, 0]| into a
`ShiftRecorder`, and returns the ordinary attention output, so the next layer sees what it
would have seen. Rows are processed in blocks, so no layer's full S×S map is ever held, let
alone all layers' maps. A sliding layer attends within its window, as the model's own mask has
it (transformers hands the layer its window); the sums are also kept per layer type (sliding
and full layers), since global layers are where long-distance RoPE error can show.

Shape legend: B copies in the batch, H query heads, Hkv key/value heads, G = H // Hkv query
heads per key/value head, R query rows of a block, S keys (the sequence length), D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PROBE_ATTENTION = "evalkit_probe"
# Elements of one block's logits (all copies and heads): 2**26 FP32 values are 256 MiB, which
# keeps a 32-head 4096-token layer at 16 blocks while bounding peak memory on small machines.
DEFAULT_BLOCK_ELEMENTS = 2**26


@dataclass
class ShiftRecorder:
    """Per-column |ΔP| sums and first-column |Δlogit| sums of copies 1..K against copy 0.

    `column_sums[k, j]` is Σ over layers, heads and query rows i of |P_k[i, j] − P_0[i, j]|
    (not yet weighted by n_j); `first_logit_sums[k]` is Σ over layers, heads and rows of
    |A_k[i, 0] − A_0[i, 0]|, with A the scaled logits the softmax sees.
    """

    seq_len: int
    n_shifted: int
    device: torch.device
    qk_dtype: torch.dtype  # the dtype q and k must arrive in: proves the RoPE variant took effect
    block_elements: int = DEFAULT_BLOCK_ELEMENTS
    column_sums: torch.Tensor = field(init=False)
    first_logit_sums: torch.Tensor = field(init=False)
    layers_seen: set[int] = field(init=False, default_factory=set)
    # the same sums over the layers of one type only ("full_attention", "sliding_attention")
    column_sums_by_type: dict[str, torch.Tensor] = field(init=False, default_factory=dict)
    first_logit_sums_by_type: dict[str, torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.column_sums = torch.zeros(self.n_shifted, self.seq_len, dtype=torch.float64, device=self.device)
        self.first_logit_sums = torch.zeros(self.n_shifted, dtype=torch.float64, device=self.device)

    def check_inputs(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        if query.shape[0] != self.n_shifted + 1 or query.shape[2] != self.seq_len:
            raise RuntimeError(
                f"probe attention got batch {query.shape[0]} x {query.shape[2]} tokens, expected "
                f"{self.n_shifted + 1} x {self.seq_len}"
            )
        if query.dtype != self.qk_dtype or key.dtype != self.qk_dtype:
            raise RuntimeError(
                f"layer {layer_idx}: q/k arrived as {query.dtype}/{key.dtype}, expected {self.qk_dtype}: this "
                "architecture does not apply RoPE the way Llama, Qwen2 and Mistral do in transformers"
            )
        if layer_idx in self.layers_seen:
            raise RuntimeError(f"layer {layer_idx} attended twice in one forward pass")
        self.layers_seen.add(layer_idx)

    def add_block(
        self, probs_BHRS: torch.Tensor, logits_first_BHR: torch.Tensor, layer_type: str = "full_attention"
    ) -> None:
        """Add one block of query rows; a block ending at row r sees keys [0, r), the columns it fills."""
        shifted, reference = probs_BHRS[1:].float(), probs_BHRS[:1].float()
        keys = probs_BHRS.shape[-1]
        columns = (shifted - reference).abs().sum(dim=(1, 2), dtype=torch.float64)
        first = logits_first_BHR.float()
        first_logit = (first[1:] - first[:1]).abs().sum(dim=(1, 2), dtype=torch.float64)
        self.column_sums[:, :keys] += columns
        self.first_logit_sums += first_logit
        if layer_type not in self.column_sums_by_type:
            self.column_sums_by_type[layer_type] = torch.zeros_like(self.column_sums)
            self.first_logit_sums_by_type[layer_type] = torch.zeros_like(self.first_logit_sums)
        self.column_sums_by_type[layer_type][:, :keys] += columns
        self.first_logit_sums_by_type[layer_type] += first_logit

    def normalised_columns(self, layer_type: str | None = None) -> torch.Tensor:
        """[K, S] float64: column j weighted by n_j = 1 / (S − j), the paper's weight (of full causal
        attention, kept for sliding layers too so that the per-type sums add up to the total)."""
        unmasked = torch.arange(self.seq_len, 0, -1, dtype=torch.float64, device=self.device)
        sums = self.column_sums if layer_type is None else self.column_sums_by_type[layer_type]
        return sums / unmasked

    def first_logit_means(self, layer_type: str | None = None) -> torch.Tensor:
        """[K] float64: D_logit = (1/S) Σ_i Σ_(l,h) |ΔA_i1|."""
        sums = self.first_logit_sums if layer_type is None else self.first_logit_sums_by_type[layer_type]
        return sums / self.seq_len


def _row_blocks(seq_len: int, batch: int, heads: int, block_elements: int) -> list[tuple[int, int]]:
    rows = max(1, block_elements // (batch * heads * seq_len))
    return [(start, min(start + rows, seq_len)) for start in range(0, seq_len, rows)]


def _grouped(query_BHRD: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, H, R, D] -> [B, Hkv, G, R, D]: query head h uses key/value head h // G, as repeat_kv does."""
    b, h, r, d = query_BHRD.shape
    return query_BHRD.view(b, kv_heads, h // kv_heads, r, d)


def _block_probabilities(query_BHRD, key_BHkvSD, scaling: float, row_start: int, window: int | None = None):
    """Logits and probabilities of one block of query rows, computed as eager attention does
    (a sliding layer's keys limited to its window: row i sees keys j with i − j < window)."""
    b, h, r, _ = query_BHRD.shape
    kv_heads, keys = key_BHkvSD.shape[1], key_BHkvSD.shape[2]
    logits = torch.matmul(_grouped(query_BHRD, kv_heads), key_BHkvSD.unsqueeze(2).transpose(-1, -2))
    logits_BHRS = logits.reshape(b, h, r, keys) * scaling  # rounded twice in the activation dtype, as eager does
    rows = torch.arange(row_start, row_start + r, device=logits.device)
    future = torch.arange(keys, device=logits.device)[None, :] > rows[:, None]
    if window is not None:
        future = future | (rows[:, None] - torch.arange(keys, device=logits.device)[None, :] >= window)
    masked = logits_BHRS.masked_fill(future, float("-inf"))
    probs_BHRS = torch.softmax(masked, dim=-1, dtype=torch.float32).to(query_BHRD.dtype)
    return logits_BHRS, probs_BHRS


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
    """transformers attention interface: causal attention, blockwise, recording into `probe_recorder`.

    query [B, H, S, D], key and value [B, Hkv, S, D]; returns the output as [B, S, H, D] like eager
    attention, and no weights (the full maps are exactly what the probe never holds).
    """
    if dropout and module.training:
        raise ValueError("the probe attention has no dropout: call the model in eval mode")
    batch, heads, seq_len, head_dim = query.shape
    window = sliding_window if sliding_window is not None and sliding_window < seq_len else None
    layer_type = "full_attention" if sliding_window is None else "sliding_attention"
    if probe_recorder is not None:
        probe_recorder.check_inputs(module.layer_idx, query, key)
    # Under the fp32 RoPE variant q and k arrive rotated in FP32: this cast is their one rounding.
    query, key = query.to(value.dtype), key.to(value.dtype)
    scaling = head_dim**-0.5 if scaling is None else scaling
    block_elements = probe_recorder.block_elements if probe_recorder is not None else DEFAULT_BLOCK_ELEMENTS
    kv_heads = key.shape[1]
    out_BHSD = torch.empty_like(query)
    for start, stop in _row_blocks(seq_len, batch, heads, block_elements):
        # Causality: rows below `stop` never see keys at or beyond it, so the block stops there.
        logits, probs = _block_probabilities(query[:, :, start:stop], key[:, :, :stop], scaling, start, window)
        if probe_recorder is not None:
            probe_recorder.add_block(probs, logits[..., 0], layer_type)
        values = value[:, :, :stop].unsqueeze(2)
        out = torch.matmul(_grouped(probs, kv_heads), values)
        out_BHSD[:, :, start:stop] = out.reshape(batch, heads, stop - start, head_dim)
    return out_BHSD.transpose(1, 2).contiguous(), None


def _no_mask(*, attention_mask=None, **_kwargs):
    """transformers' mask hook: the probe builds its causal mask itself and never pads."""
    if attention_mask is not None and not bool(torch.all(attention_mask)):
        raise ValueError("the probe attention does not take padded batches")
    return None


def register_probe_attention() -> str:
    """Register the probe attention with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PROBE_ATTENTION, probe_attention_forward)
    AttentionMaskInterface.register(PROBE_ATTENTION, _no_mask)
    return PROBE_ATTENTION
