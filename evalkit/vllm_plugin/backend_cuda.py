"""vLLM's FlashAttention backend with evalkit's packed requests (registered as vLLM's CUSTOM backend).

Select it with `LLM(..., attention_backend="CUSTOM")` (evalkit's engine does on CUDA). Plain
requests run vLLM's FlashAttention kernels unchanged; document queries of packed requests are
recomputed with FlexAttention over the paged cache, with a BlockMask built from the document
boundaries once per step (see anchor_backend and kernels).

CUDA graphs: a graph replays kernels without running Python, so the document rows could not
be recomputed inside one. Full graphs are refused (AttentionCGSupport.NEVER: vLLM then runs
its piecewise graphs, which leave attention outside the graph, eager). Allowing them for
"pure single-token decode" batches was not safe: a batch of one-token steps can be prefill
chunks of one document token each, which a replayed graph would leave uncorrected.

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
