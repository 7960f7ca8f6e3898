"""A small highlighter for .linnet sources and TOML (weights maps): comments, keywords,
strings, numbers, dtypes, table headers, each a <span class="..."> over escaped text.

    html = highlight(text, "linnet")     # or "toml"; anything else: escaped text only
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

from linnet.syntax.lexer import KEYWORDS

#: Words the parser reads as keywords at the start of a line though they may name fields too.
SOFT_KEYWORDS = ("dim", "as")
DTYPES = ("f32", "f16", "bf16", "i64", "i32", "bool", "int", "float", "str", "dtype")

LINNET = re.compile(
    r"(?P<comment>#[^\n]*)"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*")'
    r"|(?P<number>\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b)"
    r"|(?P<word>\b[A-Za-z_][A-Za-z0-9_]*\b)"
)
TOML = re.compile(
    r"(?P<comment>#[^\n]*)"
    r"|(?P<header>^\s*\[[^\]\n]*\]+)"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\')'
    r"|(?P<number>\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b)"
    r"|(?P<key>^\s*[A-Za-z0-9_.\-\"]+(?=\s*=))"
    r"|(?P<word>\b(?:true|false)\b)",
    re.MULTILINE,
)


def _class(kind: str, word: str, language: str) -> str | None:
    if kind != "word":
        return kind
    if language == "toml":
        return "keyword"
    if word in KEYWORDS or word in SOFT_KEYWORDS:
        return "keyword"
    return "type" if word in DTYPES else None


def highlight(text: str, language: str) -> Markup:
    """`text` as HTML, its tokens in spans (classes: comment, string, number, keyword, type,
    header, key)."""
    pattern = {"linnet": LINNET, "toml": TOML}.get(language)
    if pattern is None:
        return escape(text)
    out, at = [], 0
    for m in pattern.finditer(text):
        kind = m.lastgroup or ""
        css = _class(kind, m.group(), language)
        out.append(str(escape(text[at : m.start()])))
        piece = str(escape(m.group()))
        out.append(f'<span class="{css}">{piece}</span>' if css else piece)
        at = m.end()
    out.append(str(escape(text[at:])))
    return Markup("".join(out))
