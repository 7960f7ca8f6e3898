"""`linnet serve --tensor-parallel N` under torchrun: rank 0 serves, the other ranks follow.

    torchrun --nproc-per-node 2 -m linnet serve CHECKPOINT --tensor-parallel 2

Every rank loads its share of the model (`linnet.torch.load(..., tensor_parallel=N)`) and
builds the same rows (`RowDecoder`) over it. Rank 0 runs the HTTP server, whose rows are a
`MirroredRows`: each call that changes the rows (prefill, step, free, whatever the scheduler
calls) is first broadcast (its name and small arguments), then run locally; the other ranks
run `follow`, which receives each call and runs it on their own rows, so every rank issues
the same collectives in the same order. Shutdown (SIGTERM, drained) broadcasts a stop.

The calls travel on a group of their own whose timeout is long (an idle server sends
nothing for hours); the model's all-reduces keep `LINNET_TP_TIMEOUT`, so a rank that dies
ends the others' next decode with an error, and rank 0 then stops serving and exits 1.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from linnet.errors import LinnetError
from linnet.shard.layout import ShardingError

log = logging.getLogger("linnet.serve")

# what only reads the rows: answered locally, never broadcast
LOCAL_READS = frozenset({"length"})
STOP = "__stop__"
IDLE_TIMEOUT = timedelta(days=30)  # followers wait this long for the next request


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel server is gone (or a collective failed)."""


def calls_group():
    """The group calls are broadcast on (every rank must create it, in the same order)."""
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


class MirroredRows:
    """Rank 0's rows: each call is broadcast to the followers, then run on this rank's rows.
    After a failed collective every call raises the same `TensorParallelError`."""

    def __init__(self, inner, group, on_failure: Callable[[str], None] | None = None):
        self.inner, self.group, self.on_failure = inner, group, on_failure
        self.rows, self.positions = inner.rows, inner.positions
        self.failed: str | None = None
        self.stopped = False
        self._lock = threading.Lock()  # one call at a time: the ranks' order must match

    def __getattr__(self, name: str):
        found = getattr(self.inner, name)
        if name.startswith("_") or name in LOCAL_READS or not callable(found):
            return found
        return lambda *args, **kwargs: self.call(name, args, kwargs)

    def call(self, name: str, args: tuple, kwargs: dict):
        with self._lock:
            if self.failed or self.stopped:
                raise TensorParallelError(self.failed or "the tensor-parallel rows have stopped")
            try:
                send_call(self.group, (name, args, kwargs))
                return getattr(self.inner, name)(*args, **kwargs)
            except LinnetError:
                raise  # a refused call (the followers refuse it alike, before any collective)
            except Exception as err:  # noqa: BLE001 - a collective failed: a rank is gone
                self._fail(f"{name}: {type(err).__name__}: {err}")
                raise TensorParallelError(self.failed) from err

    def stop(self) -> None:
        """Tell the followers to return (once; not after a failure, nobody would listen)."""
        with self._lock:
            if self.failed is None and not self.stopped:
                send_call(self.group, (STOP, (), {}))
            self.stopped = True

    def _fail(self, what: str) -> None:
        self.failed = (
            f"tensor parallel: a rank stopped answering ({what}); "
            "the server cannot decode without every rank"
        )
        log.error("%s", self.failed)
        if self.on_failure is not None:
            self.on_failure(self.failed)


def send_call(group, call: tuple) -> None:
    dist.broadcast_object_list([call], src=0, group=group)


def receive_call(group) -> tuple:
    box = [None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def follow(rows, group) -> int:
    """A follower's loop: run each call rank 0 broadcasts on `rows` until the stop; the
    number of calls run. A call the rows refuse (`LinnetError`) was refused on rank 0 too."""
    count = 0
    while True:
        name, args, kwargs = receive_call(group)
        if name == STOP:
            return count
        try:
            getattr(rows, name)(*args, **kwargs)
        except LinnetError:
            pass
        count += 1


def serve_tensor_parallel(target: str, *, tensor_parallel: int, **options) -> None:
    """`linnet.serve.serve(target, tensor_parallel=N, ...)` inside a torchrun process: rank 0
    serves until SIGTERM, the other ranks follow; returns when rank 0 has stopped.
    Raises `TensorParallelError` on rank 0 when a rank died while serving."""
    rank = require_launch(tensor_parallel)
    if rank == 0:
        _lead(target, tensor_parallel, options)
    else:
        _follow(target, tensor_parallel, options)


def require_launch(world: int) -> int:
    """This process's rank under torchrun (checked before anything loads)."""
    if "RANK" not in os.environ:
        raise ShardingError(
            f"tensor_parallel={world} needs one process per rank: launch with "
            f"`torchrun --nproc-per-node {world} -m linnet serve ... --tensor-parallel {world}`"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) != world:
        raise ShardingError(
            f"tensor_parallel={world} but torchrun started {os.environ.get('WORLD_SIZE')} ranks"
        )
    return int(os.environ["RANK"])


def _split_options(options: dict) -> tuple[dict, dict]:
    """(the server's options, open_engine's)."""
    server_keys = {"host", "port", "name", "max_queue", "prefill_chunk", "log_level"}
    server = {k: v for k, v in options.items() if k in server_keys}
    return server, {k: v for k, v in options.items() if k not in server_keys}


def _open_rows(target: str, world: int, load: dict):
    from linnet.serve.engine import open_engine

    engine = open_engine(target, tensor_parallel=world, **load)
    return engine, calls_group()


def _lead(target: str, world: int, options: dict) -> None:
    from linnet.serve.hosting import Server

    server_options, load = _split_options(options)
    server_options.setdefault("name", target)
    mirrored: list[MirroredRows] = []

    def on_failure(_: str) -> None:
        server.uvicorn.should_exit = True  # stop serving: drain refuses, requests end

    def loader():
        engine, group = _open_rows(target, world, {"name": server_options["name"], **load})
        engine.rows = MirroredRows(engine.rows, group, on_failure)
        mirrored.append(engine.rows)
        return engine

    server = Server(loader, **server_options)
    print(f"linnet serve: {server.url}/v1 (tensor parallel {world}, loading {target})",
          file=sys.stderr)  # fmt: skip
    try:
        server.run()
    finally:
        for rows in mirrored:
            rows.stop()
    if mirrored and mirrored[0].failed:
        raise TensorParallelError(mirrored[0].failed)


def _follow(target: str, world: int, options: dict) -> None:
    _, load = _split_options(options)
    # torchrun passes Ctrl-C / SIGTERM to every rank: rank 0 drains, then sends the stop
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: log.info("follower: waiting for rank 0 to stop"))
    engine, group = _open_rows(target, world, load)
    follow(engine.rows, group)
