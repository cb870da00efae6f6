"""scripts/gpu_check.py, the short device check, dry-run on the CPU (``--device cpu``).

On a GPU it loads into ``cuda:0``; here the same script loads into CPU
tensors through the real chain, so what it asserts (target and draft equal
to safetensors' own load, no re-initialization) and the files it times
(the strategy's own plan: no empty shard) are checked before a device
machine runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_dry_run_on_the_cpu_passes():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "AWS_"))}
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "gpu_check.py"), "--device", "cpu", "--size-mb", "40", "--reps", "1"],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    figures_line, verdict = run.stdout.strip().splitlines()[-2:]
    figures = json.loads(figures_line)
    assert (figures["device"], figures["target_ok"], figures["draft_ok"]) == ("cpu", True, True)
    assert figures["raw_runai_s"] > 0 and figures["robust_s"] > 0
    assert verdict.startswith("gpu-check: PASS target=True draft=True")
