"""The shipped tiny base: where tiny-long finds it, what it is, and that it still retrieves."""

import json
from pathlib import Path

from evalkit.train import load_recipe
from evalkit.train.checkpoint import load_model_state
from evalkit.train.retrieval_check import check_retrieval

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "evalkit" / "checkpoints" / "tiny-base"


def test_tiny_long_continues_the_shipped_base_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(load_recipe("tiny-long").model.path) == BASE.resolve()


def test_the_shipped_base_is_small_bf16_and_says_how_it_was_made():
    size = sum(f.stat().st_size for f in BASE.iterdir())
    assert size < 20 * 2**20
    assert {str(t.dtype) for t in load_model_state(BASE).values()} == {"torch.bfloat16"}
    meta = json.loads((BASE / "meta.json").read_text())
    assert meta["config"]["name"] == "tiny-base" and meta["step"] == 7000
    assert "evalkit train --config tiny-base" in (BASE / "README.md").read_text()


def test_the_shipped_base_retrieves_and_copies_well_above_the_control():
    """Held-out documents (as in checkpoints/tiny-base/README.md, fewer of them): far above chance."""
    retrieval = check_retrieval(BASE, max_tokens=256, documents=48)
    assert retrieval["answer_tokens"] >= 30
    assert retrieval["answer_accuracy"] > 0.8 and retrieval["fact_accuracy"] < 0.3
    copy = check_retrieval(BASE, max_tokens=256, documents=12, kind="copy")
    assert copy["answer_accuracy"] > 0.8 and copy["fact_accuracy"] < 0.4


LONG = ROOT / "evalkit" / "checkpoints" / "tiny-long"
PARADIGMS = ("full", "intra_doc", "anchor")
RELEASED = {"dtype": "bf16_full", "rope_precision": "bf16", "grad_accum_dtype": "bf16"}  # results/study/train.sh


def test_everything_shipped_fits_the_20_mb_budget():
    assert sum(f.stat().st_size for f in (ROOT / "evalkit" / "checkpoints").rglob("*") if f.is_file()) <= 20_000_000


def test_the_shipped_tiny_long_runs_are_seed_1_of_the_study_trained_to_the_end_as_released():
    from evalkit.quickstart import shipped_runs

    runs = shipped_runs("tiny-long")
    assert sorted(run.name for run in runs) == sorted(f"{p}-bf16-seed1" for p in PARADIGMS)
    readme = (LONG / "README.md").read_text()
    recipe = load_recipe("tiny-long")
    for paradigm in PARADIGMS:
        run = LONG / f"{paradigm}-bf16-seed1"
        assert sorted(p.name for p in run.iterdir()) == ["step-550", "step-600"]
        for step in (550, 600):
            meta = json.loads((run / f"step-{step}" / "meta.json").read_text())
            config = meta["config"]
            assert meta["step"] == step and meta["paradigm"] == paradigm
            assert config["name"] == "tiny-long" and config["max_steps"] == recipe.max_steps
            assert config["data"]["retrieval_phrasing"] == recipe.data.retrieval_phrasing
            assert {key: config[key] for key in RELEASED} == RELEASED and meta["precision"]["grad_accum"] == "bf16"
            assert config["data"]["window_start"] == "bos" and config["seed"] == 1
            assert config["model"]["rope_theta"] == 100000
            assert {str(t.dtype) for t in load_model_state(run / f"step-{step}").values()} == {"torch.bfloat16"}
    command = (
        "evalkit train --config tiny-long --paradigm $p --set seed=1 --set model.rope_theta=100000 \\\n"
        "    --set dtype=bf16_full --set rope_precision=bf16 --set grad_accum_dtype=bf16 --set micro_batch=1 \\\n"
        "    --out runs/$p-bf16-seed1"
    )
    assert "for p in full intra_doc anchor; do" in readme and command in readme


def test_the_shipped_tiny_long_runs_retrieve_across_1k_tokens():
    """Held-out 1K documents (as in checkpoints/tiny-long/README.md, fewer): well above the control."""
    for paradigm in PARADIGMS:
        result = check_retrieval(
            LONG / f"{paradigm}-bf16-seed1" / "step-600", max_tokens=1024, documents=12, kind="retrieval-broad"
        )
        assert result["answer_tokens"] >= 30
        assert result["answer_accuracy"] > 0.7 and result["fact_accuracy"] < 0.3, (paradigm, result)
