"""The server process: a socket bound first, the model loaded in the background (503 until
it is ready), uvicorn serving the app, and SIGTERM as a drain.

    server = Server(lambda: open_engine("smollm2-135m-instruct"), name="smollm2-135m-instruct")
    server.run()          # blocks; SIGTERM or Ctrl-C: stop admitting, finish, exit
    server.start(); server.url; server.stop()   # the same in a background thread
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from linnet.errors import LinnetError
from linnet.serve.app import build_app
from linnet.serve.engine import Engine
from linnet.serve.scheduler import PREFILL_CHUNK
from linnet.serve.state import DEFAULT_MAX_QUEUE, ServerState

log = logging.getLogger("linnet.serve")


class _Uvicorn(uvicorn.Server):
    """uvicorn, with a drain on SIGTERM/SIGINT before its own graceful shutdown (it closes the
    socket and waits for open responses)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if sig in (signal.SIGTERM, signal.SIGINT) and captured and captured[-1] == sig:
            captured.pop()  # drained: exit with 0 rather than re-raise the signal at the end


class Server:
    def __init__(
        self,
        loader: Callable[[], Engine],
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_queue: int = DEFAULT_MAX_QUEUE,
        prefill_chunk: int = PREFILL_CHUNK,
        log_level: str = "warning",
    ):
        self.loader = loader
        self.state = ServerState(name, max_queue=max_queue, chunk=prefill_chunk)
        self.socket = _bind(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            build_app(self.state),
            log_level=log_level,
            lifespan="off",
            timeout_graceful_shutdown=None,
        )
        self.uvicorn = _Uvicorn(config, self.state.drain)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or `stop`), then drain; raises if loading failed."""
        loading = threading.Thread(target=self._load, name="linnet-load", daemon=True)
        loading.start()
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.state.drain()
            if not self.uvicorn.force_exit:  # a second Ctrl-C: leave without waiting
                self.state.close()
            self.socket.close()
        if self.state.phase == "failed":
            raise RuntimeError(f"{self.state.name} failed to load: {self.state.error}")

    def _load(self) -> None:
        try:
            self.state.start(self.loader())
        except Exception as err:  # noqa: BLE001 - reported by /health and at exit
            if not isinstance(err, LinnetError):  # a user's mistake is one line, at exit
                log.exception("loading failed")
            self.state.fail(str(err) or repr(err))
            self.uvicorn.should_exit = True

    def start(self) -> Server:
        """`run` in a background thread (no signal handling there); returns at once."""
        self.thread = threading.Thread(target=self._run_quietly, name="linnet-serve", daemon=True)
        self.thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except RuntimeError:
            pass  # the state says why

    def stop(self, timeout: float | None = 60) -> None:
        """Drain and stop a server `start`ed in the background."""
        self.state.drain()
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)

    def __enter__(self) -> Server:
        return self.start() if self.thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before loading (port 0: a free one, read back)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
