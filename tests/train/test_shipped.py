"""The shipped tiny base: where tiny-long finds it, what it is, and that it still retrieves."""

import json
from pathlib import Path

from evalkit.train import load_config
from evalkit.train.checkpoint import load_model_state
from evalkit.train.retrieval_check import check_checkpoint

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "checkpoints" / "tiny-base"


def test_tiny_long_continues_the_shipped_base_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(load_config("tiny-long").model.path) == BASE.resolve()


def test_the_shipped_base_is_small_bf16_and_says_how_it_was_made():
    size = sum(f.stat().st_size for f in BASE.iterdir())
    assert size < 20 * 2**20
    assert {str(t.dtype) for t in load_model_state(BASE).values()} == {"torch.bfloat16"}
    meta = json.loads((BASE / "meta.json").read_text())
    assert meta["config"]["name"] == "tiny-base" and meta["step"] == 7000
    assert "evalkit train --config tiny-base" in (BASE / "README.md").read_text()


def test_the_shipped_base_retrieves_and_copies_well_above_the_control():
    """Held-out documents (as in checkpoints/tiny-base/README.md, fewer of them): far above chance."""
    retrieval = check_checkpoint(BASE, max_tokens=256, documents=48)
    assert retrieval["answer_tokens"] >= 30
    assert retrieval["answer_accuracy"] > 0.8 and retrieval["fact_accuracy"] < 0.3
    copy = check_checkpoint(BASE, max_tokens=256, documents=12, kind="copy")
    assert copy["answer_accuracy"] > 0.8 and copy["fact_accuracy"] < 0.4
