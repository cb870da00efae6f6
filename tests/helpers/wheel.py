"""The mx-strategies wheel built from this checkout, and metadata-only stand-in wheels for pip's resolver."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
# What a source tree must not carry into the wheel build.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".whl", "tests"
)


def build_wheel(tmp_path: Path) -> Path:
    """``pip wheel`` of a copy of the checkout (the checkout gets no build/ or *.egg-info)."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    subprocess.run(
        PIP + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    (wheel,) = wheels.glob("mx_strategies-*.whl")
    return wheel


def metadata_only_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel that installs nothing but its metadata: what pip's resolver reads of a distribution.

    For resolving against a version that is not installed here (torch 2.14.0 is
    a multi-GB CUDA download) without downloading it: ``--no-index
    --find-links`` on ``folder``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: mx-strategies-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path
