"""The robust strategy on a target load, end to end: every tensor, once, in plan order.

Everything here is real: safetensors files written to disk, moto's S3 server
on 127.0.0.1 (fixture ``s3``), runai-model-streamer reading them, and
ModelExpress's own ``LoadStrategyChain``. The only stand-in is the model
(``helpers.engine.RecordingModel``), because a vLLM model needs a GPU; it copies
every tensor it is given and records the order, as ``load_weights`` does.
"""

from __future__ import annotations

import os

import pytest
from helpers.checkpoints import (
    hf_cache,
    place,
    store_fixture,
    tiny_shards,
    upload,
    write_checkpoint,
    write_unpadded,
    written,
)
from helpers.engine import assert_loaded, chain_load, direct_load, model_config, robust_messages, run_chain, untouched

from mx_strategies import activation
from mx_strategies.observe.report import recent_reports

# -- empty shards, many shards: local and S3 --------------------------------

EMPTY_LAYOUTS = {
    "first": (5, (0,)),
    "middle": (5, (2,)),
    "last": (5, (4,)),
    "all_but_one": (5, (0, 1, 3, 4)),
    "several_of_40": (40, (0, 7, 8, 20, 39)),
}


@pytest.mark.parametrize("kind", ["local", "s3"])
@pytest.mark.parametrize("layout", sorted(EMPTY_LAYOUTS))
def test_empty_shards_are_skipped_and_every_tensor_arrives(monkeypatch, request, caplog, tmp_path, kind, layout):
    count, empty = EMPTY_LAYOUTS[layout]
    s3 = store_fixture(kind, request)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(count, empty=empty))
    uri = place(kind, ckpt, s3)

    model, adapter = chain_load(monkeypatch, uri, ckpt.reference)

    assert_loaded(model, ckpt)
    assert adapter.reinit_calls == 0 and adapter.after_load_calls == 1
    log = robust_messages(caplog)
    assert f"chose MX_MODEL_URI={uri!r}" in log
    for position in empty:
        assert f"{os.path.basename(ckpt.files[position])}: holds no tensor; skipped" in log
    assert f"{len(ckpt.reference)} tensors verified" in log


def test_forty_shards_no_index(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(40, empty=(3, 17)), index=False)
    model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
    assert_loaded(model, ckpt)


# -- the plan's shard order: independent of write/upload/listing order, natural --------

WRITE_ORDERS = [list(range(12)), list(reversed(range(12))), [5, 11, 0, 9, 2, 7, 1, 10, 3, 8, 4, 6]]


def _shard_order() -> list[str]:
    """The shards the last load streamed, in its plan's order (its load report's; tensors reach the model as
    runai's reads complete)."""
    return list(recent_reports()[-1]["shards"])


def test_same_checkpoint_written_in_different_orders_loads_identically(monkeypatch, tmp_path):
    shards = tiny_shards(12, empty=(4,))
    orders = []
    for number, write_order in enumerate(WRITE_ORDERS):
        ckpt = write_checkpoint(str(tmp_path / f"ckpt{number}"), shards, write_order=write_order)
        model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
        assert_loaded(model, ckpt)
        orders.append(_shard_order())
    assert orders[0] == orders[1] == orders[2]


@pytest.mark.parametrize("index", [True, False], ids=["index", "no_index"])
def test_natural_shard_order_locally(monkeypatch, tmp_path, index):
    shards = tiny_shards(12)
    orders = []
    for number, write_order in enumerate(WRITE_ORDERS):
        ckpt = write_unpadded(str(tmp_path / f"ckpt{number}"), shards, index=index, write_order=write_order)
        model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
        assert_loaded(model, ckpt)
        orders.append(_shard_order())
    assert orders[0] == orders[1] == orders[2]
    shards = [int(key.split("-")[1].split(".")[0]) for key in orders[0]]
    assert shards == sorted(shards)  # model-2 before model-10


@pytest.mark.parametrize("index", [True, False], ids=["index", "no_index"])
def test_natural_shard_order_on_s3_whatever_the_upload_order(monkeypatch, s3, tmp_path, index):
    ckpt = write_unpadded(str(tmp_path / "ckpt"), tiny_shards(12, empty=(6,)), index=index, write_order=range(12))
    orders = []
    for number, upload_order in enumerate(WRITE_ORDERS):
        uri = upload(s3, ckpt.path, f"tiny{number}", order=upload_order)
        model, _ = chain_load(monkeypatch, uri, ckpt.reference)
        assert_loaded(model, ckpt)
        orders.append(_shard_order())
    assert orders[0] == orders[1] == orders[2]
    shards = [int(key.split("-")[1].split(".")[0]) for key in orders[0]]
    assert shards == sorted(shards)


# -- where the shards are: subfolders, vLLM and HF cache layouts ------------


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_shards_in_a_subfolder_named_by_the_index(monkeypatch, request, tmp_path, kind):
    s3 = store_fixture(kind, request)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3), subfolder="weights")
    model, _ = chain_load(monkeypatch, place(kind, ckpt, s3), ckpt.reference)
    assert_loaded(model, ckpt)


def test_hf_snapshot_layout_found_below_the_candidate(monkeypatch, caplog, tmp_path):
    ckpt = hf_cache(str(tmp_path / "models--org--tiny"), tiny_shards(3, empty=(1,)))
    model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
    assert_loaded(model, ckpt)
    assert f"chose MX_MODEL_URI={ckpt.path!r}" in robust_messages(caplog)


def test_vllm_model_streamer_cache_layout(monkeypatch, tmp_path):
    cache = tmp_path / "vllm-cache"
    ckpt = write_checkpoint(str(cache / "model_streamer" / "6f1c0b2a9e"), tiny_shards(3))
    ckpt = written(str(cache), ckpt.files)
    model, _ = chain_load(monkeypatch, str(cache), ckpt.reference)
    assert_loaded(model, ckpt)


@pytest.mark.parametrize("depth", [0, 1])
def test_discovery_depth_too_shallow_rejects_hf_layout_with_reason(monkeypatch, tmp_path, depth):
    ckpt = hf_cache(str(tmp_path / "models--org--tiny"), tiny_shards(2))
    monkeypatch.setenv("MX_ROBUST_DISCOVERY_DEPTH", str(depth))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is not None and attempt.error.mutated is False
    message = str(attempt.error)
    assert f"MX_MODEL_URI={ckpt.path!r}: no *.safetensors file" in message
    assert untouched(attempt.model)


def test_two_snapshot_revisions_are_ambiguous(monkeypatch, tmp_path):
    ckpt = hf_cache(str(tmp_path / "models--org--tiny"), tiny_shards(2), revisions=("a" * 40, "b" * 40))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is not None and attempt.error.mutated is False
    assert "several checkpoint folders at the same depth" in str(attempt.error)
    assert f"snapshots/{'a' * 40}" in str(attempt.error)


# -- the gate widened: the engine's own model, no MX_MODEL_URI -------------------


def test_gate_widened_without_mx_model_uri_streams_model(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "false")
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    model, adapter = run_chain(model_config(model=ckpt.path), ckpt.reference)
    assert_loaded(model, ckpt)
    assert adapter.after_load_calls == 1


# -- what is read ---------------------------------------------------------------


def test_s3_load_streams_each_tensor_byte_once(monkeypatch, s3, tmp_path):
    """Probe reads headers only, runai reads the data once: a load costs ~1x the checkpoint."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, hidden=64))
    uri = upload(s3, ckpt.path, "tiny")
    data_bytes = ckpt.data_bytes
    s3.proxy.reset()
    model, _ = chain_load(monkeypatch, uri, ckpt.reference)
    assert_loaded(model, ckpt)
    assert data_bytes <= s3.bytes_served < 1.3 * data_bytes, (s3.bytes_served, data_bytes)


def test_consecutive_s3_loads_in_one_process(monkeypatch, s3, tmp_path):
    """A load must leave runai's S3 client clean for the next one (a leaked streamer broke it)."""
    for number, (count, empty) in enumerate([(3, (0, 2)), (5, (0,)), (2, ())]):
        ckpt = write_checkpoint(str(tmp_path / f"ckpt{number}"), tiny_shards(count, empty=empty, seed=number))
        model, _ = chain_load(monkeypatch, upload(s3, ckpt.path, f"tiny{number}"), ckpt.reference)
        assert_loaded(model, ckpt)
