"""Exports show their progress: `linnet export hf|gguf|onnx` draws a bar on stderr that ends
at its total (the bytes of tensor data written, or the params for ONNX), counted here from
the files it wrote; `--quiet` draws none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tqdm
import tqdm.auto
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
#: tqdm's last state of a bar: "DESC: 100%|████| 1.06M/1.06M [00:00<00:00, ...]".
BAR = re.compile(r"(?P<desc>\S+): +(?P<pct>\d+)%\|[^|]*\| (?P<n>\S+)/(?P<total>\S+) \[")


def tensor_bytes(folder: Path) -> int:
    """Tensor data in an HF folder's safetensors files: each file less its header."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            header = int.from_bytes(fh.read(8), "little")
        total += f.stat().st_size - 8 - header
    return total


def gguf_tensor_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def checkpoint_numel(folder: Path) -> int:
    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():
                n = 1
                for d in st.get_slice(k).get_shape():
                    n *= d
                total += n
    return total


def expected_total(fmt: str, src: Path, out: Path) -> int:
    if fmt == "hf":
        return tensor_bytes(out)
    if fmt == "gguf":
        return gguf_tensor_bytes(out)
    return checkpoint_numel(src)  # ONNX counts params


def export(fmt: str, src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["export", fmt, str(src), "--out", str(out), *extra]
    if fmt == "gguf":
        args += ["--dtype", "f32"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    return subprocess.run(
        [sys.executable, "-m", "linnet.cli", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def last_bar(stderr: str, desc: str) -> dict:
    states = [m.groupdict() for m in BAR.finditer(stderr) if m["desc"] == desc]
    assert states, f"no progress bar for {desc} on stderr: {stderr[-500:]!r}"
    return states[-1]


@pytest.mark.parametrize("fmt, name", [("hf", "out"), ("gguf", "out.gguf"), ("onnx", "out")])
def test_cli_export_shows_progress_up_to_the_total(tiny_checkpoint, tmp_path, fmt, name):
    src = tiny_checkpoint("llama")
    done = export(fmt, src, tmp_path / name)
    assert done.returncode == 0, done.stderr
    bar = last_bar(done.stderr, name)
    total = tqdm.tqdm.format_sizeof(expected_total(fmt, src, tmp_path / name), divisor=1000)
    assert (bar["pct"], bar["n"], bar["total"]) == ("100", total, total)
    assert not BAR.search(done.stdout)  # the bar is on stderr, stdout says what was written


def test_quiet_export_shows_no_progress(tiny_checkpoint, tmp_path):
    done = export("hf", tiny_checkpoint("llama"), tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    assert not BAR.search(done.stderr) and "%|" not in done.stderr


class Recorded(tqdm.tqdm):
    """A tqdm that remembers each bar's name, final count and total."""

    bars: list[tuple[int, int]] = []

    def close(self):
        if not self.disable:  # close() runs again at garbage collection, disabled then
            Recorded.bars.append((self.desc, self.n, self.total))
        super().close()


@pytest.mark.parametrize("fmt", ["hf", "gguf", "onnx"])
def test_progress_counts_exactly_what_is_written(tiny_checkpoint, tmp_path, monkeypatch, fmt):
    """The bar's count at its end is the total, to the byte (the CLI shows it rounded)."""
    import linnet.gguf
    import linnet.hf
    import linnet.onnx

    src = tiny_checkpoint("llama", "tied")  # built first: transformers' bars are not ours
    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    monkeypatch.setattr(Recorded, "bars", [])
    out = tmp_path / ("out.gguf" if fmt == "gguf" else "out")
    writer = {"hf": linnet.hf.export, "gguf": linnet.gguf.export, "onnx": linnet.onnx.export}
    kwargs = {"dtype": "f32"} if fmt == "gguf" else {}
    writer[fmt](src, out, progress=True, **kwargs)
    want = expected_total(fmt, src, out)
    assert Recorded.bars == [(out.name, want, want)]
    if fmt == "hf":  # and that is the checkpoint's own tensor data, nothing more
        assert want == tensor_bytes(src)
