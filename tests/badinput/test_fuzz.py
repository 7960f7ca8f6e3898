"""Fuzzing the two binary parsers that read a user's bytes first: the safetensors header
(`parse_header`) and the GGUF header (`check_gguf_header`, then the gguf package's reader
behind `GgufCheckpoint`). Whatever the bytes, the only outcomes are a parsed header or a
CheckpointError naming the file; an accepted safetensors header keeps the format's
invariants. Hypothesis runs a bounded number of examples per test (a few seconds in CI);
crashes it has found stay below as `@example` regression cases.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from linnet.errors import CheckpointError
from linnet.weights.gguf_checkpoint import GgufCheckpoint
from linnet.weights.gguf_header import check_gguf_header
from linnet.weights.safetensors_io import DTYPE_BITS, parse_header
from tests.badinput import formats as F

BOUNDED = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FILE = Path("fuzz.safetensors")

# -- safetensors --------------------------------------------------------------------------

dims = st.lists(st.integers(min_value=-2, max_value=6), max_size=3)
entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([*DTYPE_BITS, "X99", 7]),
        "shape": dims,
        "data_offsets": st.lists(st.integers(min_value=-1, max_value=200), min_size=1, max_size=3),
    }
)
headers = st.dictionaries(st.sampled_from(["a", "b", "c", "__metadata__"]), entries, max_size=4)


def accepted(raw: bytes, data: int):
    """parse_header on `raw` with `data` bytes after it: the infos, or None if refused."""
    try:
        return parse_header(FILE, raw, 8 + len(raw), 8 + len(raw) + data)
    except CheckpointError as err:
        assert str(FILE) in str(err)
        return None


@BOUNDED
@given(header=headers, data=st.integers(min_value=0, max_value=200))
def test_safetensors_headers_parse_or_are_refused(header, data):
    raw = json.dumps(header).encode()
    infos = accepted(raw, data)
    if infos is None:
        return
    # accepted: the ranges tile the data exactly and each holds its dtype and shape
    spans = sorted(info.offsets for info in infos.values())
    start = 8 + len(raw)
    ends = [start] + [b for _, b in spans]
    assert [a for a, _ in spans] == ends[:-1]  # each starts where the one before ends
    assert ends[-1] == start + data  # and the last ends with the file
    for info in infos.values():
        count = 1
        for d in info.shape:
            count *= d
        assert count * DTYPE_BITS[info.dtype] == 8 * (info.offsets[1] - info.offsets[0])


@BOUNDED
@given(raw=st.binary(max_size=300), data=st.integers(min_value=0, max_value=64))
@example(raw=b"[" * 5000 + b"]" * 5000, data=0)
@example(raw=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', data=4)
def test_safetensors_header_bytes_parse_or_are_refused(raw, data):
    accepted(raw, data)


# -- GGUF ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeds(tiny_checkpoint, tmp_path_factory):
    """Well-formed GGUF files to mutate: the minimal one and the tiny Llama's export."""
    import linnet.gguf

    root = tmp_path_factory.mktemp("fuzz-gguf")
    llama = linnet.gguf.export(
        tiny_checkpoint("LlamaForCausalLM"), root / "llama.gguf", dtype="f32", progress=False
    )
    return Seeds({"minimal": F.minimal_gguf(), "llama": Path(llama).read_bytes()})


class Seeds(dict):
    def __repr__(self) -> str:  # hypothesis prints its arguments: not a megabyte of bytes
        return f"Seeds({', '.join(self)})"


mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "u64", "u32", "cut", "insert"]),
        st.integers(min_value=0, max_value=2**16),
        st.integers(min_value=0, max_value=2**64 - 1),
    ),
    min_size=1,
    max_size=4,
)


def mutate(blob: bytes, edits) -> bytes:
    """Byte flips, counts and lengths overwritten (u32/u64), truncation and insertion."""
    for kind, at, value in edits:
        at %= max(len(blob), 1)
        if kind == "flip" and blob:
            blob = blob[:at] + bytes([blob[at] ^ (value & 0xFF or 1)]) + blob[at + 1 :]
        elif kind == "flip":
            continue
        elif kind == "u64":
            blob = blob[:at] + struct.pack("<Q", value) + blob[at + 8 :]
        elif kind == "u32":
            blob = blob[:at] + struct.pack("<I", value & 0xFFFFFFFF) + blob[at + 4 :]
        elif kind == "cut":
            blob = blob[:at]
        else:
            blob = blob[:at] + value.to_bytes(8, "little") + blob[at:]
    return blob


def opened_or_refused(path: Path) -> None:
    """Only the header check's refusal, the reader's (wrapped) refusal or success."""
    try:
        check_gguf_header(path)
    except CheckpointError as err:
        assert str(path) in str(err)
        return
    try:
        GgufCheckpoint(path)
    except CheckpointError:
        pass


@BOUNDED
@given(seed=st.sampled_from(["minimal", "llama"]), edits=mutations)
@example(seed="minimal", edits=[("u64", 8, 2**60)])  # tensor count past the file
@example(seed="minimal", edits=[("u64", 24, 2**62)])  # a key's length past the file
def test_gguf_mutations_open_or_are_refused(seeds, tmp_path, seed, edits):
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(mutate(seeds[seed], edits))
    opened_or_refused(path)


def test_header_mutations_of_counts_are_caught_by_the_header_check(seeds, tmp_path):
    """Not fuzzing: every u64 count in the minimal file set past the file is refused by the
    header check itself, before the gguf package reads a byte."""
    blob = seeds["minimal"]
    for at in (8, 16):  # tensor count, key/value count
        path = F.write(tmp_path / f"c{at}.gguf", mutate(blob, [("u64", at, 2**60)]))
        with pytest.raises(CheckpointError, match="count"):
            check_gguf_header(path)
