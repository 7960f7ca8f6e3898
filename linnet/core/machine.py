"""The machine a figure was measured on: CPU model, the instruction-set flags that decide
its kernels (bf16 and int8 dot products above all), core count, platform and load. Parity
records and benchmark results carry it; the site shows it beside every figure."""

from __future__ import annotations

import os
import platform
from pathlib import Path

#: Flag prefixes that decide which kernels a CPU runs, recorded with every result.
_KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512", "amx", "avx_vnni", "sse4_2", "neon", "sve")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    lines = _cpuinfo()
    found = (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    return next(found, platform.processor())


def cpu_flags() -> list[str]:
    """The CPU's kernel-relevant flags (avx2, avx512_bf16, amx_tile...), sorted."""
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return sorted(f for f in have if f.startswith(_KERNEL_FLAGS))
    return []


def machine() -> dict:
    """The CPU, its flags, its cores, the platform and the load now. `under_load`: other
    work ran beside the measurement (1-minute load above half the cores), so its timings
    are marked as such."""
    load = list(os.getloadavg())
    cpus = os.cpu_count() or 1
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpus": cpus,
        "load_average": load,
        "under_load": load[0] > 0.5 * cpus,
    }
