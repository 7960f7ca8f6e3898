"""`linnet jax` (readable JAX source) and `linnet stablehlo` (an entry exported with jax.export).

SRC is resolved as for `linnet torch`: a `.linnet` source (with `--config`: a JSON file of
source fields or an HF folder), or an HF checkpoint folder; also a zoo name, found in the
HF cache or pulled (needs the `hub` extra).
"""

from __future__ import annotations

from pathlib import Path

import click

from linnet.commands.codegen import emit_source, resolve_source_and_config

_SRC = click.argument("src")
_CONFIG = click.option(
    "--config", "config", help="config: a JSON file of source fields or an HF folder"
)
_NUMERICS = click.option(
    "--numerics", type=click.Choice(["equivalent", "fast"]), default="equivalent"
)


def resolve(src: str, config: str | None):
    """(source, config) for SRC, as `linnet torch` resolves it."""
    return resolve_source_and_config(src, config)


@click.command("jax")
@_SRC
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="write here (default: stdout)"
)
@_NUMERICS
@_CONFIG
def jax_command(src: str, output: Path | None, numerics: str, config: str | None) -> None:
    """Generate readable JAX source (pure forward/decode functions) for SRC."""
    from linnet.backends.jax.codegen import generate

    source, cfg = resolve(src, config)
    emit_source(generate(source.program(cfg), numerics), output)


@click.command("stablehlo")
@_SRC
@click.option("--entry", required=True, help="the entry point to export: forward, decode, ...")
@click.option(
    "-o", "--output", required=True, type=click.Path(path_type=Path), help="the .mlir to write"
)
@_NUMERICS
@_CONFIG
@click.option(
    "--platforms", default=None, help="comma-separated XLA platforms (default: this machine's)"
)
def stablehlo_command(
    src: str, entry: str, output: Path, numerics: str, config: str | None, platforms: str | None
) -> None:
    """Export one entry of SRC as StableHLO (jax.export): OUTPUT (.mlir text) and the
    serialized export beside it (.exported), which `linnet.jax.load(from_stablehlo=)` runs."""
    from linnet import stablehlo

    source, cfg = resolve(src, config)
    chosen = tuple(platforms.split(",")) if platforms else None
    exported = stablehlo.export_entry(source, cfg, entry, numerics, chosen)
    mlir, serialized = stablehlo.save(exported, output, source, cfg, numerics)
    shapes = ", ".join(a.str_short() for a in exported.in_avals[-3:])
    click.echo(f"wrote {mlir} and {serialized.name}: {entry}(..., {shapes})", err=True)
