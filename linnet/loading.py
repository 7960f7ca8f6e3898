"""From a checkpoint folder to a plan, a source and a config, reading headers only.

Nothing here imports torch: `linnet plan` and the exporters' planning run without it.
"""

from __future__ import annotations

from pathlib import Path

from linnet.core.dtypes import normalize_dtype
from linnet.errors import CheckpointError
from linnet.source import Source
from linnet.weights.maps import WeightsMap, find_weights_map
from linnet.weights.plan import Plan, make_plan
from linnet.weights.safetensors_io import Checkpoint

# The cache is preallocated: cap the default so an 8B model with a 128k context
# does not reserve tens of GB. Pass max_positions= to go further.
DEFAULT_MAX_POSITIONS = 4096


def cache_length(overrides: dict, max_positions: int | None) -> int:
    """The KV-cache rows to allocate: `max_positions` if given, else the context capped."""
    limit = overrides.get("max_positions", DEFAULT_MAX_POSITIONS)
    return max_positions or min(limit, DEFAULT_MAX_POSITIONS)


def source_for(weights_map: WeightsMap) -> Source:
    from linnet.zoo import source_path

    return Source.load(source_path(weights_map.source))


def plan_checkpoint(
    path: str | Path, *, dtype=None, max_positions: int | None = None
) -> tuple[Plan, Source, dict, dict]:
    """Read config and headers only; return the plan, source, config and HF config."""
    ckpt = Checkpoint(path)
    hf_config = ckpt.read_config()
    archs = hf_config.get("architectures") or []
    if not archs:
        raise CheckpointError(
            f"{ckpt.config_path}: no `architectures` field, so no weights map can be chosen",
            file=str(ckpt.config_path),
        )
    weights_map = find_weights_map(archs[0])
    source = source_for(weights_map)
    overrides = weights_map.translate_config(hf_config)
    if dtype is not None:
        overrides["act"] = normalize_dtype(dtype)
    overrides.setdefault("act", "f32")
    if "max_positions" in source.fields:  # a source with a cache: cap its length
        overrides["max_positions"] = cache_length(overrides, max_positions)
    config = source.config(overrides)
    layout = source.params(config)
    shapes = {name: tuple(d.value for d in t.shape) for name, t in layout.shapes.items()}
    plan = make_plan(ckpt, weights_map, shapes, layout.tied, config["act"], config=config)
    return plan, source, config, hf_config


def onnx_folder_for(path: str | Path, *, max_positions: int | None = None) -> Path:
    """An ONNX export of a checkpoint folder or `.gguf` file, made once into the cache
    (`$LINNET_CACHE/onnx/`, keyed by the files' names, sizes and times) and reused."""
    import hashlib

    import linnet.onnx
    from linnet.hub import linnet_cache

    path = Path(path).expanduser().resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    key = hashlib.sha256(repr(max_positions).encode())
    for f in files:
        st = f.stat()
        key.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    out = linnet_cache() / "onnx" / f"{path.stem}-{key.hexdigest()[:16]}"
    if not (out / "linnet.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        linnet.onnx.export(path, out, max_positions=max_positions, overwrite=True, progress=False)
    return out
