"""The load report (:mod:`mx_strategies.observe.report`): what one load did, as data.

Every load leaves a report in ``LoadResult.metadata["robust_model_streamer"]``
and in the process's ``recent_reports()``; a failed load leaves one there
too. The log line, the demo, the benchmark and the end-to-end scripts read
these instead of parsing log text.
"""

from __future__ import annotations

import os

import pytest
from helpers.checkpoints import tiny_shards, write_checkpoint
from helpers.engine import direct_load, model_config, robust_messages, vllm_config

from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.observe.report import METADATA_KEY, clear_reports, recent_reports
from mx_strategies.testing.synthetic import config_only_copy, mtp_checkpoint

PHASES = {"resolve", "stream", "post_load", "total", "verify", "completeness"}  # the last two lie inside stream


@pytest.fixture(autouse=True)
def no_earlier_reports():
    clear_reports()
    yield
    clear_reports()


def test_load_report_in_result_metadata(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, empty=(1,)))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is None
    report = attempt.result.metadata["robust_model_streamer"]
    data_bytes = sum(t.numel() * t.element_size() for t in ckpt.reference.values())
    assert report["role"] == "target"
    assert (report["source"], report["source_label"]) == (ckpt.path, "MX_MODEL_URI")
    assert report["tensors"] == len(ckpt.reference)
    assert report["bytes_streamed"] == report["checkpoint_bytes"] == data_bytes
    assert attempt.adapter.after_load_calls == 1


def test_report_says_what_loaded_from_where_and_how_long_each_phase_took(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, empty=(1,)))
    cache = config_only_copy(ckpt.path, str(tmp_path / "cache"))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    attempt = direct_load(model_config(model=cache), ckpt.reference)

    report = attempt.report
    assert METADATA_KEY == "robust_model_streamer"
    assert report["outcome"] == "loaded" and report["rank"] == 0
    assert list(report["shards"]) == [ckpt.names[0], ckpt.names[2], ckpt.names[3]]  # the empty one is not streamed
    assert report["convention"] is None and report["distributed"] is False
    (rejected,) = report["rejected"]
    assert (rejected["label"], rejected["uri"]) == ("model", cache)
    assert f"holds {INDEX_NAME} but none of the 3 shard(s) it names" in rejected["reason"]
    assert report["trail"] == f"passed over model={cache!r}: {rejected['reason']}; chose MX_MODEL_URI={ckpt.path!r}"
    assert f"target source: {report['trail']}" in robust_messages(caplog)  # the log line says the same
    assert 0 < report["metadata_bytes"] < report["checkpoint_bytes"]
    assert set(report["timings"]) == PHASES
    assert all(seconds >= 0 for seconds in report["timings"].values())
    parts = report["timings"]["resolve"] + report["timings"]["stream"] + report["timings"]["post_load"]
    assert report["timings"]["total"] == pytest.approx(parts)
    assert report["timings"]["verify"] + report["timings"]["completeness"] <= report["timings"]["stream"]


def test_recent_reports_hold_loads_and_failures_in_order(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    loaded = direct_load(model_config(), ckpt.reference)
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path / "gone"))
    failed = direct_load(model_config(), ckpt.reference)

    reports = recent_reports()
    assert [r["outcome"] for r in reports] == ["loaded", "failed"]
    assert reports[0] == loaded.report
    assert reports[1] == {"outcome": "failed", "role": "target", "rank": 0, "error": str(failed.error), "mutated": False}
    reports[0]["tensors"] = -1  # a copy: the record is not changed through it
    assert recent_reports()[0]["tensors"] == len(ckpt.reference)
    clear_reports()
    assert recent_reports() == []


def test_a_failure_after_the_model_was_touched_is_reported_mutated(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(model_config(), ckpt.reference, names=list(ckpt.reference)[1:])  # the model lacks one
    assert attempt.error is not None and attempt.error.mutated is True
    (failure,) = recent_reports()
    assert failure["outcome"] == "failed" and failure["mutated"] is True
    assert "model has no parameter" in failure["error"]


def test_summary_line_is_the_reports(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    report = direct_load(model_config(), ckpt.reference).report
    line = f"[Worker 0] target loaded from MX_MODEL_URI={ckpt.path!r}: {report['tensors']} tensors verified, "
    line += f"{report['bytes_streamed']} of {report['checkpoint_bytes']} checkpoint bytes streamed (100.0%)"
    assert line in robust_messages(caplog)


def test_draft_report_names_its_convention_shards_and_bytes(monkeypatch, tmp_path):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", empty_shards=(1,))
    monkeypatch.setenv("MX_MODEL_URI", ck.path)

    attempt = direct_load(
        model_config(model=str(tmp_path / "nowhere"), runner_type="draft"),
        ck.tensors,
        names=ck.draft_names,
        vcfg=vllm_config("mtp"),
        draft=True,
    )

    report = attempt.report
    assert report["role"] == "draft" and report["convention"] == "nextn_layers"
    assert list(report["shards"]) == [ck.shard_names[-1]]  # DeepSeek: the MTP layer sits in the last shard
    assert report["tensors"] == len(ck.draft_names)
    assert report["bytes_streamed"] == ck.nbytes(ck.draft_names)
    assert report["checkpoint_bytes"] == ck.nbytes(ck.tensors)
    assert os.path.basename(report["rejected"][0]["uri"]) == "nowhere"
