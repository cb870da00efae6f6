"""What the strategy reads from the engine (:mod:`mx_strategies.engine`), and MX_MS_DISTRIBUTED.

The draft marker is ModelExpress's rule (a speculative config *and*
``runner_type == "draft"``); parallel sizes come from the adapter-built
``SourceIdentity`` first, so an SGLang-like context without ``vllm_config``
streams distributed too; ``MX_MS_DISTRIBUTED`` is ModelExpress's variable,
read through ``modelexpress.envs`` with its parsing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers.checkpoints import tiny_shards, write_checkpoint
from helpers.engine import (
    STOPPED,
    CountingAdapter,
    StopBeforeStreaming,
    direct_load,
    make_context,
    model_config,
    sglang_context,
    vllm_config,
)
from modelexpress import envs

from mx_strategies import activation
from mx_strategies.engine import EngineView, engine_view, is_speculative_draft
from mx_strategies.robust import RobustModelStreamerStrategy


def view(mc=None, vcfg=None, **context):
    adapter = CountingAdapter(lambda: None, vllm_config=vcfg)
    return engine_view(make_context(mc or model_config(), adapter, **context))


# -- the draft marker ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, runner_type, is_draft",
    [
        ("mtp", "draft", True),
        ("eagle", "draft", True),
        ("mtp", "generate", False),  # the target of a speculative load
        (None, "draft", False),  # no speculative config: ModelExpress's adapter says target
        (None, "generate", False),
    ],
)
def test_draft_needs_a_speculative_config_and_the_draft_runner(method, runner_type, is_draft):
    engine = view(model_config(runner_type=runner_type), vllm_config(method))
    assert engine.is_draft is is_draft
    assert engine.role == ("draft" if is_draft else "target")
    assert engine.speculative_method == method


def test_draft_rule_matches_modelexpress_vllm_adapter():
    """Our rule and ModelExpress's own ``_is_speculative_draft`` agree on every combination."""
    adapter_module = pytest.importorskip("modelexpress.engines.vllm.adapter")
    theirs = getattr(adapter_module, "_is_speculative_draft", None)
    if theirs is None:
        pytest.skip("this ModelExpress has no _is_speculative_draft")
    for method in (None, "mtp"):
        for runner_type in ("draft", "generate", None):
            vcfg, mc = vllm_config(method), model_config(runner_type=runner_type)
            assert is_speculative_draft(vcfg, mc) is bool(theirs(vcfg, mc)), (method, runner_type)


@pytest.mark.parametrize(
    "method, is_mtp", [("mtp", True), ("deepseek_mtp", True), ("qwen3_next_mtp", True), ("eagle", False), (None, False)]
)
def test_mtp_methods(method, is_mtp):
    assert EngineView(True, method, (), 1, 1, None, {}).is_mtp is is_mtp


def test_target_uris_come_from_the_speculative_target_config():
    target = model_config(model="/cache/target", model_weights="s3://bucket/target")
    engine = view(model_config(runner_type="draft"), vllm_config("mtp", target))
    assert engine.target_uris == ("s3://bucket/target", "/cache/target")


# -- parallel sizes --------------------------------------------------------------------------


def test_parallel_sizes_from_vllm_config_when_the_identity_has_none():
    engine = view(vcfg=vllm_config(tp=4, pp=2))
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (4, 2)
    assert engine.shares_target_weights is False


def test_parallel_sizes_from_the_identity_first():
    engine = view(vcfg=vllm_config(tp=4, pp=2), identity={"tensor_parallel_size": 8, "pipeline_parallel_size": 1})
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (8, 1)


def test_parallel_sizes_of_an_sglang_like_context_without_vllm_config():
    adapter = CountingAdapter(lambda: None)  # no vllm_config at all
    engine = engine_view(sglang_context(SimpleNamespace(model_path="/models/tiny"), adapter, tp=2, pp=2))
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (2, 2)
    assert engine.is_draft is False and engine.hf_config is None and engine.loader_extra_config == {}


def test_parallel_sizes_default_to_one():
    engine = view()
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (1, 1)


# -- loader options -------------------------------------------------------------------------


def test_loader_extra_config_from_the_adapters_load_config_first():
    adapter = CountingAdapter(lambda: None, vllm_config=vllm_config(extra={"concurrency": 1}))
    adapter.load_config = SimpleNamespace(model_loader_extra_config={"concurrency": 2})
    assert engine_view(make_context(model_config(), adapter)).loader_extra_config == {"concurrency": 2}
    assert view(vcfg=vllm_config(extra={"concurrency": 1})).loader_extra_config == {"concurrency": 1}
    assert view(vcfg=vllm_config(extra="not a mapping")).loader_extra_config == {}


# -- MX_MS_DISTRIBUTED: ModelExpress's variable, ModelExpress's parsing --------------------------


@pytest.mark.parametrize(
    "value, parsed",
    [("1", True), ("true", True), ("TRUE", True), ("True", True), ("0", False), ("false", False),
     ("yes", False), ("on", False), ("enabled", False), ("", False)],
)  # fmt: skip
def test_mx_ms_distributed_is_parsed_by_modelexpress_envs(monkeypatch, value, parsed):
    monkeypatch.setenv("MX_MS_DISTRIBUTED", value)
    assert envs.MX_MS_DISTRIBUTED is parsed


def test_mx_ms_distributed_defaults_to_true_and_never_fails_activation(monkeypatch):
    assert envs.MX_MS_DISTRIBUTED is True
    monkeypatch.setenv("MX_MS_DISTRIBUTED", "enabled")  # accepted (as false) by ModelExpress: so by us
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    assert activation.activate() is RobustModelStreamerStrategy


@pytest.mark.parametrize(
    "value, tp, distributed", [("1", 2, True), ("true", 2, True), ("yes", 2, False), ("on", 2, False), ("1", 1, False)]
)
def test_an_sglang_like_load_streams_distributed_as_modelexpress_says(monkeypatch, tmp_path, value, tp, distributed):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_MS_DISTRIBUTED", value)
    StopBeforeStreaming.seen = []

    attempt = direct_load(
        model_config(),
        ckpt.reference,
        strategy_cls=StopBeforeStreaming,
        ctx_factory=lambda mc, adapter: sglang_context(mc, adapter, tp=tp),
    )

    assert str(attempt.error) == STOPPED
    assert [load["distributed"] for load in StopBeforeStreaming.seen] == [distributed]
    assert StopBeforeStreaming.seen[0]["engine"].tensor_parallel_size == tp
