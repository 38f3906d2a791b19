"""Anchor-mode attention inside a stock vLLM backend, added by subclassing, never by patching.

The stock backend runs every token of every step as without the plugin (plain requests are
stock vLLM, bit for bit). Of a packed request only the document queries of a prefill step
differ from causal attention: the impl then recomputes just those rows with evalkit's anchor
kernels, reading keys and values back from the paged cache (the stock writer has filled it,
this step's tokens included), and overwrites them. Question and generated tokens keep the
stock result: they attend to everything.

    builder.build()   -> the stock metadata + `evalkit_document_queries`: one plan per packed
                         row with document queries in this step (rows from tracker.packed_rows)
    impl.forward()    -> the stock forward, then anchor attention for the planned rows

Chunked prefill and preemption need nothing special: a document query's keys are positions
0..L-1 of its own request, all in the cache, read into the workspace (workspace.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from evalkit.vllm_plugin.cache_layout import LearnedLayout, learn_layout
from evalkit.vllm_plugin.kernels import anchor_attention, anchor_block_mask, gather_paged, warm_up_anchor_flex
from evalkit.vllm_plugin.tracker import PackedRow, packed_rows
from evalkit.vllm_plugin.workspace import PrefixWorkspace, shared_prefix_workspace

METADATA_FIELD = "evalkit_document_queries"
# vLLM's cache dtype names that packed requests serve -> the workspace's dtype ("auto": the model's,
# torch's default while vLLM builds it); any other (a quantized cache) is refused.
_CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16, "float32": torch.float32}


@dataclass
class DocumentQueries:
    """One packed request's document queries in this step: its positions L-Q .. L-1."""

    query_start: int  # first row of them in the step's flattened query tensor
    num_queries: int  # Q
    doc_ids: torch.Tensor  # long [L] on the device: documents of key positions 0..L-1
    block_table_row: torch.Tensor  # the request's blocks
    block_mask: Any = None  # FlexAttention BlockMask, built once per step for every layer

    @property
    def rows(self) -> slice:
        return slice(self.query_start, self.query_start + self.num_queries)


def plan_document_queries(common, rows: Mapping[int, PackedRow], impl: str) -> list[DocumentQueries]:
    """Plans for the packed rows of a step described by vLLM's CommonAttentionMetadata."""
    query_start = common.query_start_loc_cpu.tolist()
    # Per-row context lengths: the host copy is exact for prefill rows, the only ones planned.
    host = getattr(common, "seq_lens_cpu_upper_bound", None)
    seq_lens = (host if host is not None else common.seq_lens.cpu()).tolist()
    device = common.block_table_tensor.device
    plans = []
    for row, packed in rows.items():
        if row >= common.num_reqs:
            continue
        computed = seq_lens[row] - (query_start[row + 1] - query_start[row])
        # Anchor queries attend to the anchor only: causal attention already gives them that.
        first = max(computed, packed.segments.anchor_length)
        stop = min(seq_lens[row], packed.doc_ids.numel())
        if first >= stop:
            continue  # no document query in this step: decoding, or the question's chunk
        doc_ids = packed.doc_ids_on(device)[:stop]
        plans.append(
            DocumentQueries(
                query_start=query_start[row] + first - computed,
                num_queries=stop - first,
                doc_ids=doc_ids,
                block_table_row=common.block_table_tensor[row],
                # The ids come from anchor_document_ids on the host, in order by construction: no
                # order check, so building the mask syncs nothing back from the GPU in a step.
                block_mask=anchor_block_mask(doc_ids, stop - first, check_order=False) if impl == "flex" else None,
            )
        )
    return plans


class AnchorMetadataBuilderMixin:
    """Put before a stock AttentionMetadataBuilder in the bases: attaches the step's plans."""

    anchor_impl: ClassVar[str] = "blocked"  # evalkit.vllm_plugin.kernels implementation
    # Each KV-cache group gets its own plans (its own block tables): no metadata copying.
    supports_update_block_table: bool = False

    def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)  # type: ignore[misc]
        rows = packed_rows()
        plans = plan_document_queries(common_attn_metadata, rows, self.anchor_impl) if rows else []
        setattr(metadata, METADATA_FIELD, plans)
        return metadata


class AnchorAttentionImplMixin:
    """Put before a stock AttentionImpl in the bases: stock forward, then the document rows."""

    anchor_impl: ClassVar[str] = "blocked"
    # Set by the stock AttentionImpl that follows this mixin in the bases.
    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    do_kv_cache_update: Callable[..., None]  # (layer, key, value, kv_cache, slot_mapping): the cache writer
    _evalkit_layout: LearnedLayout | None = None
    _evalkit_views: tuple | None = None  # (the cache tensor's identity, its views)
    _evalkit_workspace: PrefixWorkspace | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._evalkit_workspace = self._build_prefix_workspace()
        if self.anchor_impl == "flex" and torch.cuda.is_available():
            self._warm_up_anchor_kernels(torch.device("cuda", torch.cuda.current_device()))

    def _warm_up_anchor_kernels(self, device: torch.device) -> None:
        """FlexAttention compiled now, while vLLM builds the model (its default dtype is then the model's)."""
        warm_up_anchor_flex(
            self.num_heads, self.num_kv_heads, self.head_size, self.scale, torch.get_default_dtype(), device
        )

    def _build_prefix_workspace(self) -> PrefixWorkspace | None:
        """The prefix K/V buffer (workspace.py), made while vLLM loads the model; None outside a vLLM
        model build, or for a quantized cache (packed requests refuse it)."""
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        name = getattr(self, "kv_cache_dtype", "auto")
        dtype = torch.get_default_dtype() if name == "auto" else _CACHE_DTYPES.get(name)
        if config is None or dtype is None:
            return None
        return shared_prefix_workspace(
            config.model_config.max_model_len,
            config.cache_config.block_size,
            self.num_kv_heads,
            self.head_size,
            dtype,
            config.device_config.device,
        )

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        plans = getattr(attn_metadata, METADATA_FIELD, None)
        if plans:
            self._attend_documents(layer, query, kv_cache, plans, output)
        return output

    def _attend_documents(self, layer, query, kv_cache, plans: list[DocumentQueries], output) -> None:
        self._check_packed_supported(max(plan.doc_ids.numel() for plan in plans))
        layout = self._layout(layer, kv_cache)
        views = self._views(layout, kv_cache)
        for plan in plans:
            key, value = self._prefix(layout, views, kv_cache, plan)
            options = {"scale": self.scale, "impl": self.anchor_impl, "block_mask": plan.block_mask}
            output[plan.rows] = anchor_attention(query[plan.rows], key, value, plan.doc_ids, **options).to(output.dtype)

    def _prefix(self, layout: LearnedLayout, views, kv_cache: torch.Tensor, plan: DocumentQueries):
        """Keys and values [L, Hkv, D] of the request's positions 0..L-1: into the workspace where the
        cache has strided views (every GPU backend seen); otherwise copies, through the learned
        layout (the CPU's AMX layout, whose KV cache is a fixed size, not sized from a profile)."""
        length, row = plan.doc_ids.numel(), plan.block_table_row
        if views is None:
            return layout.gather(kv_cache, row, length)
        if self._evalkit_workspace is not None:
            return self._evalkit_workspace.gather(views[0], views[1], row, length)
        return gather_paged(views[0], row, length), gather_paged(views[1], row, length)

    def _views(self, layout: LearnedLayout, kv_cache: torch.Tensor):
        """The layer's cache seen as [NB, BS, Hkv, D] keys and values (None: read through gathers),
        made once per cache tensor (a layer keeps its tensor for the engine's life)."""
        key = (kv_cache.data_ptr(), tuple(kv_cache.shape), kv_cache.stride())
        if self._evalkit_views is None or self._evalkit_views[0] != key:
            self._evalkit_views = (key, layout.views(kv_cache))
        return self._evalkit_views[1]

    def _layout(self, layer, kv_cache: torch.Tensor) -> LearnedLayout:
        """Learned once per layer, through this backend's own cache writer (see cache_layout)."""
        if self._evalkit_layout is None:
            elements_per_block = math.prod(kv_cache.shape[1:])
            block_size, remainder = divmod(elements_per_block, 2 * self.num_kv_heads * self.head_size)
            if remainder:
                raise RuntimeError(f"cannot read {type(self).__name__}'s KV cache of shape {tuple(kv_cache.shape)}")

            self._evalkit_layout = learn_layout(
                functools.partial(self.do_kv_cache_update, layer),
                tuple(kv_cache.shape[1:]),
                kv_cache.dtype,
                kv_cache.device,
                block_size,
                self.num_kv_heads,
                self.head_size,
            )
        return self._evalkit_layout

    def _sliding_window(self) -> int | None:
        """Keys a query may see under the layer's sliding window (None: no window), from either
        backend's encoding: the CPU impl keeps the window size or -1, FlashAttention (left, right) or (-1, -1)."""
        window = getattr(self, "sliding_window", None)
        left = window[0] if isinstance(window, tuple) else window
        if left is None or left < 0:
            return None
        return left + 1 if isinstance(window, tuple) else left

    def _check_packed_supported(self, num_keys: int) -> None:
        """Packed requests implement plain softmax attention only; say so instead of computing something else."""
        cache_dtype = getattr(self, "kv_cache_dtype", "auto")
        quantized = cache_dtype != "auto" and cache_dtype not in _CACHE_DTYPES
        window = self._sliding_window()
        unsupported = {
            # A window wider than every context is no window.
            "sliding-window attention": window is not None and window < num_keys,
            "ALiBi": getattr(self, "alibi_slopes", None) is not None,
            "logit soft-capping": bool(getattr(self, "logits_soft_cap", None)),
            "attention sinks": getattr(self, "sinks", None) is not None,
            "a quantized KV cache": quantized,
            "decode context parallelism": getattr(self, "dcp_world_size", 1) > 1,
        }
        found = [name for name, present in unsupported.items() if present]
        if found:
            raise NotImplementedError(f"evalkit packed requests do not support {', '.join(found)}")
