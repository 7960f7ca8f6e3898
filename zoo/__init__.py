"""The zoo: `.linnet` sources and the entries that pair them with weights maps."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source_path(name: str) -> Path:
    """Path of the zoo source `name` (e.g. "llama" for zoo/llama.linnet)."""
    return HERE / f"{name}.linnet"


# The registry of zoo entries (zoo/entries.toml, zoo/revisions.toml) and pulling them.
from linnet.zoo.registry import Entry, Registry, get  # noqa: E402, F401


def pull(name: str, **kwargs):
    """Pull a zoo entry (or an HF repo id) into the HF cache: see `linnet.hub.pull`."""
    from linnet.hub import pull as hub_pull

    return hub_pull(name, **kwargs)
