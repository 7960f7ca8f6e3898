"""Records made here, the way CI makes them, and the site built from them.

`parity_records`: scripts/parity_ci.py runs the gate on gpt2's tiny random checkpoint (every
backend and dtype the entry has), and one gate on a tiny Llama with a weight perturbed on
purpose, recorded as llama-3.1-8b (that entry has no other record), so the site shows a
failure with its reason. The benchmark rows are the repository's bench/results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAILING_ENTRY = "llama-3.1-8b"


def run_linnet(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`linnet ...` as a user runs it, offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "linnet", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _failing_record(tiny_checkpoint, folder: Path) -> Path:
    import torch
    from linnet.zoo import get

    import linnet.torch
    from linnet.parity import run_gate, write_record
    from tests.checkpoints import probe_ids

    checkpoint = tiny_checkpoint("llama", "tied")
    model = linnet.torch.load(checkpoint, dtype="f32")
    with torch.no_grad():
        model.params["layers.1.down"].mul_(1.01)
    ids = list(probe_ids(256, (2, 24)).split(1))
    report = run_gate(
        checkpoint, entry=get(FAILING_ENTRY), ids=ids, model=model, weights="tiny-random"
    )
    assert not report.passed
    return write_record(report, folder)


@pytest.fixture(scope="session")
def parity_records(tmp_path_factory, tiny_checkpoint) -> Path:
    folder = tmp_path_factory.mktemp("parity")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "scripts/parity_ci.py", "--only", "gpt2", "--no-real"]
    done = subprocess.run(
        [*cmd, "--results", str(folder)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    _failing_record(tiny_checkpoint, folder)
    return folder


@pytest.fixture(scope="session")
def site(parity_records, tmp_path_factory) -> Path:
    """The site built by `linnet site build` from those records; returns its folder."""
    out = tmp_path_factory.mktemp("site") / "_build"
    done = run_linnet("site", "build", "--out", str(out), "--results", str(parity_records))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / "index.html")
    return out


def pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))
