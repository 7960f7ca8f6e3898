"""HF export: sharded safetensors named exactly as the original, with its config and tokenizer.

Two passes over a `Weights` stream. The first plans from shapes alone: every HF tensor's
name (as the source checkpoint spells it), shape, dtype and byte size, and the shards
(greedy, in layer order, each at most `max_shard_size`; one shard is `model.safetensors`,
more get `model-0000i-of-0000N.safetensors` and `model.safetensors.index.json`). The
second writes each shard's header, then streams its tensors block by block: from a
checkpoint folder each HF tensor is read, converted and appended in blocks of a few MB
(the weights map's transforms and their inverses cancel); from a model or a GGUF file
one group's params are inverted through the weights map (`Rule.inverse`) and converted
the same way. The folder is built under a temporary name and renamed at the end.

Beside the weights: `config.json` (the original, with `dtype` set to what was written),
`generation_config.json` (copied, or made from the config's token ids), and the
tokenizer and chat-template files (copied from the source folder; for a GGUF source,
rebuilt by transformers from the GGUF's tokenizer metadata when it is installed).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from linnet.converters.companions import copy_companion, copy_tokenizer

from linnet.atomic import atomic_path
from linnet.core.dtypes import normalize_dtype
from linnet.errors import ConfigError
from linnet.remote_code import refuse_remote_code
from linnet.weights.casting import HF_NAMES, NP_DTYPES, ST_NAMES, write_converted
from linnet.weights.stream import Weights
from linnet.weights.tensor_group import TensorGroup

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in "5GB" (10^9, as transformers counts), "500MiB" (2^20) or a plain int."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(size))
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"max_shard_size {size!r}: expected e.g. 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass
class Entry:
    group: TensorGroup | None
    name: str
    shape: tuple[int, ...]
    nbytes: int
    data: np.ndarray | None = None  # a weights-map buffer (num_batches_tracked), written as is
    st_dtype: str = ""  # its safetensors dtype


_BUFFER_NP = {"i64": np.dtype("<i8")}
_BUFFER_ST = {"i64": "I64"}


def buffer_entries(weights: Weights, hf_name: str) -> list[Entry]:
    """The weights_map's buffers beside tensor `hf_name` (scalars of their declared value)."""
    out = []
    for name, b in weights.weights_map.buffers_beside(hf_name):
        data = np.array(b.value, dtype=_BUFFER_NP[b.dtype])
        out.append(Entry(None, name, (), data.nbytes, data, _BUFFER_ST[b.dtype]))
    return out


def packed_entries(pair) -> list[Entry]:
    """An MXFP4 pair's `_blocks` and `_scales` as stored: the bytes of the source file
    (mapped, not read until written), so the export is bit-exact without re-quantizing."""
    out = []
    for info in pair:
        data = np.memmap(info.file, np.uint8, "r", offset=info.offsets[0], shape=info.shape)
        out.append(Entry(None, info.name, tuple(info.shape), info.nbytes, data, "U8"))
    return out


def plan_shards(weights: Weights, dtype: str, max_bytes: int) -> list[list[Entry]]:
    """Entries grouped into shards: in stream order, a new shard when the next tensor
    would push the current one past `max_bytes` (a tensor bigger than that gets its own)."""
    size = NP_DTYPES[dtype].itemsize
    shards: list[list[Entry]] = [[]]
    used = 0
    for g in weights.groups:
        if g.hf_name in weights.packed:  # an MXFP4 pair, copied as stored
            for e in packed_entries(weights.packed[g.hf_name]):
                if shards[-1] and used + e.nbytes > max_bytes:
                    shards.append([])
                    used = 0
                shards[-1].append(e)
                used += e.nbytes
            continue
        shape = g.hf_shape
        nbytes = int(np.prod(shape, dtype=np.int64)) * size
        if shards[-1] and used + nbytes > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(Entry(g, g.hf_name, shape, nbytes))
        used += nbytes
        for e in buffer_entries(weights, g.hf_name):
            shards[-1].append(e)
            used += e.nbytes
    return shards


def _header(entries: list[Entry], dtype: str) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": e.st_dtype or ST_NAMES[dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_shard(path: Path, weights: Weights, entries: list[Entry], dtype: str, bar) -> None:
    """One shard: the header, then each tensor converted block by block and appended. A
    tensor read from a checkpoint folder is the HF tensor as stored (the weights map's
    transforms and their inverses cancel), so it streams from the source file in blocks;
    otherwise its params are read and inverted through the weights map first."""
    header = _header(entries, dtype)
    with open(path, "wb") as f:
        f.write(header)

        def write(chunk) -> None:
            f.write(chunk)
            bar.update(len(chunk))

        for e in entries:
            g = e.group
            if e.data is not None:
                write(e.data.tobytes())
                continue
            if g.source is not None and tuple(g.source.shape) == e.shape:
                write_converted(g.source, dtype, write)
                continue
            parts = weights.read(g)
            x = g.rule.inverse(parts)
            del parts
            if tuple(x.shape) != e.shape:
                raise AssertionError(f"{e.name}: planned {e.shape}, got {x.shape}")
            write_converted(x, dtype, write)
            del x
        if f.tell() != len(header) + sum(e.nbytes for e in entries):
            raise AssertionError(f"{path}: {f.tell()} bytes written, not as planned")


def weights_stem(hf_config: dict) -> str:
    """The weights files' stem: diffusers names them `diffusion_pytorch_model` (a config.json
    with `_class_name` and no `architectures`), transformers `model`."""
    diffusers = "_class_name" in hf_config and "architectures" not in hf_config
    return "diffusion_pytorch_model" if diffusers else "model"


def shard_names(n: int, stem: str = "model") -> list[str]:
    if n == 1:
        return [f"{stem}.safetensors"]
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def hf_config_for(weights: Weights, dtype: str) -> dict:
    cfg = copy.deepcopy(weights.hf_config)
    if not weights.packed:  # MXFP4 pairs written back keep their quantization_config
        cfg.pop("quantization_config", None)
    if weights_stem(cfg) != "model":  # a diffusers config states no dtype
        return cfg
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["dtype"]
    for k in keys:
        cfg[k] = HF_NAMES[dtype]
    return cfg


def generation_config_for(weights: Weights) -> dict:
    out: dict = {"_from_model_config": True}
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if weights.hf_config.get(k) is not None:
            out[k] = weights.hf_config[k]
    return out


def tokenizer_from_gguf(gguf_path: Path, dst: Path) -> list[str]:
    """transformers' GGUF tokenizer conversion, saved as HF tokenizer files."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("warning: transformers is not installed: no tokenizer files", file=sys.stderr)
        return []
    refuse_remote_code(gguf_path.parent)
    tok = AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False
    )
    return [Path(f).name for f in tok.save_pretrained(dst)]


SIDE_CONFIGS = ("generation_config.json", "preprocessor_config.json")


def copy_side_configs(weights: Weights, dst: Path) -> list[str]:
    """generation_config.json and preprocessor_config.json (Whisper's decoding rules and
    feature extractor) as the tokenizer folder, else the checkpoint folder, has them."""
    copied = []
    for name in SIDE_CONFIGS:
        for folder in (weights.tokenizer_dir, weights.companion_dir):
            if folder is not None and (Path(folder) / name).is_file():
                copy_companion(Path(folder), name, dst)
                copied.append(name)
                break
    return copied


def export_hf(
    weights: Weights,
    out_dir: str | Path,
    *,
    dtype=None,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write `weights` as an HF checkpoint folder `out_dir`; returns its path."""
    from tqdm.auto import tqdm

    dtype = normalize_dtype(dtype) if dtype is not None else weights.dtype
    out_dir = Path(out_dir)
    shards = plan_shards(weights, dtype, parse_size(max_shard_size))
    stem = weights_stem(weights.hf_config)
    names = shard_names(len(shards), stem)
    total = sum(e.nbytes for s in shards for e in s)
    with atomic_path(out_dir, is_dir=True, overwrite=overwrite) as tmp:
        with tqdm(
            total=total, unit="B", unit_scale=True, desc=out_dir.name, disable=not progress
        ) as bar:
            for name, entries in zip(names, shards, strict=True):
                write_shard(tmp / name, weights, entries, dtype, bar)
        if len(shards) > 1:
            index = {
                "metadata": {
                    "total_parameters": weights.total_numel,
                    "total_size": total,
                },
                "weight_map": {e.name: n for n, s in zip(names, shards) for e in s},
            }
            (tmp / f"{stem}.safetensors.index.json").write_text(
                json.dumps(index, indent=2, sort_keys=True) + "\n"
            )
        (tmp / "config.json").write_text(
            json.dumps(hf_config_for(weights, dtype), indent=2, sort_keys=True) + "\n"
        )
        src = weights.tokenizer_dir
        copied = copy_side_configs(weights, tmp)
        if "generation_config.json" not in copied and stem == "model":  # diffusers has none
            (tmp / "generation_config.json").write_text(
                json.dumps(generation_config_for(weights), indent=2, sort_keys=True) + "\n"
            )
        if src is not None:
            copy_tokenizer(src, tmp)
        elif (weights.gguf_metadata or {}).get("tokenizer.ggml.model") not in (
            None,
            "none",
            "no_vocab",
        ):
            tokenizer_from_gguf(Path(weights.origin), tmp)
        for f in tmp.iterdir():
            if f.is_file():
                f.chmod(0o644)
    return out_dir
