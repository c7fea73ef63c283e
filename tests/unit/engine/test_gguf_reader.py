"""Barge's GGUF reader (engine/loader/gguf_reader.py) against gguf-py's GGUFReader on the
real SmolLM2-135M-Instruct file and on a file gguf-py writes with every value type: the
same metadata, the same tensors, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loader.gguf_reader import read_gguf_file

gguf = pytest.importorskip("gguf")


def assert_same_as_gguf_py(path, flattened: tuple[str, ...] = ()) -> None:
    """`flattened`: array-of-array keys, which GGUFReader's contents() gives flat."""
    reference = gguf.GGUFReader(str(path))
    mine = read_gguf_file(path)
    expected = {name: field.contents() for name, field in reference.fields.items() if not name.startswith("GGUF.")}
    assert mine.metadata.keys() == expected.keys()
    for key, value in expected.items():
        if key in flattened:
            assert [item for items in mine.metadata[key] for item in items] == value, key
            continue
        assert mine.metadata[key] == value, key
        assert type(mine.metadata[key]) is type(value), key
    assert [t.name for t in mine.tensors] == [t.name for t in reference.tensors]
    for tensor, expected_tensor in zip(mine.tensors, reference.tensors):
        assert tensor.tensor_type == int(expected_tensor.tensor_type), tensor.name
        assert tensor.shape == tuple(expected_tensor.shape.tolist()), tensor.name
        assert tensor.data.dtype == expected_tensor.data.dtype and tensor.data.shape == expected_tensor.data.shape
        assert np.array_equal(tensor.data, expected_tensor.data), tensor.name


def test_the_smollm2_file_reads_as_gguf_py_reads_it():
    from tests.support.smollm2 import gguf_path, require
    require()
    assert_same_as_gguf_py(gguf_path())


def test_every_value_type_and_plain_and_quantized_tensors(tmp_path):
    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 1e-5)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo, wörld")
    writer.add_array("t.strings", ["a", "", "ünïcode", "<|im_start|>"])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, 1.25])
    writer.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    writer.add_tensor("plain.f32", rng.standard_normal((3, 64), dtype=np.float32))
    writer.add_tensor("plain.f16", rng.standard_normal((2, 32)).astype(np.float16))
    blocks = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("quant.q8_0", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_gguf_py(path, flattened=("t.nested",))
    assert read_gguf_file(path).metadata["t.nested"] == [[1, 2], [3]]     # as written
    quantized = read_gguf_file(path).tensors[2]
    assert gguf.quants.dequantize(quantized.data, gguf.GGMLQuantizationType.Q8_0).shape == (4, 64)


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ValueError, match="model.gguf is not a GGUF file"):
        read_gguf_file(path)
