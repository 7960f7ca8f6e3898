"""Parity records (results/parity/*.json, written by `linnet parity` and scripts/parity_ci.py)
read for the site and checked: a record that is not JSON, lacks a field the site shows, or
names no zoo entry stops the build with a message naming the file.

    records = read_parity(Path("results/parity"), registry())
    records[0].entry, records[0].passed, records[0].made.command
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from linnet.errors import LinnetError

UNKNOWN = "unknown"


class SiteError(LinnetError):
    """A record the site cannot show honestly: the message names the file."""


@dataclass(frozen=True)
class Made:
    """Where, when and how a record was made; "unknown" for older records lacking a field."""

    date: str = UNKNOWN
    machine: str = UNKNOWN
    versions: str = UNKNOWN
    command: str = UNKNOWN


@dataclass
class ParityRecord:
    file: str
    entry: str | None  # None: a checkpoint that is no zoo entry
    checkpoint: str
    weights: str  # "real" or "tiny-random"
    backend: str
    dtype: str
    kind: str
    passed: bool
    why: str
    max_abs: float
    rel: float
    agree: str  # decoders: same first token n/m; classifiers: top-1 rows
    last: str  # decoders: least top-5 overlap; encoders: least cosine
    tolerance: str
    device: str
    seconds: float
    made: Made
    plan: str | None = None  # `linnet plan` text, when the record holds one
    samples: list[str] = field(default_factory=list)  # `linnet run` text, when held


def load_json(path: Path) -> dict:
    """A JSON object from a file, or a SiteError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise SiteError(f"{path}: cannot read the record: {err}") from None
    except json.JSONDecodeError as err:
        raise SiteError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise SiteError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


#: The flags that decide a CPU's fastest kernels, shown beside its name.
_SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def machine_text(machine) -> str:
    """One line for a machine dict: CPU, its kernel flags, core count, platform, and a
    mark when the figures were measured under load."""
    if not isinstance(machine, dict) or not machine:
        return UNKNOWN
    cpu = machine.get("cpu") or machine.get("processor") or ""
    flags = machine.get("cpu_flags")
    if isinstance(flags, list):
        shown = [f for f in _SHOWN_FLAGS if f in flags]
        cpu = f"{cpu} ({' '.join(shown) or 'no AVX2'})"
    cores = f"{machine['cpus']} cores" if machine.get("cpus") else ""
    parts = [p for p in (cpu, cores, machine.get("platform", "")) if p]
    if machine.get("under_load"):
        parts.append("measured under load (other work ran)")
    return ", ".join(str(p) for p in parts) or UNKNOWN


def versions_text(versions) -> str:
    if not isinstance(versions, dict) or not versions:
        return UNKNOWN
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def made_of(data: dict) -> Made:
    return Made(
        date=str(data.get("date") or UNKNOWN),
        machine=machine_text(data.get("machine")),
        versions=versions_text(data.get("versions")),
        command=str(data.get("command") or UNKNOWN),
    )


def _need(data: dict, path: Path, key: str, types):
    value = data.get(key)
    if not isinstance(value, types):
        raise SiteError(f"{path}: not a parity record: field {key!r} is missing or malformed")
    return value


def _figures(data: dict, path: Path) -> list[dict]:
    figures = _need(data, path, "figures", list)
    for f in figures:
        ok = isinstance(f, dict) and all(
            isinstance(f.get(k), (int, float)) and not isinstance(f.get(k), bool)
            for k in ("max_abs", "rel")
        )
        if not ok:
            raise SiteError(f"{path}: not a parity record: a figure lacks max_abs or rel")
    if not figures:
        raise SiteError(f"{path}: not a parity record: no figures")
    return figures


def _agreement(kind: str, figures: list[dict]) -> tuple[str, str]:
    """(agree, last): same first tokens or top-1 rows, and the least top-5 or cosine."""
    agree, last = "", ""
    if kind == "decoder":
        agree = f"{sum(bool(f.get('same_token')) for f in figures)}/{len(figures)} same token"
        top5 = [f["top5"] for f in figures if isinstance(f.get("top5"), int)]
        last = f"top-5 ≥ {min(top5)}/5" if top5 else ""
    top1 = [f for f in figures if isinstance(f.get("top1"), int)]
    if top1:
        agree = f"{sum(f['top1'] for f in top1)}/{sum(f.get('rows', 1) for f in top1)} top-1"
    cosines = [f["cosine"] for f in figures if isinstance(f.get("cosine"), (int, float))]
    if cosines:
        last = f"cosine ≥ {min(cosines):.8f}"
    return agree, last


def _tolerance_text(tol) -> str:
    if not isinstance(tol, dict):
        return UNKNOWN
    names = {"max_abs": "max|Δ| ≤", "rel": "rel ≤", "top5": "top-5 ≥", "cosine": "cosine ≥"}
    return ", ".join(
        f"{names.get(k, k)} {v:g}" for k, v in tol.items() if isinstance(v, int | float)
    )


def parse_parity(data: dict, path: Path, known) -> ParityRecord:
    """One record, checked; `known(name)` gives the entry's canonical name or None."""
    figures = _figures(data, path)
    entry = data.get("entry")
    if entry is not None:
        canonical = known(entry) if isinstance(entry, str) else None
        if canonical is None:
            raise SiteError(f"{path}: names {entry!r}, which is no zoo entry")
        entry = canonical
    kind = str(data.get("kind") or "decoder")
    agree, last = _agreement(kind, figures)
    why = "; ".join(str(f.get("why")) for f in figures if f.get("why"))
    return ParityRecord(
        file=path.name,
        entry=entry,
        checkpoint=Path(str(data.get("checkpoint") or "?")).name,
        weights=str(data.get("weights") or "real"),
        backend=_need(data, path, "backend", str),
        dtype=_need(data, path, "dtype", str),
        kind=kind,
        passed=_need(data, path, "passed", bool),
        why=why,
        max_abs=max(float(f["max_abs"]) for f in figures),
        rel=max(float(f["rel"]) for f in figures),
        agree=agree,
        last=last,
        tolerance=_tolerance_text(data.get("tolerance")),
        device=str(data.get("device") or UNKNOWN),
        seconds=float(data.get("seconds") or 0.0),
        made=made_of(data),
        plan=data.get("plan") if isinstance(data.get("plan"), str) else None,
        samples=[s for s in data.get("samples", []) if isinstance(s, str)],
    )


def read_parity(folder: Path, known) -> list[ParityRecord]:
    """Every record under `folder` (none when it does not exist), sorted by entry, weights,
    backend and dtype."""
    if not folder.is_dir():
        return []
    out = [parse_parity(load_json(p), p, known) for p in sorted(folder.glob("*.json"))]
    return sorted(out, key=lambda r: (r.entry or "", r.weights, r.backend, r.dtype))
