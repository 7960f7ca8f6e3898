"""Size limits that keep the code readable: modules and functions that grew too long.

    python scripts/code_limits.py            # check linnet/ and converters/; exit 1 on an offender
    python scripts/code_limits.py --survey   # also list zoo/ scripts/ bench/ (never fails on them)
    python scripts/code_limits.py PATH ...   # check these files or folders instead

Checked folders fail the run when a module is over MAX_MODULE lines or a function (or
method) over MAX_FUNCTION lines. Each offender prints as `path:line name length`; a module's
line is 1 and its name is `<module>`. Complexity is ruff's job
(`ruff check --select C901 --config 'lint.mccabe.max-complexity=15'`).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE = 500
MAX_FUNCTION = 60
CHECKED = ("linnet", "converters")
SURVEYED = ("zoo", "scripts", "bench")


def python_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_file():
            yield path
        else:
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)


def offenders(path: Path) -> Iterator[tuple[int, str, int]]:
    """(line, name, length) for the module and each function over its limit."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    if lines > MAX_MODULE:
        yield 1, "<module>", lines
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION:
                yield node.lineno, node.name, length


def report(paths: list[Path]) -> int:
    """Print every offender under `paths`; return how many there were."""
    count = 0
    for path in python_files(paths):
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for line, name, length in sorted(offenders(path)):
            print(f"{shown}:{line} {name} {length}")
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders to check")
    parser.add_argument("--survey", action="store_true", help=f"also list {' '.join(SURVEYED)}")
    args = parser.parse_args(argv)
    checked = [p.resolve() for p in args.paths] or [ROOT / name for name in CHECKED]
    failed = report(checked)
    if args.survey:
        print("-- survey (not checked):")
        report([ROOT / name for name in SURVEYED])
    if failed:
        print(
            f"{failed} over the limits ({MAX_MODULE} lines a module, {MAX_FUNCTION} a function)",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
