"""A plain (non-editable) install carries what evalkit reads at run time: recipes, lm-eval task
fixtures and the tiny study's shipped checkpoints."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECK_INSTALLED = """
import sys
from pathlib import Path
import evalkit
from evalkit.general.catalog import TASKS_DIR
from evalkit.quickstart import shipped_runs
from evalkit.train import load_config
from evalkit.train.config import resolve_recipe

site = Path(sys.argv[1]).resolve()
assert Path(evalkit.__file__).resolve().is_relative_to(site), evalkit.__file__  # the installed copy, not the checkout
assert resolve_recipe("tiny-cpu").is_relative_to(site)
base = Path(load_config("tiny-long", {}, []).model.path)
assert base.is_relative_to(site) and (base / "model.safetensors").is_file(), base
assert sorted(p.name for p in (TASKS_DIR / "evalkit_fixtures").glob("*.jsonl")) == ["hellaswag_style.jsonl", "longbench_style.jsonl", "mmlu_style.jsonl"]
assert len(shipped_runs("tiny-long")) == 3
print("ok")
"""  # noqa: E501 - a line of this script (a string constant) is 128 columns


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
