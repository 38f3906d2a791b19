"""run_probe end to end on a saved tiny checkpoint: files, rows, provenance, and one-line user errors."""

import json
import shutil

import pytest

from evalkit.errors import UserError
from evalkit.probe import run_probe

ROW_KEYS = {
    "metric",
    "kind",
    "condition",
    "dtype",
    "rope",
    "delta1",
    "delta2",
    "length",
    "n_texts",
    "column",
    "value",
    "std",
    "layers",
}


def test_shift_writes_rows_plots_and_a_summary_that_follows_the_numbers(checkpoint, tmp_path):
    messages = []
    result = run_probe(
        "shift",
        checkpoint,
        tmp_path,
        seq_len=24,
        n_texts=2,
        delta1="0,16,40",
        rope="cast,fp32",
        random_init=True,
        progress=messages.append,
    )
    files = result["files"]
    stored = json.loads(open(files["json"]).read())
    rows = stored["rows"]
    assert all(set(r) == ROW_KEYS for r in rows)
    assert {(r["condition"], r["dtype"], r["rope"]) for r in rows} == {
        (c, d, rope)
        for c, d in [("pretrained", "bf16"), ("pretrained", "fp32"), ("random_init", "bf16")]
        for rope in ("cast", "fp32")
    }
    assert len(rows) == 6 * 3
    assert all(r["value"] == 0.0 for r in rows if r["delta1"] == 16)
    by_key = {(r["condition"], r["dtype"], r["rope"], r["delta1"]): r["value"] for r in rows}
    assert by_key["pretrained", "bf16", "cast", 0] > 100 * by_key["pretrained", "fp32", "cast", 0]
    assert by_key["pretrained", "bf16", "cast", 0] != by_key["random_init", "bf16", "cast", 0]

    provenance = stored["provenance"]
    assert provenance["checkpoint"] == str(checkpoint.resolve())
    assert provenance["n_texts"] == {"24": 2} and provenance["seq_len"] == 24
    assert provenance["first_token_is_bos"] is True
    assert {"git_hash", "evalkit_version", "machine"} <= set(provenance)

    ratio = stored["summary"]["precision_ratio"]
    assert ratio["holds"] is True
    summary = open(files["markdown"]).read()
    assert f"{ratio['ratio']:.3g}" in summary
    assert "D in BF16 ≫ D in FP32): **holds**" in summary
    assert "pretrained / random-init D" in summary
    assert open(files["png"], "rb").read(4) == b"\x89PNG"
    assert "<svg" in open(files["svg"]).read()
    assert any("text 2/2" in m for m in messages)


def test_tokens_rows_break_the_total_down_per_column(checkpoint, tmp_path):
    result = run_probe("tokens", checkpoint, tmp_path, seq_len=20, n_texts=1, dtypes="bf16")
    rows = result["rows"]
    columns = sorted((r for r in rows if r["metric"] == "attn_diff_column"), key=lambda r: r["column"])
    (total,) = [r["value"] for r in rows if r["metric"] == "attn_diff"]
    (share,) = [r["value"] for r in rows if r["metric"] == "first_token_share"]
    assert [r["column"] for r in columns] == list(range(1, 21))
    assert sum(r["value"] for r in columns) == pytest.approx(total, rel=1e-9)
    assert share == pytest.approx(columns[0]["value"] / total)
    assert "first-token share of D" in open(result["files"]["markdown"]).read()


def test_length_measures_each_length_and_reports_the_growth(checkpoint, tmp_path):
    result = run_probe("length", checkpoint, tmp_path, lengths="8,16,32", n_texts=1, dtypes="bf16")
    assert [r["length"] for r in result["rows"]] == [8, 16, 32]
    assert all(r["metric"] == "logit_diff_first" and r["value"] > 0 for r in result["rows"])
    growth = result["summary"]["logit_growth"]
    assert growth["shortest"] == 8 and growth["longest"] == 32
    assert "D_logit growth, 8 → 32 tokens" in open(result["files"]["markdown"]).read()


def test_default_length_is_capped_at_the_model_window(checkpoint, tmp_path):
    result = run_probe("shift", checkpoint, tmp_path, n_texts=1, delta1="0", dtypes="fp32")
    assert result["provenance"]["seq_len"] == 128
    assert any("model's window" in note for note in result["notes"])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"delta1": "0,-2"}, "non-negative"),
        ({"delta2": -1}, "non-negative"),
        ({"seq_len": 4096}, "beyond the model's 128-token window"),
        ({"dtypes": "bf16,fp8"}, "unknown value 'fp8'"),
        ({"rope": "exact"}, "unknown value 'exact'"),
        ({"n_texts": 0}, "positive integer"),
        ({"texts": "no-such-file.txt"}, "not found"),
        ({"lengths": "64,128"}, "applies to `probe length` only"),
    ],
)
def test_bad_options_are_one_line_user_errors(checkpoint, tmp_path, options, message):
    with pytest.raises(UserError, match=message) as caught:
        run_probe("shift", checkpoint, tmp_path, **options)
    assert "\n" not in str(caught.value)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_missing_checkpoint_and_unknown_kind_are_user_errors(checkpoint, tmp_path):
    with pytest.raises(UserError, match="no checkpoint directory at"):
        run_probe("shift", tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(UserError, match="unknown probe"):
        run_probe("heads", checkpoint, tmp_path / "out")
    with pytest.raises(UserError, match="beyond the model's 128-token window"):
        run_probe("length", checkpoint, tmp_path / "out", lengths="64,256")
    with pytest.raises(UserError, match="--seq does not apply"):
        run_probe("length", checkpoint, tmp_path / "out", seq_len=64)


def test_texts_too_short_for_t_are_a_user_error(checkpoint, tmp_path):
    texts = tmp_path / "short.jsonl"
    texts.write_text(json.dumps({"text": "far too short"}) + "\n")
    with pytest.raises(UserError, match="no text in .* has 64 tokens"):
        run_probe("shift", checkpoint, tmp_path / "out", texts=texts, seq_len=64)


def test_a_checkpoint_missing_weights_is_refused(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_hidden_layers"] = 3  # the weights hold two layers
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="lacks .* weights"):
        run_probe("shift", broken, tmp_path / "out", seq_len=16, n_texts=1, delta1="0", dtypes="bf16")


def test_a_layer_type_the_probe_does_not_measure_is_refused(checkpoint, tmp_path):
    chunked = tmp_path / "chunked"
    shutil.copytree(checkpoint, chunked)
    config = json.loads((chunked / "config.json").read_text())
    config["layer_types"] = ["chunked_attention", "full_attention"]
    (chunked / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="layers of type chunked_attention") as caught:
        run_probe("shift", chunked, tmp_path / "out", seq_len=16, n_texts=1, delta1="0", dtypes="bf16")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_cli_summary_names_its_command_and_machine(checkpoint, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    args = ["probe", "length", "--ckpt", str(checkpoint), "--lengths", "8,16", "--n", "1", "--dtypes", "bf16",
            "--out", str(out)]  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "evalkit.cli", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = (out / "probe-length.md").read_text()
    assert f"Command: `evalkit probe length --ckpt {checkpoint} --lengths 8,16" in summary
    assert "Machine: cpu " in summary and "Took " in summary
    stored = json.loads((out / "probe-length.json").read_text())
    assert stored["provenance"]["command"].startswith("evalkit probe length")
