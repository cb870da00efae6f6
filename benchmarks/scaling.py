"""How it scales: inspection and verification cost against shard count on the shaped S3 link.

For each shard count (8 to 163, DeepSeek-V3's) a checkpoint of the same
total size is generated (``TENSORS_PER_SHARD`` bf16 tensors per shard, an
index, a config), uploaded to the S3 server, and loaded interleaved by
runai + copy and the robust strategy. The robust load's report gives its
``resolve`` phase (listing, index, config, every header, the plan); the
identity re-checks (one listing of the source each, before and after streaming) are
timed on their own (:func:`benchmarks.checkpoints.time_identity_recheck`);
the proxy's request log counts each loader's requests.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time

import torch

from .checkpoints import describe_site, human
from .runs import ByteCounter, measure_site

TENSORS_PER_SHARD = 8
# DeepSeek-V3's checkpoint: 163 shards, about 689 GB (FP8 weights + BF16/F32 rest).
DEEPSEEK_V3_BYTES = 689e9
LOAD_RATE = 2e9  # the "a load at 2 GB/s"


def generate_sharded(path: str, shards: int, size: int) -> None:
    """``shards`` files of ``TENSORS_PER_SHARD`` bf16 tensors, ~``size`` bytes in all, + index and config."""
    from mx_strategies.testing.synthetic import write_shards

    generator = torch.Generator().manual_seed(shards)
    per_tensor = max(2048, size // (shards * TENSORS_PER_SHARD))
    rows = max(1, per_tensor // (2 * 1024))
    files = [
        {
            f"model.layers.{s}.w{t}.weight": torch.empty(rows, 1024).normal_(generator=generator).to(torch.bfloat16)
            for t in range(TENSORS_PER_SHARD)
        }
        for s in range(shards)
    ]
    write_shards(path, files, index=True)
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16"}, handle)
    with open(os.path.join(path, ".complete"), "w") as handle:
        json.dump({"shards": shards, "size": size}, handle)


def cached_sharded(workdir: str, shards: int, size: int) -> str:
    path = os.path.join(workdir, f"checkpoint-scale-{shards}x-{size}")
    if not os.path.exists(os.path.join(path, ".complete")):
        shutil.rmtree(path, ignore_errors=True)
        generate_sharded(path, shards, size)
    return path


def run_scaling(s3, counts: list[int], size: int, reps: int, workdir: str, load_timeout: float, generated: list) -> dict:
    points = []
    for count in counts:
        source = cached_sharded(workdir, count, size)
        generated.append(source)
        started = time.perf_counter()
        uri = s3.upload(source, "scale", f"shards-{count}")
        print(f"\n[scale] {count} shards ({human(size)}) uploaded to {uri} in {time.perf_counter() - started:.1f}s", flush=True)
        site = describe_site(f"s3-scale-{count}", uri, workdir, source)
        counter = ByteCounter(s3)
        site.bytes_counter = counter.method
        results = measure_site(site, ["runai_copy", "robust"], reps, 1, counter, load_timeout)
        shutil.rmtree(site.config_only, ignore_errors=True)
        robust, copy = results["robust"], results["runai_copy"]
        resolve = statistics.median(r["resolve_s"] for r in robust.reports)
        recheck = 2 * site.identity_recheck_s
        overhead = resolve + recheck
        point = {
            "shards": count,
            "data_bytes": site.data_bytes,
            "tensors": len(site.tensors),
            "header_bytes": site.metadata_bytes,
            "robust_median_s": robust.median,
            "robust_samples_s": robust.seconds,
            "runai_copy_median_s": copy.median,
            "runai_copy_samples_s": copy.seconds,
            "ratio_to_runai_copy": copy.median / robust.median,
            "resolve_s": resolve,
            "resolve_samples_s": [r["resolve_s"] for r in robust.reports],
            "identity_recheck_s": recheck,
            "overhead_s": overhead,
            "share_of_this_load": overhead / robust.median,
            "share_of_2GB_at_2GBps": overhead / (2e9 / LOAD_RATE),
            "share_of_deepseek_v3_at_2GBps": overhead / (DEEPSEEK_V3_BYTES / LOAD_RATE),
            "requests_robust": request_counts_of(robust),
            "requests_runai_copy": request_counts_of(copy),
        }
        print(
            f"[scale] {count:4d} shards: resolve {resolve * 1e3:.0f} ms + re-checks {recheck * 1e3:.0f} ms; "
            f"robust {robust.median:.2f} s vs runai + copy {copy.median:.2f} s; requests robust "
            f"{point['requests_robust']}, runai + copy {point['requests_runai_copy']}",
            flush=True,
        )
        points.append(point)
    return {
        "size_per_checkpoint": size,
        "tensors_per_shard": TENSORS_PER_SHARD,
        "reps": reps,
        "load_rate_for_shares": LOAD_RATE,
        "deepseek_v3_bytes": DEEPSEEK_V3_BYTES,
        "points": points,
    }


def request_counts_of(result) -> dict:
    """Median request counts of a loader's timed loads, by kind."""
    samples = [r.get("requests", {}) for r in result.bytes_read]
    kinds = sorted({k for s in samples for k in s})
    return {k: statistics.median(s.get(k, 0) for s in samples) for k in kinds}


def render_scaling(scaling: dict) -> str:
    lines = [
        "",
        f"how it scales (shaped S3; {human(scaling['size_per_checkpoint'])} per checkpoint, "
        f"{scaling['tensors_per_shard']} tensors per shard, median of {scaling['reps']}):",
        f"{'shards':>6s} {'resolve ms':>10s} {'re-check ms':>11s} {'robust s':>9s} {'copy s':>7s} {'x copy':>7s} "
        f"{'% load':>7s} {'% 2GB@2GB/s':>12s} {'% DSv3@2GB/s':>13s}  robust requests",
    ]
    for p in scaling["points"]:
        lines.append(
            f"{p['shards']:6d} {p['resolve_s'] * 1e3:10.1f} {p['identity_recheck_s'] * 1e3:11.1f} "
            f"{p['robust_median_s']:9.3f} {p['runai_copy_median_s']:7.3f} {p['ratio_to_runai_copy']:7.3f} "
            f"{p['share_of_this_load']:7.2%} {p['share_of_2GB_at_2GBps']:12.2%} {p['share_of_deepseek_v3_at_2GBps']:13.3%}  "
            f"{p['requests_robust']}"
        )
    return "\n".join(lines)


def plot_scaling(scaling: dict, path: str, link: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'mx-strategies[bench]'); not drawing {path}")
        return False
    points = scaling["points"]
    if not points:
        return False
    shards = [p["shards"] for p in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    resolve = [p["resolve_s"] * 1e3 for p in points]
    recheck = [p["identity_recheck_s"] * 1e3 for p in points]
    left.plot(shards, resolve, "o-", label="inspection (resolve phase)")
    left.plot(shards, recheck, "s-", label="verification: identity re-checks (2 x one listing)")
    left.plot(shards, [a + b for a, b in zip(resolve, recheck)], "^-", color="black", label="total")
    left.set_xscale("log")
    left.set_xticks(shards, [str(s) for s in shards])
    left.set_xlabel("shards")
    left.set_ylabel("ms (median)")
    left.set_title("inspection + verification on the shaped link")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(shards, [p["share_of_this_load"] * 100 for p in points], "o-",
               label=f"of the measured load ({human(scaling['size_per_checkpoint'])})")  # fmt: skip
    right.plot(shards, [p["share_of_2GB_at_2GBps"] * 100 for p in points], "s-", label="of a 2 GB load at 2 GB/s (1 s)")
    right.plot(shards, [p["share_of_deepseek_v3_at_2GBps"] * 100 for p in points], "^-",
               label="of a DeepSeek-V3-size load (689 GB) at 2 GB/s")  # fmt: skip
    right.axhline(1.0, color="red", linestyle="--", linewidth=1, label="1% target")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xticks(shards, [str(s) for s in shards])
    right.set_xlabel("shards")
    right.set_ylabel("% of the load")
    right.set_title("share of a load")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    cap = link.get("bytes_per_connection_per_s")
    figure.suptitle(
        f"How it scales: {link['server']} behind a shaping proxy, {link['first_byte_s'] * 1e3:.0f} ms to first byte"
        + (f", {cap / 1e6:.0f} MB/s per connection" if cap else "")
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def scaling_targets(scaling) -> list[dict]:
    """The 163-shard target: inspection + verification <= 1% of a load at 2 GB/s on the shaped link."""
    from . import TARGET_OVERHEAD_SHARE

    if not scaling or "error" in scaling or not scaling["points"]:
        return []
    point = max(scaling["points"], key=lambda p: p["shards"])
    share = point["share_of_deepseek_v3_at_2GBps"]
    limit = TARGET_OVERHEAD_SHARE["local"]  # the 163-shard target stays at 1%
    return [{
        "site": "s3",
        "target": f"inspection + verification of {point['shards']} shards <= {limit:.0%} of a load "
                  f"at 2 GB/s (DeepSeek-V3 size, shaped link)",
        "value": share, "met": share <= limit,
        "note": f"{point['overhead_s'] * 1e3:.0f} ms of {scaling['deepseek_v3_bytes'] / LOAD_RATE:.0f} s; "
                f"of a 2 GB load at 2 GB/s: {point['share_of_2GB_at_2GBps']:.1%}; of the measured "
                f"{human(point['data_bytes'])} load: {point['share_of_this_load']:.1%}",
    }]  # fmt: skip
