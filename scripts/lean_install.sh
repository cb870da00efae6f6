# Sourced by scripts/install-vllm-lean.sh and scripts/install-sglang-lean.sh: the steps every
# "engine classes beside the CPU torch" install shares. Expects PY, PIP (array), TORCH_VERSION, CACHE
# and NAME (the calling script's name, for messages) to be set.

# shellcheck source=scripts/installer.sh
. "$(dirname "${BASH_SOURCE[0]}")/installer.sh"

# torch==TORCH_VERSION installed (the CPU wheel), or stop: never change the torch a venv has.
require_torch() {
  local have
  have="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  if [ -z "$have" ]; then
    pip_install "$PY" -q "torch==${TORCH_VERSION}"
  elif [ "${have%%+*}" != "$TORCH_VERSION" ]; then
    echo "$NAME: torch $have installed, need $TORCH_VERSION; refusing to change torch" >&2
    exit 3
  fi
}

# The path of DIST==VERSION's wheel in CACHE, downloaded (no dependencies) the first time.
cached_wheel() {
  local dist="$1" version="$2" wheel
  mkdir -p "$CACHE"
  wheel="$(ls "$CACHE"/"${dist}"-"${version}"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$wheel" ]; then
    "${PIP[@]}" download -q --no-deps --only-binary=:all: --dest "$CACHE" "${dist}==${version}" >&2
    wheel="$(ls "$CACHE"/"${dist}"-"${version}"-*.whl | head -n1)"
  fi
  echo "$wheel"
}

# A constraints file pinning torch and forbidding each of the given packages (pip fails loudly instead).
forbidding() {
  local out="$1"
  shift
  {
    echo "torch==${TORCH_VERSION}"
    for p in "$@"; do echo "${p}<0"; done
  } >"$out"
}
