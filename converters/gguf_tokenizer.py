"""The tokenizer of a GGUF file: `tokenizer.ggml.*` keys and the chat template.

`add_tokenizer(writer, folder, n_vocab)`: a byte-level BPE tokenizer (GPT-2 style:
SmolLM2, Llama 3, Qwen2, GPT-2) as llama.cpp's "gpt2" vocab. The pre-tokenizer name is
chosen by what `tokenizer.json` says its pre-tokenizer does (`PRE_TOKENIZERS`), not by
hashing encodings of a test string; the tests check the result by behaviour (llama.cpp
tokenizes prompts to the ids transformers gives). Merges, special-token ids, add-BOS/EOS
flags and the chat template come from the gguf package's `SpecialVocab`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linnet.errors import LinnetError

# The regex HF's ByteLevel pre-tokenizer applies when use_regex is true (GPT-2's).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: What tokenizer.json's pre-tokenizer does (as steps) -> llama.cpp's `tokenizer.ggml.pre`,
#: whose regexes (llama-vocab.cpp) split text the same way.
PRE_TOKENIZERS: dict[tuple, str] = {
    (("regex", GPT2_REGEX),): "gpt-2",
    (("digits",), ("regex", GPT2_REGEX)): "smollm",  # \p{N}, then GPT-2's regex
    (("regex", LLAMA3_REGEX),): "llama-bpe",
    (("regex", QWEN2_REGEX),): "qwen2",
}


def _pre_steps(pre: Any) -> tuple:
    """tokenizer.json's pre_tokenizer as a tuple of splitting steps."""
    if pre is None:
        return ()
    kind = pre.get("type")
    if kind == "Sequence":
        return tuple(s for p in pre.get("pretokenizers", []) for s in _pre_steps(p))
    if kind == "ByteLevel":
        return (("regex", GPT2_REGEX),) if pre.get("use_regex", True) else ()
    if kind == "Digits":
        return (("digits",),) if pre.get("individual_digits") else (("regex", r"\p{N}+"),)
    if kind == "Split":
        pattern = pre.get("pattern", {})
        regex = pattern.get("Regex", re.escape(pattern.get("String", "")))
        if pre.get("behavior") == "Isolated" and not pre.get("invert"):
            return (("regex", regex),)
    return (("unknown", json.dumps(pre, sort_keys=True)),)


def pre_tokenizer_name(tokenizer_json: Mapping) -> str:
    steps = _pre_steps(tokenizer_json.get("pre_tokenizer"))
    name = PRE_TOKENIZERS.get(steps)
    normalizer = tokenizer_json.get("normalizer")
    if normalizer is not None and not (name == "qwen2" and normalizer.get("type") == "NFC"):
        name = None
    if name is None:
        raise LinnetError(
            "tokenizer.json: no llama.cpp pre-tokenizer is known to split text as this one "
            f"does (pre_tokenizer {json.dumps(tokenizer_json.get('pre_tokenizer'))[:200]}, "
            f"normalizer {json.dumps(normalizer)[:80]}); known: "
            f"{', '.join(PRE_TOKENIZERS.values())}. Export without the tokenizer "
            "(tokenizer=False, --no-tokenizer) to skip it"
        )
    return name


def _looks_special(token: str) -> bool:
    return bool(re.fullmatch(r"<\|.*\|>|<unused[0-9]+>", token))


def bpe_vocab(tokenizer_json: Mapping, n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens and token types (llama.cpp's) for ids 0..n_vocab-1: added special tokens are
    CONTROL, other added tokens USER_DEFINED, ids the tokenizer lacks `[PADi]` UNUSED."""
    from gguf import TokenType

    reverse = {i: t for t, i in tokenizer_json["model"]["vocab"].items()}
    added = {a["id"]: a for a in tokenizer_json.get("added_tokens", [])}
    for i, a in added.items():
        reverse[i] = a["content"]
    top = max(reverse, default=-1)
    if top >= n_vocab:
        raise LinnetError(
            f"tokenizer.json has token id {top} but the model's vocabulary has {n_vocab} rows"
        )
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
        elif i in added:
            a = added[i]
            tokens.append(a["content"])
            special = a.get("special") or _looks_special(a["content"])
            types.append(int(TokenType.CONTROL if special else TokenType.USER_DEFINED))
        else:
            tokens.append(reverse[i])
            types.append(int(TokenType.NORMAL))
    return tokens, types


def bpe_merges(tokenizer_json: Mapping) -> list[str]:
    """Merges as llama.cpp stores them: "a b", a space inside a part written as U+0120+
    (what gguf's SpecialVocab does to the [a, b] list format, without its per-character
    loop)."""
    merges = tokenizer_json.get("model", {}).get("merges") or []
    if merges and isinstance(merges[0], str):
        return list(merges)
    shift = chr(ord(" ") + 256)
    return [f"{a.replace(' ', shift)} {b.replace(' ', shift)}" for a, b in merges]


def add_tokenizer(writer, folder: Path | None, n_vocab: int) -> str:
    """Write the `tokenizer.ggml.*` keys and the chat template; returns the tokenizer model
    written ("gpt2", or "none" when there is no tokenizer: llama.cpp then takes ids only)."""
    import gguf

    tj_path = folder / "tokenizer.json" if folder is not None else None
    if tj_path is None or not tj_path.is_file():
        if folder is not None and (folder / "tokenizer.model").is_file():
            raise LinnetError(
                f"{folder}: a sentencepiece tokenizer.model without tokenizer.json; GGUF "
                "export reads tokenizer.json (export with --no-tokenizer to skip it)"
            )
        writer.add_tokenizer_model("none")
        return "none"
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    model = tj.get("model", {})
    byte_level = model.get("type") == "BPE" and not model.get("byte_fallback")
    if not byte_level or (tj.get("decoder") or {}).get("type") != "ByteLevel":
        raise LinnetError(
            f"{tj_path}: GGUF export writes byte-level BPE tokenizers (GPT-2 style) so far; "
            f"this one is {model.get('type')} (byte_fallback={model.get('byte_fallback')}). "
            "Export with --no-tokenizer to skip it"
        )
    tokens, types = bpe_vocab(tj, n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tj))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=False, n_vocab=n_vocab)
    special.merges = bpe_merges(tj)
    if not special.merges:
        raise LinnetError(f"{tj_path}: a BPE tokenizer without merges")
    special.add_special_token.setdefault("bos", False)
    special.add_special_token.setdefault("eos", False)
    special.add_to_gguf(writer, quiet=True)
    return "gpt2"


def copy_tokenizer(writer, gguf_path: Path) -> str:
    """Carry a GGUF file's tokenizer over as it is: every `tokenizer.*` key with its type
    (re-exporting a GGUF as another dtype keeps its vocabulary and chat template)."""
    from gguf import GGUFValueType
    from linnet.converters.gguf_import import open_reader

    model = "none"
    for key, f in open_reader(gguf_path).fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)
        if key == "tokenizer.ggml.model":
            model = f.contents()
    if model == "none":
        writer.add_tokenizer_model("none")
    return model


def special_token_ids(fields: Mapping[str, Any]) -> dict[str, int]:
    """bos/eos/pad/unk token ids from a GGUF file's key/values, as config.json names them."""
    out = {}
    names = {"bos": "bos", "eos": "eos", "pad": "padding", "unk": "unknown"}
    for kind, gguf_kind in names.items():
        key = f"tokenizer.ggml.{gguf_kind}_token_id"
        if key in fields:
            out[f"{kind}_token_id"] = int(fields[key])
    return out
