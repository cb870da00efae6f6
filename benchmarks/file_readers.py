"""A local checkpoint read warm and cold: robust's readers against safetensors and runai (issue 48).

``python -m benchmarks --file-readers`` loads one generated checkpoint (``--size``) from a local folder, in one
process, each loader through the same stand-in model (:class:`benchmarks.runs.Harness`), interleaved and the
order rotating each round:

- ``safetensors``: ``safetensors.torch.load_file`` per shard, then the same copy into the model (what vLLM's
  default loader reads with; the like-for-like figure on a warm cache);
- ``runai_copy``: runai-model-streamer's default reader (direct I/O), then the copy;
- ``robust``: robust through ModelExpress's chain, ``MX_ROBUST_FILE_READER=auto`` (its default);
- ``robust_runai``: robust with ``MX_ROBUST_FILE_READER=runai`` (what robust did before issue 48).

Each loader runs on a **warm** page cache (the files read once just before) and on a **cold** one (each file
``fsync``-ed and dropped with ``posix_fadvise(DONTNEED)`` just before). Figures: median seconds, GB/s, and
the process's CPU seconds per load (user + system, every thread); then the resident memory one warm load adds,
in a child process per loader (:func:`benchmarks.runs.measure_peaks`; file pages a loader maps count there,
though they are the page cache's, shared and reclaimable). runai resolves its file-system strategy once
per process, so runai's other readers (``RUNAI_STREAMER_FS_STRATEGY``) would each need a process of their own:
not measured here. Targets: robust warm at least 0.8x safetensors + copy; robust cold at least runai's default
reader (1.0x, within this machine's noise).
"""

from __future__ import annotations

import gc
import resource
import statistics
import time

from . import BenchError
from .checkpoints import cached_checkpoint, describe_site, human
from .runs import Harness, measure_peaks
from mx_strategies.testing.page_cache import cold, warm

LOADERS = ("safetensors", "runai_copy", "robust", "robust_runai")
STATES = ("warm", "cold")
TARGET_WARM = 0.8  # robust / (safetensors + copy), throughput, warm page cache
TARGET_COLD = 1.0  # robust / runai's default reader + copy, throughput, cold page cache


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_file_readers(workdir: str, size: int, reps: int, warmup: int) -> dict:
    folder = cached_checkpoint(workdir, size)
    site = describe_site("local", folder, workdir, folder, generated=True)
    harness = Harness(site)
    samples = {(loader, state): {"seconds": [], "cpu_seconds": []} for loader in LOADERS for state in STATES}
    readers: dict[str, set[str]] = {state: set() for state in STATES}
    checked: set[str] = set()
    rounds = [(state, i) for i in range(warmup + reps) for state in STATES]
    for turn, (state, i) in enumerate(rounds):
        order = LOADERS[turn % len(LOADERS):] + LOADERS[: turn % len(LOADERS)]
        for loader in order:
            gc.collect()
            (warm if state == "warm" else cold)(site.shard_uris)
            cpu, started = _cpu_seconds(), time.perf_counter()
            delivered = harness.run(loader)
            seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
            if loader not in checked:
                harness.check(loader, delivered)  # every tensor, values equal to safetensors' own load
                checked.add(loader)
            elif delivered != len(site.expected(loader)):
                raise BenchError(f"{loader}: {delivered} tensors delivered")
            if loader == "robust":
                readers[state].add(harness.last_report["reader"])
            tag = " (warm-up)" if i < warmup else ""
            print(f"  [file readers] {state} round {i + 1}/{warmup + reps} {loader:13s} {seconds:7.3f}s{tag}", flush=True)
            if i >= warmup:
                samples[(loader, state)]["seconds"].append(seconds)
                samples[(loader, state)]["cpu_seconds"].append(cpu)
    harness.release()
    try:  # one child per loader, the files warm (the children before it read them)
        peaks = measure_peaks(site, list(LOADERS), workdir, reps=1)
    except BenchError as exc:
        print(f"[file readers] peak memory not measured: {exc}", flush=True)
        peaks = {}
    rows = {}
    for (loader, state), sample in samples.items():
        median = statistics.median(sample["seconds"])
        rows[f"{loader}/{state}"] = {
            "loader": loader, "state": state, "seconds": sample["seconds"], "median_s": median,
            "gb_per_s": site.data_bytes / median / 1e9, "cpu_s": statistics.median(sample["cpu_seconds"]),
        }  # fmt: skip
    warm_ratio = rows["safetensors/warm"]["median_s"] / rows["robust/warm"]["median_s"]
    cold_ratio = rows["runai_copy/cold"]["median_s"] / rows["robust/cold"]["median_s"]
    return {
        "checkpoint": folder, "bytes": site.data_bytes, "reps": reps, "warmup": warmup, "rows": rows,
        "robust_readers": {state: sorted(r) for state, r in readers.items()},
        "peak_rss_added_warm": {loader: peak["added"] for loader, peak in peaks.items()},
        "targets": [
            {"name": "robust vs safetensors load_file + copy, warm page cache", "value": warm_ratio, "target": TARGET_WARM,
             "met": warm_ratio >= TARGET_WARM},
            {"name": "robust vs runai's default reader + copy, cold page cache", "value": cold_ratio, "target": TARGET_COLD,
             "met": cold_ratio >= TARGET_COLD},
        ],
    }  # fmt: skip


def render_file_readers(result: dict) -> str:
    lines = [
        f"\nFile readers: {result['checkpoint']} ({human(result['bytes'])}), median of {result['reps']} "
        f"after {result['warmup']} warm-up round(s), interleaved",
        f"{'loader':14s} {'cache':5s} {'median s':>9s} {'GB/s':>7s} {'CPU s':>7s}",
    ]
    for row in result["rows"].values():
        lines.append(f"{row['loader']:14s} {row['state']:5s} {row['median_s']:9.3f} {row['gb_per_s']:7.2f} {row['cpu_s']:7.2f}")
    peaks = result.get("peak_rss_added_warm") or {}
    if peaks:
        lines.append("peak RSS added by one warm load (mapped file pages count; they are the page cache's): " + ", ".join(
            f"{loader} {added / 2**20:.0f} MiB" for loader, added in peaks.items()))
    readers = result["robust_readers"]
    lines.append(f"robust (auto) read with: warm {', '.join(readers['warm'])}; cold {', '.join(readers['cold'])}")
    for target in result["targets"]:
        verdict = "met" if target["met"] else "missed"
        lines.append(f"{target['name']}: {target['value']:.2f}x (target {target['target']:.2f}x): {verdict}")
    return "\n".join(lines)


__all__ = ["render_file_readers", "run_file_readers"]
