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


def huge_pages(file: Path | None = None) -> dict:
    """MB of this process in 2 MB pages: anonymous memory (Linnet's weights, where
    madvised: linnet/backends/torch/huge_pages.py) and, for `file`, its page cache mapped
    in 2 MB pages (llama.cpp's mmap of a GGUF file: how much depends on the page cache's
    state, not on llama.cpp; its f32 decode of one file ranged 37-51 ms a token in one day:
    docs/torch.md, "Session 21").
    Empty off Linux."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return {}
    anon = file_pmd = 0
    in_file = False
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):  # a mapping's first line
            in_file = file is not None and line.rstrip().endswith(str(Path(file).resolve()))
        elif head == "AnonHugePages:":
            anon += int(line.split()[1])
        elif head == "FilePmdMapped:" and in_file:
            file_pmd += int(line.split()[1])
    return {"anon_huge_mb": anon >> 10, "file_pmd_mapped_mb": file_pmd >> 10}
