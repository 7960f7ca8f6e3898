"""Weights as a stream of groups, for the exporters: numpy only, one HF tensor at a time.

A `Weights` holds what every writer needs and no tensor data: the weights map, the
source and its config (context length uncapped), the original `config.json`, where
the tokenizer lives, and `groups`: one entry per weights-map rule instance (one HF
tensor, one GGUF tensor), with its params' names and shapes. `read(group)` returns
that group's params in the source's layout as numpy arrays; writers call it once per
group, in order, and drop the arrays before the next, so peak memory stays near the
largest tensor.

Three origins build a `Weights`: `from_folder` (an HF checkpoint folder: each tensor
is a read-only map of its bytes, no torch; the map is dropped with the tensor, so the
resident set does not grow with the checkpoint), `from_model` (a loaded `TorchModel`),
and `converters.gguf_import.weights_from_gguf` (a GGUF file, dequantized per tensor).
Writers convert in blocks of a few MB (`blocks`, `write_converted`): a tensor that
a folder holds as it is streams from its file without ever being resident whole.

numpy has no bfloat16: a bf16 array here is its raw bits in a `uint16` array (no model
holds real uint16 tensors). `cast` / `cast_into` convert between f32, f16 and bf16 in
cache-sized blocks, rounding to nearest even like torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError, ConfigError
from linnet.weights.maps import Rule, WeightsMap

DTYPES = ("f32", "f16", "bf16")
NP_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}
ST_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}  # safetensors dtype names
ST_DTYPES = {v: k for k, v in ST_NAMES.items()}
HF_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}  # config.json `dtype`
DTYPE_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "fp32": "f32"}
CHUNK_ELEMENTS = 1 << 18  # casts run in blocks this size (they stay in cache)
CAST_THREADS = min(4, os.cpu_count() or 1)  # threads for casts of large tensors

# Tokenizer and chat-template files an HF export copies from the source folder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
TOKENIZER_DIRS = ("additional_chat_templates",)


def dtype_name(x) -> str:
    """f32 / f16 / bf16 for a numpy array (bf16: uint16 bits)."""
    for name, dt in NP_DTYPES.items():
        if x.dtype == dt:
            return name
    raise TypeError(f"not a float tensor Linnet exports: {x.dtype}")


def normalize_dtype(dtype: Any, allowed: tuple[str, ...] = DTYPES) -> str:
    name = str(dtype).removeprefix("torch.").lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in allowed:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(allowed)}")
    return name


# ----------------------------------------------------------------------------------------
# Casting (numpy, bit-exact with torch's conversions)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = 0x7FC0  # torch's NaN
    return rounded


def _bf16_to_f32(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.uint32) << 16).view(np.float32)


def _cast_block(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    if src == "bf16":
        x = _bf16_to_f32(x)
    if dst == "bf16":
        return _f32_to_bf16(x)
    with np.errstate(over="ignore"):  # out of f16 range: inf, as torch gives
        return x.astype(NP_DTYPES[dst])


def _bf16_to_f16_into(b: np.ndarray, out: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> None:
    """bf16 bits -> f16 bits in integer ops (no f32 pass). Inside f16's normal range
    (2^-14 <= |x| < 2^16, bf16 exponent 113..142) the value is exact: rebias the exponent
    (-112) and widen the mantissa (7 -> 10 bits). Anything else (subnormal, zero, overflow,
    inf, NaN) takes the f32 route, which rounds as torch does."""
    np.bitwise_and(b, 0x7FFF, out=s1)
    np.subtract(s1, 0x3880, out=s1)  # exponent 113 -> 0; below wraps past 0x0EFF
    np.left_shift(s1, 3, out=out)
    np.add(out, 0x400, out=out)  # (e - 112) << 10 | m << 3
    np.bitwise_and(b, 0x8000, out=s2)
    np.bitwise_or(out, s2, out=out)
    bad = s1 > 0x0EFF
    if bad.any():
        out[bad] = _cast_block(b[bad], "bf16", "f16").view(np.uint16)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` (f32, f16 or bf16 bits) as `dtype`: a new array unless the dtype already
    matches."""
    if dtype_name(x) == dtype:
        return x
    out = np.empty(x.shape, NP_DTYPES[dtype])
    cast_into(x, out)
    return out


def cast_into(x: np.ndarray, out: np.ndarray) -> None:
    """Convert `x` into the preallocated `out` (same shape; any of f32, f16, bf16 bits),
    in cache-sized blocks, split between threads for large tensors (numpy's loops release
    the GIL). `out` may be a map of the output file: the data is then written once."""
    src, dst = dtype_name(x), dtype_name(out)
    if tuple(x.shape) != tuple(out.shape):
        raise ValueError(f"cast_into: shape {x.shape} into {out.shape}")
    flat = np.ascontiguousarray(x).reshape(-1)
    dest = out.reshape(-1)
    step = CHUNK_ELEMENTS

    def run(lo: int, hi: int) -> None:
        if src == dst:
            dest[lo:hi] = flat[lo:hi]
        elif src == "bf16" and dst == "f16":
            bits = dest.view(np.uint16)
            s1, s2 = np.empty(step, np.uint16), np.empty(step, np.uint16)
            for i in range(lo, hi, step):
                n = min(step, hi - i)
                _bf16_to_f16_into(flat[i : i + n], bits[i : i + n], s1[:n], s2[:n])
        else:
            for i in range(lo, hi, step):
                j = min(i + step, hi)
                dest[i:j] = _cast_block(flat[i:j], src, dst)

    workers = min(CAST_THREADS, flat.size // (4 * step))
    if workers < 2:
        run(0, flat.size)
        return
    per = -(-flat.size // workers // step) * step
    pool = _cast_pool()
    jobs = [pool.submit(run, lo, min(lo + per, flat.size)) for lo in range(per, flat.size, per)]
    run(0, min(per, flat.size))  # this thread takes the first part
    for job in jobs:
        job.result()


_POOL = None


def _cast_pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max(1, CAST_THREADS - 1), thread_name_prefix="linnet-cast")
    return _POOL


BLOCK_ELEMENTS = 1 << 21  # elements per block when streaming a tensor to its file


def blocks(src, elements: int = BLOCK_ELEMENTS) -> Iterator[np.ndarray]:
    """`src` (an array, or the TensorInfo of a safetensors tensor) as consecutive flat blocks
    of `elements` (the last may be shorter). From a file, blocks are read into two buffers
    in turn: a block stays valid until the second next one is asked for, and nothing
    bigger than a block is resident."""
    if isinstance(src, np.ndarray):
        flat = np.ascontiguousarray(src).reshape(-1)
        for i in range(0, flat.size, elements):
            yield flat[i : i + elements]
        return
    n = int(np.prod(src.shape, dtype=np.int64))
    if n == 0:
        return
    dtype = NP_DTYPES[ST_DTYPES[src.dtype]]
    bufs = [np.empty(min(elements, n), dtype) for _ in range(2 if n > elements else 1)]
    with open(src.file, "rb", buffering=0) as f:
        f.seek(src.offsets[0])
        for k, i in enumerate(range(0, n, elements)):
            view = bufs[k % len(bufs)][: min(elements, n - i)]
            raw = memoryview(view).cast("B")
            got = 0
            while got < len(raw):
                r = f.readinto(raw[got:])
                if not r:
                    raise CheckpointError(f"{src.file}: truncated at tensor {src.name}")
                got += r
            yield view


def write_converted(src, dtype: str, write: Callable, elements: int = BLOCK_ELEMENTS) -> None:
    """Write `src` (array or TensorInfo) as `dtype` through `write(bytes)`, block by block:
    read, convert into one of two buffers, and write in a background thread while the
    next block is read and converted (file I/O and numpy release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    outs: list[np.ndarray] = []
    with ThreadPoolExecutor(1, thread_name_prefix="linnet-write") as pool:
        pending = None
        for k, blk in enumerate(blocks(src, elements)):
            if dtype_name(blk) == dtype:
                out = blk
            else:
                if len(outs) < 2:
                    outs.append(np.empty(blk.size, NP_DTYPES[dtype]))
                out = outs[k % 2][: blk.size]
                cast_into(blk, out)
            if pending is not None:
                pending.result()  # the buffer written two blocks ago is free again
            pending = pool.submit(write, memoryview(out).cast("B"))
        if pending is not None:
            pending.result()


def from_torch(t) -> np.ndarray:
    """A torch tensor as a numpy array (bf16 as uint16 bits; no copy on CPU)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype not in (torch.float32, torch.float16):
        t = t.float()
    return t.contiguous().numpy()


def to_torch(x: np.ndarray, torch_dtype=None):
    """A numpy array (bf16 as uint16 bits) as a torch tensor, cast to `torch_dtype`."""
    import torch

    x = np.ascontiguousarray(x)
    if x.dtype == np.uint16:
        t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(x)
    return t if torch_dtype is None else t.to(torch_dtype)


# ----------------------------------------------------------------------------------------
# Groups


@dataclass
class Group:
    """One rule instance: one HF tensor (and one GGUF tensor) and the params it holds."""

    rule: Rule
    bindings: dict[str, str]
    params: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]  # the params' shapes
    hf_name: str  # as the original checkpoint names it (prefix or not)
    key: Any = None  # how the origin finds the data (an HF name, a GGUF tensor)
    dtype: str = "f32"  # the dtype `read` returns
    source: Any = None  # the safetensors TensorInfo holding the HF tensor as it is (folders)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return self.rule.hf_shape(list(self.shapes))

    @property
    def joined_shape(self) -> tuple[int, ...]:
        """The shape of the params concatenated along the split axis (the GGUF tensor)."""
        if self.rule.split_axis is None:
            return self.shapes[0]
        ax = self.rule.split_axis
        first = self.shapes[0]
        return tuple(sum(s[ax] for s in self.shapes) if k == ax else d for k, d in enumerate(first))

    @property
    def sizes(self) -> list[int] | None:
        if self.rule.split_axis is None:
            return None
        return [s[self.rule.split_axis] for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def layer(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.bindings.values())


@dataclass
class Weights:
    weights_map: WeightsMap
    source: Any  # linnet.source.Source
    config: dict  # the source config, max_positions uncapped (what config.json says)
    hf_config: dict
    dtype: str  # the stored dtype: what an HF export writes by default
    groups: list[Group]
    reader: Callable[[Group], list[np.ndarray]]
    tokenizer_dir: Path | None = None  # a folder with tokenizer files, if any
    gguf_metadata: dict | None = None  # when read from a GGUF file: its key/values
    origin: str = ""  # a path or a description, for messages and model cards
    close: Callable[[], None] = field(default=lambda: None)

    def read(self, group: Group) -> list[np.ndarray]:
        """The group's params in the source's layout (numpy; bf16 as uint16 bits)."""
        return self.reader(group)

    def __iter__(self) -> Iterator[tuple[Group, list[np.ndarray]]]:
        for g in self.groups:
            yield g, self.read(g)

    @property
    def total_numel(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def largest_numel(self) -> int:
        return max((g.numel for g in self.groups), default=0)


def full_config(source, weights_map: WeightsMap, hf_config: dict, act: str) -> dict:
    """The source config of `hf_config` with the context length config.json gives (the
    loader caps the cache it allocates; metadata must carry the real value)."""
    overrides = weights_map.translate_config(hf_config)
    overrides["act"] = act
    return source.config(overrides)


def ordered(weights_map: WeightsMap, groups: list[Group]) -> list[Group]:
    """Layer order, as llama.cpp's converter writes: the globals the weights map lists
    before its first per-layer rule, then each layer's tensors in rule order, then the
    remaining globals (final norm, head)."""
    index = {id(r): k for k, r in enumerate(weights_map.rules)}
    first_layer = min((index[id(g.rule)] for g in groups if g.layer), default=0)

    def key(g: Group) -> tuple:
        k = index[id(g.rule)]
        phase = 1 if g.layer else (0 if k < first_layer else 2)
        return (phase, g.layer, k)

    return sorted(groups, key=key)


# ----------------------------------------------------------------------------------------
# Origins


def _read_tensor(info) -> np.ndarray:
    """One safetensors tensor as a read-only map of its bytes (no copy). The map lives as
    long as the array (and views of it) do: one tensor at a time stays resident."""
    dtype = ST_DTYPES.get(info.dtype)
    if dtype is None:
        raise CheckpointError(
            f"tensor {info.name} has dtype {info.dtype}; exports read F32, F16 or BF16",
            tensor=info.name,
        )
    if info.nbytes == 0:
        return np.zeros(info.shape, NP_DTYPES[dtype])
    return np.memmap(
        info.file, dtype=NP_DTYPES[dtype], mode="r", offset=info.offsets[0], shape=info.shape
    )


def from_folder(path: str | Path) -> Weights:
    """An HF checkpoint folder, planned from headers (every problem is raised first)."""
    from linnet.loading import plan_checkpoint

    plan, source, config, hf_config = plan_checkpoint(path)
    plan.check()
    weights_map = plan.weights_map
    headers = plan.checkpoint.headers()
    groups, dtypes = [], set()
    for row in plan.rows:
        if not row.loads:
            continue
        rule, bindings = weights_map.match(row.hf, plan.params)
        dtype = ST_DTYPES[row.dtype]
        dtypes.add(dtype)
        shapes = tuple(plan.params[p] for p in row.params)
        info = headers[row.hf]
        groups.append(Group(rule, bindings, row.params, shapes, row.hf, row.hf, dtype, info))

    def reader(g: Group) -> list[np.ndarray]:
        x = _read_tensor(headers[g.key])
        return g.rule.forward(x, g.sizes)

    stored = dtypes.pop() if len(dtypes) == 1 else "f32"
    folder = Path(path)
    return Weights(
        weights_map=weights_map,
        source=source,
        config=full_config(source, weights_map, hf_config, config["act"]),
        hf_config=hf_config,
        dtype=stored,
        groups=ordered(weights_map, groups),
        reader=reader,
        tokenizer_dir=folder if _has_tokenizer(folder) else None,
        origin=str(folder),
    )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


_TORCH_NAMES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


def from_model(
    model, *, architecture: str | None = None, tokenizer: str | Path | None = None
) -> Weights:
    """A loaded `TorchModel` (its params as they are; tied params are not exported twice).
    `tokenizer`: a folder whose tokenizer files go with the export (a model loaded by
    `linnet.gguf.load` carries its own)."""
    from linnet.weights.maps import find_weights_map

    hf_config = dict(getattr(model, "hf_config", None) or {})
    arch = architecture or (hf_config.get("architectures") or [None])[0]
    if arch is None:
        raise ConfigError(
            "the model has no HF config (it was not loaded from a checkpoint): pass "
            "architecture= (e.g. 'LlamaForCausalLM') to choose the weights map"
        )
    weights_map = find_weights_map(arch)
    act = model.config.get("act", "f32")
    if not hf_config:
        hf_config = weights_map.config_to_hf(model.config)
        hf_config["dtype"] = HF_NAMES[act]
    config = full_config(model.source, weights_map, hf_config, act)
    params = model.params
    shapes = {n: tuple(t.shape) for n, t in params.items()}
    groups = []
    for rule, bindings in weights_map.groups(params):
        targets = rule.targets(bindings)
        dtype = _TORCH_NAMES.get(str(params[targets[0]].dtype), "f32")
        name = rule.hf_name(bindings)
        groups.append(
            Group(rule, bindings, targets, tuple(shapes[t] for t in targets), name, None, dtype)
        )

    def reader(g: Group) -> list[np.ndarray]:
        return [from_torch(params[p]) for p in g.params]

    tok = tokenizer or getattr(model, "tokenizer_dir", None)
    return Weights(
        weights_map=weights_map,
        source=model.source,
        config=config,
        hf_config=hf_config,
        dtype=act,
        groups=ordered(weights_map, groups),
        reader=reader,
        tokenizer_dir=Path(tok) if tok else None,
        gguf_metadata=getattr(model, "gguf_metadata", None),
        origin=str(getattr(model, "origin", "") or "a loaded model"),
    )


# ----------------------------------------------------------------------------------------
# Resolving a SRC argument


def _looks_like_path(src: str) -> bool:
    return src.startswith((".", "/", "~")) or src.endswith(".gguf") or "\\" in src


def resolve(src: str | Path) -> Path:
    """A local folder or .gguf file; otherwise a zoo name (or HF repo id) that
    `linnet.zoo.pull` fetches, once that exists."""
    p = Path(src).expanduser()
    if p.exists():
        return p
    if not _looks_like_path(str(src)):
        try:
            from linnet import zoo

            pull = getattr(zoo, "pull", None)
        except ImportError:
            pull = None
        if pull is not None:
            pulled = pull(str(src))
            return Path(getattr(pulled, "folder", pulled))
    raise CheckpointError(f"{src}: no such checkpoint folder or GGUF file", file=str(src))


def open_weights(src, *, architecture: str | None = None, tokenizer=None) -> Weights:
    """The exporters' input: a loaded model, an HF folder, a .gguf file or a zoo name."""
    if not isinstance(src, (str, Path)):
        return from_model(src, architecture=architecture, tokenizer=tokenizer)
    path = resolve(src)
    if path.is_file() and path.suffix == ".gguf":
        from linnet.converters.gguf_import import weights_from_gguf

        w = weights_from_gguf(path)
    else:
        w = from_folder(path)
    if tokenizer is not None:
        w.tokenizer_dir = Path(tokenizer)
    return w
