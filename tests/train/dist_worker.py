"""One rank of the 2-process gloo runs of tests/train/test_distributed.py (started by torchrun).

argv[1] is a JSON spec: phases run in order, each a `train` call in a process group of its own
whose collective timeout is `timeout_s` (short, as a slow save would meet NCCL's watchdog).
Per phase the rank records which functions that read a checkpoint or a model it called, its peak
RSS when the first optimizer step starts (the load's peak, in a fresh process) and the dtype of
a decoder layer's weight inside its forward; rank 0 can be made to write its first checkpoint
slowly. Each rank writes rank<N>.json to spec["report_dir"].
"""

import json
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from evalkit.errors import UserError
from evalkit.train import checkpoint as ckpt
from evalkit.train import distributed, load_recipe, loop
from evalkit.train import model as model_module
from tests.train.helpers import MICRO


def _spied(module, name: str, calls: list, record=None):
    original = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(record(*args, **kwargs) if record else name)
        return original(*args, **kwargs)

    setattr(module, name, spy)
    return lambda: setattr(module, name, original)


def _record_gathered_dtype(seen: list):
    """After sharding: the dtype of a decoder layer's weight as its forward starts (after FSDP2's all-gather)."""
    original = distributed.shard

    def shard(model, ctx, *args, **kwargs):
        sharded = original(model, ctx, *args, **kwargs)
        layer = sharded.lm.base_model.layers[0]
        layer.register_forward_pre_hook(lambda module, *_: seen.append(str(module.mlp.up_proj.weight.dtype)))
        return sharded

    distributed.shard = shard
    return lambda: setattr(distributed, "shard", original)


def _slow_first_save(seconds: float, rank: int):
    original = ckpt.write_checkpoint
    state = {"slowed": False}

    def slow(*args, **kwargs):
        if rank == 0 and not state["slowed"]:
            state["slowed"] = True
            time.sleep(seconds)  # storage slower than the collective timeout
        return original(*args, **kwargs)

    ckpt.write_checkpoint = slow
    return lambda: setattr(ckpt, "write_checkpoint", original)


def _run_phase(phase: dict, timeout_s: float, rank: int) -> dict:
    calls: list = []
    peak = {}
    gathered: list = []
    error = None
    undo = [
        _record_gathered_dtype(gathered),
        _spied(ckpt, "load_model_state", calls),
        _spied(ckpt, "load_trainer_state", calls),
        _spied(model_module, "load_pretrained", calls),
        _spied(loop, "build_model", calls, lambda *a, weights=True, **k: f"build_model(weights={weights})"),
        _spied(loop, "optimizer_step", [], lambda *a, **k: peak.setdefault("kb", _maxrss_kb())),
    ]
    if phase.get("slow_save_s"):
        undo.append(_slow_first_save(phase["slow_save_s"], rank))
    # A store of its own per phase (torchrun's keeps the keys of the groups of earlier phases, same
    # names, stale addresses). Connecting may take a busy machine longer than the timeout under
    # test: connect with a generous one, then shorten it for every collective that follows.
    # train() destroys the group at its end.
    world, connect = int(os.environ["WORLD_SIZE"]), timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", phase["port"], world, is_master=rank == 0, timeout=connect)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=connect)
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s), dist.group.WORLD)
    try:
        overrides = {"out": phase["out"], "paradigm": "anchor", "max_steps": phase["max_steps"]}
        config = load_recipe("tiny-cpu", overrides, [*MICRO, *phase.get("sets", [])])
        loop.train(config, resume=phase.get("resume", False), show_progress=False)
    except UserError as err:  # a phase may expect one; the test reads it from the report
        error = str(err)
    finally:
        for restore in undo:
            restore()
    return {
        "error": error,
        "calls": calls,
        "load_peak_rss_kb": peak.get("kb"),
        "gathered_dtypes": sorted(set(gathered)),
    }


def _maxrss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    report = {"rank": rank, "phases": [_run_phase(p, spec["timeout_s"], rank) for p in spec["phases"]]}
    (Path(spec["report_dir"]) / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
