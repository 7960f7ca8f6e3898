#!/usr/bin/env bash
# The test command: set up from scratch (idempotent), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The JAX path in a virtual environment of its own, without torch (scripts/check_jax_only.sh):
# mostly pip's downloads and installs, so it runs in the background from here, beside the
# single-threaded lint steps, instead of after the suite; its log and status come at the end.
JAX_ONLY_LOG=$(mktemp -t linnet-jax-only.XXXXXX)
bash scripts/check_jax_only.sh >"$JAX_ONLY_LOG" 2>&1 &
JAX_ONLY_PID=$!
linnet check zoo/
# The habits that keep the code readable: one format, lint with complexity <= 15, no module
# over 500 lines or function over 60 (linnet/, converters/), layers that import downward only.
CODE="linnet converters weights_maps zoo tests scripts bench"
ruff format --check $CODE
ruff check $CODE
python scripts/code_limits.py
lint-imports
# torch.compile's artefacts in a folder of this run's own: a graph another checkout traced
# against other kernels (torch's default folder is shared under /tmp) is never replayed.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d -t linnet-inductor.XXXXXX)}"
# SmolLM2's real-weights checkpoint, built once here rather than by both workers at once.
python scripts/make_smollm2_checkpoint.py > /dev/null
# A skipped test fails the run (tests/skip_policy.py): only `gpu` tests may skip without a GPU.
# Two workers (most tests are small and single-threaded); a module stays on one worker, so
# its module fixtures are built once. LINNET_TEST_WORKERS=0 runs in one process.
# A worker that crashes ends the run at once and names its test: pytest-xdist 3.8's loadfile
# scheduler can wait forever after replacing a crashed worker. A test still running after
# 15 minutes prints every thread's stack (it is not stopped: that is a hang's diagnosis).
# One intra-op thread per worker (OMP_NUM_THREADS, read when torch starts, so also the
# subprocesses tests start): the two workers already fill the two cores, and a worker's
# second OpenMP thread only busy-waits against the other worker. On the 2-core EPYC, 32 tests
# of test_rows.py and test_gguf.py over two workers took 94 and 65 s at two threads, 42 and
# 35 s at one (docs/testing.md). LINNET_TEST_WORKERS=0 (one process) keeps torch's default, and so does
# the parity gate after it, which runs alone.
threads=()
if [ "${LINNET_TEST_WORKERS:-2}" != 0 ]; then threads=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"); fi
env "${threads[@]}" LINNET_STRICT_SKIPS=1 python -m pytest -q -p no:cacheprovider -rfEs --durations=30 \
    -o faulthandler_timeout=900 -n "${LINNET_TEST_WORKERS:-2}" --dist loadfile \
    --max-worker-restart 0 "$@"
# The parity gate over every zoo entry (tiny random checkpoints) and SmolLM2's real weights.
python scripts/parity_ci.py
jax_only=0
wait "$JAX_ONLY_PID" || jax_only=$?
cat "$JAX_ONLY_LOG"
if [ "$jax_only" -ne 0 ]; then
  echo "test: scripts/check_jax_only.sh failed (exit $jax_only)" >&2
  exit "$jax_only"
fi
