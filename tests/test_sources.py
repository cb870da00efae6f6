"""Source resolution: which candidate holds the checkpoint, and why the others were passed over.

Unit tests of :mod:`mx_strategies.inspect.sources` (the candidates, in order) and the
chain through the real strategy: config-only copies, hub ids, missing
folders, unreachable endpoints and missing buckets are rejected with a
reason before the model is touched; the first candidate holding a
non-empty shard is chosen.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from helpers.checkpoints import tiny_shards, upload, write_checkpoint
from helpers.engine import (
    assert_loaded,
    chain_load,
    direct_load,
    failed_chain,
    model_config,
    robust_messages,
    untouched,
)

from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, candidates
from mx_strategies.testing.loopback import S3_ENV, free_port
from mx_strategies.testing.synthetic import config_only_copy

# -- candidates ------------------------------------------------------------------------


def test_candidates_follow_the_source_order_skipping_unset_and_repeats(monkeypatch):
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/model/")
    mc = model_config(model="/cache/copy", model_weights="s3://bucket/model")
    assert candidates(mc, load_settings()) == [
        Candidate("model_weights", "s3://bucket/model"),
        Candidate("model", "/cache/copy"),
    ]  # MX_MODEL_URI names model_weights again (a trailing slash is no other source)
    monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", "MX_MODEL_URI,model")
    assert candidates(mc, load_settings()) == [
        Candidate("MX_MODEL_URI", "s3://bucket/model/"),
        Candidate("model", "/cache/copy"),
    ]


def test_candidates_read_sglang_model_path():
    """SGLang's ModelConfig names the checkpoint ``model_path``."""
    assert candidates(SimpleNamespace(model_path="/models/tiny"), load_settings()) == [Candidate("model", "/models/tiny")]


# -- the chain through the strategy ------------------------------------------------------


def test_config_only_copy_falls_through_to_s3(monkeypatch, s3, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, empty=(2,)))
    uri = upload(s3, ckpt.path, "tiny")
    cache = config_only_copy(ckpt.path, str(tmp_path / "model_streamer" / "1a2b3c"))
    assert os.path.exists(os.path.join(cache, INDEX_NAME))

    model, adapter = chain_load(monkeypatch, uri, ckpt.reference, mc=model_config(model=cache))

    assert_loaded(model, ckpt)
    assert adapter.reinit_calls == 0
    trail = robust_messages(caplog)
    assert f"passed over model={cache!r}: holds {INDEX_NAME} but none of the 3 shard(s) it names" in trail
    assert f"chose MX_MODEL_URI={uri!r}" in trail


def test_model_weights_is_tried_before_model(monkeypatch, s3, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    uri = upload(s3, ckpt.path, "tiny")
    cache = config_only_copy(ckpt.path, str(tmp_path / "cache"))
    mc = model_config(model=cache, model_weights=uri)
    model, _ = chain_load(monkeypatch, str(tmp_path / "elsewhere"), ckpt.reference, mc=mc)
    assert_loaded(model, ckpt)
    assert f"target source: chose model_weights={uri!r}" in robust_messages(caplog)


def test_source_order_is_configurable(monkeypatch, caplog, tmp_path):
    first = write_checkpoint(str(tmp_path / "first"), tiny_shards(2, seed=1))
    second = write_checkpoint(str(tmp_path / "second"), tiny_shards(2, seed=2))
    monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", "MX_MODEL_URI,model")
    model, _ = chain_load(monkeypatch, second.path, second.reference, mc=model_config(model=first.path))
    assert_loaded(model, second)
    assert f"chose MX_MODEL_URI={second.path!r}" in robust_messages(caplog)


def test_hub_id_is_no_source(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference, mc=model_config(model="org/model"))
    assert_loaded(model, ckpt)
    # The re-shape gave hub-id detection one place (storage) and one message.
    assert (
        "passed over model='org/model': org/model: no such local folder "
        "(it looks like a Hugging Face hub id, which cannot be streamed)"
    ) in robust_messages(caplog)


def test_every_candidate_rejected_lists_each_and_why(monkeypatch, tmp_path):
    full = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    cache = config_only_copy(full.path, str(tmp_path / "cache"))
    hollow = write_checkpoint(str(tmp_path / "hollow"), tiny_shards(2, empty=(0, 1)))
    missing = str(tmp_path / "gone")
    monkeypatch.setenv("MX_MODEL_URI", hollow.path)
    mc = model_config(model=cache, model_weights=missing)

    attempt = direct_load(mc, full.reference)

    assert attempt.error is not None and attempt.error.mutated is False
    message = str(attempt.error)
    assert message.startswith("no candidate source holds streamable safetensors: ")
    assert f"model_weights={missing!r}: {missing}: no such local folder" in message
    assert f"model={cache!r}: holds {INDEX_NAME} but none of the 2 shard(s) it names" in message
    assert f"MX_MODEL_URI={hollow.path!r}: all 2 safetensors shard(s) are empty" in message
    assert untouched(attempt.model)

    through_chain = failed_chain(mc, full.reference)
    assert through_chain.adapter.reinit_calls == 0 and untouched(through_chain.model)


# -- object stores that cannot be reached -----------------------------------


@pytest.mark.timeout(120)  # a hang guard: one attempt with a 1 s timeout, not a timing target
def test_unreachable_endpoint_fails_cleanly_and_quickly(monkeypatch, tmp_path):
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "1")
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    uri = "s3://models/tiny"
    monkeypatch.setenv("MX_MODEL_URI", uri)
    reference = tiny_shards(1)[0]

    attempt = direct_load(model_config(), reference)

    assert attempt.error is not None and attempt.error.mutated is False
    assert f"MX_MODEL_URI={uri!r}: {uri}: listing failed" in str(attempt.error)
    assert untouched(attempt.model)

    through_chain = failed_chain(model_config(), reference)
    assert through_chain.adapter.reinit_calls == 0


@pytest.mark.timeout(120)  # a hang guard, not a timing target
def test_missing_bucket_fails_cleanly(monkeypatch, s3):
    uri = f"s3://{s3.bucket}-does-not-exist/tiny"
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    attempt = direct_load(model_config(), tiny_shards(1)[0])
    assert attempt.error is not None and attempt.error.mutated is False
    message = str(attempt.error)
    assert f"MX_MODEL_URI={uri!r}: {uri}: listing failed" in message
    assert "NoSuchBucket" in message


def test_empty_prefix_is_no_source(monkeypatch, s3):
    uri = f"s3://{s3.bucket}/nothing-here"
    monkeypatch.setenv("MX_MODEL_URI", uri)
    attempt = direct_load(model_config(), tiny_shards(1)[0])
    assert attempt.error is not None and attempt.error.mutated is False
    assert f"MX_MODEL_URI={uri!r}: no *.safetensors file (holds nothing)" in str(attempt.error)
