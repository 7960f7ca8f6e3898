"""The one resolver for "a zoo name, an HF repo id, a local folder or a .gguf file".

    found = locate("smollm2-135m-instruct")   # pulled into the HF cache (or found there)
    found.checkpoint                          # what the loaders take: the folder or the .gguf
    found.entry                               # the zoo entry, when known
    resolve_checkpoint("./model.gguf")        # just the path (codegen)
    open_weights("llama-3.1-8b")              # the exporters' input, resolved first

Every command and front door that takes such a target resolves it here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import CheckpointError
from linnet.hub import _read_json, pull
from linnet.zoo import registry as zoo_registry

# What the Hub accepts as a repo id: ORG/NAME of letters, digits, `-`, `_` and `.`.
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass
class Target:
    """A checkpoint folder to run, with the zoo entry it is (when known) and where it came from."""

    folder: Path
    entry: object = None
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    gguf: Path | None = None  # a GGUF file in `folder`, when the target is one

    @property
    def checkpoint(self) -> Path:
        """What the loaders take: the GGUF file, or the folder."""
        return self.gguf or self.folder


def _looks_like_path(src: str) -> bool:
    return src.startswith((".", "/", "~")) or src.endswith(".gguf") or "\\" in src


def _local(path: Path, registry, identify: bool) -> Target:
    """A local folder or .gguf file; `identify`: match its config to a zoo entry."""
    if path.is_file():
        entry = None
        if identify:
            from linnet.weights.gguf_checkpoint import GgufCheckpoint

            entry = registry.match_config(GgufCheckpoint(path).read_config())  # metadata only
        return Target(folder=path.parent, entry=entry, gguf=path)
    entry = None
    if identify:
        entry = registry.match_config(_read_json(path / "config.json", f"{path}/config.json"))
    return Target(folder=path, entry=entry)


def locate(
    target: str | os.PathLike,
    *,
    checkpoint: str | os.PathLike | None = None,
    revision=None,
    registry=None,
    identify: bool = True,
) -> Target:
    """A zoo name, an HF repo id, a local folder or a .gguf file, as a `Target`. A name is
    pulled (from the cache when it is there); `checkpoint` pairs a name with a local copy of
    its weights. A local folder is recognised as a zoo entry when its config.json matches
    one (unless `identify=False`)."""
    registry = registry if registry is not None else zoo_registry.registry()
    path = Path(target).expanduser()
    local = path.is_dir() or (path.is_file() and path.suffix == ".gguf")
    if checkpoint is None and local:
        return _local(path, registry, identify)
    if checkpoint is None and (path.exists() or _looks_like_path(str(target))):
        raise CheckpointError(f"{target}: no such checkpoint folder or GGUF file", file=str(target))
    target = str(target)
    if checkpoint is not None:
        entry = registry.get(target)
        return Target(folder=Path(checkpoint).expanduser(), entry=entry, repo=entry.repo)
    if target not in registry and "/" not in target:
        registry.get(target)  # UnknownEntry, with suggestions
    if target not in registry and not REPO_ID.fullmatch(target):
        raise CheckpointError(f"{target}: no such folder, file, zoo entry or HF repo id")
    result = pull(target, revision=revision, registry=registry)
    return Target(result.folder, result.entry, result.repo, result.revision, result.commit)


def resolve_checkpoint(src: str | os.PathLike) -> Path:
    """The checkpoint path (a folder or a .gguf file) of a target, pulled if need be."""
    return locate(src, identify=False).checkpoint


def open_weights(src, *, architecture: str | None = None, tokenizer=None):
    """The exporters' input as a `Weights` stream: a loaded model, or a target (zoo name,
    repo id, folder or .gguf file) resolved here first."""
    from linnet.weights.stream import read_weights

    if isinstance(src, (str, os.PathLike)):
        src = resolve_checkpoint(src)
    return read_weights(src, architecture=architecture, tokenizer=tokenizer)
