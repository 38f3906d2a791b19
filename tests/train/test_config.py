"""Recipes, overrides and validation: every mistake is one line before any work starts."""

import pytest

from evalkit.attention import Paradigm
from evalkit.errors import UserError
from evalkit.train.config import CONFIG_DIR, load_recipe


def test_tiny_cpu_recipe_and_overrides():
    config = load_recipe("tiny-cpu", {"paradigm": "intra_doc", "seq_len": 512}, ["optim.lr=2e-5", "model.num_layers=2"])
    assert config.name == "tiny-cpu"
    assert config.paradigm is Paradigm.INTRA_DOC
    assert config.seq_len == 512
    assert config.optim.lr == 2e-5  # YAML reads 2e-5 as a string; the field's type decides
    assert config.model.num_layers == 2
    assert str(config.run_dir()) == "runs/tiny-cpu-intra_doc"


@pytest.mark.parametrize("recipe", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_every_shipped_recipe_loads(recipe):
    config = load_recipe(recipe)
    assert config.max_steps >= 1


def test_paper_recipes_match_the_paper():
    for recipe, theta in [
        ("llama2-7b-64k", 5e6),
        ("llama3-8b-64k", 5e6),
        ("mistral-7b-v0.3-64k", 5e6),
        ("qwen1.5-1.8b-64k", 5e6),
    ]:
        config = load_recipe(recipe)
        assert config.seq_len == 65536 and config.model.rope_theta == theta
        assert config.max_steps == 2000 and config.windows_per_step == 8
        o = config.optim
        assert (o.lr, o.weight_decay, o.beta1, o.beta2, o.eps, o.schedule) == (2e-5, 0.1, 0.9, 0.95, 1e-8, "constant")
        # the released trainer's regime (DeepSpeed bf16: bf16 weights, buffers, residual; cos/sin cast to bf16;
        # ZeRO-3's bf16 gradient reduction and accumulation)
        assert (config.dtype, config.rope_precision, config.grad_accum_dtype) == ("bf16_full", "bf16", "bf16")
        assert config.grad_checkpointing
        assert config.checkpoint_steps() == {1960, 1970, 1980, 1990, 2000}


@pytest.mark.parametrize(
    "sets, message",
    [
        (["optim.lrr=1"], "unknown config key 'optim.lrr'"),
        (["seq_len=long"], "seq_len: expected int, got 'long'"),
        (["grad_checkpointing=maybe"], "grad_checkpointing: expected bool"),
        (["paradigm=causal"], "unknown paradigm 'causal'"),
        (["model=3"], "model: expected a section"),
        (["dtype=fp16"], "dtype must be one of fp32, bf16, bf16_full, got 'fp16'"),
        (["noequals"], "expected key=value"),
        (["dtype=bf16", "rope_precision=fp16"], "rope_precision must be fp32 or bf16, got 'fp16'"),
        (["rope_precision=bf16"], "rope_precision=bf16 needs dtype=bf16"),
        (["model.attention=flash"], "model.attention=flash needs dtype=bf16"),
        (["dtype=bf16_full", "grad_accum_dtype=fp16"], "grad_accum_dtype must be one of fp32, bf16, got 'fp16'"),
        (["dtype=bf16", "grad_accum_dtype=bf16"], "grad_accum_dtype=bf16 needs dtype=bf16_full"),
        (["data.retrieval_phrasing=fancy"], "data.retrieval_phrasing must be one of plain, varied, broad"),
        (["micro_batch=0"], "micro_batch must be at least 1, got 0"),
        (["model.num_kv_heads=0"], "model.num_kv_heads must be at least 1, got 0"),
        (["data.max_documents=0"], "data.max_documents must be at least 1 (or null: every document), got 0"),
        (["checkpoint.final_spacing=-2"], "checkpoint.final_spacing must be at least 1, got -2"),
        (
            ["data.retrieval_fraction=0.7", "data.copy_fraction=0.4"],
            "data.copy_fraction must be at least 0, and retrieval_fraction",
        ),
    ],
)
def test_bad_settings_are_one_line_errors(sets, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("tiny-cpu", sets=sets)


def test_unknown_recipe_lists_the_available_ones():
    with pytest.raises(UserError, match="tiny-cpu"):
        load_recipe("no-such-recipe")


def test_base_inheritance(tmp_path):
    (tmp_path / "parent.yaml").write_text("seq_len: 256\noptim:\n  lr: 0.5\n  weight_decay: 0.0\n")
    (tmp_path / "child.yaml").write_text("base: parent\noptim:\n  lr: 0.25\n")
    config = load_recipe(str(tmp_path / "child.yaml"))
    assert (config.seq_len, config.optim.lr, config.optim.weight_decay, config.name) == (256, 0.25, 0.0, "child")


def test_dot_paths_in_a_recipe_are_relative_to_the_recipe_file(tmp_path, monkeypatch):
    """A recipe can name a checkpoint shipped beside it and be used from any directory."""
    (tmp_path / "recipes" / "deeper").mkdir(parents=True)
    (tmp_path / "recipes" / "base.yaml").write_text("model:\n  path: ../ckpt/base\ndata:\n  source: data/x.jsonl\n")
    (tmp_path / "recipes" / "deeper" / "child.yaml").write_text("base: ../base.yaml\ndata:\n  tokenizer: ./tok\n")
    monkeypatch.chdir(tmp_path / "recipes" / "deeper")
    config = load_recipe(str(tmp_path / "recipes" / "deeper" / "child.yaml"))
    assert config.model.path == str((tmp_path / "ckpt" / "base").resolve())
    assert config.data.tokenizer == str((tmp_path / "recipes" / "deeper" / "tok").resolve())
    assert config.data.source == "data/x.jsonl"  # no ./: a hub name or a path from where evalkit runs
    assert load_recipe(str(tmp_path / "recipes" / "base.yaml"), sets=["model.path=./mine"]).model.path == "./mine"


def test_checkpoint_window():
    config = load_recipe("tiny-cpu", {"max_steps": 100}, ["checkpoint.final_count=3", "checkpoint.final_spacing=20"])
    assert config.checkpoint_steps() == {60, 80, 100}
