"""Metrics and traces of robust's loads, through ModelExpress's own collector and tracer.

ModelExpress 0.7 has opt-in Prometheus metrics (``modelexpress.metrics``,
``MX_METRICS_ENABLED=1``) and an OpenTelemetry span "Load model" around its
strategy chain (``modelexpress.tracing``). This module records robust's loads
into both, following ModelExpress's rules:

- **Same switch, same endpoint.** Nothing is recorded unless
  ``modelexpress.metrics.enable_metrics()`` says metrics are on. The families
  below are built in the registry ModelExpress's collector uses, so under
  ``PROMETHEUS_MULTIPROC_DIR`` (multiprocess mode, one endpoint per pod) they
  are served by its endpoint next to its own ``mx_*`` families, from every rank.
  Only counters and histograms: both are multiprocess-safe.
- **Never raises into the load path.** Every recorder swallows everything; a
  failure to build the families disables them for the process, with a warning.
- **Bounded labels.** Every label is a closed set with an ``other`` fallback,
  except ``model`` (ModelExpress's own convention: clamped to 96 characters).
- **The load report is the source.** Values come from :class:`~.report.LoadReport`
  (what the log line, the demo and the benchmark read too), never from log text.

The phases: ModelExpress's ``time_load_phase`` records only its own four
(``artifact_install``, ``model_init``, ``chain``, ``publish``): they partition
``mx_load_seconds``, and robust's phases lie inside ``chain``, so it drops any
other name. robust's phases are therefore a sibling family,
``mx_robust_load_phase_seconds``, with the same labels (engine, model, phase,
scheme) and buckets; they partition the strategy's share of ``chain``.

Traces: one child span of "Load model" per phase (``Robust resolve``,
``Robust stream``, ...) with the bytes, tensors, source URI and selection
source as attributes, made from the report's timings when the load ends;
a failed load leaves one ``Robust failed`` span with the reason. Without
opentelemetry (ModelExpress's ``otel`` extra) the tracer is ModelExpress's
no-op and nothing is made.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from .. import errors
from .report import LoadReport

_logger = logging.getLogger("modelexpress.strategy_robust_model_streamer.telemetry")

#: robust's phases, in the order they run; together they are the strategy's whole load (report.timings["total"]).
#:   resolve       inspect the candidate sources' headers, plan and select the tensors
#:   stream        runai streams, every tensor is checked in and handed to the model (and the streamer closed)
#:   verify        after the last tensor: the source re-check and the ledger
#:   completeness  the model's own check that every parameter was written
#:   post_load     the engine's processing after the weights (after_weight_iter_load)
_PHASES = ("resolve", "stream", "verify", "completeness", "post_load")
_ROLES = ("target", "draft", "other")
_SOURCE_KINDS = ("s3", "gs", "az", "local", "other")
_SELECTION_SOURCES = ("dry_run", "table", "convention", "whole", "other")
_ENGINES = ("vllm", "sglang", "trtllm")

# Why a load was given up: the first classes an error is an instance of name its reason (most specific first).
_REASON_OF = (
    ((errors.NoStreamableSource, errors.NoCheckpoint, errors.StoreError), "no_source"),
    (errors.InconsistentCheckpoint, "inconsistent_checkpoint"),
    (errors.DraftPlanError, "selection"),
    ((errors.IncompleteDelivery, errors.IncompleteModel, errors.PartialParameters), "completeness"),
    (errors.RanksDisagree, "ranks_disagree"),
    ((errors.StreamStartError, errors.StreamBroken, errors.ContentMismatch), "streamer"),
)
_FAILURE_REASONS = (*dict.fromkeys(reason for _, reason in _REASON_OF), "other")

_SPAN_PREFIX = "Robust "
_FAILED_SPAN = "Robust failed"


def _clamp(value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` where it is one of ``allowed``, else ``other``: every label is a closed set."""
    return value if value in allowed else "other"


def _source_kind(uri: str) -> str:
    """s3, gs, az for object stores, local for a path; other for anything else."""
    if "://" not in uri:
        return "local"
    return _clamp(uri.split("://", 1)[0], _SOURCE_KINDS)


def _failure_reason(exc: BaseException) -> str:
    """The closed-set reason of a failed load: from the error itself or the one it was raised from."""
    seen = 0
    while exc is not None and seen < 4:
        for cls, reason in _REASON_OF:
            if isinstance(exc, cls):
                return reason
        exc = exc.__cause__
        seen += 1
    return "other"


def _phase_seconds(report: LoadReport) -> dict[str, float]:
    """robust's phases from the report's timings; ``stream`` net of verify and completeness (which lie inside it)."""
    timings = report.timings
    verify = timings.get("verify", 0.0)
    completeness = timings.get("completeness", 0.0)
    return {
        "resolve": timings.get("resolve", 0.0),
        "stream": timings.get("stream", 0.0) - verify - completeness,
        "verify": verify,
        "completeness": completeness,
        "post_load": timings.get("post_load", 0.0),
    }


# -- metrics -------------------------------------------------------------------


class _Families:
    """Our families, built once in the registry ModelExpress's collector uses."""

    def __init__(self) -> None:
        from modelexpress import metrics as mx_metrics
        from prometheus_client import REGISTRY, Counter, Histogram

        collector = mx_metrics.metrics
        registry = REGISTRY if collector._registry is None else collector._registry
        self.scheme = collector.scheme
        self.model_label = mx_metrics._model_label
        self.phase_seconds = Histogram(
            "mx_robust_load_phase_seconds",
            "Duration of one phase of a robust_model_streamer load: resolve, stream, verify, completeness or "
            "post_load. They partition the strategy's load, which lies inside mx_load_phase_seconds{phase=chain}.",
            ["engine", "model", "phase", "scheme"],
            buckets=mx_metrics._XSLOW_BUCKETS,
            registry=registry,
        )

        def counter(name: str, labels: list[str], documentation: str) -> Counter:
            """A counter in ``registry`` with ``labels`` and, last, the ``scheme`` label every family carries."""
            return Counter(name, documentation, [*labels, "scheme"], registry=registry)

        self.bytes_streamed = counter(
            "mx_robust_bytes_streamed_total", ["role", "source_kind"],
            "Tensor bytes robust_model_streamer delivered to the model, by role and source kind (s3|gs|az|local).",
        )  # fmt: skip
        self.bytes_by_origin = counter(
            "mx_robust_bytes_by_origin_total", ["role", "origin"],
            "Of the bytes streamed: read from storage by this rank, or received from the other ranks "
            "(runai's distributed streaming). Absent for a load where runai did not say.",
        )  # fmt: skip
        self.tensors = counter(
            "mx_robust_tensors_total", ["role"],
            "Tensors robust_model_streamer delivered and verified, by role.",
        )  # fmt: skip
        self.selections = counter(
            "mx_robust_selections_total", ["role", "selection_source"],
            "Successful loads by what decided the tensors streamed: declared|dry_run|table|convention|whole.",
        )  # fmt: skip
        self.failures = counter(
            "mx_robust_failures_total", ["role", "reason", "outcome"],
            "Loads robust_model_streamer gave up, by reason (no_source|inconsistent_checkpoint|selection|"
            "completeness|ranks_disagree|streamer|other) and outcome: refused (the model untouched) or "
            "failed (the chain rebuilds it).",
        )  # fmt: skip


_lock = threading.Lock()
_families: Optional[_Families] = None
_attempted = False


def _metrics() -> Optional[_Families]:
    """Our families when ModelExpress's metrics are on; None otherwise (never raises)."""
    global _families, _attempted
    try:
        from modelexpress.metrics import enable_metrics

        if not enable_metrics():  # ModelExpress's switch; idempotent, never raises
            return None
    except Exception:  # noqa: BLE001 - an old or broken ModelExpress: no metrics, never a failed load
        return None
    with _lock:
        if _families is None and not _attempted:
            _attempted = True
            try:
                _families = _Families()
            except Exception as exc:  # noqa: BLE001
                _logger.warning(f"robust_model_streamer metrics disabled: {exc}")
        return _families


def _record_metrics(report: LoadReport, engine: str, model: object) -> None:
    families = _metrics()
    if families is None:
        return
    scheme, role = families.scheme, _clamp(report.role, _ROLES)
    labels = (_clamp(engine, _ENGINES), families.model_label(model))
    for phase, seconds in _phase_seconds(report).items():
        families.phase_seconds.labels(*labels, phase, scheme).observe(max(seconds, 0.0))
    families.bytes_streamed.labels(role, _source_kind(report.source), scheme).inc(report.bytes_streamed)
    if report.bytes_from_storage is not None:
        families.bytes_by_origin.labels(role, "storage", scheme).inc(report.bytes_from_storage)
        families.bytes_by_origin.labels(role, "peers", scheme).inc(report.bytes_from_peers or 0)
    families.tensors.labels(role, scheme).inc(report.tensors)
    families.selections.labels(role, _clamp(report.selection_source, _SELECTION_SOURCES), scheme).inc()


# -- traces --------------------------------------------------------------------


def _tracer() -> Any:
    try:
        from modelexpress.tracing import tracer
    except Exception:  # noqa: BLE001
        return None
    return tracer if hasattr(tracer, "start_span") else None  # ModelExpress's no-op tracer has none


def _span_attributes(report: LoadReport) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "robust.role": report.role,
        "global_rank": report.rank,
        "robust.source_uri": report.source,
        "robust.source_label": report.source_label,
        "robust.source_kind": _source_kind(report.source),
        "robust.selection_source": report.selection_source,
        "robust.bytes_streamed": report.bytes_streamed,
        "robust.tensors": report.tensors,
        "robust.shards": len(report.shards),
        "robust.distributed": report.distributed,
    }
    if report.bytes_from_storage is not None:
        attributes["robust.bytes_from_storage"] = report.bytes_from_storage
        attributes["robust.bytes_from_peers"] = report.bytes_from_peers
    return attributes


def _wall_clock() -> Callable[[float], int]:
    """``time.perf_counter`` readings -> wall-clock nanoseconds (a span's times), against one reading of both."""
    now_perf, now_ns = time.perf_counter(), time.time_ns()
    return lambda perf: now_ns - int(round((now_perf - perf) * 1e9))


def _record_spans(report: LoadReport, ended: float) -> None:
    tracer = _tracer()
    if tracer is None:
        return
    attributes, wall_ns = _span_attributes(report), _wall_clock()
    at = ended - report.timings.get("total", 0.0)
    for phase, seconds in _phase_seconds(report).items():
        span = tracer.start_span(_SPAN_PREFIX + phase, start_time=wall_ns(at), attributes=attributes)
        at += max(seconds, 0.0)
        span.end(end_time=wall_ns(at))


@contextmanager
def _never_raising(what: str) -> Iterator[None]:
    """Telemetry never fails a load: whatever goes wrong inside is logged at DEBUG and dropped."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001
        _logger.debug(f"robust {what} not recorded: {exc}")


# -- what robust.py calls ------------------------------------------------------


def record_load(report: LoadReport, ctx: Any, *, engine: str, ended: float) -> None:
    """A finished load: metrics and spans from its report. ``ended``: perf_counter at its end. Never raises."""
    with _never_raising("load metrics"):
        _record_metrics(report, engine, getattr(getattr(ctx, "identity", None), "model_name", None))
    with _never_raising("load spans"):
        _record_spans(report, ended)


def record_failure(error: BaseException, role: str, rank: int, *, mutated: bool, started: float) -> None:
    """A load given up (``StrategyFailed``; its cause says why). Never raises."""
    reason = _failure_reason(error)
    outcome = "failed" if mutated else "refused"
    with _never_raising("failure metric"):
        families = _metrics()
        if families is not None:
            families.failures.labels(_clamp(role, _ROLES), reason, outcome, families.scheme).inc()
    with _never_raising("failure span"):
        tracer = _tracer()
        if tracer is not None:
            attributes = {"robust.role": role, "global_rank": rank, "robust.reason": reason,
                          "robust.outcome": outcome, "robust.error": str(error)[:512]}  # fmt: skip
            span = tracer.start_span(_FAILED_SPAN, start_time=_wall_clock()(started), attributes=attributes)
            with _never_raising("failure status"):
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, reason))
            span.end(end_time=time.time_ns())
