"""The GGUF reader: a llama.cpp file as a `Weights` stream (source, config, params).

    w = weights_from_gguf("model.gguf")        # headers checked, nothing dequantized yet
    for group, arrays in w: ...                # one tensor at a time, dequantized
    print(plan_text("model.gguf"))             # `linnet plan` for a GGUF file

The file is a `GgufCheckpoint` (headers, rebuilt config.json, tensor reads), planned by the
same plan code as a safetensors folder (GGUF names): each tensor is checked against the
source's params (name, shape) before any data is read; then tensors are dequantized one at
a time with the gguf package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, and every other type it
knows), un-permuted (`WeightsMap.params_from_gguf`) and split into params. The front doors
load a GGUF file through `linnet.weights.checkpoint.open_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linnet.core.dtypes import normalize_dtype
from linnet.weights import mxfp4
from linnet.weights.gguf_checkpoint import FusedTensor, GgufCheckpoint, tensor_data, tensor_dtype
from linnet.weights.gguf_packed import KEPT_PACKED, packed_from_ggml
from linnet.weights.mxfp4 import Mxfp4Pair
from linnet.weights.stream import Weights, full_config, ordered
from linnet.weights.tensor_group import TensorGroup


def weights_from_gguf(
    path: str | Path, *, act: str | None = None, packed=False, mxfp4=False
) -> Weights:
    """A GGUF file as a `Weights` stream (source config from its metadata). packed: q8_0,
    q4_0 and q4_K matrices come as `PackedArrays` (not dequantized); mxfp4: MXFP4 experts
    (GPT-OSS) as `Mxfp4Pair`s in HF's layout (not dequantized)."""
    from linnet.weights.planning import source_for

    ck = GgufCheckpoint(path)
    weights_map = ck.weights_map
    act = normalize_dtype(act) if act is not None else "f32"
    hf_config = ck.read_config()
    source = source_for(weights_map)
    config = full_config(source, weights_map, hf_config, act)
    groups = _groups(ck, source, config)

    def read(g: TensorGroup) -> list:
        pair = mxfp4_pair(g.key, weights_map.gguf) if mxfp4 and len(g.params) == 1 else None
        if pair is not None:
            return [pair]
        p = packed_tensor(g.key) if packed and g.rule.split_axis in (None, 0) else None
        if p is not None:  # row transforms and row splits apply to each part alike
            per_part = [
                weights_map.params_from_gguf(g.rule, g.bindings, a, config, g.sizes)
                for a in p.parts()
            ]
            return [p.with_parts(*parts) for parts in zip(*per_part, strict=True)]
        x = tensor_data(g.key)
        return weights_map.params_from_gguf(g.rule, g.bindings, x, config, g.sizes)

    return Weights(
        weights_map=weights_map,
        source=source,
        config=config,
        hf_config=hf_config,
        dtype=ck.stored_dtype,
        groups=ordered(weights_map, groups),
        reader=read,
        gguf_metadata=ck.fields,
        origin=str(ck.path),
        gguf_mxfp4={g.hf: g.key for g in groups if g.key.tensor_type.name == "MXFP4"},
    )


def packed_tensor(t):
    """A GGUF matrix of a packed type (q8_0, q4_0, q4_K, q5_0) unpacked, else None."""
    kind = t.tensor_type.name.lower()
    if kind not in KEPT_PACKED or len(t.shape) != 2 or isinstance(t, FusedTensor):
        return None
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return packed_from_ggml(np.asarray(t.data).reshape(-1), kind, shape)


def mxfp4_pair(t, spec) -> Mxfp4Pair | None:
    """An MXFP4 tensor (or fused parts) whose only transform is `transpose` as the packed
    pair of the transposed (source) tensor, else None. ggml's rows are HF's block rows
    (`[E, out, in]`), so the transpose is the packed layout itself; fused parts (gate,
    up) interleave by whole rows."""
    if t.tensor_type.name != "MXFP4" or [x.kind for x in spec.transforms_for(t.name)] != [
        "transpose"
    ]:
        return None
    parts = t.parts if isinstance(t, FusedTensor) else [t]
    pairs = []
    for part in parts:
        shape = tuple(int(d) for d in reversed(part.shape.tolist()))
        blocks, scales = mxfp4.from_ggml(np.asarray(part.data), shape[-1])
        groups = shape[-1] // mxfp4.BLOCK
        pairs.append((blocks.reshape(*shape[:-1], groups, 16), scales.reshape(*shape[:-1], groups)))
    if isinstance(t, FusedTensor):
        blocks, scales = (t.how.join([p[k] for p in pairs]) for k in (0, 1))
    else:
        blocks, scales = pairs[0]
    return Mxfp4Pair(np.ascontiguousarray(blocks), np.ascontiguousarray(scales))


def _groups(ck: GgufCheckpoint, source, config: dict) -> list[TensorGroup]:
    """The file's tensors planned against the source's params (every problem raised
    first), as the groups of a stream."""
    from linnet.weights.plan import make_plan
    from linnet.weights.plan_checks import GGUF_NAMES
    from linnet.weights.planning import bounded_layout

    spec = ck.weights_map.gguf
    origins = {k.field: f"{ck.path}: {spec.key(pattern)}" for pattern, k in spec.metadata.items()}
    layout = bounded_layout(source, config, ck, ck.weights_map, origins)
    shapes = {n: tuple(d.value for d in t.shape) for n, t in layout.shapes.items()}
    plan = make_plan(
        ck, ck.weights_map, shapes, layout.tied, config["act"], config={}, names=GGUF_NAMES
    )
    plan.check()
    groups = [row for row in plan.rows if row.loads]
    for g in groups:
        g.key, g.read_dtype = ck.tensors[g.hf], tensor_dtype(ck.tensors[g.hf])
        g.hf = g.rule.hf_name(g.bindings)  # writers name groups by their HF tensor
    return groups


def _undo_text(t) -> str:
    return "transpose" if t.kind == "transpose" else f"rope_unpermute({t.field})"


def plan_text(path: str | Path) -> str:
    """`linnet plan` for a GGUF file: metadata, config, and each tensor's params."""
    w = weights_from_gguf(path)
    lines = [
        f"gguf          {w.gguf_metadata.get('general.architecture')} -> "
        f"{w.weights_map.architecture}  (weights map {w.weights_map.path.name})",
        f"source        {w.weights_map.source}",
        "config        " + " ".join(f"{k}={v}" for k, v in w.config.items()),
        "",
    ]
    rows = [("GGUF tensor", "shape", "type", "transform", "params")]
    for g in w.groups:
        t = g.key
        ts = w.weights_map.gguf.transforms_for(t.name)
        steps = [_undo_text(x) for x in reversed(ts)]
        if isinstance(t, FusedTensor):  # llama.cpp's parts, interleaved back into one
            steps.insert(0, "interleave(" + " + ".join(p.name for p in t.parts) + ")")
        if g.rule.split_axis is not None:
            steps.append(f"split[{g.rule.split_axis}]")
        shape = "[" + ", ".join(str(int(d)) for d in reversed(t.shape.tolist())) + "]"
        rows.append(
            (t.name, shape, t.tensor_type.name, " → ".join(steps) or "-", ", ".join(g.params))
        )
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(wd) for c, wd in zip(r[:4], widths)) + "  " + r[4])
    lines.append("")
    lines.append(f"{len(w.groups)} tensors -> {sum(len(g.params) for g in w.groups)} params")
    return "\n".join(lines)
