"""Bad checkpoints: `linnet.torch.load` raises Linnet's own error naming the tensor or
file, and `linnet plan` exits non-zero with a message, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import linnet.torch as lt
from linnet.cli import main
from linnet.errors import CheckpointError, PickledCheckpoint, UnsupportedArchitecture
from tests.checkpoints import build_tiny


@pytest.fixture
def llama(tmp_path_factory, tmp_path):
    """A writable copy of a tiny Llama checkpoint."""
    src = build_tiny("LlamaForCausalLM", "base", tmp_path_factory.mktemp("src"))
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _missing(t):
    del t["model.layers.1.self_attn.k_proj.weight"]


def _misshapen(t):
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:-1]


def _extra(t):
    t["model.layers.0.self_attn.q_proj.bias"] = t["model.norm.weight"].clone()


CASES = {
    "missing tensor": (_missing, "model.layers.1.self_attn.k_proj.weight"),
    "wrong shape": (_misshapen, "model.layers.0.mlp.up_proj.weight"),
    "extra unmapped tensor": (_extra, "model.layers.0.self_attn.q_proj.bias"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_load_names_the_tensor(llama, case):
    change, tensor = CASES[case]
    _rewrite(llama, change)
    with pytest.raises(CheckpointError) as info:
        lt.load(llama)
    assert tensor in str(info.value)
    assert info.value.tensor == tensor
    result = CliRunner().invoke(main, ["plan", str(llama)])
    assert result.exit_code == 1
    assert tensor in result.output
    assert "Traceback" not in result.output


def test_truncated_file(llama):
    path = llama / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        lt.load(llama)
    assert "model.safetensors" in str(info.value)
    result = CliRunner().invoke(main, ["plan", str(llama)])
    assert result.exit_code == 1 and "model.safetensors" in result.output


def test_unsupported_architecture(llama):
    config = json.loads((llama / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (llama / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitecture, match="FalconForCausalLM"):
        lt.load(llama)
    result = CliRunner().invoke(main, ["plan", str(llama)])
    assert result.exit_code == 1 and "LlamaForCausalLM" in result.output  # lists supported


def test_pickled_only_folder_is_refused_unopened(llama, monkeypatch):
    (llama / "model.safetensors").unlink()
    junk = llama / "pytorch_model.bin"
    junk.write_bytes(b"\x80\x02not a pickle anyone should open")
    import torch

    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(PickledCheckpoint, match="pytorch_model.bin"):
        lt.load(llama)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        lt.load(tmp_path / "nope")


def test_cli_plan_subprocess_has_no_traceback(llama):
    _rewrite(llama, _missing)
    proc = subprocess.run(
        [sys.executable, "-m", "linnet.cli", "plan", str(llama)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "k_proj" in proc.stderr


def test_cli_plan_clean_checkpoint(llama):
    result = CliRunner().invoke(main, ["plan", str(llama)])
    assert result.exit_code == 0, result.output
    assert "LlamaForCausalLM" in result.output and "layers.1.wq" in result.output
