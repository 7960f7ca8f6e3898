"""HF export: HF -> Linnet -> HF is bit-exact, and transformers cannot tell the difference.

For every tiny variant (and SmolLM2-135M's real weights): each exported tensor is
`torch.equal` to the original under the same name, config.json is the original's, and
`AutoModelForCausalLM.from_pretrained` on the export gives identical logits. A 2-shard
export reloads; casts match torch bit for bit; killing an export leaves nothing under
the final name; the streaming writer's peak memory stays near the largest tensor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import linnet.hf
import linnet.torch as lt
from linnet.cli import main
from linnet.errors import LinnetError
from linnet.weights.safetensors_io import Checkpoint
from tests.checkpoints import load_reference, probe_ids, tiny_variants

VARIANTS = tiny_variants()
REPO = Path(__file__).resolve().parents[2]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    ckpt = Checkpoint(folder)
    out = {}
    for f in ckpt.files:
        out.update(load_file(f))
    return out


def assert_bit_exact(original: Path, export: Path) -> None:
    want, got = _tensors(original), _tensors(export)
    assert sorted(got) == sorted(want), f"names differ: {set(got) ^ set(want)}"
    for name, t in want.items():
        assert got[name].shape == t.shape, name
        assert got[name].dtype == t.dtype, name
        assert torch.equal(got[name], t), f"{name}: max |Δ| {(got[name] - t).abs().max()}"


@torch.no_grad()
def _logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    return model.eval()(input_ids=ids).logits


@pytest.mark.parametrize("how", ["path", "model"])
@pytest.mark.parametrize("arch,variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_round_trip_is_bit_exact(tiny_checkpoint, tmp_path, arch, variant, how):
    src = tiny_checkpoint(arch, variant)
    model = src if how == "path" else lt.load(src)
    out = linnet.hf.export(model, tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (src / "config.json").read_text()
    )
    assert (out / "generation_config.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_transformers_reload_gives_identical_logits(tiny_checkpoint, tmp_path, arch, variant):
    src = tiny_checkpoint(arch, variant)
    out = linnet.hf.export(lt.load(src), tmp_path / "out", progress=False)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    ids = probe_ids(vocab)
    want = load_reference(src)(input_ids=ids).logits
    got = _logits(out, ids)
    assert torch.equal(got, want), f"max |Δ| {(got - want).abs().max()}"


def test_two_shards_reload(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("llama", "base")
    total = (src / "model.safetensors").stat().st_size
    out = linnet.hf.export(src, tmp_path / "out", max_shard_size=total * 6 // 10, progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in _tensors(src).values()
    )
    assert_bit_exact(src, out)
    ids = probe_ids(256)
    assert torch.equal(_logits(out, ids), load_reference(src)(input_ids=ids).logits)
    assert torch.equal(lt.load(out).forward(ids), lt.load(src).forward(ids))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_dtype_conversion_matches_torch(tiny_checkpoint, tmp_path, dtype):
    src = tiny_checkpoint("qwen2")
    out = linnet.hf.export(src, tmp_path / "out", dtype=dtype, progress=False)
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    want, got = _tensors(src), _tensors(out)
    for name, t in want.items():
        assert got[name].dtype == torch_dtype
        assert torch.equal(got[name], t.to(torch_dtype)), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == {"bf16": "bfloat16", "f16": "float16"}[dtype]
    # and back: bf16/f16 -> f32 is exact
    back = linnet.hf.export(out, tmp_path / "back", dtype="f32", progress=False)
    for name, t in got.items():
        assert torch.equal(_tensors(back)[name], t.float()), name


def test_cast_rounds_like_torch():
    from linnet.weights.casting import cast, from_torch, to_torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 37, generator=g) * torch.logspace(-30, 30, 37)
    # ties, the largest finite values, infinities, NaN, denormals, signed zeros
    bits = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF], np.uint32)
    more = np.array([np.inf, -np.inf, np.nan, 1e-40, -0.0, 65504.0, 65520.0, 1e-8], np.float32)
    special = torch.from_numpy(np.concatenate([bits.view(np.float32), more]))
    for t in (x.flatten(), special):
        for dtype, td in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            got = to_torch(cast(from_torch(t), dtype))
            want = t.to(td)
            assert got.dtype == td
            same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
            assert bool(same.all()), t[~same][:5]
            back = to_torch(cast(from_torch(want), "f32"))
            assert torch.equal(back[~back.isnan()], want.float()[~back.isnan()])
    every_bf16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    every_bf16 = every_bf16.view(torch.bfloat16)  # all 65536 bit patterns, bf16 -> f16
    got = to_torch(cast(from_torch(every_bf16), "f16"))
    want = every_bf16.to(torch.float16)
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert bool(same.all()), every_bf16[~same][:5]
    big = torch.randn(3000, 2000, generator=g)  # converted in blocks
    assert torch.equal(to_torch(cast(from_torch(big), "bf16")), big.to(torch.bfloat16))
    assert np.array_equal(cast(from_torch(big), "f32"), big.numpy())


def test_existing_output_is_refused_unless_overwrite(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("gpt2")
    out = linnet.hf.export(src, tmp_path / "out", progress=False)
    with pytest.raises(LinnetError, match="already exists"):
        linnet.hf.export(src, out, progress=False)
    (out / "marker").write_text("old")
    linnet.hf.export(src, out, overwrite=True, dtype="bf16", progress=False)
    assert not (out / "marker").exists()
    assert _tensors(out)["transformer.wte.weight"].dtype == torch.bfloat16
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    empty = tmp_path / "empty"
    empty.mkdir()
    linnet.hf.export(src, empty, progress=False)  # an empty folder is fine
    assert (empty / "model.safetensors").is_file()


def test_bare_gpt2_keeps_its_names(tiny_checkpoint, tmp_path):
    """A GPT-2 checkpoint saved without "transformer." (as the Hub's gpt2 is) exports with
    the names it had."""
    from safetensors.torch import save_file

    src = tiny_checkpoint("gpt2")
    bare = tmp_path / "bare"
    bare.mkdir()
    tensors = {k.removeprefix("transformer."): v for k, v in _tensors(src).items()}
    save_file(tensors, bare / "model.safetensors", metadata={"format": "pt"})
    (bare / "config.json").write_text((src / "config.json").read_text())
    out = linnet.hf.export(bare, tmp_path / "out", progress=False)
    assert_bit_exact(bare, out)


def test_cli_export_hf(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("phi3", "window")
    runner = CliRunner()
    out = tmp_path / "out"
    r = runner.invoke(main, ["export", "hf", str(src), "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output
    assert_bit_exact(src, out)
    r = runner.invoke(main, ["export", "hf", str(src), "--out", str(out), "--quiet"])
    assert r.exit_code == 1 and "already exists" in r.output
    r = runner.invoke(main, ["export", "hf", str(src), "--out", str(out), "--force", "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["export", "hf", str(tmp_path / "nope"), "--out", str(out)])
    assert r.exit_code == 1 and "no such checkpoint" in r.output
    r = runner.invoke(
        main, ["export", "hf", str(src), "--out", str(tmp_path / "o2"), "--dtype", "int8"]
    )
    assert r.exit_code == 1 and "expected one of" in r.output


def test_model_without_hf_config_needs_an_architecture(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("llama", "tied")
    model = lt.load(src)
    model.hf_config = {}
    with pytest.raises(LinnetError, match="architecture="):
        linnet.hf.export(model, tmp_path / "out", progress=False)
    out = linnet.hf.export(model, tmp_path / "out", architecture="LlamaForCausalLM", progress=False)
    assert_bit_exact(src, out)
    ids = probe_ids(256)
    assert torch.equal(_logits(out, ids), load_reference(src)(input_ids=ids).logits)


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (real weights)


def test_smollm2_round_trip(smollm2_checkpoint, tmp_path, chat_prompts):
    out = linnet.hf.export(lt.load(smollm2_checkpoint), tmp_path / "out", progress=False,
                           tokenizer=smollm2_checkpoint)  # fmt: skip
    assert_bit_exact(smollm2_checkpoint, out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (smollm2_checkpoint / name).read_bytes(), name
    from transformers import AutoTokenizer

    from tests.checkpoints import chat_prompt_ids

    ids = chat_prompt_ids(AutoTokenizer.from_pretrained(out, trust_remote_code=False))
    assert all(torch.equal(a, b) for a, b in zip(ids, chat_prompts))
    want = load_reference(smollm2_checkpoint)(input_ids=ids[0]).logits
    assert torch.equal(_logits(out, ids[0]), want)


def test_smollm2_streams_with_bounded_memory(smollm2_checkpoint, tmp_path):
    """From a folder the writer streams each tensor in blocks of a few MB: the peak of
    numpy's allocations stays far under the largest tensor (embeddings, 113 MB in f32;
    the model is 538 MB; measured 30 MB, the bf16 export included)."""
    largest = 49152 * 576 * 4
    tracemalloc.start()
    try:
        linnet.hf.export(smollm2_checkpoint, tmp_path / "out", dtype="bf16", progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"peak traced {peak / 1e6:.0f} MB, largest tensor {largest / 1e6:.0f} MB")
    assert peak < largest / 2


def _kill_midway(cmd: list[str], final: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    partial = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            partial = [p for p in final.parent.iterdir() if ".partial-" in p.name]
            size = sum(
                f.stat().st_size
                for p in partial
                for f in ([p] if p.is_file() else p.rglob("*"))
                if f.is_file()
            )
            if size > 20_000_000:  # well into the tensor data
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the export finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert partial, "no temporary file was seen"
    assert not final.exists(), f"{final} exists after a killed export"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_killed_export_leaves_no_final_file(smollm2_checkpoint, tmp_path, fmt):
    final = tmp_path / ("out" if fmt == "hf" else "out.gguf")
    cmd = [sys.executable, "-m", "linnet.cli", "export", fmt, str(smollm2_checkpoint),
           "--out", str(final), "--dtype", "f32"]  # fmt: skip
    _kill_midway(cmd, final, tmp_path)
