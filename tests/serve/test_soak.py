"""A soak: a few hundred requests through `linnet serve` in a process of its own (tiny Llama,
mode generated, 4 rows), streamed and whole, completions and chat, stop strings, and clients
that leave mid-stream; the server's resident memory is sampled as it goes and must stay
flat: after the warm-up, no sample lies more than RSS_BOUND_MIB above the first (allocator
pools and the tokenizer's caches fill during the warm-up). Every request is answered once,
and the rows are all free at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import metric, wait_metric, wait_ready

REQUESTS = 200
WARMUP = 40  # requests before the first RSS sample
IN_FLIGHT = 6  # client threads: more than the rows, so some requests queue
pytestmark = pytest.mark.slow

# growth allowed after the warm-up (measured: 0.2 MiB; with a 200 KB leak per request: 31)
RSS_BOUND_MIB = 8


def start_serve(folder: Path) -> tuple[subprocess.Popen, str]:
    import re

    cmd = [sys.executable, "-m", "linnet", "serve", str(folder), "--port", "0", "--rows", "4",
           "--mode", "generated", "--name", "tiny"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
    assert found, line
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    return proc, found.group(1)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def one_request(client: httpx.Client, k: int) -> str:
    """Request k of a fixed mix; returns how it ended ("done" or "left")."""
    prompt = " ".join(f"w{(k * 7 + i) % 250 + 1}" for i in range(3 + k % 29))
    body = {"model": "tiny", "max_tokens": 4 + k % 7, "temperature": 0}
    if k % 5 == 0:
        body["stop"] = ["w3"]
    if k % 3 == 0:
        route = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        route = "/v1/completions"
        body["prompt"] = prompt
    if k % 2 == 0:
        response = client.post(route, json=body)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
        return "done"
    body["stream"] = True
    with client.stream("POST", route, json=body) as response:
        assert response.status_code == 200
        for n, line in enumerate(response.iter_lines()):
            if k % 7 == 1 and n == 2:
                return "left"  # the client goes away mid-stream
            if line == "data: [DONE]":
                return "done"
    raise AssertionError(f"request {k}: the stream ended without [DONE]")


def test_memory_stays_flat_over_a_soak(tiny_served):
    proc, url = start_serve(tiny_served)
    try:
        wait_ready(url)
        samples = []
        with httpx.Client(base_url=url, timeout=120) as client:

            def run(k: int) -> str:
                ended = one_request(client, k)
                if k >= WARMUP and k % 10 == 0:
                    samples.append(rss_mib(proc.pid))
                return ended

            with ThreadPoolExecutor(IN_FLIGHT) as pool:
                list(pool.map(run, range(WARMUP)))  # the warm-up, then the samples
                samples.append(rss_mib(proc.pid))
                ends = list(pool.map(run, range(WARMUP, REQUESTS)))
        samples.append(rss_mib(proc.pid))
        wait_metric(url, "linnet_rows_in_use", 0)
        finished = sum(
            metric(url, f'linnet_requests_finished_total{{reason="{r}"}}')
            for r in ("stop", "length", "cancelled")
        )
        assert finished == REQUESTS, f"{finished} requests finished of {REQUESTS}"
        assert ends.count("left") > 10
        growth = max(samples) - samples[0]
        assert growth <= RSS_BOUND_MIB, (
            f"RSS grew {growth:.1f} MiB over {REQUESTS - WARMUP} requests: {samples}"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
