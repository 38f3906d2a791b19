"""Generated samples on disk, reused across runs: zero generation work on a rerun (docs/ruler.md:
what is keyed, and why not the count). The key is data_key's fields; the same key and count give
byte-identical files. (What a stored answer must match is runner.answer_key.)

A cache file is a header line, {"format": CACHE_FORMAT, "samples": N, "sha256": ...}, then one
sample per line; the checksum covers the samples' canonical JSON. The format is not in the key.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from evalkit.files import cache_root
from evalkit.ruler.fitting import DEFAULT_SIZING, check_sizing
from evalkit.ruler.kinds import constants_digest, task_kind
from evalkit.ruler.prompt import BASE, PromptFormat
from evalkit.ruler.sample import Sample, dumps_jsonl, loads_jsonl
from evalkit.ruler.spec import DEFAULT_SEED, GENERATOR_VERSION, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT, TaskSpec, as_spec


def data_key(
    task: str | TaskSpec,
    length: int,
    seed: int = DEFAULT_SEED,
    *,
    essays=None,
    qa_dir=None,
    prompt_format: PromptFormat | None = None,
    exact_lengths: bool = False,
    sizing: str = DEFAULT_SIZING,
) -> str:
    """A hash of everything that decides the samples but the tokenizer (the cache's folder) and their number."""
    spec, fmt = as_spec(task), prompt_format or BASE
    fields = {
        "version": GENERATOR_VERSION,
        "task": spec.name,
        "kind": spec.kind,
        "params": dict(spec.params),
        "templates": [spec.template, spec.answer_prefix, spec.max_new_tokens, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT],
        "length": int(length),
        "seed": int(seed),
        "format": fmt.cache_token(),
        "data": task_kind(spec).data_identity(spec, essays, qa_dir),
        "exact": bool(exact_lengths),
        "sizing": check_sizing(sizing),
        "constants": constants_digest(spec.kind),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cache_key(task: str | TaskSpec, tokenizer, length: int, seed: int = DEFAULT_SEED, **data) -> tuple[str, str]:
    """(tokenizer fingerprint, data_key): the cache file's folder and name. `data`: data_key's keywords."""
    from evalkit.corpus import tokenizer_fingerprint

    return tokenizer_fingerprint(tokenizer), data_key(task, length, seed, **data)


def cache_path(
    task: str | TaskSpec,
    tokenizer,
    length: int,
    seed: int = DEFAULT_SEED,
    cache_dir: Path | None = None,
    *,
    key: tuple[str, str] | None = None,
    **data,
) -> Path:
    """The one file of (task, length, seed, data) for this tokenizer. `key`: cache_key's, if derived already."""
    spec = as_spec(task)
    fingerprint, digest = key or cache_key(spec, tokenizer, length, seed, **data)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "ruler"
    return root / fingerprint / spec.name / f"{length}-s{seed}-{digest}.jsonl"


CACHE_FORMAT = "evalkit-ruler-cache-2"  # -2: samples carry their needles' depths


class StaleEntry(Exception):
    """A cache file that must not be served."""


def samples_checksum(samples: list[Sample]) -> str:
    return hashlib.sha256(dumps_jsonl(samples).encode("utf-8")).hexdigest()


def read_entry(path: Path, num_samples: int | None = None) -> list[Sample]:
    """The samples of a cache file whose header and checksum hold; else StaleEntry."""
    damaged = StaleEntry(f"RULER cache entry {path} does not match its checksum (edited or damaged); regenerating it")
    try:
        first, _, rest = path.read_text(encoding="utf-8").partition("\n")
        header = json.loads(first)
        samples = loads_jsonl(rest)
    except (ValueError, KeyError, TypeError):  # not UTF-8, no JSON header, not sample lines any more
        raise damaged from None
    if not isinstance(header, dict) or header.get("format") != CACHE_FORMAT:
        if isinstance(header, dict) and str(header.get("format")).startswith("evalkit-ruler-cache"):
            raise StaleEntry(f"RULER cache entry {path} is of an older format; regenerating it")
        raise damaged
    expected = header.get("samples") if num_samples is None else num_samples
    if len(samples) != expected or header.get("sha256") != samples_checksum(samples):
        raise damaged
    if [sample.index for sample in samples] != list(range(len(samples))):  # served by position: 0..n-1
        raise damaged
    return samples


_warned: set[str] = set()  # one warning per damaged file and process: a file read twice is warned about once


def load_or_generate(
    task: str | TaskSpec,
    tokenizer,
    length: int,
    num_samples: int,
    seed: int = DEFAULT_SEED,
    cache_dir: Path | None = None,
    *,
    key: tuple[str, str] | None = None,
    **data,
) -> list[Sample]:
    """The first `num_samples` samples, from the cache file, extended and rewritten atomically when
    it holds fewer. `data`: generate's keywords; `key`: their cache_key, if derived already."""
    from evalkit.files import atomic_write_text
    from evalkit.ruler.generation import generate

    spec = as_spec(task)
    path = cache_path(spec, tokenizer, length, seed, cache_dir, key=key, **data)
    try:
        stored = read_entry(path) if path.is_file() else []
    except StaleEntry as why:  # a cache: regenerate, never serve what was not generated
        if str(path) not in _warned:
            _warned.add(str(path))
            print(f"warning: {why}", file=sys.stderr, flush=True)
        stored = []
    if len(stored) >= num_samples:
        return stored[:num_samples]
    samples = generate(spec, tokenizer, length, num_samples, seed, first=stored, **data)
    header = {"format": CACHE_FORMAT, "samples": len(samples), "sha256": samples_checksum(samples)}
    atomic_write_text(path, json.dumps(header, sort_keys=True) + "\n" + dumps_jsonl(samples))
    return samples
