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
@click.option(
    "--dtype",
    default=None,
    help="f32, bf16 or f16 (default: the checkpoint's; f32 for a bf16/f16 checkpoint "
    "on PyTorch where the CPU has no bf16/f16 dot product)",
)
@BACKEND_OPTION
@MODE_OPTION
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--name", default=None, help="the model's name in requests [default: NAME_OR_PATH]")
@_CHECKPOINT
@_REVISION
@click.option(
    "--tensor-parallel",
    type=click.IntRange(1),
    default=None,
    help="split the model over N torchrun ranks: rank 0 serves, the others follow",
)
def serve(
    target, rows, positions, max_queue, threads, dtype, backend, mode, host, port, name,
    checkpoint, revision, tensor_parallel,
) -> None:  # fmt: skip
    """Serve a model over the OpenAI API (completions, chat, streaming) until SIGTERM."""
    import linnet.serve

    if mode is not None and backend != "torch":
        raise click.UsageError(f"--mode {mode} is PyTorch's; --backend {backend} has one mode")
    if tensor_parallel is not None and backend != "jax":  # JAX: one process over a mesh
        options = dict(rows=rows, positions=positions, max_queue=max_queue, threads=threads,
                       dtype=dtype,
                       backend=backend, mode=mode, host=host, port=port, name=name,
                       checkpoint=checkpoint, revision=revision)  # fmt: skip
        _serve_tensor_parallel(target, tensor_parallel, options)
        return
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
            tensor_parallel=tensor_parallel,
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


def _serve_tensor_parallel(target: str, world: int, options: dict) -> None:
    """Under torchrun: rank 0 serves, the other ranks follow (docs/parallel.md)."""
    from linnet.shard.layout import ShardingError
    from linnet.shard.tp_rows import TensorParallelError, serve_tensor_parallel

    if options["backend"] != "torch":
        raise click.UsageError("--tensor-parallel runs on --backend torch (under torchrun)")
    try:
        serve_tensor_parallel(target, tensor_parallel=world, log_level="info", **options)
    except ShardingError as err:
        raise click.UsageError(str(err)) from None
    except OSError as err:
        click.echo(f"error: cannot listen: {err.strerror or err}", err=True)
        sys.exit(1)
    except (TensorParallelError, RuntimeError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
