"""One in-process server over a tiny random Llama with a chat tokenizer, shared by the tests of
this folder, and its transformers reference.

* ``tiny_served -> Path``: the checkpoint folder (tiny Llama, `tests/tiny_tokenizer.py`).
* ``served``: a running `linnet.serve` server (4 rows, 12 queued at most, prefill chunks of 16
  tokens so the longer prompts are prefilled in several chunks); its rows are a `Gate`, so a
  test can hold every decode step (`with served.rows.held(): ...`) and see requests queue.
* ``client``: the `openai` client on it (no retries: a 429 or 503 must reach the test).
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

from tests.checkpoints import reference_greedy
from tests.tiny_tokenizer import add_tiny_tokenizer

MODEL = "tiny-llama"
ROWS = 4
MAX_QUEUE = 12
PREFILL_CHUNK = 16  # prompt tokens prefilled per round
EOS = 2  # the tiny checkpoints' generation_config.json


class Gate:
    """A RowDecoder that forwards to another, but whose `step` can be held: requests then
    stay in their rows (prefill still runs, so each gets its first token)."""

    def __init__(self, rows):
        self.inner = rows
        self.rows, self.positions = rows.rows, rows.positions
        self.open = threading.Event()
        self.open.set()

    def held(self):
        gate = self

        class _Held:
            def __enter__(self):
                gate.open.clear()

            def __exit__(self, *exc):
                gate.open.set()

        return _Held()

    def prefill(self, row, ids):
        return self.inner.prefill(row, ids)

    def step(self, rows, ids):
        assert self.open.wait(60), "a test held the rows for a minute"
        return self.inner.step(rows, ids)

    def free(self, row):
        self.inner.free(row)

    def length(self, row):
        return self.inner.length(row)


@pytest.fixture(scope="session")
def tiny_served(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "tiny-llama"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    return add_tiny_tokenizer(folder, chat=True)


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _health(url) != 200:
        assert time.monotonic() < deadline, "the server did not load"
        time.sleep(0.05)


def _health(url: str) -> int | None:
    """/health's status; None when it did not answer in time (a process still importing
    on a loaded machine answers late: the deadline above is what counts)."""
    try:
        return httpx.get(url + "/health", timeout=30).status_code
    except httpx.TimeoutException:
        return None


@pytest.fixture(scope="session")
def served(tiny_served):
    from linnet.serve.engine import open_engine
    from linnet.serve.hosting import Server

    holder = {}

    def load():
        engine = open_engine(str(tiny_served), rows=ROWS, name=MODEL, mode="interpret")
        engine.rows = holder["rows"] = Gate(engine.rows)
        return engine

    server = Server(load, name=MODEL, port=0, max_queue=MAX_QUEUE, prefill_chunk=PREFILL_CHUNK)
    server.start()
    wait_ready(server.url)
    server.rows = holder["rows"]
    yield server
    server.stop()


@pytest.fixture
def client(served):
    import openai

    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def tokenizer(tiny_served):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_served, trust_remote_code=False)


def metric(url: str, name: str) -> float:
    """One sample of /metrics (0 when absent), `name` with its labels as written."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def wait_metric(url: str, name: str, value: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(url, name) != value:
        assert time.monotonic() < deadline, f"{name} stayed {metric(url, name)}, not {value}"
        time.sleep(0.02)


def greedy_answer(folder, tokenizer, ids: list[int], max_tokens: int) -> tuple[str, int, str]:
    """transformers' greedy answer as the server should give it: its text (EOS not shown), the
    number of tokens generated (EOS counted) and the finish reason ("stop" at the checkpoint's
    EOS, else "length")."""
    import torch

    out = reference_greedy(folder, torch.tensor([ids]), max_tokens, stop_at_eos=True)
    new = out[0, len(ids) :].tolist()
    shown = new[: new.index(EOS)] if EOS in new else new
    reason = "stop" if EOS in new else "length"
    return tokenizer.decode(shown, skip_special_tokens=True), len(new), reason
