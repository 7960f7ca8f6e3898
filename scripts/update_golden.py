"""Regenerate the snapshots under tests/golden/ after an intended change.

The snapshots are the printed Core IR of the zoo sources and the generated PyTorch and
JAX source:

    python scripts/update_golden.py          # rewrite every snapshot
    python scripts/update_golden.py --check  # exit 1 if any snapshot is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def snapshots():
    """(path, text) of every snapshot."""
    from tests.backends import test_torch_backend as generated
    from tests.ir.test_ir_graphs import GOLDEN, golden_path, golden_text

    for variant, entry in GOLDEN:
        yield golden_path(variant, entry), golden_text(variant, entry)
    for name in generated.TINY:
        yield generated.golden_path(name), generated.golden_text(name)
    from tests.backends import test_jax_backend as jax_generated

    for name in jax_generated.TINY:
        yield jax_generated.golden_path(name), jax_generated.golden_text(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any snapshot is stale")
    check = parser.parse_args(argv).check
    stale = []
    for path, text in snapshots():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if check else 'wrote'} {path.relative_to(ROOT)}")
    if not stale:
        print("snapshots up to date")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
