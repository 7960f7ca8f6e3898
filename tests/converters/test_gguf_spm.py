"""Sentencepiece-style tokenizers (Llama 2, TinyLlama, Mistral, Phi-3) in GGUF exports,
checked against llama.cpp, transformers and sentencepiece itself.

The tokenizer is trained here by sentencepiece (BPE, byte fallback, 400 pieces) on a few
sentences, converted by transformers' LlamaTokenizer, given an added special token, an
added plain token and a chat template, and saved beside a tiny random Llama whose
vocabulary (408 rows) leaves 6 ids unused. It is saved in the two forms in use:

* "legacy": TinyLlama's and Llama 2's tokenizer.json (normalizer Prepend ▁ + Replace " ",
  no pre-tokenizer), read as it is by transformers (tokenizer_class PreTrainedTokenizerFast).
  This is sentencepiece's own behaviour, and llama.cpp's: one ▁ before every stretch of
  text, at the start and after each special token, even one that starts with a space.
* "metaspace": what transformers 5 writes, and how its LlamaTokenizer reads any Llama
  tokenizer (Metaspace, prepend_scheme "first"): a ▁ only at the very start, and none
  before text that already starts with a space. llama.cpp cannot do that, so on such
  text (TEXTS_PREFIX_DIFFERS) its ids are the legacy ones, not these.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
import sentencepiece  # the dev extra (scripts/setup.sh)

import linnet.gguf
from linnet.errors import LinnetError
from tests.checkpoints import build_tiny

N_PIECES = 400
N_VOCAB = 408  # the model's rows: 400 pieces, 2 added tokens, 6 unused ids
CORPUS = """The quick brown fox jumps over the lazy dog.
A tokenizer splits text into pieces; pieces become ids.
Hello world, hello there! Numbers: 12345, 678 and 90.
She sells sea shells by the sea shore.
In the beginning was the word, and the word was with the model.
"""
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"

# Plain text: the same ids in every form and in llama.cpp.
TEXTS_SAME = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "café naïve 🙂 ∑ — Ünïcödé",  # characters the pieces lack: <0xXX> byte fallback
    "a  b   c    d",
    "line one\nline two\n\n\nend",
    "Numbers: 12345, 678 and 90.",
    "tabs\tand\r\nCRLF",
    "",
]
# Text that starts with a space, or follows an added token (special or not) in the text.
TEXTS_PREFIX_DIFFERS = [
    "the <extra> token",  # an added plain token, matched whole
    " leading space",
    "   three leading spaces",
    "<s>Hi</s> there",
    "Question<|end|>\nAnswer<|end|>",
]
TEXTS = TEXTS_SAME + TEXTS_PREFIX_DIFFERS


def _tokenizer(root: Path):
    """A LlamaTokenizer converted from a freshly trained sentencepiece model."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizer

    (root / "corpus.txt").write_text(CORPUS * 20)
    sentencepiece.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"), model_prefix=str(root / "spm"), vocab_size=N_PIECES,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, add_dummy_prefix=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True,
        allow_whitespace_only_pieces=True, minloglevel=2,
    )  # fmt: skip
    (root / "sp").mkdir()
    shutil.copy(root / "spm.model", root / "sp" / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(root / "sp", add_bos_token=True, trust_remote_code=False)
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    # Matched in the raw text, as llama.cpp matches added tokens (a normalized=True one is
    # matched after ▁ replaces spaces, and transformers then drops the ▁ before it).
    tok.add_tokens([AddedToken("<extra>", normalized=False)])
    tok.chat_template = TEMPLATE
    return tok


def _legacy(folder: Path) -> None:
    """Rewrite the saved tokenizer as TinyLlama's tokenizer.json has it."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}  # fmt: skip
    tj["pre_tokenizer"] = None
    (folder / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # read tokenizer.json as it is
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """{form: (folder, exported GGUF)} and the sentencepiece processor."""
    root = tmp_path_factory.mktemp("spm")
    tok = _tokenizer(root)
    assert len(tok) == N_PIECES + 2
    model = build_tiny("llama", "base", root, vocab_size=N_VOCAB)
    out = {}
    for form in ("metaspace", "legacy"):
        folder = root / form
        shutil.copytree(model, folder)
        tok.save_pretrained(folder)
        if form == "legacy":
            _legacy(folder)
        path = linnet.gguf.export(folder, root / f"{form}.gguf", dtype="f32", progress=False)
        out[form] = (folder, path)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(root / "spm.model"))
    return out, sp


def _llama(path: Path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _hf(folder: Path, **kw):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, **kw, trust_remote_code=False)


def _cpp_ids(llm, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=True, special=True)


def test_llama_cpp_tokenizes_as_transformers(spm):
    forms, sp = spm
    llm = _llama(forms["metaspace"][1])
    legacy, metaspace = _hf(forms["legacy"][0]), _hf(forms["metaspace"][0])
    assert "Prepend" in str(legacy.backend_tokenizer.normalizer)
    assert "first" in str(metaspace.backend_tokenizer.pre_tokenizer)
    n_sp = 0
    for text in TEXTS:
        got = _cpp_ids(llm, text)
        assert got[0] == 1 and got.count(1) == 1 + text.count("<s>")  # BOS added once
        assert got == legacy(text)["input_ids"], text
        same = text in TEXTS_SAME
        assert (got == metaspace(text)["input_ids"]) == same, text
        if "<" not in text:  # sentencepiece itself: no special tokens in text
            assert got == [1] + sp.encode(text), text
            n_sp += 1
    print(f"llama.cpp = transformers on {len(TEXTS)} texts (legacy form), "
          f"{len(TEXTS_SAME)} (metaspace form), sentencepiece on {n_sp}")  # fmt: skip


def test_both_forms_export_the_same_tokenizer(spm):
    forms, _ = spm
    fields = [
        {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if k.startswith("tok")}
        for _, path in forms.values()
    ]
    assert fields[0] == fields[1]


def test_llama_cpp_detokenizes_to_the_text(spm):
    forms, _ = spm
    llm = _llama(forms["metaspace"][1])
    metaspace = _hf(forms["metaspace"][0])
    for text in TEXTS_SAME:
        ids = _cpp_ids(llm, text)
        assert llm.detokenize(ids).decode() == text, text  # the prepended ▁ is dropped
        assert metaspace.decode(ids, skip_special_tokens=True) == text, text
    # After an added token, the ▁ that llama.cpp and the legacy form prepend stays a space.
    legacy = _hf(forms["legacy"][0])
    for text in TEXTS_PREFIX_DIFFERS:
        ids = _cpp_ids(llm, text)
        assert llm.detokenize(ids, special=True).decode() == legacy.decode(ids), text


def test_metadata(spm):
    from gguf import TokenType as T

    forms, _ = spm
    folder, path = forms["metaspace"]
    fields = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}
    assert fields["tokenizer.ggml.model"] == "llama"
    assert fields["tokenizer.ggml.pre"] == "default"
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    scores = fields["tokenizer.ggml.scores"]
    assert len(tokens) == len(types) == len(scores) == N_VOCAB
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert types[:3] == [T.UNKNOWN, T.CONTROL, T.CONTROL]
    assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert set(types[3:259]) == {T.BYTE}
    assert tokens[N_PIECES : N_PIECES + 2] == ["<|end|>", "<extra>"]
    assert types[N_PIECES : N_PIECES + 2] == [T.CONTROL, T.USER_DEFINED]
    assert set(types[N_PIECES + 2 :]) == {T.UNUSED}
    assert set(types[259:N_PIECES]) == {T.NORMAL}
    assert (fields["tokenizer.ggml.unknown_token_id"], fields["tokenizer.ggml.bos_token_id"],
            fields["tokenizer.ggml.eos_token_id"]) == (0, 1, 2)  # fmt: skip
    assert fields["tokenizer.ggml.add_bos_token"] is True
    assert fields["tokenizer.ggml.add_eos_token"] is False
    assert fields["tokenizer.ggml.add_space_prefix"] is True
    assert fields["tokenizer.chat_template"] == TEMPLATE
    # Merged pieces score by merge rank: "▁t" is merged before "▁the" is.
    vocab = {t: i for i, t in enumerate(tokens)}
    assert scores[vocab["▁t"]] > scores[vocab["▁the"]]


def test_add_bos_follows_the_tokenizer(spm, tmp_path):
    """A tokenizer that adds no BOS says so in the file, and llama.cpp then adds none."""
    forms, _ = spm
    folder = tmp_path / "no-bos"
    shutil.copytree(forms["metaspace"][0], folder)
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["post_processor"]["single"] = [{"Sequence": {"id": "A", "type_id": 0}}]
    (folder / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(config, add_bos_token=False)))
    path = linnet.gguf.export(folder, tmp_path / "m.gguf", dtype="f32", progress=False)
    assert _hf(folder)("Hello")["input_ids"][0] != 1
    llm = _llama(path)
    assert llm.metadata["tokenizer.ggml.add_bos_token"] == "false"
    assert _cpp_ids(llm, "Hello") == _hf(folder)("Hello")["input_ids"]


def test_transformers_reads_the_exported_tokenizer(spm):
    """transformers' GGUF loader rebuilds the tokenizer (merges from the scores) to the
    ids the folder's own tokenizer gives, on every text."""
    forms, _ = spm
    folder, path = forms["metaspace"]
    back = _hf(path.parent, gguf_file=path.name)
    want = _hf(folder)
    for text in TEXTS:
        assert back(text)["input_ids"] == want(text)["input_ids"], text


def test_unrepresentable_tokenizers_are_refused(spm, tmp_path):
    forms, _ = spm
    cases = {
        "split": (
            {
                "pre_tokenizer": {
                    "type": "Metaspace",
                    "replacement": "▁",
                    "prepend_scheme": "always",
                    "split": True,
                }
            },
            "cannot do",
        ),  # fmt: skip
        "nfkc": ({"normalizer": {"type": "NFKC"}}, "cannot do"),
        "unigram": (
            {"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]]}},
            "this one is Unigram",
        ),  # fmt: skip
    }
    for name, (change, message) in cases.items():
        folder = tmp_path / name
        shutil.copytree(forms["metaspace"][0], folder)
        tj = json.loads((folder / "tokenizer.json").read_text())
        (folder / "tokenizer.json").write_text(json.dumps(tj | change))
        with pytest.raises(LinnetError, match=message):
            linnet.gguf.export(folder, tmp_path / f"{name}.gguf", progress=False)
        assert not (tmp_path / f"{name}.gguf").exists()
