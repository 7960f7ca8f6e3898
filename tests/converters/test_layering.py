"""The layer contracts import-linter cannot check: converters/ installs as
`linnet.converters` from outside linnet/, where import-linter does not look. Every import
statement counts, the lazy ones inside functions included (see docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (folder, modules none of its files may import, why)
CONTRACTS = [
    (
        "converters",
        ("linnet.targets", "linnet.hub", "linnet.hub_remote", "linnet.hub_files", "linnet.parity",
         "linnet.commands", "linnet.cli", "linnet.torch", "linnet.jax", "linnet.runtime"),
        "converters write files from a Weights stream; resolving, pulling and loading are the "
        "front doors' business",
    ),
    *(
        (
            f"linnet/{layer}",
            ("linnet.converters",),
            "the writers sit above the compiler and the readers",
        )
        for layer in ("core", "syntax", "check", "ir", "backends", "weights")
    ),
]  # fmt: skip


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def breaches(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("folder, forbidden, why", CONTRACTS, ids=[c[0] for c in CONTRACTS])
def test_layer_contract(folder, forbidden, why):
    assert (ROOT / folder).is_dir()
    assert breaches(folder, forbidden) == [], why


def test_a_breach_is_found(tmp_path, monkeypatch):
    """The check itself: a lazy import inside a function is seen."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f():\n    from linnet.hub import pull\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert breaches("pkg", ("linnet.hub",)) == ["pkg/m.py:2 imports linnet.hub"]
