"""`--executor ray`: the pipeline's units computed on a Ray cluster's workers.

    driver (this process, holding --out's lock)            workers (any node; --out on a shared file system)
      plan: each checkpoint's units in groups ──task──▶  one engine per group (a model loaded once per worker)
                                                          each unit: benchmark.evaluate ─▶ its own per-sample
                                                          log / task record, appended or written atomically
      results, skips, who answered ◀──────────────────── (a Skipped unit is a value, never a failure)
      the pipeline's own loop writes every summary (one writer), as if it had computed the units

One writer per file across hosts, without trusting a lock on a shared file system (flock and
NFS locks do not hold across hosts on many): the driver holds --out's lease (evalkit.sweep.lease)
and assigns every unit to exactly one group; a worker claims its group and writes only its
group's units' files, each write fenced by its claim; only the driver writes summaries. A group
is retried when its worker is gone (Ray's retry: a process killed, a node declared dead) or its
claim lapsed (the driver's: a worker paused or cut off, whose writes the new claim fences off);
the retry resumes from the per-sample log, whose torn last line (if any) is dropped on reading
and whose first record of a sample stands: nothing lost, nothing twice. A unit skipped for a
user error (does not fit, missing data) comes back as a skip and is not retried; any other error
(a broken checkpoint) fails that checkpoint alone, recorded by the pipeline as in a local sweep.
A killed driver takes its groups with it (Ray cancels a dead owner's tasks); a rerun of the same
command resumes from the logs.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from evalkit.engines.ray_start import exit_status_kept, init_ray
from evalkit.errors import Skipped, UserError
from evalkit.files import disk_full_error, fenced
from evalkit.store.units import UnitStore
from evalkit.sweep.lease import ClaimWatch, LeaseLost, claim_group
from evalkit.sweep.plan import Outcome, WorkPlan, assign_shards

MAX_RETRIES = 3  # a group's attempts after its worker dies (kill -9, a lost node)
STATUS_EVERY_S = 10.0  # the driver's progress line


class RayExecutor:
    """`resources`: what each group's task asks of Ray (parse_ray_resources; --ray-resources), the rest
    task_resources' default: one CPU, the GPUs of its tensor-parallel size, and on a CPU cluster the
    memory its model needs, so that a node runs only as many model copies as fit in its memory."""

    def __init__(self, address: str | None = None, resources: dict[str, float] | None = None, **init_options: Any):
        self.address, self.resources, self.init_options = address, resources, init_options

    def run(self, benchmark, work: WorkPlan, out: Path, *, log=print, open_engine=None, lease=None) -> None:
        """Compute every unit of `work` not yet stored on the cluster; fills each checkpoint's outcomes.
        `lease` (evalkit.sweep.lease.DriverLease): the driver's, under which workers claim their groups.
        Progress is `log`'s lines (Status): groups done and each worker's samples/s, every 10 s."""
        ray = _import_ray()
        started_here = self._connect(ray)
        try:
            resources = task_resources(ray, benchmark, [ref.path for ref in work.refs()], self.resources)
            slots = concurrent_copies(_alive_nodes(ray), resources)
            groups = plan_groups(benchmark, work, out, slots)
            if groups:
                log(f"ray: each task asks {_asked(resources)}: {slots} concurrent model copies on {_describe(ray)}")
                self._run_groups(ray, benchmark, groups, out, log, open_engine, lease, resources)
        finally:
            if started_here:
                ray.shutdown()

    def _connect(self, ray) -> bool:
        """Join the cluster (or start a local one with no address); True when this call did."""
        if ray.is_initialized():
            return False
        if self.address:
            _check_reachable(self.address)
        try:
            init_ray(address=self.address, **self.init_options)
        except ConnectionError as err:
            raise UserError(f"cannot reach the Ray cluster at {self.address}: {err}; check --ray-address") from None
        return True

    def _run_groups(self, ray, benchmark, groups: list[Group], out: Path, log, open_engine, lease, resources) -> None:
        reporter = ray.remote(Reporter).options(num_cpus=0).remote()
        task = ray.remote(evaluate_group).options(max_retries=MAX_RETRIES, retry_exceptions=False, **resources)
        shipped = _for_workers(benchmark)
        claims = (lease.generation, lease.timeout) if lease is not None else None

        def submit(group: Group):
            return task.remote(shipped, group.ref, group.units, str(out), group.name, reporter, open_engine, claims)

        pending = {submit(group): group for group in groups}
        log(f"ray: {sum(len(g.units) for g in groups)} units in {len(groups)} groups on {_describe(ray)}")
        status = Status(log, len(groups))
        watch = ClaimWatch(out, *claims) if claims is not None else None
        with exit_status_kept():
            self._wait(ray, pending, reporter, status, watch, submit)

    def _wait(self, ray, pending: dict, reporter, status: Status, watch: ClaimWatch | None, submit) -> None:
        """Until every group is answered. A group may have several live attempts: Ray's own retry
        of a dead worker, and the driver's of a worker whose claim lapsed (paused, cut off, but not
        known dead to Ray); the first answer counts, a superseded attempt's LeaseLost is dropped."""
        resubmitted: dict[str, int] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            status.update(ray.get(reporter.snapshot.remote()))
            for ref in ready:
                group = pending.pop(ref)
                if group.done:
                    continue
                try:
                    answer = _result(ray, ref, group)
                except LeaseLost:
                    if not any(other is group for other in pending.values()):
                        raise  # no attempt of it left here: another driver took over --out
                    continue
                except Exception as err:  # this checkpoint failed: the others go on, as in a local sweep
                    if disk_full_error(err) is not None:
                        raise  # every later unit would fail the same way
                    group.work.failure = group.work.failure or err
                    group.done = True
                    status.failed(group, err)
                    continue
                group.collect(answer, ray.get(reporter.snapshot.remote())["attempts"].get(group.name, 1))
                group.done = True
                status.finished(group)
            for ref in [ref for ref, group in pending.items() if group.done]:
                del pending[ref]  # a superseded attempt (a paused worker): its answer is not needed
            if watch is not None:
                self._retry_lapsed(pending, watch, status, submit, resubmitted)

    def _retry_lapsed(self, pending: dict, watch: ClaimWatch, status: Status, submit, resubmitted: dict) -> None:
        """A group whose worker stopped renewing its claim for the lease timeout is started again
        elsewhere; the new attempt's claim fences the old worker off its files."""
        for group in {id(g): g for g in pending.values()}.values():
            attempt = watch.lapsed(group.name)
            if attempt is None:
                continue
            if resubmitted.get(group.name, 0) >= MAX_RETRIES:
                continue  # Ray's own retries, and the end of the run, remain
            resubmitted[group.name] = resubmitted.get(group.name, 0) + 1
            watch.forget(group.name)
            pending[submit(group)] = group
            status.log(
                f"ray: {group.name}: attempt {attempt} renewed no claim for {watch.timeout:g} s "
                "(its worker paused or cut off); started again elsewhere"
            )


class Group:
    """Some units of one checkpoint, evaluated by one worker with one engine."""

    def __init__(self, ref, units: list, work) -> None:
        self.ref, self.units, self.work = ref, units, work
        self.name = f"{ref.run}/step-{ref.step}#{units[0].label()}"
        self.done = False

    def collect(self, answer: tuple[list, dict | None], attempt: int) -> None:
        """The worker's own claim attempt, when it claimed one, else the reporter's count of starts."""
        outcomes, engine_info = answer
        for unit, result, skip, worker in outcomes:
            self.work.outcomes[unit] = Outcome(result, skip, {"attempt": attempt, **worker}, engine_info)


def plan_groups(benchmark, work: WorkPlan, out: Path, slots: int) -> list[Group]:
    """Each checkpoint's units not yet stored, in as many groups as keep every worker busy (one
    per checkpoint when there are as many checkpoints as workers), balanced by estimated tokens."""
    todo = [
        (
            ref,
            checkpoint,
            [u for u in checkpoint.units if benchmark.stored(u, UnitStore(out, ref, benchmark.name, u)) is None],
        )
        for ref, checkpoint in work.checkpoints
    ]
    todo = [item for item in todo if item[2]]
    per_checkpoint = max(1, math.ceil(slots / max(1, len(todo))))
    groups = []
    for ref, checkpoint, units in todo:
        count = min(per_checkpoint, len(units))
        owner = assign_shards([float(benchmark.unit_cost(u)) for u in units], count)
        for g in range(count):
            groups.append(Group(ref, [u for u, o in zip(units, owner) if o == g], checkpoint))
    return groups


def evaluate_group(benchmark, ref, units: list, out: str, name: str, reporter, open_engine=None, claims=None):
    """On a worker: one engine for the group's units (built only if a unit has work left).
    `claims` (the driver's lease generation, the lease timeout): the group is claimed first, and
    every write of its files checks that this attempt is still the newest (evalkit.sweep.lease)."""
    import ray

    context = ray.get_runtime_context()
    worker = {"host": socket.gethostname(), "pid": os.getpid(), "node": context.get_node_id()[:12]}
    # Not waited for: a task blocked in ray.get lends its CPU to another task, which would
    # start more workers than the cluster has CPUs. The driver reads the attempt from the reporter.
    reporter.started.remote(name, worker)
    if claims is None:
        return _evaluate_units(benchmark, ref, units, Path(out), name, reporter, open_engine, worker)
    generation, timeout = claims
    claim = claim_group(Path(out), generation, name, timeout, worker)
    try:
        with fenced(claim.check):
            worker = {**worker, "attempt": claim.attempt}
            return _evaluate_units(benchmark, ref, units, Path(out), name, reporter, open_engine, worker)
    finally:
        claim.stop()


def _evaluate_units(benchmark, ref, units: list, out: Path, name: str, reporter, open_engine, worker: dict):
    from evalkit.sweep.engine_choice import LazyEngine

    outcomes: list[tuple[Any, Any, dict | None, dict]] = []  # (unit, result or None, skip or None, who answered)
    with LazyEngine(benchmark.engine, ref.path, open_engine) as engine:
        for unit in units:
            began = time.monotonic()
            report = lambda done, total, u=unit: reporter.progress.remote(name, u.label(), done, total)  # noqa: E731
            try:
                result = benchmark.evaluate(engine, unit, UnitStore(out, ref, benchmark.name, unit), report)
                outcomes.append((unit, result, None, {**worker, "seconds": round(time.monotonic() - began, 2)}))
            except Skipped as why:  # a user error: recorded, never retried
                outcomes.append((unit, None, {**unit.fields(), "reason": why.reason, **why.details}, worker))
        engine_info = engine.info()
    return outcomes, engine_info


class Reporter:
    """A Ray actor the workers tell what they do; the driver reads it for its one progress view."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.workers: dict[str, dict] = {}
        self.units: dict[str, dict] = {}

    def started(self, group: str, worker: dict) -> int:
        self.attempts[group] = self.attempts.get(group, 0) + 1
        self.workers[group] = worker
        return self.attempts[group]

    def progress(self, group: str, unit: str, done: int, total: int) -> None:
        now = time.monotonic()
        entry = self.units.setdefault(f"{group}|{unit}", {"first": done, "since": now, "group": group, "unit": unit})
        if done < entry["first"]:  # a retry started this unit over from its log
            entry.update(first=done, since=now)
        entry.update(done=done, total=total, at=now)

    def snapshot(self) -> dict:
        return {"attempts": dict(self.attempts), "workers": dict(self.workers), "units": dict(self.units)}


class Status:
    """The driver's progress: a line every STATUS_EVERY_S (groups done, samples/s per worker),
    one per finished group, one per retry."""

    def __init__(self, log, groups: int) -> None:
        self.log, self.groups, self.done = log, groups, 0
        self.attempts: dict[str, int] = {}
        self.finished_groups: set[str] = set()
        self.last = time.monotonic()
        self.snapshot: dict = {"workers": {}, "units": {}}

    def update(self, snapshot: dict) -> None:
        self.snapshot = snapshot
        for group, attempts in snapshot["attempts"].items():
            if attempts > self.attempts.get(group, 1):
                worker = snapshot["workers"][group]
                self.log(
                    f"ray: {group} retried (attempt {attempts}, now on {_who(worker)}): its worker died or went silent"
                )
            self.attempts[group] = attempts
        if time.monotonic() - self.last >= STATUS_EVERY_S:
            self.last = time.monotonic()
            working = {g: w for g, w in snapshot["workers"].items() if g not in self.finished_groups}
            rates = "; ".join(f"{_who(w)} {self.rate(g):.1f} samples/s" for g, w in working.items())
            self.log(f"ray: {self.done}/{self.groups} groups done; {rates or 'workers starting'}")

    def rate(self, group: str) -> float:
        entries = [e for e in self.snapshot["units"].values() if e["group"] == group and "done" in e]
        samples = sum(e["done"] - e["first"] for e in entries)
        seconds = sum(e["at"] - e["since"] for e in entries)
        return samples / seconds if seconds > 0 else 0.0

    def failed(self, group: Group, err: BaseException) -> None:
        self.done += 1
        self.finished_groups.add(group.name)
        self.log(f"ray: {group.ref.run} step {group.ref.step} failed: {str(err).splitlines()[0]}")

    def finished(self, group: Group) -> None:
        self.done += 1
        self.finished_groups.add(group.name)
        worker = group.work.outcomes[group.units[0]].answered_by
        self.log(
            f"ray: {group.ref.run} step {group.ref.step}: {len(group.units)} units done on {_who(worker)} "
            f"({self.done}/{self.groups} groups)"
        )


def _who(worker: dict) -> str:
    return f"{worker.get('host')}:{worker.get('pid')}"


def _result(ray, ref, group: Group):
    """The group's answer; a failure in evalkit is raised here as the driver's own (a UserError as one line)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause
        if isinstance(cause, LeaseLost):
            raise LeaseLost(str(cause)) from None
        if isinstance(cause, UserError):
            raise UserError(str(cause)) from None
        if isinstance(cause, BaseException):
            raise cause from err
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as err:
        raise UserError(
            f"{group.name}: its worker died {MAX_RETRIES + 1} times ({type(err).__name__}); "
            "rerun the same command to resume from the per-sample logs"
        ) from None


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


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'evalkit[ray]'") from None
    return ray


def _for_workers(benchmark):
    """The benchmark as it travels to the workers: its log goes to the worker's output (forwarded
    to the driver by Ray), not the driver's console, which does not travel."""
    shipped = copy.copy(benchmark)
    shipped.log = print
    return shipped


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
    """The largest checkpoint's weight files on disk (safetensors, else .bin or .gguf), in bytes."""
    sizes = [0]
    for path in paths:
        for pattern in WEIGHT_FILES:
            found = sum(f.stat().st_size for f in Path(path).glob(pattern) if f.is_file())
            if found:
                sizes.append(found)
                break
    return max(sizes)


def task_resources(ray, benchmark, checkpoints: list[Path], given: dict[str, float] | None = None) -> dict[str, float]:
    """What each group's task asks of Ray: `given` (--ray-resources), and for what it leaves out the
    default: on a GPU cluster the GPUs of its tensor-parallel size (the model lives there); on CPUs
    one CPU and the memory its model needs, so that Ray starts on a node only as many model copies
    as fit in that node's memory, not one per core. A model that fits in no node's memory is one
    line now, not an out-of-memory kill later."""
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
    """How many tasks asking `asked` the nodes run at once (each node: the least its CPUs, GPUs and
    memory allow), so how many model copies are loaded at once; at least 1."""
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
    """A memory size as people read it: GiB, or MiB below one GiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _asked(resources: dict[str, float]) -> str:
    shown = {"num_cpus": "CPUs", "num_gpus": "GPUs"}
    return ", ".join(
        _gib(amount) + " memory" if key == "memory" else f"{amount:g} {shown[key]}" for key, amount in resources.items()
    )


def _describe(ray) -> str:
    resources = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    gpus = f", {int(resources['GPU'])} GPUs" if resources.get("GPU") else ""
    return f"{nodes} node(s), {int(resources.get('CPU', 0))} CPUs{gpus}"
