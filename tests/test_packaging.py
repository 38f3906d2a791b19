"""A plain (non-editable) install carries what evalkit reads at run time: recipes, lm-eval task
fixtures and the tiny study's shipped checkpoints; from another directory, it trains the
embedded recipe and scores a fixture through the installed copy."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK_INSTALLED = """
import sys
from pathlib import Path
import evalkit
from evalkit.general.catalog import TASKS_DIR
from evalkit.quickstart import shipped_runs
from evalkit.train import load_recipe
from evalkit.train.config import resolve_recipe

site = Path(sys.argv[1]).resolve()
assert Path(evalkit.__file__).resolve().is_relative_to(site), evalkit.__file__  # the installed copy, not the checkout
assert resolve_recipe("tiny-cpu").is_relative_to(site)
base = Path(load_recipe("tiny-long", {}, []).model.path)
assert base.is_relative_to(site) and (base / "model.safetensors").is_file(), base
assert sorted(p.name for p in (TASKS_DIR / "evalkit_fixtures").glob("*.jsonl")) == [
    "babilong_style.jsonl", "hellaswag_style.jsonl", "longbench_e_style.jsonl", "longbench_style.jsonl", "mmlu_style.jsonl"
]
assert len(shipped_runs("tiny-long")) == 3
print("ok")
"""  # noqa: E501 - a line of this script (a string constant) is 128 columns


@pytest.mark.slow
def test_a_built_wheel_installs_recipes_fixtures_and_shipped_checkpoints(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(ROOT), "-w", str(tmp_path / "wheel")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("evalkit-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel: what pip install would lay down
    checked = subprocess.run(
        [sys.executable, "-c", CHECK_INSTALLED, str(site)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        check=False,
    )
    assert checked.returncode == 0 and checked.stdout.strip() == "ok", checked.stderr[-3000:]

    # The installed copy at work, from a directory that is not the checkout.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "EVALKIT_CACHE": os.environ["EVALKIT_CACHE"]}
    env["HOME"] = str(tmp_path)  # nothing of the user's home is read

    def evalkit(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "evalkit.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=elsewhere, timeout=600)

    trained = evalkit("train", "--config", "tiny-cpu", "--max-steps", "2", "--set", "seq_len=256",
                      "--set", "model.num_layers=1", "--set", "data.num_retrieval_docs=50")  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    (checkpoint,) = (elsewhere / "runs").glob("*/step-2")
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["step"] == 2 and meta["paradigm"] == "anchor"
    scored = evalkit("general", "--ckpts", str(checkpoint), "--tasks", "evalkit_fixture_mmlu_style", "--limit", "4",
                     "--out", "results")  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    summary = json.loads(next((elsewhere / "results").rglob("general-summary.json")).read_text())
    group = [row for row in summary["rows"] if row["task"] == "evalkit_fixture_mmlu_style"]
    assert group and {row["n"] for row in group} == {12}  # the group: its three subjects, 4 documents each
