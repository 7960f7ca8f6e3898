"""Start tests/parallel/jax_worker.py in a process of its own with N host devices (XLA_FLAGS
must be set before jax starts) and read back its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("jax_worker.py")


def run_worker(out: Path, devices: int, world: int, cks: list[str], timeout: float) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), str(world), *cks], env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    print({Path(k).name: round(v, 1) for k, v in report["seconds"].items()})  # -s: the costs
    return report
