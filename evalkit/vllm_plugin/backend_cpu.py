"""vLLM's CPU attention backend with evalkit's packed requests, which `register()` puts in the
CPU_ATTN slot (the one vLLM always takes on CPU). Plain requests run the stock kernels; document
queries of packed requests are recomputed with per-document SDPA (anchor_backend).
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
