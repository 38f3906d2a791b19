"""Which lm-eval tasks exist (TaskCatalog: lm-eval's TaskManager over evalkit's tasks/ and the
user's folders), how each is loaded, and with how many shots it is scored (STANDARD_FEWSHOT,
docs/general.md; the paper states none: mmlu's 5 is the MMLU paper's and the Open LLM Leaderboard's).
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.general.errors import DatasetUnavailable
from evalkit.package_data import TASKS_DIR

OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
STANDARD_FEWSHOT = {"mmlu": 5, "hellaswag": 0}


def default_include_paths(extra: Sequence[str | Path] = ()) -> list[Path]:
    """evalkit's tasks/ folder (package data), then the user's folders: lm-eval lets later folders
    override earlier ones, so a user's task of the same name wins."""
    paths = [TASKS_DIR] if TASKS_DIR.is_dir() else []
    for path in extra:
        path = Path(path).expanduser().resolve()
        if not path.is_dir():
            raise UserError(f"--include-path {path} is not a directory of lm-eval task YAMLs")
        if path not in paths:
            paths.append(path)
    return paths


class TaskCatalog:
    """lm-eval's task index over the include paths, built only as large as the requested names need."""

    def __init__(self, include_paths: list[Path], names: list[str]) -> None:
        from lm_eval.tasks import TaskManager

        self.include_paths = include_paths
        self.unavailable: dict[str, str] = {}  # name -> reason: tried once per run, not once per checkpoint
        # lm-eval's own index parses ~15k YAML files (10-20 s); skip it when every requested name is
        # defined in the include paths (evalkit's fixtures, a user's folder of tasks).
        manager = TaskManager(include_path=include_paths, include_defaults=False) if include_paths else None
        self.complete = manager is None or not set(names) <= set(manager.all_tasks)
        if manager is None or self.complete:
            manager = TaskManager(include_path=include_paths or None)
        self.manager = manager

    def check(self, names: list[str]) -> None:
        for name in names:
            if name not in self.manager.task_index:
                close = difflib.get_close_matches(name, self.manager.all_tasks, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise UserError(
                    f"unknown lm-eval task or group {name!r}{hint}; list them with `lm-eval ls tasks`, "
                    "or add a folder of task YAMLs with --include-path"
                )

    def fewshot(self, name: str, given: int | None) -> tuple[int | None, str]:
        """(shots to ask lm-eval for, where that number comes from); None keeps the task's default."""
        if given is not None:
            return given, "given"
        import lm_eval.tasks

        tasks_dir = Path(lm_eval.tasks.__file__).resolve().parent
        path = getattr(self.manager.task_index.get(name), "yaml_path", None)  # None: not in the index
        if name == "hellaswag" and _is_under(path, tasks_dir / "hellaswag"):
            standard = "hellaswag"
        elif _is_under(path, tasks_dir / "mmlu" / "default"):  # lm-eval's mmlu group and its parts
            standard = "mmlu"
        else:
            return None, "lm-eval default"
        return STANDARD_FEWSHOT[standard], f"evalkit standard for {standard}"

    def leaf_tasks(self, name: str, seen: frozenset[str] = frozenset()) -> int:
        """How many tasks `name` scores (a group's or tag's leaves; 1 for a task, an unknown name or a
        group that names itself, `seen` being the groups above it), from the index alone: a shard's cost."""
        entry = self.manager.task_index.get(name)
        if entry is None or name in seen:
            return 1
        if entry.kind.name == "GROUP":  # lm_eval.tasks._index.Kind, by name: a private module
            members = (entry.cfg or {}).get("task") or []
            children = members if isinstance(members, list) else [members]
        elif entry.kind.name == "TAG":
            children = [other for other, e in self.manager.task_index.items() if name in e.tags]
        else:
            return 1
        # an inline task config (a dict in the group's list) is one task
        return max(1, sum(self.leaf_tasks(c, seen | {name}) if isinstance(c, str) else 1 for c in children))

    @contextmanager
    def loading(self, name: str) -> Iterator[None]:
        """Where to load and run `name`: offline and quiet for evalkit's fixtures (tasks defined in
        evalkit's own tasks/ folder: local data, no download), as is for the rest."""
        entry = self.manager.task_index.get(name)
        # lm-eval tells CLI users of custom_dataset tasks about its --metadata; evalkit passes BABILong's itself.
        with ExitStack() as stack:
            stack.enter_context(quiet_logger("lm_eval.api.task", ("Custom kwargs can be passed",)))
            if entry is not None and _is_under(entry.yaml_path, TASKS_DIR):
                stack.enter_context(offline_hubs())
            yield

    def load(self, name: str, max_seq_length: str | None = None) -> list[Any]:
        """The top-level Task/Group objects of `name`, data loaded (at lm-eval's metadata max_seq_lengths
        where given: BABILong's length); DatasetUnavailable if it cannot be, remembered: without network
        each try costs the hub client's retries (~25 s) to fail alike."""
        tried = name if max_seq_length is None else f"{name} at max_seq_lengths {max_seq_length}"
        if tried in self.unavailable:
            raise DatasetUnavailable(self.unavailable[tried])
        try:
            loaded = self._manager(max_seq_length).load([name])
        except Exception as err:  # datasets, hub and file errors differ by version and backend: all are data errors
            if isinstance(err, KeyError) and not self.complete:
                # A group in the include paths made of lm-eval's own tasks: those need the full index.
                from lm_eval.tasks import TaskManager

                self.manager, self.complete = TaskManager(include_path=self.include_paths or None), True
                return self.load(name, max_seq_length)
            self.unavailable[tried] = _unavailable_reason(tried, err)
            raise DatasetUnavailable(self.unavailable[tried]) from err
        if name in loaded.get("groups", {}):
            return [loaded["groups"][name]]
        if name in loaded["tasks"]:
            return [loaded["tasks"][name]]
        return list(loaded["tasks"].values())  # a tag: the tasks it names

    def _manager(self, max_seq_length: str | None) -> Any:
        """The manager, or a copy whose tasks get lm-eval's metadata max_seq_lengths (what `--metadata`
        passes to a custom_dataset loader). The metadata lives in the manager's private factory: a
        copy sharing the index, since a new TaskManager would parse lm-eval's YAMLs again (10-20 s)."""
        if max_seq_length is None:
            return self.manager
        from lm_eval.tasks._factory import TaskFactory

        manager = copy.copy(self.manager)
        manager.metadata = {"max_seq_lengths": max_seq_length}
        manager._factory = TaskFactory(meta=manager.metadata)
        return manager


def _is_under(path: Path | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


def _unavailable_reason(name: str, err: BaseException) -> str:
    """One line: the dataset that failed, the library's own first line, and what to do about it."""
    task = _failing_task(err)
    dataset, loads_through_hub = _failing_dataset(task) if task is not None else (None, False)
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    where = f"dataset {dataset}" if dataset else f"{name} or its dataset"
    reason = f"{where} could not be loaded ({type(err).__name__}: {first_line})"
    if task is not None and loads_through_hub:
        config_name = getattr(task, "DATASET_NAME", None)
        call = f"datasets.load_dataset({task.DATASET_PATH!r}{f', {config_name!r}' if config_name else ''})"
        reason += (
            "; it is neither in the Hugging Face cache nor reachable: run once where the hub is reachable to fill "
            f'the cache (or pre-download it: python -c "import datasets; {call}"), then HF_DATASETS_OFFLINE=1 '
            "HF_HUB_OFFLINE=1 make runs read the cache without network"
        )
    return reason


def _failing_task(err: BaseException) -> Any | None:
    """The lm-eval Task whose data loading raised `err`: the innermost frame of a Task method."""
    found = None
    traceback = err.__traceback__
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if candidate is not None and hasattr(candidate, "DATASET_PATH") and hasattr(candidate, "config"):
            found = candidate
        traceback = traceback.tb_next
    return found


def _failing_dataset(task: Any) -> tuple[str, bool]:
    """(a name for the task's dataset, whether it loads through datasets/the hub)."""
    kwargs = getattr(task.config, "dataset_kwargs", None) or {}
    if getattr(task.config, "custom_dataset", None) is not None:  # a local loader: name what it reads
        files = [str(v) for k, v in kwargs.items() if "file" in k]
        return (", ".join(files) or task.config.task), False
    path, config_name = task.DATASET_PATH, getattr(task, "DATASET_NAME", None)
    if kwargs.get("data_files"):
        return f"{path} ({kwargs['data_files']})", False
    return (f"{path} ({config_name})" if config_name else str(path)), True


@contextmanager
def offline_hubs() -> Iterator[None]:
    """huggingface_hub and datasets offline for the duration, then as they were: both read the
    environment once, at import, into module constants, so both are set, then restored."""
    from unittest import mock

    import datasets.config
    import huggingface_hub.constants

    constants = [
        (huggingface_hub.constants, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_DATASETS_OFFLINE"),
    ]
    # Only these variables are restored: the task may build an engine that sets others for good.
    saved_environment = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
    try:
        with ExitStack() as stack:
            for module, attribute in constants:
                stack.enter_context(mock.patch.object(module, attribute, True, create=True))
            yield
    finally:
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def quiet_logger(name: str, fragments: tuple[str, ...]) -> Iterator[None]:
    """Drop the messages of logger `name` that contain any of `fragments`, for the duration."""
    logger = logging.getLogger(name)

    def keep(record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in fragments)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
