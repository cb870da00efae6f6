"""The benchmark (``python -m benchmarks``) runs end to end, as the README tells users to run it.

Tiny sizes and one repetition keep this quick; nothing here asserts a
timing (the targets are benchmark figures, not test conditions). What is
asserted is what makes the figures trustworthy: every loader delivered
every expected tensor (the script checks values against
``safetensors.torch.load_file`` on the first load of each and fails
otherwise), the MTP draft streamed only the head, and the report still
prints without matplotlib.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mx_strategies.settings import RobustSettings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = ["-m", "benchmarks"]  # run from the repository root

# Runs the benchmark with matplotlib made unimportable (a None entry in sys.modules).
WITHOUT_MATPLOTLIB = [
    "-c",
    "import runpy, sys; sys.modules['matplotlib'] = None; "
    "sys.argv = ['benchmarks'] + sys.argv[1:]; runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)",
]


def _run(args: list[str], *, command_prefix: list[str] = BENCH) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "AWS_", "RUNAI_"))}
    command = [sys.executable, *command_prefix, *args]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-5000:]
    return completed


def test_bench_runs_tiny_local_and_s3_and_reports_without_matplotlib(tmp_path):
    report_path = tmp_path / "bench.json"
    plot_path = tmp_path / "bench.png"
    workdir = tmp_path / "work"
    completed = _run(
        [
            "--size", "3MB", "--s3-size", "2MB", "--reps", "1", "--warmup", "0",
            "--memory", "robust", "--memory-reps", "1", "--workdir", str(workdir),
            "--json", str(report_path), "--plot", str(plot_path), "--clean",
        ]
    )  # fmt: skip

    report = json.loads(report_path.read_text())
    assert set(report["sites"]) == {"local", "s3"}
    local, s3 = report["sites"]["local"], report["sites"]["s3"]
    assert set(local["loaders"]) == {"runai_raw", "runai_copy", "robust", "robust_unordered", "upstream", "safetensors", "draft"}
    assert set(s3["loaders"]) == {"runai_raw", "runai_copy", "robust", "robust_unordered", "upstream", "draft"}  # load_file is local only
    for summary in (local, s3):
        site = summary["site"]
        assert site["shard_files"] == 8 and site["empty_shards"] == 1
        assert site["draft_names"] and all(name.startswith("mtp.") for name in site["draft_names"])
        for loader, row in summary["loaders"].items():
            assert len(row["samples_s"]) == 1 and not row["failures"], (loader, row["failures"])
        # Peak memory measured in child processes for robust and, for its ratio, raw runai.
        assert {l for l, row in summary["loaders"].items() if "peak_rss" in row} == {"runai_raw", "robust"}
        # Robust loads' phases and header bytes come from their load reports.
        for loader in ("robust", "robust_unordered", "draft"):
            row = summary["loaders"][loader]
            assert set(row["phases_median_s"]) == {"resolve", "stream", "post_load", "total"}, loader
            assert 0 < row["metadata_bytes_read"] <= site["metadata_bytes"], loader
            assert row["resolve_share"] == row["resolve_s"] / row["median_s"]
        # MX_ROBUST_DELIVERY_ORDER=arrival, where the runtime has that setting (older ones always used plan order).
        unordered = ["arrival"] if "delivery_order" in RobustSettings.model_fields else ["plan"]
        assert summary["loaders"]["robust_unordered"]["delivery_order"] == unordered

    # Over S3 every byte is counted by the proxy: the draft pulled its head and
    # the metadata, not the checkpoint; a target load pulled at least the data.
    draft_read = s3["loaders"]["draft"]["bytes_read_median"]
    assert s3["site"]["draft_bytes"] <= draft_read <= s3["site"]["draft_bytes"] + s3["site"]["metadata_bytes"] + 200_000
    assert s3["loaders"]["robust"]["bytes_read_median"] >= s3["site"]["data_bytes"]
    assert {t["site"] for t in report["targets"]} == {"local", "s3"}
    assert "targets:" in completed.stdout and "robust (MX chain)" in completed.stdout
    assert plot_path.stat().st_size > 0
    assert not workdir.exists() or not any(p.name.startswith("checkpoint-") for p in workdir.iterdir())

    # The tables print from the saved report with matplotlib unavailable.
    again = _run(["--from-json", str(report_path), "--plot", str(tmp_path / "again.png")], command_prefix=WITHOUT_MATPLOTLIB)
    assert "robust (MX chain)" in again.stdout and "targets:" in again.stdout
    assert "matplotlib is not installed" in again.stdout
    assert not (tmp_path / "again.png").exists()
