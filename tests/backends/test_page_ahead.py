"""The row kernels' page-ahead prefetch (kernels/page_ahead.h): one prefetch for each
4 KB page some distance ahead of the row a kernel starts. It must change no result and
never fault, even where the distance runs past a weight's mapping into pages that cannot
be read; its speed is measured in bench/packed_decode.py ("4 KB pages, no page-ahead")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from linnet.backends.torch import kernels
from tests.backends.avx2_build import avx512f, run_avx2_build

# A weight whose last byte ends a readable mapping, 64 unreadable pages (PROT_NONE) after
# it: a row kernel near the end prefetches into them. Each op's answer, with the
# prefetch off, 4 KB ahead and the default 128 KB ahead, must be the same bits.
_GUARDED = """
import ctypes, mmap
libc = ctypes.CDLL(None)
GUARD = 64 * 4096


def guarded(rows, cols, dtype):
    nbytes = rows * cols * torch.tensor([], dtype=dtype).element_size()
    data = -(-nbytes // 4096) * 4096
    m = mmap.mmap(-1, data + GUARD)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(ctypes.c_void_p(base + data), GUARD, 0) == 0  # PROT_NONE
    w = torch.frombuffer(m, dtype=torch.uint8, count=data)[data - nbytes :]
    w = w.view(dtype).view(rows, cols)
    w.copy_(torch.randn(rows, cols).to(dtype))
    return w, m


def same_bits_at_every_distance(op, dtype, rows=300, cols=576):
    w, keep = guarded(rows, cols, dtype)
    x = torch.randn(1, cols).to(dtype)
    answers = []
    for ahead in (0, 4096, 128 * 1024):
        if hasattr(ops, "page_ahead"):
            ops.page_ahead(ahead)
        answers.append(op(x, w, None))
    assert all(torch.equal(answers[0], a) for a in answers[1:]), op
    assert torch.isfinite(answers[0]).all()
"""


def _run(script: str) -> str:
    prelude = (
        "import torch\n"
        "from linnet.backends.torch import kernels\n"
        "ops = kernels.load()\n"
        "torch.manual_seed(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # -11: a fault
    return done.stdout


def test_the_distance_is_set_and_answered(ops):  # ops: conftest's, the kernels built
    default = kernels.set_page_ahead(0)
    try:
        assert default == 128 * 1024
        assert kernels.set_page_ahead(8192) == 0
        assert kernels.set_page_ahead(default) == 8192
        for wrong in (100, -4096):
            with pytest.raises(RuntimeError, match="4 KB pages"):
                kernels.set_page_ahead(wrong)
    finally:
        kernels.set_page_ahead(default)


def test_rows_read_up_to_unreadable_pages_the_same_at_every_distance(ops):
    """AMD's walks (forced: the row kernels that prefetch pages), f32 and bf16, in a
    process of its own (a fault would kill it)."""
    script = _GUARDED + (
        "ops.amd_tuning(1)\n"
        "same_bits_at_every_distance(ops.f32_linear, torch.float32, cols=1536)\n"
        "same_bits_at_every_distance(ops.f32_linear, torch.float32)\n"
        "if ops.bf16_gemv_native():\n"
        "    same_bits_at_every_distance(ops.bf16_linear, torch.bfloat16)\n"
        "print('ok')\n"
    )
    assert _run(script).split() == ["ok"]


@pytest.mark.skipif(not avx512f(), reason="the AVX2 build is tested beside an AVX-512 one")
def test_the_avx2_walks_read_up_to_unreadable_pages(tmp_path):
    """The AVX2 code of bf16_gemv.cpp (AMD's four chains) and f32_gemv.cpp, each built
    alone (`avx2_build`; f32_gemv.cpp's library has no distance op: its default)."""
    bf16 = _GUARDED + (
        "ops.amd_tuning(1)\n"
        "same_bits_at_every_distance(ops.bf16_linear, torch.bfloat16)\n"
        "print('ok')\n"
    )
    f32 = _GUARDED + (
        "same_bits_at_every_distance(ops.f32_linear, torch.float32, cols=1536)\n"
        "print(ops.f32_gemv_lanes())\n"
    )
    assert run_avx2_build("bf16_gemv.cpp", bf16, tmp_path).split() == ["ok"]
    assert run_avx2_build("f32_gemv.cpp", f32, tmp_path).split() == ["8"]
