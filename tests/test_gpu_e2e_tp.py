"""The tensor-parallel verdict of the GPU check (``GPU_E2E_TP=2 scripts/gpu-e2e.sh``), without a GPU.

The run itself needs two GPUs (nccl) and has not run yet; what it judges is
checked here on canned logs in the format of our strategy's report line
(``mx_strategies.report.LoadReport.summary``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.scripts import load_gpu_e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu-e2e.sh")
HELPER = os.path.join(REPO, "scripts", "gpu_e2e.py")

gpu_e2e = load_gpu_e2e()

URI = "s3://mx-e2e/tiny-mtp"
MANIFEST = {
    "arch": "deepseek_v3",
    "tensor_count": 97,
    "draft_tensor_count": 44,
    "draft_convention": "nextn_layers",
    "checkpoint_bytes": 23544224,
    "draft_bytes": 8527504,
}
ONCE = MANIFEST["checkpoint_bytes"] + MANIFEST["draft_bytes"]


def _log(ranks=(0, 1), distributed=True) -> str:
    lines = []
    mark = ", distributed" if distributed else ""
    for rank in ranks:
        w = f"(VllmWorker_TP{rank} pid={100 + rank}) INFO 11-30 01:19:10 [robust.py:256]"
        lines.append(
            f"{w} [Worker {rank}] target loaded from model_weights='{URI}': 97 tensors verified, "
            f"23544224 of 23544224 checkpoint bytes streamed (100.0%){mark} in 0.41s"
        )
        lines.append(
            f"{w} [Worker {rank}] draft loaded from model_weights='{URI}', convention nextn_layers: "
            f"44 tensors verified, 8527504 of 23544224 checkpoint bytes streamed (36.2%){mark} in 0.12s"
        )
    return "\n".join(lines) + "\n"


def test_every_rank_distributed_and_each_byte_once_passes():
    assert gpu_e2e.tp_problem(_log(), MANIFEST, 2, {"bytes_served": ONCE + 300_000}) == ""
    assert gpu_e2e.tp_problem(_log(), MANIFEST, 2, None) == ""  # no count: the log alone


def test_every_byte_read_by_every_rank_fails():
    problem = gpu_e2e.tp_problem(_log(), MANIFEST, 2, {"bytes_served": 2 * ONCE})
    assert problem.startswith("tensor parallel 2: S3 served")
    assert "the ranks did not share the reads" in problem


def test_a_load_that_was_not_distributed_fails():
    problem = gpu_e2e.tp_problem(_log(distributed=False), MANIFEST, 2, None)
    assert problem == "tensor parallel 2: rank 0's target load was not distributed (MX_MS_DISTRIBUTED=1?)"


def test_a_rank_without_its_load_lines_fails():
    assert gpu_e2e.tp_problem(_log(ranks=(0,)), MANIFEST, 2, None) == (
        "tensor parallel 2: no 'target loaded from' line for rank 1"
    )


def test_verdict_command_with_tp_judges_the_distribution(tmp_path):
    completion = {"choices": [{"index": 0, "text": " fox"}], "usage": {"completion_tokens": 16}}
    paths = {}
    for name, text in (
        ("log", _log()),
        ("completion", json.dumps(completion)),
        ("manifest", json.dumps(MANIFEST)),
        ("once", json.dumps({"bytes_served": ONCE + 300_000, "uri": URI})),
        ("twice", json.dumps({"bytes_served": 2 * ONCE, "uri": URI})),
    ):
        paths[name] = tmp_path / name
        paths[name].write_text(text)

    def verdict(stats: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, HELPER, "verdict", "--log", str(paths["log"]), "--completion", str(paths["completion"]),
             "--manifest", str(paths["manifest"]), "--stats-file", str(paths[stats]), "--tp", "2"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    good, bad = verdict("once"), verdict("twice")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "tensor parallel 2, every rank's loads distributed" in good.stdout
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.startswith("FAIL: tensor parallel 2: S3 served")


def test_script_with_one_gpu_skips_the_tp2_run(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB'\n")
    fake.chmod(0o755)
    env = dict(os.environ, GPU_E2E_NVIDIA_SMI=str(fake), GPU_E2E_TP="2", PYTHON=sys.executable)
    run = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 77, run.stdout + run.stderr
    assert run.stdout.strip() == "SKIP: GPU_E2E_TP=2 needs 2 GPUs; " + str(fake) + " lists 1"
