"""StableHLO exports of a source's entries (front door of `backends/jax/stablehlo.py`).

    exported = export_entry(source, config, "decode")      # symbolic B and S
    save(exported, "decode.mlir", source, config, "equivalent")   # + decode.exported
    model = linnet.jax.load(ckpt, from_stablehlo="decode.mlir")

The source is lowered here (`Source.program`); the backend exports the program.
"""

from __future__ import annotations

from pathlib import Path

from jax import export as jax_export

from linnet.backends.jax import stablehlo as backend
from linnet.backends.jax.stablehlo import SUFFIX, check_fits, load_exports, read
from linnet.errors import LinnetError
from linnet.ir.program import Program
from linnet.source import Source

__all__ = ["SUFFIX", "check_fits", "export_entry", "load_exports", "read", "save"]


def export_entry(
    source: Source,
    config: dict,
    entry: str,
    numerics: str = "equivalent",
    platforms: tuple[str, ...] | None = None,
) -> jax_export.Exported:
    """`entry` of `source` for `config` as a `jax.export.Exported` (StableHLO inside)."""
    if entry not in source.entries:
        raise LinnetError(
            f"--entry {entry}: the {source.name} source has {', '.join(source.entries)}"
        )
    return backend.export_entry(source.program(config), entry, numerics, platforms)


def save(
    exported: jax_export.Exported,
    path: str | Path,
    source: Source,
    config: dict,
    numerics: str,
) -> tuple[Path, Path]:
    """Write the StableHLO text to `path` (.mlir) and the serialized export beside it."""
    about = Program(source.name, config, {}, source.params(config).shapes)  # no lowering
    return backend.save(exported, path, about, numerics)
