"""The runtime matrix: one row per zoo entry, one column per runtime, every cell derived from
the records (parity records and benchmark rows), never typed by hand.

    ✓ ran (every configuration)   ✓ n of m (some)   ✕ failed (with why)
    · not applicable              not measured (no record, or none for the whole runtime)

A runtime is a column for the parity backend it is measured by and the benchmark methods
that run on it; runtimes with no records at all (linnet.serve, vLLM until they land) still
get their column, every cell "not measured".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from linnet.site.bench import BenchRow
from linnet.site.records import ParityRecord


@dataclass(frozen=True)
class Runtime:
    key: str
    label: str
    backend: str | None  # the parity backend that measures it
    runs: Callable[[str], bool]  # a benchmark method that runs on it
    applies: Callable  # entry -> whether the entry could run here


def _backend(name: str) -> Callable:
    return lambda entry: entry.ready and name in entry.backends


def _decoder(entry) -> bool:
    return entry.ready and entry.kind == "decoder"


RUNTIMES = [
    Runtime("torch", "PyTorch", "torch",
            lambda m: m.startswith("linnet/") and m != "linnet/onnx", _backend("torch")),
    Runtime("jax", "XLA/JAX", "jax", lambda m: m.startswith("jax/"), _backend("jax")),
    Runtime("onnx", "ONNX Runtime", "onnx", lambda m: m == "linnet/onnx", _backend("onnx")),
    Runtime("serve", "linnet.serve", None, lambda m: m.startswith("serve/"),
            lambda e: e.ready),
    Runtime("vllm", "vLLM", None, lambda m: m.startswith("vllm"), _decoder),
    Runtime("llamacpp", "llama.cpp", None, lambda m: m == "llama.cpp", _decoder),
]  # fmt: skip


@dataclass
class Config:
    """One measured configuration of an entry on a runtime: a parity record or a bench row."""

    what: str  # "parity tiny-random f32", "bench decoders bf16"
    ok: bool
    why: str = ""


@dataclass
class Cell:
    state: str  # ran, some, failed, na, unmeasured
    configs: list[Config] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.configs)

    @property
    def mark(self) -> str:
        n, m = self.passed, len(self.configs)
        return {
            "ran": "✓",
            "some": f"✓ {n} of {m}",
            "failed": "✕",
            "na": "·",
            "unmeasured": "not measured",
        }[self.state]

    @property
    def note(self) -> str:
        """The cell's hover note and its text for screen readers: each configuration."""
        if self.state == "na":
            return "not applicable"
        if not self.configs:
            return "not measured: no record"
        return "; ".join(f"{c.what}: {'ok' if c.ok else 'failed: ' + c.why}" for c in self.configs)

    @property
    def why(self) -> str:
        return next((c.why for c in self.configs if not c.ok and c.why), "")


def runtime_of(method: str) -> Runtime | None:
    return next((rt for rt in RUNTIMES if rt.runs(method)), None)


def configs_for(entry: str, rt: Runtime, parity: list[ParityRecord], rows: list[BenchRow]):
    out = [
        Config(f"parity {r.weights} {r.dtype}", r.passed, r.why)
        for r in parity
        if r.entry == entry and r.backend == rt.backend
    ]
    out += [
        Config(f"bench {r.method} {r.config}", r.ok, r.notes if not r.ok else "")
        for r in rows
        if r.entry == entry and rt.runs(r.method)
    ]
    return out


def cell(entry, rt: Runtime, parity, rows, measured: bool) -> Cell:
    """The cell of one entry on one runtime; `measured`: the runtime has any record at all."""
    configs = configs_for(entry.name, rt, parity, rows)
    if configs:
        passed = sum(c.ok for c in configs)
        state = "ran" if passed == len(configs) else "some" if passed else "failed"
        return Cell(state, configs)
    if measured and not rt.applies(entry):
        return Cell("na")
    return Cell("unmeasured")


def matrix(entries, parity: list[ParityRecord], rows: list[BenchRow]) -> dict:
    """entry name -> runtime key -> Cell, and which runtimes have any record."""
    names = {e.name for e in entries}
    measured = {
        rt.key: any(r.backend == rt.backend and r.entry in names for r in parity)
        or any(r.entry in names and rt.runs(r.method) for r in rows)
        for rt in RUNTIMES
    }
    cells = {
        e.name: {rt.key: cell(e, rt, parity, rows, measured[rt.key]) for rt in RUNTIMES}
        for e in entries
    }
    return {"cells": cells, "measured": measured}
