"""Print ``export UV_...=...`` lines that give uv the indexes, links and constraints pip has here.

pip on these machines reads extra indexes, find-links and a global constraints file from its
configuration (``pip config list``: files and ``PIP_*`` variables). uv reads none of pip's
configuration, so scripts/test.sh evaluates this script's output before it installs with uv:
the same packages come from the same places, under the same constraints, as with pip.

Usage: eval "$(python3 scripts/uv_env.py)"
"""

from __future__ import annotations

import shlex
import subprocess
import sys


def pip_settings() -> dict[str, str]:
    """pip's effective settings (``global.x``, ``install.x``, ``:env:.x``), the last one named winning."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    settings: dict[str, str] = {}
    order = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence: environment over files
    ranked: dict[str, int] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        value = value.strip().strip("'\"")
        rank = order.get(section, 0)
        if name and rank >= ranked.get(name, -1):
            settings[name], ranked[name] = value, rank
    return settings


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    env = {
        # pip takes the best version from every index and link; uv's default stops at the first index that has one.
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        # Venvs share the cache's files (hard links: a CI run's venvs cost their size once, not twice, on a
        # shared disk); where cache and venv sit on different file systems uv copies instead. Nothing we
        # run edits an installed file in place.
        "UV_LINK_MODE": "hardlink",
        # pip compiles every module it installs; uv only when asked. Without .pyc files every process that
        # imports vLLM compiles it again where PYTHONDONTWRITEBYTECODE is set (it is on these machines):
        # 7 s more per engine process, three processes per engine start.
        "UV_COMPILE_BYTECODE": "1",
    }
    if "index-url" in settings:
        env["UV_DEFAULT_INDEX"] = settings["index-url"]
    if "extra-index-url" in settings:
        env["UV_EXTRA_INDEX_URL"] = " ".join(settings["extra-index-url"].split())
    if "find-links" in settings:
        env["UV_FIND_LINKS"] = ",".join(settings["find-links"].split())
    if "constraint" in settings:
        env["UV_CONSTRAINT"] = " ".join(settings["constraint"].split())
    if "cert" in settings:
        env["SSL_CERT_FILE"] = settings["cert"]
    if "default-timeout" in settings:
        env["UV_HTTP_TIMEOUT"] = settings["default-timeout"]
    return env


if __name__ == "__main__":
    for name, value in uv_environment(pip_settings()).items():
        print(f"export {name}={shlex.quote(value)}")
