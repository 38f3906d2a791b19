"""The engine a benchmark asks for (name and settings), built only when a unit needs it
(evalkit.sweep.pipeline, the Ray executor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalkit.store.result_format import STANDARD

if TYPE_CHECKING:
    from evalkit.models.precision import Serving


@dataclass(frozen=True)
class EngineChoice:
    """The engine every checkpoint is evaluated with: its registry name and keyword settings."""

    name: str = "hf"
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Any) -> EngineChoice:
        """From a benchmark's settings (engine, engine_args, batch_size, max_length, dtype, encoding).
        Any encoding but the standard one packs documents: vLLM then needs evalkit's attention backend."""
        chosen = {**settings.engine_args, "batch_size": settings.batch_size, "max_length": settings.max_length}
        if settings.dtype:
            chosen["dtype"] = settings.dtype
        if settings.encoding != STANDARD and settings.engine == "vllm":
            chosen["packed"] = True
        return cls(settings.engine, chosen)

    def served(self, path: Path) -> Serving:
        """How the engine will serve the checkpoint at `path`: its dtype and RoPE regime, known before
        it is built (what results are keyed under: the recorded regime is the used one)."""
        from evalkit.engines import ENGINE_NAMES
        from evalkit.models.precision import served_regime

        # evalkit's engines take `serving` (default trained); one registered beside them serves stock
        serving = self.settings.get("serving") or ("trained" if self.name in ENGINE_NAMES else "stock")
        return served_regime(path, serving, self.settings.get("dtype"), self.settings.get("device") or "auto")


class LazyEngine:
    """The checkpoint's engine, built on first `get()`: a checkpoint whose units are all on disk
    already loads no model. Closed (if built) when the block ends, before the next checkpoint's
    engine starts: two vLLM engines would not fit one GPU."""

    def __init__(self, choice: EngineChoice, path: Path, open_engine: Callable[..., Any] | None = None) -> None:
        self.choice, self.path = choice, path
        self._open = open_engine
        self._engine = None

    def get(self):
        if self._engine is None:
            from evalkit.engines import get_engine

            self._engine = (self._open or get_engine)(self.choice.name, self.path, **self.choice.settings)
        return self._engine

    def info(self) -> dict[str, Any] | None:
        return self._engine.engine_info() if self._engine is not None else None

    def __enter__(self) -> LazyEngine:
        return self

    def __exit__(self, *_exc) -> None:
        if self._engine is not None:
            self._engine.close()
