"""Every shard header is read once per load, on the S3 servers the tests and the benchmark use.

The loopback proxy records each request's method, path and Range as the
clients (boto3 for the probe, runai for streaming) sent them. A load of a
sharded checkpoint must ask for each shard's header bytes once (the probe)
and each tensor's bytes once (runai, with the plan's byte ranges), and hand
the model tensors equal to safetensors' own load. The same on moto (the
tests' server) and on s3rver (the benchmark's, npm) behind the shaping
proxy that emulates a remote store.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from helpers.checkpoints import write_shard
from safetensors.torch import load_file

from mx_strategies.engine import EngineView
from mx_strategies.plan.planning import plan_of
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.select.selection import select_resolved
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, resolve
from mx_strategies.stream.streaming import VerifiedStream
from mx_strategies.testing.loopback import S3rverS3, ShapingProxy
from mx_strategies.verify.tensor_bytes import same_bytes

TARGET = EngineView(False, None, (), 1, 1, None, {})
SHARDS = 4


class ShapedS3rver(S3rverS3):
    proxy_class = ShapingProxy


def _checkpoint(folder) -> None:
    for shard in range(SHARDS):
        tensors = {f"model.layers.{shard}.w{j}": torch.randn(64, 32 + j) for j in range(3)}
        write_shard(os.path.join(folder, f"model-{shard + 1:05d}-of-{SHARDS:05d}.safetensors"), tensors)


def _load(uri: str) -> tuple[dict[str, torch.Tensor], object]:
    settings = load_settings()
    resolution = resolve([Candidate("explicit", uri)], settings)
    plan = plan_of(resolution.checkpoint, select_resolved(resolution, BuiltModule(TARGET), settings).names, settings)
    with VerifiedStream(plan, settings) as stream:
        delivered = {name: tensor.clone() for name, tensor in stream.tensors()}
    return delivered, plan


def _reads_per_range(requests, plan) -> Counter:
    """How many times each shard's header parts and each tensor's bytes were read (GETs with a Range).

    A part counts as read once when the requests' overlaps with it add up to
    exactly its length (it may span two requests: the probe's first read
    takes the length and, where it fits, the JSON); 0 when none touched it;
    more when bytes were read twice.
    """
    wanted = {}
    for shard in plan.shards:
        key = shard.uri.split("/", 3)[3]
        wanted[(key, "header length")] = (0, 7)
        wanted[(key, "header")] = (8, shard.header_bytes - 1)
        for info in shard.tensors.values():
            wanted[(key, info.name)] = (info.start, info.start + info.nbytes - 1)
    covered: Counter = Counter({item: 0 for item in wanted})
    for method, path, byte_range in requests:
        if method != "GET" or byte_range is None:
            continue
        if "://" in path:  # runai's client sends the absolute form
            path = "/" + path.split("://", 1)[1].split("/", 1)[1]
        key = path.split("?", 1)[0].split("/", 2)[2]
        first, last = (int(x) for x in byte_range.removeprefix("bytes=").split("-"))
        for (wanted_key, what), (start, end) in wanted.items():
            if wanted_key == key:
                covered[(wanted_key, what)] += max(0, min(end, last) - max(start, first) + 1)
    lengths = {item: end - start + 1 for item, (start, end) in wanted.items()}
    return Counter({item: covered[item] / lengths[item] for item in wanted})


def _check(server, tmp_path) -> None:
    _checkpoint(tmp_path)
    reference = {}
    for name in sorted(os.listdir(tmp_path)):
        reference.update(load_file(os.path.join(tmp_path, name)))  # what safetensors itself loads
    uri = server.upload(str(tmp_path), server.bucket, "model")
    server.proxy.reset()
    delivered, plan = _load(uri)
    assert delivered.keys() == reference.keys()
    for name, tensor in reference.items():
        assert same_bytes(delivered[name], tensor), name
    counts = _reads_per_range(server.proxy.requests, plan)
    assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v != 1}


@pytest.mark.timeout(120)
def test_moto_load_reads_each_header_and_tensor_once(s3, tmp_path):
    _check(s3, tmp_path)


@pytest.mark.timeout(300)  # the first run installs s3rver from npm
def test_s3rver_behind_the_shaping_proxy_reads_each_header_and_tensor_once(tmp_path):
    with ShapedS3rver() as server:
        server.bucket = "models"
        server.create_bucket(server.bucket)
        _check(server, tmp_path)
        # the shaping proxy delayed every response by its first-byte latency
        assert server.proxy.first_byte_s > 0
