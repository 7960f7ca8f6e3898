"""The tokenizer of a GGUF file: `tokenizer.ggml.*` keys and the chat template.

`add_tokenizer(writer, folder, n_vocab)`: a byte-level BPE tokenizer (GPT-2 style:
SmolLM2, Llama 3, Qwen2, GPT-2) as llama.cpp's "gpt2" vocab. The pre-tokenizer name is
chosen by what `tokenizer.json` says its pre-tokenizer does (`PRE_TOKENIZERS`), not by
hashing encodings of a test string; the tests check the result by behaviour (llama.cpp
tokenizes prompts to the ids transformers gives). A sentencepiece-style BPE (byte
fallback: Llama 2, TinyLlama, Mistral, Phi-3) becomes llama.cpp's "llama" vocab, with
scores from the merge order (`spm_vocab`) and the ▁ prefix rule (`spm_space_prefix`).
Merges, special-token ids, add-BOS/EOS flags and the chat template come from the gguf
package's `SpecialVocab`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linnet.converters.companions import companion

from linnet.errors import LinnetError
from linnet.weights.jsonfile import read_json_object

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


# ----------------------------------------------------------------------------------------
# Sentencepiece-style BPE (Llama 2, TinyLlama, Mistral, Phi-3): llama.cpp's "llama" vocab

SPACE = "\u2581"  # sentencepiece writes a space as ▁ inside tokens
_PREPEND = {"type": "Prepend", "prepend": SPACE}
_REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def is_sentencepiece(tokenizer_json: Mapping) -> bool:
    """BPE over ▁-spelled text that falls back to <0xXX> byte tokens (sentencepiece's BPE
    as transformers converts it), rather than GPT-2's byte-level alphabet."""
    model = tokenizer_json.get("model", {})
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


def _steps(normalizer: Any) -> list:
    if normalizer is None:
        return []
    if normalizer.get("type") == "Sequence":
        return [s for n in normalizer.get("normalizers", []) for s in _steps(n)]
    return [normalizer]


def spm_space_prefix(tokenizer_json: Mapping, tokenizer_config: Mapping) -> bool:
    """llama.cpp's add_space_prefix for this tokenizer. llama.cpp can only replace spaces
    by ▁ and prepend one ▁ to each stretch of text; either form transformers writes does
    that: the legacy normalizer (Prepend ▁, Replace " " -> ▁) or a Metaspace pre-tokenizer
    that does not split. Anything else (Metaspace splitting at ▁, NFKC, lowercasing) would
    be tokenized differently, so it is refused."""
    steps = _steps(tokenizer_json.get("normalizer"))
    pre = tokenizer_json.get("pre_tokenizer")
    prefix = None
    if pre is None and steps in ([_PREPEND, _REPLACE], [_REPLACE]):
        prefix = steps[0] == _PREPEND
    elif not steps and pre is not None and pre.get("type") == "Metaspace":
        scheme = pre.get("prepend_scheme") or ("always" if pre.get("add_prefix_space") else "never")
        if pre.get("replacement") == SPACE and not pre.get("split", True):
            prefix = scheme != "never"
    if prefix is None:
        raise LinnetError(
            "tokenizer.json: a sentencepiece-style tokenizer whose text preparation llama.cpp "
            f"cannot do (normalizer {json.dumps(tokenizer_json.get('normalizer'))[:160]}, "
            f"pre_tokenizer {json.dumps(pre)[:160]}); llama.cpp only replaces spaces by "
            f"{SPACE} and prepends one (no Metaspace split, no other normalizer). Export "
            "without the tokenizer (tokenizer=False, --no-tokenizer) to skip it"
        )
    # transformers' LlamaTokenizer lets tokenizer_config.json's flag decide (so does
    # llama.cpp's converter).
    flag = tokenizer_config.get("add_prefix_space")
    return prefix if flag is None else bool(flag)


def _merge_ranks(merges: list) -> dict[str, int]:
    """Joined token -> rank of the first merge that makes it."""
    ranks: dict[str, int] = {}
    for rank, m in enumerate(merges):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        ranks.setdefault(a + b, rank)
    return ranks


def spm_vocab(
    tokenizer_json: Mapping, tokenizer_config: Mapping, n_vocab: int
) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types for llama.cpp's "llama" vocab.

    llama.cpp, like sentencepiece, repeatedly joins the adjacent pair whose joined token
    scores highest, so a token's score is minus the rank of the merge that makes it (the
    order transformers applies merges in); tokens no merge makes score below every merge.
    Types as `bpe_vocab`, plus BYTE for <0xXX> and UNKNOWN for the unk token."""
    from gguf import TokenType

    tokens, types = bpe_vocab(tokenizer_json, n_vocab)
    model = tokenizer_json["model"]
    ranks = _merge_ranks(model.get("merges") or [])
    unk = model.get("unk_token") or tokenizer_config.get("unk_token")
    unk = unk.get("content") if isinstance(unk, dict) else unk
    added = {a["id"]: a for a in tokenizer_json.get("added_tokens", [])}
    scores = [0.0] * n_vocab
    for i, token in enumerate(tokens):
        if token == unk:
            types[i] = int(TokenType.UNKNOWN)
        elif types[i] == TokenType.USER_DEFINED and added[i].get("normalized"):
            tokens[i] = token.replace(SPACE, " ")  # matched in raw text by llama.cpp
        elif types[i] == TokenType.NORMAL and _BYTE_TOKEN.fullmatch(token):
            types[i] = int(TokenType.BYTE)
        elif types[i] == TokenType.NORMAL:
            scores[i] = -float(ranks.get(token, len(ranks)))
    return tokens, scores, types


# ----------------------------------------------------------------------------------------
# Writing


def _read_json(path: Path) -> dict:
    """A tokenizer file of the checkpoint ({} when absent); one that links out of the
    checkpoint or is not a JSON object is refused with its name."""
    return read_json_object(companion(path.parent, path.name)) if path.is_file() else {}


def add_tokenizer(writer, folder: Path | None, n_vocab: int) -> str:
    """Write the `tokenizer.ggml.*` keys and the chat template; returns the tokenizer model
    written ("gpt2", "llama", or "none" when there is no tokenizer: llama.cpp then takes
    ids only)."""
    import gguf

    tj_path = folder / "tokenizer.json" if folder is not None else None
    if tj_path is None or not tj_path.is_file():
        if folder is not None and (folder / "tokenizer.model").is_file():
            raise LinnetError(
                f"{folder}: a sentencepiece tokenizer.model without tokenizer.json; GGUF "
                "export reads tokenizer.json (transformers writes one: AutoTokenizer."
                "from_pretrained(folder).save_pretrained(folder)), or export with "
                "--no-tokenizer to skip it"
            )
        writer.add_tokenizer_model("none")
        return "none"
    tj = _read_json(tj_path)
    if is_sentencepiece(tj):
        kind, merges = "llama", []
        config = _read_json(folder / "tokenizer_config.json")
        tokens, scores, types = spm_vocab(tj, config, n_vocab)
        writer.add_tokenizer_model(kind)
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(spm_space_prefix(tj, config))
    else:
        kind, merges = "gpt2", _byte_level_vocab(writer, tj, tj_path, n_vocab)
    special = gguf.SpecialVocab(folder, load_merges=False, n_vocab=n_vocab)
    special.merges = merges
    # Write both flags: llama.cpp's defaults (BOS on for "llama") need not be the model's.
    special.add_special_token.setdefault("bos", False)
    special.add_special_token.setdefault("eos", False)
    special.add_to_gguf(writer, quiet=True)
    return kind


def _byte_level_vocab(writer, tj: Mapping, tj_path: Path, n_vocab: int) -> list[str]:
    """Write a byte-level BPE vocabulary as llama.cpp's "gpt2"; returns its merges."""
    model = tj.get("model", {})
    if model.get("type") != "BPE" or (tj.get("decoder") or {}).get("type") != "ByteLevel":
        raise LinnetError(
            f"{tj_path}: GGUF export writes byte-level BPE (GPT-2 style) and sentencepiece-"
            f"style BPE (byte_fallback) tokenizers; this one is {model.get('type')} "
            f"(byte_fallback={model.get('byte_fallback')}, decoder "
            f"{(tj.get('decoder') or {}).get('type')}). Export with --no-tokenizer to skip it"
        )
    tokens, types = bpe_vocab(tj, n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tj))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    merges = bpe_merges(tj)
    if not merges:
        raise LinnetError(f"{tj_path}: a BPE tokenizer without merges")
    return merges


def copy_tokenizer(writer, gguf_path: Path) -> str:
    """Carry a GGUF file's tokenizer over as it is: every `tokenizer.*` key with its type
    (re-exporting a GGUF as another dtype keeps its vocabulary and chat template)."""
    from gguf import GGUFValueType

    from linnet.weights.gguf_checkpoint import open_reader

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
