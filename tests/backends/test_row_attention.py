"""A step over cache rows in one C++ call (kernels/decode_ops.cpp's `decode_attention_rows`,
prelude.py's `_rows_attention`; docs/serve.md "Session 12: AVX2 CPU"):

- within 2e-6 of `attention_ref` with per-row positions (rows of different lengths, GQA,
  windows, sinks), the bound `decode_attention` keeps (f32 sums in another order, a
  polynomial e^x);
- no row reads past its own position: NaN in every slot beyond it leaves the output
  as it was;
- bf16 rows go through it widened to f32 (attention_fast's bf16 path on CPUs without a
  bf16 dot product); `attention_fast` keeps the PyTorch path for several queries a row, a
  padding mask, and LINNET_KERNELS=0 (bit for bit what it gave before the op);
- shapes for tracing (a Meta kernel: opcheck's fake-tensor check);
- tiny Llama and Mistral (a window of 8) served on rows in `generated`/`fast` call it
  once a layer per step and give transformers' greedy tokens and logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch import prelude as P
from tests.backends.test_rows import POSITIONS, check_schedule

pytestmark = pytest.mark.skipif(
    not kernels.cpu_supported(), reason="the C++ kernels need an x86 CPU with AVX2"
)
LENGTHS = (1, 9, 40, 23, 2)  # each row's keys: its query sits at length - 1


def _rows(heads, kv, d, g, dtype=torch.float32):
    """q [B, H, 1, D]; k, v the first max(LENGTHS) slots of a [B, KV, 64, D] cache (a
    strided slice, as a step reads it); positions [B, 1], each row's last key."""
    b, t = len(LENGTHS), max(LENGTHS)
    q = torch.randn(b, heads, 1, d, generator=g) * 2
    k, v = torch.randn(2, b, kv, 64, d, generator=g)
    positions = torch.tensor(LENGTHS).reshape(b, 1) - 1
    return q.to(dtype), k[:, :, :t].to(dtype), v[:, :, :t].to(dtype), positions


@pytest.mark.parametrize("window", [0, 1, 8, 40])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize(("heads", "kv", "d"), [(4, 4, 8), (6, 2, 17), (9, 3, 64)])
def test_rows_within_f32_bound_of_attention_ref(spy, window, sinks, heads, kv, d):
    g = torch.Generator().manual_seed(heads * 100 + d + window)
    q, k, v, positions = _rows(heads, kv, d, g)
    s = torch.randn(heads, generator=g) if sinks else None
    got = P.attention_fast(q, k, v, True, positions, window, None, None, s)
    want = P.attention_ref(q, k, v, True, positions, window, None, None, s)
    assert spy.calls == {"decode_attention_rows": 1}
    assert got.shape == want.shape == q.shape
    assert (got - want).abs().max().item() <= 2e-6


def test_no_row_reads_past_its_position(spy):
    """NaN in every cache slot past each row's position (the slots a longer row's reach
    spans): the output is what it was with finite values there."""
    g = torch.Generator().manual_seed(1)
    q, k, v, positions = _rows(6, 2, 16, g)
    clean = P.attention_fast(q, k, v, True, positions, 0, 0.3)
    for row, n in enumerate(LENGTHS):
        k[row, :, n:] = float("nan")
        v[row, :, n:] = float("nan")
    assert torch.equal(P.attention_fast(q, k, v, True, positions, 0, 0.3), clean)
    assert spy.calls == {"decode_attention_rows": 2}


def test_pytorch_path_where_the_op_does_not_apply(spy, monkeypatch):
    """Two queries a row, a padding mask: no op; LINNET_KERNELS=0: the masked SDPA
    attention_fast called before the op, bit for bit."""
    g = torch.Generator().manual_seed(2)
    q, k, v, positions = _rows(4, 2, 16, g)
    two = torch.cat([positions - 1, positions], dim=1).clamp(min=0)
    P.attention_fast(q.expand(-1, -1, 2, -1), k, v, True, two, 0, None)
    P.attention_fast(q, k, v, True, positions, 0, None, torch.ones(len(LENGTHS), k.shape[2]))
    assert spy.calls == {}
    monkeypatch.setenv("LINNET_KERNELS", "0")
    mask = P._allowed(positions, 1, k.shape[2], 0, q.device)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.equal(P.attention_fast(q, k, v, True, positions, 0, None), want)
    assert spy.calls == {}


def test_bf16_rows_widened_through_the_op(spy, monkeypatch):
    """Without a bf16 dot product, bf16 rows attend through the f32 op on widened inputs."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, False)
    g = torch.Generator().manual_seed(4)
    q, k, v, positions = _rows(6, 2, 16, g, torch.bfloat16)
    got = P.attention_fast(q, k, v, True, positions, 8, None)
    want = P.attention_ref(q.float(), k.float(), v.float(), True, positions, 8, None)
    assert spy.calls == {"decode_attention_rows": 1} and got.dtype == torch.bfloat16
    bound = want.abs() * 2**-8 + 2e-6  # the op's f32 bound, then one rounding to bf16
    assert ((got.float() - want).abs() <= bound).all()


def test_bf16_rows_attend_natively_with_a_bf16_dot(spy, monkeypatch):
    """With one (AVX512-BF16), bf16 rows stay bf16: torch's masked SDPA, no op, no copies
    of the cache in f32; each row still sees only its own keys."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, True)
    g = torch.Generator().manual_seed(4)
    q, k, v, positions = _rows(6, 2, 16, g, torch.bfloat16)
    got = P.attention_fast(q, k, v, True, positions, 8, None)
    assert spy.calls == {} and got.dtype == torch.bfloat16
    mask = P._allowed(positions, 1, k.shape[2], 8, q.device)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.equal(got, want)
    exact = P.attention_ref(q.float(), k.float(), v.float(), True, positions, 8, None)
    assert ((got.float() - exact).abs() <= exact.abs().max() * 2**-6).all()


def test_op_checks_and_fake_shapes(ops):
    g = torch.Generator().manual_seed(3)
    q, k, v, positions = _rows(4, 2, 8, g)
    args = (q, k, v, 0.3, positions.reshape(-1), 4, torch.randn(4, generator=g))
    torch.library.opcheck(
        ops.decode_attention_rows.default, args, test_utils=("test_schema", "test_faketensor")
    )
    with pytest.raises(RuntimeError, match="positions: 0..T-1"):
        ops.decode_attention_rows(q, k, v, 0.3, positions.reshape(-1) + 1, 0, None)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_rows_schedule_runs_the_op_and_gives_transformers_tokens(spy, tiny_checkpoint, arch):
    """tests/backends/test_rows.py's schedule (five requests on four rows, prefills while
    others decode, a freed row reused) in `generated`/`fast`: greedy tokens equal
    transformers' and each request's solo run, logits within 1e-4; the steps of several
    rows attend through the op."""
    folder = tiny_checkpoint(arch)
    model = lt.load(folder, max_positions=POSITIONS, mode="generated", numerics="fast")
    check_schedule(model, folder)
    assert spy.calls.get("decode_attention_rows", 0) > 0
