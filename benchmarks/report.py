"""Summaries, targets, tables and the plot of a run; the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from typing import Optional

import torch

from . import (
    BASELINE,
    LABELS,
    LIKE_FOR_LIKE,
    TARGET_COPY_RATIO,
    TARGET_DRAFT_READ_RATIO,
    TARGET_OVERHEAD_SHARE,
    TARGET_PEAK_RATIO,
    TARGET_RAW_RATIO,
    BenchError,
)
from .checkpoints import Site, human
from .runs import LoaderResult


def summarise_site(site: Site, results: dict[str, LoaderResult], reps: int, warmup: int, counter_method: str) -> dict:
    rows = {}
    base = results.get(BASELINE)
    like = results.get(LIKE_FOR_LIKE)
    for loader, result in results.items():
        if not result.seconds:
            raise BenchError(f"{loader}: no successful timed load:\n" + "\n".join(result.failures))
        nbytes = site.draft_bytes if loader == "draft" else site.data_bytes
        row = {
            "label": LABELS[loader],
            "samples_s": result.seconds,
            "median_s": result.median,
            "min_s": min(result.seconds),
            "max_s": max(result.seconds),
            "bytes": nbytes,
            "throughput_gbps": nbytes / result.median / 1e9,
            "throughput_min_gbps": nbytes / max(result.seconds) / 1e9,
            "throughput_max_gbps": nbytes / min(result.seconds) / 1e9,
            "bytes_read_samples": result.bytes_read,
            "failures": result.failures,
        }
        if loader != "draft":
            if base is not None:
                row["ratio_to_runai_raw"] = base.median / result.median
            if like is not None:
                row["ratio_to_runai_copy"] = like.median / result.median
        read_key = "served" if site.bytes_counter.startswith("bytes served") else "read"
        reads = [r.get(read_key) for r in result.bytes_read if r.get(read_key) is not None]
        if reads:
            row["bytes_read_median"] = statistics.median(reads)
            row["bytes_read_ratio"] = statistics.median(reads) / nbytes if nbytes else None
        if result.reports:
            figures = {k: statistics.median(r[k] for r in result.reports) for k, v in result.reports[0].items()
                       if isinstance(v, (int, float))}  # fmt: skip
            row["phases_median_s"] = {k[: -len("_s")]: v for k, v in figures.items() if k.endswith("_s")}
            row["metadata_bytes_read"] = figures["metadata_bytes"]
            row["resolve_s"] = row["phases_median_s"]["resolve"]
            row["resolve_share"] = row["resolve_s"] / result.median
            if loader != "draft":
                # Inspection (the report's resolve phase) + verification's store round trips (the two
                # identity re-checks, before and after streaming, timed on their own by describe_site).
                row["identity_recheck_s"] = 2 * site.identity_recheck_s
                row["overhead_s"] = row["resolve_s"] + row["identity_recheck_s"]
                row["overhead_share"] = row["overhead_s"] / result.median
        if result.peak is not None:
            row["peak_rss"] = result.peak
            if base is not None and base.peak is not None:
                row["peak_ratio_to_runai_raw"] = result.peak["peak"] / base.peak["peak"]
            if like is not None and like.peak is not None:
                row["peak_ratio_to_runai_copy"] = result.peak["peak"] / like.peak["peak"]
        rows[loader] = row
    return {
        "site": {k: v for k, v in site.as_dict().items() if k != "tensors"},
        "tensor_count": len(site.tensors),
        "reps": reps,
        "warmup": warmup,
        "bytes_counter": counter_method,
        "loaders": rows,
    }


def evaluate_targets(sites: dict[str, dict]) -> list[dict]:
    """Each target, per site, with the measured figure and whether it is met."""
    verdicts = []
    for name, summary in sites.items():
        if "error" in summary:
            continue
        rows = summary["loaders"]
        robust = rows.get("robust")
        kind = "s3" if name.startswith("s3") else "local"
        for baseline, targets, label in (
            ("runai_copy", TARGET_COPY_RATIO, "runai + copy"),
            ("runai_raw", TARGET_RAW_RATIO, "raw runai (iterate only)"),
        ):
            ratio = robust.get(f"ratio_to_{baseline}") if robust else None
            if ratio is None or kind not in targets:
                continue
            site = summary["site"]
            data, mine = site["data_bytes"], site.get("target_bytes", site["data_bytes"])
            share = (data - mine) / data if data else 0.0  # the MTP layers the robust target leaves to the draft
            wanted = targets[kind] + (share if baseline == "runai_copy" and kind == "local" else 0.0)
            verdicts.append({
                "site": name,
                "target": f"robust target on an MTP checkpoint (MTP share {share:.1%}, left to the draft) "
                          f">= {wanted:.2f}x {label} (which streams everything)"
                          if baseline == "runai_copy" else f"robust target load >= {wanted:.2f}x {label}",
                "value": ratio, "met": ratio >= wanted,
                "note": f"{robust['median_s']:.3f} s vs {rows[baseline]['median_s']:.3f} s (medians)",
            })  # fmt: skip
        if robust and "overhead_share" in robust:
            limit = TARGET_OVERHEAD_SHARE[kind]
            verdicts.append({
                "site": name, "target": f"inspection + verification <= {limit:.0%} of the load",
                "value": robust["overhead_share"],
                "met": robust["overhead_share"] <= limit,
                "note": f"resolve {robust['resolve_s'] * 1e3:.1f} ms + identity re-checks {robust['identity_recheck_s'] * 1e3:.1f} ms "
                        f"of {robust['median_s']:.3f} s ({human(summary['site']['data_bytes'])}, "
                        f"{summary['site']['shard_files']} shard files)",
            })  # fmt: skip
        draft = rows.get("draft")
        if draft and "bytes_read_median" in draft:
            site = summary["site"]
            ratio = draft["bytes_read_median"] / site["draft_bytes"]
            verdicts.append({
                "site": name,
                "target": f"draft bytes read <= {TARGET_DRAFT_READ_RATIO:.2f}x the bytes the draft keeps",
                "value": ratio, "met": ratio <= TARGET_DRAFT_READ_RATIO,
                "note": f"read {human(draft['bytes_read_median'])} (headers, index, config included) for "
                        f"{human(site['draft_bytes'])} of MTP tensors",
            })  # fmt: skip
        if robust and "peak_ratio_to_runai_copy" in robust:
            base = rows["runai_copy"]["peak_rss"]
            verdicts.append({
                "site": name, "target": f"robust peak RSS <= {TARGET_PEAK_RATIO:.2f}x runai + copy's",
                "value": robust["peak_ratio_to_runai_copy"], "met": robust["peak_ratio_to_runai_copy"] <= TARGET_PEAK_RATIO,
                "note": f"{robust['peak_rss']['peak'] / 2**20:.0f} vs {base['peak'] / 2**20:.0f} MiB "
                        f"(added over the model: {robust['peak_rss']['added'] / 2**20:.0f} vs {base['added'] / 2**20:.0f} MiB)",
            })  # fmt: skip
    return verdicts


def render_tables(report: dict) -> str:
    lines = []
    for name, summary in report["sites"].items():
        lines.append("")
        if "error" in summary:
            lines.append(f"{name}: FAILED, no figures: {summary['error'].strip().splitlines()[-1]}")
            continue
        site = summary["site"]
        lines.append(
            f"{name}: {site['uri']}  {human(site['data_bytes'])} in {site['shard_files']} shard files "
            f"({site['empty_shards']} empty), {summary['tensor_count']} tensors; "
            f"median of {summary['reps']} interleaved reps after {summary['warmup']} warm-up"
        )
        header = (
            f"{'loader':36s} {'median s':>9s} {'min s':>8s} {'max s':>8s} {'GB/s':>7s} "
            f"{'x raw':>7s} {'x copy':>7s} {'read':>10s} {'peak MiB':>9s} {'+MiB':>7s}"
        )
        lines.append(header)
        lines.append("-" * len(header))
        for loader, row in summary["loaders"].items():
            peak = row.get("peak_rss")
            lines.append(
                f"{row['label']:36s} {row['median_s']:9.3f} {row['min_s']:8.3f} {row['max_s']:8.3f} "
                f"{row['throughput_gbps']:7.3f} {_ratio(row.get('ratio_to_runai_raw')):>7s} "
                f"{_ratio(row.get('ratio_to_runai_copy')):>7s} "
                f"{human(row['bytes_read_median']) if 'bytes_read_median' in row else '-':>10s} "
                f"{peak['peak'] / 2**20 if peak else float('nan'):9.0f} {peak['added'] / 2**20 if peak else float('nan'):7.0f}"
            )
        for loader, row in summary["loaders"].items():
            if row["failures"]:
                lines.append(f"{row['label']}: {len(row['failures'])} failed load(s), retried; first: "
                             f"{row['failures'][0].strip().splitlines()[-1]}")  # fmt: skip
        robust = summary["loaders"].get("robust")
        if robust and "phases_median_s" in robust:
            p = robust["phases_median_s"]
            lines.append(
                f"robust phases (median, from its load reports): resolve {p['resolve'] * 1e3:.1f} ms "
                f"({robust['resolve_share']:.2%} of the load), stream {p['stream'] * 1e3:.1f} ms, post-load "
                f"{p['post_load'] * 1e3:.2f} ms; identity re-checks {robust['identity_recheck_s'] * 1e3:.1f} ms; "
                f"inspection + verification {robust['overhead_share']:.2%}; the probe read "
                f"{human(robust['metadata_bytes_read'])} of headers"
            )
        draft = summary["loaders"].get("draft")
        if draft:
            lines.append(
                f"draft: {draft['median_s']:.3f} s for {human(site['draft_bytes'])} of MTP tensors; read "
                f"{human(draft.get('bytes_read_median', float('nan')))} ({summary['bytes_counter']})"
            )
    lines.append("")
    lines.append("targets:")
    for verdict in report["targets"]:
        lines.append(
            f"  [{'met' if verdict['met'] else 'MISSED':6s}] {verdict['site']:5s} {verdict['target']}: "
            f"{verdict['value']:.3f}  ({verdict['note']})"
        )
    return "\n".join(lines)


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(report: dict, path: str) -> bool:
    """Throughput per loader, one panel per site; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'mx-strategies[bench]'); not drawing {path}")
        return False
    sites = {name: summary for name, summary in report["sites"].items() if "error" not in summary}
    if not sites:
        return False
    figure, axes = plt.subplots(1, len(sites), figsize=(6.5 * len(sites), 4.2), squeeze=False)
    for axis, (name, summary) in zip(axes[0], sites.items()):
        rows = [(l, r) for l, r in summary["loaders"].items() if l != "draft"]
        labels = [r["label"] for _, r in rows]
        values = [r["throughput_gbps"] for _, r in rows]
        low = [r["throughput_gbps"] - r["throughput_min_gbps"] for _, r in rows]
        high = [r["throughput_max_gbps"] - r["throughput_gbps"] for _, r in rows]
        colors = ["#2b8a3e" if l == "robust" else "#868e96" if l.startswith("runai") else "#1c7ed6" for l, _ in rows]
        positions = range(len(rows))
        axis.barh(positions, values, xerr=[low, high], color=colors, capsize=3)
        axis.set_yticks(list(positions), labels)
        axis.invert_yaxis()
        right = max(r["throughput_max_gbps"] for _, r in rows)
        for y, (_, row) in zip(positions, rows):
            ratio = row.get("ratio_to_runai_raw")
            copy_ratio = row.get("ratio_to_runai_copy")
            text = f"{row['throughput_gbps']:.2f} GB/s"
            if ratio is not None and copy_ratio is not None:
                text += f"\n{ratio:.2f}x raw, {copy_ratio:.2f}x copy"
            axis.text(row["throughput_max_gbps"] + right * 0.02, y, text, va="center", ha="left", fontsize=8)
        axis.set_xlim(0, right * 1.6)
        axis.set_xlabel("GB/s (median; whiskers: min-max)")
        axis.set_title(f"{name}: {human(summary['site']['data_bytes'])}, {summary['reps']} reps")
    figure.suptitle("Checkpoint load throughput (CPU only, 2 cores shared)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


# -- machine ----------------------------------------------------------------------


def machine_info() -> dict:
    import importlib.metadata as metadata

    memory = None
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((l.split(":", 1)[1].strip() for l in handle if l.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for package in ("torch", "runai-model-streamer", "modelexpress", "safetensors", "moto", "mx-strategies"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_bytes": memory,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": torch.cuda.is_available(),
        "versions": versions,
    }


def settings_snapshot() -> dict:
    """The robust strategy's settings in force (defaults unless the environment says otherwise)."""
    from mx_strategies.settings import load_settings

    return {k: v for k, v in load_settings().model_dump(mode="json").items() if k != "model_uri"}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg())


