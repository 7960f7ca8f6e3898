"""Every case of the bad-input corpus (tests/badinput/corpus.py), run through the real command
line in a process of its own, must end the same way: exit 1 (2 for usage), one `error:` line
naming the culprit, no traceback, no partial output, no canary from hostile code, and within
30 s and 1 GB. A `y` waits on standard input in case anything asks to run code."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.badinput.corpus import CASES, Base, canary
from tests.tiny_tokenizer import add_tiny_tokenizer

# A hang guard, not a speed bound: `linnet run` starts torch and transformers, and the suite
# runs beside another worker on the same cores.
SECONDS = 90
MEMORY = 1 << 30


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    max_rss: int | None  # bytes, the process's own peak (None: it reported none)
    timed_out: bool


# `python -m linnet ARGV` that writes its own peak resident memory (VmHWM of the process after
# exec) to $LINNET_PEAK_FILE at exit. The kernel's ru_maxrss of a child would count the
# forked copy of this test process (2 GB with torch loaded) before the exec.
LINNET_WITH_PEAK = """
import atexit, os, runpy, sys

def _peak():
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(os.environ["LINNET_PEAK_FILE"], "w") as out:
        out.write(str(kib * 1024))

atexit.register(_peak)
sys.argv[0] = "linnet"
runpy.run_module("linnet", run_name="__main__", alter_sys=True)
"""


def run_linnet(argv: list[str], cwd: Path, fsize: int | None = None) -> Outcome:
    """`python -m linnet ARGV` with `y` on stdin, its peak memory and whether it was killed
    for running past SECONDS."""

    def limits():
        if fsize is not None:  # a full disk: writes past fsize fail with EFBIG
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    peak = cwd / ".peak"
    peak.unlink(missing_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_COLOR": "1",
        "LINNET_PEAK_FILE": str(peak),
    }
    with open(cwd / ".stdin", "w+") as stdin, open(cwd / ".stdout", "w+") as out:
        stdin.write("y\ny\n")
        stdin.seek(0)
        with open(cwd / ".stderr", "w+") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", LINNET_WITH_PEAK, *argv],
                stdin=stdin,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                preexec_fn=limits,
            )
            try:
                proc.wait(timeout=SECONDS)
                expired = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                expired = True
            out.seek(0), err.seek(0)
            rss = int(peak.read_text()) if peak.is_file() else None
            return Outcome(proc.returncode, out.read(), err.read(), rss, expired)


@pytest.fixture(scope="module")
def base(tiny_checkpoint, tmp_path_factory) -> Base:
    import linnet.gguf

    root = tmp_path_factory.mktemp("corpus-base")
    llama = root / "llama"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), llama)
    add_tiny_tokenizer(llama)
    gguf = linnet.gguf.export(
        llama, root / "llama.gguf", dtype="f32", tokenizer=False, progress=False
    )
    return Base(llama=llama, gguf=Path(gguf))


def test_the_base_inputs_work(base, tmp_path):
    """The control: the unbroken inputs pass, so each refusal below is the break's doing."""
    for argv in (
        ["plan", str(base.llama)],
        ["plan", str(base.gguf)],
        ["run", str(base.llama), "--prompt", "the a", "--max-new-tokens", "2", "--no-chat"],
        ["export", "hf", str(base.llama), "--out", str(tmp_path / "out"), "--quiet"],
    ):
        done = run_linnet(argv, tmp_path)
        assert done.code == 0, (argv, done.err)


def is_error(line: str) -> bool:
    """`error: ...`, click's `Error: ...`, or a source's `FILE:LINE:COL: error: ...`."""
    return line.lower().startswith("error") or ": error: " in line


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".partial-" in p.name]


def outputs(here: Path) -> dict:
    """Every path named out* under a case's folder, with a file's bytes."""
    return {p: p.read_bytes() if p.is_file() else None for p in here.rglob("out*")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_cleanly(name, base, tmp_path):
    case = CASES[name]
    here = tmp_path / "case"
    here.mkdir()
    argv = case.make(base, here)
    before = outputs(here)
    done = run_linnet(argv, here, case.fsize)
    text = done.out + done.err
    assert not done.timed_out, f"{name}: still running after {SECONDS} s"
    assert done.code == case.code, f"{name}: exit {done.code}\n{text}"
    assert "Traceback" not in text, text
    errors = [line for line in done.err.splitlines() if is_error(line)]
    assert errors, f"{name}: no error line\n{text}"
    assert any(case.culprit in line for line in errors), f"{name}: {case.culprit!r} unnamed\n{text}"
    assert not canary(here).exists(), f"{name}: hostile code ran"
    assert partials(here) == [], f"{name}: a partial output was left"
    assert outputs(here) == before, f"{name}: an output appeared or changed"
    assert done.max_rss is not None and done.max_rss < MEMORY, f"{name}: peak {done.max_rss}"


def wide_llama(base: Base, folder: Path) -> Path:
    """The tiny Llama made wide (about 100 MB of f32), so that an export takes long enough
    to be killed in the middle of its writes."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir()
    for p in base.llama.iterdir():
        if p.suffix == ".json" and p.name != "config.json":
            shutil.copy(p, folder / p.name)
    config = json.loads((base.llama / "config.json").read_text())
    dim, ffn, kv, layers = 512, 1536, 128, 8
    config.update(
        hidden_size=dim,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
    )
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    tensors = {
        "model.embed_tokens.weight": w(256, dim),
        "lm_head.weight": w(256, dim),
        "model.norm.weight": np.ones(dim, np.float32),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": w(dim, dim),
            p + "self_attn.k_proj.weight": w(kv, dim),
            p + "self_attn.v_proj.weight": w(kv, dim),
            p + "self_attn.o_proj.weight": w(dim, dim),
            p + "mlp.gate_proj.weight": w(ffn, dim),
            p + "mlp.up_proj.weight": w(ffn, dim),
            p + "mlp.down_proj.weight": w(dim, ffn),
            p + "input_layernorm.weight": np.ones(dim, np.float32),
            p + "post_attention_layernorm.weight": np.ones(dim, np.float32),
        }
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_write_killed_midway_leaves_no_output_and_the_next_cleans_up(base, tmp_path):
    """kill -9 while the export writes: the final path never appears; the next export removes
    the dead process's temporary and writes a complete folder."""
    import time

    src, out = wide_llama(base, tmp_path / "wide"), tmp_path / "out"
    argv = [sys.executable, "-m", "linnet", "export", "hf", str(src), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + SECONDS
    while not partials(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    assert partials(tmp_path), "the export ended before it could be killed mid-write"
    assert not out.exists()
    done = run_linnet(argv[3:], tmp_path)
    assert done.code == 0, done.err
    assert partials(tmp_path) == [] and (out / "model.safetensors").is_file()
