"""Every bad request gets its status and OpenAI's JSON error; a full queue answers 429; a
server still loading answers 503; a client that goes away frees its row."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve.conftest import MAX_QUEUE, MODEL, ROWS, metric, wait_metric, wait_ready

OK = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}

# (route, body (bytes are sent as they are), status, the field the error names or None)
BAD = {
    "malformed JSON": ("completions", b'{"model": ', 400, None),
    "NaN is not JSON": (
        "completions",
        b'{"model": "tiny-llama", "prompt": "w1", "top_p": NaN}',
        400,
        None,
    ),
    "not an object": ("completions", [OK], 400, None),
    "no model": ("completions", {"prompt": "w1"}, 400, "model"),
    "unknown model": ("completions", {**OK, "model": "gpt-4"}, 404, "model"),
    "n > 1": ("completions", {**OK, "n": 2}, 400, "n"),
    "best_of": ("completions", {**OK, "best_of": 3}, 400, "best_of"),
    "echo": ("completions", {**OK, "echo": True}, 400, "echo"),
    "logprobs": ("chat", {**CHAT, "logprobs": True}, 400, "logprobs"),
    "tools": ("chat", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    "unknown field": ("completions", {**OK, "frobnicate": 1}, 400, "frobnicate"),
    "penalty": ("chat", {**CHAT, "presence_penalty": 0.5}, 400, "presence_penalty"),
    "temperature too high": ("completions", {**OK, "temperature": 2.5}, 400, "temperature"),
    "temperature a string": ("completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    "top_p 0": ("completions", {**OK, "top_p": 0}, 400, "top_p"),
    "top_k not an int": ("completions", {**OK, "top_k": 1.5}, 400, "top_k"),
    "seed a float": ("completions", {**OK, "seed": 1.5}, 400, "seed"),
    "max_tokens 0": ("completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens true": ("completions", {**OK, "max_tokens": True}, 400, "max_tokens"),
    "five stops": ("completions", {**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    "empty stop": ("completions", {**OK, "stop": [""]}, 400, "stop"),
    "stream a string": ("completions", {**OK, "stream": "yes"}, 400, "stream"),
    "ignore_eos a number": ("completions", {**OK, "ignore_eos": 1}, 400, "ignore_eos"),
    "stream_options alone": (
        "completions",
        {**OK, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    "two prompts": ("completions", {**OK, "prompt": ["w1", "w2"]}, 400, "prompt"),
    "empty prompt": ("completions", {**OK, "prompt": ""}, 400, "prompt"),
    "prompt a number": ("completions", {**OK, "prompt": 7}, 400, "prompt"),
    "id past the vocab": ("completions", {**OK, "prompt": [1, 256]}, 400, "prompt"),
    "negative id": ("completions", {**OK, "prompt": [1, -1]}, 400, "prompt"),
    "prompt longer than a row": ("completions", {**OK, "prompt": [5] * 128}, 400, "prompt"),
    "prompt and max_tokens past a row": (
        "completions",
        {**OK, "prompt": [5] * 100, "max_tokens": 29},
        400,
        "max_tokens",
    ),
    "no messages": ("chat", {**CHAT, "messages": []}, 400, "messages"),
    "message without role": (
        "chat",
        {**CHAT, "messages": [{"content": "w1"}]},
        400,
        "messages[0]",
    ),
    "image content": (
        "chat",
        {
            **CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ],
        },
        400,
        "messages[0]",
    ),
    "tool role": (
        "chat",
        {**CHAT, "messages": [{"role": "tool", "content": "w1"}]},
        400,
        "messages[0]",
    ),
    "chat prompt longer than a row": (
        "chat",
        {**CHAT, "messages": [{"role": "user", "content": " ".join(["w5"] * 130)}]},
        400,
        "messages",
    ),
}


def post(url: str, route: str, body) -> httpx.Response:
    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    return httpx.post(url + path, json=body)


def assert_openai_error(response: httpx.Response, status: int, param=None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param, error
    return error


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request(served, case):
    route, body, status, param = BAD[case]
    assert_openai_error(post(served.url, route, body), status, param)


def test_the_same_requests_made_valid_pass(served):
    """The control: the bodies the bad cases start from are answered."""
    for route, body in (("completions", OK), ("chat", CHAT)):
        assert post(served.url, route, body).status_code == 200


def test_openai_client_sees_the_errors(client):
    import openai

    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="w1", n=2)
    assert bad.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "w1"}])


def test_routes_and_methods(served):
    assert_openai_error(httpx.get(served.url + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(served.url + "/v1/completions"), 405)
    models = httpx.get(served.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL] and models["object"] == "list"
    assert httpx.get(served.url + "/health").json() == {"status": "ready"}


def test_full_queue_answers_429_and_every_admitted_request_finishes(served, client):
    """Steps held: one request holds a row and the scheduler (its step waits); the other rows
    are free, so ROWS - 1 + MAX_QUEUE more may wait; one more is refused with 429. Released,
    every admitted one is answered."""
    ask = dict(model=MODEL, max_tokens=3, temperature=0)
    waiting = ROWS - 1 + MAX_QUEUE
    with ThreadPoolExecutor(1 + waiting) as pool:
        with served.rows.held():
            futures = [pool.submit(client.completions.create, prompt="w30", **ask)]
            wait_metric(served.url, "linnet_rows_in_use", 1)
            futures += [
                pool.submit(client.completions.create, prompt=f"w{31 + i}", **ask)
                for i in range(waiting)
            ]
            wait_metric(served.url, "linnet_queue_depth", waiting)
            error = assert_openai_error(post(served.url, "completions", OK), 429)
            assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        answers = [f.result() for f in futures]
    assert all(a.usage.completion_tokens >= 1 and a.choices[0].finish_reason for a in answers)
    wait_metric(served.url, "linnet_rows_in_use", 0)
    assert metric(served.url, "linnet_queue_depth") == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_disconnects_frees_its_row(served, stream):
    """Steps held, so the request cannot finish on its own: the client closes its connection
    after the first token (streamed) or while waiting for the answer (whole); the row comes
    back and the generation is counted as cancelled."""
    cancelled = 'linnet_requests_finished_total{reason="cancelled"}'
    before = metric(served.url, cancelled)
    body = json.dumps({**OK, "max_tokens": 100, "temperature": 0, "stream": stream}).encode()
    with served.rows.held():
        with socket.create_connection((served.host, served.port)) as conn:
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            if stream:
                assert b"data: {" in read_until(conn, b"data: {")
            else:
                wait_metric(served.url, "linnet_rows_in_use", 1)
        # closed while the steps are held: the server marks the job cancelled...
        jobs = served.state.scheduler.decoding
        wait_until(lambda: len(jobs) == 1 and jobs[0].cancelled)
    # ...and the scheduler, released, frees the row instead of generating 100 tokens
    wait_metric(served.url, cancelled, before + 1)
    wait_metric(served.url, "linnet_rows_in_use", 0)


def wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never saw the client go"
        time.sleep(0.02)


def read_until(conn: socket.socket, marker: bytes) -> bytes:
    got = b""
    conn.settimeout(30)
    while marker not in got:
        part = conn.recv(4096)
        assert part, got
        got += part
    return got


def test_503_while_loading(tiny_served):
    """Requests that come before the model is loaded get 503; once loaded, 200."""
    from linnet.serve.engine import open_engine
    from linnet.serve.hosting import Server

    loaded = threading.Event()

    def load():
        assert loaded.wait(120)
        return open_engine(str(tiny_served), rows=1, name=MODEL, mode="interpret")

    with Server(load, name=MODEL, port=0) as server:
        assert httpx.get(server.url + "/health").json() == {"status": "loading"}
        assert httpx.get(server.url + "/health").status_code == 503
        for route, body in (("completions", OK), ("chat", CHAT)):
            error = assert_openai_error(post(server.url, route, body), 503)
            assert "loading" in error["message"]
        assert_openai_error(httpx.get(server.url + "/v1/models"), 503)
        loaded.set()
        wait_ready(server.url)
        assert post(server.url, "completions", OK).status_code == 200


def test_a_failed_load_is_reported(tmp_path):
    from linnet.serve.hosting import Server

    def load():
        raise ValueError("no weights here")

    server = Server(load, name=MODEL, port=0)
    with pytest.raises(RuntimeError, match="no weights here"):
        server.run()
    assert server.state.phase == "failed"
