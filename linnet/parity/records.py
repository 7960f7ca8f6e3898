"""Parity records: one JSON file per entry, weights, backend and dtype, read by the site,
model cards and `linnet zoo list`.

    path = write_record(report)            # results/parity/NAME.real.torch.f32.json
    records = read_records()               # every record there, as dicts

The folder is the argument, else $LINNET_RESULTS, else results/parity.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from linnet.core.machine import machine
from linnet.parity.report import Report

DEFAULT_RESULTS = Path("results") / "parity"


def record(report: Report) -> dict:
    """The report as JSON-ready data, with its tolerance and verdict spelled out."""
    out = asdict(report)
    out["tolerance"] = report.tolerance.as_dict()
    out["passed"] = report.passed
    out.setdefault("machine", machine())
    out.setdefault("command", command())
    return out


def command(argv: list[str] | None = None) -> str:
    """The command line that made the record: `linnet parity ...`, `python scripts/...`."""
    argv = list(sys.argv if argv is None else argv) or ["python"]
    head = Path(argv[0])
    if head.suffix == ".py":
        first = ["python", os.path.relpath(head) if head.is_absolute() else str(head)]
    else:
        first = [head.name]
    return shlex.join([*first, *argv[1:]])


def results_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get("LINNET_RESULTS") or DEFAULT_RESULTS)


def record_path(report: Report, folder: str | os.PathLike | None = None) -> Path:
    name = report.entry or Path(report.checkpoint).name
    tag = "tiny" if report.weights != "real" else "real"
    backend = report.backend + (f"-{report.mode}" if report.mode else "")
    return results_dir(folder) / f"{name}.{tag}.{backend}.{report.dtype}.json"


def write_record(report: Report, folder: str | os.PathLike | None = None) -> Path:
    """Write the parity record (JSON) under the results folder; returns its path."""
    path = record_path(report, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")  # a reader never sees half a record
    tmp.write_text(json.dumps(record(report), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_records(folder: str | os.PathLike | None = None) -> list[dict]:
    """Every parity record under the results folder (unreadable ones are skipped)."""
    out = []
    root = results_dir(folder)
    for p in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out
