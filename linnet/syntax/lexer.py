"""Tokens of a `.linnet` source: indentation-structured, Python-like.

Blocks are marked by indentation (spaces only); a line break inside brackets
continues the line. Every token keeps its line and column for diagnostics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from linnet.core.diagnostics import Diagnostic, DiagnosticError

KEYWORDS = {
    "model",
    "config",
    "params",
    "state",
    "fn",
    "entry",
    "updates",
    "require",
    "return",
    "if",
    "else",
    "for",
    "in",
    "and",
    "or",
    "not",
    "true",
    "false",
    "none",
}

TOKEN_RE = re.compile(
    r"""
    (?P<float>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<string>"[^"\n]*")
  | (?P<op>->|==|!=|<=|>=|//|[-+*/%@<>=()\[\]{},:.?])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # name, keyword, int, float, string, op, newline, indent, dedent, eof
    text: str
    line: int
    col: int  # 1-based
    opener: Token | None = None  # innermost bracket still open at this token

    @property
    def end_col(self) -> int:
        return self.col + max(len(self.text), 1)


def tokenize(text: str, path: str = "<source>") -> list[Token]:
    lines = text.replace("\r\n", "\n").split("\n")
    tokens: list[Token] = []
    indents = [0]
    openers: list[Token] = []  # open brackets: newlines inside them are ignored

    def fail(line: int, col: int, message: str, hint: str | None = None) -> None:
        raise DiagnosticError(
            Diagnostic(path, line, col, col + 1, message, source_line=lines[line - 1], hint=hint)
        )

    for ln, raw in enumerate(lines, start=1):
        body = raw.split("#", 1)[0] if '"' not in raw else _strip_comment(raw)
        if not body.strip():
            continue
        if not openers:
            stripped = body.lstrip(" ")
            if stripped.startswith("\t"):
                fail(
                    ln,
                    len(body) - len(stripped) + 1,
                    "tab in indentation",
                    "indent with spaces only",
                )
            width = len(body) - len(stripped)
            if width > indents[-1]:
                indents.append(width)
                tokens.append(Token("indent", "", ln, 1))
            while width < indents[-1]:
                indents.pop()
                tokens.append(Token("dedent", "", ln, 1))
            if width != indents[-1]:
                fail(ln, width + 1, "unindent does not match any outer indentation level")
        col = len(body) - len(body.lstrip(" "))
        while col < len(body):
            if body[col] == " ":
                col += 1
                continue
            m = TOKEN_RE.match(body, col)
            if not m:
                fail(ln, col + 1, f"unexpected character {body[col]!r}")
            kind = m.lastgroup
            word = m.group()
            if kind == "name" and word in KEYWORDS:
                kind = "keyword"
            opener = openers[-1] if openers else None
            tok = Token(kind, word, ln, col + 1, opener if word not in ")]}" else None)
            if kind == "op" and word in "([{":
                openers.append(tok)
            elif kind == "op" and word in ")]}" and openers:
                openers.pop()
            tokens.append(tok)
            col = m.end()
        if not openers:
            tokens.append(Token("newline", "", ln, len(body.rstrip()) + 1))
    last = len(lines)
    unclosed = openers[-1] if openers else None
    while len(indents) > 1:
        indents.pop()
        tokens.append(Token("dedent", "", last, 1, unclosed))
    tokens.append(Token("eof", "", last, 1, unclosed))
    return tokens


def _strip_comment(raw: str) -> str:
    """Drop a trailing comment, leaving `#` inside strings alone."""
    in_string = False
    for i, ch in enumerate(raw):
        if ch == '"':
            in_string = not in_string
        elif ch == "#" and not in_string:
            return raw[:i]
    return raw
