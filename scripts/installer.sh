# Sourced by scripts/test.sh and the install scripts: how to install into (or remove from) an interpreter.
#
# With MX_TEST_UV set (scripts/test.sh sets it to a uv binary, after `eval "$(python3 scripts/uv_env.py)"`
# gave uv pip's indexes, find-links and constraints), installs go through `uv pip`; otherwise through pip.
# Either way a failure stops the calling script (set -e) with the installer's own message. Downloads of
# single wheels stay with pip (`pip download`; uv has no such command).

pip_install() {  # pip_install PYTHON ARGS...: `pip install ARGS` into PYTHON's environment
  local python="$1"
  shift
  if [ -n "${MX_TEST_UV:-}" ]; then
    # uv drops UV_CONSTRAINT when a command names constraints of its own: name pip's global ones each time.
    local global=() file
    for file in ${UV_CONSTRAINT:-}; do global+=(-c "$file"); done
    "$MX_TEST_UV" pip install --python "$python" "${global[@]}" "$@"
  else
    "$python" -m pip --disable-pip-version-check install "$@"
  fi
}

pip_uninstall() {  # pip_uninstall PYTHON NAME...: remove the distributions from PYTHON's environment
  local python="$1"
  shift
  if [ -n "${MX_TEST_UV:-}" ]; then
    "$MX_TEST_UV" pip uninstall -q --python "$python" "$@"
  else
    "$python" -m pip --disable-pip-version-check uninstall -q -y "$@"
  fi
}
