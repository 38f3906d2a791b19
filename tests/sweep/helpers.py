"""What the scale-out tests share: a tiny sweep of the shipped checkpoints, and how two outputs are compared."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from evalkit.files import LOCK_NAME
from tests.helpers import run_cli  # noqa: F401  (the scale tests take it from here)

SHIPPED = Path(__file__).parents[2] / "evalkit" / "checkpoints" / "tiny-long"
SHIPPED_FULL = SHIPPED / "full-bf16-seed1"  # two checkpoints each, trained bf16_full (served so by default)
SHIPPED_ANCHOR = SHIPPED / "anchor-bf16-seed1"
TASKS = ["niah_single_1", "niah_single_2", "qa_1"]  # qa_1 without --qa-dir: a user-error skip


def tiny_refs(runs: tuple[str, ...] = (SHIPPED_FULL.name,)):
    from evalkit.models.refs import resolve_checkpoints

    return resolve_checkpoints([str(SHIPPED / run) for run in runs])


def tiny_settings(samples: int = 3, tasks=TASKS):
    from evalkit.ruler.runner import RulerSettings

    return RulerSettings(tasks=list(tasks), lengths=[1024], num_samples=samples)


def outputs_of(out: Path) -> tuple[dict, dict]:
    """(summaries without the fields a run's time and place decide, per-sample logs as bytes), by path."""
    summaries, logs = {}, {}
    for path in sorted(Path(out).rglob("*")):
        rel = str(path.relative_to(out))
        if path.name.endswith("-summary.json"):
            summary = json.loads(path.read_text())
            provenance = summary["provenance"]
            kept = {k: provenance.get(k) for k in ("checkpoint_meta", "engine", "settings", "data_keys")}
            # The engine's torch threads follow the process (a Ray worker has its one CPU's): an
            # execution detail, not a result (the per-sample logs are compared byte for byte).
            kept["engine"] = {k: v for k, v in (kept["engine"] or {}).items() if k != "threads"}
            summaries[rel] = {"rows": summary["rows"], "skipped": summary["skipped"], "provenance": kept}
        elif path.suffix == ".jsonl":
            logs[rel] = path.read_bytes()
    return summaries, logs


def forbid_writes_under_results() -> None:
    """A Ray worker's setup hook (tests/sweep/test_ray.py's cluster): any write under a directory
    holding evalkit's lock file (a run's --out) raises PermissionError, so a test there passes only
    if the workers hand every write to the driver."""
    import sys

    sys.addaudithook(_refuse_writes_under_results)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.utime", "os.link", "os.symlink"}


def _refuse_writes_under_results(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        paths = [path] if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & _WRITE_FLAGS else []
    elif event in _CHANGES:
        paths = [arg for arg in args[:2] if isinstance(arg, (str, bytes, os.PathLike))]
    else:
        return
    for path in paths:
        if isinstance(path, (str, bytes, os.PathLike)) and _under_a_results_directory(Path(os.fsdecode(path))):
            raise PermissionError(f"a Ray worker wrote under a run's --out: {path}")


def _under_a_results_directory(path: Path) -> bool:
    return any((parent / LOCK_NAME).is_file() for parent in path.absolute().parents)


@dataclass(frozen=True)
class HoldSecondChunkOnce:
    """An engine opener for the Ray tests that catch a worker mid-unit: the engine it opens answers
    its first `generate` call (a unit's first chunk), then holds its second until the file
    `release` exists, on the first worker only (it leaves `held`; a retried worker finds it and
    does not wait). Without it the second chunk may end before the driver has written the first.
    Picklable: the workers import it from tests/."""

    held: str
    release: str

    def __call__(self, name: str, path: Path, **settings):
        from evalkit.engines import get_engine

        return _HeldEngine(get_engine(name, path, **settings), self)


class _HeldEngine:
    def __init__(self, engine, hold: HoldSecondChunkOnce) -> None:
        self._engine, self._hold, self._calls = engine, hold, 0

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generate(self, *args, **kwargs):
        self._calls += 1
        if self._calls == 2 and not Path(self._hold.held).exists():
            Path(self._hold.held).touch()
            deadline = time.monotonic() + 600
            while not Path(self._hold.release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self._engine.generate(*args, **kwargs)
