"""Continuous batching over a `RowDecoder`'s fixed rows, in a thread of its own.

Each round: waiting requests are admitted into free rows; the prefilling rows, oldest
first, take the next parts of their prompts, one chunk of tokens in all (so neither a long
prompt nor a burst of them stalls the rows that decode for more than a chunk); every
decoding row then advances by one token in a single `step`. (Prefilling several rows in one
call, `prefill_together`, cost more CPU than one row at a time on the 2-core CPU measured:
docs/serve.md.) A request that finished (EOS, a stop string,
`max_tokens`) or was cancelled (its client went away) frees its row in the round it is seen.
Results go back through each job's `notify` (called from this thread) as `Update`s.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from linnet.serve.metrics import Metrics
from linnet.serve.protocol import ApiError
from linnet.serve.sampling import Sampler
from linnet.serve.textout import TextOut

log = logging.getLogger("linnet.serve")

PREFILL_CHUNK = 256  # prompt tokens a row prefills per round


@dataclass
class Update:
    """What a job's client gets: new text, and at the end a finish reason (or an error)."""

    text: str = ""
    finish_reason: str | None = None  # "stop" or "length" on the last update
    completion_tokens: int = 0
    error: str | None = None


@dataclass(eq=False)
class Job:
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    text: TextOut
    eos: frozenset[int]
    notify: Callable[[Update], None]
    row: int | None = None
    fed: int = 0  # prompt tokens already in the row
    part: list[int] = field(default_factory=list)  # the prompt tokens fed this round
    pending: int | None = None  # the last token drawn, fed at the next step
    generated: int = 0
    cancelled: bool = False
    done: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    last_token: float | None = None

    def cancel(self) -> None:
        """Called from any thread: the scheduler frees the row at its next round."""
        self.cancelled = True


class Scheduler:
    def __init__(self, rows, metrics: Metrics, *, max_queue: int, chunk: int = PREFILL_CHUNK):
        self.rows = rows
        self.metrics = metrics
        self.max_queue = max_queue
        self.chunk = chunk
        # a heap: the lowest free row first, so the rows in use stay at the front and a
        # step computes only up to the last of them (linnet/rows.py)
        self.free_rows = list(range(rows.rows))
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        self.decoding: list[Job] = []
        self.cond = threading.Condition()
        self.admitting = True
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="linnet-scheduler", daemon=True)

    # -- from the HTTP side ------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.cond:
            if not self.admitting:
                raise ApiError(503, "the server is shutting down")
            # the free rows take the first waiting jobs at the next round: they do not queue
            if len(self.waiting) >= self.max_queue + len(self.free_rows):
                raise ApiError(
                    429,
                    f"every row is busy and {self.max_queue} requests already wait for one; "
                    "retry later",
                    code="queue_full",
                )
            self.waiting.append(job)
            self.cond.notify()

    def stop_admitting(self) -> None:
        with self.cond:
            self.admitting = False

    def close(self, timeout: float | None = None) -> None:
        """Finish every admitted job, then end the thread."""
        with self.cond:
            self.admitting = False
            self.stopping = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def queue_depth(self) -> int:
        return len(self.waiting)

    def rows_in_use(self) -> int:
        return self.rows.rows - len(self.free_rows)

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while self._round():
            pass

    def _round(self) -> bool:
        with self.cond:
            while not self._busy() and not self.stopping:
                self.cond.wait()
            if self.stopping and not self._busy():
                return False
            self._admit()
        self._drop_cancelled()
        self._guarded(self._this_round(), self._prefill)
        self._guarded(list(self.decoding), self._step)
        return True

    def _busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def _admit(self) -> None:
        while self.waiting and self.free_rows:
            job = self.waiting.popleft()
            if job.cancelled:
                job.done = True
                continue
            job.row = heapq.heappop(self.free_rows)
            self.prefilling.append(job)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.prefilling + self.decoding if j.cancelled]:
            self.metrics.finish("cancelled", len(job.prompt), job.generated)
            self._release(job)

    def _guarded(self, jobs: list[Job], run: Callable[[list[Job]], None]) -> None:
        """Run one phase; if the model fails, its jobs end with the error (the server
        stays up for the others)."""
        if not jobs:
            return
        try:
            run(jobs)
        except Exception as err:  # noqa: BLE001 - reported to each client, logged once
            log.exception("decoding failed")
            for job in jobs:
                if not job.done:
                    job.notify(Update(error=f"decoding failed: {err}"))
                    self._release(job)

    def _this_round(self) -> list[Job]:
        """The prefilling jobs this round feeds, oldest first, and their parts (`job.part`):
        one chunk of prompt tokens in all, so the decoding rows step after every chunk (a
        burst of long prompts delays them by one chunk a round, not by a chunk per prompt)."""
        budget, jobs = self.chunk, []
        for job in self.prefilling:
            if budget == 0:
                break
            job.part = job.prompt[job.fed : job.fed + budget]
            budget -= len(job.part)
            jobs.append(job)
        return jobs

    def _prefill(self, jobs: list[Job]) -> None:
        for job in jobs:
            logits = self.rows.prefill(job.row, job.part)
            job.fed += len(job.part)
            if job.fed == len(job.prompt):
                self.prefilling.remove(job)
                self.decoding.append(job)
                self._take(job, job.sampler(logits))

    def _step(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if not j.done and j.pending is not None]
        if not jobs:
            return
        logits = self.rows.step([j.row for j in jobs], [j.pending for j in jobs])
        for job, row_logits in zip(jobs, logits):
            self._take(job, job.sampler(row_logits))

    def _take(self, job: Job, token: int) -> None:
        """One drawn token: count it, release its text, end the job when it should end."""
        now = time.perf_counter()
        first = job.last_token is None
        self.metrics.token(None if first else now - job.last_token, job_wait(job, now, first))
        job.last_token = now
        job.generated += 1
        finish = None
        if token in job.eos:  # counted, never shown
            finish = "stop"
            text = job.text.flush()
        else:
            text = job.text.add(token)
            if job.text.stopped:
                finish = "stop"
            elif job.generated >= job.max_tokens or self._row_full(job):
                finish = "length"
                text += job.text.flush()
        job.pending = token
        job.notify(Update(text, finish, job.generated))
        if finish is not None:
            self.metrics.finish(finish, len(job.prompt), job.generated)
            self._release(job)

    def _row_full(self, job: Job) -> bool:
        return self.rows.length(job.row) >= self.rows.positions

    def _release(self, job: Job) -> None:
        job.done = True
        for phase in (self.prefilling, self.decoding):
            if job in phase:
                phase.remove(job)
        if job.row is not None:
            self.rows.free(job.row)
            heapq.heappush(self.free_rows, job.row)
            job.row = None


def job_wait(job: Job, now: float, first: bool) -> float | None:
    return now - job.submitted if first else None
