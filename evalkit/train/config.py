"""Typed training configuration: dataclasses, named YAML recipes with `base:` inheritance, overrides.

A recipe's keys mirror `TrainConfig`; `base: NAME` starts from another recipe. Every key and type
is checked before any work starts (docs/training.md): a typo is never a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evalkit.attention import Paradigm
from evalkit.attention.hf import ROPE_PRECISIONS
from evalkit.attention.packing import WINDOW_STARTS
from evalkit.errors import UserError
from evalkit.files import read_text
from evalkit.models.check import HubModel, checkpoint_source
from evalkit.models.refs import is_checkpoint
from evalkit.package_data import CONFIG_DIR, recipe_folder
from evalkit.train.regime import BF16_DTYPES, DTYPES, GRAD_ACCUM_DTYPES
from evalkit.train.synthetic import PHRASINGS

FLOAT32_MAX = 3.4028234663852886e38


def _at_least(lowest: int, default: Any, note: str = "") -> Any:
    """A field that must be at least `lowest` unless null (validate); `note` says what the bound means."""
    return field(default=default, metadata={"at_least": (lowest, note)})


@dataclass
class ModelConfig:
    path: str | None = None  # a local HF checkpoint (or hub name) to continue pretraining; None: build from scratch
    arch: str = "llama"  # from scratch: llama | qwen2 | mistral
    hidden_size: int = _at_least(1, 256)
    num_layers: int = _at_least(1, 4)
    num_heads: int = _at_least(1, 4)
    num_kv_heads: int = _at_least(1, 4)
    intermediate_size: int = _at_least(1, 688)
    # from scratch; default 4 x seq_len, so RULER can go beyond training length
    max_position_embeddings: int | None = _at_least(1, None, " (or null: 4 x seq_len)")
    rope_theta: float | None = None  # overrides the checkpoint's base: the paper's only RoPE change
    tie_embeddings: bool = True
    # evalkit implementation: auto (blocked on CPU, flex on CUDA) | blocked | flex | flash | dense
    attention: str = "auto"
    # how the anchor meets a sliding layer's window: "window" (the model's own mask: seen while within
    # the window) | "sink" (always seen); see evalkit.attention.masks. Recorded in each checkpoint's meta.
    window_anchor: str = "window"
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    source: str = "builtin"  # builtin | a .jsonl file | a saved HF datasets directory | a hub dataset name
    split: str = "train"
    text_field: str = "text"
    domain_field: str = "domain"  # optional in the data; the domain tags of anchor_tag come from it
    tokenizer: str | None = None  # default: the checkpoint's own, or the built-in BPE for a model built from scratch
    vocab_size: int = _at_least(1, 2048)  # built-in BPE only
    retrieval_fraction: float = 0.5  # built-in corpus: share of synthetic retrieval documents
    num_retrieval_docs: int = _at_least(0, 4000)  # built-in corpus: how many synthetic retrieval documents to draw
    copy_fraction: float = 0.0  # built-in corpus: share of synthetic copy documents (the induction skill alone)
    # built-in corpus: plain (three fixed templates), varied (many phrasings) or broad (more, RULER's among them)
    retrieval_phrasing: str = "plain"
    # use only the first N documents of the source
    max_documents: int | None = _at_least(1, None, " (or null: every document)")
    window_start: str = "bos"  # bos | document: docs/training.md's "Window start"


@dataclass
class OptimConfig:
    # torch's AdamW refuses some bad values itself, but with a traceback once the model is built
    lr: float = _at_least(0, 2e-5, " (0 keeps the weights as they are)")
    weight_decay: float = _at_least(0, 0.1)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = _at_least(0, 1e-8)
    warmup_steps: int = _at_least(0, 0)
    schedule: str = "constant"  # constant | cosine (to min_lr_ratio x lr)
    min_lr_ratio: float = 0.1
    grad_clip: float | None = _at_least(0, 1.0, " (0 or null: no clipping)")


@dataclass
class CheckpointConfig:
    every: int = _at_least(1, 100)  # a checkpoint to resume from every N steps
    final_count: int = _at_least(1, 5)  # the evaluation window: the last K checkpoints ...
    final_spacing: int = _at_least(1, 10)  # ... M steps apart, ending at max_steps
    keep_periodic: bool = False  # keep resume checkpoints outside the evaluation window
    io_timeout_minutes: float = 120.0  # distributed: the other ranks' wait on rank 0 (docs/training.md)


@dataclass
class TrainConfig:
    name: str = "run"
    paradigm: Paradigm = Paradigm.ANCHOR
    seq_len: int = _at_least(16, 1024)
    max_steps: int = _at_least(1, 200)
    windows_per_step: int = _at_least(1, 8)  # the global batch, in windows
    # windows per forward pass on each process (gradient accumulation covers the rest)
    micro_batch: int = _at_least(1, 1)
    # the precision regime, each tensor's dtype under each setting: docs/training.md's "Precision" table
    dtype: str = "fp32"  # fp32 | bf16 | bf16_full
    rope_precision: str = "fp32"  # fp32 | bf16
    grad_accum_dtype: str = "fp32"  # fp32 | bf16
    grad_checkpointing: bool = False
    seed: int = 0
    out: str | None = None  # default runs/<name>-<paradigm>
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def run_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / f"{self.name}-{self.paradigm.value}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["paradigm"] = self.paradigm.value
        return data

    def checkpoint_steps(self) -> set[int]:
        """Steps of the evaluation window (the last K checkpoints, M steps apart)."""
        return set(range(self.max_steps, 0, -self.checkpoint.final_spacing)[: self.checkpoint.final_count])

    def validate(self) -> None:
        _check_numbers(self)
        for ok, message in _rules(self):
            if not ok:
                raise UserError(message)


def _rules(c: TrainConfig) -> list[tuple[bool, str]]:
    """The settings' other rules, as (holds, the error if not); the _at_least bounds hold already."""
    m, o, d = c.model, c.optim, c.data
    choices = {  # setting: (its value, the values it may take)
        "dtype": (c.dtype, DTYPES),
        "grad_accum_dtype": (c.grad_accum_dtype, GRAD_ACCUM_DTYPES),
        "model.arch": (m.arch, ("llama", "qwen2", "mistral")),
        "model.attention": (m.attention, ("auto", "blocked", "flex", "flash", "dense")),
        "model.window_anchor": (m.window_anchor, ("window", "sink")),
        "optim.schedule": (o.schedule, ("constant", "cosine")),
        "data.retrieval_phrasing": (d.retrieval_phrasing, PHRASINGS),
        "data.window_start": (d.window_start, WINDOW_STARTS),
    }
    return [
        *[
            (value in allowed, f"{name} must be one of {', '.join(allowed)}, got {value!r}")
            for name, (value, allowed) in choices.items()
        ],
        (
            c.rope_precision in ROPE_PRECISIONS,
            f"rope_precision must be {' or '.join(ROPE_PRECISIONS)}, got {c.rope_precision!r}",
        ),
        (
            c.rope_precision == "fp32" or c.dtype in BF16_DTYPES,
            "rope_precision=bf16 needs dtype=bf16 or bf16_full (an fp32 run has no bf16 to rotate in)",
        ),
        (
            c.grad_accum_dtype == "fp32" or c.dtype == "bf16_full",
            "grad_accum_dtype=bf16 needs dtype=bf16_full (other dtypes make fp32 gradients)",
        ),
        (
            m.attention != "flash" or c.dtype in BF16_DTYPES,
            "model.attention=flash needs dtype=bf16 or bf16_full (flash-attn runs fp16/bf16 only)",
        ),
        (
            m.hidden_size % m.num_heads == 0 and m.num_heads % m.num_kv_heads == 0,
            f"model.hidden_size ({m.hidden_size}) must be a multiple of model.num_heads ({m.num_heads}), "
            f"and num_heads a multiple of model.num_kv_heads ({m.num_kv_heads})",
        ),
        (m.rope_theta is None or m.rope_theta > 0, f"model.rope_theta must be positive (or null), got {m.rope_theta}"),
        (
            0.0 <= d.retrieval_fraction <= 1.0,
            f"data.retrieval_fraction must be between 0 and 1, got {d.retrieval_fraction}",
        ),
        (
            0.0 <= d.copy_fraction and d.retrieval_fraction + d.copy_fraction <= 1.0,
            "data.copy_fraction must be at least 0, and retrieval_fraction + copy_fraction at most 1",
        ),
        (
            0 <= o.beta1 < 1 and 0 <= o.beta2 < 1,
            f"optim.beta1 and optim.beta2 must be in [0, 1), got {o.beta1}, {o.beta2}",
        ),
        (0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must be between 0 and 1, got {o.min_lr_ratio}"),
        (  # AdamW's first step size and decay factor are float32 scalars: beyond, torch fails with a traceback
            o.beta1 >= 1 or max(o.lr / (1 - o.beta1), o.lr * o.weight_decay) <= FLOAT32_MAX,
            f"optim.lr={o.lr} is too large: AdamW's first step size lr / (1 - beta1), and lr x weight_decay, "
            "must stay below float32's largest value, 3.4e38",
        ),
        (
            c.checkpoint.io_timeout_minutes > 0,
            f"checkpoint.io_timeout_minutes must be positive, got {c.checkpoint.io_timeout_minutes}",
        ),
    ]


def _check_numbers(section: Any, prefix: str = "") -> None:
    """Every float finite (`--set optim.lr=nan` parses as a float: a run trained with one would log
    nan losses from its first step on), every _at_least field (unless null) at least its bound."""
    for f in dataclasses.fields(section):
        name, value = f"{prefix}{f.name}", getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            _check_numbers(value, f"{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{name} must be a finite number, got {value}")
        elif "at_least" in f.metadata and value is not None and value < f.metadata["at_least"][0]:
            lowest, note = f.metadata["at_least"]
            raise UserError(f"{name} must be at least {lowest}{note}, got {value}")


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith((".jsonl", ".json"))


def check_inputs(config: TrainConfig) -> None:
    """Files the run reads exist (hub names are left to the hub): fail before any work starts."""
    for what, name in (("model path", config.model.path), ("tokenizer path", config.data.tokenizer)):
        if name and _looks_local(name) and not Path(name).expanduser().exists():
            raise UserError(f"{what} {name} does not exist")
    source = config.data.source
    if _looks_local(source) and not Path(source).expanduser().exists():
        kind = "data file" if source.endswith(".jsonl") else "data source"
        raise UserError(f"{kind} {source} does not exist (a .jsonl file, a datasets directory or a hub name)")
    _check_model_attention(config)


def model_directory(config: TrainConfig) -> Path | None:
    """model.path as the loaders read it: a local path as given, a hub name as its snapshot in the
    hub cache. The recipe keeps the name as given: that is what the run's meta.json shows and what
    a resume compares; the commit it resolved to is the meta's base_model (base_model_record)."""
    return checkpoint_source(config.model.path)[0] if config.model.path else None


def base_model_record(config: TrainConfig) -> dict[str, dict[str, str]]:
    """{"base_model": repo, revision, commit} for a run started from a hub model; {} otherwise."""
    hub: HubModel | None = checkpoint_source(config.model.path)[1] if config.model.path else None
    return {"base_model": hub.record()} if hub is not None else {}


def _check_model_attention(config: TrainConfig) -> None:
    """A checkpoint whose attention evalkit cannot reproduce is refused before the data is read; a
    hub name is resolved here, so a miss in the hub cache is too."""
    folder = model_directory(config)
    if folder is None or not is_checkpoint(folder):
        return  # built from scratch, or a name build_model reports in its own words
    from transformers import AutoConfig

    from evalkit.attention.features import check_attention_supported

    try:
        hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=config.model.trust_remote_code)
    except (OSError, ValueError):
        return  # build_model reports an unreadable checkpoint in its own words
    check_attention_supported(hf_config, "evalkit train")
    from evalkit.train.model import check_rope_theta

    check_rope_theta(hf_config, config.model.rope_theta)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


# One optional sign and ASCII digits: "--5" (what lstrip("-") let through to int()) and "²" are refused.
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """`value` as type `tp`, or a UserError naming the key and the expected type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in (option for option in options if option is not type(None)):
            with suppress(UserError):
                return _coerce(value, option, key)
        raise UserError(f"{key}: expected {' or '.join(_type_name(o) for o in options)}, got {value!r}")
    if tp is Paradigm:
        try:
            return Paradigm.parse(value)
        except ValueError as err:
            raise UserError(f"{key}: {err}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with suppress(ValueError):
                return float(value)  # YAML reads "2e-5" as a string
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise UserError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise UserError(f"unknown config key {full!r}; valid keys here: {', '.join(sorted(names))}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise UserError(f"{full}: expected a section of keys, got {value!r}")
            _apply(current, value, prefix=f"{full}.")
        else:
            setattr(obj, key, _coerce(value, hints[key], full))


def recorded_config(values: dict[str, Any]) -> TrainConfig:
    """The config a run recorded (meta.json's "config"), unvalidated: its files may be elsewhere now."""
    config = TrainConfig()
    _apply(config, values)
    return config


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe path as given, or configs/NAME.yaml (evalkit's recipes, shipped in the package)."""
    for candidate in (Path(name_or_path), CONFIG_DIR / name_or_path, CONFIG_DIR / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))) if CONFIG_DIR.is_dir() else "none"
    raise UserError(f"no config {name_or_path!r}: give a YAML path or one of the recipes: {available}")


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values, section by section (a recipe over its base, a saved config over
    the defaults)."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_sections(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path.resolve() in seen:
        raise UserError(f"config {path} inherits from itself through 'base:'")
    try:
        data = yaml.safe_load(read_text(path, "config")) or {}
    except yaml.YAMLError as err:
        raise UserError(f"config {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"config {path} must be a mapping of keys to values")
    _resolve_relative_paths(data, recipe_folder(path))
    base = data.pop("base", None)
    if base is None:
        return data
    base_path = path.parent / f"{base}.yaml" if not str(base).endswith(".yaml") else path.parent / base
    if not base_path.is_file():
        base_path = resolve_recipe(str(base))
    return merge_sections(_read_recipe(base_path, (*seen, path.resolve())), data)


RECIPE_RELATIVE_PATHS = (("model", "path"), ("data", "tokenizer"), ("data", "source"))


def _resolve_relative_paths(data: dict[str, Any], recipe_dir: Path) -> None:
    """Paths a recipe writes as ./x or ../x are relative to the recipe file, not to where evalkit runs,
    so a recipe can name files shipped beside it (a base checkpoint) and work from any directory."""
    for section, key in RECIPE_RELATIVE_PATHS:
        value = (data.get(section) or {}).get(key) if isinstance(data.get(section), dict) else None
        if isinstance(value, str) and value.startswith(("./", "../")):
            data[section][key] = str((recipe_dir / value).resolve())


def _parse_set(assignment: str) -> tuple[list[str], Any]:
    if "=" not in assignment:
        raise UserError(f"--set {assignment!r}: expected key=value, e.g. --set optim.lr=1e-4")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def load_recipe(
    recipe: str | None, overrides: dict[str, Any] | None = None, sets: list[str] | None = None
) -> TrainConfig:
    """The config of a recipe, then flag overrides (dotted keys), then --set assignments, validated."""
    config = TrainConfig()
    if recipe:
        path = resolve_recipe(recipe)
        values = _read_recipe(path)
        values.setdefault("name", path.stem)
        _apply(config, values)
    nested: dict[str, Any] = {}
    items = [(key.split("."), value) for key, value in (overrides or {}).items() if value is not None]
    items += [_parse_set(s) for s in sets or []]
    for parts, value in items:
        target = nested
        for depth, part in enumerate(parts[:-1]):
            target = target.setdefault(part, {})
            if not isinstance(target, dict):  # `--set model=3 --set model.path=x`
                section = ".".join(parts[: depth + 1])
                raise UserError(
                    f"{'.'.join(parts)}: {section} is set to a value above, not a section; set one of the two"
                )
        target[parts[-1]] = value
    _apply(config, nested)
    config.validate()
    return config
