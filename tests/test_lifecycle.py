"""A load's end, exactly once, on every ModelExpress users run (0.7.0 and 0.8's development builds).

ModelExpress 0.8 moved post-load processing and tensor registration out of a
strategy's ``load`` into its chain's lifecycle (``prepare`` / ``load`` /
``finalize`` / ``abort``); a strategy that still did both in ``load`` ran them
twice, and twice repacks or requantizes weights already processed (seed 003).
These tests run the installed ModelExpress's real chain (``LoadStrategyChain.run``),
real runai-model-streamer and real safetensors files, and count what the user
would count: ``after_weight_iter_load`` (vLLM: ``process_weights_after_loading``)
and ``register_tensors`` per load, for targets and drafts, on success and on
fallback. CI runs this file in the main venv (0.7.0) and in the 0.8 venv
(``scripts/test.sh``). The engine side is the stand-in adapter (vLLM needs a
GPU for its own), as in ``tests/test_activation.py``.
"""

from __future__ import annotations

import ast
import logging
import os
import sys

import modelexpress.load_strategy as chain_module
import pytest
import torch
from helpers.checkpoints import reference_tensors
from helpers.engine import CHAIN_LOGGER, FolderNativeAdapter, RecordingModel, assert_got, make_context, messages
from helpers.engine import model_config, one_attempt, untouched, vllm_config
from modelexpress.adapter import StrategyFailed
from modelexpress.load_strategy import LoadResult, LoadStrategyChain

from mx_strategies import activation
from mx_strategies.modelexpress_plugin import PLUGIN_NAME, write_plugin
from mx_strategies.releases import chain_finalizes, chain_takes_plugins
from mx_strategies.observe.report import METADATA_KEY
from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.testing import synthetic

LOGGER = "modelexpress.strategy_robust_model_streamer"

ON_08 = chain_finalizes()
needs_08 = pytest.mark.skipif(not ON_08, reason="ModelExpress 0.7 has no load lifecycle, reloads or plugins")


class NativeAdapter(FolderNativeAdapter):
    """Also loads like the engine's own disk loader (``default`` is eligible), and counts every phase."""

    def __init__(self, make_model, folder: str, vllm_config=None) -> None:
        super().__init__(make_model, folder, vllm_config=vllm_config)
        self.reloads_begun = 0
        self.reloads_ended = 0

    def begin_streaming_reload(self, result: LoadResult) -> None:
        self.reloads_begun += 1

    def end_streaming_reload(self, result: LoadResult) -> None:
        self.reloads_ended += 1


class FailingPostLoad(NativeAdapter):
    """Post-load processing that fails after robust streamed (the chain must rebuild, then fall back)."""

    def after_weight_iter_load(self, result: LoadResult) -> LoadResult:
        self.after_load_calls += 1
        raise RuntimeError("repacking failed")


@pytest.fixture
def registrations(monkeypatch):
    """Every call of ModelExpress's ``register_tensors``, under whatever name a module holds it (it still runs)."""
    import modelexpress.load_strategy.default_strategy  # noqa: F401  the chain imports it when it runs
    import modelexpress.load_strategy.model_streamer_strategy  # noqa: F401

    calls = []
    original = chain_module.register_tensors

    def counted(result, ctx, **kwargs):
        calls.append(ctx.global_rank)
        return original(result, ctx, **kwargs)

    for name, module in list(sys.modules.items()):
        # ModelExpress's modules and ours only: other packages' lazy modules import on attribute access.
        if name.startswith(("modelexpress", "mx_strategies")) and getattr(module, "register_tensors", None) is original:
            monkeypatch.setattr(module, "register_tensors", counted)
    return calls


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    """A small DeepSeek-style MTP checkpoint that MX_MODEL_URI points at, robust installed by MX_STRATEGY."""
    made = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", hidden=16, vocab=32, dtype=torch.float32)
    monkeypatch.setenv("MX_MODEL_URI", made.path)
    monkeypatch.setenv("MX_ROBUST_TARGET_SELECTION", "all")  # a target streams the MTP layer too: every tensor
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    return made


def _chain(ckpt, *, model_path=None, draft=False, adapter_cls=NativeAdapter, reload=False):
    """The installed ModelExpress's chain; the engine's own loader (``default``) reads ``ckpt``'s folder."""
    names = ckpt.draft_names if draft else None
    make = lambda: RecordingModel(ckpt.tensors, names)  # noqa: E731
    adapter = adapter_cls(make, ckpt.path, vllm_config=vllm_config("mtp") if draft else None)
    mc = model_config(model=model_path or ckpt.path, runner_type="draft" if draft else "generate")
    ctx = make_context(mc, adapter, draft=draft)
    if reload:
        ctx.is_reload = True
    model = make()
    return LoadStrategyChain.run(model, ctx), model, adapter


def _eligible(caplog) -> list[str]:
    (line,) = [m for m in messages(caplog, CHAIN_LOGGER, level=logging.NOTSET) if m.startswith("Eligible loaders: ")]
    return ast.literal_eval(line[len("Eligible loaders: ") :])


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_load_runs_post_processing_and_registration_exactly_once(ckpt, registrations, role):
    loaded, _, adapter = _chain(ckpt, draft=role == "draft")

    assert adapter.after_load_calls == 1
    assert registrations == [0]
    assert adapter.native_calls == 0 and adapter.reinit_calls == 0
    expected = ckpt.draft_names if role == "draft" else ckpt.tensors
    assert_got(loaded, expected, reference_tensors(ckpt.path))


def test_the_report_rides_on_the_result(ckpt):
    """The load report is on the result the chain hands back (0.8: written in finalize, after load)."""
    make = lambda: RecordingModel(ckpt.tensors)  # noqa: E731
    adapter = NativeAdapter(make, ckpt.path)
    model = make()
    result = one_attempt(RobustModelStreamerStrategy(), LoadResult(value=model, model=model), make_context(model_config(model=ckpt.path), adapter))
    report = result.metadata[METADATA_KEY]
    assert report["role"] == "target" and report["tensors"] == len(ckpt.tensors)
    assert report["timings"]["post_load"] >= 0 and adapter.after_load_calls == 1


def test_a_refusal_before_streaming_falls_back_with_one_registration(ckpt, registrations, tmp_path, monkeypatch):
    """robust finds no safetensors in its sources: it refuses untouched, the engine's own loader loads once."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("MX_MODEL_URI", str(empty))

    loaded, model, adapter = _chain(ckpt, model_path=str(empty))

    assert adapter.after_load_calls == 0  # robust never reached post-processing
    assert adapter.native_calls == 1 and adapter.reinit_calls == 0
    assert loaded is model  # nothing was rebuilt: mutated=False
    assert registrations == [0]
    assert_got(loaded, ckpt.tensors, reference_tensors(ckpt.path))


def test_post_processing_that_fails_rebuilds_the_model_and_falls_back(ckpt, registrations, caplog):
    caplog.set_level(logging.INFO)
    loaded, model, adapter = _chain(ckpt, adapter_cls=FailingPostLoad)

    assert adapter.after_load_calls == 1  # tried once, never again
    assert adapter.reinit_calls == 1 and loaded is not model  # mutated=True: ModelExpress rebuilt the model
    assert adapter.native_calls == 1
    assert registrations == [0]  # the fallback's registration only
    assert any("post-load processing failed: repacking failed" in m for m in messages(caplog, CHAIN_LOGGER))
    assert_got(loaded, ckpt.tensors, reference_tensors(ckpt.path))


@needs_08
def test_a_reload_refits_through_robust_entering_and_leaving_the_reload_once(ckpt, registrations, caplog):
    """ModelExpress 0.8's reload (``is_reload``) through robust (stand-in engine: tests/test_refit.py runs vLLM's real
    classes and layerwise reload): the reload is entered and left once each, no post-load pass on top of it, every
    tensor streamed by robust, the report says refit, registration once."""
    caplog.set_level(logging.INFO)
    loaded, model, adapter = _chain(ckpt, reload=True)

    assert not [m for m in messages(caplog, CHAIN_LOGGER) if "robust_model_streamer failed" in m]
    assert adapter.reloads_begun == adapter.reloads_ended == 1
    assert adapter.after_load_calls == 0 and adapter.reinit_calls == 0 and adapter.native_calls == 0
    assert loaded is model and registrations == [0]
    assert_got(loaded, ckpt.tensors, reference_tensors(ckpt.path))
    assert any(m.startswith("[Worker 0] target refitted from ") for m in messages(caplog, LOGGER))


@needs_08
def test_a_refit_refused_before_the_reload_stops_the_chain_untouched(ckpt, tmp_path, monkeypatch):
    """No safetensors at the new revision nor at MX_MODEL_URI: robust refuses in prepare, before the reload is
    entered; the chain stops there (StrategyRecoveryError: no later link refits), nothing written."""
    from modelexpress.adapter import StrategyRecoveryError

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("MX_MODEL_URI", str(empty))
    make = lambda: RecordingModel(ckpt.tensors)  # noqa: E731
    adapter = NativeAdapter(make, ckpt.path)
    ctx = make_context(model_config(model=str(empty)), adapter)
    ctx.is_reload = True
    model = make()
    with pytest.raises(StrategyRecoveryError) as refused:
        LoadStrategyChain.run(model, ctx)
    assert refused.value.mutated is False
    assert str(refused.value).startswith(f"target refit to {empty} refused before the live model was touched (the live "
                                         f"model keeps every weight of the previous revision): ")  # fmt: skip
    assert untouched(model) and adapter.reloads_begun == 0 and adapter.native_calls == 0


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    """robust's plugin file in a folder of its own, named by MX_PLUGIN_DIR; ModelExpress's plugin registry emptied."""
    import modelexpress.plugins as plugins

    folder = tmp_path / "plugins"
    write_plugin(folder)
    monkeypatch.setattr(plugins, "plugins", {})
    monkeypatch.setattr(plugins, "_loaded_directories", {})
    monkeypatch.setenv("MX_PLUGIN_DIR", str(folder))
    monkeypatch.setenv("MX_LOAD_PLUGIN", PLUGIN_NAME)
    monkeypatch.setenv("MX_LOAD_PLUGIN_BEFORE", "model_streamer")
    return folder


@needs_08
@pytest.mark.parametrize("also_mx_strategy", [False, True], ids=["plugin", "plugin+MX_STRATEGY"])
def test_the_08_plugin_puts_robust_in_the_chain_once(tmp_path, plugin_folder, registrations, caplog, monkeypatch,
                                                      also_mx_strategy):  # fmt: skip
    assert chain_takes_plugins()
    made = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", hidden=16, vocab=32, dtype=torch.float32)
    monkeypatch.setenv("MX_MODEL_URI", made.path)
    monkeypatch.setenv("MX_ROBUST_TARGET_SELECTION", "all")
    if also_mx_strategy:
        monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
        activation.register()
    caplog.set_level(logging.INFO)

    loaded, _, adapter = _chain(made)

    # robust where model_streamer stood, once; the plain streamer is out of the chain.
    assert _eligible(caplog) == [PLUGIN_NAME, "default"]
    assert any(f"Loaded loading strategy plugin {PLUGIN_NAME!r}" in r.getMessage() for r in caplog.records)
    assert adapter.after_load_calls == 1 and registrations == [0] and adapter.native_calls == 0
    assert_got(loaded, made.tensors, reference_tensors(made.path))


@needs_08
def test_without_the_plugin_08_keeps_its_own_chain(tmp_path, caplog, monkeypatch):
    """MX_STRATEGY unset, no plugin: ModelExpress 0.8 runs its own model_streamer, untouched by us."""
    made = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", hidden=16, vocab=32, dtype=torch.float32)
    monkeypatch.setenv("MX_MODEL_URI", made.path)
    caplog.set_level(logging.INFO)
    _chain(made)
    assert _eligible(caplog) == ["model_streamer", "default"]


@needs_08
def test_on_08_a_draft_is_published_by_the_chain_and_robust_leaves_its_identity(ckpt, registrations):
    """0.8 marks a draft's context (``p2p_role="draft"``) and its finalize registers the draft's tensors under
    ``draft_tensor_namespace`` into the target's publication: robust touches neither the flag nor the identity."""
    names = ckpt.draft_names
    make = lambda: RecordingModel(ckpt.tensors, names)  # noqa: E731
    adapter = NativeAdapter(make, ckpt.path, vllm_config=vllm_config("mtp"))
    ctx = make_context(model_config(model=ckpt.path, runner_type="draft"), adapter)
    ctx.p2p_role = "draft"
    identity = ctx.identity.SerializeToString()

    LoadStrategyChain.run(make(), ctx)

    assert registrations == [0] and adapter.after_load_calls == 1
    assert ctx.p2p_enabled is True and ctx.p2p_role == "draft"
    assert ctx.identity.SerializeToString() == identity
