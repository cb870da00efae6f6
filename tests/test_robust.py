"""The strategy itself (:mod:`mx_strategies.robust`): its gate, and the ``mutated`` flag it raises.

The chain relies on ``StrategyFailed.mutated`` to decide whether to rebuild
the model before the next strategy; every failure here is provoked for
real (damaged files, a shard changed after planning, a model refusing a
tensor, a failing post-load step) and checked directly and through
ModelExpress's chain.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
from helpers.checkpoints import (
    DROPPED,
    Written,
    corrupt_header,
    cut_tail,
    delete_file,
    index_names_missing_tensor,
    replace_without,
    tiny_shards,
    write_checkpoint,
)
from helpers.engine import (
    CountingAdapter,
    direct_load,
    drop_from_stream,
    failed_chain,
    make_context,
    model_config,
    racing,
    untouched,
)
from modelexpress.adapter import StrategyFailed

from mx_strategies import errors
from mx_strategies.robust import RobustModelStreamerStrategy

# -- the gate ---------------------------------------------------------------------------


def _context(tmp_path):
    return make_context(model_config(model=str(tmp_path)), CountingAdapter(lambda: None))


def test_offered_without_mx_model_uri_unless_the_gate_is_kept(monkeypatch, tmp_path):
    """MX_STRATEGY alone switches robust on; MX_ROBUST_REQUIRE_MODEL_URI=true keeps upstream's gate."""
    strategy = RobustModelStreamerStrategy()
    assert strategy.is_available(_context(tmp_path))
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "true")
    assert not strategy.is_available(_context(tmp_path))
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path))
    assert strategy.is_available(_context(tmp_path))


def test_gate_needs_runai(monkeypatch, tmp_path):
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path))
    # None in sys.modules is Python's own way of making a module unimportable.
    monkeypatch.setitem(sys.modules, "runai_model_streamer", None)
    assert not RobustModelStreamerStrategy().is_available(_context(tmp_path))


@pytest.mark.parametrize(
    "env, value",
    [
        ("MX_ROBUST_COMPLETENESS", "maybe"),
        ("MX_ROBUST_SOURCE_ORDER", "model,bogus"),
        ("MX_ROBUST_DISCOVERY_DEPTH", "-1"),
        ("MX_STRATEGIES_CONFIG", "/nonexistent/robust.toml"),
    ],
)
def test_is_available_never_raises_on_a_bad_setting(monkeypatch, caplog, tmp_path, env, value):
    """A setting broken after activation skips the strategy; it must not abort the whole chain."""
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path))
    monkeypatch.setenv(env, value)
    assert RobustModelStreamerStrategy().is_available(_context(tmp_path)) is False
    skipped = [r.getMessage() for r in caplog.records if "robust_model_streamer skipped" in r.getMessage()]
    assert len(skipped) == 1 and env in skipped[0]


def test_load_with_a_bad_setting_fails_unmutated(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "maybe")
    attempt = direct_load(model_config(), ckpt.reference)
    assert isinstance(attempt.error, StrategyFailed) and attempt.error.mutated is False
    assert "MX_ROBUST_COMPLETENESS='maybe' is invalid" in str(attempt.error)
    assert untouched(attempt.model)


# -- errors carry `mutated` into StrategyFailed ------------------------------------------

BEFORE_THE_MODEL = [
    errors.ConfigurationError,
    errors.ActivationError,
    errors.StoreError,
    errors.NoCheckpoint,
    errors.NoStreamableSource,
    errors.InconsistentCheckpoint,
    errors.DraftPlanError,
    errors.StreamStartError,
    errors.StreamBroken,
    errors.ContentMismatch,
]


@pytest.mark.parametrize("cls", BEFORE_THE_MODEL, ids=lambda c: c.__name__)
def test_errors_default_to_unmutated_and_take_what_the_raiser_knows(cls):
    assert issubclass(cls, errors.MxStrategiesError)
    assert cls("x").mutated is False
    if cls is not errors.NoStreamableSource:  # takes the rejections instead
        assert cls("x", mutated=True).mutated is True


@pytest.mark.parametrize("cls", [errors.IncompleteDelivery, errors.IncompleteModel], ids=lambda c: c.__name__)
def test_shortfall_errors_default_to_mutated(cls):
    assert cls("x").mutated is True
    assert cls("x", mutated=False).mutated is False  # a stream that never reached the model says so


def test_configuration_error_is_a_value_error_and_not_pydantic_settings_error():
    assert issubclass(errors.ConfigurationError, ValueError)
    assert errors.ConfigurationError.__name__ != "SettingsError"


@pytest.mark.parametrize("mutated", [False, True])
@pytest.mark.parametrize("cls", [errors.StreamBroken, errors.ContentMismatch, errors.IncompleteDelivery])
def test_stream_errors_raised_while_the_engine_holds_the_stream_are_mutated(monkeypatch, tmp_path, cls, mutated):
    """Raised inside the engine's apply_weight_iter, a stream error is mutated=True whatever it says: the engine's
    code ran (before the hand-over, robust's errors keep their word: tests/test_faults.py's refused starts)."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    class Raising(CountingAdapter):
        def apply_weight_iter(self, result, weights_iter):
            raise cls("injected", mutated=mutated)

    attempt = direct_load(model_config(), ckpt.reference, adapter_cls=Raising)
    assert isinstance(attempt.error, StrategyFailed)
    assert attempt.error.mutated is True
    assert str(attempt.error) == "injected"
    assert isinstance(attempt.error.__cause__, cls)


def test_an_engine_error_is_mutated_once_the_engine_holds_the_stream(monkeypatch, tmp_path):
    """Mutated whether or not a tensor reached the model: an engine's load_weights may change the model before it
    takes its first tensor, and robust cannot see that (ModelExpress's rule for apply_weight_iter; before, robust
    answered mutated=False when no tensor had been taken, a guess in its own favour)."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    class BeforeReading(CountingAdapter):
        def apply_weight_iter(self, result, weights_iter):
            raise RuntimeError("engine refused before reading")

    class AfterOne(CountingAdapter):
        def apply_weight_iter(self, result, weights_iter):
            next(iter(weights_iter))
            raise RuntimeError("engine failed after one tensor")

    assert direct_load(model_config(), ckpt.reference, adapter_cls=BeforeReading).error.mutated is True
    assert direct_load(model_config(), ckpt.reference, adapter_cls=AfterOne).error.mutated is True


# -- the mutation contract, through the chain -----------------------------------------------


@dataclass(frozen=True)
class FailureCase:
    mutated: bool
    message: str  # in the StrategyFailed message
    prepare: Callable[[Written], None] = lambda ckpt: None
    strategy_cls: type = RobustModelStreamerStrategy
    model_lacks: Optional[str] = None  # a checkpoint tensor the model has no parameter for
    after_load_fails: bool = False
    stream_drops: Optional[str] = None  # a tensor runai's stream loses


FAILURES = {
    # Before the first tensor: listing, headers, index, streamer start.
    "no_source": FailureCase(False, "no candidate source", prepare=lambda c: [delete_file(f) for f in c.files]),
    "corrupt_header": FailureCase(False, "not valid JSON", prepare=corrupt_header),
    "index_mismatch": FailureCase(False, "header lacks it", prepare=index_names_missing_tensor),
    "shard_deleted_before_streaming": FailureCase(False, "did not start", strategy_cls=racing(delete_file)),
    "shard_truncated_before_streaming": FailureCase(False, "did not start", strategy_cls=racing(cut_tail)),
    "shard_rewritten_before_streaming": FailureCase(
        False, "changed since they were inspected", strategy_cls=racing(lambda p: replace_without(p, DROPPED))
    ),
    # After it: the model holds some of the new weights.
    "tensor_never_delivered": FailureCase(True, "expected tensors missing", stream_drops=DROPPED),
    "model_rejects_a_tensor": FailureCase(True, "model has no parameter", model_lacks=DROPPED),
    "post_load_processing_fails": FailureCase(True, "post-load processing failed", after_load_fails=True),
}


class FailingPostLoad(CountingAdapter):
    def after_weight_iter_load(self, result):
        super().after_weight_iter_load(result)
        raise RuntimeError("quantization repack failed")


@pytest.mark.parametrize("reader", ["runai", "page_cache"])
@pytest.mark.parametrize("case", sorted(FAILURES))
def test_mutation_contract(monkeypatch, tmp_path, case, reader):
    monkeypatch.setenv("MX_ROBUST_FILE_READER", reader)  # the same contract whichever reader reads the files
    spec = FAILURES[case]
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    spec.prepare(ckpt)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    names = [n for n in ckpt.reference if n != spec.model_lacks]
    adapter_cls = FailingPostLoad if spec.after_load_fails else CountingAdapter
    if spec.stream_drops:
        drop_from_stream(monkeypatch, spec.stream_drops)

    # Directly: the flag the strategy raises.
    attempt = direct_load(
        model_config(), ckpt.reference, names=names, strategy_cls=spec.strategy_cls, adapter_cls=adapter_cls
    )
    assert isinstance(attempt.error, StrategyFailed)
    assert attempt.error.mutated is spec.mutated
    assert spec.message in str(attempt.error)
    assert untouched(attempt.model) is not spec.mutated

    # Through the chain: what the flag makes ModelExpress do.
    if case.startswith("shard_"):  # the race changed the files: start again from a fresh copy
        shutil.rmtree(ckpt.path)
        ckpt = write_checkpoint(ckpt.path, tiny_shards(3))
    attempt = failed_chain(
        model_config(), ckpt.reference, names=names, strategy_cls=spec.strategy_cls, adapter_cls=adapter_cls
    )
    assert attempt.adapter.reinit_calls == (1 if spec.mutated else 0)
