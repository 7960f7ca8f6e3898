"""`linnet torch`: straight-line PyTorch source for a model or a source."""

from __future__ import annotations

import json
from pathlib import Path

import click

from linnet.errors import LinnetError


def resolve_source_and_config(src: str, config: str | None):
    """A `.linnet` source (with --config: JSON file or HF folder), an HF folder, or a zoo
    name (its checkpoint from the HF cache, pulled if need be)."""
    from linnet.source import Source
    from linnet.weights.planning import plan_checkpoint

    path = Path(src)
    if path.suffix != ".linnet" and not path.exists():
        from linnet.targets import resolve_checkpoint

        path = resolve_checkpoint(src)
    if path.suffix == ".linnet":
        source = Source.load(path)
        overrides = {}
        if config is not None:
            overrides = _config_overrides(config)
        return source, source.config(overrides)
    if path.is_dir():
        _, source, cfg, _ = plan_checkpoint(path)
        if config is not None:
            cfg = source.config(dict(cfg, **_config_overrides(config)))
        return source, cfg
    raise LinnetError(f"{src}: expected a .linnet source, a checkpoint folder or a zoo name")


def _config_overrides(config: str) -> dict:
    path = Path(config)
    if path.is_dir():
        from linnet.weights.planning import plan_checkpoint

        return plan_checkpoint(path)[2]
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise LinnetError(f"{config}: not valid JSON: {err}") from None
    raise LinnetError(f"--config {config}: no such JSON file or checkpoint folder")


@click.command("torch")
@click.argument("src")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="write here (default: stdout)"
)
@click.option("--numerics", type=click.Choice(["equivalent", "fast"]), default="equivalent")
@click.option("--config", "config", help="config: a JSON file of source fields or an HF folder")
def torch_command(src: str, output: Path | None, numerics: str, config: str | None) -> None:
    """Generate readable PyTorch source (one nn.Module) for SRC."""
    from linnet.backends.torch.codegen import generate

    source, cfg = resolve_source_and_config(src, config)
    emit_source(generate(source.program(cfg), numerics), output)


def emit_source(text: str, output: Path | None) -> None:
    """Generated code to stdout, or to `output` through a temporary name."""
    if output is None:
        click.echo(text, nl=False)
        return
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    click.echo(f"wrote {output} ({len(text.splitlines())} lines)", err=True)
