"""Dtypes and devices: the one place evalkit names them and turns names into torch objects.

evalkit's names (bf16, fp16, fp32) are used everywhere a user types or reads one: the CLI,
configs, results. Libraries call them otherwise: torch.bfloat16, "bfloat16" for vLLM and
lm-eval. torch is imported only when a torch object is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from evalkit.errors import UserError

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("bf16", "fp16", "fp32")
LONG_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch's, vLLM's, lm-eval's
# How RoPE's cos/sin tables meet a bf16 model: "cast" rounds them to the model's dtype, as stock
# models do (the paper's subject); "fp32" keeps them in float32. Used by the probe (evalkit.probe.measure)
# and by serving (evalkit.vllm_plugin.rope), which must not import the probe.
ROPE_VARIANTS = ("cast", "fp32")


def check_dtype(name: str, allowed: Sequence[str] = DTYPE_NAMES) -> str:
    """`name` if it is one of `allowed`, else a UserError listing them."""
    if name not in allowed:
        raise UserError(f"unknown dtype {name!r}; choose one of: {', '.join(allowed)}")
    return name


def engine_dtype(asked: str | None = None, device: str = "auto") -> str:
    """The dtype an engine computes in: the one asked for, else bf16 on CUDA and fp32 elsewhere.
    The engines resolve theirs here, and the benchmarks key a stored result by it before any
    engine is built (sweep.engine_choice.EngineChoice.served): the recorded one is the used one."""
    if asked:
        return check_dtype(asked)
    return "bf16" if resolve_device(device).type == "cuda" else "fp32"


# How an engine serves a checkpoint: docs/training.md, "Serving as trained".
SERVINGS = ("trained", "stock")


@dataclass(frozen=True)
class Serving:
    """The regime an engine serves a checkpoint in: its compute dtype, the dtype RoPE's frequencies
    are held in, and where q and k are rotated (ROPE_VARIANTS: in the model's dtype, or fp32)."""

    asked: str  # SERVINGS
    dtype: str
    frequencies: str = "fp32"
    rotation: str = "cast"
    off_regime: str = ""  # served stock off the trained regime: that regime, said (else "")
    unlike_stock: bool = False  # served as trained, and that is not what a stock serving computes

    def key_facts(self) -> dict[str, str]:
        """What the serving adds to a stored result's key: nothing where it computes what a stock
        serving does (so results from before the setting keep their keys), else the regime."""
        return {"served": self.describe()} if self.unlike_stock else {}

    def record(self) -> dict[str, str]:
        return {"serving": self.asked, "rope_frequencies": self.frequencies, "rope_rotation": self.rotation}

    def describe(self) -> str:
        return f"{self.dtype}, RoPE frequencies {self.frequencies}, rotation {self.rotation}"


def served_regime(
    path: Path,
    serving: str = "trained",
    asked_dtype: str | None = None,
    device: str = "auto",
    rotation: str | None = None,
) -> Serving:
    """How `serving` serves the checkpoint at `path` (docs/training.md), from its meta.json's precision
    record (evalkit.train.regime.record). Under "trained" a dtype or a `rotation` (the vllm engine's
    rope, docs/vllm.md) that contradicts it is refused; under "stock" the rotation is cast unless named."""
    from evalkit.models.refs import checkpoint_meta

    if serving not in SERVINGS:
        raise UserError(f"serving must be one of {', '.join(SERVINGS)}, got {serving!r}")
    precision = checkpoint_meta(Path(path)).get("precision") or {}
    recorded = str(precision.get("dtype"))
    stock = Serving("stock", engine_dtype(asked_dtype, device))
    if recorded not in ("fp32", "bf16", "bf16_full"):
        served = replace(stock, asked=serving)
    else:
        trained = Serving(
            "trained",
            "fp32" if recorded == "fp32" else "bf16",
            "bf16" if precision.get("buffers") == "bf16" else "fp32",
            "fp32" if recorded != "fp32" and precision.get("rotation") == "fp32" else "cast",
        )
        unlike_stock = replace(stock, asked="trained") != trained
        if serving == "trained" and asked_dtype and check_dtype(asked_dtype) != trained.dtype:
            raise UserError(
                f"{path} trained in {recorded}: serving=trained computes in {trained.dtype}, not {asked_dtype}; "
                "drop the dtype, or serve it stock (--engine-arg serving=stock)"
            )
        if serving == "trained":
            served = replace(trained, unlike_stock=unlike_stock)
        else:
            served = replace(stock, off_regime=f"{recorded}: {trained.describe()}" if unlike_stock else "")
    if rotation is None or rotation == served.rotation:
        return served
    if serving == "trained":
        raise UserError(
            f"{path} is served as trained, rotating q and k as it trained ({served.rotation}), not rope={rotation}; "
            "drop rope, or serve it stock (serving=stock) to probe that variant"
        )
    return replace(served, rotation=rotation)


def long_dtype_name(name: str) -> str:
    """ "bfloat16" for "bf16": what torch attributes, vLLM and lm-eval call evalkit's dtype names."""
    return LONG_DTYPE_NAMES[check_dtype(name)]


def torch_dtype(name: str) -> torch.dtype:
    """torch.bfloat16 for "bf16", and so on."""
    import torch

    return getattr(torch, long_dtype_name(name))


def resolve_device(name: str) -> torch.device:
    """auto (CUDA when torch sees one, else CPU), cpu, cuda or cuda:N, refused with one line if unusable."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but torch sees no CUDA device")
    return device
