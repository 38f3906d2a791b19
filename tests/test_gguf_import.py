"""`evalkit import` refuses what it cannot import with one line, and writes nothing then.

The success path needs a real GGUF model: tests/real/test_real_import.py. These cases need only
the gguf package (a dev dependency), which writes the small GGUF files used here.
"""

import json
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'evalkit[gguf]')")


def evalkit_import(*args):
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", "import", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and all(f in lines[-1] for f in fragments), lines


def write_gguf(path, architecture: str) -> None:
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_file_that_is_not_gguf(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"PK\x03\x04 a zip archive, not a model")
    assert_one_line_error(evalkit_import(source, tmp_path / "dest"), "is not a GGUF file")
    assert not (tmp_path / "dest").exists()


def test_a_missing_file(tmp_path):
    assert_one_line_error(evalkit_import(tmp_path / "none.gguf", tmp_path / "dest"), "does not exist")


def test_a_truncated_file(tmp_path):
    whole = tmp_path / "whole.gguf"
    write_gguf(whole, "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-40])
    assert_one_line_error(evalkit_import(cut, tmp_path / "dest"), "truncated or corrupt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf", "whole.gguf"]


def test_an_architecture_transformers_cannot_dequantize(tmp_path):
    source = tmp_path / "odd.gguf"
    write_gguf(source, "mamba2000")
    assert_one_line_error(evalkit_import(source, tmp_path / "dest"), "mamba2000", "not supported")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]  # no DEST, no temporary directory


def test_a_destination_that_is_not_an_import_is_never_replaced(tmp_path):
    source = tmp_path / "odd.gguf"
    write_gguf(source, "llama")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    assert_one_line_error(evalkit_import(source, dest), "not a checkpoint written by evalkit import")
    assert_one_line_error(evalkit_import(source, dest, "--overwrite"), "not a checkpoint written by evalkit import")
    assert (dest / "notes.txt").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert_one_line_error(evalkit_import(source, afile), "is a file")


def test_an_earlier_import_is_replaced_only_when_asked(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "meta.json").write_text('{"source": {"kind": "gguf-import"}}')
    source = tmp_path / "not.gguf"
    source.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(16))
    assert_one_line_error(evalkit_import(source, dest), "--overwrite")


@pytest.mark.parametrize("file_type", [None, 2, 3, 999])
def test_the_declared_file_type_is_what_ggufs_own_reader_reads(file_type, tmp_path):
    """meta.json's source.file_type comes from evalkit's header check, not from a second read of
    the file by gguf's reader: both must agree (999 is a code gguf does not name)."""
    import numpy as np

    from evalkit.models.gguf_header import read_gguf_header

    source = tmp_path / "typed.gguf"
    writer = gguf.GGUFWriter(str(source), "llama")
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_custom_alignment(64)  # a uint32 read beside general.file_type
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    field = gguf.GGUFReader(str(source)).fields.get("general.file_type")
    code = None if field is None else int(field.parts[field.data[0]][0])
    expected = gguf.LlamaFileType(code).name if code in {t.value for t in gguf.LlamaFileType} else None
    assert read_gguf_header(source) == (gguf.GGUF_VERSION, expected)
    assert (expected is None) == (file_type in (None, 999))


def test_a_bad_dtype(tmp_path):
    source = tmp_path / "odd.gguf"
    write_gguf(source, "llama")
    assert_one_line_error(evalkit_import(source, tmp_path / "dest", "--dtype", "int8"), "choose one of: bf16, fp32")


def test_a_non_llama_import_writes_what_save_pretrained_would(tmp_path):
    """A tiny Gemma 3 GGUF (sliding layers mixed with a global one): config.json equals what
    transformers' own save_pretrained writes for the same config (architectures included, which
    readers like vLLM need to pick the model class), and the weights are the source model's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.gguf_models import write_gemma3_gguf

    source = tmp_path / "tiny-gemma3.gguf"
    original = write_gemma3_gguf(source)
    dest = tmp_path / "imported"
    result = evalkit_import(source, dest, "--dtype", "fp32")
    assert result.returncode == 0, result.stderr
    written = json.loads((dest / "config.json").read_text())
    assert written["architectures"] == ["Gemma3ForCausalLM"]
    assert written["sliding_window"] == 8 and written["layer_types"] == original.config.layer_types

    bare = AutoConfig.from_pretrained(dest)
    bare.architectures = None  # what the GGUF reader hands over: let save_pretrained fill it in
    reference = tmp_path / "reference"
    AutoModelForCausalLM.from_config(bare).save_pretrained(reference)
    assert written == json.loads((reference / "config.json").read_text())

    weights = load_file(dest / "model.safetensors")
    expected = {k: v for k, v in original.state_dict().items() if k != "lm_head.weight"}
    assert sorted(weights) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6, msg=key)
