"""The probe reads the regime a checkpoint trained in: a bf16_full run's BF16 condition has its RoPE
frequencies rounded to bf16 as in training, and every report says what each condition computed in."""

import json
import shutil

import torch

from evalkit.probe import run_probe
from evalkit.probe.run import load_model, trained_regime
from tests.train.helpers import micro_config


def _trained(tmp_path, *sets):
    from evalkit.train.loop import train

    run = train(micro_config(tmp_path / "run", *sets, max_steps=2), show_progress=False)
    return run / "step-2"


def _conditions(result) -> dict:
    return {(r["condition"], r["dtype"]): r for r in result["provenance"]["condition_precision"]}


def test_a_bf16_full_checkpoint_is_probed_as_it_trained(tmp_path):
    checkpoint = _trained(tmp_path, "dtype=bf16_full", "rope_precision=bf16")
    result = run_probe("tokens", checkpoint, tmp_path / "out", seq_len=20, n_texts=1, dtypes="bf16,fp32")
    conditions = _conditions(result)
    assert conditions["pretrained", "bf16"] | {} == {
        "condition": "pretrained", "dtype": "bf16", "weights": "bf16", "residual": "bf16",
        "rope_frequencies": "bf16", "as_trained": True,
    }  # fmt: skip
    assert conditions["pretrained", "fp32"]["rope_frequencies"] == "fp32"
    assert not conditions["pretrained", "fp32"]["as_trained"]
    assert result["provenance"]["trained_precision"]["dtype"] == "bf16_full"
    report = open(result["files"]["markdown"]).read()
    assert "## Precision of each condition" in report and "the released regime" in report

    # The frequencies as the model computes them (fp32, by the formula here), then rounded to bf16.
    config = json.loads((checkpoint / "config.json").read_text())
    dim = config["hidden_size"] // config["num_attention_heads"]
    theta = config["rope_parameters"]["rope_theta"]
    expected = (1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)).to(torch.bfloat16)
    from transformers import AutoConfig

    model = load_model(
        checkpoint, AutoConfig.from_pretrained(checkpoint), "pretrained", "bf16", torch.device("cpu"), 0,
        trained_regime(checkpoint),
    )  # fmt: skip
    (inv_freq,) = {m.inv_freq for m in model.modules() if hasattr(m, "inv_freq")}
    assert inv_freq.dtype == torch.bfloat16 and torch.equal(inv_freq, expected)

    # The same weights without the record are probed as transformers loads them: fp32 frequencies,
    # and other numbers in the BF16 condition.
    plain = tmp_path / "plain"
    shutil.copytree(checkpoint, plain)
    meta = json.loads((plain / "meta.json").read_text())
    del meta["precision"]
    (plain / "meta.json").write_text(json.dumps(meta))
    other = run_probe("tokens", plain, tmp_path / "out-plain", seq_len=20, n_texts=1, dtypes="bf16")
    assert _conditions(other)["pretrained", "bf16"]["rope_frequencies"] == "fp32"
    values = {
        r["column"]: r["value"] for r in result["rows"] if r["metric"] == "attn_diff_column" and r["dtype"] == "bf16"
    }
    others = {r["column"]: r["value"] for r in other["rows"] if r["metric"] == "attn_diff_column"}
    assert values != others


def test_an_autocast_checkpoint_keeps_transformers_fp32_frequencies(tmp_path):
    checkpoint = _trained(tmp_path, "dtype=bf16", "rope_precision=bf16")
    result = run_probe("tokens", checkpoint, tmp_path / "out", seq_len=20, n_texts=1, dtypes="bf16")
    regime = _conditions(result)["pretrained", "bf16"]
    assert (regime["rope_frequencies"], regime["as_trained"]) == ("fp32", False)
    assert "bf16 autocast" in open(result["files"]["markdown"]).read()
