"""The command-line side of scaling out: --shard, --executor and --ray-address, checked before any work."""

from __future__ import annotations

import re

from evalkit.errors import UserError

EXECUTORS = ("local", "ray")
SHARD_HELP = (
    "Evaluate only shard I of N of the (checkpoint, unit) pairs, balanced by estimated tokens; "
    "'slurm' or 'sge': this job-array task's shard, from the scheduler's array variables (any first "
    "index and step). Join the shards with evalkit merge."
)
EXECUTOR_HELP = "local: this process; ray: the units on a Ray cluster's workers (pip install 'evalkit[ray]')."
RAY_ADDRESS_HELP = "--executor ray: the cluster to join (ray://host:10001 or host:6379; default: a local one)."
RAY_RESOURCES_HELP = (
    "--executor ray: what each task (one model copy) asks of a node, e.g. cpus=4,memory=8G or gpus=2 "
    "(default: 1 CPU and 3x the weights' size in memory on CPUs; the GPUs of its tensor-parallel size on GPUs)."
)


def make_executor(name: str, ray_address: str | None, ray_resources: str | None = None):
    """None for the local executor (the pipeline's own loop), else the Ray executor."""
    if name not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if name == "local":
        if ray_address is not None:
            raise UserError("--ray-address needs --executor ray")
        if ray_resources is not None:
            raise UserError("--ray-resources needs --executor ray")
        return None
    import importlib.util

    check_ray_address(ray_address)
    if importlib.util.find_spec("ray") is None:
        raise UserError("--executor ray needs Ray: pip install 'evalkit[ray]'")
    from evalkit.sweep.ray_executor import RayExecutor, parse_ray_resources

    return RayExecutor(address=ray_address, resources=parse_ray_resources(ray_resources))


# What ray.init takes: the head's HOST:PORT (a name, IPv4 or [IPv6]), ray://HOST[:PORT] (Ray Client),
# or a keyword: "auto" (the cluster this node joined), "local" (start one here).
_HOST = r"(\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+)"
RAY_ADDRESS = re.compile(rf"^(ray://{_HOST}(:\d+)?|{_HOST}:\d+|auto|local)$")


def check_ray_address(address: str | None) -> None:
    """A malformed --ray-address is one line before any work, not Ray's "Invalid address format" traceback."""
    if address is not None and not RAY_ADDRESS.match(address):
        raise UserError(
            f"--ray-address {address!r} is not a Ray address: give the head node's HOST:PORT (as `ray start "
            "--head` printed it, e.g. 10.0.0.5:6379), ray://HOST:10001 (Ray Client), or auto (this node's cluster)"
        )


def scale_options(shard: str | None, executor: str, ray_address: str | None, avg: bool, ray_resources=None):
    """(Shard or None, executor or None) from the options, refusing what cannot work together."""
    from evalkit.sweep.plan import parse_shard

    parsed = parse_shard(shard)
    if parsed is not None and avg:
        raise UserError("--avg averages over every checkpoint; with --shard, run it after evalkit merge instead")
    return parsed, make_executor(executor, ray_address, ray_resources)
