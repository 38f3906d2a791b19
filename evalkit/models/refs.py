"""From the paths a user types to the checkpoints they mean.

A path may be one checkpoint (a directory with config.json) or a run directory holding
`step-<N>` checkpoints; shell globs expand before we see them, quoted globs expand here.
Every checkpoint gets a run name (its run directory's name) and a step, which is how results
are stored and averaged; a hub name's (docs/models.md): the repo's name part, step 0 or its meta.json's.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import UserError
from evalkit.files import read_json_object
from evalkit.models.check import HubModel, checkpoint_source

# A checkpoint's record (step, paradigm, precision, hub source): written last, so it marks a whole one.
META = "meta.json"
# What checkpoint_meta keeps of it; "hub" is an export of a hub model's, "base_model" the commit a
# run trained from a hub model started from.
META_KEYS = tuple(
    "step tokens_seen paradigm anchor_token config precision data_fingerprint tokenizer_fingerprint git_hash model"
    " source dtype attention hub base_model".split()
)
STEP_DIR = re.compile(r"^step-(\d+)$")  # the one step-directory rule: step-<N>, written by step_dir_name


@dataclass(frozen=True, order=True)
class CheckpointRef:
    run: str
    step: int
    path: Path
    hub: HubModel | None = field(default=None, compare=False)  # set when named by its hub name


def step_dir_name(step: int) -> str:
    """The directory of a run's checkpoint at `step`, and of its results under an --out directory."""
    return f"step-{step}"


def is_checkpoint(path: Path) -> bool:
    """The one "is this a checkpoint" check: a directory holding an HF config.json."""
    return (path / "config.json").is_file()


def _step_of(path: Path) -> int:
    match = STEP_DIR.match(path.name)
    if match:
        return int(match.group(1))
    try:
        return int(_meta_record(path).get("step", 0))
    except (TypeError, ValueError):  # a step of null or a list reads as none
        return 0


def _run_checkpoints(run_dir: Path) -> list[CheckpointRef]:
    return [
        CheckpointRef(run_dir.name, _step_of(child), child.resolve())
        for child in sorted(run_dir.iterdir())
        if STEP_DIR.match(child.name) and is_checkpoint(child)
    ]


def _expand(pattern: str) -> list[Path]:
    if any(ch in pattern for ch in "*?["):
        return [Path(p) for p in sorted(glob.glob(pattern))]
    return [Path(pattern)]


def resolve_checkpoints(paths: list[str], last: int | None = None) -> list[CheckpointRef]:
    """Checkpoints named by `paths`, sorted by run then step; `last` keeps each run's newest N."""
    if not paths:
        raise UserError(
            "no checkpoint given: pass --ckpts PATH (a checkpoint, a run directory of step-* checkpoints "
            "or a hub name org/name[@revision])"
        )
    check_last(last)
    refs: list[CheckpointRef] = []
    for pattern in paths:
        source, hub = checkpoint_source(pattern)
        if hub is not None:
            refs.append(CheckpointRef(hub.run, _step_of(source), source, hub))
            continue
        matches = _expand(pattern)
        if not matches:
            raise UserError(f"{pattern} matches nothing")
        for path in matches:
            if is_checkpoint(path):
                run = path.parent.name if STEP_DIR.match(path.name) else path.name
                refs.append(CheckpointRef(run, _step_of(path), path.resolve()))
            elif path.is_dir() and (found := _run_checkpoints(path)):
                refs.extend(found)
            else:
                shown = pattern if path == Path(pattern) else path  # as typed: org//name is not org/name
                raise UserError(
                    f"no checkpoint at {shown}: expected a directory with config.json or with step-* checkpoints, "
                    "or a hub name org/name[@revision]"
                )
    unique = sorted(_one_per_directory(refs))
    _check_run_names(unique)
    if last is None:
        return unique
    # sorted by run, then step: each run's group ends with its newest
    return [ref for _, group in itertools.groupby(unique, key=lambda ref: ref.run) for ref in list(group)[-last:]]


def _one_per_directory(refs: list[CheckpointRef]) -> set[CheckpointRef]:
    """One ref per checkpoint directory, by its real path: a symlink (runs/latest -> myrun) matched
    by a glob beside its target is the same checkpoint, not a second run. The first spelling given
    keeps its name; each other name skipped is said in one stderr line (a checkpoint named twice
    alike is silent: nothing to tell)."""
    kept: dict[Path, CheckpointRef] = {}
    skipped: dict[tuple[str, str], list[int]] = {}  # (name skipped, name kept): the steps
    for ref in refs:
        first = kept.setdefault(ref.path, ref)
        if first.run != ref.run:
            skipped.setdefault((ref.run, first.run), []).append(ref.step)
    for (name, kept_name), steps in skipped.items():
        print(
            f"note: {name} (step {', '.join(map(str, sorted(set(steps))))}) is the same checkpoint directory "
            f"as {kept_name} (a symlink?): skipped, evaluated once as {kept_name}",
            file=sys.stderr,
        )
    return set(kept.values())


def check_last(last: int | None) -> None:
    """--last N keeps each run's newest N checkpoints; N < 1 would slice as [-0:], i.e. keep them all."""
    if last is not None and last < 1:
        raise UserError(f"--last {last}: give how many of each run's newest checkpoints to use, at least 1")


def _check_run_names(refs: list[CheckpointRef]) -> None:
    parents: dict[str, set[Path]] = {}
    for ref in refs:
        parents.setdefault(ref.run, set()).add(ref.path.parent if STEP_DIR.match(ref.path.name) else ref.path)
    clashes = [run for run, dirs in parents.items() if len(dirs) > 1]
    if clashes:
        raise UserError(f"two different runs are both named {clashes[0]!r}; rename one of the run directories")


def checkpoint_meta(path: Path, hub: HubModel | None = None) -> dict:
    """What made a checkpoint: the trainer's record (paradigm, config, step, data), evalkit
    import's (model name, source file and hash, dtype), and for a model named by its hub name the
    repo, revision and commit (`hub`, also in an export's meta.json); {} for others."""
    found = _meta_record(path)
    return {**found, "hub": hub.record()} if hub is not None else found


def _meta_record(path: Path) -> dict:
    data = read_json_object(path / META)  # absent or unreadable: no record
    return {key: data[key] for key in META_KEYS if key in data}


WEIGHTS_SAMPLES = 16  # evenly spaced blocks read from each weights file
WEIGHTS_SAMPLE_BYTES = 1 << 16


def weights_fingerprint(path: Path) -> str | None:
    """What identifies a checkpoint's weights, whatever its directory or run name (docs/reliability.md):
    a sha256 over each *.safetensors file's name, size, header and WEIGHTS_SAMPLES blocks spread over
    its data. Two trainings differ in every tensor, so in every block; a copy is the same. None
    without weights in safetensors."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    try:
        for file in files:
            stat = file.stat()
            digest.update(
                f"{file.name}\0{_file_fingerprint(file.resolve(), stat.st_size, stat.st_mtime_ns)}\0".encode()
            )
    except OSError:
        return None  # unreadable here: the loader says why, in its own words
    return digest.hexdigest()[:20]


@functools.lru_cache(maxsize=64)
def _file_fingerprint(file: Path, size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256(str(size).encode())
    with file.open("rb") as handle:
        # The header: an 8-byte length, then that much JSON (clamped: a crafted length reads the file)
        header_length = int.from_bytes(handle.read(8), "little")
        digest.update(handle.read(min(header_length, size)))
        start = min(8 + header_length, size)
        step = max(1, (size - start) // WEIGHTS_SAMPLES)
        for offset in range(start, size, step):
            handle.seek(offset)
            digest.update(handle.read(WEIGHTS_SAMPLE_BYTES))
    return digest.hexdigest()
