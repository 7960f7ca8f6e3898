"""What every benchmark records about where it ran: the machine and the versions."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict:
    """The CPU, its core count and the load average now (timings on a loaded machine are
    noisy: say so next to them)."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
    }


def versions(names) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = __import__(name).__version__
        except Exception as err:  # a missing baseline is reported, not fatal
            out[name] = f"unavailable: {type(err).__name__}"
    return out
