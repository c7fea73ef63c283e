"""A GGUF file's metadata and tensor table, parsed straight from the memory-mapped bytes.

gguf-py's GGUFReader builds a numpy view for every part of every field: SmolLM2-135M's
49,152 tokens and 48,900 merges make 1.2 million memmap slices, 4.0 s of CPU of the 9.4 s a
generate engine takes to load (2-core AMX Xeon). Here a string array is read with one
struct call per string and a numeric array with one np.frombuffer: 0.1 s. What comes out is
what GGUFReader's `field.contents()` gives (tests/unit/engine/test_gguf_reader.py checks
both on the real file), and each tensor's data is the same read-only view of the map:
unquantized types as their numpy dtype in row-major shape, quantized ones as bytes, a row
of blocks per row (gguf.quants.dequantize's input).

The layout (llama.cpp's docs/gguf.md): magic "GGUF", version (uint32, 2 or 3), tensor
count and key-value count (uint64); the key-values (a string key, a uint32 value type, the
value); the tensor infos (name, dims, type, offset from the data section); then the data,
aligned to `general.alignment` (32 by default). All little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# value type -> (struct format, numpy dtype) of the scalar types
SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
           4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
           10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
# ggml types stored as plain numbers (the rest are quantized blocks)
PLAIN_TYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: int          # ggml type (gguf.GGMLQuantizationType's value)
    shape: tuple[int, ...]    # as GGUF stores dims: innermost first
    data: np.ndarray          # read-only view of the file's bytes (see the module's doc)


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict            # key -> value: str, int, float, bool, or a list of them
    tensors: list[GGUFTensor]


def read_gguf_file(path: str | Path) -> GGUFFile:
    # a plain ndarray over the map: numpy's memmap subclass costs a Python call per slice,
    # and dequantizing slices each tensor into thousands of row groups
    data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    buffer = memoryview(data)
    if bytes(buffer[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (its first bytes are not {MAGIC!r})")
    version, num_tensors, num_fields = struct.unpack_from("<IQQ", buffer, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    cursor = _Cursor(buffer, 24)
    metadata = {}
    for _ in range(num_fields):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("<I"))
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = tuple(cursor.scalar("<Q") for _ in range(cursor.scalar("<I")))
        infos.append((name, dims, cursor.scalar("<I"), cursor.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.offset // alignment) * alignment
    return GGUFFile(metadata, [_tensor(data, start, *info) for info in infos])


def _tensor(data: np.ndarray, start: int, name: str, dims: tuple[int, ...], tensor_type: int,
            offset: int) -> GGUFTensor:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType   # the block sizes of the quantized types

    shape = tuple(reversed(dims))                              # row-major, as numpy wants
    num_elements = int(np.prod(dims))
    dtype = PLAIN_TYPES.get(tensor_type)
    if dtype is not None:
        num_bytes = num_elements * np.dtype(dtype).itemsize
        view = data[start + offset:start + offset + num_bytes].view(dtype).reshape(shape)
    else:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor_type)]
        num_bytes = num_elements // block_size * type_size
        view = data[start + offset:start + offset + num_bytes].reshape(*shape[:-1], shape[-1] // block_size * type_size)
    if view.nbytes != num_bytes:
        raise ValueError(f"GGUF tensor {name!r} runs past the end of the file")
    return GGUFTensor(name, tensor_type, dims, view)


class _Cursor:
    def __init__(self, buffer: memoryview, offset: int):
        self.buffer, self.offset = buffer, offset

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        text = str(self.buffer[self.offset:self.offset + length], "utf-8")
        self.offset += length
        return text

    def value(self, value_type: int):
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type == STRING:
                return [self.string() for _ in range(count)]
            if item_type == ARRAY:
                return [self.value(ARRAY) for _ in range(count)]
            fmt, dtype = SCALARS[item_type]
            items = np.frombuffer(self.buffer, dtype=np.dtype(dtype).newbyteorder("<"), count=count,
                                  offset=self.offset)
            self.offset += items.nbytes
            return items.tolist()
        if value_type not in SCALARS:
            raise ValueError(f"GGUF value type {value_type} is not one this reader knows")
        return self.scalar(SCALARS[value_type][0])
