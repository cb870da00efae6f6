"""The venv under test holds the built wheel, and the wheel's command works from it as a user runs it.

scripts/test.sh builds the wheel and sdist once (scripts/build-dist.sh) and installs
``dist/mx_strategies-<version>-py3-none-any.whl[test]`` into each venv, not the tree; it names the wheel in
``MX_TEST_EXPECT_WHEEL``. Here: the installed distribution is that wheel (its version is pyproject's, its
files are the wheel's byte for byte, pip's or uv's ``direct_url.json`` points at the wheel file, not at the
checkout), and from that install, in a child process with an empty ``HOME``, a working folder outside the
checkout and no ``PYTHONPATH``, ``mx-strategies --version`` and ``mx-strategies doctor`` (a local folder,
an S3 URI on moto at 127.0.0.1, a missing folder) exit with their documented status and print no traceback.

``python -m pytest`` puts the checkout first on ``sys.path``, so the suite itself imports the tree's
``mx_strategies``; the check that the tree's files equal the wheel's says that this is the same code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
from helpers.wheel import REPO

import mx_strategies
from mx_strategies.testing import synthetic
from mx_strategies.testing.loopback import S3_ENV

try:
    import tomllib
except ImportError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib

PYPROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DIST = "mx-strategies"
CLI_TIMEOUT_S = 60  # each run takes a few seconds (imports torch); the bound only stops a hang


def _expected_wheel() -> Path:
    named = os.environ.get("MX_TEST_EXPECT_WHEEL")
    if not named:
        pytest.skip("MX_TEST_EXPECT_WHEEL is unset: scripts/test.sh names the wheel it installed")
    wheel = Path(named).resolve()
    assert wheel.is_file(), f"MX_TEST_EXPECT_WHEEL={named}: no such file"
    return wheel


def _console_script() -> Path:
    script = Path(sys.executable).parent / "mx-strategies"
    assert script.is_file(), f"the mx-strategies console script is not installed next to {sys.executable}"
    return script


def _outside(tmp_path: Path, **extra: str) -> dict:
    """A child's environment and working folder as a fresh user's: empty HOME, outside the checkout."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    assert not cwd.resolve().is_relative_to(REPO)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("MX_", "AWS_", "XDG_"))}
    env.update(HOME=str(home), COLUMNS="200", **extra)
    return {"env": env, "cwd": cwd}


def _run(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(_console_script()), *args],
        check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, **_outside(tmp_path, **extra),
    )  # fmt: skip
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    """The wheel's package files (its .dist-info aside: RECORD and INSTALLER differ once installed)."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if ".dist-info/" not in name}


def test_the_installed_version_is_pyprojects():
    assert metadata.version(DIST) == PYPROJECT_VERSION
    assert mx_strategies.__version__ == PYPROJECT_VERSION


def test_the_venv_holds_the_built_wheel_not_the_tree(tmp_path):
    wheel = _expected_wheel()
    assert wheel.name == f"mx_strategies-{PYPROJECT_VERSION}-py3-none-any.whl"
    dist = metadata.distribution(DIST)
    direct_url = dist.read_text("direct_url.json")
    if direct_url is not None:  # pip and uv write it for a wheel file: its URL, with archive_info
        found = json.loads(direct_url)
        assert "dir_info" not in found, f"installed from a folder (the tree?), not the wheel: {found}"
        assert found["url"] == wheel.as_uri(), found
    # A fresh interpreter outside the checkout finds the package in this venv's site-packages.
    probe = _outside(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", "import mx_strategies; print(mx_strategies.__file__)"],
        capture_output=True, text=True, check=True, timeout=CLI_TIMEOUT_S, **probe,
    )  # fmt: skip
    package = Path(done.stdout.strip()).resolve().parent
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert package == purelib / "mx_strategies", (package, purelib)
    # Every file the wheel holds is installed there as the wheel has it; the tree this suite imports has the same.
    files = _wheel_files(wheel)
    assert "mx_strategies/__init__.py" in files
    assert [n for n, data in files.items() if (purelib / n).read_bytes() != data] == [], (
        f"site-packages holds another build than {wheel.name}"
    )
    assert [n for n, data in files.items() if (REPO / n).read_bytes() != data] == [], (
        "the checkout changed since scripts/build-dist.sh built the wheel: run scripts/test.sh again"
    )
    # And the wheel installed nothing the tree lacks or the tree something the wheel lacks (a stale module).
    installed = {str(p.relative_to(purelib)) for p in (purelib / "mx_strategies").rglob("*.py")}
    assert installed == {n for n in files if n.endswith(".py")}


def test_version_from_the_install(tmp_path):
    done = _run(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"mx-strategies {PYPROJECT_VERSION}"


def _checkpoint(path: Path) -> Path:
    """A real two-shard safetensors checkpoint with its index and config (a few KiB)."""
    g = torch.Generator().manual_seed(0)
    shards = [
        {"model.embed_tokens.weight": torch.randn(8, 4, generator=g), "model.layers.0.mlp.weight": torch.randn(4, 4, generator=g)},
        {"model.layers.1.mlp.weight": torch.randn(4, 4, generator=g), "lm_head.weight": torch.randn(8, 4, generator=g)},
    ]  # fmt: skip
    synthetic.write_shards(str(path), shards)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    return path


def test_doctor_on_a_local_folder_from_the_install(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    done = _run(tmp_path, "doctor", str(ckpt))  # the human report, as a user reads it (--json: the S3 test below)
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())  # undo rich's line folding
    assert "4 tensors" in out and "in 2 of 2 shards" in out and "no tensor data" in out, out
    assert "OK: nothing here stops a load." in out, out


def test_doctor_on_s3_from_the_install(tmp_path, s3):
    uri = s3.upload(str(_checkpoint(tmp_path / "ckpt")), s3.bucket, "model")
    done = _run(tmp_path, "doctor", uri, "--json", **S3_ENV, AWS_ENDPOINT_URL=s3.endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["source"]["uri"] == uri
    assert len(report["shards"]) == 2


def test_doctor_on_a_missing_folder_exits_2_with_one_line(tmp_path):
    """The documented usage/access status (docs/doctor.md): 2, one line on stderr, no traceback."""
    done = _run(tmp_path, "doctor", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
