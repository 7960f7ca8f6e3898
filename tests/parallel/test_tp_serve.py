"""`torchrun --nproc-per-node 2 -m linnet serve CK --tensor-parallel 2` (linnet/shard/tp_rows.py):
two gloo ranks on CPU over a tiny random Llama (8 heads, 2 KV heads); rank 0 serves over HTTP,
rank 1 follows. Concurrent greedy requests get transformers' greedy answers; SIGTERM drains,
stops the follower, and every process exits 0; a follower killed while serving makes rank 0
exit 1 with a clear error (bounded by LINNET_TP_TIMEOUT, not a hang)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.parallel.launch import free_port
from tests.serve.conftest import greedy_answer, wait_ready
from tests.tiny_tokenizer import add_tiny_tokenizer

# (prompt, max_tokens): different lengths, so rows join and leave the batch at different steps
PROMPTS = [("w5 w9 w11", 12), ("w62", 20), ("w7 w7 w7 w7 w7 w8", 8), ("w100 w3", 16)]
TP_TIMEOUT_S = 20
SERVE_ARGS = [
    "--port", "0", "--rows", "3", "--mode", "interpret", "--dtype", "f32", "--name", "tiny",
    "--tensor-parallel", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def served_folder(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp-serve") / "tiny-llama"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    return add_tiny_tokenizer(folder, chat=True)


@pytest.fixture(scope="module")
def tokenizer(served_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(served_folder, trust_remote_code=False)


def start_torchrun(folder) -> tuple[subprocess.Popen, str, list[str]]:
    """torchrun with two ranks serving `folder`; the process, rank 0's URL and the log lines
    (kept being read in the background)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port()), "-m", "linnet", "serve", str(folder), *SERVE_ARGS,
    ]  # fmt: skip
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LINNET_TP_TIMEOUT=str(TP_TIMEOUT_S)
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    url, lines = _read_url(proc)
    return proc, url, lines


def _read_url(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """Rank 0's URL from its first lines; the log lines, kept being read in the background."""
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while (found := _url(lines)) is None:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, "no URL from rank 0:\n" + "".join(lines)
        lines.append(line)
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return found, lines


def _url(lines: list[str]) -> str | None:
    for line in lines:
        if found := re.search(r"(http://127\.0\.0\.1:\d+)/v1 \(tensor parallel 2", line):
            return found.group(1)
    return None


def _complete(url: str, prompt: str, max_tokens: int) -> tuple[str, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["text"], choice["finish_reason"]


def _concurrently(url: str) -> list:
    results = [None] * len(PROMPTS)

    def run(i):
        results[i] = _complete(url, *PROMPTS[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return results


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_concurrent_greedy_requests_match_transformers_then_sigterm_stops_every_rank(
    served_folder, tokenizer
):
    want = [
        greedy_answer(served_folder, tokenizer, tokenizer(p)["input_ids"], n) for p, n in PROMPTS
    ]
    want = [(text, reason) for text, _, reason in want]
    proc, url, lines = start_torchrun(served_folder)
    try:
        wait_ready(url)
        got = _concurrently(url)
        again = _complete(url, *PROMPTS[0])  # rows freed and reused keep their answers
        proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks...
        proc.wait(120)  # ...and exits (1: torchrun reports its own signal, whatever the ranks)
    finally:
        _stop(proc)
    log = "".join(lines)
    assert got == want, log
    assert again == want[0], log


def test_sigterm_to_rank_0_drains_and_stops_the_follower(served_folder, tokenizer):
    ids = tokenizer(PROMPTS[1][0])["input_ids"]
    text, _, reason = greedy_answer(served_folder, tokenizer, ids, PROMPTS[1][1])
    procs, url, lines = start_ranks(served_folder)
    try:
        wait_ready(url)
        got = _complete(url, *PROMPTS[1])
        procs[0].send_signal(signal.SIGTERM)
        codes = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert got == (text, reason)
    assert codes == [0, 0], "".join(lines)  # the follower returned on rank 0's stop


def start_ranks(folder) -> tuple[list[subprocess.Popen], str, list[str]]:
    """The two ranks as separate processes with torchrun's environment (no torchrun agent
    that would end rank 0 itself when rank 1 dies): the processes, the URL, rank 0's log."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = dict(
            os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1", LINNET_TP_TIMEOUT=str(TP_TIMEOUT_S),
        )  # fmt: skip
        cmd = [sys.executable, "-m", "linnet", "serve", str(folder), *SERVE_ARGS]
        out = subprocess.PIPE if rank == 0 else subprocess.DEVNULL
        procs.append(
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        )
    url, lines = _read_url(procs[0])
    return procs, url, lines


def test_a_follower_killed_while_serving_ends_rank_0_with_a_clear_error(served_folder):
    procs, url, lines = start_ranks(served_folder)
    try:
        wait_ready(url)
        assert _complete(url, "w5 w9", 3)[1] in ("length", "stop")
        procs[1].kill()
        procs[1].wait(30)
        status = _status_after_a_rank_died(url)
        code = procs[0].wait(4 * TP_TIMEOUT_S)  # bounded by the collective timeout
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    log = "".join(lines)
    assert status is None or status >= 500, status
    assert code == 1, log
    assert "tensor parallel: a rank stopped answering" in log, log


def _status_after_a_rank_died(url: str) -> int | None:
    """A request's status, or None when rank 0 had already stopped listening (its last
    call, the finished request's `free`, may be the one that found rank 1 gone)."""
    body = {"model": "tiny", "prompt": "w5 w9", "max_tokens": 4, "temperature": 0}
    try:
        response = httpx.post(url + "/v1/completions", json=body, timeout=4 * TP_TIMEOUT_S)
    except httpx.TransportError:
        return None
    return response.status_code


def test_serve_tensor_parallel_without_torchrun_says_how_to_launch(served_folder):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "linnet", "serve", str(served_folder), "--tensor-parallel", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "torchrun --nproc-per-node 2 -m linnet serve" in done.stderr, done.stderr


class _Rows:
    """Rows that record what ran on them (a stand-in for rank 0's RowDecoder)."""

    rows, positions = 3, 16

    def __init__(self):
        self.ran = []

    def prefill_together(self, rows, prompts):  # a method MirroredRows has never heard of
        self.ran.append(("prefill_together", rows, prompts))
        return "logits"

    def free(self, row):
        from linnet.errors import LinnetError

        if row > 2:
            raise LinnetError(f"row {row} is out of range")
        self.ran.append(("free", row))

    def length(self, row):
        return 0


def test_mirrored_rows_send_every_call_by_name_before_running_it(monkeypatch):
    from linnet.errors import LinnetError
    from linnet.shard import tp_rows

    sent, inner = [], _Rows()
    monkeypatch.setattr(tp_rows, "send_call", lambda group, call: sent.append((call, inner.ran[:])))
    failures = []
    rows = tp_rows.MirroredRows(inner, group=None, on_failure=failures.append)
    assert rows.prefill_together([0, 2], [[5, 6], [7]]) == "logits"
    assert sent == [(("prefill_together", ([0, 2], [[5, 6], [7]]), {}), [])]  # sent first
    assert rows.length(1) == 0 and len(sent) == 1  # reads stay local
    with pytest.raises(LinnetError):  # refused alike on every rank: not a failure
        rows.free(7)
    assert not failures and rows.failed is None
    rows.stop()
    assert sent[-1][0][0] == tp_rows.STOP


def test_mirrored_rows_fail_for_good_when_a_broadcast_fails(monkeypatch):
    from linnet.shard import tp_rows

    def gone(group, call):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(tp_rows, "send_call", gone)
    failures, inner = [], _Rows()
    rows = tp_rows.MirroredRows(inner, group=None, on_failure=failures.append)
    with pytest.raises(tp_rows.TensorParallelError, match="a rank stopped answering"):
        rows.free(0)
    assert len(failures) == 1 and inner.ran == []
    with pytest.raises(tp_rows.TensorParallelError, match="a rank stopped answering"):
        rows.free(1)  # every later call fails at once, nothing is sent
    assert len(failures) == 1
    rows.stop()  # nobody listens: no stop is sent
