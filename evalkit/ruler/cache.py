"""Generated samples on disk, reused across runs: zero generation work on a rerun.

The file name carries a hash of everything that decides the data: generator version,
tokenizer fingerprint, task and its templates, length, number of samples, seed, prompt format,
the data files the task reads and the sizing. The same key always gives byte-identical files.
The default sizing ("exact") adds nothing to the key, so keys made before sizings existed hold.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from evalkit.ruler.fitting import DEFAULT_SIZING, check_sizing
from evalkit.ruler.prompt import BASE, PromptFormat
from evalkit.ruler.sample import Sample, dumps_jsonl, loads_jsonl
from evalkit.ruler.spec import DEFAULT_SEED, GENERATOR_VERSION, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT, task_spec


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
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return tokenizer_fingerprint(tokenizer), digest


def cache_path(
    task: str, tokenizer, length: int, num_samples: int, seed: int = DEFAULT_SEED, cache_dir: Path | None = None, **data
) -> Path:
    from evalkit.corpus.tokenizer import cache_root

    fingerprint, digest = cache_key(task, tokenizer, length, num_samples, seed, **data)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "ruler"
    return root / fingerprint / task / f"{length}-n{num_samples}-s{seed}-{digest}.jsonl"


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
    from evalkit.results_io import atomic_write_text
    from evalkit.ruler.generation import generate

    path = cache_path(task, tokenizer, length, num_samples, seed, cache_dir, **data)
    if path.is_file():
        try:
            samples = loads_jsonl(path.read_text(encoding="utf-8"))
            if len(samples) == num_samples:
                return samples
        except (ValueError, KeyError):
            pass  # a damaged file is regenerated below
    samples = generate(task, tokenizer, length, num_samples, seed, **data)
    atomic_write_text(path, dumps_jsonl(samples))
    return samples
