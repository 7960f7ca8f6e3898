"""GGUF export with the gguf package's writer: llama.cpp's names, metadata and tokenizer.

Two passes over a `Weights` stream. The first needs shapes only: each group's GGUF name
and tensor shape (the weights map's `gguf = ...` and `[gguf]` table), its GGUF type,
the architecture's metadata (`[gguf.metadata]`), the tokenizer and chat template, and
the extra tensors computed from the config (`[gguf.extra]`). With every tensor's info
declared, `GGUFWriter` writes the header, key/values and tensor infos; then each tensor
is appended (aligned, as the infos say) block by block: read a few MB, convert, write.
A tensor the weights map leaves as it is (no transform, nothing to permute) streams from
the source file that way; others are joined and permuted first (`WeightsMap.gguf_tensor`).
The file is written under a temporary name and renamed at the end.

Types follow llama.cpp (`gguf_types`): 1-D tensors (norms, biases) stay F32; `q8_0`
quantizes 2-D tensors whose rows are whole blocks of 32 (others fall back to F16), with
the gguf package's quantizer (bit-exact with ggml's); the 4- to 6-bit types and the _M
mixes are quantized by `gguf_quants` / `gguf_kquants`, tensor by tensor as the mix says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from linnet.converters.gguf_mxfp4 import check_gpt_oss_rope, gguf_mxfp4_bytes, mxfp4_bytes
from linnet.converters.gguf_tokenizer import add_tokenizer, copy_tokenizer
from linnet.converters.gguf_types import (
    GGUF_DTYPES,
    Layout,
    file_type,
    ggml_type,
    tensor_bytes,
    tensor_kind,
)

from linnet.atomic import atomic_path
from linnet.core.dtypes import normalize_dtype
from linnet.errors import UnsupportedArchitecture
from linnet.weights.casting import blocks, cast_into, write_converted
from linnet.weights.gguf_metadata import add_metadata, extra_rule, metadata_values
from linnet.weights.maps.gguf import GgufFused
from linnet.weights.stream import Weights
from linnet.weights.tensor_group import TensorGroup

ROW_BLOCK = 1 << 22  # elements quantized per call


def bulk_writer():
    """`GGUFWriter` whose long metadata arrays (tokens, merges, token types, scores) are
    packed in bulk rather than item by item: the same bytes, without ~0.6 s of Python per
    50k-token vocabulary. Other values go through the gguf package's own packing."""
    import struct

    from gguf import GGUFEndian, GGUFValueType, GGUFWriter

    T = GGUFValueType
    numeric = {T.INT32: "<i4", T.UINT32: "<u4", T.FLOAT32: "<f4"}

    class BulkWriter(GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if (
                vtype != GGUFValueType.ARRAY
                or self.endianess != GGUFEndian.LITTLE
                or not isinstance(val, (list, tuple))
                or len(val) < 256
            ):
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            ltype = sub_type if sub_type is not None else GGUFValueType.get_type(val[0])
            if any(GGUFValueType.get_type(v) is not ltype for v in val):
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            head = (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack(
                "<IQ", ltype, len(val)
            )
            if ltype == GGUFValueType.STRING:
                items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
                return head + b"".join(struct.pack("<Q", len(e)) + e for e in items)
            if ltype in numeric:
                return head + np.asarray(val, dtype=numeric[ltype]).tobytes()
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    return BulkWriter


@dataclass
class Item:
    name: str
    shape: tuple[int, ...]  # numpy order (llama.cpp's ne reversed)
    kind: str  # f32 / f16 / bf16 / q8_0 / q4_0 ... q6_k, mxfp4 (stored MXFP4 blocks)
    group: TensorGroup | None = None
    data: np.ndarray | None = None  # extra tensors, computed up front (small)
    fused: GgufFused | None = None  # one of the tensors the group's GGUF tensor is split in
    part: int = 0

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.kind, self.shape)


def write_encoded(src, kind: str, row: int, write) -> None:
    """Write `src` (an array, or the TensorInfo of a safetensors tensor) as GGUF type
    `kind` through `write`, in blocks of whole rows of `row` elements."""
    if kind in ("f32", "f16", "bf16"):
        write_converted(src, kind, write)
        return
    if kind == "mxfp4":  # ggml's bytes already (`gguf_mxfp4`)
        write(memoryview(np.ascontiguousarray(src)).cast("B"))
        return
    from gguf import quants
    from linnet.converters.gguf_quants import quantize_rows

    rows = max(1, ROW_BLOCK // row)
    f32 = np.empty(rows * row, np.float32)
    for blk in blocks(src, rows * row):
        x = f32[: blk.size].reshape(-1, row)
        cast_into(blk, x.reshape(-1))
        if kind == "q8_0":
            q = quants.quantize(x, ggml_type(kind))
        else:
            q = quantize_rows(x, kind)
        write(memoryview(np.ascontiguousarray(q)).cast("B"))


def _group_items(weights: Weights, g: TensorGroup) -> list[Item]:
    """The GGUF tensors of group `g` (kinds not chosen yet): one, or the parts of a
    `[gguf.fused]` tensor (GPT-OSS's expert gate and up)."""
    weights_map = weights.weights_map
    name = g.rule.gguf_name(g.bindings)
    if name is None:
        raise UnsupportedArchitecture(
            f"{weights_map.path.name}: tensor {g.hf_name} has no GGUF name (gguf = ...)"
        )
    spec = weights_map.gguf
    shape = spec.shape_for(name, g.joined_shape)
    kind = "mxfp4" if g.hf_name in weights.packed or g.hf_name in weights.gguf_mxfp4 else ""
    fused = spec.fused_for(name)
    if fused is None:
        return [Item(name, shape, kind, group=g)]
    how, parts = fused
    part_shape = how.part_shape(shape)
    return [Item(p, part_shape, kind, group=g, fused=how, part=k) for k, p in enumerate(parts)]


def plan_items(weights: Weights, dtype: str) -> list[Item]:
    weights_map = weights.weights_map
    spec = weights_map.gguf
    check_gpt_oss_rope(spec.arch, weights.config)
    items = [it for g in weights.groups for it in _group_items(weights, g)]
    layout = Layout.of([it.name for it in items])
    for it in items:
        it.kind = it.kind or tensor_kind(it.name, it.shape, dtype, layout)
    for name, rule_name in spec.extra.items():
        x, _ = extra_rule(rule_name, weights_map.path.name).export(weights.config)
        if x is not None:
            items.append(Item(name, tuple(x.shape), "f32", data=x.astype(np.float32)))
    return items


def tensor_source(weights: Weights, it: Item, cache: dict):
    """What item `it` is written from: its computed data, an MXFP4 pair's stored blocks,
    the source file's tensor as it is (a rule without transforms, nothing to permute:
    joining the split params gives the HF tensor back), or the params joined and permuted
    by the weights map (a fused tensor's parts: its slices; the whole is kept in `cache`
    for the next part)."""
    if it.data is not None:
        return it.data
    g = it.group
    if it.kind == "mxfp4" and g.hf_name in weights.gguf_mxfp4:
        part = None if it.fused is None else it.part
        return gguf_mxfp4_bytes(weights.gguf_mxfp4[g.hf_name], it.shape, part)
    if it.kind == "mxfp4":
        return mxfp4_bytes(weights.packed[g.hf_name], it.shape, it.fused, it.part)
    spec = weights.weights_map.gguf
    name = g.rule.gguf_name(g.bindings)
    whole = it.fused is None and not g.rule.transforms and not spec.transforms_for(name)
    if whole and g.source is not None:
        x = g.source
    elif cache.get("group") is g:
        x = cache["x"]
    else:
        parts = weights.read(g)
        _, x = weights.weights_map.gguf_tensor(g.rule, g.bindings, parts, weights.config)
        cache.update(group=g, x=x)
    return x if it.fused is None else np.ascontiguousarray(it.fused.take(x, it.part))


def model_name(weights: Weights) -> str:
    name = weights.hf_config.get("_name_or_path") or weights.hf_config.get("_model_name_or_path")
    return str(name or Path(weights.origin).name or weights.weights_map.architecture)


def _write_metadata(writer, weights: Weights, dtype: str, file_type: int, tokenizer: bool):
    """The file's key/values: general.*, the map's [gguf.metadata] and extras, the tokenizer
    (copied from a GGUF origin, else made from tokenizer.json)."""
    import gguf

    weights_map, config = weights.weights_map, weights.config
    spec = weights_map.gguf
    writer.add_type("model")
    writer.add_name(model_name(weights))
    writer.add_file_type(file_type)
    if dtype not in ("f32", "f16", "bf16") or weights.packed:  # packed: MXFP4 experts
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_metadata(writer, metadata_values(spec, config))
    for rule_name in spec.extra.values():
        add_metadata(writer, extra_rule(rule_name, weights_map.path.name).export(config)[1])
    if tokenizer and weights.tokenizer_dir is None and weights.gguf_metadata is not None:
        copy_tokenizer(writer, Path(weights.origin))
    else:
        add_tokenizer(writer, weights.tokenizer_dir if tokenizer else None, int(config["vocab"]))


def export_gguf(
    weights: Weights,
    out_path: str | Path,
    *,
    dtype: str = "f16",
    tokenizer: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write `weights` as one GGUF file; returns its path."""
    from tqdm.auto import tqdm

    weights_map = weights.weights_map
    if weights_map.gguf is None:
        raise UnsupportedArchitecture(
            f"{weights_map.architecture}: {weights_map.path.name} has no [gguf] table "
            "(no llama.cpp names)"
        )
    dtype = normalize_dtype(dtype, GGUF_DTYPES)
    out_path = Path(out_path)
    spec = weights_map.gguf
    items = plan_items(weights, dtype)

    writer = bulk_writer()(path=None, arch=spec.arch)
    _write_metadata(writer, weights, dtype, file_type(dtype), tokenizer)
    for key, value in (extra_metadata or {}).items():
        writer.add_string(key, str(value))
    for it in items:
        writer.add_tensor_info(
            it.name, it.shape, np.dtype(np.float32), it.nbytes, raw_dtype=ggml_type(it.kind)
        )

    total = sum(it.nbytes for it in items)
    with atomic_path(out_path, overwrite=overwrite) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            fout = writer.fout[0]  # tensor data follows, each aligned as the infos say

            def write(chunk) -> None:
                fout.write(chunk)
                bar.update(len(chunk))

            cache: dict = {}
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=out_path.name, disable=not progress
            ) as bar:
                for it in items:
                    writer.write_padding(fout, fout.tell())
                    start = fout.tell()
                    src = tensor_source(weights, it, cache)
                    write_encoded(src, it.kind, it.shape[-1], write)
                    if fout.tell() - start != it.nbytes:
                        raise AssertionError(f"{it.name}: {fout.tell() - start} bytes written")
                    writer.write_padding(fout, it.nbytes)
        finally:
            writer.close()
    return out_path
