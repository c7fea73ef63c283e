"""Read a CTranslate2 `model.bin` (binary version 6, as faster-whisper ships Whisper).

Layout, all little-endian:

    u32 version | str spec name | u32 revision | u32 num_variables
    num_variables × ( str name | u8 rank | u32 dims[rank] | u8 dtype | u32 num_bytes | bytes )
    u32 num_aliases × ( str alias | str target )

where `str` is a u16 length (including a trailing NUL) and the UTF-8 bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

SUPPORTED_VERSIONS = (5, 6)
# CTranslate2's DataType enum; int8 and int16 here are scalar flags, not quantized weights.
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class _Reader:
    def __init__(self, data: memoryview, path: Path):
        self.data, self.offset, self.path = data, 0, path

    def take(self, num_bytes: int) -> memoryview:
        if self.offset + num_bytes > len(self.data):
            raise ValueError(f"{self.path} is truncated at byte {self.offset} (wanted {num_bytes} more)")
        chunk = self.data[self.offset:self.offset + num_bytes]
        self.offset += num_bytes
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.unpack("H"))).rstrip(b"\0").decode("utf-8")


def read_ct2(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}); aliases resolve to their target's array.
    Arrays of 16-bit floats stay float16 (bfloat16 is widened to float32)."""
    path = Path(path)
    data = memoryview(path.read_bytes())
    reader = _Reader(data, path)
    version = reader.unpack("I")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is not one of {SUPPORTED_VERSIONS}")
    spec_name = reader.string()
    reader.unpack("I")     # spec revision: the variable names below are what we check
    variables = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = [reader.unpack("I") for _ in range(reader.unpack("B"))]
        dtype_id = reader.unpack("B")
        raw = reader.take(reader.unpack("I"))
        variables[name] = _to_array(raw, dtype_id, shape, name, path)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    return spec_name, variables


def _to_array(raw: memoryview, dtype_id: int, shape: list[int], name: str, path: Path) -> np.ndarray:
    if dtype_id not in DTYPES:
        raise ValueError(f"{path}: variable {name!r} has unknown dtype id {dtype_id}")
    if DTYPES[dtype_id] == "bfloat16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=DTYPES[dtype_id]).reshape(shape)
