"""One checkpoint interface for every front door: a safetensors folder or a GGUF file
gives a source, its config, the HF config and a lazy stream of params.

    ck = open_checkpoint("path/to/folder-or.gguf", dtype="f32", max_positions=1024)
    ck.source, ck.config, ck.hf_config
    params = ck.numpy_params()            # {name: numpy array} in config["act"] (JAX)
    params = ck.torch_params("cuda")      # {name: torch.Tensor} (PyTorch)

A folder is planned from its headers (`linnet.weights.planning.plan_checkpoint`) and read one HF
tensor at a time; a GGUF file's config is rebuilt from its metadata through the weights
map (`gguf_reader.weights_from_gguf`) and its tensors are dequantized one at a time.
Nothing here builds a model: the front doors do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from linnet.core.dtypes import DTYPES, numpy_dtype


@dataclass
class OpenCheckpoint:
    """A checked checkpoint: what a model needs, params read on demand."""

    source: Any  # linnet.source.Source
    config: dict  # the source config (act and max_positions resolved)
    hf_config: dict  # config.json, or the one rebuilt from GGUF metadata
    stream: Callable[[], Iterator[tuple[str, np.ndarray]]]  # (param, array) as stored
    origin: str = ""
    gguf_metadata: dict | None = None  # a GGUF file's key/values (for a GGUF re-export)
    torch_stream: Callable[[Any], Iterator[tuple[str, Any]]] | None = None

    def numpy_params(self) -> dict[str, np.ndarray]:
        """Every param as a numpy array of the config's dtype (bf16: ml_dtypes)."""
        target = numpy_dtype(self.config["act"])
        out = {}
        for name, x in self.stream():
            if x.dtype == np.uint16:  # bf16 bits (see linnet.weights.casting)
                x = x.view(numpy_dtype("bf16"))
            out[name] = np.ascontiguousarray(x, dtype=target)
        return out

    def torch_params(
        self, device="cpu", packed: Callable | None = None, mxfp4: Callable | None = None
    ) -> dict[str, Any]:
        """Every param as a torch tensor of the config's dtype on `device`; a GGUF file
        opened `packed=True` gives its packed matrices to `packed(arrays, dtype, device)`,
        a folder its MXFP4 pairs to `mxfp4(blocks, scales, dtype)` (Plan.load)."""
        import torch

        from linnet.weights.gguf_packed import PackedArrays
        from linnet.weights.mxfp4 import Mxfp4Pair

        torch_dtype = getattr(torch, DTYPES[self.config["act"]].torch)
        if self.torch_stream is not None:
            return {n: t.to(device) for n, t in self.torch_stream(torch_dtype, mxfp4)}
        from linnet.weights.casting import to_torch

        def convert(x):
            if isinstance(x, PackedArrays):
                return packed(x, torch_dtype, device)
            if isinstance(x, Mxfp4Pair):
                blocks, scales = torch.from_numpy(x.blocks), torch.from_numpy(x.scales)
                return mxfp4(blocks.to(device), scales.to(device), torch_dtype)
            return to_torch(x, torch_dtype).to(device)

        return {n: convert(x) for n, x in self.stream()}


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def open_checkpoint(
    path: str | Path, *, dtype=None, max_positions: int | None = None, packed=False, mxfp4=False
) -> OpenCheckpoint:
    """A local HF checkpoint folder or `.gguf` file, checked before any tensor is read.
    dtype: the params' dtype (default: a folder's stored dtype; f32 for GGUF);
    max_positions: the KV-cache length (default: the context, capped);
    packed: a GGUF file's q8_0, q4_0 and q4_K matrices stream as `PackedArrays`;
    mxfp4: its MXFP4 experts as `Mxfp4Pair`s (`torch_params` hands them to `mxfp4`)."""
    if is_gguf(path):
        return _open_gguf(Path(path), dtype, max_positions, packed, mxfp4)
    from linnet.weights.planning import plan_checkpoint

    plan, source, config, hf_config = plan_checkpoint(
        path, dtype=dtype, max_positions=max_positions
    )
    plan.check()
    return OpenCheckpoint(
        source,
        config,
        hf_config,
        stream=lambda: plan.load_numpy(config["act"]),
        origin=str(path),
        torch_stream=plan.load,
    )


def _open_gguf(
    path: Path, dtype, max_positions: int | None, packed=False, mxfp4=False
) -> OpenCheckpoint:
    from linnet.weights.gguf_reader import weights_from_gguf
    from linnet.weights.planning import cache_length

    w = weights_from_gguf(path, act=dtype, packed=packed, mxfp4=mxfp4)
    overrides = w.weights_map.translate_config(w.hf_config)
    overrides["act"] = w.config["act"]
    overrides["max_positions"] = cache_length(overrides, max_positions)
    config = w.source.config(overrides)

    def stream() -> Iterator[tuple[str, np.ndarray]]:
        for g in w.groups:
            yield from zip(g.params, w.read(g), strict=True)

    return OpenCheckpoint(
        w.source, config, w.hf_config, stream, origin=w.origin, gguf_metadata=w.gguf_metadata
    )
