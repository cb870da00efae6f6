"""The wheel's requirements never narrow a user's environment: no upper bound on torch or an engine.

vLLM 0.33.0 requires ``torch==2.14.0`` and SGLang 0.5.23 ``torch==2.14.1``;
with ``torch<2.14`` in our requirements, ``pip install mx-strategies`` into
a vLLM 0.33 image exited 0 after silently downgrading torch to 2.13.0. Here
pip's own resolver (``install --dry-run --report``, offline: ``--no-index``)
resolves the wheel built from this checkout in this environment, as it is
(torch 2.13.0) and with torch constrained to 2.14.0 and 2.14.1, which a
metadata-only stand-in wheel provides (the real ones are multi-GB CUDA
downloads; pip's resolver reads only metadata).
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from importlib.metadata import version

import pytest
from helpers.wheel import PIP, REPO, metadata_only_wheel
from packaging.requirements import Requirement

# The torch our own test installs pin (scripts/test.sh), and so the one installed here.
PINNED = next(
    line.split("==")[1].strip() for line in (REPO / "scripts" / "constraints-cpu.txt").read_text().splitlines()
    if line.startswith("torch==")
)  # fmt: skip
# The version the wheel is built at (pyproject.toml's, also scripts/build-dist.sh's file name).
VERSION = next(
    line.split('"')[1] for line in (REPO / "pyproject.toml").read_text().splitlines() if line.startswith("version = ")
)  # fmt: skip
# Engines and libraries whose versions users pick; we must not cap them.
UNCAPPED = ("torch", "vllm", "sglang", "modelexpress", "runai-model-streamer", "safetensors", "pydantic-settings")
# The ModelExpress 0.8 build the 0.8 venv installs (scripts/test.sh), named in one place.
MODELEXPRESS_08 = next(
    line.split("==")[1].strip() for line in (REPO / "scripts" / "constraints-modelexpress-next.txt").read_text().splitlines()
    if line.startswith("modelexpress==")
)  # fmt: skip


def _requires(wheel) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    return [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]


def _dry_run(wheel, tmp_path, *extra: str) -> dict:
    report = tmp_path / "report.json"
    done = subprocess.run(
        PIP + ["install", "--dry-run", "--no-index", "--report", str(report), *extra, str(wheel)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())


def _installs(report: dict) -> dict[str, str]:
    """What pip would install or replace, besides mx-strategies itself (installed already in the test venv)."""
    found = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    # pip replaces ours where the installed mx-strategies is not this version (or is the same version from the tree).
    assert found.pop("mx-strategies", VERSION) == VERSION
    return found


def test_no_requirement_caps_torch_or_an_engine(built_wheel):
    for req in _requires(built_wheel):
        if req.name.lower() in UNCAPPED:
            capped = [spec for spec in req.specifier if spec.operator in ("<", "<=", "==", "===", "~=")]
            assert not capped, f"{req}: an upper bound narrows the user's environment"
    torch = [r for r in _requires(built_wheel) if r.name == "torch"]
    assert torch and all(r.specifier.contains(v) for r in torch for v in ("2.13.0", "2.14.0", "2.14.1", "3.0.0"))


def test_installing_the_wheel_here_changes_nothing_but_itself(built_wheel, tmp_path):
    installs = _installs(_dry_run(built_wheel, tmp_path))
    assert installs == {}, installs
    assert version("torch").split("+")[0] == PINNED  # what the test venv holds (scripts/test.sh)


@pytest.mark.parametrize("torch_version", ["2.14.0", "2.14.1"])
def test_the_wheel_resolves_beside_the_torch_of_vllm_033_and_sglang_0523(built_wheel, tmp_path, torch_version):
    links = tmp_path / "links"
    metadata_only_wheel(links, "torch", torch_version)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={torch_version}\n")
    installs = _installs(_dry_run(built_wheel, tmp_path, "--find-links", str(links), "-c", str(constraints)))
    # pip installs the engine's torch (the stand-in here) and us; it downgrades nothing.
    assert installs == {"torch": torch_version}, installs


def test_the_wheel_resolves_with_torch_pinned_to_what_is_installed(built_wheel, tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={PINNED}\n")
    assert _installs(_dry_run(built_wheel, tmp_path, "-c", str(constraints))) == {}


def test_the_wheel_keeps_a_modelexpress_08_development_build(built_wheel, tmp_path):
    """Images that track ModelExpress 0.8 keep it: before, pip moved them back to 0.7.0."""
    links = tmp_path / "links"
    metadata_only_wheel(links, "modelexpress", MODELEXPRESS_08)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"modelexpress=={MODELEXPRESS_08}\n")
    installs = _installs(_dry_run(built_wheel, tmp_path, "--find-links", str(links), "-c", str(constraints)))
    # Where 0.8 is installed already (the 0.8 venv) pip installs nothing; elsewhere it takes 0.8 and nothing else.
    expected = {} if version("modelexpress") == MODELEXPRESS_08 else {"modelexpress": MODELEXPRESS_08}
    assert installs == expected, installs


def test_the_vllm_extra_asks_for_vllm_without_its_runai_extra(built_wheel):
    """vLLM 0.34's ``runai`` extra needs runai-model-streamer-azure 0.17.1, which the registry lacks: through
    ``vllm[runai]`` pip could not give a user 0.34. We require runai ourselves."""
    extra = [r for r in _requires(built_wheel) if r.name == "vllm"]
    assert [str(r) for r in extra] == ['vllm>=0.25; extra == "vllm"']
    runai = [r for r in _requires(built_wheel) if r.name == "runai-model-streamer" and r.marker is None]
    assert runai and runai[0].specifier.contains("0.17.1")
