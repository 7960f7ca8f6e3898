"""Weights as a stream of groups, for the writers: numpy only, one tensor at a time.

    w = read_weights("path/to/folder")     # or a local .gguf file, a loaded model
    for group, arrays in w:                # arrays: the group's params, source layout
        ...
    w.close()

A `Weights` holds what every writer needs and no tensor data: the weights map, the
source and its config (context length uncapped), the original `config.json`, where
the tokenizer lives, and `groups`: one entry per weights-map rule instance (one HF
tensor, one GGUF tensor), with its params' names and shapes. `read(group)` returns
that group's params in the source's layout as numpy arrays; writers call it once per
group, in order, and drop the arrays before the next, so peak memory stays near the
largest tensor.

Three origins build a `Weights`: `from_folder` (an HF checkpoint folder: each tensor
is a read-only map of its bytes, no torch; the map is dropped with the tensor, so the
resident set does not grow with the checkpoint), `from_model` (a loaded model), and
`linnet.weights.gguf_reader.weights_from_gguf` (a GGUF file, dequantized per tensor).
Casting and block-wise writing: `linnet.weights.casting`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.core.dtypes import DTYPES as DTYPE_TABLE
from linnet.core.dtypes import FLOAT_DTYPES
from linnet.errors import CheckpointError, ConfigError
from linnet.weights.casting import HF_NAMES, NP_DTYPES, ST_DTYPES, from_torch
from linnet.weights.maps import WeightsMap
from linnet.weights.tensor_group import TensorGroup

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


@dataclass
class Weights:
    weights_map: WeightsMap
    source: Any  # linnet.source.Source
    config: dict  # the source config, max_positions uncapped (what config.json says)
    hf_config: dict
    dtype: str  # the stored dtype: what an HF export writes by default
    groups: list[TensorGroup]
    reader: Callable[[TensorGroup], list[np.ndarray]]
    tokenizer_dir: Path | None = None  # a folder with tokenizer files, if any
    # the checkpoint folder, for the other files an export carries (generation_config.json,
    # preprocessor_config.json) when it has no tokenizer files
    companion_dir: Path | None = None
    gguf_metadata: dict | None = None  # when read from a GGUF file: its key/values
    origin: str = ""  # a path or a description, for messages and model cards
    close: Callable[[], None] = field(default=lambda: None)
    # HF name -> the (blocks, scales) TensorInfo of an MXFP4 pair as stored (from a folder:
    # never changed, so an HF export copies them; the groups read them dequantized)
    packed: dict = field(default_factory=dict)
    # HF name -> a GGUF file's MXFP4 tensor (a FusedTensor for gate + up): a GGUF export
    # copies its ggml bytes as they are
    gguf_mxfp4: dict = field(default_factory=dict)

    def read(self, group: TensorGroup) -> list[np.ndarray]:
        """The group's params in the source's layout (numpy; bf16 as uint16 bits)."""
        return self.reader(group)

    def __iter__(self) -> Iterator[tuple[TensorGroup, list[np.ndarray]]]:
        for g in self.groups:
            yield g, self.read(g)

    @property
    def total_numel(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def largest_numel(self) -> int:
        return max((g.numel for g in self.groups), default=0)


def full_config(
    source, weights_map: WeightsMap, hf_config: dict, act: str, tensor_names=None
) -> dict:
    """The source config of `hf_config` with the context length config.json gives (the
    loader caps the cache it allocates; metadata must carry the real value).
    `tensor_names`: the HF tensors there are (they set `[config.present]` fields)."""
    overrides = weights_map.translate_config(hf_config, tensor_names)
    overrides["act"] = act
    return source.config(overrides)


def ordered(weights_map: WeightsMap, groups: list[TensorGroup]) -> list[TensorGroup]:
    """Layer order, as llama.cpp's converter writes: the globals the weights map lists
    before its first per-layer rule, then each layer's tensors in rule order, then the
    remaining globals (final norm, head)."""
    index = {id(r): k for k, r in enumerate(weights_map.rules)}
    first_layer = min((index[id(g.rule)] for g in groups if g.layer), default=0)

    def key(g: TensorGroup) -> tuple:
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
    from linnet.weights.planning import plan_checkpoint

    plan, source, config, hf_config = plan_checkpoint(path)
    plan.check()
    weights_map = plan.weights_map
    ckpt = plan.checkpoint
    headers = ckpt.headers()
    packed = {n: tuple(ckpt.raw_headers[p] for p in pair) for n, pair in ckpt.packed.items()}
    groups, dtypes = [], set()
    for row in plan.rows:
        if not row.loads:
            continue
        row.key, row.read_dtype = row.hf, ST_DTYPES[row.dtype]
        row.source = None if row.hf in packed else headers[row.hf]  # packed: no f32 bytes
        dtypes.add(row.read_dtype)
        groups.append(row)

    def reader(g: TensorGroup) -> list[np.ndarray]:
        x = ckpt.read_numpy(g.key) if g.key in packed else _read_tensor(headers[g.key])
        return g.rule.forward(x, g.sizes)

    stored = dtypes.pop() if len(dtypes) == 1 else "f32"
    folder = Path(path)
    return Weights(
        weights_map=weights_map,
        source=source,
        config=full_config(source, weights_map, hf_config, config["act"], headers),
        hf_config=hf_config,
        dtype=stored,
        groups=ordered(weights_map, groups),
        reader=reader,
        tokenizer_dir=folder if _has_tokenizer(folder) else None,
        companion_dir=folder,
        origin=str(folder),
        packed=packed,
    )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


_TORCH_NAMES = {f"torch.{DTYPE_TABLE[n].torch}": n for n in FLOAT_DTYPES}  # torch dtype -> name


def from_model(
    model, *, architecture: str | None = None, tokenizer: str | Path | None = None
) -> Weights:
    """A loaded `TorchModel` (its params as they are; tied params are not exported twice).
    `tokenizer`: a folder whose tokenizer files go with the export (a model loaded by
    `linnet.gguf.load` carries its own)."""
    from linnet.weights.maps import architecture_of, find_weights_map

    hf_config = dict(getattr(model, "hf_config", None) or {})
    arch = architecture or architecture_of(hf_config)
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
    params = model.params
    shapes = {n: tuple(t.shape) for n, t in params.items()}
    groups = []
    for rule, bindings in weights_map.groups(params):
        targets = rule.targets(bindings)
        dtype = _TORCH_NAMES.get(str(params[targets[0]].dtype), "f32")
        name = rule.hf_name(bindings)
        shape = tuple(shapes[t] for t in targets)
        groups.append(TensorGroup(name, rule=rule, bindings=bindings, params=targets,
                                  shapes=shape, read_dtype=dtype))  # fmt: skip
    config = full_config(model.source, weights_map, hf_config, act, [g.hf for g in groups])

    def reader(g: TensorGroup) -> list[np.ndarray]:
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
        companion_dir=getattr(model, "folder", None),
        gguf_metadata=getattr(model, "gguf_metadata", None),
        origin=str(getattr(model, "origin", "") or "a loaded model"),
    )


# ----------------------------------------------------------------------------------------
# The exporters' input (a SRC argument is resolved first: linnet.targets.open_weights)


def read_weights(src, *, architecture: str | None = None, tokenizer=None) -> Weights:
    """A loaded model, a local HF folder or a local .gguf file as a `Weights` stream."""
    if not isinstance(src, (str, Path)):
        return from_model(src, architecture=architecture, tokenizer=tokenizer)
    path = Path(src)
    if path.is_file() and path.suffix == ".gguf":
        from linnet.weights.gguf_reader import weights_from_gguf

        w = weights_from_gguf(path)
    else:
        w = from_folder(path)
    if tokenizer is not None:
        w.tokenizer_dir = Path(tokenizer)
    return w
