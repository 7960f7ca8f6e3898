"""`numerics="fast"` for ONNX exports: MatMul weights as int8 (onnxruntime's dynamic
quantization), activations quantized per call, as CTranslate2's int8 compute type does.

    model = linnet.onnx.load("whisper-onnx/", numerics="fast")

Every entry but `decode` is quantized: a decode step's logits pick each greedy token, and on
a whisper-tiny-shaped random checkpoint int8 decoder layers moved the first step's logits past
its top-2 gap (7e-4) while saving 6% of a step with the vocabulary projection kept f32. So the
encoder side (Whisper's `encode`, an encoder's `embed`, `forward`) runs int8 and decoding's
layers f32. An encoder-decoder's `decode` projects to the vocabulary in int8 and also outputs
its final hidden state, from which linnet/onnx_vocab.py recomputes in f32 every token the
int8 error bound lets win: greedy tokens stay f32's, and `decode` itself still returns whole
f32 rows (from the hidden state).

Each quantized entry's graph is first optimized by onnxruntime at the basic level and saved
(a weight read through a Transpose becomes a constant MatMul input, which the quantizer
needs), then `quantize_dynamic` makes every MatMul with a constant weight a MatMulInteger
over int8 weights with one scale per output column (`per_channel`). Attention's MatMuls (no
constant input), convolutions, norms and embedding lookups stay f32, and so does a projection
to the vocabulary (a weight `vocab` columns wide: `forward`'s logits). The quantized folder
is made once into `$LINNET_CACHE/onnx-fast/` (keyed by the export's files) and reused; its
f32 weights (all of `decode`'s but the int8 projection's) are read from the export's weights
file through a hard link (a copy only where the two folders are on different file systems). The
cache is pruned each time
a folder is made: entries of the same export made from older files, of an export that is gone,
from before this layout, and past the `KEEP` most recently used; none used in the last
`GRACE_S` seconds (another process may be loading it). The error this costs is bounded per
model by its tests (docs/speech.md for Whisper), not by the f32 parity bounds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

#: The settings of the quantization (part of the cache key, with `reduce_range()`).
SETTINGS = "int8 weights, per output column, MatMul with a constant weight; int8 vocab; v3"
#: Cache entries kept (the most recently used), and how recent a use spares any entry.
KEEP, GRACE_S = 4, 600.0
#: Each entry's record of the export it was made from (absent: made before v2).
SOURCE = ".linnet-fast-source"


def reduce_range() -> bool:
    """7-bit weights on x86 CPUs without VNNI: there onnxruntime's int8 kernel multiplies
    u8 activations by s8 weights in pairs summed into saturating int16 (AVX2's vpmaddubsw),
    and full-range weights overflow it (whisper-tiny's encoder came out 12% off on an
    AVX2-only EPYC); VNNI sums in int32 and keeps all 8 bits."""
    from linnet.core.machine import cpu_flags

    flags = cpu_flags()
    x86 = any(f.startswith("avx") for f in flags)
    return x86 and not any(f in ("avx512_vnni", "avx_vnni", "avx512vnni") for f in flags)


def fast_folder(folder: Path) -> Path:
    """The int8 copy of an export folder, made once into the cache (which is then pruned)."""
    from linnet.hub import linnet_cache

    folder = Path(folder).resolve()
    out = linnet_cache() / "onnx-fast" / f"{folder.name}-{_key(folder)}"
    if (out / "linnet.json").is_file():
        (out / SOURCE).touch()  # its last use, for pruning
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=".partial-"))
    try:
        _quantize_folder(folder, work)
        (work / SOURCE).write_text(str(folder), encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prune(out.parent, keep=out)
    return out


def prune(cache: Path, keep: Path) -> list[Path]:
    """Remove the entries no load will ask for again (see the module's doc); `keep` is the
    entry just made. Returns what it removed."""
    import time

    now, source = time.time(), (keep / SOURCE).read_text(encoding="utf-8")
    entries = sorted(
        (p for p in cache.iterdir() if p.is_dir() and p != keep),
        key=lambda p: _last_use(p), reverse=True,
    )  # fmt: skip
    gone, kept = [], 1  # `keep` is the most recent
    for entry in entries:
        if now - _last_use(entry) < GRACE_S:
            kept += 1
            continue
        record = entry / SOURCE
        made_from = record.read_text(encoding="utf-8") if record.is_file() else None
        stale = made_from is None or made_from == source or not Path(made_from).is_dir()
        if stale or kept >= KEEP:
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry)
        else:
            kept += 1
    return gone


def _last_use(entry: Path) -> float:
    record = entry / SOURCE
    return (record if record.is_file() else entry).stat().st_mtime


def _key(folder: Path) -> str:
    key = hashlib.sha256(f"{SETTINGS}; reduce_range={reduce_range()}".encode())
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        st = f.stat()
        key.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return key.hexdigest()[:16]


def _quantize_folder(folder: Path, out: Path) -> None:
    """Every `*.onnx` but `decode` quantized (weights beside it); the other files as
    exported, the weights file hard-linked; an encoder-decoder's `decode` with the int8
    vocabulary projection."""
    import json

    config = json.loads((folder / "linnet.json").read_text(encoding="utf-8"))["config"]
    quantized = [f for f in folder.iterdir() if f.suffix == ".onnx" and f.stem != "decode"]
    for f in quantized:
        _quantize_model(f, out / f.name, out, config.get("vocab"))
    for f in folder.iterdir():
        if f.is_file() and f not in quantized:
            _share(f, out / f.name)
    _int8_vocabulary(folder, out)


def _int8_vocabulary(folder: Path, out: Path) -> None:
    """An encoder-decoder's (Whisper's) `decode` with its vocabulary projection int8 and its
    greedy token f32's (linnet/onnx_vocab.py: `linnet.speech.greedy` uses it): a new
    decode.onnx beside the shared weights, and a linnet.json that says so. A decoder-only
    export's `decode` stays as exported (its `generate` reads whole f32 rows)."""
    from linnet.onnx_vocab import add_to_signature, int8_projection

    if not (folder / "decode.onnx").is_file() or not (folder / "encode.onnx").is_file():
        return
    (out / "decode.onnx").unlink()
    info = int8_projection(
        folder / "decode.onnx", out / "decode.onnx", 63 if reduce_range() else 127
    )
    if info is None:
        _share(folder / "decode.onnx", out / "decode.onnx")
        return
    (out / "linnet.json").unlink()  # a hard link to the export's: written anew
    (out / "linnet.json").write_text((folder / "linnet.json").read_text(encoding="utf-8"))
    add_to_signature(out / "linnet.json", info)


def _share(source: Path, target: Path) -> None:
    """`target` as `source`'s bytes: a hard link (no second copy of the weights), a copy
    where the file system refuses one."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _quantize_model(model: Path, target: Path, scratch: Path, vocab: int | None) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folded = scratch / f".{model.stem}.folded.onnx"
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the unused-initializer warnings of the folded graph
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(folded)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", folded.stem + ".data"
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    quantize_dynamic(
        folded, target, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
        per_channel=True, reduce_range=reduce_range(), extra_options={"MatMulConstBOnly": True},
        nodes_to_exclude=_vocab_projections(folded, vocab),
        use_external_data_format=True,  # large-v3's would pass protobuf's 2 GB
    )  # fmt: skip
    folded.unlink()
    (scratch / (folded.stem + ".data")).unlink(missing_ok=True)
    _share_unchanged(target, model)


def _share_unchanged(target: Path, export: Path) -> None:
    """Point each f32 weight the quantizer left as the export holds it (same name, shape and
    bytes: embeddings, norms, the conv stem) at the export's weights file (hard-linked beside
    `target`), and rewrite `target`'s own weights file with the rest only."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    def external(t):
        return t.data_location == onnx.TensorProto.EXTERNAL and ExternalDataInfo(t)

    model = onnx.load(str(target), load_external_data=False)
    source = {t.name: t for t in onnx.load(str(export), load_external_data=False).graph.initializer}
    own = target.with_name(target.name + ".data")
    fresh = own.with_name(own.name + ".tmp")
    with own.open("rb") as old, fresh.open("wb") as new:
        for t in model.graph.initializer:
            if not (info := external(t)):
                continue
            old.seek(info.offset or 0)
            data = old.read(info.length)
            o = source.get(t.name)
            if (
                o is not None
                and (list(o.dims), o.data_type) == (list(t.dims), t.data_type)
                and external(o)
            ):
                there = ExternalDataInfo(o)
                with (export.parent / there.location).open("rb") as f:
                    f.seek(there.offset or 0)
                    if f.read(there.length) == data:
                        del t.external_data[:]
                        t.external_data.extend(o.external_data)
                        continue
            _set_external(t, own.name, new.tell(), len(data))
            new.write(data)
    fresh.replace(own)
    onnx.save(model, str(target))


def _set_external(tensor, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


def _vocab_projections(model: Path, vocab: int | None) -> list[str]:
    """The MatMuls whose constant weight is `vocab` columns wide."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    widths = {t.name: t.dims[-1] for t in graph.initializer if len(t.dims) == 2}
    return [
        n.name for n in graph.node
        if n.op_type == "MatMul" and vocab is not None and widths.get(n.input[1]) == vocab
    ]  # fmt: skip
