"""The GPU check (scripts/gpu-e2e.sh) without a GPU: every way it stops before vLLM, and its verdict line.

The run itself is ``mx-strategies demo --engine vllm --device cuda``: the
same code as the CPU real-engine demo (tests/test_demo_engine.py) with
vLLM's CUDA build, which needs a GPU. Here the script meets a missing GPU,
a ``nvidia-smi`` that lists none, bad settings and missing prerequisites
with the real tools; the last two tests stand a fake ``nvidia-smi`` and a
fake ``python`` (it answers the prerequisite check and writes a canned
result) in for the GPU and the demo, because neither can run here, to show
how the script turns a result into its one line and exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu-e2e.sh")


def _fake_nvidia_smi(tmp_path, listing: str = "NVIDIA H200, 143771 MiB"):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho '{listing}'\n")
    fake.chmod(0o755)
    return fake


def _run_script(tmp_path, **env):
    return subprocess.run(
        ["bash", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPU_E2E_WORKDIR": str(tmp_path / "work"), **env},
    )


def test_script_syntax():
    subprocess.run(["bash", "-n", SCRIPT], check=True, timeout=30)


def test_script_without_a_gpu_says_so_in_one_line(tmp_path):
    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(tmp_path / "no-such-nvidia-smi"))

    assert run.returncode == 77
    assert run.stdout.splitlines() == [
        f"SKIP: no NVIDIA GPU on this machine ({tmp_path / 'no-such-nvidia-smi'} not found); scripts/gpu-e2e.sh needs one"
    ]


def test_script_with_nvidia_smi_but_no_gpu_says_so(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n")
    fake.chmod(0o755)

    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(fake))

    assert run.returncode == 77
    assert run.stdout.splitlines() == [f"SKIP: {fake} lists no usable NVIDIA GPU; scripts/gpu-e2e.sh needs one"]


def test_script_tensor_parallel_needs_that_many_gpus(tmp_path):
    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(_fake_nvidia_smi(tmp_path)), GPU_E2E_TP="2")

    assert run.returncode == 77
    assert run.stdout.splitlines() == [f"SKIP: GPU_E2E_TP=2 needs 2 GPUs; {tmp_path / 'nvidia-smi'} lists 1"]


def test_script_refuses_bad_settings_by_name(tmp_path):
    smi = str(_fake_nvidia_smi(tmp_path))
    for env, line in (
        ({"GPU_E2E_TP": "two"}, "FAIL: GPU_E2E_TP='two' is not a positive integer"),
        ({"GPU_E2E_ARCH": "llama"}, "FAIL: GPU_E2E_ARCH='llama' is not deepseek_v3 or qwen3_next"),
        ({"GPU_E2E_BUDGET_S": "5m"}, "FAIL: GPU_E2E_BUDGET_S='5m' is not a number of seconds"),
    ):
        run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=smi, **env)
        assert (run.returncode, run.stdout.splitlines()) == (2, [line]), env


def test_script_with_a_gpu_but_no_python_fails_as_a_prerequisite(tmp_path):
    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(_fake_nvidia_smi(tmp_path)), PYTHON=str(tmp_path / "no-python"))

    assert run.returncode == 2
    assert run.stdout.splitlines() == [f"FAIL: no python at '{tmp_path / 'no-python'}' (set PYTHON)"]


def test_script_names_what_this_python_lacks_for_a_gpu_run(tmp_path):
    """This environment's python, as it is: what it lacks for --device cuda, in the script's one line."""
    from mx_strategies.testing.engine.check import missing

    expected = missing("cuda")
    assert expected  # no environment here has vLLM's CUDA build
    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(_fake_nvidia_smi(tmp_path)), PYTHON=sys.executable)

    assert run.returncode == 2
    assert run.stdout.splitlines() == [f"FAIL: prerequisites missing in {sys.executable}: {expected} (see docs/gpu-e2e.md)"]


FAKE_PYTHON = """#!/bin/sh
# Stand-in for python on a GPU machine (no GPU here): the prerequisite check passes; the demo
# records its arguments and writes the canned result; the verdict step runs the real python.
case "$*" in
  *"import missing"*) echo ""; exit 0 ;;
  "-m mx_strategies.cli demo"*) echo "$@" > "$GPU_E2E_WORKDIR/args"; cat "$FAKE_RESULT"; exit "$FAKE_STATUS" ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def _script_with_result(tmp_path, result, status: int):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    canned = tmp_path / "result.json"
    canned.write_text(json.dumps(result) if isinstance(result, dict) else result)
    return _run_script(
        tmp_path,
        GPU_E2E_NVIDIA_SMI=str(_fake_nvidia_smi(tmp_path)),
        PYTHON=str(fake),
        REAL_PYTHON=sys.executable,
        FAKE_RESULT=str(canned),
        FAKE_STATUS=str(status),
        GPU_E2E_BUDGET_S="300",
    )


def test_script_prints_the_checks_line_and_passes_on_a_passing_result(tmp_path):
    line = "PASS: deepseek_v3 on cuda: robust from s3://mx-engine-check/deepseek_v3 = vLLM's default loader, bit for bit"
    run = _script_with_result(tmp_path, {"workdir": "w", "checks": [{"ok": True, "line": line}]}, 0)

    assert run.returncode == 0, run.stderr
    (out,) = run.stdout.splitlines()
    assert out.startswith(line + " (NVIDIA H200, ")
    args = (tmp_path / "work" / "args").read_text().split()
    assert args[:7] == ["-m", "mx_strategies.cli", "demo", "--engine", "vllm", "--device", "cuda"]
    assert args[args.index("--engine-timeout") + 1] == "120"  # (300 - 60) / 2
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.3"


def test_script_fails_on_a_failing_result_and_on_no_result(tmp_path):
    line = "FAIL: deepseek_v3: rank 0: draft: 1 tensor(s) differ from deepseek_v3-default's: model.layers.2.eh_proj.weight"
    run = _script_with_result(tmp_path, {"workdir": "w", "checks": [{"ok": False, "line": line}]}, 1)
    assert run.returncode == 1
    assert run.stdout.splitlines()[0].startswith(line + " (NVIDIA H200, ")

    run = _script_with_result(tmp_path, "", 124)
    assert run.returncode == 1
    assert run.stdout.startswith("FAIL: the demo wrote no result (timed out (GPU_E2E_BUDGET_S); JSONDecodeError)")
