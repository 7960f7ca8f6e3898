"""Decode steps on the calling thread and Linnet's helper thread, which shares the linears'
rows and reads the weights ahead between them (stream_ahead.py, kernels/stream_ahead.h):
the step must give the same bits as the step split over torch's threads, each kernel's
shared rows the bits of its split ones, the helper must really learn the step's weights,
read them and run rows (its own counts), torch must get its threads back, and the helper
must never read a weight that was freed: it holds weak references to the storages. Its
speed is measured in bench/packed_decode.py (`--threads 2`, "linears split")."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import linnet.backends.torch.quantized as quantized
import linnet.torch as lt
from linnet.backends.torch import kernels, stream_ahead
from linnet.quantize import quantize_params
from tests.checkpoints import build_tiny, greedy_steps


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def f32_ours(ops):
    """AMD's choices forced on, so f32 decode linears are f32_gemv.cpp's on any CPU the
    kernels build for (elsewhere torch's linear runs them, and nothing is streamed)."""
    before = kernels.force_amd_tuning(1)
    try:
        yield
    finally:
        kernels.force_amd_tuning(before)


@pytest.mark.parametrize("dtype", ["bf16", "q8_0", "q4_0", "f32"])
def test_streamed_steps_give_the_split_steps_bits(ops, two_threads, monkeypatch, dtype, request):
    if dtype == "f32":
        request.getfixturevalue("f32_ours")
    folder = str(build_tiny("llama", "base"))
    model = lt.load(folder, mode="generated", numerics="fast", dtype=dtype)
    assert model.runner.one_core
    read = ops.stream_ahead_stats()[0]
    streamed = greedy_steps(model, 4)
    assert torch.get_num_threads() == 2  # given back after every step
    read_after, learned, _ = ops.stream_ahead_stats()
    # a cycle of every weight a step reads: each layer's fused qkv, wo, fused gate/up and
    # down, then the head (packed: codes and scales each, and q4_0's offsets where the
    # integer kernel does not derive them from the scales), and the helper read ahead in it
    per_weight = {"q8_0": 2, "q4_0": 2 if kernels.int8x_derived_offsets() else 3}.get(dtype, 1)
    assert learned == (4 * model.hf_config["num_hidden_layers"] + 1) * per_weight
    deadline = time.monotonic() + 10  # the helper runs on its own: give it steps to follow
    while read_after == read and time.monotonic() < deadline:
        greedy_steps(model, 1)
        time.sleep(0.001)
        read_after = ops.stream_ahead_stats()[0]
    assert read_after > read
    monkeypatch.setenv("LINNET_STREAM_AHEAD", "0")
    split = greedy_steps(model, 4)
    assert all(torch.equal(a, b) for a, b in zip(streamed, split))


def test_not_streamed_where_torch_runs_the_linears(ops, two_threads, monkeypatch):
    folder = str(build_tiny("llama", "base"))
    before = kernels.force_amd_tuning(0)  # f32 decode linears then torch's (f32_gemv_preferred)
    try:
        assert not lt.load(folder, mode="generated", numerics="fast").runner.one_core
    finally:
        kernels.force_amd_tuning(before)
    assert not lt.load(folder, mode="generated", numerics="equivalent").runner.one_core
    assert not stream_ahead.one_token_step([torch.zeros(1, 5, dtype=torch.long)])  # a prompt
    assert not stream_ahead.one_token_step([torch.zeros(8, 1, dtype=torch.long)])  # 8 rows
    assert stream_ahead.one_token_step([torch.zeros(2, 1, dtype=torch.long)])


def _kernel_linear(ops, kind: str):
    """A decode kernel's linear of one row on a weight big enough to be cut into chunks
    (2048 x 768), as a call, or None where that kernel does not run here."""
    torch.manual_seed(0)
    w, x = torch.randn(2048, 768), torch.randn(1, 768)
    if kind == "bf16":
        w, x = w.bfloat16(), x.bfloat16()
        return (lambda: ops.bf16_linear(x, w, None)) if kernels.bf16_gemv_available() else None
    if kind == "f32":  # the op itself, whichever cpu_tuning.h choice would offer it
        return (lambda: ops.f32_linear(x, w, None)) if ops.f32_gemv_native() else None
    packed = quantize_params({"w": w}, kind)["w"]
    packed.int8_x = kind != "q4_k"  # the integer kernel, and the f32 one for q4_K
    return lambda: quantized.decode_linear(x, packed)


@pytest.mark.parametrize("kind", ["bf16", "f32", "q8_0", "q4_0", "q4_k"])
def test_shared_rows_give_the_split_bits(ops, two_threads, amd_tuning, kind):
    """Both sides of cpu_tuning.h: the Xeon's walks and 512-bit integer kernel, AMD's."""
    run = _kernel_linear(ops, kind)
    if run is None:
        pytest.skip(f"no {kind} decode kernel here (this build, these cpu_tuning.h choices)")
    split = run()
    before = ops.stream_ahead(1 << 20)
    assert not ops.stream_ahead_step(True)
    try:
        chunks = ops.stream_ahead_stats()[2]
        deadline = time.monotonic() + 10  # the helper wakes at a note: give it calls to join
        while ops.stream_ahead_stats()[2] == chunks and time.monotonic() < deadline:
            assert torch.equal(run(), split)
        for _ in range(20):
            assert torch.equal(run(), split)
    finally:
        ops.stream_ahead_step(False)
        ops.stream_ahead(before)
    assert ops.stream_ahead_stats()[2] > chunks  # the helper ran some of the rows


@pytest.mark.parametrize("threads", [1, 3])
def test_the_step_takes_one_thread_only_where_torch_has_two(ops, threads):
    """One helper takes half of a linear: with more threads than two (not measured) each
    linear splits over torch's threads as before, with one there is no second core."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with stream_ahead.one_core_step():
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    torch.set_num_threads(2)
    try:
        with stream_ahead.one_core_step():
            assert torch.get_num_threads() == 1  # the step's thread; the helper is the other
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 2 << 20), ("0", 0), ("off", 0), ("2", 2 << 20), ("0.5", 1 << 19)],
)
def test_budget_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("LINNET_STREAM_AHEAD", raising=False)
    else:
        monkeypatch.setenv("LINNET_STREAM_AHEAD", value)
    assert stream_ahead.budget_bytes() == expected


def test_a_bad_budget_warns_and_takes_the_default(monkeypatch):
    monkeypatch.setenv("LINNET_STREAM_AHEAD", "lots")
    with pytest.warns(UserWarning, match="LINNET_STREAM_AHEAD"):
        assert stream_ahead.budget_bytes() == stream_ahead.DEFAULT_MB << 20


def test_the_ops_answer_and_refuse(ops):
    with pytest.raises(RuntimeError, match="bytes >= 0"):
        ops.stream_ahead(-1)
    before = ops.stream_ahead(0)
    try:
        assert not ops.stream_ahead_step(True)  # no budget: the step is not streamed
        assert not ops.stream_ahead_step(False)
    finally:
        ops.stream_ahead(before)


# Three weights, each in a mapping of its own, read in a cycle until the helper has learned
# it; then the middle one is freed and its mapping unmapped while the cycle goes on over the
# other two: the helper, reading ahead of the first, comes to the second's bytes every
# lap. A read of them would be a fault (the process dies of SIGSEGV).
_FREED = """
import mmap, time
import torch
from linnet.backends.torch import kernels
torch.manual_seed(0)
ops = kernels.load()
rows, cols = 256, 576


def mapped():
    m = mmap.mmap(-1, rows * cols * 2)
    w = torch.frombuffer(m, dtype=torch.bfloat16).view(rows, cols)
    w.copy_(torch.randn(rows, cols).bfloat16())
    return w, m


(a, ma), (b, mb), (c, mc) = mapped(), mapped(), mapped()
x = torch.randn(1, cols).bfloat16()
ops.stream_ahead(1 << 20)
expected = [ops.bf16_linear(x, w, None) for w in (a, b, c)]
assert ops.stream_ahead_step(True) is False
for _ in range(50):
    got = [ops.bf16_linear(x, w, None) for w in (a, b, c)]
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    time.sleep(0.001)
read, learned, _ = ops.stream_ahead_stats()
assert learned == 3 and read > 0, (read, learned)
del b, got
mb.close()  # munmap: its bytes are gone
t_end = time.time() + 0.5
while time.time() < t_end:
    ops.bf16_linear(x, a, None), ops.bf16_linear(x, c, None)
    time.sleep(0.0002)
ops.stream_ahead_step(False)
print("read", ops.stream_ahead_stats()[0] - read)
"""


def test_the_helper_never_reads_a_freed_weight(ops):
    assert kernels.bf16_gemv_available()  # AVX2 and FMA at least, as the kernels need
    done = subprocess.run(
        [sys.executable, "-c", _FREED], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # -11: it read freed bytes
    assert int(done.stdout.split()[-1]) > 0  # it went on reading the other two
