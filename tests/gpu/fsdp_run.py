"""One-rank FSDP2 against the unsharded run, in a process of its own (tests/gpu/test_fsdp.py).

argv[1]: JSON {"device", "sets", "out"}. Trains the tiny-gpu recipe with `sets` twice from the same
seed: first in a one-rank process group (NCCL on CUDA, gloo on a CPU), which the trainer joins
and shards with fully_shard (train.distributed), then without one. Prints one JSON line: both
runs' losses per step, whether every parameter of the sharded model was a DTensor (FSDP2 applied),
and how far the sharded run's final weights are from the unsharded run's, relative to how far
the unsharded run moved them from its first checkpoint.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _spy_on_sharding(seen: list) -> None:
    from torch.distributed.tensor import DTensor

    from evalkit.train import distributed

    original = distributed.shard

    def shard(model, ctx, *args, **kwargs):
        model = original(model, ctx, *args, **kwargs)
        seen.append(all(isinstance(p, DTensor) for p in model.parameters()))
        return model

    distributed.shard = shard


def _weights(run_dir: Path, step: int) -> torch.Tensor:
    from safetensors.torch import load_file

    state = load_file(str(run_dir / f"step-{step}" / "model.safetensors"))
    return torch.cat([state[name].float().flatten() for name in sorted(state)])


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def main() -> None:
    from evalkit.train import load_recipe, train

    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    sharded_parameters: list[bool] = []
    _spy_on_sharding(sharded_parameters)
    runs = {}
    for name in ("sharded", "plain"):
        if name == "sharded":  # the trainer joins the group it finds, and destroys it at its end
            store = dist.FileStore(str(out / "store"), 1)
            dist.init_process_group("nccl" if spec["device"] == "cuda" else "gloo", store=store, rank=0, world_size=1)
        config = load_recipe("tiny-gpu", {"paradigm": "anchor", "out": str(out / name)}, spec["sets"])
        runs[name] = train(config, show_progress=False)
    steps = config.max_steps
    moved = _weights(runs["plain"], steps) - _weights(runs["plain"], 1)
    apart = _weights(runs["sharded"], steps) - _weights(runs["plain"], steps)
    result = {
        "losses_sharded": _losses(runs["sharded"]),
        "losses_plain": _losses(runs["plain"]),
        "sharded_parameters": sharded_parameters,
        "weights_apart_per_moved": float(apart.norm() / moved.norm()),
        "weights_max_apart": float(apart.abs().max()),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
