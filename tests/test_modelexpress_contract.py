"""ModelExpress's own ModelStreamerStrategy tests, re-aimed at the subclass.

A port of the assertions in ModelExpress's
``modelexpress_client/python/tests/test_model_streamer_strategy.py``
(github.com/ai-dynamo/modelexpress), organised as there: availability, load,
the weight stream, the vLLM adapter's runai options, and the chain order.
``RobustModelStreamerStrategy`` replaces ``model_streamer``, so every promise
the parent's tests make must hold for it, except where it differs by design;
each such test says how and why.

Two adaptations run through the file:

- The installed ModelExpress (0.7.0) gates the parent on ``MX_MODEL_URI``
  (newer upstream releases carry it in ``LoadContext.model_streamer_uri``);
  the port sets the variable where upstream sets the context field.
- Upstream patches ``ModelStreamerStrategy._stream_weights`` (the adapter's
  runai iterator). The subclass streams itself (``VerifiedStream``), so the
  port loads real safetensors files through real runai-model-streamer
  instead; the model is the suite's stand-in (``helpers.engine``).
"""

from __future__ import annotations

import importlib.util
import logging
from unittest.mock import MagicMock, patch

import pytest
import torch
from helpers.checkpoints import tiny_shards, upload, write_checkpoint
from helpers.engine import (
    STOPPED,
    CountingAdapter,
    RecordingModel,
    StopBeforeStreaming,
    make_context,
    mocked_register_tensors,
    model_config,
    one_attempt,
    vllm_config,
)
from modelexpress import envs
from modelexpress.adapter import EngineAdapter, StrategyFailed
from modelexpress.load_strategy import LoadStrategyChain
from modelexpress.load_strategy.context import LoadResult

from mx_strategies import activation
from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.testing.loopback import S3_ENV, free_port


def _context(mc=None, adapter=None, **kwargs):
    return make_context(mc or model_config(), adapter or CountingAdapter(lambda: None), **kwargs)


def _tracked_model(reference):
    """A stand-in model whose ``load_weights`` is also a mock, to count calls as upstream does."""
    model = RecordingModel(reference)
    model.load_weights = MagicMock(side_effect=model.load_weights)
    return model


# -- TestModelStreamerIsAvailable ------------------------------------------------------

AVAILABLE_URIS = [
    "s3://bucket/model",  # test_available_with_s3_uri
    "/models/deepseek",  # test_available_with_local_path_env
    "gs://bucket/model",  # test_available_with_gcs_uri
    "/models/deepseek-ai/DeepSeek-V3",  # test_available_with_local_path
    "deepseek-ai/DeepSeek-V3",  # test_available_with_hf_model_id: the gate does not probe (the load rejects it)
]


@pytest.mark.parametrize("uri", AVAILABLE_URIS)
def test_available_with_a_model_uri(monkeypatch, uri):
    monkeypatch.setenv("MX_MODEL_URI", uri)
    with patch("importlib.util.find_spec", return_value=MagicMock()):
        assert RobustModelStreamerStrategy().is_available(_context()) is True


def test_available_without_a_model_uri(caplog):
    """By design, not upstream (whose model_streamer is gated on MX_MODEL_URI): MX_STRATEGY alone switches robust on,
    and its chain streams the engine's own model_weights/model. Offered quietly."""
    with patch("importlib.util.find_spec", return_value=MagicMock()), caplog.at_level(logging.INFO):
        assert RobustModelStreamerStrategy().is_available(_context()) is True
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_gate_kept_by_setting_warns_what_to_set(monkeypatch, caplog):
    """MX_ROBUST_REQUIRE_MODEL_URI=true keeps upstream's gate: without MX_MODEL_URI robust is not offered, and the
    load says so in one warning line naming what to set (never silently)."""
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "true")
    with patch("importlib.util.find_spec", return_value=MagicMock()), caplog.at_level(logging.INFO):
        assert RobustModelStreamerStrategy().is_available(_context()) is False
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "[Worker 0] robust_model_streamer is switched on but not offered: MX_ROBUST_REQUIRE_MODEL_URI=true and "
        "MX_MODEL_URI is unset: set MX_MODEL_URI to the checkpoint, or unset MX_ROBUST_REQUIRE_MODEL_URI; "
        "ModelExpress's next strategy loads without robust's checks"
    ]
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/model")
    with patch("importlib.util.find_spec", return_value=MagicMock()):
        assert RobustModelStreamerStrategy().is_available(_context()) is True


def test_unavailable_without_the_runai_package(monkeypatch):
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/model")
    with patch("importlib.util.find_spec", return_value=None):
        assert RobustModelStreamerStrategy().is_available(_context()) is False


def test_mx_model_uri_as_a_gate_leaves_the_engine_uri_in_charge(monkeypatch, tmp_path):
    """Upstream's test_resolve_model_streamer_uri_keeps_mx_model_uri_as_gate.

    ``MX_MODEL_URI=1`` only switches the strategy on; the checkpoint comes
    from the engine's ``model_weights``. Here that is the source chain's
    default order (model_weights, model, MX_MODEL_URI).
    """
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", "1")
    mc = model_config(model="deepseek-ai/DeepSeek-V3", model_weights=ckpt.path)
    model = RecordingModel(ckpt.reference)
    result = one_attempt(RobustModelStreamerStrategy(), model, _context(mc, CountingAdapter(lambda: model)))
    assert result.metadata["robust_model_streamer"]["source_label"] == "model_weights"
    assert result.metadata["robust_model_streamer"]["source"] == ckpt.path
    assert sorted(model.order) == sorted(ckpt.reference)


# -- TestModelStreamerLoad ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["s3", "local"])  # test_success_path_s3, test_success_path_local_uses_context_uri
def test_success_path(monkeypatch, request, tmp_path, kind):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    uri = upload(request.getfixturevalue("s3"), ckpt.path, "model") if kind == "s3" else ckpt.path
    monkeypatch.setenv("MX_MODEL_URI", uri)
    model = _tracked_model(ckpt.reference)
    ctx = _context(adapter=CountingAdapter(lambda: model))

    with mocked_register_tensors() as mock_register:
        result = one_attempt(RobustModelStreamerStrategy(), model, ctx)  # a bare model, as upstream passes it

    assert isinstance(result, LoadResult)
    assert result.model is model
    assert result.metadata["robust_model_streamer"]["source"] == uri  # upstream: _stream_weights got the URI
    model.load_weights.assert_called_once()  # the stand-in declines the dry run (supports_dry_run = False)
    mock_register.assert_called_once_with(result, ctx)


def test_mx_model_uri_wins_over_model_config_when_ordered_first(monkeypatch, tmp_path):
    """Upstream's test_context_uri_wins_over_model_config, which differs by design.

    Upstream streams its URI and never looks at ``model_weights``/``model``.
    The subclass walks a chain, by default ``model_weights``, ``model``,
    ``MX_MODEL_URI`` (vLLM's own URI first: for a draft on vLLM <= 0.28
    MX_MODEL_URI is the only one holding weights, for a target model_weights
    is the one vLLM pulled). ``MX_ROBUST_SOURCE_ORDER`` puts MX_MODEL_URI
    first, which is upstream's precedence.
    """
    from_context = write_checkpoint(str(tmp_path / "from-context"), tiny_shards(2, seed=1))
    from_config = write_checkpoint(str(tmp_path / "from-config"), tiny_shards(2, seed=2))
    monkeypatch.setenv("MX_MODEL_URI", from_context.path)
    mc = model_config(model=str(tmp_path / "ignored"), model_weights=from_config.path)

    def source(order=None):
        if order:
            monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", order)
        model = RecordingModel(from_context.reference)
        result = one_attempt(RobustModelStreamerStrategy(), model, _context(mc, CountingAdapter(lambda: model)))
        return result.metadata["robust_model_streamer"]["source"]

    assert source() == from_config.path  # by design: the engine's model_weights first
    assert source("MX_MODEL_URI,model_weights,model") == from_context.path  # upstream's precedence


def test_raises_strategy_failed_on_error(monkeypatch):
    """A store that cannot be reached: StrategyFailed, not mutated, nothing registered."""
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens: connection fails
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "1")
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/model")
    model = MagicMock()

    with mocked_register_tensors() as mock_register:
        with pytest.raises(StrategyFailed, match="s3://bucket/model: listing failed") as exc:
            one_attempt(RobustModelStreamerStrategy(), model, _context())

    assert exc.value.mutated is False
    mock_register.assert_not_called()
    model.load_weights.assert_not_called()


class PartialLoad(CountingAdapter):
    """apply_weight_iter fails after the model took one tensor."""

    def apply_weight_iter(self, result, weights_iter):
        result.model.load_weights(iter([next(iter(weights_iter))]))
        raise RuntimeError("partial load")


class RefusesAtOnce(CountingAdapter):
    def apply_weight_iter(self, result, weights_iter):
        raise RuntimeError("partial load")


class PostLoadFails(CountingAdapter):
    def after_weight_iter_load(self, result):
        raise RuntimeError("post load")


def _failed_load(monkeypatch, tmp_path, adapter_cls, match: str):
    """One load from a real checkpoint with ``adapter_cls``; (StrategyFailed, model, register_tensors mock)."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    model = RecordingModel(ckpt.reference)
    with mocked_register_tensors() as mock_register:
        with pytest.raises(StrategyFailed, match=match) as exc:
            one_attempt(RobustModelStreamerStrategy(), model, _context(adapter=adapter_cls(lambda: model)))
    return exc.value, model, mock_register


def test_apply_weight_iter_failure_is_mutated(monkeypatch, tmp_path):
    error, model, mock_register = _failed_load(monkeypatch, tmp_path, PartialLoad, "partial load")
    assert error.mutated is True
    assert len(model.order) == 1
    mock_register.assert_not_called()


def test_apply_weight_iter_failure_before_any_tensor_is_mutated(monkeypatch, tmp_path):
    """Upstream's rule (ModelExpress 0.7.0's test_apply_weight_iter_failure_is_mutated: an adapter that raises at once,
    the iterator untouched, is mutated=True). robust used to answer False here, as no tensor had reached the model;
    but the engine's code had run, and a load_weights that changes the model before its first tensor would then have
    been served without the chain's rebuild."""
    error, model, mock_register = _failed_load(monkeypatch, tmp_path, RefusesAtOnce, "partial load")
    assert error.mutated is True
    assert model.order == []
    mock_register.assert_not_called()


def test_after_weight_iter_failure_is_mutated(monkeypatch, tmp_path):
    error, _, mock_register = _failed_load(monkeypatch, tmp_path, PostLoadFails, "post load")
    assert error.mutated is True
    mock_register.assert_not_called()


# -- TestStreamWeights ------------------------------------------------------------------------


def test_streams_itself_instead_of_delegating_to_the_adapter(monkeypatch, tmp_path):
    """Upstream's test_delegates_to_adapter_without_cloning, which differs by design.

    The parent hands streaming to ``adapter.build_model_streamer_weight_iter``
    (vLLM's runai loader). The subclass streams the plan itself, so it needs
    only ``apply_weight_iter``: it never calls the adapter's iterator, and an
    adapter without one (SGLang's, scripts') can still use it. What upstream
    checks of the delegation (the tensor reaches the engine as the stream
    made it, no clone) is checked here as: runai's owned tensors, handed on
    unchanged (tests/test_streaming.py ``test_streamed_tensors_are_owned``).
    """
    assert RobustModelStreamerStrategy.requires == (EngineAdapter.apply_weight_iter,)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    adapter = CountingAdapter(lambda: None)
    adapter.build_model_streamer_weight_iter = MagicMock(side_effect=AssertionError("not to be called"))
    model = RecordingModel(ckpt.reference)

    one_attempt(RobustModelStreamerStrategy(), model, _context(adapter=adapter))

    adapter.build_model_streamer_weight_iter.assert_not_called()
    assert sorted(model.order) == sorted(ckpt.reference)


class OnlyAppliesWeights(EngineAdapter):
    """An adapter implementing apply_weight_iter and nothing streaming-specific."""

    def apply_weight_iter(self, result, weights_iter):
        result.model.load_weights(weights_iter)
        return result


def test_an_adapter_without_a_streamer_iterator_is_eligible(monkeypatch):
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/model")
    ctx = _context(adapter=OnlyAppliesWeights())
    assert RobustModelStreamerStrategy().is_available(ctx) is True
    from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

    assert ModelStreamerStrategy().is_available(ctx) is False  # the parent needs the adapter's iterator


# -- TestVllmModelStreamerIterator: the runai options the parent's vLLM path sets -----------------


def _stopped_load(monkeypatch, tmp_path, *, tp, extra=None):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    StopBeforeStreaming.seen = []
    adapter = CountingAdapter(lambda: None, vllm_config=vllm_config(tp=tp, extra=extra))
    with pytest.raises(StrategyFailed, match=STOPPED):
        StopBeforeStreaming().load(RecordingModel(ckpt.reference), _context(adapter=adapter))
    (seen,) = StopBeforeStreaming.seen
    return seen


def test_enables_distributed_streaming_at_tensor_parallel_8(monkeypatch, tmp_path):
    """Upstream's test_uses_vllm_native_iterator_and_enables_distributed (``distributed: True``)."""
    monkeypatch.setenv("MX_MS_DISTRIBUTED", "1")
    assert _stopped_load(monkeypatch, tmp_path, tp=8)["distributed"] is True


def test_preserves_existing_extra_config_when_distributed_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("MX_MS_DISTRIBUTED", "1")
    seen = _stopped_load(monkeypatch, tmp_path, tp=1, extra={"concurrency": 4})
    assert seen["distributed"] is False
    assert dict(seen["engine"].loader_extra_config) == {"concurrency": 4}
    # ... and runai gets it, as vLLM's loader would pass it (tests/test_streaming.py checks the variables in force).


def test_distributed_default_is_modelexpress_own(monkeypatch, tmp_path):
    """Upstream's test_distributed_disabled_by_default_even_with_tp_gt_one, against the installed ModelExpress.

    Newer upstream releases default MX_MS_DISTRIBUTED to off; 0.7.0 to on.
    The subclass reads the variable through ``modelexpress.envs``, so its
    default is whatever the installed ModelExpress says.
    """
    monkeypatch.delenv("MX_MS_DISTRIBUTED", raising=False)
    seen = _stopped_load(monkeypatch, tmp_path, tp=8, extra={"concurrency": 4})
    assert seen["distributed"] is envs.MX_MS_DISTRIBUTED
    assert dict(seen["engine"].loader_extra_config) == {"concurrency": 4}


# -- TestChainOrder ----------------------------------------------------------------------------------

ALWAYS = "modelexpress.load_strategy.{}.is_available"
UPSTREAM_STRATEGIES = {
    "rdma": "rdma_strategy.RdmaStrategy",
    "server_cache": "server_cache_strategy.ServerCacheStrategy",
    "instant_tensor": "instant_tensor_strategy.InstantTensorStrategy",
    "gds": "gds_strategy.GdsStrategy",
    "default": "default_strategy.DefaultStrategy",
}
OFF = ("server_cache", "instant_tensor")  # not in upstream's test (newer upstream has no such strategies)


def _run_tracked_chain(robust_available: bool) -> list[str]:
    call_order: list[str] = []

    def track_load(strategy_name):
        def _load(self_or_model, *args, **kwargs):
            call_order.append(strategy_name)
            if strategy_name != "default":
                raise StrategyFailed(f"{strategy_name} miss")
            return args[0]

        return _load

    patches = []
    for name, path in UPSTREAM_STRATEGIES.items():
        patches.append(patch(f"modelexpress.load_strategy.{path}.is_available", return_value=name not in OFF))
        patches.append(patch(f"modelexpress.load_strategy.{path}.load", track_load(name)))
    patches.append(patch.object(RobustModelStreamerStrategy, "is_available", return_value=robust_available))
    patches.append(patch.object(RobustModelStreamerStrategy, "load", track_load("robust_model_streamer")))
    activation.install(RobustModelStreamerStrategy)
    for p in patches:
        p.start()
    try:
        LoadStrategyChain.run(MagicMock(), _context())
    finally:
        for p in reversed(patches):
            p.stop()
    return call_order


def test_robust_takes_model_streamers_place_in_the_chain():
    """Upstream's test_model_streamer_in_chain: rdma, model_streamer, gds, default."""
    assert _run_tracked_chain(robust_available=True) == ["rdma", "robust_model_streamer", "gds", "default"]


def test_skips_unavailable_strategy():
    assert _run_tracked_chain(robust_available=False) == ["rdma", "gds", "default"]


def test_runai_is_installed_here():
    """The availability tests patch find_spec; the load tests need the real package."""
    assert importlib.util.find_spec("runai_model_streamer") is not None
    assert torch.__version__
