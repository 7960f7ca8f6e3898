"""ONNX export: every entry point as an ONNX model emitted from the Core IR.

The folder holds one model per entry (`forward.onnx`, `decode.onnx`), one external
data file both share (`weights.onnx.data`: each param once, 4 KiB aligned so
onnxruntime can map it), `linnet.json` (the call signature: inputs, runtime dims,
state parts, guards; what `linnet.onnx.load` needs without the source), and the
original `config.json` and tokenizer files.

Params stream group by group from a `Weights` into the data file (peak memory
near the largest tensor); the folder is built under a temporary name and renamed
at the end. Models hold no weight bytes, so they stay far below protobuf's 2 GB.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
from linnet.converters.companions import copy_tokenizer
from onnx import TensorProto

from linnet.atomic import atomic_path
from linnet.backends.onnx.emit import ONNX_DTYPES
from linnet.backends.onnx.graph import prepare, signature, to_model
from linnet.core.dtypes import normalize_dtype
from linnet.weights.casting import write_converted
from linnet.weights.planning import DEFAULT_MAX_POSITIONS
from linnet.weights.stream import Weights

DATA = "weights.onnx.data"
SIGNATURE = "linnet.json"
ALIGN = 4096
FORMAT = 1


def export_onnx(
    weights: Weights,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    max_positions: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    out_dir = Path(out_dir)
    dtype = normalize_dtype(dtype or weights.dtype)
    config = export_config(weights, dtype, max_positions)
    source = weights.source
    layout = source.params(config)
    program = source.program(config)
    entries = {e: prepare(program, e) for e in source.entries_for(config)}  # first
    with atomic_path(out_dir, is_dir=True, overwrite=overwrite) as tmp:
        initializers = write_data(weights, tmp / DATA, dtype, progress, out_dir.name)
        for name, entry in entries.items():
            model = to_model(entry, initializers, layout.tied)
            onnx.save_model(model, str(tmp / f"{name}.onnx"))
        write_signature(tmp / SIGNATURE, weights, config, dtype, entries)
        copy_side_files(weights, tmp)
    return out_dir


def export_config(weights: Weights, dtype: str, max_positions: int | None) -> dict:
    """The source config the graphs are built for: the export dtype, and a cache of
    `max_positions` rows (default: the context, capped like the loaders)."""
    config = dict(weights.config, act=dtype)
    if "max_positions" in config:
        limit = config["max_positions"]
        config["max_positions"] = max_positions or min(limit, DEFAULT_MAX_POSITIONS)
    return weights.source.config(config)


def write_data(weights: Weights, path: Path, dtype: str, progress: bool, desc: str) -> list:
    """Stream every param into one file; return initializers that point into it."""
    from tqdm import tqdm

    initializers = []
    total = weights.total_numel
    with (
        open(path, "wb") as f,
        tqdm(
            total=total,
            unit="param",
            unit_scale=True,
            desc=desc,
            disable=not progress,
            file=sys.stderr,
        ) as bar,
    ):
        for group in weights.groups:
            for name, array in zip(group.params, weights.read(group)):
                offset = _pad_to(f, ALIGN)
                write_converted(array, dtype, f.write)  # in blocks: no whole-tensor copy
                length = f.tell() - offset
                initializers.append(_external(name, array.shape, dtype, offset, length))
                bar.update(array.size)
    return initializers


def _pad_to(f, align: int) -> int:
    offset = f.tell()
    if offset % align:
        f.write(b"\0" * (align - offset % align))
    return f.tell()


def _external(name: str, shape, dtype: str, offset: int, length: int) -> TensorProto:
    t = TensorProto(name=name, data_type=ONNX_DTYPES[dtype], dims=list(shape))
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", DATA), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def write_signature(path: Path, weights: Weights, config: dict, dtype: str, entries) -> None:
    record = {
        "format": FORMAT,
        "source": weights.source.name,
        "dtype": dtype,
        "config": config,
        "architecture": (weights.hf_config.get("architectures") or [None])[0],
        "entries": {name: signature(e) | {"file": f"{name}.onnx"} for name, e in entries.items()},
    }
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def copy_side_files(weights: Weights, tmp: Path) -> None:
    """config.json (as the original says it) and the tokenizer, for the tools around."""
    (tmp / "config.json").write_text(json.dumps(weights.hf_config, indent=2) + "\n")
    folder = weights.tokenizer_dir
    if folder is None:
        return
    copy_tokenizer(folder, tmp)
