"""`numerics="fast"` for ONNX exports: MatMul weights as int8 (onnxruntime's dynamic
quantization), activations quantized per call, as CTranslate2's int8 compute type does.

    model = linnet.onnx.load("whisper-onnx/", numerics="fast")

Every entry but `decode` is quantized: a decode step's logits pick each greedy token, and on
a whisper-tiny-shaped random checkpoint int8 decoder layers moved the first step's logits past
its top-2 gap (7e-4) while saving 6% of a step with the vocabulary projection kept f32 (35%
with it quantized too, and the first token changed). So the encoder side (Whisper's `encode`,
an encoder's `embed`, `forward`) runs int8 and decoding f32.

Each quantized entry's graph is first optimized by onnxruntime at the basic level and saved
(a weight read through a Transpose becomes a constant MatMul input, which the quantizer
needs), then `quantize_dynamic` makes every MatMul with a constant weight a MatMulInteger
over int8 weights with one scale per output column (`per_channel`). Attention's MatMuls (no
constant input), convolutions, norms and embedding lookups stay f32, and so does a projection
to the vocabulary (a weight `vocab` columns wide: `forward`'s logits). The quantized folder
is made once into `$LINNET_CACHE/onnx-fast/` (keyed by the export's files) and reused. The
error this costs is bounded per model by its tests (docs/speech.md for Whisper), not by the
f32 parity bounds.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

#: The settings of the quantization (part of the cache key, with `reduce_range()`).
SETTINGS = "int8 weights, per output column, MatMul with a constant weight; v1"


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
    """The int8 copy of an export folder, made once into the cache."""
    from linnet.hub import linnet_cache

    folder = Path(folder).resolve()
    out = linnet_cache() / "onnx-fast" / f"{folder.name}-{_key(folder)}"
    if (out / "linnet.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=".partial-"))
    try:
        _quantize_folder(folder, work)
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _key(folder: Path) -> str:
    key = hashlib.sha256(f"{SETTINGS}; reduce_range={reduce_range()}".encode())
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        st = f.stat()
        key.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return key.hexdigest()[:16]


def _quantize_folder(folder: Path, out: Path) -> None:
    """Every `*.onnx` quantized (weights beside it), the other files copied."""
    import json

    config = json.loads((folder / "linnet.json").read_text(encoding="utf-8"))["config"]
    for f in folder.iterdir():
        if f.suffix == ".onnx" and f.stem != "decode":
            _quantize_model(f, out / f.name, out, config.get("vocab"))
        elif f.suffix == ".onnx":
            _copy_model(f, out / f.name)
        elif f.is_file() and not f.name.endswith(".data"):
            shutil.copy2(f, out / f.name)


def _copy_model(model: Path, target: Path) -> None:
    """An entry kept f32, its weights in a file of its own (the export's is not copied)."""
    import onnx

    onnx.save(
        onnx.load(str(model)), str(target), save_as_external_data=True,
        location=target.name + ".data", size_threshold=1024,
    )  # fmt: skip


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


def _vocab_projections(model: Path, vocab: int | None) -> list[str]:
    """The MatMuls whose constant weight is `vocab` columns wide."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    widths = {t.name: t.dims[-1] for t in graph.initializer if len(t.dims) == 2}
    return [
        n.name for n in graph.node
        if n.op_type == "MatMul" and vocab is not None and widths.get(n.input[1]) == vocab
    ]  # fmt: skip
