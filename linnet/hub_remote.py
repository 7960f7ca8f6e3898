"""The Hub's side of a pull: which files a repo has and which Linnet fetches, and a plan
made from the safetensors headers read remotely (a ranged GET), before any weight lands.

    remote = remote_files(api.list_repo_tree(...))      # name -> RemoteFile (size, sha256)
    wanted_files(set(remote), index)                     # what a pull downloads
    plan_for(RemoteCheckpoint(...))                      # the plan, from headers only

Used by `linnet.hub.pull`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from linnet.errors import CheckpointError, PickledCheckpoint
from linnet.weights.safetensors_io import (
    INDEX_FILE,
    MAX_HEADER_BYTES,
    PICKLE_SUFFIXES,
    SINGLE_FILE,
    WEIGHT_STEMS,
    TensorInfo,
    parse_header,
)

#: Top-level files fetched besides the weights: configs and tokenizers (no code, no pickles).
TOKENIZER_FILES = frozenset(
    {"tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja"}
)
#: First bytes asked for when reading a safetensors header (most headers are smaller).
HEADER_PROBE = 100_000

# -- the repo's files ---------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1


def _remote_files(repo_files) -> dict[str, RemoteFile]:
    out = {}
    for f in repo_files:
        if not hasattr(f, "blob_id"):  # a folder
            continue
        lfs = getattr(f, "lfs", None)
        out[f.path] = RemoteFile(
            f.path,
            lfs.size if lfs else f.size,
            lfs.sha256 if lfs else None,
            f.blob_id,
        )
    return out


#: The dtype a pull asks for -> the diffusers weights variant that holds it.
VARIANT_OF_DTYPE = {"f16": "fp16"}


def with_variant(name: str, variant: str | None) -> str:
    """diffusers' variant file name: the variant before the last suffix
    (`x.safetensors` -> `x.fp16.safetensors`, `x.safetensors.index.json` ->
    `x.safetensors.index.fp16.json`)."""
    if not variant:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{variant}.{suffix}"


def _variant_present(names, variant: str | None) -> bool:
    """Whether the repo has the variant's weights (a single file or an index)."""
    files = (f"{stem}.safetensors" for stem in WEIGHT_STEMS)
    indexes = (f"{stem}.safetensors.index.json" for stem in WEIGHT_STEMS)
    return bool(variant) and any(with_variant(n, variant) in names for n in (*files, *indexes))


def index_file(names, variant: str | None = None) -> str | None:
    """The shard index among `names`, as `Checkpoint` looks for it: transformers', then
    diffusers' (`diffusion_pytorch_model.safetensors.index.json`); the variant's index where
    the repo has the variant's weights."""
    variant = variant if _variant_present(names, variant) else None
    indexes = (with_variant(f"{stem}.safetensors.index.json", variant) for stem in WEIGHT_STEMS)
    return next((i for i in indexes if i in names), None)


def weight_files(names: set[str], index: dict | None, variant: str | None = None) -> list[str]:
    """The safetensors files Linnet loads: the sharded set an index names, or model.safetensors
    (diffusers': diffusion_pytorch_model.safetensors). With a variant (`fp16`) the repo has,
    its file instead (diffusion_pytorch_model.fp16.safetensors): never both, so the folder
    holds one set of weights. Pickled weights are never among them."""
    if index is not None:
        shards = sorted(set((index.get("weight_map") or {}).values()))
        missing = [s for s in shards if s not in names]
        if missing:
            raise CheckpointError(
                f"{INDEX_FILE} names shard {missing[0]}, which the repo does not have",
                file=missing[0],
            )
        return shards
    variant = variant if _variant_present(names, variant) else None
    single = (with_variant(f"{stem}.safetensors", variant) for stem in WEIGHT_STEMS)
    found = next((f for f in single if f in names), None)
    if found is not None:
        return [found]
    pickled = sorted(n for n in names if PurePosixPath(n).suffix in PICKLE_SUFFIXES)
    if pickled:
        raise PickledCheckpoint(
            f"the repo has only pickled weights ({', '.join(pickled[:3])}); Linnet never "
            "unpickles checkpoints. Use a revision or fork with model.safetensors",
            file=pickled[0],
        )
    raise CheckpointError(f"the repo has no {SINGLE_FILE} or {INDEX_FILE}")


def wanted_files(names: set[str], index: dict | None, variant: str | None = None) -> list[str]:
    """Everything a pull fetches: top-level JSON and tokenizer files, and the weights; of the
    shard indexes, only the one whose shards are fetched (`Checkpoint` reads the first it
    finds)."""
    top = [n for n in names if "/" not in n]
    chosen = index_file(names, variant)
    extra = [
        n
        for n in top
        if (n.endswith(".json") and (".safetensors.index" not in n or n == chosen))
        or n in TOKENIZER_FILES
    ]
    return sorted(set(extra) | set(weight_files(names, index, variant)))


# -- planning from remote headers ---------------------------------------------------------


class RemoteCheckpoint:
    """What `make_plan` needs of a checkpoint (config and headers), from the Hub's metadata."""

    def __init__(self, label: str, config: dict, headers: dict[str, TensorInfo], files):
        self.folder = label
        self.config_path = f"{label}/config.json"
        self.files = [PurePosixPath(f) for f in files]
        self._config = config
        self._headers = headers

    def read_config(self) -> dict:
        return self._config

    def headers(self) -> dict[str, TensorInfo]:
        return self._headers


def _read_prefix(url: str, headers: dict, n: int) -> bytes:
    """The first `n` bytes of `url`: a ranged GET, streamed and cut short when the server
    ignores the range (olah does), so a multi-GB file is never read to its end."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    buf = bytearray()
    with get_session().stream(
        "GET", url, headers={**headers, "Range": f"bytes=0-{n - 1}"}, follow_redirects=True
    ) as r:
        if r.status_code >= 400:
            r.read()
            hf_raise_for_status(r)
        for chunk in r.iter_bytes():
            buf += chunk
            if len(buf) >= n:
                break
    return bytes(buf[:n])


def remote_header(url: str, headers: dict, name: str, size: int) -> dict[str, TensorInfo]:
    """Parse one safetensors header from the Hub, checking it as `read_header` does locally."""
    probe = _read_prefix(url, headers, min(HEADER_PROBE, size))
    if len(probe) < 8:
        raise CheckpointError(f"{name}: not a safetensors file ({size} bytes)", file=name)
    (length,) = struct.unpack("<Q", probe[:8])
    if length < 2 or length > MAX_HEADER_BYTES or 8 + length > size:
        raise CheckpointError(
            f"{name}: corrupt safetensors file: the header claims {length} bytes of {size}",
            file=name,
        )
    raw = probe if len(probe) >= 8 + length else _read_prefix(url, headers, 8 + length)
    return parse_header(Path(name), raw[8 : 8 + length], 8 + length, size)


def plan_for(ckpt, dtype: str | None = None):
    """The weights-map plan of a checkpoint (local `Checkpoint` or `RemoteCheckpoint`)."""
    from linnet.weights.planning import plan_checkpoint

    return plan_checkpoint(ckpt, dtype=dtype)[0]
