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
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # a bound for a hang, not a timing
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-5000:]
    return completed


def test_bench_runs_tiny_local_and_s3_and_reports_without_matplotlib(tmp_path):
    report_path = tmp_path / "bench.json"
    plot_path = tmp_path / "bench.png"
    workdir = tmp_path / "work"
    scale_plot_path = tmp_path / "scale.png"
    completed = _run(
        [
            "--size", "3MB", "--s3-size", "2MB", "--reps", "1", "--warmup", "0",
            "--memory", "robust", "--memory-reps", "1", "--workdir", str(workdir),
            "--s3-server", "s3rver", "--s3-first-byte-ms", "2", "--s3-conn-mbps", "500",
            "--scale-shards", "2,3", "--scale-size", "1MB", "--scale-reps", "1",
            "--json", str(report_path), "--plot", str(plot_path), "--scale-plot", str(scale_plot_path), "--clean",
        ]
    )  # fmt: skip

    report = json.loads(report_path.read_text())
    assert set(report["sites"]) == {"local", "s3"}
    local, s3 = report["sites"]["local"], report["sites"]["s3"]
    assert set(local["loaders"]) == {"runai_raw", "runai_copy", "robust", "upstream", "safetensors", "draft"}
    assert set(s3["loaders"]) == {"runai_raw", "runai_copy", "robust", "upstream", "draft"}  # load_file is local only
    # The S3 site is s3rver behind the shaping proxy.
    assert report["s3_link"] == s3["link"]
    assert s3["link"]["server"] == "s3rver" and s3["link"]["shaped"] and s3["link"]["first_byte_s"] == 0.002
    for summary in (local, s3):
        site = summary["site"]
        assert site["shard_files"] == 8 and site["empty_shards"] == 1
        assert site["draft_names"] and all(name.startswith("mtp.") for name in site["draft_names"])
        for loader, row in summary["loaders"].items():
            assert len(row["samples_s"]) == 1 and not row["failures"], (loader, row["failures"])
        # Peak memory measured in child processes for robust and, for its ratio, runai + copy.
        assert {l for l, row in summary["loaders"].items() if "peak_rss" in row} == {"runai_copy", "robust"}
        assert "peak_ratio_to_runai_copy" in summary["loaders"]["robust"]
        # Robust loads' phases and header bytes come from their load reports.
        for loader in ("robust", "draft"):
            row = summary["loaders"][loader]
            assert set(row["phases_median_s"]) == {"resolve", "stream", "post_load", "total", "verify", "completeness"}, loader
            assert 0 < row["metadata_bytes_read"] <= site["metadata_bytes"], loader
            assert row["resolve_share"] == row["resolve_s"] / row["median_s"]
        robust = summary["loaders"]["robust"]
        assert robust["overhead_s"] == robust["resolve_s"] + robust["identity_recheck_s"]

    # Over S3 every byte is counted by the proxy: the draft pulled its head and
    # the metadata, not the checkpoint; a target load pulled at least the data.
    draft_read = s3["loaders"]["draft"]["bytes_read_median"]
    assert s3["site"]["draft_bytes"] <= draft_read <= s3["site"]["draft_bytes"] + s3["site"]["metadata_bytes"] + 200_000
    # The robust target leaves the MTP head to the draft: it reads the target's share, not the checkpoint.
    site3 = s3["site"]
    assert site3["target_bytes"] + site3["draft_bytes"] == site3["data_bytes"] and site3["draft_bytes"] > 0
    assert site3["target_bytes"] <= s3["loaders"]["robust"]["bytes_read_median"] < site3["data_bytes"]
    assert s3["loaders"]["runai_copy"]["bytes_read_median"] >= site3["data_bytes"]
    # Every S3 request went through the proxy's log: a robust load reads each header once (no more
    # ranged GETs than raw runai's plus one per non-empty shard), and lists once.
    robust_requests = s3["loaders"]["robust"]["bytes_read_samples"][0]["requests"]
    assert robust_requests.get("list", 0) >= 1 and robust_requests.get("ranged_get", 0) > 0
    assert {t["site"] for t in report["targets"]} == {"local", "s3"}
    # How it scales: one point per shard count, timings and request counts from the shaped link.
    points = report["scaling"]["points"]
    assert [p["shards"] for p in points] == [2, 3]
    for point in points:
        assert point["overhead_s"] == point["resolve_s"] + point["identity_recheck_s"] > 0
        # identity re-checks, before and after streaming: one listing each, no request per shard
        assert point["requests_robust"].get("list", 0) == 3 and point["requests_robust"].get("head", 0) == 0
    assert scale_plot_path.stat().st_size > 0
    assert "how it scales" in completed.stdout
    assert "targets:" in completed.stdout and "robust (MX chain)" in completed.stdout
    assert plot_path.stat().st_size > 0
    assert not workdir.exists() or not any(p.name.startswith("checkpoint-") for p in workdir.iterdir())

    # The tables print from the saved report with matplotlib unavailable.
    again = _run(["--from-json", str(report_path), "--plot", str(tmp_path / "again.png")], command_prefix=WITHOUT_MATPLOTLIB)
    assert "robust (MX chain)" in again.stdout and "targets:" in again.stdout
    assert "matplotlib is not installed" in again.stdout
    assert not (tmp_path / "again.png").exists()


def test_engine_section_reprints_from_json_with_failures_named(tmp_path):
    """The real-engine section's table (benchmarks/engine.py) from a saved report: medians, the
    share of the checkpoint S3 served, and a loader whose engine failed counted as failed."""
    sample = {"ok": True, "error": None, "engine_s": 40.0, "target_load_s": 0.9, "draft_load_s": 0.5,
              "loaders_timed": [], "bytes_served": 5_000_000, "robust_bytes_streamed": []}  # fmt: skip
    failed = dict(sample, ok=False, error="RuntimeError: boom", target_load_s=None, draft_load_s=None)
    from benchmarks.engine import LOADERS, _medians

    samples = {"robust": [sample], "plain_modelexpress": [dict(sample, bytes_served=9_000_000)], "runai_streamer": [failed]}
    report = {
        "sites": {},
        "targets": [],
        "engine": {
            "arch": "deepseek_v3", "uri": "s3://b/m", "reps": 1, "checkpoint_bytes": 4_000_000,
            "draft_needed_bytes": 1_000_000, "loaders": LOADERS, "samples": samples,
            "medians": {name: _medians(runs) for name, runs in samples.items()}, "seconds": 1.0,
        },
    }  # fmt: skip
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(report))
    out = _run(["--from-json", str(path)]).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split() and line.split()[0] in LOADERS}
    assert rows["robust"] == ["robust", "0.900", "0.500", "5.00", "1.25", "40.0"]
    assert rows["plain_modelexpress"][3:5] == ["9.00", "2.25"]
    assert rows["runai_streamer"][1:3] == ["-", "-"] and out.count("(1 failed)") == 1
