"""Progress while streaming (:mod:`mx_strategies.observe.progress`): the tracker, its lines, and real loads.

The tracker is fed (shard, bytes) with an injected clock, so every number in
a line is exact. The loads are real (runai streaming a checkpoint on disk or
from the loopback S3 into the stand-in engine); they ask for the lines by
raising the progress logger's level, which the suite keeps quiet otherwise.
"""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
from helpers.checkpoints import tiny_shards, upload, write_checkpoint
from helpers.engine import direct_load, make_context, model_config

from mx_strategies.observe.progress import ProgressLog, ProgressTracker, for_load, human_bytes, _human_seconds
from mx_strategies.settings import load_settings

PROGRESS_LOGGER = "modelexpress.strategy_robust_model_streamer.progress"  # kept quiet by conftest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


SHARDS = [("s3://b/m/model-00001-of-00002.safetensors", 2, 3_000_000_000), ("s3://b/m/model-00002-of-00002.safetensors", 1, 1_000_000_000)]


def test_tracker_counts_bytes_and_completes_a_shard_with_its_last_tensor():
    clock = Clock()
    tracker = ProgressTracker("s3://b/m", SHARDS, clock=clock)
    assert (tracker.planned_bytes, tracker.shards_total, tracker.shards_done) == (4_000_000_000, 2, 0)
    clock.now += 1.0
    assert tracker.add(SHARDS[0][0], 1_000_000_000) is False
    assert tracker.add(None, 7) is False  # a tensor the plan does not name: its bytes count, it completes nothing
    assert tracker.add(SHARDS[0][0], 2_000_000_000) is True
    snap = tracker.snapshot()
    assert (snap.done_bytes, snap.shards_done, snap.seconds) == (3_000_000_007, 1, 1.0)
    assert snap.text() == "3.00 GB of 4.00 GB (75.0%), 3.00 GB/s, ETA 0s, 1 of 2 shards"


def test_tracker_eta_and_a_stalled_start():
    clock = Clock()
    tracker = ProgressTracker("/models/m", SHARDS, clock=clock)
    assert tracker.snapshot().text() == "0 B of 4.00 GB (0.0%), 0 B/s, ETA unknown, 0 of 2 shards"
    clock.now += 40.0
    tracker.add(SHARDS[0][0], 1_000_000_000)
    assert tracker.snapshot().eta == 120.0
    assert tracker.snapshot().text() == "1.00 GB of 4.00 GB (25.0%), 25.0 MB/s, ETA 2m00s, 0 of 2 shards"


def test_a_shard_without_expected_tensors_is_not_counted():
    tracker = ProgressTracker("/m", [("/m/a.safetensors", 0, 0), ("/m/b.safetensors", 1, 8)], clock=Clock())
    assert tracker.shards_total == 1
    assert tracker.add("/m/b.safetensors", 8) is True
    assert tracker.snapshot().text() == "8 B of 8 B (100.0%), 0 B/s, ETA 0s, 1 of 1 shards"


@pytest.mark.parametrize(
    "n, text", [(0, "0 B"), (999, "999 B"), (1000, "1.00 kB"), (12_345_678, "12.3 MB"), (689e9, "689 GB"), (2.5e15, "2.50 PB")]
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (59, "59s"), (292, "4m52s"), (3780, "1h03m")])
def test_human_seconds(seconds, text):
    assert _human_seconds(seconds) == text


def test_log_writes_a_line_per_finished_shard_and_per_beat():
    clock = Clock()
    lines: list[str] = []
    log = ProgressLog(ProgressTracker("s3://b/m", SHARDS, clock=clock), prefix="[Worker 0] target ", emit=lines.append)
    clock.now += 2.0
    log.add(SHARDS[0][0], 1_500_000_000)
    log.beat()
    log.add(SHARDS[0][0], 1_500_000_000)
    log.add(SHARDS[1][0], 1_000_000_000)
    log.beat()  # everything arrived: the shard lines said so, the interval says nothing more
    assert lines == [
        "[Worker 0] target streaming s3://b/m: 1.50 GB of 4.00 GB (37.5%), 750 MB/s, ETA 3s, 0 of 2 shards",
        "[Worker 0] target streaming s3://b/m: 3.00 GB of 4.00 GB (75.0%), 1.50 GB/s, ETA 1s, 1 of 2 shards "
        "(shard model-00001-of-00002.safetensors done)",
        "[Worker 0] target streaming s3://b/m: 4.00 GB of 4.00 GB (100.0%), 2.00 GB/s, ETA 0s, 2 of 2 shards "
        "(shard model-00002-of-00002.safetensors done)",
    ]


def test_log_with_interval_zero_writes_nothing_but_still_feeds_the_bar():
    class Bar:
        total = 0
        closed = False

        def update(self, n):
            self.total += n

        def close(self):
            self.closed = True

    lines: list[str] = []
    bar = Bar()
    log = ProgressLog(ProgressTracker("/m", SHARDS, clock=Clock()), interval_s=0, emit=lines.append, bar=bar)
    log.start()
    log.add(SHARDS[1][0], 1_000_000_000)
    log.beat()
    log.stop()
    assert lines == [] and bar.total == 1_000_000_000 and bar.closed


def test_the_interval_thread_writes_until_stopped():
    written = threading.Event()
    lines: list[str] = []

    def emit(line):
        lines.append(line)
        written.set()

    log = ProgressLog(ProgressTracker("/m", SHARDS, clock=Clock()), interval_s=0.01, emit=emit)
    log.start()
    assert written.wait(30), "the interval thread wrote no line"
    log.stop()
    after = len(lines)
    assert log._thread is None and lines[0] == "streaming /m: 0 B of 4.00 GB (0.0%), 0 B/s, ETA unknown, 0 of 2 shards"
    assert len(lines) == after  # stopped: nothing more


# -- who shows progress ----------------------------------------------------------------


def _ctx(rank=0, tqdm=None):
    ctx = make_context(model_config(), None)
    ctx.global_rank = rank
    if tqdm is not None:
        ctx.load_config = SimpleNamespace(use_tqdm_on_load=tqdm)
    return ctx


PLAN = SimpleNamespace(source="/m", shards=(), names=None)


def test_lines_on_rank_zero_only_and_an_interval_of_zero_turns_them_off(monkeypatch):
    assert for_load(PLAN, load_settings(), _ctx(0), "target").lines
    assert for_load(PLAN, load_settings(), _ctx(1), "target") is None
    monkeypatch.setenv("MX_ROBUST_PROGRESS_ALL_RANKS", "true")  # retired: warned about, changes nothing
    assert for_load(PLAN, load_settings(), _ctx(0), "target").prefix == "[Worker 0] target "
    assert for_load(PLAN, load_settings(), _ctx(1), "target") is None
    monkeypatch.setenv("MX_ROBUST_PROGRESS_INTERVAL_S", "0")
    assert for_load(PLAN, load_settings(), _ctx(0), "target") is None


def test_a_bar_where_the_engine_shows_one(monkeypatch):
    monkeypatch.setenv("MX_ROBUST_PROGRESS_INTERVAL_S", "0")
    assert for_load(PLAN, load_settings(), _ctx(0, tqdm=False), "target") is None
    assert for_load(PLAN, load_settings(), _ctx(1, tqdm=True), "target") is None  # vLLM: rank 0 only
    shown = for_load(PLAN, load_settings(), _ctx(0, tqdm=True), "target")
    assert shown.bar is not None and not shown.lines
    shown.stop()


# -- real loads ------------------------------------------------------------------------


def _progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER]


def test_a_load_is_quiet_unless_the_progress_logger_is_asked(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    assert direct_load(model_config(), ckpt.reference).error is None
    assert _progress_lines(caplog) == []


def test_a_load_from_s3_logs_each_shard_and_ends_at_everything_planned(monkeypatch, caplog, s3, tmp_path):
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3, empty=(1,)))
    uri = upload(s3, ckpt.path, "tiny")
    monkeypatch.setenv("MX_MODEL_URI", uri)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is None
    report = attempt.report
    lines = _progress_lines(caplog)
    # One line per streamed shard (the empty one is not streamed), in the order shards completed.
    assert len(lines) == len(report["shards"]) == 2
    assert all(line.startswith(f"[Worker 0] target streaming {uri}: ") for line in lines)
    done = sorted(line.rsplit("(shard ", 1)[1] for line in lines)
    assert done == sorted(f"{key} done)" for key in report["shards"])
    total = human_bytes(report["bytes_streamed"])
    assert f": {total} of {total} (100.0%), " in lines[-1] and ", 2 of 2 shards (shard " in lines[-1]
    assert "1 of 2 shards" in lines[0]


def test_a_load_on_rank_one_is_quiet_by_default(monkeypatch, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    def rank_one(mc, adapter):
        ctx = make_context(mc, adapter)
        ctx.global_rank = 1
        return ctx

    assert direct_load(model_config(), ckpt.reference, ctx_factory=rank_one).error is None
    assert _progress_lines(caplog) == []
    monkeypatch.setenv("MX_ROBUST_PROGRESS_ALL_RANKS", "1")  # retired: warned about, the rank stays quiet
    assert direct_load(model_config(), ckpt.reference, ctx_factory=rank_one).error is None
    assert _progress_lines(caplog) == []


def test_a_load_where_vllm_shows_its_bar_shows_one(monkeypatch, capsys, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    def with_tqdm(mc, adapter):
        ctx = make_context(mc, adapter)
        ctx.load_config = SimpleNamespace(use_tqdm_on_load=True)
        return ctx

    attempt = direct_load(model_config(), ckpt.reference, ctx_factory=with_tqdm)
    assert attempt.error is None
    err = capsys.readouterr().err
    assert "Loading safetensors using Runai Model Streamer (robust): 100%" in err
