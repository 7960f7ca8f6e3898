"""`linnet serve --backend jax --tensor-parallel 2` (linnet/shard/jax_rows.py): one process,
the tiny random Llama (8 heads, 2 KV heads) over a mesh of two host devices
(XLA_FLAGS=--xla_force_host_platform_device_count=2, so in a process of its own).
Concurrent greedy requests get transformers' greedy answers; too few devices is a clear
error naming the flag."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests.parallel.test_tp_serve import (  # the same tiny served folder and prompts
    PROMPTS,
    _complete,
    _concurrently,
    _read_url,
    served_folder,  # noqa: F401 - a fixture
    tokenizer,  # noqa: F401 - a fixture
)
from tests.serve.conftest import greedy_answer, wait_ready

ARGS = ["--port", "0", "--rows", "3", "--dtype", "f32", "--name", "tiny", "--backend", "jax"]


def start_jax_server(folder, devices: int, world: int) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONUNBUFFERED="1",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )  # fmt: skip
    cmd = [sys.executable, "-m", "linnet", "serve", str(folder), *ARGS,
           "--tensor-parallel", str(world)]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip


def _url(lines: list[str]) -> str | None:
    for line in lines:
        if found := re.search(r"(http://127\.0\.0\.1:\d+)/v1 \(loading", line):
            return found.group(1)
    return None


def test_jax_server_over_two_devices_answers_concurrent_requests_as_transformers(
    served_folder,  # noqa: F811
    tokenizer,  # noqa: F811
    monkeypatch,
):
    want = [
        greedy_answer(served_folder, tokenizer, tokenizer(p)["input_ids"], n) for p, n in PROMPTS
    ]
    want = [(text, reason) for text, _, reason in want]
    from tests.parallel import test_tp_serve

    monkeypatch.setattr(test_tp_serve, "_url", _url)  # this server's first line
    proc = start_jax_server(served_folder, devices=2, world=2)
    try:
        url, lines = _read_url(proc)
        wait_ready(url, timeout=300)
        got = _concurrently(url)
        again = _complete(url, *PROMPTS[0])  # freed rows reused keep their answers
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    log = "".join(lines)
    assert re.search(r"tensor parallel 2 over 2 \w+ devices", log), log  # over the mesh
    assert got == want, log
    assert again == want[0], log
    assert code == 0, log


def test_linnet_run_jax_tensor_parallel_prints_the_single_device_text(served_folder):  # noqa: F811
    args = [sys.executable, "-m", "linnet", "run", str(served_folder), "--backend", "jax",
            "--no-chat", "--prompt", "w5 w9 w11", "--max-new-tokens", "5",
            "--dtype", "f32"]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    one = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    two = subprocess.run(
        [*args, "--tensor-parallel", "2"], capture_output=True, text=True, env=env, timeout=600
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "tensor parallel 2 over 2" in two.stderr, two.stderr
    assert two.stdout.strip() == one.stdout.strip() and one.stdout.strip()
    few = subprocess.run(
        [*args, "--tensor-parallel", "4"], capture_output=True, text=True, env=env, timeout=600
    )
    assert few.returncode != 0
    assert "needs 4 devices, found 2" in few.stderr, few.stderr
