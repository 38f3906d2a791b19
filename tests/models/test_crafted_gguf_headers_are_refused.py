"""`evalkit import` checks every count and size a GGUF header declares (metadata entries, arrays,
strings, tensors, their data) against the file's size before gguf reads it: a 130-byte file
declaring 2^40 items is one line, at once, and nothing is written."""

import struct
from pathlib import Path

import pytest

from tests.helpers import error_line, evalkit

STRING, ARRAY, INT32, UINT32 = 8, 9, 5, 4


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_file(path: Path, n_tensors: int, kvs: list[bytes], tail: bytes = b"", size: int = 130) -> Path:
    """A GGUF v3 file whose header declares `n_tensors` tensors and the given key/value entries,
    followed by `tail`, padded with zeros to `size` bytes."""
    body = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs)) + b"".join(kvs) + tail
    path.write_bytes(body.ljust(size, b"\0"))
    return path


def kv(key: str, value_type: int, value: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + value


ARCH = kv("general.architecture", STRING, gguf_string("llama"))


CRAFTED = {
    # The file: an int32 array of 2^40 items in a 130-byte file.
    "array of 2^40 int32": lambda: [ARCH, kv("x.lst", ARRAY, struct.pack("<IQ", INT32, 1 << 40))],
    "array of 2^40 strings": lambda: [ARCH, kv("x.list", ARRAY, struct.pack("<IQ", STRING, 1 << 40))],
    "nested array of 2^40": lambda: [
        ARCH,
        kv("x.list", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", UINT32, 1 << 40)),
    ],
    "string of 2^50 bytes": lambda: [ARCH, kv("x.text", STRING, struct.pack("<Q", 1 << 50))],
    "key of 2^50 bytes": lambda: [ARCH, struct.pack("<Q", 1 << 50)],
    "unknown value type": lambda: [ARCH, kv("x.odd", 77, b"")],
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_gguf_header_is_refused_in_one_line(case, tmp_path):
    pytest.importorskip("gguf")
    source = gguf_file(tmp_path / "crafted.gguf", 0, CRAFTED[case]())
    line = error_line(evalkit("import", source, tmp_path / "dest", timeout=60))
    assert str(source) in line and "corrupt" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted.gguf"]


def test_a_tensor_index_past_the_end_of_the_file_is_refused(tmp_path):
    pytest.importorskip("gguf")
    # 2^40 tensors declared; and, separately, one tensor of 2^30 float32 values in 130 bytes.
    many = gguf_file(tmp_path / "many.gguf", 1 << 40, [ARCH])
    assert "corrupt" in error_line(evalkit("import", many, tmp_path / "d1", timeout=60))
    info = gguf_string("w") + struct.pack("<IQQ", 2, 1 << 15, 1 << 15) + struct.pack("<IQ", 0, 0)
    huge = gguf_file(tmp_path / "huge.gguf", 1, [ARCH], tail=info, size=256)
    line = error_line(evalkit("import", huge, tmp_path / "d2", timeout=60))
    assert "corrupt" in line and "tensor" in line, line
