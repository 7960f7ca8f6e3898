"""The files an export carries beside the weights (tokenizer, chat templates, generation
config), read only from inside the checkpoint.

    copy_tokenizer(src_folder, out_folder)        # the names it copied
    path = companion(src_folder, "tokenizer.json")  # checked before it is read

A companion that is a symlink may point inside the folder, or, for a folder in the Hub cache
(`snapshots/<commit>/`), at the repo's own `blobs/`; one that leads anywhere else is refused
with its name, so an export (which may be pushed to a Hub) never carries a file from outside
the checkpoint; a `.json` companion that is not a JSON object is refused too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from linnet.errors import CheckpointError
from linnet.weights.jsonfile import read_json_object
from linnet.weights.stream import TOKENIZER_DIRS, TOKENIZER_FILES


def checkpoint_root(folder: Path) -> Path:
    """Where a checkpoint's files may live: the folder, or its Hub cache repo."""
    real = folder.resolve()
    if real.parent.name == "snapshots":  # models--org--name/snapshots/<commit> -> ../../blobs
        return real.parent.parent
    return real


def companion(folder: Path, name: str) -> Path:
    """`folder / name`, refused when it resolves outside the checkpoint."""
    path = folder / name
    target = path.resolve()
    if not target.is_relative_to(checkpoint_root(folder)):
        raise CheckpointError(
            f"{path}: links outside the checkpoint folder (to {target}); an export copies "
            "only files that are inside it",
            file=str(path),
        )
    return path


def copy_companion(folder: Path, name: str, dst: Path) -> None:
    """One file, copied as a regular file once it is known to be inside the checkpoint (and,
    for a `.json` file, to be a JSON object: a broken one is named, not passed on)."""
    path = companion(folder, name)
    if name.endswith(".json"):
        read_json_object(path)
    shutil.copyfile(path, dst / name)


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """The tokenizer and chat-template files of `src` into `dst`; the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            copy_companion(src, name, dst)
            copied.append(name)
    for name in TOKENIZER_DIRS:
        if (src / name).is_dir():
            companion(src, name)
            for path in sorted((src / name).rglob("*")):
                rel = str(path.relative_to(src))
                companion(src, rel)  # every file under it, links included
            shutil.copytree(src / name, dst / name)
            copied.append(name + "/")
    return copied
