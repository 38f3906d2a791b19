"""Generated samples on disk, reused across runs: zero generation work on a rerun.

The file name carries a hash of everything that decides the data: generator version,
tokenizer fingerprint, task and its templates, length, number of samples, seed, prompt format,
the data files the task reads, the sizing and the generator's module constants (kinds.py). The
same key always gives byte-identical files. The default sizing ("exact") and constants equal to
version 1's add nothing to the key, so keys made before either was keyed in still hold.

A cache file is a header line, {"format": "evalkit-ruler-cache", "samples": N, "sha256": ...},
then one sample per line. The checksum covers the samples' canonical JSON (Sample.to_json), so
an entry edited by hand (one answer changed, still valid JSON) or damaged is never served: it
is regenerated, with one warning on stderr. Files written before checksums existed have no
header; they are treated the same way (stale), which rewrites them once in the new format.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from evalkit.ruler.fitting import DEFAULT_SIZING, check_sizing
from evalkit.ruler.kinds import changed_constants_digest
from evalkit.ruler.prompt import BASE, PromptFormat
from evalkit.ruler.sample import Sample, dumps_jsonl, loads_jsonl
from evalkit.ruler.spec import DEFAULT_SEED, GENERATOR_VERSION, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT, task_spec
from evalkit.storage import cache_root


def _file_identity(path: Path) -> list:
    """Cheap identity of a data file (no hashing of large files on every run)."""
    if not path.is_file():
        return [str(path), None]
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _data_identity(task: str, essays, qa_dir) -> list:
    spec = task_spec(task)
    if spec.kind == "niah" and spec.params["haystack"] == "essay":
        if essays is None:
            return ["builtin-prose"]
        from evalkit.ruler.essay import _looks_like_path

        if isinstance(essays, Path) or _looks_like_path(str(essays)):
            return _file_identity(Path(essays))
        return ["text", hashlib.sha256(str(essays).encode()).hexdigest()]
    if spec.kind == "qa":
        from evalkit.ruler.qa import dataset_path

        path = dataset_path(spec.params["dataset"], qa_dir)
        return _file_identity(path) if path is not None else [None]
    return []


def cache_key(
    task: str,
    tokenizer,
    length: int,
    num_samples: int,
    seed: int,
    *,
    essays=None,
    qa_dir=None,
    prompt_format: PromptFormat | None = None,
    exact_lengths: bool = False,
    sizing: str = DEFAULT_SIZING,
) -> tuple[str, str]:
    """(tokenizer fingerprint, hash of everything else that decides the data)."""
    from evalkit.corpus import tokenizer_fingerprint

    spec = task_spec(task)
    fmt = prompt_format or BASE
    fields = {
        "version": GENERATOR_VERSION,
        "task": task,
        "kind": spec.kind,
        "params": dict(spec.params),
        "templates": [spec.template, spec.answer_prefix, spec.max_new_tokens, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT],
        "length": int(length),
        "num_samples": int(num_samples),
        "seed": int(seed),
        "format": fmt.cache_token(),
        "data": _data_identity(task, essays, qa_dir),
        "exact": bool(exact_lengths),
    }
    if check_sizing(sizing) != DEFAULT_SIZING:  # only other sizings key in: exact keys stay as they were
        fields["sizing"] = sizing
    changed = changed_constants_digest(spec.kind)
    if changed is not None:  # likewise: the generator's constants key in once they differ from version 1's
        fields["constants"] = changed
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return tokenizer_fingerprint(tokenizer), digest


def cache_path(
    task: str, tokenizer, length: int, num_samples: int, seed: int = DEFAULT_SEED, cache_dir: Path | None = None, **data
) -> Path:
    fingerprint, digest = cache_key(task, tokenizer, length, num_samples, seed, **data)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "ruler"
    return root / fingerprint / task / f"{length}-n{num_samples}-s{seed}-{digest}.jsonl"


CACHE_FORMAT = "evalkit-ruler-cache"


class StaleEntry(Exception):
    """A cache file that must not be served. `kind` groups its warning: one per damaged file,
    one per process for all files of the old format."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def samples_checksum(samples: list[Sample]) -> str:
    return hashlib.sha256(dumps_jsonl(samples).encode("utf-8")).hexdigest()


def dumps_entry(samples: list[Sample]) -> str:
    """A cache file's text: the header with the samples' checksum, then the samples."""
    header = {"format": CACHE_FORMAT, "samples": len(samples), "sha256": samples_checksum(samples)}
    return json.dumps(header, sort_keys=True) + "\n" + dumps_jsonl(samples)


def read_entry(path: Path, num_samples: int) -> list[Sample]:
    """The samples of a cache file whose header and checksum hold; StaleEntry otherwise."""
    damaged = StaleEntry(
        f"RULER cache entry {path} does not match its checksum (edited or damaged); regenerating it", str(path)
    )
    try:
        first, _, rest = path.read_text(encoding="utf-8").partition("\n")
    except UnicodeDecodeError:
        raise damaged from None
    header = _header(first)
    if header is None:
        raise StaleEntry(
            f"RULER cache entries without a checksum (written by an older evalkit), such as {path}, "
            "are regenerated on first use",
            "old-format",
        )
    try:
        samples = loads_jsonl(rest)
    except (ValueError, KeyError, TypeError):  # not sample lines any more
        raise damaged from None
    if len(samples) != num_samples or header.get("sha256") != samples_checksum(samples):
        raise damaged
    return samples


def _header(line: str) -> dict | None:
    try:
        header = json.loads(line)
    except ValueError:
        return None
    return header if isinstance(header, dict) and header.get("format") == CACHE_FORMAT else None


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    """One line on stderr per kind and process: a run touching hundreds of stale entries
    (an upgraded cache) says so once."""
    if kind not in _warned:
        _warned.add(kind)
        print(message, file=sys.stderr, flush=True)


def load_or_generate(
    task: str,
    tokenizer,
    length: int,
    num_samples: int,
    seed: int = DEFAULT_SEED,
    cache_dir: Path | None = None,
    **data,
) -> list[Sample]:
    """The cached samples when present, else generated, written atomically, and returned.

    `data` takes generate's keywords: essays=, qa_dir=, prompt_format=, exact_lengths=, sizing=.
    """
    from evalkit.ruler.generation import generate
    from evalkit.storage import atomic_write_text

    path = cache_path(task, tokenizer, length, num_samples, seed, cache_dir, **data)
    if path.is_file():
        try:
            return read_entry(path, num_samples)
        except StaleEntry as why:  # a cache: regenerate, never serve what was not generated
            _warn_once(why.kind, f"warning: {why}")
    samples = generate(task, tokenizer, length, num_samples, seed, **data)
    atomic_write_text(path, dumps_entry(samples))
    return samples
