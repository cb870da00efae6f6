"""Faults and hostile answers from the object store: nothing lost, nothing hung.

A real moto S3 server on 127.0.0.1 sits behind ``faults.FaultProxy``, an
HTTP-aware proxy that injects one fault into chosen requests: bursts of
503 SlowDown / 500, connection resets and bodies cut short mid-way, delays
and mid-body stalls, a server that stops answering, ranged reads answered
with the wrong bytes, and flipped data bytes. The proxy tells runai's C++
client ("streamer") from the probe's boto3 ("probe") by User-Agent, so each
side is faulted on its own. Everything else is real: safetensors files,
runai-model-streamer 0.17.0, the robust strategy and ModelExpress's chain;
the model is ``helpers.engine.RecordingModel`` (a vLLM model needs a GPU).

The contract checked for every fault: the load either delivers every tensor
equal to ``safetensors.torch.load_file``, or raises ``StrategyFailed`` whose
``mutated`` flag says whether a tensor reached the model and whose message
names the source and the fault. Each test also asserts that its fault
really fired. Retries are cut down with our settings so persistent faults
fail in seconds; docs/faults.md has the times measured with the defaults.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from helpers.checkpoints import layer_shards, write_checkpoint
from helpers.engine import Attempt, direct_load, model_config, run_chain
from helpers.faults import CORRUPT, DELAY, FAULTS_LAYER, RESET, SHORT, STALL, STATUS, WRONG_RANGE, FaultyS3, Rule

from mx_strategies import activation
from mx_strategies.verify import ledger
from mx_strategies.verify.ledger import _ContentCheck, _chosen_for_check
from mx_strategies.settings import load_settings
from mx_strategies.verify.tensor_bytes import same_bytes

SHARDS = 3
HIDDEN = 16
# Persistent faults fail after this many retries per request (runai's default is 5).
FEW_RETRIES = "1"

pytestmark = pytest.mark.timeout(120)  # a hang guard, not a timing target

_buckets = itertools.count()


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty():
    with FaultyS3() as server:
        yield server


@dataclass
class Loaded:
    """A checkpoint uploaded to the faulty S3, with what a correct load delivers."""

    uri: str
    files: list[str]  # shard keys, natural order
    reference: dict[str, torch.Tensor]
    offsets: dict[str, tuple[str, int, int]]  # tensor -> (shard key, absolute start, end)

    def shard_of(self, name: str) -> str:
        return self.offsets[name][0]


@pytest.fixture
def ckpt(faulty, tmp_path, monkeypatch) -> Loaded:
    """A fresh 3-shard checkpoint on the faulty S3, MX_MODEL_URI pointing at it, no fault armed."""
    written = write_checkpoint(str(tmp_path), layer_shards(SHARDS, hidden=HIDDEN, seed=7, layer=FAULTS_LAYER))
    uri = faulty.upload(str(tmp_path), f"faults-{next(_buckets)}", "model")
    faulty.proxy.clear()
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty.proxy.endpoint)  # in case another fixture moved it
    yield Loaded(uri, written.names, written.reference, written.offsets)
    faulty.proxy.clear()


def load(ckpt: Loaded) -> Attempt:
    """One direct ``strategy.load`` (the flag and message ModelExpress's chain acts on)."""
    return direct_load(model_config(), ckpt.reference)


def assert_verified(outcome: Attempt, ckpt: Loaded) -> None:
    """Loaded, every tensor once and bit-identical to what safetensors reads."""
    assert outcome.error is None, f"load failed: {outcome.error}"
    assert sorted(outcome.model.order) == sorted(ckpt.reference)
    for name, expected in ckpt.reference.items():
        assert same_bytes(outcome.model.weights[name], expected), name


# A fault in one shard's reads while the engine's weight loading held the stream: mutated=True (robust cannot know
# what the engine's code did before failing: ModelExpress's rule for apply_weight_iter). Tensors reach the model as
# runai's reads complete, so whether other shards' tensors arrived first is the timing's; what is certain is that no
# tensor of the faulted shard reached the model. ``faulted(ckpt, i)`` names shard i's tensors for ``assert_failed``.
HELD = "held"


def faulted(ckpt: "Loaded", shard: int) -> frozenset[str]:
    return frozenset(n for n in ckpt.reference if ckpt.shard_of(n) == ckpt.files[shard])


def assert_failed(outcome: Attempt, *, mutated, says: tuple[str, ...], kept_out: frozenset[str] = frozenset()) -> str:
    """Failed with the right flag, the model untouched when unmutated and touched when mutated (``HELD``: touched or
    not, but none of ``kept_out`` reached it), the message naming ``says``."""
    assert outcome.error is not None, "the load succeeded despite the fault"
    message = str(outcome.error)
    assert outcome.error.mutated is (mutated is not False), message
    if mutated == HELD:
        assert kept_out and not kept_out & set(outcome.model.order), (outcome.model.order, message)
    else:
        untouched = not outcome.model.order
        assert untouched is (mutated is not True), (outcome.model.order, message)
    for text in says:
        assert text in message, f"{text!r} not in {message!r}"
    return message


def data_read_of(ckpt: Loaded, shard: int):
    """A predicate for ranged reads of shard ``shard``'s tensor data (not its header)."""
    key = ckpt.files[shard]
    first_data = min(start for k, start, _ in ckpt.offsets.values() if k == key)

    def matches(request) -> bool:
        return request.path.endswith(key) and request.range is not None and request.range[0] >= first_data

    return matches


def first_data_read_of(ckpt: Loaded, shard: int):
    """A predicate for the one ranged read of shard ``shard``'s first tensor (a burst on one request)."""
    key = ckpt.files[shard]
    first_data = min(start for k, start, _ in ckpt.offsets.values() if k == key)
    return lambda r: r.path.endswith(key) and r.range is not None and r.range[0] == first_data


def header_read_of(ckpt: Loaded, shard: int):
    key = ckpt.files[shard]
    return lambda r: r.path.endswith(key) and r.range is not None and r.range[0] == 0


# -- transient faults in the stream: runai's client retries, the load is whole ---------

TRANSIENT = {
    # runai reads no header since it streams the probe's plan (mx_strategies.stream.runai_plan): the
    # SlowDown burst that once hit its header read now hits a data read.
    "503_slowdown_burst_on_data": dict(kind=STATUS, status=503, times=3, target="data"),
    "500_burst_on_data": dict(kind=STATUS, status=500, times=2, target="data"),
    "reset_mid_body": dict(kind=RESET, keep_bytes=300, times=2, target="data"),
    "body_cut_short": dict(kind=SHORT, keep_bytes=300, times=2, target="data"),
    "slow_response": dict(kind=DELAY, delay_s=1.5, times=1, target="data"),
    "stalled_mid_body": dict(kind=STALL, keep_bytes=300, delay_s=1.5, times=1, target="data"),
}


@pytest.mark.parametrize("case", sorted(TRANSIENT))
def test_transient_stream_fault_is_retried_and_the_load_is_whole(faulty, ckpt, case):
    spec = dict(TRANSIENT[case])
    target = spec.pop("target")
    when = data_read_of(ckpt, 1) if target == "data" else None
    faulty.proxy.add(Rule(client="streamer", when=when, **spec))
    outcome = load(ckpt)
    assert_verified(outcome, ckpt)
    assert len(faulty.proxy.fired(spec["kind"])) == spec["times"]


def test_transient_probe_throttling_is_retried(faulty, ckpt):
    faulty.proxy.add(Rule(STATUS, status=503, times=2, client="probe", when=header_read_of(ckpt, 0)))
    outcome = load(ckpt)
    assert_verified(outcome, ckpt)
    assert len(faulty.proxy.fired(STATUS)) == 2


@pytest.mark.parametrize("kind", [RESET, SHORT])
def test_probe_body_cut_once_is_read_again(faulty, ckpt, kind):
    """botocore does not retry a body that breaks after the headers; our ranged read does.

    The probe reads a header with one ranged read from byte 0 where it fits (it once read
    the 8-byte length, then the JSON from byte 8): the cut hits that read.
    """
    faulty.proxy.add(Rule(kind, keep_bytes=20, times=1, client="probe", when=header_read_of(ckpt, 2)))
    outcome = load(ckpt)
    assert_verified(outcome, ckpt)
    assert len(faulty.proxy.fired(kind)) == 1


# -- persistent faults: bounded failure, the right flag, a message naming source and fault ---


def test_persistent_throttling_of_the_stream_fails_mutated_with_nothing_written(faulty, ckpt, monkeypatch):
    """The first shard's data is throttled for good: none of its tensors reached the model, but the engine held the
    stream: mutated (the chain rebuilds)."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", FEW_RETRIES)
    faulty.proxy.add(Rule(STATUS, status=503, times=None, client="streamer", when=data_read_of(ckpt, 0)))
    outcome = load(ckpt)
    assert_failed(outcome, mutated=HELD, says=(ckpt.uri, "File access error"), kept_out=faulted(ckpt, 0))
    attempts = Counter(event.range for event in faulty.proxy.fired(STATUS))
    assert attempts and set(attempts.values()) == {int(FEW_RETRIES) + 1}, attempts  # the setting reached runai's client


@pytest.mark.parametrize("kind", [RESET, SHORT, STATUS])
def test_persistent_data_fault_after_the_first_tensor_fails_mutated(faulty, ckpt, monkeypatch, kind):
    """The last shard's data never arrives whole; the first shard's tensors already reached the model."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", FEW_RETRIES)
    # The delay lets the first shards arrive first, as they do when a late shard breaks.
    faulty.proxy.add(
        Rule(kind, keep_bytes=300, delay_s=0.6, times=None, client="streamer", when=data_read_of(ckpt, SHARDS - 1))
    )
    outcome = load(ckpt)
    message = assert_failed(
        outcome, mutated=True, says=(ckpt.uri, f"{ckpt.uri}/{ckpt.files[-1]}", "File access error")
    )
    assert "failed after" in message
    assert faulty.proxy.fired(kind)
    assert not any(n.startswith(f"model.layers.{SHARDS - 1}.") for n in outcome.model.order)


def test_persistent_data_fault_through_the_chain_rebuilds_the_model(faulty, ckpt, monkeypatch):
    """What ``mutated=True`` makes ModelExpress do: reinitialize before the next strategy."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", FEW_RETRIES)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    faulty.proxy.add(
        Rule(RESET, keep_bytes=300, delay_s=0.6, times=None, client="streamer", when=data_read_of(ckpt, SHARDS - 1))
    )
    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        run_chain(model_config(), ckpt.reference)
    assert faulty.proxy.fired(RESET)


def test_server_that_stops_answering_fails_in_bounded_time(faulty, ckpt, monkeypatch):
    """runai abandons a request that sends nothing for about 5 s, then retries; it never hangs."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", FEW_RETRIES)
    faulty.proxy.add(Rule(DELAY, delay_s=60.0, times=None, client="streamer", when=data_read_of(ckpt, 0)))
    outcome = load(ckpt)
    # runai reads the first shard's tensors with one request each; none reached the model,
    # as later shards' tensors are held back until the first shard's arrive.
    message = assert_failed(outcome, mutated=HELD, says=(f"{ckpt.uri}/{ckpt.files[0]}", "File access error"),
                            kept_out=faulted(ckpt, 0))
    assert "failed after" in message
    attempts = Counter(event.range for event in faulty.proxy.fired(DELAY))
    assert attempts and set(attempts.values()) == {int(FEW_RETRIES) + 1}, attempts


def test_persistent_probe_throttling_fails_unmutated_naming_slowdown(faulty, ckpt, monkeypatch):
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 2)
    faulty.proxy.add(Rule(STATUS, status=503, times=None, client="probe", when=header_read_of(ckpt, 0)))
    outcome = load(ckpt)
    assert_failed(outcome, mutated=False, says=(f"{ckpt.uri}/{ckpt.files[0]}", "SlowDown"))
    assert len(faulty.proxy.fired(STATUS)) == 2
    assert faulty.proxy.requests["streamer"] == 0  # refused before streaming


# -- wrong bytes ------------------------------------------------------------------------


def test_the_stream_reads_no_header_so_a_wrong_header_answer_cannot_mislead_it(faulty, ckpt):
    """``Range: bytes=0-7`` answered with bytes 8-15 once made runai read an absurd header length
    (and fail, unmutated). runai now streams the probe's plan (mx_strategies.stream.runai_plan) and asks
    for no header: the rule never fires and the load is whole."""
    faulty.proxy.add(Rule(WRONG_RANGE, shift=8, times=None, client="streamer", when=header_read_of(ckpt, 0)))
    outcome = load(ckpt)
    assert_verified(outcome, ckpt)
    assert faulty.proxy.fired(WRONG_RANGE) == []


def test_probe_header_read_answered_with_other_bytes_is_refused(faulty, ckpt):
    faulty.proxy.add(Rule(WRONG_RANGE, shift=8, times=None, client="probe", when=header_read_of(ckpt, 1)))
    outcome = load(ckpt)
    assert_failed(outcome, mutated=False, says=(f"{ckpt.uri}/{ckpt.files[1]}", "header length"))
    assert faulty.proxy.requests["streamer"] == 0


def _corrupt_one_tensor(faulty, ckpt: Loaded, name: str) -> Rule:
    key, start, end = ckpt.offsets[name]
    return faulty.proxy.add(
        Rule(
            CORRUPT,
            times=None,
            client="streamer",
            path_contains=key,
            ranged=True,
            corrupt_start=start + 4,
            corrupt_end=start + 12,
        )
    )


CORRUPTED = "model.layers.1.q_proj.weight"


def test_flipped_data_bytes_are_served_silently_without_verification(faulty, ckpt):
    """The honest baseline: runai does not notice, the model gets a wrong weight."""
    _corrupt_one_tensor(faulty, ckpt, CORRUPTED)
    outcome = load(ckpt)
    assert outcome.error is None
    assert faulty.proxy.fired(CORRUPT)
    assert not same_bytes(outcome.model.weights[CORRUPTED], ckpt.reference[CORRUPTED])
    for name, expected in ckpt.reference.items():
        if name != CORRUPTED:
            assert same_bytes(outcome.model.weights[name], expected), name


def test_flipped_data_bytes_are_caught_by_verify_all(faulty, ckpt, monkeypatch):
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "all")
    _corrupt_one_tensor(faulty, ckpt, CORRUPTED)
    outcome = load(ckpt)
    key, start, end = ckpt.offsets[CORRUPTED]
    assert_failed(  # whether other tensors arrived first is the reads' timing; the wrong bytes never reached the model
        outcome,
        mutated=HELD,
        says=("content check failed", repr(CORRUPTED), f"{ckpt.uri}/{key}", f"bytes {start}-{end - 1}"),
        kept_out=frozenset({CORRUPTED}),
    )
    assert CORRUPTED not in outcome.model.order


def test_off_by_n_data_range_is_caught_by_verify_all(faulty, ckpt, monkeypatch):
    """A data read answered with the bytes 4 further on (the last 4 missing): runai accepts it.

    The shard's tensors fail the check before the model sees them; the engine held the stream, so the failure is
    mutated.
    """
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "all")
    faulty.proxy.add(Rule(WRONG_RANGE, shift=4, times=None, client="streamer", when=data_read_of(ckpt, 2)))
    outcome = load(ckpt)
    assert_failed(outcome, mutated=HELD, says=("content check failed", f"{ckpt.uri}/{ckpt.files[2]}"),
                  kept_out=faulted(ckpt, 2))
    assert faulty.proxy.fired(WRONG_RANGE)


def test_off_by_n_data_range_is_served_silently_without_verification(faulty, ckpt):
    faulty.proxy.add(Rule(WRONG_RANGE, shift=4, times=None, client="streamer", when=data_read_of(ckpt, 2)))
    outcome = load(ckpt)
    assert outcome.error is None
    wrong = [n for n in ckpt.reference if not same_bytes(outcome.model.weights[n], ckpt.reference[n])]
    assert wrong and all(n.startswith("model.layers.2.") for n in wrong)


def test_verify_sample_checks_that_many_tensors_and_passes_a_clean_load(faulty, ckpt, monkeypatch):
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "sample")
    monkeypatch.setattr(ledger, "_SAMPLE_SIZE", 2)  # MX_ROBUST_VERIFY_SAMPLE until issue 53
    outcome = load(ckpt)
    assert_verified(outcome, ckpt)
    assert faulty.proxy.requests["probe"] > 0


def test_verify_sample_catches_corruption_in_a_sampled_tensor(faulty, ckpt, monkeypatch):
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "sample")
    monkeypatch.setattr(ledger, "_SAMPLE_SIZE", 2)  # MX_ROBUST_VERIFY_SAMPLE until issue 53
    sampled = sorted(_chosen_for_check(ckpt.reference, "sample", 2, salt=ckpt.uri))
    victim = max(sampled, key=lambda n: ckpt.offsets[n][1] + 1000 * ckpt.files.index(ckpt.shard_of(n)))
    _corrupt_one_tensor(faulty, ckpt, victim)
    outcome = load(ckpt)
    assert outcome.error is not None and repr(victim) in str(outcome.error)


def test_verification_read_that_fails_fails_the_load(faulty, ckpt, monkeypatch):
    """The check's own read broken for good: no silent pass."""
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "all")
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    faulty.proxy.add(Rule(STATUS, status=500, times=None, client="probe", when=data_read_of(ckpt, 0)))
    outcome = load(ckpt)
    assert_failed(outcome, mutated=HELD, says=("could not read the stored bytes", "InternalError"),
                  kept_out=faulted(ckpt, 0))


# -- retry settings reach runai on every load ----------------------------------------------


def _fails_then_outlasts(faulty, ckpt, monkeypatch, burst: dict, more_patience: dict[str, str]) -> None:
    """``burst`` fails a load with one retry per request; with ``more_patience`` set, the next load outlasts it."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "1")
    faulty.proxy.add(Rule(**burst))
    first = min(faulted(ckpt, 0), key=lambda n: ckpt.offsets[n][1])  # the burst's read: shard 0's first tensor
    assert_failed(load(ckpt), mutated=HELD, says=(ckpt.uri,), kept_out=frozenset({first}))

    for key, value in more_patience.items():
        monkeypatch.setenv(key, value)
    faulty.proxy.clear()
    faulty.proxy.add(Rule(**burst))
    assert_verified(load(ckpt), ckpt)


def test_retry_setting_changes_between_loads_in_one_process(faulty, ckpt, monkeypatch):
    """runai builds its S3 clients per load, so a changed setting applies to the next load."""
    burst = dict(kind=STATUS, status=503, times=3, client="streamer", when=first_data_read_of(ckpt, 0))
    _fails_then_outlasts(faulty, ckpt, monkeypatch, burst, {"MX_ROBUST_STREAMER_S3_MAX_RETRIES": "5"})
    assert len(faulty.proxy.fired(STATUS)) == 3


def test_retry_timeout_setting_lets_runai_outlast_a_longer_burst(faulty, ckpt, monkeypatch):
    """RUNAI_STREAMER_S3_TIMEOUT: application-level retries after the client gave up."""
    burst = dict(kind=STATUS, status=503, times=4, client="streamer", when=first_data_read_of(ckpt, 0))
    _fails_then_outlasts(faulty, ckpt, monkeypatch, burst, {"MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S": "10"})


def test_retry_settings_are_restored_after_the_load(faulty, ckpt, monkeypatch):
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "2")
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S", "3")
    monkeypatch.delenv("RUNAI_STREAMER_S3_MAX_RETRIES", raising=False)
    monkeypatch.setenv("RUNAI_STREAMER_S3_TIMEOUT", "9")
    assert_verified(load(ckpt), ckpt)
    assert "RUNAI_STREAMER_S3_MAX_RETRIES" not in os.environ
    assert os.environ["RUNAI_STREAMER_S3_TIMEOUT"] == "9"


# -- the content check's parts ----------------------------------------------------------


def test_sample_is_fixed_per_source_and_spread():
    names = [f"t{i}" for i in range(100)]
    first = _chosen_for_check(names, "sample", 10, salt="s3://a/b")
    assert first == _chosen_for_check(list(reversed(names)), "sample", 10, salt="s3://a/b")
    assert len(first) == 10
    assert _chosen_for_check(names, "sample", 10, salt="s3://other") != first
    assert _chosen_for_check(names, "all", 1) == set(names)
    assert _chosen_for_check(names, "off", 10) == frozenset()
    assert _chosen_for_check(names[:3], "sample", 10) == set(names[:3])


def test_verify_settings_are_validated(monkeypatch):
    from mx_strategies.errors import ConfigurationError

    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "some")
    with pytest.raises(ConfigurationError, match="MX_ROBUST_VERIFY_CONTENT='some' is invalid"):
        load_settings()
    monkeypatch.setenv("MX_ROBUST_VERIFY_CONTENT", "sample")
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "0")
    with pytest.raises(ConfigurationError, match="MX_ROBUST_STREAMER_S3_MAX_RETRIES='0' is invalid"):
        load_settings()


def test_content_check_names_an_unknown_offset(tmp_path):
    from mx_strategies.inspect.checkpoint import Shard, TensorInfo
    from mx_strategies.errors import ContentMismatch

    shard = Shard(key="a.safetensors", uri=str(tmp_path / "a.safetensors"), size=100)
    shard.tensors = {"x": TensorInfo("x", "F32", (1,), 4)}
    check = _ContentCheck(str(tmp_path), [shard], ["x"], load_settings(MX_ROBUST_VERIFY_CONTENT="all"))
    with pytest.raises(ContentMismatch, match="offset is unknown"):
        check.check("x", torch.zeros(1))
