"""GGUF exports in q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K and the q4_K_M / q5_K_M mixes,
against the gguf package and llama.cpp (llama-cpp-python).

* Blocks: every type's packed blocks, dequantized by the gguf package
  (`gguf.quants.dequantize`, its own numpy reading of ggml's layouts), equal Linnet's own
  reconstruction exactly, on random rows and edge cases (zero, constant, one outlier,
  subnormal-small rows); the round-trip error on random rows stays within the type's
  bound (`RANDOM_REL_RMSE`). The 32-block types are byte for byte the gguf package's
  quantizers, which follow ggml's reference ones.
* Against llama.cpp's own quantizer (`llama_model_quantize` on Linnet's f32 export: `pure`
  for the single types, its default rules for the mixes): every tensor gets the type
  llama.cpp gives it (mixes and fallbacks included), the file type is llama.cpp's, and
  each tensor's RMSE against the f32 weights is at most `RMSE_MARGIN` times llama.cpp's.
  On tiny Llama and GPT-2 models whose rows are whole 256-blocks (so the k-quants are not
  replaced by their fallbacks) and on SmolLM2-135M (slow; hidden 576, so only its
  1536-wide ffn_down rows are k-quant blocks).
* llama.cpp runs every export: its logits on Linnet's file stay within `LOGITS_VS_LLAMA`
  (tiny models, all positions, relative to the largest logit) and `SMOLLM2_VS_LLAMA`
  (SmolLM2 chat prompts, last position) of its logits on its own quantization of the same
  type, gives the same first token, and its distance from transformers' f32 logits is at
  most `QUANT_NOISE_MARGIN` times that of llama.cpp's file; on SmolLM2, q8_0 / q6_K /
  q5_K_M / q4_K_M give transformers' f32 first token, except on "Say hello." in q5_K_M,
  where llama.cpp's own q5_K_M file gives the same other token (`OWN_FLIPS`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import quants
from linnet.converters.gguf_quants import BLOCK, encode
from linnet.converters.gguf_types import ggml_type

import linnet.gguf
from linnet.weights.gguf_file import GgufFile
from tests.checkpoints import (
    CHAT_MESSAGES,
    load_reference,
    logit_gaps,
    probe_ids,
    tiny_config,
)
from tests.tiny_decoders import draw_separated

KINDS = ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
DTYPES = (*KINDS, "q4_k_m", "q5_k_m")
# RMSE / std on N(0, 1) rows: measured q4_0 0.0862, q4_1 0.0782, q5_0 0.0428, q5_1 0.0380,
# q4_K 0.0715, q5_K 0.0363, q6_K 0.0178; bounds 1.1x.
RANDOM_REL_RMSE = dict(q4_0=0.095, q4_1=0.086, q5_0=0.047, q5_1=0.042, q4_k=0.079)
RANDOM_REL_RMSE.update(q5_k=0.040, q6_k=0.0196)
RMSE_MARGIN = 1.02  # per tensor, Linnet's error vs llama.cpp's
# llama.cpp on Linnet's file vs on its own quantization of the same type. The 32-block
# files are byte for byte llama.cpp's (so are q8_0's): equal logits. The k-quants differ
# in some blocks (float sums in another order pick another candidate scale now and then).
# Tiny models (max |Δ| / max |logit|) amplify weight noise: random weights, 8 layers,
# logits up to 135; llama.cpp's own q4_0 moves them by 1.09 of max |logit|. Measured, llama
# / gpt2: q4_K 0.236 / 0.064, q5_K 0.192 / 0.051, q6_K 0.125 / 0.055, q4_K_M 0.217 / 0.053,
# q5_K_M 0.149 / 0.057.
LOGITS_VS_LLAMA = dict(q4_0=0, q4_1=0, q5_0=0, q5_1=0, q8_0=0, q4_k=0.35, q5_k=0.3)
LOGITS_VS_LLAMA.update(q6_k=0.2, q4_k_m=0.35, q5_k_m=0.25)
# And each file's distance from llama.cpp's f32 logits: Linnet's at most this times
# llama.cpp's (measured worst 1.19, q6_K on the tiny Llama).
QUANT_NOISE_MARGIN = 1.5
# SmolLM2 chat prompts, last position, max |Δ| (logits up to about 30). Measured: the
# 32-block types and q8_0 0 (same bytes); q4_K 1.39, q5_K 1.24, q6_K 1.03, q4_K_M 1.39,
# q5_K_M 2.06.
SMOLLM2_VS_LLAMA = dict(q4_0=0, q4_1=0, q5_0=0, q5_1=0, q8_0=0, q4_k=2.5, q5_k=2.5)
SMOLLM2_VS_LLAMA.update(q6_k=2.0, q4_k_m=2.5, q5_k_m=3.0)
FIRST_TOKEN_TYPES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m")
# Where llama.cpp's own quantization of the type also leaves transformers' f32 first token
# (f32 top-2 gap 0.40): both files give 10813 for 19556. Linnet's file must still give
# llama.cpp's own file's token.
OWN_FLIPS = {("q5_k_m", "Say hello.")}
# llama.cpp's file type per export dtype; the single types are quantized `pure`.
LLAMA_FTYPES = dict(q4_0="Q4_0", q4_1="Q4_1", q5_0="Q5_0", q5_1="Q5_1", q4_k="Q4_K_S")
LLAMA_FTYPES.update(q5_k="Q5_K_S", q6_k="Q6_K", q4_k_m="Q4_K_M", q5_k_m="Q5_K_M", q8_0="Q8_0")


def _random_rows(rows: int = 64, n: int = 1024, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)


def _edge_rows(n: int = 512) -> np.ndarray:
    x = _random_rows(8, n, seed=1) * 0.02
    x[0] = 0  # all zero
    x[1] = -0.3  # constant below zero (the min carries it)
    x[2] = 0.7  # constant above zero
    x[3, 5] = 40.0  # one outlier
    x[4] *= 1e-30  # below f16's range: scales flush to zero
    x[5, ::2] = 0  # half zeros
    x[6] = np.abs(x[6])  # all positive
    x[7] = -np.abs(x[7])  # all negative
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_read_back_by_gguf(kind):
    """gguf's dequantizer reads Linnet's blocks to exactly Linnet's reconstruction."""
    block, size = gguf.GGML_QUANT_SIZES[ggml_type(kind)]
    assert BLOCK[kind] == block
    for x in (_random_rows(), _edge_rows()):
        packed, values = encode(x, kind)
        assert packed.dtype == np.uint8 and packed.shape == (len(x), x.shape[1] // block * size)
        np.testing.assert_array_equal(quants.dequantize(packed, ggml_type(kind)), values)
    x = _random_rows()
    rel = float(np.sqrt(np.mean((encode(x, kind)[1] - x) ** 2)) / x.std())
    print(f"{kind}: RMSE / std {rel:.4f} on N(0, 1) rows")
    assert rel <= RANDOM_REL_RMSE[kind]
    edges = _edge_rows()
    values = encode(edges, kind)[1]
    np.testing.assert_array_equal(values[0], 0)
    np.testing.assert_allclose(values[1:3], edges[1:3], rtol=1e-3)  # constants come back
    assert np.isfinite(values).all()


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q5_0", "q5_1"])
def test_32_blocks_are_ggml_reference(kind):
    for x in (_random_rows(), _edge_rows()):
        np.testing.assert_array_equal(encode(x, kind)[0], quants.quantize(x, ggml_type(kind)))


def test_rows_must_be_whole_blocks():
    with pytest.raises(ValueError, match="whole blocks of 256"):
        encode(np.zeros((2, 96), np.float32), "q6_k")


# ---------------------------------------------------------------------------------------
# Against llama.cpp's quantizer


def llama_quantize(src: Path, out: Path, dtype: str) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{LLAMA_FTYPES[dtype]}")
    params.pure = not dtype.endswith("_m")
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize {dtype}: {rc}"
    return out


def read_tensors(path: Path) -> tuple[int, dict[str, tuple[str, np.ndarray]]]:
    """(general.file_type, {name: (type name, f32 values)}): the bytes through Linnet's GGUF
    reader (tests/weights/test_gguf_file.py holds it equal to the gguf package's, which
    takes seconds per open on the vocabulary), the values by the gguf package's dequantizer."""
    reader = GgufFile(path)
    values = {
        t.name: (t.tensor_type.name, quants.dequantize(t.data, t.tensor_type).reshape(-1))
        for t in reader.tensors
    }
    return int(reader.fields["general.file_type"].contents()), values


def compare_with_llama_cpp(f32: Path | dict, mine: Path, theirs: Path, label: str) -> dict:
    """Types and file type equal; per tensor, Linnet's RMSE vs the f32 weights (a file, or
    its `read_tensors` values when several types share it) at most RMSE_MARGIN times
    llama.cpp's. Returns the whole-file RMSEs."""
    ref = f32 if isinstance(f32, dict) else read_tensors(f32)[1]
    (ft_mine, got), (ft_theirs, want) = read_tensors(mine), read_tensors(theirs)
    assert ft_mine == ft_theirs, f"{label}: general.file_type {ft_mine} != {ft_theirs}"
    assert sorted(got) == sorted(ref) == sorted(want)
    err = {"linnet": 0.0, "llama.cpp": 0.0, "n": 0, "worst": 0.0}
    for name, (_, x) in ref.items():
        assert got[name][0] == want[name][0], f"{label} {name}: {got[name][0]} != {want[name][0]}"
        e_mine = float(np.sqrt(np.mean((got[name][1] - x) ** 2)))
        e_theirs = float(np.sqrt(np.mean((want[name][1] - x) ** 2)))
        if e_theirs == 0:  # kept as it was (f32): so must Linnet's be
            assert e_mine == 0, f"{label} {name}: RMSE {e_mine:.3g} where llama.cpp's is 0"
            continue
        assert e_mine <= RMSE_MARGIN * e_theirs, (
            f"{label} {name} ({got[name][0]}): RMSE {e_mine:.4g} vs llama.cpp {e_theirs:.4g}"
        )
        err["worst"] = max(err["worst"], e_mine / e_theirs)
        err["linnet"] += e_mine**2 * x.size
        err["llama.cpp"] += e_theirs**2 * x.size
        err["n"] += x.size
    err = {
        k: (np.sqrt(v / err["n"]) if k in ("linnet", "llama.cpp") else v) for k, v in err.items()
    }
    print(
        f"{label}: RMSE Linnet {err['linnet']:.4e}, llama.cpp {err['llama.cpp']:.4e} "
        f"(worst tensor ratio {err['worst']:.4f})"
    )
    return err


# Rows of 256 and 512 (whole k-quant blocks), 8 layers (the mixes' layer rule bites).
TINY_FIELDS = {
    "llama": dict(vocab=256, dim=256, ffn=512, n_layers=8, n_heads=4, n_kv=2, max_positions=128,
                  eps=1e-5, rope_scaling="default", rope_theta=10000.0, tied=False),
    "gpt2": dict(vocab=256, n_positions=128, max_positions=128, dim=256, n_layers=8, n_heads=4,
                 eps=1e-5),
}  # fmt: skip
# Rows of 96 and 112: k-quants fall back (q4_K -> q5_0, q6_K -> q8_0), ffn_down's rows of
# 112 are not whole 32-blocks (-> f16), and the tied embedding is the mixes' q8_0 head.
TINY_FIELDS["narrow"] = dict(TINY_FIELDS["llama"], dim=96, ffn=112, n_heads=6, tied=True)
TINY_ARCH = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "narrow": "LlamaForCausalLM"}


@pytest.fixture(scope="module")
def wide_tiny(tmp_path_factory):
    """arch -> (checkpoint folder, its f32 GGUF export without a tokenizer)."""
    root = tmp_path_factory.mktemp("wide-tiny")
    made = {}

    def get(arch: str):
        if arch not in made:
            model, _, _ = draw_separated(tiny_config(TINY_ARCH[arch], TINY_FIELDS[arch]), arch)
            src = root / arch
            model.save_pretrained(src)
            f32 = linnet.gguf.export(
                src, root / f"{arch}.f32.gguf", dtype="f32", tokenizer=False, progress=False
            )
            made[arch] = (src, f32)
        return made[arch]

    return get


def _llama(path: Path, **kw):
    import llama_cpp

    # torch's thread budget (scripts/test.sh: one per pytest worker, as the two workers fill
    # the two cores): ggml's threads busy-wait for each other at every op
    threads = torch.get_num_threads()
    kw = {"n_ctx": 256, "logits_all": True, "verbose": False, "n_threads": threads, **kw}
    return llama_cpp.Llama(model_path=str(path), **kw)


def _scores(path: Path, ids: list[int]) -> np.ndarray:
    llm = _llama(path)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gpt2", "narrow"])
def test_tiny_against_llama_cpp(wide_tiny, tmp_path, arch, dtype):
    src, f32 = wide_tiny(arch)
    mine = linnet.gguf.export(src, tmp_path / "linnet.gguf", dtype=dtype.upper(), progress=False,
                              tokenizer=False)  # fmt: skip
    theirs = llama_quantize(f32, tmp_path / "llama.gguf", dtype)
    compare_with_llama_cpp(f32, mine, theirs, f"{arch} {dtype}")
    ids = probe_ids(256, (1, 24))[0].tolist()
    base, got, want = (_scores(p, ids) for p in (f32, mine, theirs))
    scale = np.abs(base).max()
    rel = float(np.abs(got - want).max() / scale)
    off_mine, off_theirs = (float(np.abs(v - base).max() / scale) for v in (got, want))
    print(
        f"{arch} {dtype}: llama.cpp logits (max |logit| {scale:.3g}), Linnet's file vs its "
        f"own {rel:.3g}; vs f32: Linnet's {off_mine:.3g}, its own {off_theirs:.3g}"
    )
    assert rel <= LOGITS_VS_LLAMA[dtype]
    assert off_mine <= QUANT_NOISE_MARGIN * off_theirs


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (real weights)


@pytest.fixture(scope="module")
def smollm2_f32_gguf(smollm2_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2-quants")
    return linnet.gguf.export(smollm2_checkpoint, root / "smollm2.f32.gguf", dtype="f32",
                              progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_f32_tensors(smollm2_f32_gguf):
    return read_tensors(smollm2_f32_gguf)[1]  # read once for every quantization type


def _chat_ids(llm, message: str) -> list[int]:
    from tests.converters.test_gguf import _chat_text

    return llm.tokenize(_chat_text(llm, message).encode(), add_bos=False, special=True)


def _last_logits(path: Path) -> list[np.ndarray]:
    llm = _llama(path, n_ctx=512)
    out = []
    for message in CHAT_MESSAGES:
        ids = _chat_ids(llm, message)
        llm.reset()
        llm.eval(ids)
        out.append(np.array(llm.scores[len(ids) - 1]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", (*DTYPES, "q8_0"))
def test_smollm2_against_llama_cpp(
    smollm2_checkpoint, smollm2_f32_gguf, smollm2_f32_tensors, chat_prompts, tmp_path, dtype
):
    mine = linnet.gguf.export(smollm2_checkpoint, tmp_path / "linnet.gguf", dtype=dtype,
                              progress=False)  # fmt: skip
    theirs = llama_quantize(smollm2_f32_gguf, tmp_path / "llama.gguf", dtype)
    compare_with_llama_cpp(smollm2_f32_tensors, mine, theirs, f"SmolLM2 {dtype}")
    reference = load_reference(smollm2_checkpoint)
    got, want = _last_logits(mine), _last_logits(theirs)
    for message, ids, g, w in zip(CHAT_MESSAGES, chat_prompts, got, want):
        with torch.no_grad():
            f32 = reference(input_ids=ids).logits[0, -1]
        delta = float(np.abs(g - w).max())
        off_mine, off_theirs = (float(np.abs(v - f32.numpy()).max()) for v in (g, w))
        print(
            f"SmolLM2 {dtype} {message!r}: llama.cpp first token on Linnet's file "
            f"{int(g.argmax())}, on its own {int(w.argmax())}, transformers f32 "
            f"{int(f32.argmax())} (gap {logit_gaps(f32).item():.2f}); max |Δ| {delta:.3g}; "
            f"vs f32: Linnet's {off_mine:.3g}, its own {off_theirs:.3g}"
        )
        assert delta <= SMOLLM2_VS_LLAMA[dtype], f"{message!r}: max |Δ| {delta:.3g}"
        assert off_mine <= QUANT_NOISE_MARGIN * off_theirs, message
        assert int(g.argmax()) == int(w.argmax()), message
        if dtype in FIRST_TOKEN_TYPES and (dtype, message) not in OWN_FLIPS:
            assert int(g.argmax()) == int(f32.argmax()), message
    for path in (mine, theirs):
        path.unlink()
