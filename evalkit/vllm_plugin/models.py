"""vLLM model classes for evalkit's checkpoints (ARCHITECTURES): vLLM's own Llama, Qwen2 and Mistral
(weights, kernels, parallelism unchanged) whose rotary embeddings then honour evalkit's RoPE options
(rope.install_rope_options); evalkit's engine selects one with hf_overrides={"architectures": [name]}.
"""

from __future__ import annotations

from typing import cast

from torch import nn
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from evalkit.vllm_plugin.rope import RopeOptions, install_rope_options


class _ServingOptions:
    """Mixin: build the stock model, then apply the RoPE options the config carries."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs) -> None:
        # A mixin: vLLM's model class follows in the bases and takes these arguments.
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)  # type: ignore[call-arg]
        model_config = vllm_config.model_config
        install_rope_options(
            cast(nn.Module, self), RopeOptions.from_config(model_config.hf_config), model_config.max_model_len
        )


class EvalkitLlamaForCausalLM(_ServingOptions, LlamaForCausalLM): ...


class EvalkitQwen2ForCausalLM(_ServingOptions, Qwen2ForCausalLM): ...


class EvalkitMistralForCausalLM(_ServingOptions, MistralForCausalLM): ...
