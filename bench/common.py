"""What every benchmark records about where it ran: the machine, the versions, the date and
the command that made it (the site shows them beside every row)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
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


def provenance() -> dict:
    """When and how this result was made: the date (UTC) and the command line."""
    script = Path(sys.argv[0])
    head = os.path.relpath(script) if script.is_absolute() else str(script)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", head, *sys.argv[1:]]),
    }
