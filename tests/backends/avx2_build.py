"""One kernel source built alone (with stream_ahead.cpp, which the decode linears call) with
AVX2 code (-march=x86-64-v3: AVX2 and FMA, no AVX-512) and a script run over its ops, in a
process of its own: what a CPU without AVX-512 runs, tested on one that has it (its own
build never compiles those branches)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PRELUDE = """
import torch
from linnet.backends.torch import kernels
kernels.FLAGS = ("-O3", "-march=x86-64-v3")
kernels.SOURCES = ({source!r}, "stream_ahead.cpp")  # the decode linears note their weights
torch.ops.load_library(str(kernels._build(kernels.build_dir())))
ops = torch.ops.linnet_kernels
torch.manual_seed(0)
"""


def run_avx2_build(source: str, script: str, cache: Path) -> str:
    """`script` (with `torch` and the built `ops` in scope) run over `source`'s library,
    built under `cache`; its stdout (an assertion failing in it fails the caller)."""
    env = dict(os.environ, LINNET_CACHE=str(cache))
    code = _PRELUDE.format(source=source) + script
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def avx512f() -> bool:
    return "avx512f" in cpu_flags()


def cpu_flags() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text().split() if cpuinfo.exists() else []
