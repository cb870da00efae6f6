"""Progress and metrics cost nothing measurable: one interleaved run, on against off.

``python -m benchmarks --observability`` loads one generated checkpoint
(``--size``) with the robust strategy through ModelExpress's real chain,
alternating two loaders in one process (the order rotating each round,
:func:`benchmarks.runs.measure_site`):

- ``robust_quiet``: no progress lines (``MX_ROBUST_PROGRESS_INTERVAL_S=0``),
  ModelExpress's metrics off (``MX_METRICS_ENABLED=0``);
- ``robust_observed``: a progress line every 0.2 s and per shard
  (``MX_ROBUST_PROGRESS_INTERVAL_S=0.2``: fifty times the default rate), written
  to a handler that keeps them, and the metrics on (``MX_METRICS_ENABLED=1``:
  ModelExpress's collector and robust's families, in multiprocess mode when
  ``PROMETHEUS_MULTIPROC_DIR`` was set before the run, as in a pod).

The figure is the ratio of the two median load times (observed / quiet):
1.00 is no cost. The run also says how many progress lines the observed
loads wrote and what the collector holds after them, so an "observed" load
that observed nothing cannot pass for a free one. On a shared machine the
load times vary by more than the cost measured, so the run also times the
added work alone: counting one tensor (:meth:`ProgressLog.add`, per tensor)
and recording one finished load's metrics and spans (per load).
"""

from __future__ import annotations

import logging

from . import OBSERVABILITY_LOADERS
from .checkpoints import cached_checkpoint, describe_site, human
from .runs import ByteCounter, measure_site

QUIET, OBSERVED = OBSERVABILITY_LOADERS
PROGRESS_LOGGER = "modelexpress.strategy_robust_model_streamer.progress"


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _collected() -> dict[str, float]:
    """robust's counters as ModelExpress's exposition registry serves them (empty when metrics stayed off)."""
    try:
        from modelexpress.metrics import metrics
        from prometheus_client import generate_latest
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return {}
    text = generate_latest(metrics._exposition_registry()).decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("mx_robust_tensors_total", "mx_robust_bytes_streamed_total"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _per_call(fn, calls: int) -> float:
    import time

    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def added_work(report: dict) -> dict:
    """Seconds per tensor counted (progress) and per load recorded (metrics + spans), best of 5."""
    from mx_strategies.observe import telemetry
    from mx_strategies.observe.progress import ProgressLog, ProgressTracker
    from mx_strategies.observe.report import LoadReport

    shards = [(f"/m/{i}.safetensors", 10**9, 10**12) for i in range(8)]
    log = ProgressLog(ProgressTracker("/m", shards), emit=lambda line: None)
    per_tensor = min(_per_call(lambda: log.add("/m/0.safetensors", 1 << 20), 100_000) for _ in range(5))
    names = set(LoadReport.__dataclass_fields__)
    loaded = LoadReport(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in report.items() if k in names})
    per_load = min(
        _per_call(lambda: telemetry.record_load(loaded, None, engine="vllm", ended=0.0), 200) for _ in range(5)
    )
    return {"progress_per_tensor_s": per_tensor, "record_per_load_s": per_load}


def run_observability(workdir: str, size: int, reps: int, warmup: int, load_timeout: float) -> dict:
    uri = cached_checkpoint(workdir, size)
    site = describe_site("local", uri, workdir, uri, generated=True)
    site.bytes_counter = "not counted"
    print(f"\n[observability] {uri}: {human(site.data_bytes)}, {len(site.tensors)} tensors", flush=True)
    logger = logging.getLogger(PROGRESS_LOGGER)
    kept, level, propagate = _Kept(), logger.level, logger.propagate
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        results = measure_site(site, [QUIET, OBSERVED], reps, warmup, ByteCounter(enabled=False), load_timeout)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
        logger.propagate = propagate
    quiet, observed = results[QUIET].median, results[OBSERVED].median
    collected = _collected()  # before added_work() records more
    import os

    from mx_strategies.observe.report import recent_reports

    os.environ["MX_METRICS_ENABLED"] = "1"  # as the observed loads had it
    try:
        added = added_work(recent_reports()[-1])
    finally:
        os.environ.pop("MX_METRICS_ENABLED", None)
    return {
        "checkpoint": uri,
        "data_bytes": site.data_bytes,
        "tensors": len(site.tensors),
        "reps": reps,
        "warmup": warmup,
        "seconds": {QUIET: results[QUIET].seconds, OBSERVED: results[OBSERVED].seconds},
        "median_s": {QUIET: quiet, OBSERVED: observed},
        "ratio": observed / quiet,
        "progress_lines": len(kept.lines),
        "progress_excerpt": kept.lines[:3],
        "collected": collected,
        "added_work": added,
    }


def render_observability(result: dict) -> str:
    quiet, observed = result["median_s"][QUIET], result["median_s"][OBSERVED]
    spread = {name: f"{min(s):.3f}-{max(s):.3f}s" for name, s in result["seconds"].items()}
    lines = [
        "",
        f"Progress + metrics on vs off: {human(result['data_bytes'])}, {result['tensors']} tensors, "
        f"{result['reps']} interleaved rounds after {result['warmup']} warm-up",
        f"  {QUIET:16s} median {quiet:.3f}s (range {spread[QUIET]})",
        f"  {OBSERVED:16s} median {observed:.3f}s (range {spread[OBSERVED]})",
        f"  ratio of medians (observed / quiet): {result['ratio']:.3f}",
        f"  progress lines written by the observed loads: {result['progress_lines']}",
        f"  collected after the run: {result['collected'] or 'nothing (metrics did not come on)'}",
    ]
    added = result["added_work"]
    tensors_per_load = result["tensors"]
    lines += [
        f"  added work alone: {added['progress_per_tensor_s'] * 1e9:.0f} ns per tensor counted, "
        f"{added['record_per_load_s'] * 1e6:.0f} us per load recorded (metrics + spans): "
        f"{(added['progress_per_tensor_s'] * tensors_per_load + added['record_per_load_s']) / quiet * 100:.4f}% "
        f"of the quiet median load",
    ]
    lines += [f"    {line}" for line in result["progress_excerpt"]]
    return "\n".join(lines)


__all__ = ["render_observability", "run_observability"]
