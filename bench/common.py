"""What every benchmark records about where it ran: the machine, the versions, the date and
the command that made it (the site shows them beside every row)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

from linnet.core.machine import machine as core_machine


def machine() -> dict:
    """Linnet's machine record (CPU, flags, cores, load, `under_load`) plus the Python
    version and the processor string."""
    out = core_machine()
    out.update(processor=platform.processor(), python=platform.python_version())
    return out


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
