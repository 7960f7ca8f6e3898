"""The server's phase (loading, ready, draining, failed) and what serves once loaded."""

from __future__ import annotations

import time

from linnet.serve.engine import Engine
from linnet.serve.metrics import Metrics
from linnet.serve.protocol import ApiError
from linnet.serve.scheduler import PREFILL_CHUNK, Scheduler

DEFAULT_MAX_QUEUE = 256  # requests waiting while every row is busy; one more gets 429


class ServerState:
    def __init__(
        self, name: str, *, max_queue: int = DEFAULT_MAX_QUEUE, chunk: int = PREFILL_CHUNK
    ):
        self.name = name
        self.created = int(time.time())
        self.max_queue = max_queue
        self.chunk = chunk
        self.phase = "loading"
        self.error: str | None = None
        self.engine: Engine | None = None
        self.scheduler: Scheduler | None = None
        self.metrics = Metrics()
        self.metrics.gauge(
            "linnet_queue_depth", "requests waiting for a row", lambda: self._read("queue_depth")
        )
        self.metrics.gauge(
            "linnet_rows_in_use", "cache rows holding a request", lambda: self._read("rows_in_use")
        )
        self.metrics.gauge(
            "linnet_rows", "cache rows", lambda: self.engine.rows.rows if self.engine else 0
        )

    def _read(self, gauge: str) -> int:
        return getattr(self.scheduler, gauge)() if self.scheduler else 0

    def start(self, engine: Engine) -> None:
        """The engine loaded: start its scheduler and take requests (unless a drain began)."""
        scheduler = Scheduler(engine.rows, self.metrics, max_queue=self.max_queue, chunk=self.chunk)
        scheduler.start()
        self.engine, self.scheduler = engine, scheduler
        if self.phase == "loading":
            self.phase = "ready"
        else:
            scheduler.stop_admitting()

    def fail(self, error: str) -> None:
        self.phase, self.error = "failed", error

    def drain(self) -> None:
        """Stop taking requests; what was admitted runs to its end."""
        if self.phase in ("loading", "ready"):
            self.phase = "draining"
        if self.scheduler is not None:
            self.scheduler.stop_admitting()

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    def ready(self) -> tuple[Engine, Scheduler]:
        if self.phase == "ready":
            return self.engine, self.scheduler
        why = {
            "loading": f"{self.name} is loading; retry shortly",
            "draining": "the server is shutting down",
            "failed": f"{self.name} failed to load: {self.error}",
        }[self.phase]
        raise ApiError(503, why)
