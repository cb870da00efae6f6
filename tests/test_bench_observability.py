"""``python -m benchmarks --observability`` (progress and metrics on against off) runs end to end.

Tiny size and one round; nothing here asserts a timing. What is asserted is
what makes the figure mean something: the observed loads did write progress
lines and did record metrics (in multiprocess mode, as in a pod), the quiet
ones did not, and every load delivered every expected tensor (the harness
checks values on the first load of each loader and fails otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_observability_benchmark_compares_on_with_off(tmp_path):
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "AWS_", "RUNAI_", "PROMETHEUS_"))}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    out = tmp_path / "observability.json"
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--observability", "--size", "3MB", "--reps", "1", "--warmup", "0",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-5000:]
    result = json.loads(out.read_text())["observability"]
    assert set(result["seconds"]) == {"robust_quiet", "robust_observed"}
    assert all(len(s) == 1 for s in result["seconds"].values())
    assert result["ratio"] == result["median_s"]["robust_observed"] / result["median_s"]["robust_quiet"]
    # The one observed load: a line per streamed shard at least (the generated checkpoint: 6 with target tensors).
    assert result["progress_lines"] >= 6
    assert all(line.startswith("[Worker 0] target streaming ") for line in result["progress_excerpt"])
    # Its metrics, and only its (the quiet load recorded none): the target's tensors once.
    target_tensors = result["tensors"] - 6  # the MTP head's 6 tensors are left to the draft
    assert result["collected"]["mx_robust_tensors_total"] == target_tensors
    assert result["added_work"]["progress_per_tensor_s"] > 0 and result["added_work"]["record_per_load_s"] > 0
    assert "ratio of medians (observed / quiet): " in completed.stdout
    assert any(name.endswith(".db") for name in os.listdir(multiproc))  # multiprocess mode was on
