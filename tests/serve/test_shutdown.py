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

# (prompt, max_tokens): the first holds the one row for 100 tokens (no EOS before), long
# enough for the others to queue behind it
PROMPTS = [("w62", 100), ("w66", 10), ("w67 w68", 10)]


def start_serve(folder) -> tuple[subprocess.Popen, str]:
    """`python -m linnet serve FOLDER --port 0 --rows 1`, and its URL (from its first line),
    at a lower CPU priority than the test (`nice -n 5`, which execs it: the PID signalled
    is the server's). The test polls /metrics every 20 ms to see the first request
    decoding. Once, in a full suite on 2 cores (2026-12-04), it waited 30 s for a row in
    use it never saw, after the request's 200: most likely the server, at the test's own
    priority, decoded all 100 tokens between two polls. Not reproduced alone or beside two
    CPU burners (4 runs); with the server niced it passes beside them in 10-17 s."""
    proc = subprocess.Popen(
        [
            "nice",
            "-n",
            "5",
            sys.executable,
            "-m",
            "linnet",
            "serve",
            str(folder),
            "--port",
            "0",
            "--rows",
            "1",
            "--threads",
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


def stream_text(client, prompt: str, max_tokens: int, firsts: list) -> tuple[str, str | None]:
    """A streamed completion's text and finish reason; the time of its first chunk."""
    parts, reason = [], None
    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    )
    for chunk in stream:
        if not parts:
            firsts.append(time.monotonic())
        parts.append(chunk.choices[0].text)
        reason = chunk.choices[0].finish_reason or reason
    return "".join(parts), reason


def test_sigterm_drains_then_exits(tiny_served, tokenizer):
    import openai

    want = [
        greedy_answer(tiny_served, tokenizer, tokenizer(prompt)["input_ids"], n)
        for prompt, n in PROMPTS
    ]
    assert want[0][1] == 100  # the first holds its row for all its tokens
    want = [(text, reason) for text, _, reason in want]
    proc, url = start_serve(tiny_served)
    try:
        wait_ready(url)
        results, firsts = [None] * len(PROMPTS), []
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=60)

        def run(i):
            results[i] = stream_text(client, *PROMPTS[i], firsts)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        threads[0].start()
        wait_metric(url, "linnet_rows_in_use", 1)
        for t in threads[1:]:
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
    from linnet.serve.hosting import Server

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


def test_drain_refuses_new_requests_and_finishes_admitted_ones(tiny_served):
    """What SIGTERM does, called directly: with one request decoding (its steps held) and one
    queued, `drain` makes new requests 503 and /health `draining`; released, both admitted
    requests are answered in full."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from linnet.serve.engine import open_engine
    from linnet.serve.hosting import Server
    from tests.serve.conftest import Gate

    gate = {}

    def load():
        engine = open_engine(str(tiny_served), rows=1, name="tiny", mode="interpret")
        engine.rows = gate["rows"] = Gate(engine.rows)
        return engine

    with Server(load, name="tiny", port=0) as server:
        wait_ready(server.url)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=60)
        ask = dict(model="tiny", max_tokens=5, temperature=0)
        with ThreadPoolExecutor(2) as pool, gate["rows"].held():
            first = pool.submit(client.completions.create, prompt="w70", **ask)
            wait_metric(server.url, "linnet_rows_in_use", 1)
            queued = pool.submit(client.completions.create, prompt="w71", **ask)
            wait_metric(server.url, "linnet_queue_depth", 1)
            server.state.drain()
            refused = httpx.post(server.url + "/v1/completions", json={**ask, "prompt": "w72"})
            health = httpx.get(server.url + "/health")
        answers = [first.result(), queued.result()]
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert health.status_code == 503 and health.json() == {"status": "draining"}
    assert all(a.choices[0].finish_reason and a.usage.completion_tokens for a in answers)


def test_a_checkpoint_that_does_not_load_exits_1_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "linnet", "serve", str(tmp_path / "missing"), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"error: {tmp_path / 'missing'} failed to load" in done.stderr
