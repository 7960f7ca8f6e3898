"""Load a model onto PyTorch: a Hugging Face folder through its weights map, or a
source with weights you already hold.

    model = linnet.torch.load("path/to/SmolLM2-135M-Instruct", dtype="f32")
    logits = model.forward(ids)
"""

from __future__ import annotations

from pathlib import Path

import torch

from linnet.backends.torch.interp import TORCH_DTYPES
from linnet.backends.torch.mxfp4_experts import Mxfp4Experts
from linnet.backends.torch.quantized import allow_int8_activations
from linnet.errors import LinnetError
from linnet.quantize import packed_dtype, quantize_params, to_packed_weight
from linnet.runtime import TorchModel
from linnet.source import Source
from linnet.weights.checkpoint import is_gguf, open_checkpoint


def load(
    path: str | Path,
    *,
    dtype=None,
    device="cpu",
    numerics: str = "equivalent",
    max_positions: int | None = None,
    mode: str = "interpret",
    tensor_parallel: int | None = None,
    devices: list[str] | None = None,
    split: list[int] | None = None,
    max_device_bytes: int | str | None = None,
    entries: list[str] | None = None,
) -> TorchModel:
    """A local HF checkpoint folder (config.json + safetensors), or a `.gguf` file, as a
    Linnet model.

    dtype: "f32", "bf16", "f16" (or torch dtypes); default: the checkpoint's dtype. Or a
        packed type, "q8_0", "q4_0", "q4_k" (f32 activations): a GGUF file's matrices of
        those types stay packed as stored, an HF folder's 2-D weights are quantized on
        load; linears then run weight-only quantized (docs/torch.md).
    max_positions: KV-cache length; default the config's context, capped at 4096.
    mode: "interpret" (Core IR per call), "generated" (straight-line source),
        "compile" (generated under torch.compile) or "cudagraphs" (CUDA only).
    numerics: "equivalent" (the reference's f32 norms and softmax) or "fast"
        (fused kernels; generated and compiled modes).
    tensor_parallel: N ranks, one process each under torchrun: this rank's share of the
        model, collectives over torch.distributed (docs/parallel.md).
    devices: layers split over these devices in order (["cuda:0", "cuda:1"]; balanced by
        bytes, or `split`: layers per device); max_device_bytes: a budget per device
        ("8GiB"), the layers beyond it stream from host memory (docs/parallel.md).
    entries: only these of the source's entries are lowered and generated (a whole model
        on one device); `linnet run` and `chat` load ["decode"]: SmolLM2's other two
        entries cost about 1 s of a load.
    """
    if entries is not None and (devices, max_device_bytes, tensor_parallel) != (None, None, None):
        raise LinnetError("entries= loads a whole model on one device")
    if devices is not None or max_device_bytes is not None:
        return _load_placed(
            path, devices or [device], split, max_device_bytes, dtype=dtype,
            numerics=numerics, max_positions=max_positions, mode=mode,
            tensor_parallel=tensor_parallel,
        )  # fmt: skip
    if tensor_parallel not in (None, 1):  # 1: the whole model, no process group
        from linnet.shard.torch_tp import load_tensor_parallel

        return load_tensor_parallel(
            path, tensor_parallel, dtype=dtype, device=device, numerics=numerics,
            max_positions=max_positions, mode=mode,
        )  # fmt: skip
    return _load_whole(path, dtype, device, numerics, max_positions, mode, entries)


def _load_whole(
    path, dtype, device, numerics: str, max_positions, mode: str, entries=None
) -> TorchModel:
    """The whole model on one device (packed dtypes and MXFP4 experts kept packed)."""
    quant = packed_dtype(dtype)
    if quant is not None:
        dtype = "f32"
    ck = open_checkpoint(
        path, dtype=dtype, max_positions=max_positions, packed=bool(quant), mxfp4=True
    )
    source, config, hf_config = ck.source, ck.config, ck.hf_config
    # MXFP4 experts (GPT-OSS) stay packed: the moe op reads the chosen ones' blocks
    params = ck.torch_params(device, packed=to_packed_weight, mxfp4=Mxfp4Experts.build)
    if quant is not None and not is_gguf(path):
        params = quantize_params(params, quant)
    allow_int8_activations(params, numerics)
    model = TorchModel(
        source, config, params, device=device, numerics=numerics, mode=mode,
        hf_config=hf_config, entries=entries,
    )  # fmt: skip
    model.folder = Path(path) if Path(path).is_dir() else None  # companions (Whisper's rules)
    if ck.gguf_metadata is not None:  # a GGUF re-export keeps the file's key/values
        model.gguf_metadata, model.origin = ck.gguf_metadata, ck.origin
    return model


def _load_placed(path, devices, split, budget, *, tensor_parallel, dtype, **options):
    """A model placed over `devices` and a budget (linnet/shard/placed.py)."""
    from linnet.shard.placement import PlacementError, parse_bytes

    if tensor_parallel not in (None, 1) or packed_dtype(dtype) is not None:
        raise PlacementError(
            "devices= and max_device_bytes= take neither tensor_parallel nor a packed dtype: "
            "the placement pass moves and streams dense params only (packed weights are not "
            "moved yet) and does not split layers within a tensor-parallel rank"
        )
    ck = open_checkpoint(path, dtype=dtype, max_positions=options.pop("max_positions"))
    placement = dict(
        devices=list(devices), split=split,
        max_device_bytes=None if budget is None else parse_bytes(budget),
    )  # fmt: skip
    params = ck.torch_params("cpu", packed=to_packed_weight)  # placed from host memory
    model = TorchModel(
        ck.source, ck.config, params, device=devices[0], hf_config=ck.hf_config,
        placement=placement, **options,
    )  # fmt: skip
    model.folder = Path(path) if Path(path).is_dir() else None
    return model


def load_source(
    source_path: str | Path,
    config: dict,
    weights: dict[str, torch.Tensor],
    *,
    device="cpu",
    numerics: str = "equivalent",
    mode: str = "interpret",
) -> TorchModel:
    """A source outside the zoo with a config and params named as the source names them."""
    source = Source.load(source_path)
    config = source.config(config)
    layout = source.check_weights(config, weights, str(source_path))
    params = {}
    for name, t in layout.shapes.items():
        params[name] = weights[name].to(device=device, dtype=TORCH_DTYPES[t.dtype])
    for name, target in layout.tied.items():
        params[name] = params[target]
    return TorchModel(source, config, params, device=device, numerics=numerics, mode=mode)
