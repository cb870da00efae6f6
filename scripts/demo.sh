#!/usr/bin/env bash
# The README's first command: make a virtual environment, install the
# package with its demo extra, and run `mx-strategies demo` (a model and its
# MTP draft loaded from an S3 server on 127.0.0.1, with and without
# mx_strategies). Works on a fresh clone with only Python and the package
# registries. Usage: scripts/demo.sh [demo args, e.g. --json]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MX_DEMO_VENV:-.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "Creating $VENV ..."
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
echo "Installing mx-strategies and its demo extra into $VENV ..."
pip install -q --upgrade pip
# torch first and pinned (scripts/constraints-cpu.txt: the CPU wheel), kept through every install below.
pip install -q -c scripts/constraints-cpu.txt torch
pip install -q -c scripts/constraints-cpu.txt ".[demo]"
exec "$VENV/bin/mx-strategies" demo "$@"
