"""`--executor ray` (docs/scaling-out.md): the pipeline's units computed on a Ray cluster's workers,
the driver the one writer under --out (workers hand their writes to an Inbox actor it empties).
"""

from __future__ import annotations

import copy
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalkit.engines.ray_start import exit_status_kept, init_ray
from evalkit.errors import Skipped, UserError
from evalkit.files import disk_full_error
from evalkit.store.sample_log import HERE, Writer
from evalkit.store.units import UnitStore
from evalkit.sweep.engine_choice import LazyEngine
from evalkit.sweep.plan import Outcome, WorkPlan, assign_shards

MAX_RETRIES = 3  # a group's attempts after its worker dies (kill -9, a lost node)
STATUS_EVERY_S = 10.0  # the driver's progress line


class RayExecutor:
    """`resources`: what each group's task asks of Ray (--ray-resources); task_resources fills the rest."""

    def __init__(self, address: str | None = None, resources: dict[str, float] | None = None) -> None:
        self.address, self.resources = address, resources

    def run(self, benchmark, work: WorkPlan, out: Path, *, log=print, open_engine=None) -> None:
        """Compute every unit of `work` not yet stored on the cluster, writing what the workers hand
        back; fills each checkpoint's outcomes."""
        import ray  # evalkit.cli.options.make_executor checked that it is installed

        started_here = self._connect(ray)
        try:
            resources = task_resources(ray, benchmark, [ref.path for ref, _ in work.checkpoints], self.resources)
            slots = concurrent_copies(_alive_nodes(ray), resources)
            groups = plan_groups(benchmark, work, out, slots)
            if groups:
                log(f"ray: each task asks {_asked(resources)}: {slots} concurrent model copies on {_describe(ray)}")
                self._run_groups(ray, benchmark, groups, out, log, open_engine, resources)
        finally:
            if started_here:
                ray.shutdown()

    def _connect(self, ray) -> bool:
        """True when this call joined (or started) the cluster."""
        if ray.is_initialized():
            return False
        if self.address:
            _check_reachable(self.address)
        try:
            init_ray(address=self.address)
        except ConnectionError as err:
            raise UserError(f"cannot reach the Ray cluster at {self.address}: {err}; check --ray-address") from None
        return True

    def _run_groups(self, ray, benchmark, groups: list[Group], out: Path, log, open_engine, resources) -> None:
        inbox = ray.remote(Inbox).options(num_cpus=0).remote()
        # Retried here, not by Ray: the driver must write what a dead attempt handed over, and drop
        # what else comes from it, before the retry reads the logs.
        task = ray.remote(evaluate_group).options(max_retries=0, **resources)
        # The workers' copy logs to their output (Ray forwards it): the driver's console does not travel.
        shipped = copy.copy(benchmark)
        shipped.log = _worker_print

        def submit(group: Group):
            group.attempt += 1
            return task.remote(shipped, group.ref, group.units, str(out), group.name, group.attempt, inbox, open_engine)

        pending = {submit(group): group for group in groups}
        log(f"ray: {sum(len(g.units) for g in groups)} units in {len(groups)} groups on {_describe(ray)}")
        status = Status(log, len(groups))
        by_name = {group.name: group for group in groups}
        with exit_status_kept():
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                # After the wait: a task seen ended made its last call to the inbox, so all it sent is there.
                writes, snapshot = ray.get(inbox.take.remote())
                for name, attempt, kind, rel, text in writes:
                    group = by_name[name]
                    if attempt == group.attempt and not group.done:  # else a dead attempt's, retried since
                        write_handed_over(out, kind, rel, text)
                status.update(snapshot)
                for ref in ready:
                    group = pending.pop(ref)
                    if self._answer(ray, ref, group, status):
                        pending[submit(group)] = group

    def _answer(self, ray, ref, group: Group, status: Status) -> bool:
        """Take an ended task's answer; True when its group is to be tried again (its worker died)."""
        try:
            answer = ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as died:
            lost = type(died).__name__
            if group.attempt <= MAX_RETRIES:
                status.log(f"ray: {group.name} retried (attempt {group.attempt + 1}): its worker died ({lost})")
                return True
            err: BaseException = UserError(
                f"{group.name}: its worker died {group.attempt} times ({lost}); "
                "rerun the same command to resume from the per-sample logs"
            )
        except Exception as caught:  # this checkpoint failed: the others go on, as in a local sweep
            err = _own_error(ray, caught)
            if disk_full_error(err) is not None:
                raise err from None  # every later unit would fail the same way
        else:
            group.collect(answer)
            status.ended(group)
            return False
        group.work.failure = group.work.failure or err
        group.done = True
        status.ended(group, err)
        return False


class Group:
    """Some units of one checkpoint, evaluated by one worker with one engine."""

    def __init__(self, ref, units: list, work) -> None:
        self.ref, self.units, self.work = ref, units, work
        self.name = f"{ref.run}/step-{ref.step}#{units[0].label()}"
        self.attempt = 0
        self.done = False

    def collect(self, answer: tuple[list, dict | None]) -> None:
        outcomes, engine_info = answer
        for unit, result, skip, worker in outcomes:
            self.work.outcomes[unit] = Outcome(result, skip, {"attempt": self.attempt, **worker}, engine_info)
        self.done = True


def plan_groups(benchmark, work: WorkPlan, out: Path, slots: int) -> list[Group]:
    """Each checkpoint's units not yet stored, in as many groups as keep every worker busy,
    balanced by estimated tokens."""
    todo = []
    for ref, checkpoint in work.checkpoints:
        units = [u for u in checkpoint.units if benchmark.stored(u, UnitStore(out, ref, benchmark.name, u)) is None]
        if units:
            todo.append((ref, checkpoint, units))
    per_checkpoint = max(1, math.ceil(slots / max(1, len(todo))))
    groups = []
    for ref, checkpoint, units in todo:
        count = min(per_checkpoint, len(units))
        owner = assign_shards([float(benchmark.unit_cost(u)) for u in units], count)
        for g in range(count):
            groups.append(Group(ref, [u for u, o in zip(units, owner) if o == g], checkpoint))
    return groups


class Handover(Writer):
    """A worker's writer: each write, named relative to --out, is sent to the driver to write."""

    def __init__(self, out: Path, send: Callable[[str, str, str], Any]) -> None:
        self.out, self.send = out, send

    def text(self, path: Path, text: str) -> None:
        self.send("text", Path(path).relative_to(self.out).as_posix(), text)

    def append(self, path: Path, text: str) -> None:
        self.send("append", Path(path).relative_to(self.out).as_posix(), text)


def write_handed_over(out: Path, kind: str, rel: str, text: str) -> None:
    if Path(rel).is_absolute() or ".." in Path(rel).parts or kind not in ("text", "append"):
        raise RuntimeError(f"a worker handed over a write evalkit does not make: {kind} {rel}")
    getattr(HERE, kind)(out / rel, text)


def evaluate_group(benchmark, ref, units: list, out: str, name: str, attempt: int, inbox, open_engine=None):
    """On a worker: one engine for the group's units (built only if a unit has work left); every
    write goes to the driver through `inbox`, tagged with the group and attempt."""
    import ray

    context = ray.get_runtime_context()
    worker = {"host": socket.gethostname(), "pid": os.getpid(), "node": context.get_node_id()[:12]}
    # Not waited for: a task blocked in ray.get lends its CPU to another task, which would
    # start more workers than the cluster has CPUs.
    inbox.started.remote(name, worker)
    writer = Handover(Path(out), lambda kind, rel, text: inbox.write.remote(name, attempt, kind, rel, text))
    outcomes: list[tuple[Any, Any, dict | None, dict]] = []  # (unit, result or None, skip or None, who answered)
    try:
        with LazyEngine(benchmark.engine, ref.path, open_engine) as engine:
            for unit in units:
                began = time.monotonic()
                report = lambda done, total, u=unit: inbox.progress.remote(name, u.label(), done, total)  # noqa: E731
                try:
                    store = UnitStore(Path(out), ref, benchmark.name, unit, writer)
                    result = benchmark.evaluate(engine, unit, store, report)
                    outcomes.append((unit, result, None, {**worker, "seconds": round(time.monotonic() - began, 2)}))
                except Skipped as why:  # a user error: recorded, never retried
                    outcomes.append((unit, None, {**unit.fields(), "reason": why.reason, **why.details}, worker))
            engine_info = engine.info()
        return outcomes, engine_info
    finally:
        # Waited for at the end (its engine closed, so lending its CPU costs nothing): Ray runs one
        # caller's calls to an actor in order, so every write above is in the inbox before the task ends.
        ray.get(inbox.flush.remote())


class Inbox:
    """A Ray actor the workers hand their writes (until the driver takes them) and progress to."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, str, str, str]] = []
        self.workers: dict[str, dict] = {}
        self.units: dict[str, dict] = {}

    def write(self, group: str, attempt: int, kind: str, rel: str, text: str) -> None:
        self.writes.append((group, attempt, kind, rel, text))

    def started(self, group: str, worker: dict) -> None:
        self.workers[group] = worker

    def progress(self, group: str, unit: str, done: int, total: int) -> None:
        now = time.monotonic()
        entry = self.units.setdefault(f"{group}|{unit}", {"first": done, "since": now, "group": group, "unit": unit})
        if done < entry["first"]:  # a retry started this unit over from its log
            entry.update(first=done, since=now)
        entry.update(done=done, total=total, at=now)

    def flush(self) -> None:
        """What a worker waits for last: by then the inbox holds every write it made before."""

    def take(self) -> tuple[list, dict]:
        """The writes handed over since the last take, in order, and the progress so far."""
        writes, self.writes = self.writes, []
        return writes, {"workers": dict(self.workers), "units": dict(self.units)}


class Status:
    """The driver's progress lines (docs/scaling-out.md)."""

    def __init__(self, log, groups: int) -> None:
        self.log, self.groups = log, groups
        self.finished_groups: set[str] = set()
        self.last = time.monotonic()
        self.snapshot: dict = {"workers": {}, "units": {}}

    def update(self, snapshot: dict) -> None:
        self.snapshot = snapshot
        if time.monotonic() - self.last >= STATUS_EVERY_S:
            self.last = time.monotonic()
            working = {g: w for g, w in snapshot["workers"].items() if g not in self.finished_groups}
            rates = "; ".join(f"{_who(w)} {self.rate(g):.1f} samples/s" for g, w in working.items())
            self.log(f"ray: {len(self.finished_groups)}/{self.groups} groups done; {rates or 'workers starting'}")

    def rate(self, group: str) -> float:
        entries = [e for e in self.snapshot["units"].values() if e["group"] == group and "done" in e]
        samples = sum(e["done"] - e["first"] for e in entries)
        seconds = sum(e["at"] - e["since"] for e in entries)
        return samples / seconds if seconds > 0 else 0.0

    def ended(self, group: Group, err: BaseException | None = None) -> None:
        self.finished_groups.add(group.name)
        name = f"ray: {group.ref.run} step {group.ref.step}"
        if err is not None:
            self.log(f"{name} failed: {str(err).splitlines()[0]}")
            return
        worker = _who(group.work.outcomes[group.units[0]].answered_by)
        self.log(
            f"{name}: {len(group.units)} units done on {worker} ({len(self.finished_groups)}/{self.groups} groups)"
        )


def _who(worker: dict) -> str:
    return f"{worker.get('host')}:{worker.get('pid')}"


def _own_error(ray, caught: Exception) -> BaseException:
    """A task's failure in evalkit as the driver's own error (a UserError as one line), not Ray's wrapper."""
    cause = caught.cause if isinstance(caught, ray.exceptions.RayTaskError) else None
    if isinstance(cause, UserError):
        return UserError(str(cause))
    return cause if isinstance(cause, BaseException) else caught


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A HOST:PORT that answers no connection is one line now: ray.init would retry it for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise UserError(
            f"cannot reach the Ray cluster at {address} ({err.strerror or type(err).__name__} within "
            f"{timeout_s:.0f} s); check --ray-address (the head node's HOST:PORT, as `ray start --head` printed it)"
        ) from None


def _worker_print(line: str) -> None:
    """print, pickled by this name: Ray's driver may replace builtins.print (tqdm_ray does) between
    two submissions, after which the original built-in no longer pickles by reference."""
    print(line, flush=True)


# What a CPU worker holds per byte of weights on disk: the weights, the loader's transient copy,
# activations and the KV cache of a batch; an estimate (--ray-resources memory= overrides it).
MEMORY_PER_WEIGHT_BYTE = 3
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf")
RAY_RESOURCE_KEYS = {"cpus": "num_cpus", "gpus": "num_gpus", "memory": "memory"}
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # binary, as memory is sold and reported


def parse_ray_resources(text: str | None) -> dict[str, float] | None:
    """--ray-resources cpus=N,gpus=N,memory=SIZE (any of them; SIZE in bytes or with K/M/G/T, binary):
    what each task asks of Ray; a key not given keeps task_resources' default for it."""
    if text is None:
        return None
    asked: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in RAY_RESOURCE_KEYS:
            raise UserError(
                f"--ray-resources: {item!r} is not one of cpus=N, gpus=N, memory=SIZE (e.g. cpus=4,memory=8G)"
            )
        amount = _size(value) if key == "memory" else _number(value)
        if amount is None or amount < 0 or (key == "cpus" and amount == 0):
            least = "a positive number" if key == "cpus" else "a non-negative amount"
            raise UserError(f"--ray-resources: {key}={value.strip()!r} is not {least}")
        asked[RAY_RESOURCE_KEYS[key]] = int(amount) if key == "memory" else amount  # Ray: memory in whole bytes
    if not asked:
        raise UserError("--ray-resources is empty; give cpus=N, gpus=N and/or memory=SIZE")
    return asked


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _size(text: str) -> float | None:
    """Bytes from "8G", "512M", "8GiB", "1048576"."""
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = cleaned[-1] if cleaned and cleaned[-1] in "kmgt" else ""
    number = _number(cleaned[: len(cleaned) - len(unit)]) if cleaned else None
    return None if number is None else number * _UNITS[unit]


def weight_bytes(paths: list[Path]) -> int:
    """The largest checkpoint's weight files on disk, in bytes."""
    sizes = [0]
    for path in paths:
        found = (sum(f.stat().st_size for f in Path(path).glob(pattern) if f.is_file()) for pattern in WEIGHT_FILES)
        sizes.append(next((size for size in found if size), 0))
    return max(sizes)


def task_resources(ray, benchmark, checkpoints: list[Path], given: dict[str, float] | None = None) -> dict[str, float]:
    """What each group's task asks of Ray (docs/scaling-out.md): `given` (--ray-resources), else on GPUs
    those of its tensor-parallel size; on CPUs one CPU and its model's memory, so that a node runs
    only the copies that fit in its memory, and a model that fits in none is one line now."""
    given = given or {}
    if ray.cluster_resources().get("GPU", 0) > 0:
        return {"num_gpus": float(benchmark.engine.settings.get("tensor_parallel_size") or 1), "num_cpus": 1.0, **given}
    if "memory" in given:
        return {"num_cpus": 1.0, **given}
    need = float(MEMORY_PER_WEIGHT_BYTE * weight_bytes(checkpoints))
    largest = max((node.get("memory", 0.0) for node in _alive_nodes(ray)), default=0.0)
    if need > largest:
        raise UserError(
            f"a model copy needs about {_gib(need)} ({MEMORY_PER_WEIGHT_BYTE}x its weights on disk) and no Ray node "
            f"offers that much memory (the largest: {_gib(largest)}); give --ray-resources memory=SIZE if it fits"
        )
    return {"num_cpus": 1.0, **({"memory": int(need)} if need else {}), **given}


def concurrent_copies(nodes: list[dict[str, float]], asked: dict[str, float]) -> int:
    """How many tasks asking `asked` the nodes run at once, so how many model copies are loaded at once."""
    names = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    asked = {"num_cpus": 1.0, **asked}  # Ray's default for a task that names no CPUs
    total = 0
    for node in nodes:
        fits = [int(node.get(names[key], 0.0) // amount) for key, amount in asked.items() if amount > 0]
        total += min(fits) if fits else 0
    return max(1, total)


def _alive_nodes(ray) -> list[dict[str, float]]:
    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _asked(resources: dict[str, float]) -> str:
    shown = {"num_cpus": "CPUs", "num_gpus": "GPUs"}
    return ", ".join(
        _gib(amount) + " memory" if key == "memory" else f"{amount:g} {shown[key]}" for key, amount in resources.items()
    )


def _describe(ray) -> str:
    resources = ray.cluster_resources()
    nodes = len(_alive_nodes(ray))
    gpus = f", {int(resources['GPU'])} GPUs" if resources.get("GPU") else ""
    return f"{nodes} node(s), {int(resources.get('CPU', 0))} CPUs{gpus}"
