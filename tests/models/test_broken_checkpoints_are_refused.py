"""No score from a broken checkpoint: every loader (the hf engine, the vllm engine's check, probe,
`train --model`) refuses with one line naming the file an invalid or mistyped config.json, a
truncated safetensors file, pickle-only weights, custom model code, missing, unexpected or
non-finite weights, and a tokenizer or chat template that does not load (a template that tries to
leave Jinja's sandbox never runs); a tied lm_head is fine. Nothing is scored or trained then."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evalkit.errors import UserError
from tests.helpers import (
    ROOT,
    TINY_BASE,
    copy_tiny_base,
    edit_config,
    edit_json,
    edit_weights,
    error_line,
    evalkit,
    evalkit_here,
    truncate_weights,
)
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def drop_layer_0(checkpoint: Path) -> None:
    edit_weights(checkpoint, lambda w: {k: v for k, v in w.items() if ".layers.0." not in k})


def add_stray_weight(checkpoint: Path) -> None:
    edit_weights(checkpoint, lambda w: {**w, "model.stray.weight": torch.zeros(3)})


def untie_without_head(checkpoint: Path) -> None:
    edit_config(checkpoint, tie_word_embeddings=False)  # the file stores no lm_head: it was tied


def pickle_only(checkpoint: Path) -> None:
    torch.save(load_file(checkpoint / "model.safetensors"), checkpoint / "pytorch_model.bin")
    (checkpoint / "model.safetensors").unlink()


def custom_code(checkpoint: Path) -> None:
    edit_config(
        checkpoint,
        model_type="mystery_lm",
        auto_map={"AutoConfig": "mystery.MysteryConfig", "AutoModelForCausalLM": "mystery.MysteryForCausalLM"},
    )


BROKEN = {
    "missing-layer-0": (drop_layer_0, ["lacks 9 weights", "model.layers.0.input_layernorm.weight"]),
    "stray-weight": (add_stray_weight, ["holds 1 weight", "model.stray.weight"]),
    "untied-no-head": (untie_without_head, ["lacks 1 weight", "lm_head.weight"]),
    "truncated": (truncate_weights, ["model.safetensors is truncated or corrupt"]),
    "pickle-only": (pickle_only, ["pytorch_model.bin", "safetensors only", "save_pretrained"]),
    "custom-code": (custom_code, ["auto_map", "trust_remote_code"]),
    "invalid-config": (
        lambda ckpt: (ckpt / "config.json").write_text('{"model_type": "llama",'),
        ["config.json is not valid JSON"],
    ),
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("broken")
    made = {}
    for name, (damage, _fragments) in BROKEN.items():
        made[name] = copy_tiny_base(folder / name)
        damage(made[name])
    return made


@pytest.mark.parametrize("case", list(BROKEN))
def test_ruler_refuses_a_broken_checkpoint_with_one_line(broken, case, tmp_path):
    out = tmp_path / "ruler"
    result = evalkit(
        "ruler", "--ckpts", broken[case], "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1", "--out", out
    )
    line = error_line(result)
    assert str(broken[case]) in line
    for fragment in BROKEN[case][1]:
        assert fragment in line
    assert not list(out.rglob("*.jsonl")) and not list(out.rglob("*summary.json"))  # nothing scored


def test_the_engine_loads_tied_embeddings_without_complaint():
    """The control for the refusals above: tiny-base stores no lm_head, and that is right."""
    from evalkit.engines import get_engine

    assert "lm_head.weight" not in load_file(TINY_BASE / "model.safetensors")
    engine = get_engine("hf", TINY_BASE, dtype="fp32", device="cpu")
    model = engine.model
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_the_probe_refuses_an_invalid_config_and_missing_weights(broken, tmp_path):
    bad_json = copy_tiny_base(tmp_path / "bad-json")
    (bad_json / "config.json").write_text('{"model_type": "llama",')
    line = error_line(evalkit("probe", "shift", "--ckpt", bad_json, "--out", tmp_path / "p1"))
    assert f"{bad_json}/config.json is not valid JSON" in line
    line = error_line(evalkit("probe", "shift", "--ckpt", broken["missing-layer-0"], "--seq", "16", "--n", "1",
                              "--dtypes", "bf16", "--delta1", "0", "--out", tmp_path / "p2"))  # fmt: skip
    assert "lacks 9 weights" in line and "layers.0.input_layernorm.weight" in line
    assert not (tmp_path / "p1").exists() and not (tmp_path / "p2").exists()


def test_train_refuses_to_continue_a_checkpoint_missing_weights(broken, tmp_path):
    out = tmp_path / "run"
    line = error_line(
        evalkit("train", "--config", "tiny-cpu", "--model", broken["missing-layer-0"], "--max-steps", "1", "--out", out)
    )
    assert str(broken["missing-layer-0"]) in line and "lacks 9 weights" in line
    assert not list(out.glob("step-*"))


def with_chat_template(template: str):
    return lambda ckpt: edit_json(ckpt / "tokenizer_config.json", lambda c: {**c, "chat_template": template})


def overwrite(name: str, text: str):
    return lambda ckpt: (ckpt / name).write_text(text)


# Each breaks one file that is read while a checkpoint's tokenizer, template or config is loaded;
# (how, the file the error line must name, --prompt-format).
BROKEN_FILES = {
    "template escaping the sandbox": (
        with_chat_template("{{ cycler.__init__.__globals__.os.system('touch PWNED') }}"),
        "tokenizer_config.json",
        "chat",
    ),
    "template that does not parse": (with_chat_template("{% for m in messages %}"), "tokenizer_config.json", "chat"),
    "template that raises": (
        with_chat_template("{{ raise_exception('no system role') }}"),
        "tokenizer_config.json",
        "chat",
    ),
    "template file that does not parse": (overwrite("chat_template.jinja", "{% if %}"), "chat_template.jinja", "chat"),
    "tokenizer_config.json not JSON": (
        overwrite("tokenizer_config.json", "{ not json"),
        "tokenizer_config.json",
        "base",
    ),
    "tokenizer.json not JSON": (overwrite("tokenizer.json", '{"model": '), "tokenizer.json", "base"),
    "tokenizer.json of another shape": (overwrite("tokenizer.json", '{"model": 5}'), "tokenizer.json", "base"),
    "config.json field of the wrong type": (
        lambda ckpt: edit_json(ckpt / "config.json", lambda c: {**c, "num_hidden_layers": "two"}),
        "config.json",
        "base",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_FILES))
def test_a_broken_template_tokenizer_or_config_is_one_line_naming_the_file(case, tmp_path, capsys):
    damage, file_name, prompt_format = BROKEN_FILES[case]
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    damage(ckpt)
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "256", "--samples", "1"]
    line = error_line(evalkit_here(capsys, *args, "--prompt-format", prompt_format, "--out", tmp_path / "out"))
    assert str(ckpt / file_name) in line, line
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()


def poison(ckpt: Path, value: float) -> Path:
    def change(weights: dict) -> dict:
        name = "model.layers.0.mlp.up_proj.weight"
        weights[name] = weights[name].clone()
        weights[name][0, :3] = value
        return weights

    edit_weights(ckpt, change)
    return ckpt


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory) -> Path:
    return poison(copy_tiny_base(tmp_path_factory.mktemp("nan") / "run" / "step-1"), float("nan"))


NON_FINITE = "holds NaN or infinite weights: model.layers.0.mlp.up_proj.weight (3 values)"


def test_ruler_refuses_nan_weights_before_scoring(nan_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["ruler", nan_checkpoint, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args))
    assert str(nan_checkpoint / "model.safetensors") in line and NON_FINITE in line, line
    assert not list(out.rglob("*summary.json")) and not list(out.rglob("*.jsonl"))  # nothing scored


def test_probe_and_train_refuse_infinite_weights(tmp_path, capsys):
    ckpt = poison(copy_tiny_base(tmp_path / "run" / "step-1"), float("-inf"))
    probe_args = ["probe", "shift", "--ckpt", ckpt, "--seq", "16", "--n", "1", "--delta1", "0"]
    probe = error_line(evalkit_here(capsys, *probe_args, "--out", tmp_path / "probe"))
    assert NON_FINITE in probe, probe
    train_args = ["train", "--config", "tiny-cpu", "--model", ckpt, "--max-steps", "1"]
    assert NON_FINITE in error_line(evalkit_here(capsys, *train_args, "--out", tmp_path / "train"))
    assert not list((tmp_path / "train").glob("step-*"))


def test_every_loader_shares_the_non_finite_check(nan_checkpoint):
    """The vllm engine runs check_checkpoint before vLLM starts (no vLLM here to start)."""
    from evalkit.engines import vllm as vllm_engine
    from evalkit.models.check import check_checkpoint

    with pytest.raises(UserError, match="NaN or infinite"):
        check_checkpoint(nan_checkpoint)
    assert "check_checkpoint(self.model_path" in Path(vllm_engine.__file__).read_text()


@pytest.mark.parametrize("step", [None, [600], "six hundred"])
def test_a_meta_step_that_is_no_number_reads_as_step_zero(tmp_path, step):
    """A checkpoint directory not named step-N takes its step from meta.json; one that holds no
    number there (null, a list, a word) is step 0, as one without the field, never a traceback."""
    from evalkit.models.refs import resolve_checkpoints

    checkpoint = tmp_path / "mine"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "meta.json").write_text(json.dumps({"step": step}))
    ((ref,),) = [resolve_checkpoints([str(checkpoint)])]
    assert (ref.run, ref.step) == ("mine", 0)
