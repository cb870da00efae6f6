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
# What the install costs, measured on a fresh venv with pip's cache off (docs/demo.md): about 1.3 GiB and
# 1.5 to 3 minutes. pip's own lines show each download as it goes; the lines below say which step is running.
step() { echo "== $* ($(date +%H:%M:%S))"; }
step "Installing into $VENV: about 1.3 GiB, 1.5 to 3 minutes on a first run (quicker from pip's cache)"
pip install -q --upgrade pip
# torch first and pinned (scripts/constraints-cpu.txt: the CPU wheel), kept through every install below.
step "1/2 torch, CPU wheel (about 750 MiB)"
pip install --progress-bar on -c scripts/constraints-cpu.txt torch
step "2/2 mx-strategies and its demo extra (about 600 MiB)"
pip install --progress-bar on -c scripts/constraints-cpu.txt ".[demo]"
step "Installed; running the demo"
exec "$VENV/bin/mx-strategies" demo "$@"
