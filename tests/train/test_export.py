"""Exported checkpoints (bf16, no trainer state) and the prepared GPU study script, run on a CPU."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from evalkit.errors import UserError
from evalkit.train import train
from evalkit.train.checkpoint import TRAINER_STATE, complete_checkpoints, export_checkpoint, load_model_state
from tests.train.helpers import MICRO, micro_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_export_command_writes_a_bf16_copy_and_refuses_bad_input(tmp_path):
    run = train(micro_config(tmp_path / "run", max_steps=2), show_progress=False)
    source = complete_checkpoints(run)[-1][1]
    cli = [sys.executable, "-m", "evalkit.cli", "export"]
    done = subprocess.run([*cli, str(source), str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "MiB" in done.stdout and json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    for args, message in (
        ([str(source), str(tmp_path / "x"), "--dtype", "fp8"], "unknown dtype 'fp8'; choose one of: bf16, fp32"),
        ([str(tmp_path), str(tmp_path / "y")], "not a complete checkpoint"),
    ):
        bad = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr
        assert not Path(args[1]).exists()


def test_export_casts_weights_drops_trainer_state_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    run = train(micro_config(tmp_path / "run", max_steps=4), show_progress=False)
    source = complete_checkpoints(run)[-1][1]
    assert (source / TRAINER_STATE).is_file()
    target = export_checkpoint(source, tmp_path / "shipped" / "step-4")

    assert not (target / TRAINER_STATE).exists()
    assert json.loads((target / "meta.json").read_text()) == json.loads((source / "meta.json").read_text())
    assert json.loads((target / "config.json").read_text())["dtype"] == "bfloat16"
    original, exported = load_model_state(source), load_model_state(target)
    assert original.keys() == exported.keys()
    for name, tensor in original.items():
        assert exported[name].dtype == torch.bfloat16
        assert torch.equal(exported[name], tensor.to(torch.bfloat16)), name
    assert complete_checkpoints(tmp_path / "shipped") == [(4, target)]

    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    shipped = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        gap = (reference(ids).logits - shipped(ids).logits).abs().max()
    assert 0 < gap < 0.1  # rounded to bf16: close, not identical


def test_export_refuses_an_incomplete_checkpoint(tmp_path):
    (tmp_path / "step-1").mkdir()
    with pytest.raises(UserError, match="not a complete checkpoint"):
        export_checkpoint(tmp_path / "step-1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# Not on the lent GPU machine's image: the study (its training children included) must not import them.
ABSENT_ON_THE_IMAGE = ("datasets", "lm_eval", "wonderwords", "vllm", "flash_attn")


def _blocking_site(tmp_path: Path) -> Path:
    """A sitecustomize that makes those modules unimportable in every process started with it on
    PYTHONPATH (the study passes its PYTHONPATH on to the training processes it starts)."""
    site = tmp_path / "image-site"
    site.mkdir(exist_ok=True)
    lines = ["import sys", *(f"sys.modules[{name!r}] = None" for name in ABSENT_ON_THE_IMAGE)]
    (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return site


def _study(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """The script with OUT = tmp_path/out and the runs in tmp_path/runs, the image's absent modules blocked."""
    out, extra = tmp_path / "out", ("--runs-dir", str(tmp_path / "runs"), *extra)
    sets = [item for s in [*MICRO, "model.attention=blocked"] for item in ("--set", s)]
    command = [
        sys.executable,
        str(ROOT / "scripts" / "gpu_study.py"),
        "--out",
        str(out),
        "--recipe",
        "tiny-cpu",
        *sets,
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": f"{_blocking_site(tmp_path)}{os.pathsep}{ROOT}"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_gpu_study_trains_each_paradigm_checks_and_exports(tmp_path):
    result = _study(tmp_path, "--paradigms", "full,anchor", "--documents", "4", "--set", "max_steps=4",
                    "--set", "seq_len=512", "--set", "checkpoint.every=2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "tiny-cpu-anchor.tar", "tiny-cpu-full.tar"]
    report = (out / "README.md").read_text()
    for paradigm in ("full", "anchor"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {paradigm} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "finished" and cells[2] == "4" and cells[-1] == "2, 4"
        assert 0 <= float(cells[6]) <= 1 and 0 <= float(cells[7]) <= 1  # the retrieval check ran
        assert 0 <= float(cells[9]) <= 1 and 0 <= float(cells[10]) <= 1  # and the copy check
        with tarfile.open(out / f"tiny-cpu-{paradigm}.tar") as archive:
            archive.extractall(tmp_path / "shipped", filter="data")
        shipped = complete_checkpoints(tmp_path / "shipped" / f"tiny-cpu-{paradigm}")
        assert [step for step, _ in shipped] == [2, 4]
        assert not any((path / TRAINER_STATE).exists() for _, path in shipped)
        meta = json.loads((shipped[-1][1] / "meta.json").read_text())
        assert meta["paradigm"] == paradigm


def test_gpu_study_stops_runs_at_the_time_limit(tmp_path):
    result = _study(tmp_path, "--paradigms", "anchor", "--minutes", "0.05", "--set", "max_steps=100000")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| anchor | stopped at the 0.05-minute limit |" in (tmp_path / "out" / "README.md").read_text()


def _load_study_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_study", ROOT / "scripts" / "gpu_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flex_works", [True, False])
def test_gpu_study_falls_back_to_blocked_when_flex_fails_its_smoke_test(flex_works, tmp_path, monkeypatch):
    import argparse

    import evalkit.train

    study = _load_study_module()
    trained = []

    def fake_train(config, **_kwargs):
        assert not Path(config.out).exists()  # a rerun's smoke checkpoints are gone, or train() would refuse
        trained.append(config)
        if not flex_works:
            raise RuntimeError("no backward for this mask\nmore")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(evalkit.train, "train", fake_train)
    stale = tmp_path / "smoke-flex" / "step-2"
    stale.mkdir(parents=True)
    (stale / "meta.json").write_text("{}")
    args = argparse.Namespace(recipe="tiny-gpu", set=[])
    chosen = study.choose_attention(args, tmp_path)
    assert len(trained) == 1 and trained[0].max_steps == 2  # one short smoke run, before the study
    if flex_works:
        assert chosen == "auto" and args.set == []
    else:
        assert chosen.startswith("blocked") and args.set == ["model.attention=blocked"]
