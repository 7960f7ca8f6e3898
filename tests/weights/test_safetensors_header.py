"""Safetensors headers are checked as the format requires before any data is read:
unique names, byte ranges that tile the data without overlap, gap or tail, and no JSON
nested deep enough to overflow the parser. Files are written byte by byte here."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from linnet.cli import main
from linnet.errors import CheckpointError
from linnet.weights.safetensors_io import read_header


def write(path, header_text: str, data: bytes) -> None:
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def tensors(*ranges) -> str:
    """A header of F32 tensors t0, t1, ... of 2 values each, at the given byte ranges."""
    entry = {"dtype": "F32", "shape": [2]}
    return json.dumps({f"t{i}": {**entry, "data_offsets": list(r)} for i, r in enumerate(ranges)})


def test_a_file_the_safetensors_library_writes_passes(tmp_path):
    save_file({"a": np.ones(3, np.float32), "b": np.zeros((2, 2), np.float32)}, tmp_path / "x")
    assert sorted(read_header(tmp_path / "x")) == ["a", "b"]


@pytest.mark.parametrize(
    "ranges, size, why, tensor",
    [
        (((0, 8), (4, 12)), 12, "overlaps the tensor before it", "t1"),
        (((0, 8), (12, 20)), 20, "leaves a gap", "t1"),
        (((0, 8), (0, 8)), 8, "overlaps the tensor before it", "t1"),
        (((0, 8),), 12, "data ends at byte", None),
    ],
    ids=["overlap", "gap", "same-bytes", "tail"],
)
def test_ranges_must_tile_the_data(tmp_path, ranges, size, why, tensor):
    write(tmp_path / "x", tensors(*ranges), bytes(size))
    with pytest.raises(CheckpointError, match=why) as e:
        read_header(tmp_path / "x")
    assert e.value.tensor == tensor and e.value.file == str(tmp_path / "x")


def test_a_name_listed_twice_is_refused(tmp_path):
    entry = '{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    write(tmp_path / "x", f'{{"w": {entry}, "w": {entry}}}', bytes(8))
    with pytest.raises(CheckpointError, match="'w' listed twice"):
        read_header(tmp_path / "x")


def test_deeply_nested_json_is_an_error_not_a_recursion_crash(tmp_path):
    depth = 200_000
    write(tmp_path / "x", '{"__metadata__": ' + "[" * depth + "]" * depth + "}", b"")
    with pytest.raises(CheckpointError, match="nested too deeply"):
        read_header(tmp_path / "x")


def test_plan_names_the_file_and_exits_1(tiny_checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    shard = folder / "model.safetensors"
    header = json.loads(shard.read_bytes()[8 : 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]])
    names = [k for k in header if k != "__metadata__"]
    header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]  # two views of one range
    data = shard.read_bytes()[8 + struct.unpack("<Q", shard.read_bytes()[:8])[0] :]
    write(shard, json.dumps(header), data)
    done = CliRunner().invoke(main, ["plan", str(folder)])
    assert done.exit_code == 1, done.output
    assert "model.safetensors" in done.output and "Traceback" not in done.output
