"""The zoo: `.linnet` sources and the entries that pair them with weights maps."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source_path(name: str) -> Path:
    """Path of the zoo source `name` (e.g. "llama" for zoo/llama.linnet)."""
    return HERE / f"{name}.linnet"
