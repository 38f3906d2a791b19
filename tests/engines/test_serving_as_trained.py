"""A checkpoint is served in the regime it trained in unless stock is asked for: the hf engine's
forward, served as trained, is the trainer's own (KL at rounding level against train.loop's forward
path); served stock it is not, and says so with the KL; the regime keys stored answers."""

import json
import shutil

import pytest
import torch

from evalkit.engines import get_engine
from evalkit.engines.hf import divergence, probe_tokens
from evalkit.errors import UserError
from evalkit.models.precision import Serving, served_regime
from evalkit.probe.parity import bucket_rows, measure
from evalkit.train.loop import trainer_logprobs
from tests.helpers import run_cli
from tests.train.helpers import micro_config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A micro run in the released regime (bf16 weights, buffers, RoPE), at a base where the bf16
    frequencies are far from the fp32 ones at a few hundred positions."""
    from evalkit.train.loop import train

    out = tmp_path_factory.mktemp("released") / "run"
    sets = ("dtype=bf16_full", "rope_precision=bf16", "model.rope_theta=100000")
    return _sharpened(train(micro_config(out, *sets, max_steps=2), show_progress=False) / "step-2")


def _sharpened(checkpoint):
    """Two steps leave the next-token distributions near uniform, where every serving agrees: the
    final norm's scale times 16 (exact in bf16) makes them peaked, as a trained model's are."""
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] * 16
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return checkpoint


def _with_precision(tmp_path, checkpoint, precision):
    """The checkpoint's weights under another meta.json precision record (None: no record)."""
    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta.pop("precision")
    if precision is not None:
        meta["precision"] = precision
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize(
    "precision, trained, stock_off",
    [
        (None, Serving("trained", "fp32"), False),  # nothing recorded: served as loaded
        ({"dtype": "fp32", "rope": "fp32", "buffers": "fp32", "rotation": "fp32"}, Serving("trained", "fp32"), False),
        (
            {"dtype": "bf16", "rope": "fp32", "buffers": "fp32", "rotation": "fp32"},
            Serving("trained", "bf16", "fp32", "fp32", unlike_stock=True),
            True,
        ),
        (
            {"dtype": "bf16_full", "rope": "bf16", "buffers": "bf16", "rotation": "bf16"},
            Serving("trained", "bf16", "bf16", "cast", unlike_stock=True),
            True,
        ),
        (
            {"dtype": "bf16_full", "rope": "fp32", "buffers": "bf16, RoPE frequencies fp32", "rotation": "fp32"},
            Serving("trained", "bf16", "fp32", "fp32", unlike_stock=True),
            True,
        ),
    ],
)
def test_the_served_regime_is_read_from_the_record(tmp_path, released, precision, trained, stock_off):
    checkpoint = _with_precision(tmp_path, released, precision)
    assert served_regime(checkpoint, "trained", device="cpu") == trained
    stock = served_regime(checkpoint, "stock", device="cpu")
    assert (stock.dtype, stock.frequencies, stock.rotation) == ("fp32", "fp32", "cast")
    assert bool(stock.off_regime) == stock_off
    assert stock.key_facts() == {}  # results from before the setting were served stock: their keys hold
    assert bool(trained.key_facts()) == stock_off


def test_a_dtype_that_contradicts_the_trained_regime_is_refused(released):
    with pytest.raises(UserError, match="serving=trained computes in bf16, not fp32"):
        served_regime(released, "trained", "fp32", "cpu")
    assert served_regime(released, "stock", "fp32", "cpu").dtype == "fp32"


def test_served_as_trained_the_hf_engine_computes_the_trainers_forward(released, capsys):
    engine = get_engine("hf", released)
    # The frequencies as the model's formula computes them in fp32, rounded to bf16 as the trainer held them.
    config = json.loads((released / "config.json").read_text())
    dim = config["hidden_size"] // config["num_attention_heads"]
    expected = (1.0 / 1e5 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)).to(torch.bfloat16)
    (inv_freq,) = {module.inv_freq for module in engine.model.modules() if hasattr(module, "inv_freq")}
    assert inv_freq.dtype == torch.bfloat16 and torch.equal(inv_freq, expected)
    assert engine.engine_info()["serving"] == "trained" and engine.dtype == "bf16"

    tokens = probe_tokens(engine.tokenizer, 512)
    reference = trainer_logprobs(released, tokens, CPU)
    kl, top1 = divergence(reference, engine.position_logprobs(tokens))
    # Rounding level: the trainer's attention (evalkit's blocked kernel) and the engine's SDPA sum in
    # other orders; a served regime off by one rounding of the frequencies costs more (below).
    assert float(kl.max()) < 1e-3 and float(top1.float().mean()) > 0.99

    stock = get_engine("hf", released, serving="stock")
    said = capsys.readouterr().err
    assert "served stock" in said and "off the regime it trained in" in said and "KL" in said
    stock_kl, _ = divergence(reference, stock.position_logprobs(tokens))
    assert float(stock_kl.mean()) > 10 * max(float(kl.mean()), 1e-7)
    assert stock.engine_info()["off_regime_kl"] > 0


def test_an_fp32_rotation_is_served_as_it_trained(tmp_path):
    from evalkit.train.loop import train

    run = train(
        micro_config(tmp_path / "run", "dtype=bf16_full", "rope_precision=fp32", max_steps=2), show_progress=False
    )
    checkpoint = run / "step-2"
    engine = get_engine("hf", checkpoint)
    assert (engine.served.frequencies, engine.served.rotation) == ("fp32", "fp32")
    tokens = probe_tokens(engine.tokenizer, 256)
    kl, top1 = divergence(trainer_logprobs(checkpoint, tokens, CPU), engine.position_logprobs(tokens))
    assert float(kl.max()) < 1e-3 and float(top1.float().mean()) > 0.99
    # and generation runs through the cache with fp32 keys beside bf16 values
    assert len(engine.generate(["The"], max_new_tokens=4)) == 1


def test_parity_buckets_by_position_and_is_a_command(tmp_path, released):
    kl = torch.arange(200, dtype=torch.float32)
    rows = bucket_rows(kl, kl % 2 == 0)
    assert [r["positions"] for r in rows] == ["0-63", "64-127", "128-199"]
    assert rows[1]["kl_mean"] == pytest.approx(95.5) and rows[2]["kl_max"] == 199 and rows[0]["top1_agreement"] == 0.5

    measured = measure(released, ["hf"], 256)
    assert {(r["serving"], r["positions"]) for r in measured} == {
        (s, p) for s in ("trained", "stock") for p in ("0-63", "64-127", "128-255")
    }
    assert run_cli(["parity", str(released), "--length", "128", "--out", str(tmp_path / "parity")]) == 0
    stored = json.loads((tmp_path / "parity" / "parity.json").read_text())
    assert {r["served"] for r in stored["rows"]} == {
        "bf16, RoPE frequencies bf16, rotation cast",
        "fp32, RoPE frequencies fp32, rotation cast",
    }

    plain = _with_precision(tmp_path, released, None)
    meta = json.loads((plain / "meta.json").read_text())
    del meta["config"]
    (plain / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="records no training run"):
        measure(plain, ["hf"], 128)
    with pytest.raises(UserError, match="no checkpoint directory at"):
        measure(tmp_path / "absent", ["hf"], 128)


def test_each_serving_keys_its_own_answers(tmp_path, released):
    """RULER's answers and perplexity's documents of one checkpoint served as trained and stock are
    two results (neither is read back as the other), and each summary says which serving it was."""
    out, step = tmp_path / "out", tmp_path / "out" / "run" / "step-2"
    common = ["--ckpts", str(released), "--lengths", "512", "--out", str(out)]
    ruler_keys = []
    for serving in ("trained", "stock"):
        ruler = ["ruler", *common, "--tasks", "niah_single_1", "--samples", "2", "--engine-arg", f"serving={serving}"]
        assert run_cli(ruler) == 0
        assert json.loads((step / "ruler-summary.json").read_text())["provenance"]["engine"]["serving"] == serving
        ruler_keys += [json.loads(line)["key"] for line in (step / "ruler/niah_single_1/512.jsonl").open()]
        assert run_cli(["ppl", *common, "--docs", "2", "--engine-arg", f"serving={serving}"]) == 0
    assert len(ruler_keys) == 4 and len(set(ruler_keys)) == 2  # the stock run answered again, under its key
    assert len({json.loads(line)["key"] for line in (step / "ppl/ppl/512.jsonl").open()}) == 2  # one shared log
