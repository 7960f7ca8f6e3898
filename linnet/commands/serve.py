"""`linnet serve NAME_OR_PATH`: an OpenAI-compatible HTTP server (docs/serve.md)."""

from __future__ import annotations

import sys

import click

from linnet.commands.run import _CHECKPOINT, _REVISION, _TARGET
from linnet.commands.session import BACKEND_OPTION, MODE_OPTION


@click.command()
@_TARGET
@click.option(
    "--rows",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="cache rows: requests decoded together",
)
@click.option(
    "--positions",
    type=click.IntRange(2),
    default=None,
    help="tokens a row holds, prompt and answer [default: the context, at most 4096]",
)
@click.option(
    "--max-queue",
    type=click.IntRange(0),
    default=256,
    show_default=True,
    help="requests that may wait while every row is busy; one more gets 429",
)
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=None,
    help="torch's intra-op threads (torch.set_num_threads) [default: torch's, one per core]",
)
@click.option("--dtype", default=None, help="f32, bf16 or f16 (default: the checkpoint's)")
@BACKEND_OPTION
@MODE_OPTION
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--name", default=None, help="the model's name in requests [default: NAME_OR_PATH]")
@_CHECKPOINT
@_REVISION
def serve(
    target,
    rows,
    positions,
    max_queue,
    threads,
    dtype,
    backend,
    mode,
    host,
    port,
    name,
    checkpoint,
    revision,
) -> None:
    """Serve a model over the OpenAI API (completions, chat, streaming) until SIGTERM."""
    import linnet.serve

    if mode is not None and backend != "torch":
        raise click.UsageError(f"--mode {mode} is PyTorch's; --backend {backend} has one mode")
    try:
        server = linnet.serve.server(
            target,
            host=host,
            port=port,
            name=name,
            max_queue=max_queue,
            log_level="info",
            rows=rows,
            positions=positions,
            threads=threads,
            backend=backend,
            mode=mode,
            dtype=dtype,
            checkpoint=checkpoint,
            revision=revision,
        )
    except OSError as err:
        click.echo(f"error: cannot listen on {host}:{port}: {err.strerror or err}", err=True)
        sys.exit(1)
    click.echo(f"linnet serve: {server.url}/v1 (loading {target})", err=True)
    try:
        server.run()
    except RuntimeError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
