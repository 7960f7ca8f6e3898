"""`linnet serve` as a user runs it, in a process of its own: SIGTERM stops admitting, lets
every request already in flight finish in full, then the process exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.serve.conftest import greedy_answer, metric, wait_metric, wait_ready

PROMPTS = ["w60 w61", "w62", "w63 w64 w65"]
MAX_TOKENS = 30


def start_serve(folder) -> tuple[subprocess.Popen, str]:
    """`python -m linnet serve FOLDER --port 0 --rows 1`, and its URL (from its first line)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "linnet",
            "serve",
            str(folder),
            "--port",
            "0",
            "--rows",
            "1",
            "--mode",
            "interpret",
            "--name",
            "tiny",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stderr.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
    assert found, line
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    return proc, found.group(1)


def stream_text(url: str, prompt: str, firsts: list) -> tuple[str, str | None]:
    """A streamed completion's text and finish reason; the time of its first chunk."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    parts, reason = [], None
    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    for chunk in stream:
        if not parts:
            firsts.append(time.monotonic())
        parts.append(chunk.choices[0].text)
        reason = chunk.choices[0].finish_reason or reason
    return "".join(parts), reason


def test_sigterm_drains_then_exits(tiny_served, tokenizer):
    want = [
        greedy_answer(tiny_served, tokenizer, tokenizer(prompt)["input_ids"], MAX_TOKENS)
        for prompt in PROMPTS
    ]
    want = [(text, reason) for text, _, reason in want]
    proc, url = start_serve(tiny_served)
    try:
        wait_ready(url)
        results, firsts = [None] * len(PROMPTS), []

        def run(i):
            results[i] = stream_text(url, PROMPTS[i], firsts)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        wait_metric(url, "linnet_queue_depth", len(PROMPTS) - 1)  # one decodes, two wait
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        refused = _new_request_refused(url)
        for t in threads:
            t.join(120)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert refused
    # every request admitted before the signal got its whole answer...
    assert results == want
    # ...including some that had not started when it came: the drain was exercised
    assert max(firsts) > signalled


def _new_request_refused(url: str) -> bool:
    """After SIGTERM a new request is refused: 503 while the socket is still open, then no
    connection at all."""
    try:
        response = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "w1"})
    except httpx.TransportError:
        return True
    return response.status_code == 503 and "shutting down" in response.json()["error"]["message"]


def test_metrics_before_anything_loads_read_zero(tiny_served):
    """/metrics answers while loading; its gauges read 0 (not absent) until the rows exist."""
    from linnet.serve.server import Server

    gate = threading.Event()
    server = Server(lambda: (gate.wait(60), None)[1], name="tiny", port=0)
    server.start()
    try:
        text = httpx.get(server.url + "/metrics").text
        assert "\nlinnet_rows_in_use 0\n" in text and "\nlinnet_queue_depth 0\n" in text
        assert metric(server.url, "linnet_generation_tokens_total") == 0
    finally:
        gate.set()
        server.stop()
