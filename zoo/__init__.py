"""The zoo: `.linnet` sources and the entries that pair them with weights maps."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source_path(name: str) -> Path:
    """Path of the zoo source `name` (e.g. "llama" for zoo/llama.linnet)."""
    return HERE / f"{name}.linnet"


# The registry of zoo entries (zoo/entries.toml, zoo/revisions.toml); `linnet.hub.pull`
# pulls them (the hub imports the zoo, never the reverse).
from linnet.zoo.registry import Entry, Registry, get  # noqa: E402, F401
