"""A GGUF file's header read once, every count and size it declares checked against the file
before anything else reads it: gguf's reader trusts the header (an array declared with 2^40 items
in a 130-byte file is sliced past the end, then looped over item by item without bound).
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

from evalkit.errors import UserError

# GGUF value types: fixed item sizes; STRING (8) and ARRAY (9) have a length prefix.
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
MIN_SIZES = {**FIXED_SIZES, STRING: 8, ARRAY: 12}  # the least bytes one item of each type takes
MIN_ENTRY = 8 + 4 + 1  # a metadata entry: key length, value type, the smallest value
MIN_TENSOR = 8 + 4 + 4 + 8  # a tensor index entry: name length, n_dims, type, offset
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays: no model file goes deeper than 2
DEFAULT_ALIGNMENT = 32
GGUF_MAGIC = b"GGUF"
HEADER_BYTES = 24  # magic, version, tensor count, metadata count


class _Corrupt(Exception):
    """What the header declares that does not fit the file (the message of the UserError)."""


class _Cursor:
    """Reads little-endian values from a buffer, refusing any read past its end."""

    def __init__(self, data: memoryview):
        self.data, self.offset = data, 0

    def need(self, count: int, item_size: int, what: str) -> None:
        remaining = len(self.data) - self.offset
        if count * item_size > remaining:
            raise _Corrupt(
                f"its header declares {what} of {count:,} items ({count * item_size:,} bytes at least) "
                f"at byte {self.offset:,}, but only {remaining:,} bytes follow"
            )

    def unpack(self, fmt: str, what: str) -> tuple:
        size = struct.calcsize(fmt)
        self.need(1, size, what)
        values = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return values

    def string(self, what: str) -> bytes:
        (length,) = self.unpack("<Q", what)
        self.need(length, 1, what)
        raw = bytes(self.data[self.offset : self.offset + length])
        self.offset += length
        return raw


def read_gguf_header(path: Path) -> tuple[int, str | None]:
    """(GGUF version, the quantization its header declares, e.g. MOSTLY_Q4_1) of `path`."""
    if not path.is_file():
        raise UserError(f"{path} does not exist or is not a file; give the path of a .gguf model file")
    with open(path, "rb") as handle:
        head = handle.read(HEADER_BYTES)
        if head[:4] != GGUF_MAGIC:
            raise UserError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
        if len(head) < HEADER_BYTES:
            raise UserError(f"{path} is truncated: {len(head)} bytes, shorter than a GGUF header")
        version = int.from_bytes(head[4:8], "little")
        if version not in (2, 3):
            raise UserError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")
        try:
            from gguf import LlamaFileType
        except ImportError:
            raise UserError("reading GGUF needs the gguf package: pip install 'evalkit[gguf]'") from None
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                code = _walk(_Cursor(view))
            except _Corrupt as err:
                raise UserError(f"{path} is truncated or corrupt: {err}; download it again") from None
            finally:
                view.release()
    try:
        return version, LlamaFileType(code).name if code is not None else None
    except ValueError:  # a code this gguf version does not name
        return version, None


def _walk(cursor: _Cursor) -> int | None:
    """The file type code (general.file_type) the header declares, if any, once all of it fits."""
    cursor.offset, file_size = 8, len(cursor.data)  # past the magic and version, read by read_gguf_header
    n_tensors, n_entries = cursor.unpack("<QQ", "the tensor and metadata counts")
    cursor.need(n_entries, MIN_ENTRY, "a metadata table")
    uint32s: dict[bytes, int] = {}  # general.alignment and general.file_type are uint32s
    for _ in range(n_entries):
        key = cursor.string("a metadata key")
        (value_type,) = cursor.unpack("<I", "a metadata value type")
        value = _skip_value(cursor, value_type, key.decode("utf-8", "replace"), depth=0)
        if value is not None:  # only a uint32 is returned
            uint32s[key] = value
    alignment = uint32s.get(b"general.alignment", DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment is {alignment}, not a power of two")
    cursor.need(n_tensors, MIN_TENSOR, "a tensor index")
    tensors = [_tensor_info(cursor) for _ in range(n_tensors)]
    data_start = -(-cursor.offset // alignment) * alignment
    for name, nbytes, offset in tensors:
        end = data_start + offset + nbytes
        if end > file_size:
            raise _Corrupt(
                f"tensor {name} declares data up to byte {end:,}, past the end of the file ({file_size:,} bytes)"
            )
    return uint32s.get(b"general.file_type")


def _skip_value(cursor: _Cursor, value_type: int, key: str, depth: int) -> int | None:
    """Steps over one value (returning it when it is a uint32, for general.alignment and .file_type)."""
    if value_type in FIXED_SIZES:
        if value_type == 4:
            return cursor.unpack("<I", f"the value of {key}")[0]
        cursor.need(1, FIXED_SIZES[value_type], f"the value of {key}")
        cursor.offset += FIXED_SIZES[value_type]
    elif value_type == STRING:
        cursor.string(f"the string {key}")
    elif value_type == ARRAY:
        if depth >= MAX_NESTING:
            raise _Corrupt(f"{key} nests arrays more than {MAX_NESTING} deep")
        item_type, count = cursor.unpack("<IQ", f"the array {key}")
        if item_type not in MIN_SIZES:
            raise _Corrupt(f"the array {key} declares an unknown item type {item_type}")
        cursor.need(count, MIN_SIZES[item_type], f"the array {key}")
        if item_type in FIXED_SIZES:
            cursor.offset += count * FIXED_SIZES[item_type]
        else:  # strings or arrays: each has its own length, checked as it is read
            for _ in range(count):
                _skip_value(cursor, item_type, key, depth + 1)
    else:
        raise _Corrupt(f"{key} declares an unknown value type {value_type}")
    return None


def _tensor_info(cursor: _Cursor) -> tuple[str, int, int]:
    """(name, bytes of data, offset in the data section) of the next tensor index entry."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name = cursor.string("a tensor name").decode("utf-8", "replace")
    (n_dims,) = cursor.unpack("<I", f"the dimensions of tensor {name}")
    if n_dims > MAX_DIMS:
        raise _Corrupt(f"tensor {name} declares {n_dims:,} dimensions (at most {MAX_DIMS})")
    dims = cursor.unpack(f"<{n_dims}Q", f"the shape of tensor {name}")
    tensor_type, offset = cursor.unpack("<IQ", f"the type and offset of tensor {name}")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor_type)]
    except (ValueError, KeyError):
        raise _Corrupt(f"tensor {name} declares an unknown type {tensor_type}") from None
    return name, -(-math.prod(dims) // block) * block_bytes, offset
