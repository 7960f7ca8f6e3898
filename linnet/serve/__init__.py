"""linnet.serve: an OpenAI-compatible server with continuous batching over fixed cache rows
(docs/serve.md).

    import linnet.serve
    linnet.serve.serve("smollm2-135m-instruct", rows=8, port=8000)   # blocks; SIGTERM drains

    with linnet.serve.start("./my-checkpoint", rows=4, port=0) as server:  # in the background
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")

Pieces: `serial_rows` (the row-decoding contract and its exact fallback), `scheduler` (the
batching loop), `sampling`, `textout` (stop strings, streamed text), `protocol` (request
checks, OpenAI errors), `responses`, `metrics` (Prometheus text), `app` (routes), `hosting`
(uvicorn, loading, drain).
"""

from __future__ import annotations


def server(
    target: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str | None = None,
    max_queue: int = 256,
    prefill_chunk: int = 256,
    log_level: str = "warning",
    **load,
):
    """A `Server` for `target` (a zoo name, an HF repo id, a folder or a .gguf); `load`:
    `open_engine`'s options (rows, positions, threads, backend, mode, dtype, checkpoint,
    revision).
    `max_queue`: requests that may wait while every row is busy (one more gets 429);
    `prefill_chunk`: prompt tokens a row prefills per round.
    The model loads when it starts; until then every request gets 503."""
    from linnet.serve.engine import open_engine
    from linnet.serve.hosting import Server

    name = name or target
    return Server(
        lambda: open_engine(target, name=name, **load),
        name=name,
        host=host,
        port=port,
        max_queue=max_queue,
        prefill_chunk=prefill_chunk,
        log_level=log_level,
    )


def serve(target: str, **options) -> None:
    """Serve `target` until SIGTERM or Ctrl-C (then drain and return); see `server`.
    `tensor_parallel=N` inside torchrun: rank 0 serves, the others follow (docs/parallel.md)."""
    if options.get("tensor_parallel") and options.get("backend") != "jax":  # JAX: one process
        from linnet.shard.tp_rows import serve_tensor_parallel

        return serve_tensor_parallel(target, **options)
    server(target, **options).run()


def start(target: str, **options):
    """A server running in a background thread (a context manager: `stop` drains it)."""
    return server(target, **options).start()
