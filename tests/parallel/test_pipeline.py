"""Layers split across devices (issue 19): the placement pass and the placed runners.

No GPU here: the same code runs over the device list `cpu,cpu`, where every hand-over is
still a copy (`move_to` clones on the same device) and `check_placement` requires every
node's inputs on the node's device, so a missing move fails on the CPU too. Tiny random
checkpoints of four families in `generated` and `interpret` modes: forward logits equal to
the one-device model's, and greedy tokens equal to it and to transformers' `generate`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

import linnet.torch
from linnet.shard.place import check_placement
from linnet.shard.placement import PlacementError, parse_bytes, split_layers
from tests.numeric import assert_close
from tests.tiny_decoders import build_tiny, probe_ids, reference_greedy

CHECKPOINTS = [
    ("llama", "base"),  # untied head: the embedding on the first device, the head on the last
    ("llama", "tied"),  # head tied to the embedding: a copy of it on the last device
    ("qwen3", "base"),  # per-head q/k norms
    ("phi3", "base"),  # fused checkpoint tensors
    ("gpt2", "base"),  # learned positions, layer norm, tied head
]
MODES = ["generated", "interpret"]
NEW_TOKENS = 6
PAIR = ["cpu", "cpu"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pipe-tiny")


def _load(ck, mode, **placement):
    return linnet.torch.load(ck, dtype="f32", mode=mode, **placement)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch,variant", CHECKPOINTS, ids=lambda x: x)
def test_split_over_two_devices_equals_one_device(tiny_dir, arch, variant, mode):
    ck = build_tiny(arch, variant, out_dir=tiny_dir)
    one, two = _load(ck, mode), _load(ck, mode, devices=PAIR)
    assert sorted(set(two.placement.layer_device.values())) == [0, 1]  # both devices used
    ids = probe_ids(one.config["vocab"])
    # the same ops in the same order on the same CPU: bit for bit
    assert_close(two.forward(ids), one.forward(ids), atol=0.0, rtol=0.0, what="logits")
    prompt = ids[:1]
    tokens = two.generate(prompt, NEW_TOKENS)
    assert torch.equal(tokens, one.generate(prompt, NEW_TOKENS))
    assert torch.equal(tokens, reference_greedy(ck, prompt, NEW_TOKENS))


def _placed(tiny_dir, variant="base", mode="generated", **placement):
    model = _load(build_tiny("llama", variant, out_dir=tiny_dir), mode, **placement)
    return model, model.runner.placed


def test_one_hand_over_per_boundary_and_the_cache_with_its_layer(tiny_dir):
    model, placed = _placed(tiny_dir, devices=PAIR)
    assert model.placement.layer_device == {0: 0, 1: 1}
    for entry in ("forward", "decode"):
        p = placed[entry]
        moves = [n for n in p.graph.nodes if n.op == "to_device"]
        dim, vocab = model.config["dim"], model.config["vocab"]
        widths = sorted(n.output.type.shape[-1].value for n in moves)
        assert widths == [dim, vocab], entry  # the hidden state over, the logits back
        for name, device in p.state_device.items():  # kv.<layer>.<k or v>
            assert device == int(name.split(".")[1]), name
        for name, device in p.param_device.items():
            if name.startswith("layers."):
                assert device == int(name.split(".")[1]), name
        assert p.param_device["embed"] == 0 and p.param_device["lm_head"] == 1


def test_a_tied_embedding_gets_a_copy_on_the_last_device(tiny_dir):
    model, placed = _placed(tiny_dir, "tied", devices=PAIR)
    p = placed["decode"]
    assert p.replicas == {"embed__on1": ("embed", 1)}
    held = model.runner.tensors
    assert torch.equal(held["embed__on1"], held["embed"])  # (the same tensor on one CPU)
    gathers, head = (
        placed["forward"].graph.params["embed"],
        placed["forward"].graph.params["embed__on1"],
    )
    users = {n.op for n in placed["forward"].graph.nodes if head in n.inputs}
    assert users == {"linear"} and gathers is not head  # the head reads the copy


def test_check_placement_finds_a_missing_move(tiny_dir):
    model, placed = _placed(tiny_dir, devices=PAIR)
    p = placed["decode"]
    move = next(n for n in p.graph.nodes if n.op == "to_device")
    user = next(n for n in p.graph.nodes if move.output in n.inputs)
    user.inputs = [move.inputs[0] if v is move.output else v for v in user.inputs]
    with pytest.raises(PlacementError, match="a move is missing"):
        check_placement(p)


def test_explicit_split_and_bad_ones(tiny_dir):
    ck = build_tiny("llama", "deep", out_dir=tiny_dir)
    model = _load(ck, "generated", devices=["cpu", "cpu", "cpu"], split=[1, 2, 1])
    assert model.placement.layer_device == {0: 0, 1: 1, 2: 1, 3: 2}
    one = _load(ck, "generated")
    ids = probe_ids(one.config["vocab"])
    assert_close(model.forward(ids), one.forward(ids), atol=0.0, rtol=0.0, what="logits")
    for split in ([2, 1, 1, 0], [3, 2], [4]):
        with pytest.raises(PlacementError, match="one layer or more"):
            _load(ck, "generated", devices=PAIR, split=split)
    with pytest.raises(PlacementError, match="5 devices but only 4 layers"):
        _load(ck, "generated", devices=["cpu"] * 5)
    with pytest.raises(PlacementError, match="not compile: the hand-overs"):
        _load(ck, "compile", devices=PAIR)


@pytest.mark.parametrize("what", [dict(dtype="q8_0"), dict(tensor_parallel=2)])
def test_placement_refuses_packed_dtypes_and_tensor_parallel_saying_why(tiny_dir, what):
    ck = build_tiny("llama", "deep", out_dir=tiny_dir)
    for where in (dict(devices=PAIR), dict(max_device_bytes="1GiB")):
        with pytest.raises(PlacementError, match="moves and streams dense params only"):
            linnet.torch.load(ck, mode="generated", **where, **what)


def test_prelude_moves_copy_and_pass_python_numbers_through():
    from linnet.backends.torch import prelude

    x = torch.arange(4.0)
    for moved in (prelude.move_to(x, "cpu"), prelude.prefetch_to(x, "cpu")):
        assert torch.equal(moved, x) and moved.data_ptr() != x.data_ptr()  # a real copy
    assert prelude.await_copy(x) is x  # nothing to wait for on the CPU
    assert prelude.move_to(0.5, "cuda:1") == 0.5  # a generated scalar constant


def test_split_by_bytes_balances_and_stays_contiguous():
    # layer bytes 10, 10, 10, 30: each layer goes where its middle byte falls
    assert split_layers({0: 10, 1: 10, 2: 10, 3: 30}, 2) == {0: 0, 1: 0, 2: 0, 3: 1}
    assert split_layers({i: 1 for i in range(6)}, 3) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    assert parse_bytes("8GiB") == 8 << 30 and parse_bytes("512MB") == 512 * 10**6
    with pytest.raises(PlacementError, match="not a size"):
        parse_bytes("eight gigs")


def test_linnet_run_devices_prints_the_placement_and_the_same_text(tiny_dir, tmp_path):
    from tests.tiny_tokenizer import add_tiny_tokenizer

    ck = tmp_path / "llama"
    shutil.copytree(build_tiny("llama", "base", out_dir=tiny_dir), ck)
    add_tiny_tokenizer(ck)
    args = [sys.executable, "-m", "linnet", "run", str(ck), "--no-chat", "--prompt", "w5 w9"]
    args += ["--max-new-tokens", "5", "--dtype", "f32", "--mode", "generated"]
    one = subprocess.run(args, capture_output=True, text=True, timeout=300)
    two = subprocess.run(
        args + ["--devices", "cpu,cpu", "--split", "1,1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    assert two.stdout == one.stdout and one.stdout.strip()
    assert "placement over cpu, cpu (2 layers)" in two.stderr
    assert "layers 0," in two.stderr and "layers 1," in two.stderr
    bad = subprocess.run(args + ["--split", "1,1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--split needs --devices" in bad.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="layers on a CUDA device need CUDA")
def test_split_between_the_host_and_a_gpu(tiny_dir):
    ck = build_tiny("llama", "base", out_dir=tiny_dir)
    one = _load(ck, "generated")
    two = _load(ck, "generated", devices=["cpu", "cuda:0"])
    ids = probe_ids(one.config["vocab"])
    assert_close(two.forward(ids).cpu(), one.forward(ids), atol=1e-4, rtol=0.0, what="logits")
    assert torch.equal(two.generate(ids[:1], NEW_TOKENS).cpu(), one.generate(ids[:1], NEW_TOKENS))


def test_smollm2_split_and_streamed_equal_one_device(smollm2_checkpoint):
    """Real weights (slow): 30 layers over two devices, and with a budget that streams
    most of them; the tied embedding on both sides of the split."""
    one = _load(smollm2_checkpoint, "generated")
    ids = torch.tensor([[1, 4093, 28, 2683, 253, 1115, 30, 2]])  # any ids within the vocab
    expected, tokens = one.forward(ids), one.generate(ids, NEW_TOKENS)
    fixed = sum(t.nbytes for n, t in one.params.items() if not n.startswith("layers."))
    layer = sum(t.nbytes for n, t in one.params.items() if n.startswith("layers.0."))
    del one
    for placement in (dict(devices=PAIR), dict(max_device_bytes=fixed + 10 * layer)):
        model = _load(smollm2_checkpoint, "generated", **placement)
        assert_close(model.forward(ids), expected, atol=0.0, rtol=0.0, what="logits")
        assert torch.equal(model.generate(ids, NEW_TOKENS), tokens)
        if "max_device_bytes" in placement:
            assert len(model.placement.streamed) == 30 - 8  # 8 held, room for 2 streamed


def test_rows_at_their_own_positions_run_split(tiny_dir):
    """The server's row decoding (`model.rows`, the `decode_rows` entry) over a split."""
    ck = build_tiny("llama", "base", out_dir=tiny_dir)
    results = []
    for placement in ({}, dict(devices=PAIR)):
        rows = _load(ck, "generated", **placement).rows(3, 64)
        first, second = rows.prefill(0, [5, 6, 7]), rows.prefill(2, [9, 10])
        step = rows.step([0, 2], [int(first.argmax()), int(second.argmax())])
        results.append([torch.as_tensor(x) for x in (first, second, step)])
    for split, whole in zip(*results, strict=True):
        assert_close(split, whole, atol=0.0, rtol=0.0, what="row logits")
