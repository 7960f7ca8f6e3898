"""HF and GGUF exports that fail part way leave nothing behind: no output under the final
name, no `.partial-*` temporary, and an output they were overwriting unchanged, byte for byte.

The failure is made inside the exporter: its tensor writer (`write_converted` for HF,
`write_encoded` for GGUF) raises after a few tensors, as a full disk, a bad tensor or a
Ctrl-C would, once part of the output is on disk.
"""

from __future__ import annotations

from pathlib import Path

import linnet.converters.gguf_export as gguf_export
import linnet.converters.hf_export as hf_export
import pytest

import linnet.gguf
import linnet.hf
import linnet.torch as lt

TENSORS_BEFORE_FAILING = 3


class WriterFailed(RuntimeError):
    pass


def fail_after(monkeypatch, module, name: str, exc: type[BaseException]) -> list[int]:
    """Make `module.name` (a tensor writer) raise `exc` on its call after
    TENSORS_BEFORE_FAILING; returns the list of calls that went through."""
    real = getattr(module, name)
    done: list[int] = []

    def writer(*args, **kwargs):
        if len(done) == TENSORS_BEFORE_FAILING:
            raise exc(f"{name}: made to fail after {len(done)} tensors")
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, writer)
    return done


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones included), path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def hf_export_of(src, out: Path, **kwargs) -> Path:
    return linnet.hf.export(src, out, progress=False, **kwargs)


def gguf_export_of(src, out: Path, **kwargs) -> Path:
    return linnet.gguf.export(src, out, dtype="f32", progress=False, **kwargs)


EXPORTS = {
    # name: (export, tensor writer patched, arguments, output name)
    "hf": (hf_export_of, hf_export, "write_converted", {}, "out"),
    "hf-sharded": (hf_export_of, hf_export, "write_converted", {"max_shard_size": 20_000}, "out"),
    "gguf": (gguf_export_of, gguf_export, "write_encoded", {}, "out.gguf"),
}
FAILURES = [WriterFailed, KeyboardInterrupt]


@pytest.fixture
def source(tiny_checkpoint):
    return tiny_checkpoint("llama", "tied")


@pytest.mark.parametrize("exc", FAILURES, ids=["error", "interrupt"])
@pytest.mark.parametrize("fmt", list(EXPORTS))
@pytest.mark.parametrize("how", ["path", "model"])
def test_a_failed_export_leaves_nothing(source, tmp_path, monkeypatch, fmt, exc, how):
    export, module, writer, kwargs, name = EXPORTS[fmt]
    done = fail_after(monkeypatch, module, writer, exc)
    what = source if how == "path" else lt.load(source)
    with pytest.raises(exc, match="made to fail after 3 tensors"):
        export(what, tmp_path / name, **kwargs)
    assert len(done) == TENSORS_BEFORE_FAILING  # it failed mid-write, not before
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no `.partial-*`


@pytest.mark.parametrize("exc", FAILURES, ids=["error", "interrupt"])
@pytest.mark.parametrize("fmt", list(EXPORTS))
def test_a_failed_overwrite_keeps_the_old_output(
    source, tiny_checkpoint, tmp_path, monkeypatch, fmt, exc
):
    export, module, writer, kwargs, name = EXPORTS[fmt]
    out = export(tiny_checkpoint("llama"), tmp_path / name, **kwargs)  # the old output
    old = listing(tmp_path)
    assert old  # something to keep
    fail_after(monkeypatch, module, writer, exc)
    with pytest.raises(exc, match="made to fail after 3 tensors"):
        export(source, out, overwrite=True, **kwargs)
    assert listing(tmp_path) == old  # the same files, byte for byte, and no temporaries
