"""MTP drafts stream only their own tensors, into the module the engine built.

The bug reports (shared/seeds): on vLLM <= 0.28 the draft's ModelConfig points
at the config-only ``model_streamer/<hash>`` folder with no model_weights, so
the draft load finds no safetensors; upstream ModelExpress streams the whole
checkpoint into the draft when it does find it. Every test here runs the real
modelexpress chain, real runai-model-streamer and, where it says S3, the real
loopback S3 server; only the engine's model is a stand-in (vLLM cannot build
one on CPU), and it is strict: a tensor it does not own fails the load.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers.checkpoints import reference_tensors
from helpers.engine import (
    CountingAdapter,
    RecordingModel,
    make_context,
    model_config,
    run_chain,
    vllm_config,
)
from helpers.engine import assert_got as assert_loaded  # exactly these names, each once, equal to the reference
from helpers.headers import metadata_bytes
from modelexpress.adapter import StrategyFailed
from modelexpress.load_strategy import LoadResult, LoadStrategyChain

from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.testing.synthetic import config_only_copy, mtp_checkpoint, write_shards


@pytest.fixture(params=["qwen", "deepseek"])
def style(request):
    return request.param


def checkpoint(tmp_path, style, **kwargs):
    return mtp_checkpoint(str(tmp_path / "ckpt"), style=style, empty_shards=(1,), **kwargs)


def on_s3(ck, s3, monkeypatch, prefix: str = "tiny") -> str:
    """Upload ``ck`` to the test bucket and point MX_MODEL_URI at it; return the URI."""
    uri = s3.upload(ck.path, s3.bucket, prefix)
    monkeypatch.setenv("MX_MODEL_URI", uri)
    return uri


def run_draft(mc, ck, *, vcfg=None, names=None):
    names = ck.draft_names if names is None else names
    return run_chain(mc, ck.tensors, names, vcfg=vcfg or vllm_config("mtp"), draft=True)


# -- vLLM <= 0.28: draft model = config-only cache dir, no model_weights ---------


def test_draft_from_config_only_folder_falls_through_to_s3(tmp_path, style, s3, robust, monkeypatch, caplog):
    ck = checkpoint(tmp_path, style)
    uri = on_s3(ck, s3, monkeypatch, "GLM-tiny")
    cache = config_only_copy(ck.path, str(tmp_path / "model_streamer" / "d7905c16"))

    caplog.set_level("INFO")
    model, adapter = run_draft(model_config(model=cache, runner_type="draft"), ck)

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))
    assert adapter.reinit_calls == 0
    assert adapter.after_load_calls == 1
    trail = [r.getMessage() for r in caplog.records if "draft source:" in r.getMessage()]
    assert trail and f"passed over model={cache!r}" in trail[0] and f"chose MX_MODEL_URI={uri!r}" in trail[0]
    expected_convention = "mtp" if style == "qwen" else "nextn_layers"
    report = [r.getMessage() for r in caplog.records if "draft loaded from" in r.getMessage()]
    assert report and f"convention {expected_convention}:" in report[0]
    assert f"{len(ck.draft_names)} tensors verified" in report[0]


def test_draft_from_config_only_folder_falls_through_to_local_checkpoint(tmp_path, style, robust, monkeypatch):
    ck = checkpoint(tmp_path, style)
    monkeypatch.setenv("MX_MODEL_URI", ck.path)
    cache = config_only_copy(ck.path, str(tmp_path / "cache"))

    model, adapter = run_draft(model_config(model=cache, runner_type="draft"), ck)

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))
    assert adapter.reinit_calls == 0


# -- vLLM >= 0.29: draft gets target.model_weights or target.model ------------------


def test_draft_with_vllm_029_config(tmp_path, style, s3, robust, monkeypatch):
    ck = checkpoint(tmp_path, style)
    uri = on_s3(ck, s3, monkeypatch)
    target = model_config(model=str(tmp_path / "cache"), model_weights=uri)

    model, adapter = run_draft(
        model_config(model=uri, model_weights=uri, runner_type="draft"), ck, vcfg=vllm_config("mtp", target)
    )

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))
    assert adapter.reinit_calls == 0


@pytest.mark.parametrize("selection", ["model", "all"])
def test_target_load_leaves_the_drafts_own_layers_to_the_draft(tmp_path, style, s3, robust, monkeypatch, selection):
    """The target streams every tensor but the MTP layers (Qwen3-Next: mtp.*; DeepSeek-V3:
    model.layers.{N}.*, its per-layer embedding and head copies included), which the target's
    load_weights skips and the draft streams itself; MX_ROBUST_TARGET_SELECTION=all streams everything.
    The table's rule: this stand-in model holds every tensor (its load_weights would read the MTP layers too),
    so the module is not asked here; vLLM's real targets answer for themselves in test_mtp_architectures.py.
    The config names a target of the same naming whose draft class is not built here (Qwen3.5, DeepSeek-V3.2),
    as only those keep a row; Qwen3-Next's and DeepSeek-V3's are asked."""
    monkeypatch.setenv("MX_ROBUST_TARGET_SELECTION", selection)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    ck = checkpoint(tmp_path, style)
    with open(os.path.join(ck.path, "config.json"), "w") as handle:
        json.dump(dict(ck.config, model_type="qwen3_5_text" if style == "qwen" else "deepseek_v32"), handle)
    uri = on_s3(ck, s3, monkeypatch)
    cache = config_only_copy(ck.path, str(tmp_path / "cache"))

    model, adapter = run_chain(model_config(model=cache, model_weights=uri), ck.tensors, vcfg=vllm_config("mtp"))

    mtp_layer = "mtp." if style == "qwen" else f"model.layers.{ck.config['num_hidden_layers']}."
    mine = {n for n in ck.tensors if not n.startswith(mtp_layer)}
    assert ck.draft_names and not ck.draft_names & mine
    assert_loaded(model, mine if selection == "model" else set(ck.tensors), reference_tensors(ck.path))
    assert adapter.reinit_calls == 0


# -- drafts with their own checkpoint --------------------------------------------


def test_separate_draft_checkpoint_is_loaded_whole_and_never_fed_the_target(tmp_path, s3, robust, monkeypatch):
    target = mtp_checkpoint(str(tmp_path / "target"), style="deepseek")
    monkeypatch.setenv("MX_MODEL_URI", s3.upload(target.path, s3.bucket, "target"))
    eagle_tensors = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32),
        "fc.weight": torch.randn(32, 64),
    }
    eagle_dir = str(tmp_path / "eagle")
    write_shards(eagle_dir, [eagle_tensors])
    eagle_uri = s3.upload(eagle_dir, s3.bucket, "eagle")

    for draft_model in (eagle_dir, eagle_uri):
        model, adapter = run_chain(
            model_config(model=draft_model, runner_type="draft"),
            eagle_tensors,
            vcfg=vllm_config("eagle", model_config(model_weights=target.path)),
            draft=True,
        )
        assert_loaded(model, set(eagle_tensors), eagle_tensors)
        assert adapter.reinit_calls == 0


def test_separate_draft_without_weights_does_not_fall_back_to_the_target(tmp_path, s3, monkeypatch):
    """An EAGLE draft whose own folder is empty must not be fed the target's checkpoint."""
    target = mtp_checkpoint(str(tmp_path / "target"), style="deepseek")
    monkeypatch.setenv("MX_MODEL_URI", s3.upload(target.path, s3.bucket, "target"))
    empty_draft = tmp_path / "eagle"
    empty_draft.mkdir()
    (empty_draft / "config.json").write_text("{}")
    adapter = CountingAdapter(lambda: RecordingModel({}, []), vllm_config("eagle"))
    ctx = make_context(model_config(model=str(empty_draft), runner_type="draft"), adapter, draft=True)
    model = RecordingModel({}, [])

    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)

    assert failure.value.mutated is False
    assert "draft (method eagle) has a checkpoint of its own" in str(failure.value)
    assert "only the target's checkpoint s3://" in str(failure.value)
    assert model.order == []


# -- conventions ------------------------------------------------------------------


def test_two_nextn_layers(tmp_path, s3, robust, monkeypatch):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", num_hidden_layers=4, num_nextn_layers=2)
    assert {n.split(".")[2] for n in ck.draft_names} == {"4", "5"}
    on_s3(ck, s3, monkeypatch)
    cache = config_only_copy(ck.path, str(tmp_path / "cache"))

    model, adapter = run_draft(model_config(model=cache, runner_type="draft"), ck)

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))
    assert adapter.reinit_calls == 0


def test_layer_counts_from_the_engine_when_the_checkpoint_has_no_config(tmp_path, s3, robust, monkeypatch):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", num_hidden_layers=3)
    os.remove(os.path.join(ck.path, "config.json"))
    on_s3(ck, s3, monkeypatch)
    hf_config = type("HfConfig", (), {"num_hidden_layers": 3, "num_nextn_predict_layers": 1})()

    model, adapter = run_draft(
        model_config(model=str(tmp_path / "nowhere"), runner_type="draft", hf_config=hf_config), ck
    )

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))


@pytest.mark.parametrize(
    "draft_prefix,extra",
    [("model.mtp.layers.0.", None), ("language_model.mtp_head.", "language_model.mtp_head.")],
)
def test_mtp_layers_convention_and_extra_prefixes(tmp_path, robust, monkeypatch, draft_prefix, extra):
    target = {"model.layers.0.mlp.weight": torch.randn(8, 8), "lm_head.weight": torch.randn(16, 8)}
    draft = {f"{draft_prefix}fc.weight": torch.randn(8, 16), f"{draft_prefix}norm.weight": torch.randn(8)}
    path = str(tmp_path / "ckpt")
    write_shards(path, [target, draft])
    monkeypatch.setenv("MX_MODEL_URI", path)
    if extra:
        monkeypatch.setenv("MX_ROBUST_DRAFT_EXTRA_PREFIXES", extra)
    reference = {**target, **draft}

    model, adapter = run_chain(
        model_config(model=str(tmp_path / "nowhere"), runner_type="draft"),
        reference,
        set(draft),
        vcfg=vllm_config("mtp"),
        draft=True,
    )

    assert_loaded(model, set(draft), reference)


def test_checkpoint_without_draft_tensors_fails_cleanly(tmp_path, s3, robust, monkeypatch, caplog):
    plain = {"model.layers.0.mlp.weight": torch.randn(8, 8), "lm_head.weight": torch.randn(16, 8)}
    path = str(tmp_path / "plain")
    write_shards(path, [plain])
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump({"num_hidden_layers": 1, "num_nextn_predict_layers": 1}, handle)
    uri = s3.upload(path, s3.bucket, "plain")
    monkeypatch.setenv("MX_MODEL_URI", uri)
    mc = model_config(model=str(tmp_path / "nowhere"), runner_type="draft")
    adapter = CountingAdapter(lambda: RecordingModel(plain, []), vllm_config("mtp"))
    model = RecordingModel(plain, [])

    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), make_context(mc, adapter, draft=True))

    message = str(failure.value)
    assert failure.value.mutated is False
    assert uri in message and "no draft tensor found among 2 tensors" in message
    assert "mtp (mtp.*)" in message and "model.layers.1.*" in message and "model.mtp.layers.*" in message
    assert model.order == []

    # Through the chain: nothing else can load it, and nothing was rebuilt.
    caplog.set_level("INFO")
    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        run_chain(mc, plain, [], vcfg=vllm_config("mtp"), draft=True)
    assert any("no draft tensor found" in r.getMessage() for r in caplog.records)


# -- shared embed_tokens / lm_head --------------------------------------------------


@pytest.mark.parametrize(
    "pp,policy,streams_shared",
    [(1, "auto", False), (2, "auto", True), (2, "never", False), (1, "always", True)],
)
def test_shared_weights_policy(tmp_path, robust, monkeypatch, pp, policy, streams_shared):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    monkeypatch.setenv("MX_MODEL_URI", ck.path)
    monkeypatch.setenv("MX_ROBUST_DRAFT_SHARED_WEIGHTS", policy)
    expected = ck.draft_names | (ck.shared_names if streams_shared else set())

    model, adapter = run_draft(
        model_config(model=str(tmp_path / "nowhere"), runner_type="draft"),
        ck,
        vcfg=vllm_config("mtp", pp=pp),
        names=expected,
    )

    assert_loaded(model, expected, reference_tensors(ck.path))


# -- bytes: a draft load reads about the MTP bytes, not the checkpoint ------------


def test_draft_reads_about_its_own_bytes_from_s3(tmp_path, style, s3, robust, monkeypatch):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style=style, hidden=256, num_hidden_layers=6, empty_shards=(1,))
    on_s3(ck, s3, monkeypatch, "big")
    cache = config_only_copy(ck.path, str(tmp_path / "cache"))
    draft_bytes = ck.nbytes(ck.draft_names)
    total_bytes = ck.nbytes(ck.tensors)
    metadata = metadata_bytes(ck.path)  # every shard's header, the index and config.json
    s3.proxy.reset()

    model, adapter = run_draft(model_config(model=cache, runner_type="draft"), ck)

    assert_loaded(model, ck.draft_names, reference_tensors(ck.path))
    served = s3.bytes_served
    # Headers are read twice (our probe, then runai's own request planning);
    # 32 KiB covers HTTP response headers and the listing XML.
    bound = 1.1 * draft_bytes + 2 * metadata + 32 * 1024
    assert served <= bound, (served, draft_bytes, metadata, total_bytes)
    assert served < total_bytes / 2  # far from streaming the checkpoint twice


# -- contrast: what upstream ModelExpress 0.7.0 does with the same draft ------------


def test_upstream_strategy_feeds_the_draft_the_whole_checkpoint(tmp_path, monkeypatch, caplog):
    """Without MX_STRATEGY the draft gets target tensors and the model is rebuilt."""
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek")
    monkeypatch.setenv("MX_MODEL_URI", ck.path)
    caplog.set_level("INFO")
    adapter = CountingAdapter(lambda: RecordingModel(ck.tensors, ck.draft_names), vllm_config("mtp"))
    ctx = make_context(model_config(model=str(tmp_path / "cache"), runner_type="draft"), adapter, draft=True)

    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        LoadStrategyChain.run(RecordingModel(ck.tensors, ck.draft_names), ctx)

    failures = [r.getMessage() for r in caplog.records if "Strategy model_streamer failed" in r.getMessage()]
    assert failures and "model has no parameter" in failures[0]
    fed = failures[0].split("model has no parameter ")[1].strip("'\"")
    assert fed in ck.tensors and fed not in ck.draft_names  # a target tensor reached the draft
    assert adapter.reinit_calls == 1  # and the draft module was rebuilt for nothing
