"""evalkit's vLLM plugin (docs/vllm.md): AnchorAttention packed requests and RoPE options, without forking vLLM.

`register()` is the `vllm.general_plugins` entry point (vLLM calls it in every process it starts). It
registers, by import path so that nothing heavy is imported until used, evalkit's model classes
(ARCHITECTURES, with rope.py's options) and the packed-request backend (anchor_backend.py): the CUSTOM
backend on CUDA; on CPU the CPU_ATTN slot, only in processes started for packed requests
(PACKED_ENVIRONMENT). A packed request's segments travel in SamplingParams.extra_args (packing.py),
which the TRACKER logits processor hands to the backend (tracker.py).
"""

from __future__ import annotations

import os

TRACKER = "evalkit.vllm_plugin.tracker:PackedRequestTracker"
CUDA_BACKEND = "evalkit.vllm_plugin.backend_cuda.AnchorFlashAttentionBackend"
CPU_BACKEND = "evalkit.vllm_plugin.backend_cpu.AnchorCPUAttentionBackend"
CUDA_BACKEND_NAME = "CUSTOM"  # what to pass as attention_backend= on CUDA
PACKED_ENVIRONMENT = "EVALKIT_VLLM_PACKED"  # "1" in the processes of an engine started for packed requests
ARCHITECTURES = {  # the checkpoint's architecture -> evalkit's vLLM model class
    "LlamaForCausalLM": "EvalkitLlamaForCausalLM",
    "Qwen2ForCausalLM": "EvalkitQwen2ForCausalLM",
    "MistralForCausalLM": "EvalkitMistralForCausalLM",
}


def register() -> None:
    """vLLM's general-plugin hook: register the model classes and the attention backends (idempotent)."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name in ARCHITECTURES.values():
        ModelRegistry.register_model(name, f"evalkit.vllm_plugin.models:{name}")
    register_backend(AttentionBackendEnum.CUSTOM, CUDA_BACKEND)  # used only where selected by name
    if current_platform.is_cpu():
        select_cpu_backend(packed=os.environ.get(PACKED_ENVIRONMENT) == "1")


def select_cpu_backend(*, packed: bool) -> None:
    """evalkit's backend in the CPU_ATTN slot for packed requests; otherwise vLLM's own (put back if
    an earlier engine in this process had replaced it; another plugin's choice is left alone)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if packed:
        register_backend(AttentionBackendEnum.CPU_ATTN, CPU_BACKEND)
    elif AttentionBackendEnum.CPU_ATTN.get_path() == CPU_BACKEND:
        AttentionBackendEnum.CPU_ATTN.clear_override()
