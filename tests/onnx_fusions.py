"""What onnxruntime's optimizer makes of an ONNX model, for tests that hold Linnet's exports to
the fusions onnxruntime finds in a reference's own torch.onnx export."""

from __future__ import annotations

import tempfile
from pathlib import Path

NCHWC = "com.microsoft.nchwc"


def optimized_graph(path: Path):
    """The graph onnxruntime runs for the model at `path` (CPU, every optimization)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3  # its warning that the file is CPU-specific
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath, load_external_data=False).graph


def sum_fused_convs(path: Path) -> int | None:
    """How many NCHWc convolutions take an Add's other operand as a fourth input (the
    "Sum" fusion: the convolution accumulates into it); None where onnxruntime made no
    NCHWc convolution at all (a CPU without those kernels)."""
    convs = [n for n in optimized_graph(path).node if n.op_type == "Conv" and n.domain == NCHWC]
    if not convs:
        return None
    return sum(len(n.input) > 3 and bool(n.input[3]) for n in convs)
