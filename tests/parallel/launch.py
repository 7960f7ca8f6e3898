"""Start one process per rank with the environment torchrun gives them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("tp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, out: Path, job: dict, timeout_s: float = 600, tp_timeout_s=30):
    """Run the worker on `world` ranks; (exit codes, each rank's report or None)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            LINNET_TP_TIMEOUT=str(tp_timeout_s),
        )
        cmd = [sys.executable, str(WORKER), str(out), json.dumps(job)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    codes, logs = [], []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"a rank hung past {timeout_s} s") from None
        codes.append(p.returncode)
        logs.append(text.decode(errors="replace"))
    reports = []
    for rank in range(world):
        f = out / f"rank{rank}.json"
        reports.append(json.loads(f.read_text()) if f.exists() else None)
    return codes, reports, logs
