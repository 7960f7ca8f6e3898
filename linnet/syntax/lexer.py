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
    lexer = _Lexer(text.replace("\r\n", "\n").split("\n"), path)
    for ln, raw in enumerate(lexer.lines, start=1):
        body = raw.split("#", 1)[0] if '"' not in raw else _strip_comment(raw)
        if not body.strip():
            continue
        if not lexer.openers:
            lexer.indentation(ln, body)
        lexer.line(ln, body)
        if not lexer.openers:
            lexer.tokens.append(Token("newline", "", ln, len(body.rstrip()) + 1))
    return lexer.finish()


class _Lexer:
    """The tokens so far, the indentation stack, and the open brackets (newlines inside
    them are ignored)."""

    def __init__(self, lines: list[str], path: str) -> None:
        self.lines, self.path = lines, path
        self.tokens: list[Token] = []
        self.indents = [0]
        self.openers: list[Token] = []

    def fail(self, line: int, col: int, message: str, hint: str | None = None) -> None:
        source_line = self.lines[line - 1]
        raise DiagnosticError(
            Diagnostic(self.path, line, col, col + 1, message, source_line=source_line, hint=hint)
        )

    def indentation(self, ln: int, body: str) -> None:
        """Indent and dedent tokens for a line that starts a statement."""
        stripped = body.lstrip(" ")
        if stripped.startswith("\t"):
            col = len(body) - len(stripped) + 1
            self.fail(ln, col, "tab in indentation", "indent with spaces only")
        width = len(body) - len(stripped)
        if width > self.indents[-1]:
            self.indents.append(width)
            self.tokens.append(Token("indent", "", ln, 1))
        while width < self.indents[-1]:
            self.indents.pop()
            self.tokens.append(Token("dedent", "", ln, 1))
        if width != self.indents[-1]:
            self.fail(ln, width + 1, "unindent does not match any outer indentation level")

    def line(self, ln: int, body: str) -> None:
        col = len(body) - len(body.lstrip(" "))
        while col < len(body):
            if body[col] == " ":
                col += 1
                continue
            m = TOKEN_RE.match(body, col)
            if not m:
                self.fail(ln, col + 1, f"unexpected character {body[col]!r}")
            kind = m.lastgroup
            word = m.group()
            if kind == "name" and word in KEYWORDS:
                kind = "keyword"
            opener = self.openers[-1] if self.openers else None
            tok = Token(kind, word, ln, col + 1, opener if word not in ")]}" else None)
            if kind == "op" and word in "([{":
                self.openers.append(tok)
            elif kind == "op" and word in ")]}" and self.openers:
                self.openers.pop()
            self.tokens.append(tok)
            col = m.end()

    def finish(self) -> list[Token]:
        last = len(self.lines)
        unclosed = self.openers[-1] if self.openers else None
        while len(self.indents) > 1:
            self.indents.pop()
            self.tokens.append(Token("dedent", "", last, 1, unclosed))
        self.tokens.append(Token("eof", "", last, 1, unclosed))
        return self.tokens


def _strip_comment(raw: str) -> str:
    """Drop a trailing comment, leaving `#` inside strings alone."""
    in_string = False
    for i, ch in enumerate(raw):
        if ch == '"':
            in_string = not in_string
        elif ch == "#" and not in_string:
            return raw[:i]
    return raw
