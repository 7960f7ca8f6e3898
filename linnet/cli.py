"""The `linnet` command.

Every user mistake ends as a message on stderr and a non-zero exit code:
1 for a source or checkpoint that does not pass, 2 for usage errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from linnet.errors import LinnetError, SourceError


def _fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turns Linnet's own errors into a message and exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SourceError as err:
            click.echo(str(err), err=True)
            sys.exit(1)
        except LinnetError as err:
            _fail(str(err))


@click.group(cls=_Group)
@click.version_option(package_name="linnet")
def main() -> None:
    """Linnet: check model sources, load checkpoints, verify parity, export."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def check(paths: tuple[Path, ...]) -> None:
    """Check .linnet sources (files or folders) before any weight is touched."""
    from linnet.source import Source

    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.rglob("*.linnet"))
        elif p.exists():
            files.append(p)
        else:
            _fail(f"{p}: no such file or folder", 2)
    if not files:
        _fail(f"no .linnet sources under {', '.join(map(str, paths))}", 2)
    errors = 0
    for f in files:
        try:
            Source.load(f)
        except SourceError as err:
            errors += len(err.diagnostics)
            click.echo(str(err) + "\n", err=True)
        except (OSError, UnicodeDecodeError) as err:
            errors += 1
            click.echo(f"{f}: error: cannot read the source: {err}\n", err=True)
    if errors:
        click.echo(
            f"{errors} error{'s' if errors > 1 else ''} in {len(files)} "
            f"source{'s' if len(files) > 1 else ''}",
            err=True,
        )
        sys.exit(1)
    click.echo(f"checked {len(files)} source{'s' if len(files) > 1 else ''}: no errors")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--dtype", default=None, help="f32, bf16 or f16 (default: the checkpoint's)")
def plan(path: Path, dtype: str | None) -> None:
    """Show how a checkpoint's tensors map onto its source, reading headers only."""
    if path.suffix == ".gguf":  # a GGUF file: its metadata and tensor infos
        from linnet.weights.gguf_reader import plan_text

        click.echo(plan_text(path))
        return
    from linnet.weights.planning import plan_checkpoint

    result = plan_checkpoint(path, dtype=dtype)[0]
    click.echo(result.format())
    if result.problems:
        click.echo(f"\n{len(result.problems)} problem(s):", err=True)
        for problem in result.problems:
            click.echo(f"  {problem}", err=True)
        _fail(f"{path}: {len(result.problems)} problem(s), the first: {result.problems[0]}")


# Commands defined in their own modules (linnet/commands/*.py) register here, one line each.
# -- command registrations --
from linnet.commands.codegen import torch_command  # noqa: E402

main.add_command(torch_command)
from linnet.commands.chat import chat as chat_command  # noqa: E402
from linnet.commands.run import parity as parity_command  # noqa: E402
from linnet.commands.run import run as run_command  # noqa: E402
from linnet.commands.zoo import zoo as zoo_group  # noqa: E402

main.add_command(zoo_group)
main.add_command(run_command)
main.add_command(chat_command)
main.add_command(parity_command)
from linnet.commands.export import export as export_group  # noqa: E402
from linnet.commands.export import push as push_command  # noqa: E402

main.add_command(export_group)
main.add_command(push_command)

from linnet.commands.jax import jax_command, stablehlo_command  # noqa: E402

main.add_command(jax_command)
main.add_command(stablehlo_command)
from linnet.commands.train import train as train_group  # noqa: E402

main.add_command(train_group)
from linnet.commands.serve import serve as serve_command  # noqa: E402

main.add_command(serve_command)
from linnet.commands.transcribe import transcribe as transcribe_command  # noqa: E402

main.add_command(transcribe_command)

from linnet.site.command import site as site_group  # noqa: E402

main.add_command(site_group)


if __name__ == "__main__":
    main()
