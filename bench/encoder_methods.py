"""bench/encoders.py's methods: each prepared once (load, export), then bound to inputs.

    bind, info = prepare("linnet/onnx", ckpt, work)     # raises Unsupported
    call = bind(inputs)
    output = call()                                     # numpy, the last hidden state

Linnet's PyTorch modes and its ONNX export on onnxruntime; transformers eager, under
torch.compile, and exported with torch.onnx on onnxruntime with Linnet's session options.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.encoder_models import kind_of, make_inputs


class Unsupported(Exception):
    """A method that cannot load or export the model: recorded, not fatal."""


def prepare(method: str, ckpt: Path, work: Path) -> tuple:
    """(bind, info): bind(inputs) gives a zero-argument call returning the output as
    numpy. Raises Unsupported when the method cannot load or export the model."""
    family, _, rest = method.partition("/")
    try:
        if family == "linnet" and rest == "onnx":
            return prepare_linnet_onnx(ckpt, work)
        if family == "linnet":
            mode, numerics = rest.split("/")
            return prepare_linnet_torch(ckpt, mode, numerics)
        if rest == "onnx":
            return prepare_hf_onnx(ckpt, work)
        return prepare_hf_torch(ckpt, compiled=rest == "compile")
    except Exception as e:  # whatever the loader raised, one line of it
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise Unsupported(f"{type(e).__name__}: {why}"[:300]) from e


def prepare_linnet_torch(ckpt: Path, mode: str, numerics: str) -> tuple:
    import torch

    import linnet.torch as lt

    t0 = time.perf_counter()
    model = lt.load(ckpt, dtype="f32", mode=mode, numerics=numerics)
    info = {"load_s": time.perf_counter() - t0, "entry": "forward"}

    def bind(inputs):
        args = [torch.from_numpy(v) for v in inputs.values()]
        return lambda: model.forward(*args).numpy()

    return bind, info


def prepare_linnet_onnx(ckpt: Path, work: Path) -> tuple:
    import linnet.onnx

    t0 = time.perf_counter()
    out = linnet.onnx.export(ckpt, work / "linnet-onnx", overwrite=True, progress=False)
    info = {"export_s": time.perf_counter() - t0, "entry": "forward"}
    t0 = time.perf_counter()
    model = linnet.onnx.load(out)  # CPU, onnxruntime's default threads
    info["load_s"] = time.perf_counter() - t0

    def bind(inputs):
        args = list(inputs.values())
        return lambda: model.forward(*args)

    return bind, info


def prepare_hf_torch(ckpt: Path, compiled: bool) -> tuple:
    import torch
    from transformers import AutoModel

    t0 = time.perf_counter()
    model = AutoModel.from_pretrained(ckpt, dtype=torch.float32, trust_remote_code=False).eval()
    info = {
        "load_s": time.perf_counter() - t0,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if compiled:  # the same setting as Linnet's compile mode
        model = torch.compile(model, dynamic=True)
        info["compile"] = "torch.compile(model, dynamic=True)"

    def bind(inputs):
        kwargs = {k: torch.from_numpy(v) for k, v in inputs.items()}

        def call():
            with torch.inference_mode():
                return model(**kwargs).last_hidden_state.numpy()

        return call

    return bind, info


def prepare_hf_onnx(ckpt: Path, work: Path) -> tuple:
    """transformers' model through torch.onnx.export (TorchScript exporter, batch dynamic),
    the last hidden state as the only output, run like Linnet's: default SessionOptions,
    CPUExecutionProvider."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(ckpt, dtype=torch.float32, trust_remote_code=False).eval()
    sample = make_inputs(ckpt, 2, seq_len=8)  # traced at batch 2, length 8: neither baked
    names = list(sample)
    if "attention_mask" in sample:  # padding traced too: the mask stays in the graph
        sample["attention_mask"][1, -3:] = 0
    dynamic = {0: "batch"} if kind_of(ckpt) == "image" else {0: "batch", 1: "sequence"}
    path = work / "transformers.onnx"
    t0 = time.perf_counter()
    torch.onnx.export(
        LastHidden(model, names), tuple(torch.from_numpy(v) for v in sample.values()),
        str(path), dynamo=False, input_names=names, output_names=["last_hidden_state"],
        opset_version=17, dynamic_axes={n: dynamic for n in names + ["last_hidden_state"]},
    )  # fmt: skip
    info = {
        "export_s": time.perf_counter() - t0,
        "exporter": "torchscript",
        "opset": 17,
        "attn_implementation": model.config._attn_implementation,
    }
    t0 = time.perf_counter()
    session = ort.InferenceSession(
        str(path), ort.SessionOptions(), providers=["CPUExecutionProvider"]
    )
    info["load_s"] = time.perf_counter() - t0

    def bind(inputs):
        feeds = dict(inputs)
        return lambda: session.run(None, feeds)[0]

    return bind, info


class LastHidden:
    """A module calling the HF model with named inputs and returning the last hidden
    state alone (so the export carries no pooler)."""

    def __new__(cls, model, names):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(**dict(zip(names, args))).last_hidden_state

        return Wrapper()
