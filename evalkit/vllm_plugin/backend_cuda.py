"""vLLM's FlashAttention backend with evalkit's packed requests (registered as vLLM's CUSTOM backend).

Select it with `LLM(..., attention_backend="CUSTOM")` (evalkit's engine does on CUDA). Plain
requests run vLLM's FlashAttention kernels unchanged; document queries of packed requests are
recomputed with FlexAttention over the paged cache, with a BlockMask built from the document
boundaries once per step (see anchor_backend and kernels).

CUDA graphs: a graph replays kernels without running Python, so the document rows could not
be recomputed inside one. Full graphs are therefore limited to pure single-token decode
batches, which never hold document queries; other batches run attention eagerly (vLLM's
piecewise graphs leave attention outside the graph).
"""

from __future__ import annotations

from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadataBuilder,
)

from evalkit.vllm_plugin.anchor_backend import AnchorAttentionImplMixin, AnchorMetadataBuilderMixin


class AnchorFlashMetadataBuilder(AnchorMetadataBuilderMixin, FlashAttentionMetadataBuilder):
    anchor_impl = "flex"
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return cls._cudagraph_support


class AnchorFlashAttentionImpl(AnchorAttentionImplMixin, FlashAttentionImpl):
    anchor_impl = "flex"


class AnchorFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[AnchorFlashAttentionImpl]:
        return AnchorFlashAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AnchorFlashMetadataBuilder]:
        return AnchorFlashMetadataBuilder
