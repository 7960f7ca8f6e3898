"""Diagnostics: where, what, expected versus received, the dim table, a hint.

zoo/llama.linnet:52:7: error: shape mismatch in `linear`
   52 |   q = linear(h, p.wk)
      |       ^^^^^^^^^^^^^^^
  expected: act[B, S, dim] @ act[N, dim]^T
  received: ...
  dims: B, S, P symbolic; dim = 4096, n_heads = 32
  hint: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Diagnostic:
    path: str
    line: int
    col: int
    end_col: int
    message: str
    expected: str | None = None
    received: str | None = None
    hint: str | None = None
    source_line: str | None = None
    dims: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        out = [f"{self.path}:{self.line}:{self.col}: error: {self.message}"]
        if self.source_line is not None:
            gutter = f"{self.line:>5} | "
            out.append(gutter + self.source_line.rstrip())
            width = max(self.end_col - self.col, 1)
            out.append(" " * (len(gutter) - 2) + "| " + " " * (self.col - 1) + "^" * width)
        if self.expected is not None:
            out.append(f"  expected: {self.expected}")
        if self.received is not None:
            out.append(f"  received: {self.received}")
        if self.dims:
            out.append("  dims: " + ", ".join(f"{k} = {v}" for k, v in self.dims.items()))
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


class DiagnosticError(Exception):
    """Raised inside the front end to abandon the current statement."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        self.diagnostic = diagnostic
        super().__init__(diagnostic.message)
