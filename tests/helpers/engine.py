"""The engine side of a load, for tests: contexts, configs, the stand-in engine, loads.

vLLM needs a GPU to build a model, so the model and adapter are
``mx_strategies.testing.standin``'s: a strict model (a tensor it does not own
fails the load) and a real ``EngineAdapter`` subclass that applies weights
through ``model.load_weights`` as vLLM's adapter does and counts
``reinit_for_retry`` calls. Everything else in the chain is real.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional
from unittest.mock import MagicMock, patch

import pytest
from modelexpress import p2p_pb2
from modelexpress.adapter import StrategyFailed
from modelexpress.load_strategy import LoadResult, LoadStrategyChain
from safetensors.torch import load_file

from mx_strategies import activation
from mx_strategies.engine import EngineView
from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.testing.standin import StandInAdapter as CountingAdapter
from mx_strategies.testing.standin import StandInModel as RecordingModel
from mx_strategies.testing.standin import load_context, model_config, vllm_config  # noqa: F401 (re-exported)
from mx_strategies.verify.tensor_bytes import same_bytes

STRATEGY_LOGGER = "modelexpress.strategy_robust_model_streamer"
CHAIN_LOGGER = "modelexpress.load_strategy"
NO_STRATEGY = "No loading strategy succeeded"

# What planning sees for a plain target load, and for an MTP draft at pipeline parallel 1.
TARGET = EngineView(False, None, (), 1, 1, None, {})
MTP_DRAFT = EngineView(True, "mtp", (), 1, 1, None, {})


# -- configs and contexts (model_config, vllm_config: mx_strategies.testing.standin's) -------


def make_context(mc, adapter, *, draft: bool = False, identity: Optional[dict] = None):
    """A LoadContext for rank 0; ``identity`` adds SourceIdentity fields (parallel sizes...)."""
    ctx = load_context(mc, adapter, name="tiny", p2p_enabled=not draft)
    if identity:
        ctx.identity = p2p_pb2.SourceIdentity(model_name="tiny", **identity)
    return ctx


def sglang_context(mc, adapter, *, tp: int = 1, pp: int = 1):
    """A context as SGLang's adapter builds it: no ``vllm_config``, parallel sizes in the identity only."""
    return make_context(mc, adapter, identity={"tensor_parallel_size": tp, "pipeline_parallel_size": pp})


# -- loads ------------------------------------------------------------------------------


def run_chain(mc, reference, names=None, *, vcfg=None, draft=False, adapter_cls=CountingAdapter):
    """Run ModelExpress's real chain; return (model, adapter)."""
    make = lambda: RecordingModel(reference, names)  # noqa: E731
    adapter = adapter_cls(make, vllm_config=vcfg)
    model = LoadStrategyChain.run(make(), make_context(mc, adapter, draft=draft))
    return model, adapter


def chain_load(monkeypatch, uri: str, reference, *, mc=None, names=None):
    """MX_MODEL_URI=uri and ModelExpress's chain with the robust strategy installed."""
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    return run_chain(mc if mc is not None else model_config(), reference, names)


class FolderNativeAdapter(CountingAdapter):
    """The stand-in adapter that also loads as the engine's own disk loader does (ModelExpress's ``default``, the
    chain's strategy after robust): every shard of ``folder``, with safetensors; counts its loads."""

    def __init__(self, make_model, folder: str, **kwargs) -> None:
        super().__init__(make_model, **kwargs)
        self.folder = folder
        self.native_calls = 0

    def load_via_native(self, result: LoadResult) -> LoadResult:
        self.native_calls += 1
        for shard in sorted(os.listdir(self.folder)):
            if shard.endswith(".safetensors"):
                result.model.load_weights(iter(load_file(os.path.join(self.folder, shard)).items()))
        return result

    def after_native_load(self, result: LoadResult) -> LoadResult:
        return result


class InstantTensorAdapter(CountingAdapter):
    """The stand-in adapter with ModelExpress's InstantTensor hooks: CUDA-like, and a reader that only counts its
    calls (InstantTensor's own reader needs CUDA; tests/test_chain_guard.py runs vLLM's real path on real folders)."""

    def __init__(self, make_model, **kwargs) -> None:
        super().__init__(make_model, **kwargs)
        self.instanttensor_calls = 0

    def is_cuda_alike(self) -> bool:
        return True

    def build_instanttensor_weight_iter(self, model=None):
        self.instanttensor_calls += 1
        return iter(())


@dataclass
class Attempt:
    """One load: the model and adapter it used, and its result or StrategyFailed."""

    model: RecordingModel
    adapter: CountingAdapter
    result: Optional[LoadResult] = None
    error: Optional[Exception] = None
    seconds: float = 0.0

    @property
    def report(self) -> dict:
        """The load report the strategy left in the result's metadata."""
        return self.result.metadata["robust_model_streamer"]


def one_attempt(strategy, result, ctx):
    """``strategy`` tried once, with the lifecycle the installed ModelExpress's chain gives an attempt."""
    import modelexpress.load_strategy as chain

    phases = getattr(chain, "_strategy_phases", None)  # 0.8: prepare / load / finalize or abort
    if phases is None:
        return strategy.load(result, ctx)
    if not isinstance(result, LoadResult):  # 0.8's chain hands every phase its envelope, never a bare model
        result = LoadResult(value=result, model=result)
    with phases(strategy, result, ctx):
        result = strategy.load(result, ctx)
    return result


@contextmanager
def mocked_register_tensors():
    """A mock in place of ModelExpress's ``register_tensors`` where the installed release calls it for robust.

    robust's ``load`` calls it on 0.7; the chain's ``finalize`` (``load_strategy.base``) on 0.8.
    """
    mock = MagicMock()
    with patch("mx_strategies.robust.register_tensors", mock), patch("modelexpress.load_strategy.base.register_tensors", mock):
        yield mock


def direct_load(
    mc,
    reference,
    *,
    names=None,
    strategy_cls=RobustModelStreamerStrategy,
    adapter_cls=CountingAdapter,
    vcfg=None,
    draft=False,
    ctx_factory=None,
) -> Attempt:
    """One attempt of ``strategy_cls`` outside the chain, keeping a StrategyFailed to inspect.

    Run as the installed ModelExpress runs one: on 0.8 inside its own
    ``_strategy_phases`` (prepare, load, then finalize or abort), on 0.7 ``load`` alone.
    """
    adapter = adapter_cls(lambda: RecordingModel(reference, names), vllm_config=vcfg)
    model = RecordingModel(reference, names)
    ctx = (ctx_factory or make_context)(mc, adapter, **({"draft": draft} if ctx_factory is None else {}))
    attempt = Attempt(model, adapter)
    started = time.perf_counter()
    try:
        attempt.result = one_attempt(strategy_cls(), LoadResult(value=model, model=model), ctx)
    except StrategyFailed as exc:
        attempt.error = exc
    attempt.seconds = time.perf_counter() - started
    return attempt


def failed_chain(mc, reference, *, names=None, strategy_cls=RobustModelStreamerStrategy, adapter_cls=CountingAdapter):
    """ModelExpress's chain with ``strategy_cls`` installed, expected to fail; keeps model and adapter."""
    activation.install(strategy_cls)
    adapter = adapter_cls(lambda: RecordingModel(reference, names))
    model = RecordingModel(reference, names)
    attempt = Attempt(model, adapter)
    with pytest.raises(RuntimeError, match=NO_STRATEGY) as caught:
        LoadStrategyChain.run(model, make_context(mc, adapter))
    attempt.error = caught.value
    return attempt


# -- what arrived ----------------------------------------------------------------------


def assert_loaded(model: RecordingModel, ckpt) -> None:
    """Every tensor of ``ckpt`` (a Written) exactly once, equal to what safetensors reads (in arrival order:
    tensors reach the model as runai's reads complete)."""
    assert Counter(model.order) == Counter(ckpt.order)
    assert set(model.weights) == set(ckpt.reference)
    for name, expected in ckpt.reference.items():
        assert model.weights[name].dtype == expected.dtype, name
        assert same_bytes(model.weights[name], expected), name


def assert_got(model: RecordingModel, expected_names, reference) -> None:
    """Exactly ``expected_names``, each once (any order), equal to ``reference``."""
    assert sorted(model.order) == sorted(expected_names)
    for name in expected_names:
        assert same_bytes(model.weights[name], reference[name]), name


def untouched(model: RecordingModel) -> bool:
    return not model.order and all(not t.any() for t in model.weights.values())


def messages(caplog, logger: str, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= level]


def robust_messages(caplog, level=logging.INFO) -> str:
    return "\n".join(messages(caplog, STRATEGY_LOGGER, level))


# -- a checkpoint changing under a load -----------------------------------------------


class RaceAfterPlanning(RobustModelStreamerStrategy):
    """The real strategy, with another writer changing a shard once the plan is fixed.

    ``change`` runs between planning and streaming (the strategy's ``_stream``
    step): the window in which a checkpoint being re-uploaded or re-synced
    changes under a load.
    """

    change = staticmethod(lambda path: None)
    shard_number = 2

    def _stream(self, result, ctx, asked, *args, **kwargs):
        type(self).change(asked.load.plan.shards[self.shard_number - 1].uri)
        return super()._stream(result, ctx, asked, *args, **kwargs)


class StopBeforeStreaming(RobustModelStreamerStrategy):
    """The real strategy up to the stream, which it records instead of running.

    ``seen`` holds, per load, whether it would stream distributed (runai's
    distributed mode needs a process group) and the engine view it planned
    for; the load then fails with :data:`STOPPED`, ``mutated=False``.
    """

    seen: list[dict] = []

    def _stream(self, result, ctx, asked, *args, **kwargs):
        type(self).seen.append({"distributed": asked.distributed, "engine": asked.module.engine, "module": asked.module,
                                "load": asked.load})  # fmt: skip
        raise StrategyFailed(STOPPED, mutated=False)


STOPPED = "stopped before streaming"


def drop_from_stream(monkeypatch, dropped: str) -> None:
    """Make the stream silently lose ``dropped`` (vLLM #38991: 335 of 447 tensors dropped), whichever reader
    reads it (runai, or the page-cache reader).

    The shard on disk stays as inspected, so only the delivery ledger can
    notice; rewriting the file instead is refused before streaming (its
    identity changed).
    """
    from mx_strategies.stream import file_reader, runai_plan

    for reader in (runai_plan.PlannedStreamer, file_reader.PageCacheReader):

        def get_tensors(self, original=reader.get_tensors):
            return ((name, tensor) for name, tensor in original(self) if name != dropped)

        monkeypatch.setattr(reader, "get_tensors", get_tensors)


def racing(change) -> type:
    """A strategy class whose load runs ``change(shard path)`` after planning."""
    return type("Racing", (RaceAfterPlanning,), {"change": staticmethod(change)})
