"""Mutated sources never crash the front end.

Hypothesis mutates valid sources (the two zoo files and the tiny decoder of
test_check_diagnostics) by deleting text or a token, duplicating, swapping or
re-indenting lines, replacing an identifier with another one of the file, and
inserting punctuation. Whatever comes out, `Source.parse_text` either checks it
or raises SourceError, and every diagnostic points inside the text. A mutant
that checks clean resolves its config and lowers every entry, or says why with
a LinnetError: what the checker accepts, lowering builds.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from linnet.cli import main
from linnet.errors import LinnetError, SourceError
from linnet.source import Source
from tests.check.test_check_diagnostics import BASE

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "llama": (ROOT / "zoo" / "llama.linnet").read_text(encoding="utf-8"),
    "gpt2": (ROOT / "zoo" / "gpt2.linnet").read_text(encoding="utf-8"),
    "tiny": BASE,
}
IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
TOKEN = re.compile(
    r'[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|"[^"\n]*"|->|==|<=|>=|'
    r"!=|//|\S"
)
PUNCT = list("()[]{},:.?=+-*/%@<>!#\"'$;\\") + ["->", "==", "//", "\t", " ", "  ", "\n", "\r"]
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- mutations: each takes a chooser and a text, and returns a new text -----------------------


class Hypothesis:
    """Choices drawn by hypothesis (so failing mutants shrink)."""

    def __init__(self, data) -> None:
        self.data = data

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.data.draw(st.integers(lo, hi), label=label)

    def choice(self, items, label: str):
        return self.data.draw(st.sampled_from(items), label=label)


class Seeded:
    """Choices from a seeded RNG: the same mutations without hypothesis."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, items, label: str):
        return self.rng.choice(list(items))


def delete_chars(r, text: str) -> str:
    i = r.integer(0, max(len(text) - 1, 0), "delete at")
    return text[:i] + text[i + r.integer(1, 40, "delete count") :]


def delete_token(r, text: str) -> str:
    tokens = list(TOKEN.finditer(text))
    if not tokens:
        return text
    m = r.choice(tokens, "token")
    return text[: m.start()] + text[m.end() :]


def duplicate_line(r, text: str) -> str:
    lines = text.split("\n")
    i = r.integer(0, len(lines) - 1, "duplicate line")
    return "\n".join(lines[: i + 1] + lines[i:])


def swap_lines(r, text: str) -> str:
    lines = text.split("\n")
    i = r.integer(0, len(lines) - 1, "swap line")
    j = r.integer(0, len(lines) - 1, "with line")
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


INDENTS = ["", " ", "  ", "   ", "    ", "      ", "        ", "\t", "  \t"]


def reindent_line(r, text: str) -> str:
    lines = text.split("\n")
    i = r.integer(0, len(lines) - 1, "reindent line")
    lines[i] = r.choice(INDENTS, "indent") + lines[i].lstrip(" \t")
    return "\n".join(lines)


def replace_identifier(r, text: str) -> str:
    spots = list(IDENT.finditer(text))
    if not spots:
        return text
    m = r.choice(spots, "identifier")
    other = r.choice(sorted({s.group() for s in spots}), "replacement")
    return text[: m.start()] + other + text[m.end() :]


def insert_punctuation(r, text: str) -> str:
    i = r.integer(0, len(text), "insert at")
    return text[:i] + r.choice(PUNCT, "punctuation") + text[i:]


MUTATIONS = [
    delete_chars,
    delete_token,
    duplicate_line,
    swap_lines,
    reindent_line,
    replace_identifier,
    insert_punctuation,
]


def mutant(r, name: str | None = None) -> str:
    name = name or r.choice(sorted(SOURCES), "source")
    text = SOURCES[name]
    for _ in range(r.integer(1, 3, "mutations")):
        text = r.choice(MUTATIONS, "mutation")(r, text)
    return text


def hypothesis_mutant(data) -> str:
    text = mutant(Hypothesis(data))
    note(f"mutant:\n{text}")
    return text


# -- the properties ----------------------------------------------------------------------------


def check_diagnostics_in_text(err: SourceError, text: str, path: str) -> None:
    assert err.diagnostics, "a SourceError without diagnostics"
    lines = text.split("\n")
    for d in err.diagnostics:
        where = f"{d.line}:{d.col} ({d.message})"
        assert 1 <= d.line <= len(lines), f"line out of the text: {where}"
        line = lines[d.line - 1]
        assert 1 <= d.col <= len(line) + 1, f"column out of line {line!r}: {where}"
        assert d.end_col >= d.col, where
        if d.source_line is not None:
            assert d.source_line == line, where
        assert d.render().startswith(f"{path}:{d.line}:{d.col}: error: ")


def parse_or_diagnose(text: str, path: str = "mutant.linnet") -> Source | None:
    try:
        return Source.parse_text(text, path)
    except SourceError as err:
        check_diagnostics_in_text(err, text, path)
        return None


@SETTINGS
@given(st.data())
def test_mutants_check_or_diagnose(data):
    parse_or_diagnose(hypothesis_mutant(data))


@SETTINGS
@given(st.data())
def test_clean_mutants_lower(data):
    src = parse_or_diagnose(hypothesis_mutant(data))
    if src is None:
        return
    small = {"n_layers": 2} if any(f.name == "n_layers" for f in src.module.fields) else {}
    try:
        config = src.config(small)
        src.params(config)
        for entry in src.entries:
            src.lower(config, entry)
    except LinnetError:
        pass


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_sources_are_valid(name):
    src = Source.parse_text(SOURCES[name], f"{name}.linnet")
    config = src.config({"n_layers": 2})
    for entry in src.entries:
        src.lower(config, entry)


# -- the CLI on fixed mutants ------------------------------------------------------------------


def fixed_mutants(count: int = 12, seed: int = 20261129) -> list[str]:
    """Mutants with mistakes, made by a seeded RNG (no hypothesis), cycling the sources."""
    r = Seeded(seed)
    out = []
    while len(out) < count:
        text = mutant(r, sorted(SOURCES)[len(out) % len(SOURCES)])
        try:
            Source.parse_text(text, "fixed")
        except SourceError:
            out.append(text)  # only mutants with mistakes: the CLI must report them
    return out


def test_fixed_mutants_are_mistakes():
    assert len(fixed_mutants()) == 12


def test_cli_check_prints_no_traceback(tmp_path):
    for i, text in enumerate(fixed_mutants()):
        (tmp_path / f"mutant_{i:02d}.linnet").write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    for i in range(12):
        assert re.search(rf"mutant_{i:02d}\.linnet:\d+:\d+: error: ", result.stderr), i
    assert "in 12 sources" in result.stderr


def test_cli_check_subprocess_prints_no_traceback(tmp_path):
    for i, text in enumerate(fixed_mutants(count=4, seed=7)):
        (tmp_path / f"m{i}.linnet").write_text(text, encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "linnet.cli", "check", str(tmp_path)], capture_output=True, text=True
    )
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert res.stderr.count(": error: ") >= 4


def test_cli_check_no_traceback_on_dtype_compare(tmp_path):
    bad = tmp_path / "cmp.linnet"
    bad.write_text(
        BASE.replace(
            "  require n_heads % n_kv == 0", "  require n_heads % n_kv == 0\n  require act == f32"
        )
    )
    res = subprocess.run(
        [sys.executable, "-m", "linnet.cli", "check", str(bad)], capture_output=True, text=True
    )
    assert "Traceback" not in res.stderr
    assert res.returncode in (0, 1)
