"""Weight-only quantized linears (q8_0, q4_0, q4_K; docs/torch.md "Quantized weights").

- the packed layout dequantizes to exactly what the gguf package reads from the same
  ggml block bytes (the formats' outside reference);
- `F.linear` on a PackedWeight (the kernel, one block of rows at a time) equals the
  reference decomposition, dequantize-then-matmul, to f32 summation order;
- a GGUF export imported packed runs the model the dequantized import runs, in every
  mode, and an HF folder quantized on load runs the weights its GGUF export holds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

import linnet.backends.torch.quantized as quantized
import linnet.gguf
import linnet.torch as lt
from linnet.backends.torch.quantized import PackedWeight
from linnet.quantize import ggml_bytes, to_packed_weight
from linnet.weights.gguf_packed import packed_from_ggml

KINDS = ("q8_0", "q4_0", "q4_k")
GGML = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K"}
CASES = [(k, 512) for k in KINDS] + [("q8_0", 96), ("q4_0", 96)]  # 96: an odd 3 groups
IDS = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])


def _packed(kind: str, rows=96, cols=512, seed=0) -> tuple[PackedWeight, np.ndarray]:
    """A random weight quantized as `kind`, and the ggml bytes it came from."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 1, (rows, 1))).astype(np.float32)
    raw = ggml_bytes(x, kind)
    return to_packed_weight(packed_from_ggml(raw, kind, x.shape), torch.float32), raw


def _gguf_dequantized(raw: np.ndarray, kind: str, shape) -> torch.Tensor:
    x = quants.dequantize(raw, GGMLQuantizationType[GGML[kind]]).reshape(tuple(shape))
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


@pytest.mark.parametrize("kind,cols", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_packed_layout_dequantizes_as_gguf_does(kind, cols):
    w, raw = _packed(kind, cols=cols)
    torch.testing.assert_close(
        w.dequantize(), _gguf_dequantized(raw, kind, w.shape), rtol=0, atol=0
    )


def _bound(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """f32 summation-order error bound for x @ dense^T: a few ulps of sum |x| |w|."""
    return 64 * torch.finfo(torch.float32).eps * (x.float().abs() @ dense.abs().t())


@pytest.mark.parametrize("kind,cols", CASES, ids=[f"{k}-{c}" for k, c in CASES])
@pytest.mark.parametrize("batch", [(1,), (2, 7)], ids=["decode", "batch"])
@pytest.mark.parametrize("chunk", [1 << 18, 3 * 512], ids=["whole", "3-rows"])
def test_packed_linear_matches_dequantize_then_matmul(kind, cols, batch, chunk, monkeypatch):
    monkeypatch.setattr(quantized, "_CHUNK", chunk)  # 3 rows: blocks of rows, a ragged end
    w, raw = _packed(kind, rows=97, cols=cols)
    shape = (*batch, cols)
    dense = _gguf_dequantized(raw, kind, w.shape)  # the reference outside Linnet's code
    x, b = torch.randn(shape), torch.randn(97)
    for bias in (None, b):
        got = F.linear(x, w, bias)
        want = F.linear(x, dense, bias)
        assert got.shape == want.shape and got.dtype == torch.float32
        delta = (got - want).abs()
        assert not (delta > _bound(x, dense).reshape(delta.shape)).any(), delta.max()


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_activations_round_once(kind):
    """bf16 x: the f32 result of the reference, rounded once to bf16."""
    w, _ = _packed(kind)
    x = torch.randn(3, 512).bfloat16()
    got = F.linear(x, w.to(torch.bfloat16))
    want = F.linear(x.float(), w.dequantize())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5)


def test_interpreter_shapes_of_a_weight():
    """What a weight meets in the interpreter and the runners stays packed or dequantizes
    correctly: a transpose then matmul, row slices and `cat` (fuse_linears), row gathers
    (embeddings), and any other op on the dequantized values."""
    w, _ = _packed("q4_0", rows=8, cols=64)
    dense, x, rows = w.dequantize(), torch.randn(2, 64), torch.tensor([[4, 1]])
    torch.testing.assert_close(torch.matmul(x, w.permute(1, 0)), x @ dense.t())
    stacked = torch.cat([w[:3], w[3:]])
    assert isinstance(stacked, PackedWeight) and isinstance(w[2:5], PackedWeight)
    torch.testing.assert_close(stacked.dequantize(), dense, rtol=0, atol=0)
    torch.testing.assert_close(w[rows], dense[rows], rtol=0, atol=0)
    torch.testing.assert_close(w * 2 + 1, dense * 2 + 1, rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_llama_ggufs(tiny_checkpoint, tmp_path_factory):
    """(folder, GGUF export) of a tiny Llama variant in a packed type, made once."""
    root, made = tmp_path_factory.mktemp("quantized"), {}

    def get(variant: str, kind: str):
        src = tiny_checkpoint("llama", variant)
        if (variant, kind) not in made:
            path = root / f"{variant}.{kind}.gguf"
            made[variant, kind] = linnet.gguf.export(src, path, dtype=kind, progress=False)
        return src, made[variant, kind]

    return get


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    delta = (got - want).abs().max().item()
    assert delta <= 1e-5 * want.abs().max().item(), delta


def _all_matrices_packed(model) -> None:
    matrices = [n for n, p in model.params.items() if p.dim() == 2]
    assert matrices and all(isinstance(model.params[n], PackedWeight) for n in matrices)


# tied: SmolLM2-like, the packed embedding is also the head; hidden 96 is 3 groups (odd)
@pytest.mark.parametrize("variant", ["base", "tied"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_gguf_imported_packed_equals_dequantized_import(tiny_llama_ggufs, kind, mode, variant):
    _, gguf = tiny_llama_ggufs(variant, kind)
    want_model = lt.load(gguf)  # dequantized to f32 on load
    model = lt.load(gguf, dtype=kind, mode=mode)
    _all_matrices_packed(model)
    _close(model.forward(IDS), want_model.forward(IDS))
    assert model.generate(IDS, 6).tolist() == want_model.generate(IDS, 6).tolist()


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_hf_folder_quantized_on_load_runs_its_gguf_export(tiny_llama_ggufs, kind):
    src, gguf = tiny_llama_ggufs("base", kind)
    model = lt.load(src, dtype=kind.upper(), mode="generated")
    _all_matrices_packed(model)
    _close(model.forward(IDS), lt.load(gguf).forward(IDS))
