"""vLLM's CPU attention backend with evalkit's packed requests (registered in the CPU_ATTN slot).

On CPU, vLLM always takes the backend in its CPU_ATTN slot, so `register()` puts this class
there. Everything stock is kept: plain requests run the stock kernels; document queries of
packed requests are recomputed with per-document SDPA (see anchor_backend).
"""

from __future__ import annotations

from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)

from evalkit.vllm_plugin.anchor_backend import AnchorAttentionImplMixin, AnchorMetadataBuilderMixin


class AnchorCPUMetadataBuilder(AnchorMetadataBuilderMixin, CPUAttentionMetadataBuilder):
    anchor_impl = "blocked"


class AnchorCPUAttentionImpl(AnchorAttentionImplMixin, CPUAttentionBackendImpl):
    anchor_impl = "blocked"


class AnchorCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[AnchorCPUAttentionImpl]:
        return AnchorCPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AnchorCPUMetadataBuilder]:
        return AnchorCPUMetadataBuilder
