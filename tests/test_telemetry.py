"""Metrics and traces (:mod:`mx_strategies.observe.telemetry`) through ModelExpress's collector and tracer.

The metrics test runs real loads in processes of their own, as ranks of a
pod do: prometheus_client chooses multiprocess mode when it is imported, so
``MX_METRICS_ENABLED=1`` and ``PROMETHEUS_MULTIPROC_DIR`` are in their
environment from the start. One process loads and exits; the other loads,
fails a load, and serves ModelExpress's exposition registry on 127.0.0.1.
The scrape is parsed with prometheus_client's own parser and every value is
compared with the load reports the two processes returned.

The trace test installs the OpenTelemetry SDK with an in-memory exporter
and runs ModelExpress's real chain, whose "Load model" span robust's phase
spans must hang under.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
from helpers.checkpoints import tiny_shards, upload, write_checkpoint
from helpers.engine import chain_load, direct_load, failed_chain, model_config
from modelexpress.adapter import StrategyFailed

from mx_strategies import errors
from mx_strategies.observe import telemetry
from mx_strategies.observe.report import LoadReport, clear_reports, recent_reports

REPO = Path(__file__).resolve().parents[1]


# -- the closed label sets -------------------------------------------------------------

REASONS = {
    errors.NoStreamableSource: "no_source",
    errors.NoCheckpoint: "no_source",
    errors.StoreError: "no_source",
    errors.InconsistentCheckpoint: "inconsistent_checkpoint",
    errors.DraftPlanError: "selection",
    errors.IncompleteDelivery: "completeness",
    errors.IncompleteModel: "completeness",
    errors.PartialParameters: "completeness",
    errors.RanksDisagree: "ranks_disagree",
    errors.StreamStartError: "streamer",
    errors.StreamBroken: "streamer",
    errors.ContentMismatch: "streamer",
    errors.ConfigurationError: "other",
    errors.ActivationError: "other",
}


def test_every_error_has_a_reason():
    assert set(REASONS) == {getattr(errors, name) for name in errors.__all__} - {errors.MxStrategiesError}


@pytest.mark.parametrize("cls", list(REASONS), ids=lambda c: c.__name__)
def test_a_failed_load_is_counted_under_its_errors_reason(cls):
    try:
        try:
            raise cls("x")
        except errors.MxStrategiesError as exc:
            raise StrategyFailed(str(exc), mutated=False) from exc
    except StrategyFailed as failed:
        assert telemetry._failure_reason(failed) == REASONS[cls]
    assert REASONS[cls] in telemetry._FAILURE_REASONS


def test_an_engine_error_is_other():
    try:
        raise StrategyFailed("post-load processing failed", mutated=True) from RuntimeError("boom")
    except StrategyFailed as failed:
        assert telemetry._failure_reason(failed) == "other"


@pytest.mark.parametrize(
    "uri, kind",
    [("s3://b/m", "s3"), ("gs://b/m", "gs"), ("az://c/m", "az"), ("/models/m", "local"), ("hf://org/m", "other")],
)
def test_source_kind(uri, kind):
    assert telemetry._source_kind(uri) == kind


def _report(**changes) -> LoadReport:
    fields = dict(
        role="target", rank=0, source="s3://b/m", source_label="MX_MODEL_URI", rejected=(), convention=None,
        shards=("a.safetensors",), tensors=3, bytes_streamed=96, checkpoint_bytes=96, metadata_bytes=10,
        distributed=False,
        timings={"resolve": 0.5, "stream": 2.0, "verify": 0.25, "completeness": 0.125, "post_load": 0.0625,
                 "total": 2.5625},
    )  # fmt: skip
    fields.update(changes)
    return LoadReport(**fields)


def test_phases_partition_the_strategys_load():
    phases = telemetry._phase_seconds(_report())
    assert phases == {"resolve": 0.5, "stream": 1.625, "verify": 0.25, "completeness": 0.125, "post_load": 0.0625}
    assert tuple(phases) == telemetry._PHASES
    assert sum(phases.values()) == _report().timings["total"]


def test_metrics_off_records_nothing_and_nothing_raises():
    assert os.environ.get("MX_METRICS_ENABLED") is None
    telemetry.record_load(_report(), None, engine="vllm", ended=0.0)
    telemetry.record_load(object(), None, engine="vllm", ended=0.0)  # not even a report: no error
    telemetry.record_failure(RuntimeError("x"), "target", 0, mutated=False, started=0.0)
    assert telemetry._families is None


# -- the real exposition endpoint after real loads ----------------------------------------


def _child(mode: str, ckpt: str, env: dict, *extra: str, **popen):
    return subprocess.Popen(
        [sys.executable, "-m", "helpers.telemetry_child", mode, ckpt, *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip


def _samples(text: str) -> dict[str, dict[tuple, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_scraped_metrics_equal_the_load_reports(s3, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3, empty=(1,)))
    uri = upload(s3, ckpt.path, "tiny")
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {
        **os.environ,
        "MX_METRICS_ENABLED": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "MX_STRATEGY": "mx_strategies.robust",
        "MX_MODEL_URI": uri,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
    }
    for unset in ("MX_METRICS_PORT", "MX_METRICS_PUSHGATEWAY", "MX_METRICS_SCHEME"):
        env.pop(unset, None)

    first = _child("load", ckpt.path, env)
    out, _ = first.communicate(timeout=240)
    assert first.returncode == 0
    (gone,) = json.loads(out)["reports"]
    with _child("serve", ckpt.path, env, f"{uri}-missing", stdin=subprocess.PIPE) as server:
        try:
            served = json.loads(server.stdout.readline())
            text = urllib.request.urlopen(f"http://127.0.0.1:{served['port']}/metrics", timeout=30).read().decode()
        finally:
            server.stdin.close()
            server.wait(timeout=60)
    loaded, failed = served["reports"]
    assert (gone["outcome"], loaded["outcome"], failed["outcome"]) == ("loaded", "loaded", "failed")
    assert failed["mutated"] is False
    samples = _samples(text)

    def value(name, **labels):
        return samples[name][tuple(sorted({**labels, "scheme": ""}.items()))]

    both = (gone, loaded)
    assert samples["mx_robust_bytes_streamed_total"] == {
        (("role", "target"), ("scheme", ""), ("source_kind", "s3")): float(sum(r["bytes_streamed"] for r in both))
    }
    assert value("mx_robust_tensors_total", role="target") == sum(r["tensors"] for r in both)
    assert value("mx_robust_bytes_by_origin_total", role="target", origin="storage") == sum(
        r["bytes_from_storage"] for r in both
    )
    assert value("mx_robust_bytes_by_origin_total", role="target", origin="peers") == sum(
        r["bytes_from_peers"] for r in both
    )
    assert samples["mx_robust_selections_total"] == {
        (("role", "target"), ("scheme", ""), ("selection_source", loaded["selection_source"])): 2.0
    }
    assert samples["mx_robust_failures_total"] == {
        (("outcome", "refused"), ("reason", "no_source"), ("role", "target"), ("scheme", "")): 1.0
    }
    for phase in telemetry._PHASES:
        labels = {"engine": "vllm", "model": "tiny", "phase": phase}
        expected = [telemetry._phase_seconds(LoadReport(**_fields(r)))[phase] for r in both]
        assert value("mx_robust_load_phase_seconds_count", **labels) == 2
        assert value("mx_robust_load_phase_seconds_sum", **labels) == expected[0] + expected[1]
    # ModelExpress's own families are served by the same endpoint.
    assert value("mx_build_info", component="client", version=version("modelexpress")) == 1


def _fields(data: dict) -> dict:
    """A LoadReport's fields from its as_dict() form."""
    names = set(LoadReport.__dataclass_fields__)
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in names}


# -- spans under ModelExpress's "Load model" ------------------------------------------------


@pytest.fixture(scope="module")
def spans():
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another tracer provider was installed first in this process")
    return exporter


def test_phase_spans_hang_under_load_model_and_carry_the_report(spans, monkeypatch, tmp_path):
    spans.clear()
    clear_reports()
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    chain_load(monkeypatch, ckpt.path, ckpt.reference)
    (report,) = recent_reports()
    finished = spans.get_finished_spans()
    (load,) = [s for s in finished if s.name == "Load model"]
    phase_spans = [s for s in finished if s.name.startswith(telemetry._SPAN_PREFIX)]
    assert [s.name for s in phase_spans] == [telemetry._SPAN_PREFIX + p for p in telemetry._PHASES]
    expected = telemetry._phase_seconds(LoadReport(**_fields(report)))
    for span, phase in zip(phase_spans, telemetry._PHASES):
        assert span.parent is not None and span.parent.span_id == load.context.span_id
        assert span.context.trace_id == load.context.trace_id
        assert dict(span.attributes) == {
            "robust.role": "target",
            "global_rank": 0,
            "robust.source_uri": ckpt.path,
            "robust.source_label": "MX_MODEL_URI",
            "robust.source_kind": "local",
            "robust.selection_source": report["selection_source"],
            "robust.bytes_streamed": report["bytes_streamed"],
            "robust.tensors": report["tensors"],
            "robust.shards": 3,
            "robust.distributed": False,
            "robust.bytes_from_storage": report["bytes_from_storage"],
            "robust.bytes_from_peers": report["bytes_from_peers"],
        }
        # Made from the report's timings: each span lasts its phase (to the nanosecond rounding of each end).
        assert abs((span.end_time - span.start_time) - expected[phase] * 1e9) <= 2
    # One after the other, inside the chain's span.
    assert all(a.end_time == b.start_time for a, b in zip(phase_spans, phase_spans[1:]))
    assert load.start_time <= phase_spans[0].start_time and phase_spans[-1].end_time <= load.end_time


def test_a_failed_load_leaves_a_failed_span_with_its_reason(spans, monkeypatch, tmp_path):
    from opentelemetry.trace import StatusCode

    spans.clear()
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path / "nothing-here"))
    failed_chain(model_config(), ckpt.reference)
    finished = spans.get_finished_spans()
    (load,) = [s for s in finished if s.name == "Load model"]
    (span,) = [s for s in finished if s.name.startswith("Robust")]
    assert span.name == telemetry._FAILED_SPAN and span.parent.span_id == load.context.span_id
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes["robust.reason"], span.attributes["robust.outcome"]) == ("no_source", "refused")


def test_without_a_tracer_provider_a_load_is_unchanged(monkeypatch, tmp_path):
    """ModelExpress's no-op tracer (no opentelemetry installed) has no start_span: nothing is made."""
    import modelexpress.tracing

    class NoOp:
        pass

    monkeypatch.setattr(modelexpress.tracing, "tracer", NoOp())
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    assert direct_load(model_config(), ckpt.reference).error is None


_WITHOUT_METRICS_OR_TRACES = """
import sys

class Hidden:
    # ModelExpress's `metrics` and `otel` extras, as in an image without them.
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from helpers.checkpoints import reference_tensors
from helpers.engine import direct_load, model_config

attempt = direct_load(model_config(), reference_tensors(sys.argv[1]))
assert attempt.error is None, attempt.error
assert "prometheus_client" not in sys.modules and "opentelemetry" not in sys.modules
print(attempt.report["tensors"])
"""


def test_a_load_with_metrics_on_needs_neither_prometheus_client_nor_opentelemetry(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    env = {
        **os.environ,
        "MX_METRICS_ENABLED": "1",
        "MX_MODEL_URI": ckpt.path,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_METRICS_OR_TRACES, ckpt.path],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(len(ckpt.reference))
