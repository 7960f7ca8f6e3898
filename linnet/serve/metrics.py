"""The server's counters, gauges and histograms, written as Prometheus text (format 0.0.4).

Counters and histograms are updated from the HTTP loop and the scheduler thread under one
lock; gauges (queue depth, rows in use) are read from the scheduler when scraped, so they
never drift from what the scheduler holds."""

from __future__ import annotations

import threading
from collections.abc import Callable

# Seconds: from a few milliseconds (a tiny model's step) to a long queue wait.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.count += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        return out + [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}  # (route, status) -> count
        self.finished: dict[str, int] = {}  # finish reason -> count
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.gauges: dict[str, tuple[str, Callable[[], int]]] = {}

    def gauge(self, name: str, help_text: str, read: Callable[[], int]) -> None:
        self.gauges[name] = (help_text, read)

    def request(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1

    def finish(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self.lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.prompt_tokens += prompt_tokens

    def token(self, since_last: float | None, since_submit: float | None) -> None:
        """One generated token: the time since the request's previous token (None for the
        first), or since it was submitted (the first)."""
        with self.lock:
            self.generation_tokens += 1
            if since_submit is not None:
                self.ttft.observe(since_submit)
            if since_last is not None:
                self.itl.observe(since_last)

    def text(self) -> str:
        with self.lock:
            out = _counter(
                "linnet_requests_total",
                "HTTP requests answered, by route and status",
                [(f'route="{r}",status="{s}"', n) for (r, s), n in sorted(self.requests.items())],
            )
            out += _counter(
                "linnet_requests_finished_total",
                "generations ended, by finish reason",
                [(f'reason="{r}"', n) for r, n in sorted(self.finished.items())],
            )
            out += _counter(
                "linnet_prompt_tokens_total",
                "prompt tokens of finished requests",
                [("", self.prompt_tokens)],
            )
            out += _counter(
                "linnet_generation_tokens_total", "tokens generated", [("", self.generation_tokens)]
            )
            out += _histogram(
                "linnet_time_to_first_token_seconds",
                "from submission to the first generated token",
                self.ttft,
            )
            out += _histogram(
                "linnet_inter_token_seconds", "between a request's consecutive tokens", self.itl
            )
        for name, (help_text, read) in self.gauges.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {read()}"]
        return "\n".join(out) + "\n"


def _counter(name: str, help_text: str, samples: list[tuple[str, int]]) -> list[str]:
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
    return out


def _histogram(name: str, help_text: str, hist: Histogram) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *hist.lines(name)]
