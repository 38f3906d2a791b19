"""A micro version of the tiny-cpu recipe, small enough for many short runs in the test suite."""

import json
from pathlib import Path

from evalkit.train import load_recipe

MICRO = [
    "seq_len=128",
    "windows_per_step=4",
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
    "model.max_position_embeddings=512",
    "data.num_retrieval_docs=200",
    "optim.warmup_steps=0",
    "optim.schedule=constant",
    "optim.lr=3e-3",
    "checkpoint.every=4",
    "checkpoint.final_count=2",
    "checkpoint.final_spacing=2",
]


def micro_config(out: Path, *sets: str, paradigm: str = "anchor", max_steps: int = 8):
    return load_recipe("tiny-cpu", {"out": str(out), "paradigm": paradigm, "max_steps": max_steps}, [*MICRO, *sets])


def micro_args(out: Path, *sets: str, paradigm: str = "anchor", max_steps: int = 8) -> list[str]:
    """The same run as command-line arguments of `evalkit train`."""
    args = ["train", "--config", "tiny-cpu", "--out", str(out), "--paradigm", paradigm, "--max-steps", str(max_steps)]
    for s in [*MICRO, *sets]:
        args += ["--set", s]
    return args


def losses(run_dir: Path) -> list[float]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if line.strip()]
