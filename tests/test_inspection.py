"""Checkpoint inspection on its own: listing, headers, index, never tensor data.

Real files on disk and in moto's S3 on 127.0.0.1; ``checkpoint.inspect``
reads them through the same stores a load's probe uses.
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers.checkpoints import edit_index, tiny_shards, upload, write_checkpoint, write_shard, write_unpadded
from helpers.headers import header_order

from mx_strategies.inspect.checkpoint import INDEX_NAME, natural_key
from mx_strategies.inspect.index import inspect
from mx_strategies.errors import NoCheckpoint
from mx_strategies.inspect.object_stores import open_store
from mx_strategies.inspect.storage import LocalStore
from mx_strategies.testing.synthetic import config_only_copy, write_shards

DEPTH = 3


def keys(checkpoint) -> list[str]:
    return [s.key for s in checkpoint.shards]


def problems(checkpoint) -> set[tuple[str, str, str | None, str | None]]:
    return {(p.kind, p.severity, p.file, p.tensor) for p in checkpoint.problems}


# -- order ----------------------------------------------------------------------


def test_natural_key_puts_2_before_10():
    names = ["model-10.safetensors", "model-2.safetensors", "model-1.safetensors", "model-11.safetensors"]
    assert sorted(names, key=natural_key) == [
        "model-1.safetensors",
        "model-2.safetensors",
        "model-10.safetensors",
        "model-11.safetensors",
    ]


@pytest.mark.parametrize("index", [True, False], ids=["index", "no_index"])
def test_shards_in_natural_order_whatever_the_readdir_order(tmp_path, index):
    natural = [f"model-{i}.safetensors" for i in range(1, 13)]
    for number, write_order in enumerate([range(12), reversed(range(12)), [7, 0, 11, 3, 9, 1, 5, 10, 2, 8, 4, 6]]):
        ckpt = write_unpadded(str(tmp_path / f"c{number}"), tiny_shards(12), index=index, write_order=list(write_order))
        assert keys(inspect(LocalStore(ckpt.path), DEPTH)) == natural


def test_shards_in_natural_order_from_a_lexicographic_s3_listing(s3, tmp_path):
    ckpt = write_unpadded(str(tmp_path / "ckpt"), tiny_shards(12), index=False, write_order=list(range(12)))
    uri = upload(s3, ckpt.path, "tiny")
    checkpoint = inspect(open_store(uri), DEPTH)
    assert keys(checkpoint) == [f"model-{i}.safetensors" for i in range(1, 13)]
    assert [s.uri for s in checkpoint.shards] == [f"{uri}/model-{i}.safetensors" for i in range(1, 13)]


def test_tensors_listed_in_file_order(tmp_path):
    """As runai reads them (by offset), not the header's alphabetical key order."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)
    for shard, path in zip(checkpoint.shards, ckpt.files):
        assert list(shard.tensors) == header_order(path)
        assert list(shard.tensors) != sorted(shard.tensors)  # the case is real: bf16 sits after f32


# -- what it reads -------------------------------------------------------------------


def test_inspection_reads_headers_only(s3, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3, hidden=256))
    data_bytes = ckpt.data_bytes
    uri = upload(s3, ckpt.path, "tiny")
    s3.proxy.reset()
    checkpoint = inspect(open_store(uri), DEPTH)
    assert checkpoint.data_bytes == data_bytes
    assert checkpoint.tensor_count == len(ckpt.reference)
    assert s3.bytes_served < 0.05 * data_bytes, (s3.bytes_served, data_bytes)


def test_an_empty_shard_costs_one_request(s3, tmp_path):
    """An empty shard (8 bytes of length and a padded "{}") is read whole in one ranged GET, not
    its length and then its JSON in two round trips. (A 16 KiB shard with a tensor still takes two:
    its first read is 1/1024 of the file, so that a probe reads next to no tensor data.)"""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_shard(str(folder / "model-00001-of-00002.safetensors"), {"w": torch.zeros(64, 64)})
    write_shard(str(folder / "model-00002-of-00002.safetensors"), {})
    uri = upload(s3, str(folder), "empty")
    s3.proxy.reset()
    checkpoint = inspect(open_store(uri), DEPTH)
    assert [s.empty for s in checkpoint.shards] == [False, True]
    # (the probe's GETs carry a presigned query string: mx_strategies.inspect.s3_ranged)
    gets = [(path.split("?", 1)[0].rsplit("/", 1)[-1], byte_range)
            for method, path, byte_range in s3.proxy.requests if method == "GET" and byte_range]  # fmt: skip
    empty_size = os.path.getsize(folder / "model-00002-of-00002.safetensors")
    assert sorted(gets) == [
        ("model-00001-of-00002.safetensors", "bytes=0-15"),  # 1/1024 of 16 KiB: the length, then
        ("model-00001-of-00002.safetensors", f"bytes=16-{checkpoint.shards[0].header_bytes - 1}"),  # the rest
        ("model-00002-of-00002.safetensors", f"bytes=0-{empty_size - 1}"),
    ]


# -- what it reports ---------------------------------------------------------------


def test_warnings_do_not_stop_a_load(tmp_path):
    shards = tiny_shards(4, empty=(1,))
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), shards)
    # A tensor the index does not name, and a file it does not name (Mistral's consolidated.safetensors).
    extra = dict(shards[2])
    extra["model.layers.2.extra.weight"] = torch.ones(4)
    write_shard(ckpt.files[2], extra)
    write_shard(os.path.join(ckpt.path, "consolidated.safetensors"), {"consolidated.weight": torch.ones(4)})

    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)

    assert checkpoint.errors == []
    empty, third = (os.path.basename(ckpt.files[i]) for i in (1, 2))
    assert problems(checkpoint) == {
        ("empty_shard", "warning", empty, None),
        ("unindexed_shard", "warning", "consolidated.safetensors", None),
        ("unindexed_tensor", "warning", third, "model.layers.2.extra.weight"),
    }
    assert [s.key for s in checkpoint.loadable_shards] == [os.path.basename(ckpt.files[i]) for i in (0, 2, 3)]
    assert "consolidated.weight" not in checkpoint.tensors()


def test_every_error_names_its_file_and_tensor(tmp_path):
    shards = tiny_shards(4)
    shards[0]["model.layers.2.input_layernorm.weight"] = torch.zeros(16)  # also in shard 3
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), shards)
    names = [os.path.basename(f) for f in ckpt.files]
    edit_index(ckpt.path, lambda wm: wm.__setitem__("model.layers.1.ghost.weight", names[1]))
    os.remove(ckpt.files[3])
    os.truncate(ckpt.files[1], os.path.getsize(ckpt.files[1]) - 32)

    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)

    assert {(p.kind, p.file, p.tensor) for p in checkpoint.errors} == {
        ("missing_shard", names[3], None),
        ("truncated_shard", names[1], None),
        ("duplicate_tensor", names[2], "model.layers.2.input_layernorm.weight"),
    }
    # The ghost tensor is reported once its shard reads; a truncated shard cannot say what it lacks.
    os.remove(ckpt.files[1])
    write_shard(ckpt.files[1], shards[1])
    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)
    assert ("missing_tensor", names[1], "model.layers.1.ghost.weight") in {
        (p.kind, p.file, p.tensor) for p in checkpoint.errors
    }


def test_unreadable_index_is_an_error(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    with open(os.path.join(ckpt.path, INDEX_NAME), "w") as handle:
        handle.write("{ not json")
    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)
    assert [(p.kind, p.file) for p in checkpoint.errors] == [("corrupt_index", INDEX_NAME)]


def test_a_valid_zero_tensor_file_is_empty_not_corrupt(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2), index=False)
    write_shard(os.path.join(ckpt.path, "model-00003-of-00003.safetensors"), {})
    checkpoint = inspect(LocalStore(ckpt.path), DEPTH)
    assert checkpoint.errors == []
    assert [s.key for s in checkpoint.shards if s.empty] == ["model-00003-of-00003.safetensors"]
    assert len(checkpoint.loadable_shards) == 2


# -- no checkpoint here ------------------------------------------------------------


def test_config_only_copy_is_no_checkpoint(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    cache = config_only_copy(ckpt.path, str(tmp_path / "cache"))
    with pytest.raises(NoCheckpoint, match=f"holds {INDEX_NAME} but none of the 3 shard"):
        inspect(LocalStore(cache), DEPTH)


def test_folder_without_safetensors_says_what_it_holds(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(NoCheckpoint, match=r"no \*\.safetensors file \(holds config.json, pytorch_model.bin\)"):
        inspect(LocalStore(str(tmp_path)), DEPTH)


# -- depth: the same answer from a folder and from S3 ---------------------------------


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_listing_depth_means_the_same_locally_and_on_s3(s3, tmp_path, depth):
    root = tmp_path / "root"
    write_shards(str(root / "a" / "b"), tiny_shards(1))
    write_shards(str(root / "a"), tiny_shards(1), prefix="mid")
    write_shards(str(root), tiny_shards(1), prefix="top")
    uri = upload(s3, str(root), "nested")
    local = sorted(o.key for o in LocalStore(str(root)).list(depth))
    remote = sorted(o.key for o in open_store(uri).list(depth))
    assert local == remote
    assert max(k.count("/") for k in local) == depth
