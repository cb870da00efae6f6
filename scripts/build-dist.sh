#!/usr/bin/env bash
# Build the release files into dist/ and check them: the sdist and the wheel, with `python -m build` (the sdist
# first, then the wheel from the sdist, as PyPI's users would build it), `twine check --strict` on both, and
# two checks of our own:
#   - the wheel built from the sdist holds the same files as a wheel built straight from the tree (the sdist
#     lost nothing the package needs);
#   - the sdist carries no venv, cache, VCS folder or build output.
# Usage: bash scripts/build-dist.sh [PYTHON]
#   PYTHON: the interpreter to build with; build, twine and the build system's requirements are installed into
#   it. Without it, a venv of its own: ${MX_DIST_VENV:-.venv-dist} (made once; a few MB).
# With MX_TEST_UV set (scripts/test.sh sets it), installs go through uv (scripts/installer.sh).
# Prints the wheel's path last. The builds run without isolation, in that interpreter: `build` checks that it
# holds the build system's requirements (pyproject.toml's [build-system]), installed here first.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/installer.sh
. scripts/installer.sh

if [ $# -gt 0 ]; then
  PY="$1"
else
  VENV="${MX_DIST_VENV:-.venv-dist}"
  if [ ! -x "$VENV/bin/python" ]; then
    if [ -n "${MX_TEST_UV:-}" ]; then
      "$MX_TEST_UV" venv -q --python "${PYTHON:-python3}" "$VENV"
    else
      "${PYTHON:-python3}" -m venv "$VENV"
    fi
  fi
  PY="$VENV/bin/python"
  # A venv uv made has no pip: give it one where pip installs.
  [ -n "${MX_TEST_UV:-}" ] || "$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip >/dev/null
fi

# The build system's requirements, read from pyproject.toml (tomllib on 3.11+; its one line otherwise).
mapfile -t BUILD_REQUIRES < <("$PY" - <<'EOF'
import re
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    requires = tomllib.loads(text)["build-system"]["requires"]
except ImportError:
    requires = re.findall(r'"([^"]+)"', re.search(r"\[build-system\][^\[]*?requires\s*=\s*\[([^\]]*)\]", text).group(1))
print("\n".join(requires))
EOF
)
pip_install "$PY" -q "build>=1.2" "twine>=6.1" "${BUILD_REQUIRES[@]}"

VERSION="$("$PY" - <<'EOF'
import re
print(re.search(r'(?m)^version\s*=\s*"([^"]+)"', open("pyproject.toml", encoding="utf-8").read()).group(1))
EOF
)"
WHEEL="dist/mx_strategies-${VERSION}-py3-none-any.whl"
SDIST="dist/mx_strategies-${VERSION}.tar.gz"

# setuptools builds in the tree (build/, mx_strategies.egg-info/) and keeps what it finds there: a module
# deleted since the last build stays in build/lib and would ship in a wheel built straight from the tree, and
# the egg-info's SOURCES.txt is read back into the next sdist. Both are build outputs (.gitignore): start clean.
# One build at a time in a tree: setuptools builds in it (build/, the egg-info, the sdist's release folder), and
# two builds side by side (two scripts/test.sh runs) remove each other's files.
mkdir -p dist
exec 9>dist/.build-dist.lock
flock 9
rm -rf build mx_strategies.egg-info
rm -f dist/mx_strategies-*
direct="$(mktemp -d)"
trap 'rm -rf "$direct"' EXIT

"$PY" -m build --no-isolation --outdir dist . >"$direct/build.log" 2>&1 || { cat "$direct/build.log"; exit 1; }
"$PY" -m build --no-isolation --wheel --outdir "$direct" . >"$direct/build-direct.log" 2>&1 ||
  { cat "$direct/build-direct.log"; exit 1; }
rm -rf build mx_strategies.egg-info
[ -f "$WHEEL" ] && [ -f "$SDIST" ] || { echo "build-dist: expected $WHEEL and $SDIST; dist/ holds: $(ls dist)"; exit 1; }
"$PY" -m twine --no-color check --strict "$WHEEL" "$SDIST"

"$PY" - "$WHEEL" "$direct/$(basename "$WHEEL")" "$SDIST" <<'EOF'
import sys
import tarfile
import zipfile

wheel, direct, sdist = sys.argv[1:]
from_sdist, from_tree = (set(zipfile.ZipFile(path).namelist()) for path in (wheel, direct))
if from_sdist != from_tree:
    sys.exit(
        "build-dist: the wheel built from the sdist differs from the one built from the tree:\n"
        f"  only from the sdist: {sorted(from_sdist - from_tree)}\n  only from the tree: {sorted(from_tree - from_sdist)}"
    )
# Nothing of a working tree: venvs, caches, VCS folders, build outputs, compiled files.
FORBIDDEN_PARTS = {".git", ".hg", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis",
                   "node_modules", "build", "dist", ".tox", ".nox", "venv", ".whl"}
with tarfile.open(sdist) as archive:
    members = archive.getnames()
bad = [
    name for name in members
    if any(part in FORBIDDEN_PARTS or part.startswith(".venv") for part in name.split("/")[1:])
    or name.endswith((".pyc", ".pyo", ".whl", ".so"))
]
if bad:
    sys.exit(f"build-dist: the sdist carries what a source release must not: {bad[:20]}")
print(f"build-dist: {len(from_sdist)} files in the wheel (the same from the sdist and from the tree), "
      f"{len(members)} in the sdist, none of them a venv, cache or VCS file")
EOF
echo "$WHEEL"
