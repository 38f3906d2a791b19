"""Checks that a checkpoint loads as it was written, or fails with one line saying why
(docs/reliability.md): `check_checkpoint` before a loader's first read, `load_pretrained` after
loading, by transformers' own loading report, not safetensors headers against the state dict:
transformers renames and fuses weights on load (MoE experts, multimodal wrappers) and knows which
are tied, so an independent comparison would refuse valid checkpoints. A checkpoint named by its
hub name resolves here too (checkpoint_source; docs/models.md).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.errors import UserError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Read while a tokenizer or a generation config is loaded; config.json is read_config's.
CHECKPOINT_JSON = (
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "generation_config.json",
)
KEYS_SHOWN = 3  # weight names quoted in an error: enough to see the pattern, short enough for one line
# A name meant for the hub, when no local path has it: two parts (org, name) or an @revision, no
# glob character (a quoted glob is a path pattern), not starting as a path does (/, ., ~).
HUB_SHAPED = re.compile(r"\A(?![/.~])[^*?\[]*\Z")
# The hub's repo id rules (huggingface_hub's validate_repo_id): ASCII letters, digits, '_', '-',
# '.', starting and ending with a letter, digit or '_', at most 96 characters, no '--' or '..'.
HUB_REPO_PART = re.compile(r"(?!.*(--|\.\.))\w(?:[\w.-]{0,94}\w)?", re.ASCII)
# A revision is a branch, a tag or a commit: git's ref-name rules that keep it a name, not a path
# (no '..', no leading '/' or '-', no '//', no component starting with '.', no control character,
# space or ~^:?*[\, no '@{', not ending in '/', '.' or '.lock').
BAD_REVISION = re.compile(r"\.\.|//|@\{|(^|/)\.|^[/-]|[/.]$|\.lock$|[\x00-\x20\x7f~^:?*\[\\]")
# What evalkit's loaders read from a repo: config, tokenizer and safetensors weights. Repos often
# also hold pickle weights, ONNX and GGUF exports, several times the model's size.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
DEFAULT_REVISION = "main"  # huggingface_hub's, when no @revision is given


@dataclass(frozen=True, order=True)
class HubModel:
    """A hub model as resolved: the repo, the revision asked for (None: the default branch), the
    commit that revision named when resolved, and that commit's snapshot directory."""

    repo: str
    revision: str | None
    commit: str
    path: Path

    @property
    def run(self) -> str:
        """Its run name: the repo's name part, with the revision when one was pinned (two
        revisions of one model are two runs, stored apart)."""
        name = self.repo.rsplit("/", 1)[1]
        return f"{name}@{self.revision.replace('/', '-')}" if self.revision else name

    def record(self) -> dict[str, str]:
        """What a summary's provenance records of it."""
        return {"repo": self.repo, "revision": self.revision or DEFAULT_REVISION, "commit": self.commit}


def check_checkpoint(path: str | Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Refuse what would load wrongly or fail with a traceback; returns config.json."""
    path = Path(path)
    config = check_config_files(path, trust_remote_code=trust_remote_code)
    for file in weight_files(path):
        _check_weights(file)
    return config


def check_config_files(path: Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """config.json, and every JSON file a tokenizer reads, read as transformers will."""
    config = read_config(path)
    _check_custom_code(path, config, trust_remote_code)
    check_json_files(path)
    load_config(path, trust_remote_code=trust_remote_code)
    return config


def checkpoint_directory(path: str | Path, who: str) -> Path:
    """The resolved checkpoint directory a path or hub name names; `who`: the loader that asks."""
    resolved = checkpoint_source(str(path))[0].resolve()
    if not resolved.is_dir():
        raise UserError(
            f"no checkpoint directory at {resolved}: {who} loads a checkpoint directory "
            "or a hub name org/name[@revision]"
        )
    if not (resolved / "config.json").is_file():
        raise UserError(f"{resolved} has no config.json: not a transformers checkpoint")
    return resolved


def hub_cache() -> Path:
    """The hub cache huggingface_hub uses, read from the environment now: its own constant is read
    once, at import, and would miss an HF_HUB_CACHE or HF_HOME set after that."""
    from huggingface_hub import constants

    named = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if named:
        return Path(named).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_is_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it at import."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any((flag or "").upper() in ("1", "ON", "YES", "TRUE") for flag in flags) or constants.HF_HUB_OFFLINE


def checkpoint_source(name: str, *, cache_only: bool = False) -> tuple[Path, HubModel | None]:
    """The directory a checkpoint name stands for: a local path as given (it wins over the hub),
    else a hub name's snapshot in the hub cache, with what it resolved to; `cache_only` never
    downloads, as HF_HUB_OFFLINE=1. A name that is neither a hub name nor a local path comes back
    as a path, for the caller's own "no checkpoint there" error."""
    if not name.strip():
        raise UserError(f"{name!r} names no checkpoint: give a checkpoint directory or a hub name org/name[@revision]")
    repo, at, revision = name.partition("@")
    if not HUB_SHAPED.match(name) or not (at or re.fullmatch(r"[^/]+/+[^/]+", repo)):
        return Path(name).expanduser(), None  # an absolute or deeper path: huggingface_hub is not even imported
    if not Path(name).expanduser().exists():
        _check_hub_name(name, repo, revision if at else None)
    return _source(name, repo, revision if at else None, Path.cwd(), hub_cache(), cache_only or hub_is_offline())


def _check_hub_name(name: str, repo: str, revision: str | None) -> None:
    """A name read as a hub name (no local path has it) follows the hub's rules, or one line says
    which it breaks: `org//name` is not `org/name`, and `@../../x` is not a revision but a path."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(HUB_REPO_PART.fullmatch(part) for part in parts) or repo.endswith(".git"):
        problem = f"the repo {repo!r} is not org/name (letters, digits, '_', '-', '.'; no '--' or '..')"
    elif revision is not None and (revision == "" or BAD_REVISION.search(revision)):
        problem = f"the revision {revision!r} is not a branch, tag or commit name (git's ref-name rules)"
    else:
        return
    raise UserError(f"{name!r} is not a local path, nor a valid hub name org/name[@revision]: {problem}")


@functools.cache
def _source(
    name: str, repo: str, revision: str | None, cwd: Path, cache: Path, offline: bool
) -> tuple[Path, HubModel | None]:
    """checkpoint_source of a hub-shaped name, once per process: a branch moving mid-run would
    otherwise give one command the config of one commit and the weights of another, and the note
    is said once. Keyed by the working directory too: a relative name is another directory elsewhere."""
    local = Path(name).expanduser()
    if local.exists():
        if (cache / f"models--{repo.replace('/', '--')}").is_dir():  # both could be meant
            print(
                f"note: {name} is the local directory {local.resolve()}, not the hub model in {cache}", file=sys.stderr
            )
        return local, None
    path = _snapshot(repo, revision, cache, offline)
    return path, HubModel(repo, revision, path.name, path)


def _snapshot(repo: str, revision: str | None, cache: Path, offline: bool) -> Path:
    """The snapshot directory of `repo` at `revision`: from the cache, downloaded into it unless
    offline. A miss says both readings, since `runs/x` mistyped reads as a hub name too."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    name = f"{repo}@{revision}" if revision else repo
    try:
        found = snapshot_download(
            repo, revision=revision, cache_dir=cache, local_files_only=offline, allow_patterns=HUB_FILES
        )
    except LocalEntryNotFoundError:
        where = "only the cache was read" if offline else "the hub could not be reached"
        fill = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
        raise UserError(
            f"{name} is neither a local directory nor in the hub cache {cache} ({where}); fill it with: {fill}"
        ) from None
    except Exception as err:  # not found, gated, HTTP errors: huggingface_hub raises many kinds
        raise UserError(f"{name} is not a local directory, and the hub did not give it: {one_line(err)}") from None
    # A refs file (or the cache) edited to point elsewhere must not make another directory the model.
    snapshots = (cache / f"models--{repo.replace('/', '--')}" / "snapshots").resolve()
    if Path(found).resolve().parent != snapshots:
        raise UserError(
            f"{name} resolved to {found}, which is not a snapshot in the hub cache {snapshots}; "
            f"its refs file may be damaged: fill it again with hf download {repo}"
        )
    return Path(str(found))


def read_config(path: Path) -> dict[str, Any]:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise UserError(f"{path} has no config.json: not a transformers checkpoint")
    config = _read_json(file)
    if not isinstance(config, dict):
        raise UserError(
            f"{file} must hold a JSON object, not {type(config).__name__}; restore it from the checkpoint's source"
        )
    return config


def check_json_files(path: Path) -> None:
    """Each JSON file a tokenizer or generation config is read from parses, or a UserError names it."""
    for name in CHECKPOINT_JSON:
        if (Path(path) / name).is_file():
            _read_json(Path(path) / name)


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read {file}: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{file} is not valid JSON ({err}); restore it from the checkpoint's source") from None


def load_config(path: str | Path, *, trust_remote_code: bool = False):
    """transformers' config of a local checkpoint; whatever its validation raises is one line."""
    from transformers import AutoConfig

    file = Path(path) / "config.json"
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as err:  # transformers and huggingface_hub raise many kinds here
        raise UserError(
            f"{file} is not a valid config: {one_line(err)}; restore it from the checkpoint's source"
        ) from None


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    if (Path(path) / "config.json").is_file():  # AutoTokenizer reads it too, and would fail on it
        check_config_files(Path(path), trust_remote_code=trust_remote_code)
    else:
        check_json_files(Path(path))
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as err:  # tokenizers, sentencepiece and transformers raise many kinds on a bad file
        raise UserError(
            f"cannot load the tokenizer from {_faulty_tokenizer_file(Path(path))}: {one_line(err)}; "
            "restore the tokenizer files from the checkpoint's source"
        ) from None


def _faulty_tokenizer_file(path: Path) -> Path:
    """Which file a failed tokenizer load most likely choked on: tokenizer.json if the tokenizers
    library cannot read it alone, else tokenizer_config.json (the class, the special tokens)."""
    fast = path / "tokenizer.json"
    if fast.is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(fast))
        except Exception:  # any failure to read it alone puts the fault there
            return fast
    return path / "tokenizer_config.json"


def one_line(err: BaseException, limit: int = 300) -> str:
    """An error's message on one line (its type when it has none), cut to `limit` characters:
    libraries spread one fault over several lines (pydantic-style validation errors)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_custom_code(path: Path, config: dict[str, Any], trust_remote_code: bool) -> None:
    """An auto_map is custom Python shipped with the checkpoint; it is needed only when transformers
    does not know the model_type itself (many checkpoints of built-in types carry one anyway)."""
    from transformers import CONFIG_MAPPING

    auto_map = config.get("auto_map")
    if not auto_map or trust_remote_code or config.get("model_type") in CONFIG_MAPPING:
        return
    classes = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else str(auto_map)
    raise UserError(
        f"{path}/config.json needs custom model code shipped with the checkpoint (auto_map: {classes}) and "
        "trust_remote_code is off: evalkit runs no checkpoint code unless asked; read that code, then turn "
        "trust_remote_code on (train: --set model.trust_remote_code=true; engines: trust_remote_code=True)"
    )


def weight_files(path: Path) -> list[Path]:
    if (path / SAFETENSORS).is_file():
        return [path / SAFETENSORS]
    if (path / SAFETENSORS_INDEX).is_file():
        return _shards(path)
    pickles = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
    if pickles:
        raise UserError(
            f"{path} holds pickle weights only ({pickles[0]}): evalkit loads safetensors only (unpickling can run "
            'code); convert once with python -c "from transformers import AutoModelForCausalLM as M; '
            f"M.from_pretrained('{path}').save_pretrained('NEW_DIR')\", copy the tokenizer files beside it, use NEW_DIR"
        )
    raise UserError(f"{path} holds no weights ({SAFETENSORS} or {SAFETENSORS_INDEX}): give a complete checkpoint")


def _shards(path: Path) -> list[Path]:
    index = path / SAFETENSORS_INDEX
    try:
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise UserError(
            f"{index} is not a valid safetensors index ({err}); restore it from the checkpoint's source"
        ) from None
    absent = [name for name in names if not (path / name).is_file()]
    if absent:
        raise UserError(
            f"{path} lacks {len(absent)} of the {len(names)} weight files its index names ({absent[0]}); copy them in"
        )
    return [path / name for name in names]


def _check_weights(file: Path) -> None:
    """Refuse a weight file that is truncated (opening it checks that the data its header describes
    is all there: it fails here, not half-way through loading) or holds a NaN or an infinity (such
    a model scores, every prediction empty or garbage, as if it were merely bad). Read once per
    version of the file."""
    from safetensors import SafetensorError

    try:
        stat = file.stat()
        found = _non_finite_weights(str(file), stat.st_size, stat.st_mtime_ns)
    except (SafetensorError, OSError) as err:
        raise UserError(f"{file} is truncated or corrupt ({err}); copy it again from its source") from None
    if found:
        shown = _some([f"{name} ({count:,} values)" for name, count in found], " tensors")
        raise UserError(
            f"{file} holds NaN or infinite weights: {shown}; evalkit does not score a model with non-finite "
            "weights: use an earlier checkpoint, or re-save this one from a healthy model"
        )


@functools.lru_cache(maxsize=64)
def _non_finite_weights(file: str, _size: int, _mtime_ns: int) -> list[tuple[str, int]]:
    """(tensor name, count of non-finite values) for each floating tensor of `file` that has any;
    read one tensor at a time, so the memory held is one tensor's. Size and mtime key the cache."""
    import torch
    from safetensors import safe_open

    found = []
    with safe_open(file, framework="pt") as weights:
        for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensor = weights.get_tensor(name)
            if tensor.is_floating_point():
                bad = int(tensor.numel() - torch.isfinite(tensor).sum())
                if bad:
                    found.append((name, bad))
    return found


def check_loading_info(path: str | Path, info: dict[str, Any], *, allowed_unexpected: Iterable[str] = ()) -> None:
    """Refuse a loaded model whose weights did not all come from the checkpoint (`info`: from_pretrained's
    output_loading_info). `allowed_unexpected`: name prefixes left out on purpose (the probe loads no LM head)."""
    allowed = tuple(allowed_unexpected)
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(key for key in info.get("unexpected_keys") or () if not key.startswith(allowed))
    mismatched = sorted(info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"lacks {_weights(missing)} its config.json needs ({_some(missing)})")
    if unexpected:
        problems.append(f"holds {_weights(unexpected)} its config.json has no place for ({_some(unexpected)})")
    if mismatched:
        shapes = [f"{key} stored {list(stored)}, config {list(wanted)}" for key, stored, wanted in mismatched]
        problems.append(f"has {_weights(mismatched)} of another shape than its config.json gives ({_some(shapes)})")
    if problems:
        raise UserError(
            f"{path} {'; '.join(problems)}: evalkit does not evaluate randomly initialised weights; give the "
            "config.json the weights were trained with, or re-save the checkpoint from the trained model"
        )


def _weights(keys: list) -> str:
    return f"{len(keys)} weight{'s' if len(keys) != 1 else ''}"


def _some(names: list[str], what: str = "") -> str:
    shown = ", ".join(names[:KEYS_SHOWN])
    return shown + (f", … {len(names) - KEYS_SHOWN} more{what}" if len(names) > KEYS_SHOWN else "")


def load_pretrained(
    auto_class,
    path: str | Path,
    *,
    trust_remote_code: bool = False,
    allowed_unexpected: Iterable[str] = (),
    progress_bar: bool = True,
    **kwargs,
):
    """`auto_class.from_pretrained(path, **kwargs)`, then check_loading_info (check_checkpoint is the
    caller's, made before its first read of the checkpoint). `progress_bar=False` hides transformers'
    loading bar from a caller that reports its own progress (the two would interleave)."""
    with _no_loading_report(progress_bar):
        model, info = auto_class.from_pretrained(
            path,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # only so that mis-shaped weights reach check_loading_info
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
    check_loading_info(path, info, allowed_unexpected=allowed_unexpected)
    return model


@contextmanager
def _no_loading_report(progress_bar: bool) -> Iterator[None]:
    """transformers logs a table of missing and unexpected weights as a warning; check_loading_info
    turns the same facts into evalkit's one-line error, so the table would only bury that line."""
    from transformers.utils import logging as hf_logging

    verbosity, bars_on = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if not progress_bar:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_on:
            hf_logging.enable_progress_bar()
