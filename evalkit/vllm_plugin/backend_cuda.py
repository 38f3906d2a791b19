"""vLLM's FlashAttention backend with evalkit's packed requests (vLLM's CUSTOM backend: select it
with `LLM(..., attention_backend="CUSTOM")`, as evalkit's engine does on CUDA). Document queries
of packed requests are recomputed with FlexAttention over the paged cache (anchor_backend).

CUDA graphs replay kernels without running Python, so the document rows could not be
recomputed inside one. Full graphs are refused (AttentionCGSupport.NEVER: vLLM then runs its
piecewise graphs, attention outside them, eager); even "pure single-token decode" batches are
not safe: their one-token steps can be prefill chunks of one document token each.

FlexAttention is compiled when the impl is built (AnchorAttentionImplMixin.__init__), not at
the first packed request: vLLM runs the model under torch's fail-on-recompile stance.
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
    _cudagraph_support = AttentionCGSupport.NEVER

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
