"""Which part of a Hub repo is the checkpoint: the whole repo, or one subfolder of it.

Diffusers pipelines keep each model in a folder of its own (stable-diffusion-xl-base-1.0's
UNet is `unet/config.json` and `unet/diffusion_pytorch_model.safetensors`); a zoo entry with
`subfolder = "unet"` pulls that folder alone and hands back `snapshot/unet`.

    scope = RepoScope("unet")
    files = scope.files(remote, "org/name@commit")   # "config.json" -> RemoteFile("unet/...")
    scope.path("config.json")                        # "unet/config.json", as the Hub names it
    scope.folder(snapshot)                           # snapshot / "unet"

Used by `linnet.hub.pull`, with the cache helpers it shares with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import CheckpointError


@dataclass(frozen=True)
class RepoScope:
    subfolder: str | None = None  # None: the checkpoint is the repo's top level

    def path(self, name: str) -> str:
        """The repo path of a file named relative to the checkpoint folder."""
        return f"{self.subfolder}/{name}" if self.subfolder else name

    def folder(self, snapshot: Path) -> Path:
        return snapshot / self.subfolder if self.subfolder else snapshot

    def files(self, repo_files: dict, label: str) -> dict:
        """The repo's files inside the checkpoint folder, named relative to it; a repo
        without the subfolder is a CheckpointError that says what the repo has instead."""
        if not self.subfolder:
            return dict(repo_files)
        prefix = f"{self.subfolder}/"
        inside = {p[len(prefix) :]: f for p, f in repo_files.items() if p.startswith(prefix)}
        if not inside:
            top = sorted({p.split("/")[0] for p in repo_files})
            raise CheckpointError(
                f"{label}: no {prefix} folder, where the entry's checkpoint lives (the repo "
                f"has: {', '.join(top[:8]) or 'nothing'})",
                file=prefix,
            )
        return inside


def blob_sizes(storage: Path) -> dict[str, int]:
    """Blob name -> size, of the complete blobs of a repo's HF cache folder."""
    blobs = storage / "blobs"
    if not blobs.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in blobs.iterdir() if not p.name.endswith(".incomplete")}


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{what}: unreadable: {e}", file=str(path)) from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{what}: not a JSON object", file=str(path))
    return data
