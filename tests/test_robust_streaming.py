"""The robust strategy on a target load, end to end.

Everything here is real: safetensors files written to disk, moto's S3 server
on 127.0.0.1 (fixture ``s3``), runai-model-streamer reading them, and
ModelExpress's own ``LoadStrategyChain``. The only stand-in is the model
(``support.RecordingModel``), because a vLLM model needs a GPU; it copies
every tensor it is given and records the order, as ``load_weights`` does.

Happy paths and fall-through run through the chain (``support.run_chain``);
failures are also provoked with direct ``load`` calls, to check the
``mutated`` flag the chain relies on to decide whether to rebuild the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
from modelexpress.adapter import StrategyFailed
from modelexpress.load_strategy import LoadResult, LoadStrategyChain
from safetensors.torch import load_file, save_file

from mx_strategies import activation
from mx_strategies.checkpoint import INDEX_NAME, inspect
from mx_strategies.testing.loopback import S3_ENV, free_port
from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.settings import load_settings
from mx_strategies.storage import LocalStore
from mx_strategies.errors import IncompleteDelivery
from mx_strategies.engine import EngineView
from mx_strategies.planning import LoadPlan, plan_for
from mx_strategies.streaming import InOrder, VerifiedStream
from mx_strategies.testing.synthetic import config_only_copy, write_shards

TARGET = EngineView(False, None, (), 1, 1, None, {})
from support import CountingAdapter, RecordingModel, make_context, model_config, run_chain

STRATEGY_LOGGER = "modelexpress.strategy_robust_model_streamer"
NO_STRATEGY = "No loading strategy succeeded"


# -- checkpoints -------------------------------------------------------------


def tiny_shards(count: int, *, empty: tuple[int, ...] = (), hidden: int = 16, seed: int = 0) -> list[dict]:
    """``count`` shards; those at ``empty`` hold no tensor, the others a small layer each.

    Mixed dtypes and sizes, so tensors sit at different offsets in each file.
    """
    generator = torch.Generator().manual_seed(seed)
    shards = []
    for i in range(count):
        if i in empty:
            shards.append({})
            continue
        shards.append(
            {
                f"model.layers.{i}.self_attn.q_proj.weight": torch.randn(hidden, hidden, generator=generator),
                f"model.layers.{i}.mlp.down_proj.weight": torch.randn(hidden, 2 * hidden, generator=generator).to(
                    torch.bfloat16
                ),
                f"model.layers.{i}.input_layernorm.weight": torch.randn(hidden, generator=generator),
            }
        )
    return shards


def header_order(path: str) -> list[str]:
    """A shard's tensor names in file (data offset) order, read straight from its header."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return [name for name, _ in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))]


def reference_of(paths: list[str]) -> dict[str, torch.Tensor]:
    """What safetensors itself reads from these files."""
    tensors: dict[str, torch.Tensor] = {}
    for path in paths:
        tensors.update(load_file(path))
    return tensors


@dataclass
class Written:
    """A checkpoint on disk and what a correct load of it delivers."""

    path: str
    files: list[str]  # every shard, in intended (natural) order, empty ones included
    reference: dict[str, torch.Tensor]
    order: list[str]  # shard by shard in natural order, tensors in file order

    @property
    def loaded_files(self) -> list[str]:
        return [f for f in self.files if header_order(f)]


def written(path: str, files: list[str]) -> Written:
    return Written(path, files, reference_of(files), [n for f in files for n in header_order(f)])


def write_checkpoint(path: str, shards: list[dict], *, index: bool = True, write_order=None, subfolder: str = ""):
    names = write_shards(path, shards, index=index, write_order=write_order, subfolder=subfolder)
    return written(path, [os.path.join(path, subfolder, n) for n in names])


def write_unpadded(path: str, shards: list[dict], *, index: bool, write_order: list[int]) -> Written:
    """Shards named ``model-1`` .. ``model-N`` (no zero padding), created in ``write_order``.

    Lexicographic order (``model-10`` before ``model-2``) is then neither the
    natural order nor, on most filesystems, the readdir order.
    """
    staging = path + ".staging"
    padded = write_shards(staging, shards, index=False)
    os.makedirs(path)
    names = [f"model-{i + 1}.safetensors" for i in range(len(shards))]
    for i in write_order:
        shutil.move(os.path.join(staging, padded[i]), os.path.join(path, names[i]))
    shutil.rmtree(staging)
    if index:
        weight_map = {t: names[i] for i, shard in enumerate(shards) for t in shard}
        with open(os.path.join(path, INDEX_NAME), "w") as handle:
            json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return written(path, [os.path.join(path, n) for n in names])


def upload(s3, folder: str, prefix: str, order: Optional[list[int]] = None) -> str:
    """Upload every file of ``folder`` (sorted, then permuted by ``order``) to the test bucket."""
    files = sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, names in os.walk(folder) for f in names
    )
    if order is not None:
        files = [files[i] for i in order] + [f for i, f in enumerate(files) if i not in order]
    client = s3.client()
    for rel in files:
        client.upload_file(os.path.join(folder, rel), s3.bucket, f"{prefix}/{rel.replace(os.sep, '/')}")
    return f"s3://{s3.bucket}/{prefix}"


def place(kind: str, ckpt: Written, s3, prefix: str = "tiny") -> str:
    """The URI a load reads ``ckpt`` from: its folder, or an S3 copy of it."""
    return ckpt.path if kind == "local" else upload(s3, ckpt.path, prefix)


def store_fixture(kind: str, request):
    """The ``s3`` fixture for S3 cases (started on demand), None for local ones."""
    return request.getfixturevalue("s3") if kind == "s3" else None


# -- loads ---------------------------------------------------------------------


def chain_load(monkeypatch, uri: str, reference, *, mc=None, names=None):
    """MX_MODEL_URI=uri and ModelExpress's chain with the robust strategy installed."""
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    return run_chain(mc if mc is not None else model_config(), reference, names)


@dataclass
class Attempt:
    model: RecordingModel
    adapter: CountingAdapter
    result: Optional[LoadResult] = None
    error: Optional[Exception] = None


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


def direct_load(mc, reference, *, names=None, strategy_cls=RobustModelStreamerStrategy) -> Attempt:
    """One ``strategy.load`` call outside the chain, keeping a StrategyFailed to inspect."""
    adapter = CountingAdapter(lambda: RecordingModel(reference, names))
    model = RecordingModel(reference, names)
    attempt = Attempt(model, adapter)
    try:
        attempt.result = strategy_cls().load(LoadResult(value=model, model=model), make_context(mc, adapter))
    except StrategyFailed as exc:
        attempt.error = exc
    return attempt


def assert_loaded(model: RecordingModel, ckpt: Written) -> None:
    """Every tensor once, in plan order, equal to what safetensors reads."""
    assert model.order == ckpt.order
    assert set(model.weights) == set(ckpt.reference)
    for name, expected in ckpt.reference.items():
        assert model.weights[name].dtype == expected.dtype, name
        assert torch.equal(model.weights[name], expected), name


def untouched(model: RecordingModel) -> bool:
    return not model.order and all(not t.any() for t in model.weights.values())


def robust_messages(caplog, level=logging.INFO) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == STRATEGY_LOGGER and r.levelno >= level)


# -- 1. the gate ---------------------------------------------------------------


def _context(tmp_path):
    return make_context(model_config(model=str(tmp_path)), CountingAdapter(lambda: None))


def test_gate_needs_mx_model_uri(monkeypatch, tmp_path):
    strategy = RobustModelStreamerStrategy()
    assert not strategy.is_available(_context(tmp_path))
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path))
    assert strategy.is_available(_context(tmp_path))


def test_gate_widened_without_mx_model_uri_streams_model(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "false")
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    model, adapter = run_chain(model_config(model=ckpt.path), ckpt.reference)
    assert_loaded(model, ckpt)
    assert adapter.after_load_calls == 1


def test_gate_needs_runai(monkeypatch, tmp_path):
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path))
    # None in sys.modules is Python's own way of making a module unimportable.
    monkeypatch.setitem(sys.modules, "runai_model_streamer", None)
    assert not RobustModelStreamerStrategy().is_available(_context(tmp_path))


# -- 2. empty shards, many shards: local and S3 --------------------------------

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


def test_load_report_in_result_metadata(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, empty=(1,)))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is None
    report = attempt.result.metadata["robust_model_streamer"]
    data_bytes = sum(t.numel() * t.element_size() for t in ckpt.reference.values())
    assert report["role"] == "target"
    assert (report["source"], report["source_label"]) == (ckpt.path, "MX_MODEL_URI")
    assert report["tensors"] == len(ckpt.reference)
    assert report["bytes_streamed"] == report["checkpoint_bytes"] == data_bytes
    assert attempt.adapter.after_load_calls == 1


# -- 3. order: independent of write/upload/listing order, natural --------------

WRITE_ORDERS = [list(range(12)), list(reversed(range(12))), [5, 11, 0, 9, 2, 7, 1, 10, 3, 8, 4, 6]]


def test_same_checkpoint_written_in_different_orders_loads_identically(monkeypatch, tmp_path):
    shards = tiny_shards(12, empty=(4,))
    orders = []
    for number, write_order in enumerate(WRITE_ORDERS):
        ckpt = write_checkpoint(str(tmp_path / f"ckpt{number}"), shards, write_order=write_order)
        model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
        assert_loaded(model, ckpt)
        orders.append(model.order)
    assert orders[0] == orders[1] == orders[2]


@pytest.mark.parametrize("index", [True, False], ids=["index", "no_index"])
def test_natural_shard_order_locally(monkeypatch, tmp_path, index):
    shards = tiny_shards(12)
    orders = []
    for number, write_order in enumerate(WRITE_ORDERS):
        ckpt = write_unpadded(str(tmp_path / f"ckpt{number}"), shards, index=index, write_order=write_order)
        model, _ = chain_load(monkeypatch, ckpt.path, ckpt.reference)
        assert_loaded(model, ckpt)  # ckpt.order is model-1, model-2, ..., model-10, ...
        orders.append(model.order)
    assert orders[0] == orders[1] == orders[2]
    layers = [int(name.split(".")[2]) for name in orders[0]]
    assert layers == sorted(layers)  # model-2 (layer 1) before model-10 (layer 9)


@pytest.mark.parametrize("index", [True, False], ids=["index", "no_index"])
def test_natural_shard_order_on_s3_whatever_the_upload_order(monkeypatch, s3, tmp_path, index):
    ckpt = write_unpadded(str(tmp_path / "ckpt"), tiny_shards(12, empty=(6,)), index=index, write_order=range(12))
    orders = []
    for number, upload_order in enumerate(WRITE_ORDERS):
        uri = upload(s3, ckpt.path, f"tiny{number}", order=upload_order)
        model, _ = chain_load(monkeypatch, uri, ckpt.reference)
        assert_loaded(model, ckpt)
        orders.append(model.order)
    assert orders[0] == orders[1] == orders[2]
    layers = [int(name.split(".")[2]) for name in orders[0]]
    assert layers == sorted(layers)


# -- 4. where the shards are: subfolders, vLLM and HF cache layouts ------------


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_shards_in_a_subfolder_named_by_the_index(monkeypatch, request, tmp_path, kind):
    s3 = store_fixture(kind, request)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3), subfolder="weights")
    model, _ = chain_load(monkeypatch, place(kind, ckpt, s3), ckpt.reference)
    assert_loaded(model, ckpt)


def hf_cache(root: str, shards: list[dict], revisions=("0123456789abcdef0123456789abcdef01234567",)) -> Written:
    """``models--org--tiny`` as huggingface_hub lays it out: blobs, refs, snapshots/<rev> of symlinks."""
    staging = root + ".staging"
    names = write_shards(staging, shards)
    blobs = os.path.join(root, "blobs")
    os.makedirs(blobs)
    os.makedirs(os.path.join(root, "refs"))
    with open(os.path.join(root, "refs", "main"), "w") as handle:
        handle.write(revisions[0])
    for revision in revisions:
        snapshot = os.path.join(root, "snapshots", revision)
        os.makedirs(snapshot)
        for name in sorted(os.listdir(staging)):
            with open(os.path.join(staging, name), "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            blob = os.path.join(blobs, digest)
            if not os.path.exists(blob):
                shutil.copyfile(os.path.join(staging, name), blob)
            os.symlink(os.path.join("..", "..", "blobs", digest), os.path.join(snapshot, name))
    shutil.rmtree(staging)
    snapshot = os.path.join(root, "snapshots", revisions[0])
    return written(root, [os.path.join(snapshot, n) for n in names])


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


# -- 5. the source chain --------------------------------------------------------


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
    assert "passed over model='org/model': org/model: no such local folder (a hub id or a missing path)" in (
        robust_messages(caplog)
    )


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


# -- 6. inconsistent checkpoints: refused before the model is touched ----------


def _shard(ckpt: Written, number: int) -> str:
    return ckpt.files[number - 1]


def _rewrite_index(ckpt: Written, change: Callable[[dict], None]) -> None:
    path = os.path.join(ckpt.path, INDEX_NAME)
    with open(path) as handle:
        index = json.load(handle)
    change(index["weight_map"])
    with open(path, "w") as handle:
        json.dump(index, handle)


def index_names_missing_tensor(ckpt: Written) -> list[str]:
    _rewrite_index(ckpt, lambda wm: wm.__setitem__("model.layers.1.ghost.weight", os.path.basename(_shard(ckpt, 2))))
    return ["model.layers.1.ghost.weight", os.path.basename(_shard(ckpt, 2)), "header lacks it"]


def index_names_missing_shard(ckpt: Written) -> list[str]:
    os.remove(_shard(ckpt, 3))
    return [os.path.basename(_shard(ckpt, 3)), "not found"]


def corrupt_header(ckpt: Written) -> list[str]:
    path = _shard(ckpt, 2)
    size = os.path.getsize(path)
    junk = b"{this is not json" + b" " * 15
    with open(path, "r+b") as handle:
        handle.write(len(junk).to_bytes(8, "little") + junk)
    assert os.path.getsize(path) == size
    return [path, "not valid JSON"]


def header_longer_than_file(ckpt: Written) -> list[str]:
    path = _shard(ckpt, 2)
    with open(path, "r+b") as handle:
        handle.write((os.path.getsize(path) * 10).to_bytes(8, "little"))
    return [path, "exceeds the file size"]


def truncated_shard(ckpt: Written) -> list[str]:
    path = _shard(ckpt, 2)
    os.truncate(path, os.path.getsize(path) - 64)
    return [path, "truncated"]


def zero_byte_shard(ckpt: Written) -> list[str]:
    path = _shard(ckpt, 2)
    os.truncate(path, 0)
    return [path, "file is 0 bytes"]


def text_file_named_safetensors(ckpt: Written) -> list[str]:
    path = _shard(ckpt, 2)
    with open(path, "w") as handle:
        handle.write("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1234\n")
    return [path, "not a safetensors file"]


INCONSISTENT = {
    "index_names_missing_tensor": index_names_missing_tensor,
    "index_names_missing_shard": index_names_missing_shard,
    "corrupt_header": corrupt_header,
    "header_longer_than_file": header_longer_than_file,
    "truncated_shard": truncated_shard,
    "zero_byte_shard": zero_byte_shard,
    "text_file_named_safetensors": text_file_named_safetensors,
}
NEEDS_INDEX = {"index_names_missing_tensor", "index_names_missing_shard"}


def _as_uri(fragment: str, ckpt: Written, uri: str) -> str:
    """A local path in an expected message, as it reads for the S3 copy."""
    return fragment.replace(ckpt.path, uri) if fragment.startswith(ckpt.path) else fragment


# An index mismatch needs an index; the file-level damage is checked with and without one.
INCONSISTENT_LAYOUTS = [(case, True) for case in sorted(INCONSISTENT)] + [
    (case, False) for case in sorted(INCONSISTENT) if case not in NEEDS_INDEX
]


@pytest.mark.parametrize("kind", ["local", "s3"])
@pytest.mark.parametrize(
    ("case", "index"),
    INCONSISTENT_LAYOUTS,
    ids=[f"{c}-{'index' if i else 'no_index'}" for c, i in INCONSISTENT_LAYOUTS],
)
def test_inconsistent_checkpoint_is_refused_unmutated(monkeypatch, request, tmp_path, kind, index, case):
    s3 = store_fixture(kind, request)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3), index=index)
    fragments = INCONSISTENT[case](ckpt)
    uri = place(kind, ckpt, s3)
    monkeypatch.setenv("MX_MODEL_URI", uri)

    attempt = direct_load(model_config(), ckpt.reference)

    assert attempt.error is not None, "an inconsistent checkpoint was loaded"
    assert attempt.error.mutated is False
    message = str(attempt.error)
    assert message.startswith(f"checkpoint {uri} is inconsistent, not loading it: ")
    for fragment in fragments:
        assert _as_uri(fragment, ckpt, uri) in message
    assert untouched(attempt.model)


def test_duplicate_tensor_across_shards_names_tensor_and_files(monkeypatch, tmp_path):
    shards = tiny_shards(3)
    shards[0]["model.layers.1.input_layernorm.weight"] = torch.ones(16)  # also in shard 2
    for index in (True, False):
        ckpt = write_checkpoint(str(tmp_path / f"ckpt-{index}"), shards, index=index)
        monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
        attempt = direct_load(model_config(), {**ckpt.reference})
        assert attempt.error is not None and attempt.error.mutated is False
        message = str(attempt.error)
        first, second = (os.path.basename(f) for f in ckpt.files[:2])
        assert f"tensor 'model.layers.1.input_layernorm.weight' is in both {first} and {second}" in message
        assert untouched(attempt.model)


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_inconsistent_checkpoint_through_the_chain_serves_nothing(monkeypatch, caplog, tmp_path, case):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    fragments = INCONSISTENT[case](ckpt)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    attempt = failed_chain(model_config(), ckpt.reference)

    assert attempt.adapter.reinit_calls == 0
    assert untouched(attempt.model)
    failures = [r.getMessage() for r in caplog.records if "Strategy robust_model_streamer failed" in r.getMessage()]
    assert len(failures) == 1
    for fragment in fragments:
        assert fragment in failures[0]


# -- 7. object stores that cannot be reached -----------------------------------


def test_unreachable_endpoint_fails_cleanly_and_quickly(monkeypatch, tmp_path):
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "1")
    monkeypatch.setenv("MX_ROBUST_PROBE_MAX_ATTEMPTS", "1")
    uri = "s3://models/tiny"
    monkeypatch.setenv("MX_MODEL_URI", uri)
    reference = tiny_shards(1)[0]

    started = time.monotonic()
    attempt = direct_load(model_config(), reference)
    elapsed = time.monotonic() - started

    assert attempt.error is not None and attempt.error.mutated is False
    assert f"MX_MODEL_URI={uri!r}: {uri}: listing failed" in str(attempt.error)
    assert elapsed < 30, f"took {elapsed:.1f}s"
    assert untouched(attempt.model)

    through_chain = failed_chain(model_config(), reference)
    assert through_chain.adapter.reinit_calls == 0


def test_missing_bucket_fails_cleanly(monkeypatch, s3):
    uri = f"s3://{s3.bucket}-does-not-exist/tiny"
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setenv("MX_ROBUST_PROBE_MAX_ATTEMPTS", "1")
    started = time.monotonic()
    attempt = direct_load(model_config(), tiny_shards(1)[0])
    assert time.monotonic() - started < 30
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


# -- 8. delivery verification ----------------------------------------------------


def replace_without(path: str, dropped: str) -> None:
    """Rewrite ``path`` as a valid safetensors file lacking ``dropped`` (another writer's copy)."""
    tensors = load_file(path)
    del tensors[dropped]
    save_file(tensors, path)


DROPPED = "model.layers.1.mlp.down_proj.weight"


def test_verified_stream_reports_a_tensor_that_never_came(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    settings = load_settings()
    plan = plan_for(inspect(LocalStore(ckpt.path), settings.discovery_depth), TARGET, settings, source_is_target=True)
    replace_without(_shard(ckpt, 2), DROPPED)  # after inspection, before streaming

    delivered = []
    with pytest.raises(IncompleteDelivery) as caught:
        with VerifiedStream(plan, settings) as stream:
            for name, tensor in stream.tensors():
                delivered.append(name)
                assert torch.equal(tensor, ckpt.reference[name])

    assert str(caught.value) == (
        f"incomplete load from {ckpt.path}: 1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    )
    assert delivered == [n for n in ckpt.order if n != DROPPED]


def test_verified_stream_warn_policy_reports_and_returns(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "warn")
    settings = load_settings()
    plan = plan_for(inspect(LocalStore(ckpt.path), settings.discovery_depth), TARGET, settings, source_is_target=True)
    replace_without(_shard(ckpt, 2), DROPPED)
    warnings: list[str] = []
    with VerifiedStream(plan, settings, on_warning=warnings.append) as stream:
        delivered = [name for name, _ in stream.tensors()]
    assert len(delivered) == len(ckpt.reference) - 1
    assert warnings == [
        f"incomplete load from {ckpt.path}: 1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    ]


def test_verified_stream_reports_duplicates(tmp_path):
    """What a load without header checks would do with one name in two shards."""
    shards = tiny_shards(3)
    shards[2]["model.layers.0.input_layernorm.weight"] = torch.ones(16)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), shards, index=False)
    settings = load_settings()
    checkpoint = inspect(LocalStore(ckpt.path), settings.discovery_depth)
    assert [p.kind for p in checkpoint.errors] == ["duplicate_tensor"]  # the strategy would stop here
    names: list[str] = []
    with pytest.raises(IncompleteDelivery, match="1 delivered more than once: model.layers.0.input_layernorm.weight"):
        with VerifiedStream(plan_for(checkpoint, TARGET, settings, source_is_target=True), settings) as stream:
            names.extend(name for name, _ in stream.tensors())
    assert names.count("model.layers.0.input_layernorm.weight") == 2
    assert len(names) == len(ckpt.reference) + 1


def test_verified_stream_reports_a_plan_listing_a_shard_twice(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    settings = load_settings()
    full = plan_for(inspect(LocalStore(ckpt.path), settings.discovery_depth), TARGET, settings, source_is_target=True)
    twice = LoadPlan(full.source, (full.shards[0], full.shards[1], full.shards[0]), None)
    model = RecordingModel(ckpt.reference)
    with pytest.raises(IncompleteDelivery, match="3 delivered more than once"):
        with VerifiedStream(twice, settings) as stream:
            model.load_weights(stream.tensors())
    assert len(model.order) == len(ckpt.reference) + 3


def test_verified_stream_notices_an_engine_that_stopped_reading(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    settings = load_settings()
    plan = plan_for(inspect(LocalStore(ckpt.path), settings.discovery_depth), TARGET, settings, source_is_target=True)
    with pytest.raises(IncompleteDelivery, match="the engine stopped reading before the stream ended"):
        with VerifiedStream(plan, settings) as stream:
            tensors = stream.tensors()
            next(tensors)
            stream.settle()


class RaceAfterPlanning(RobustModelStreamerStrategy):
    """The real strategy, with another writer changing a shard once the plan is fixed.

    ``change`` runs between inspection and streaming: the window in which a
    checkpoint being re-uploaded or re-synced changes under a load.
    """

    change: Callable[[str], None] = staticmethod(lambda path: None)
    shard_number = 2

    def _plan(self, checkpoint, *args, **kwargs):
        planned = super()._plan(checkpoint, *args, **kwargs)
        type(self).change(checkpoint.shards[self.shard_number - 1].uri)
        return planned


def racing(change: Callable[[str], None]) -> type:
    return type("Racing", (RaceAfterPlanning,), {"change": staticmethod(change)})


def test_shortfall_after_the_model_was_touched_is_mutated(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(
        model_config(), ckpt.reference, strategy_cls=racing(lambda path: replace_without(path, DROPPED))
    )
    assert attempt.error is not None and attempt.error.mutated is True
    assert f"1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}" in str(attempt.error)
    assert len(attempt.model.order) == len(ckpt.reference) - 1  # the model really was written to
    assert attempt.adapter.after_load_calls == 0


def test_shortfall_through_the_chain_reinitializes_the_model(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = failed_chain(
        model_config(), ckpt.reference, strategy_cls=racing(lambda path: replace_without(path, DROPPED))
    )
    assert attempt.adapter.reinit_calls == 1
    assert DROPPED in robust_messages(caplog, logging.WARNING)


def test_shortfall_under_warn_policy_loads_and_warns(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "warn")
    attempt = direct_load(
        model_config(), ckpt.reference, strategy_cls=racing(lambda path: replace_without(path, DROPPED))
    )
    assert attempt.error is None
    assert attempt.adapter.after_load_calls == 1
    assert not attempt.model.weights[DROPPED].any()  # what the user is warned about
    assert attempt.model.order == [n for n in ckpt.order if n != DROPPED]
    warnings = robust_messages(caplog, logging.WARNING)
    shortfall = f"1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    assert f"[Worker 0] incomplete load from {ckpt.path}: {shortfall}" in warnings


# -- 9. the mutation contract, through the chain ---------------------------------


def _delete(path: str) -> None:
    os.remove(path)


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) - 64)


@dataclass(frozen=True)
class FailureCase:
    mutated: bool
    message: str  # in the StrategyFailed message
    prepare: Callable[[Written], None] = lambda ckpt: None
    strategy_cls: type = RobustModelStreamerStrategy
    model_lacks: Optional[str] = None  # a checkpoint tensor the model has no parameter for
    after_load_fails: bool = False


FAILURES = {
    # Before the first tensor: listing, headers, index, streamer start.
    "no_source": FailureCase(False, "no candidate source", prepare=lambda c: [os.remove(f) for f in c.files]),
    "corrupt_header": FailureCase(False, "not valid JSON", prepare=corrupt_header),
    "index_mismatch": FailureCase(False, "header lacks it", prepare=index_names_missing_tensor),
    "shard_deleted_before_streaming": FailureCase(False, "did not start", strategy_cls=racing(_delete)),
    "shard_truncated_before_streaming": FailureCase(False, "did not start", strategy_cls=racing(_truncate)),
    # After it: the model holds some of the new weights.
    "tensor_never_delivered": FailureCase(
        True, "expected tensors missing", strategy_cls=racing(lambda p: replace_without(p, DROPPED))
    ),
    "model_rejects_a_tensor": FailureCase(True, "model has no parameter", model_lacks=DROPPED),
    "post_load_processing_fails": FailureCase(True, "post-load processing failed", after_load_fails=True),
}


class FailingPostLoad(CountingAdapter):
    def after_weight_iter_load(self, result):
        super().after_weight_iter_load(result)
        raise RuntimeError("quantization repack failed")


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_mutation_contract(monkeypatch, tmp_path, case):
    spec = FAILURES[case]
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    spec.prepare(ckpt)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    names = [n for n in ckpt.reference if n != spec.model_lacks]
    adapter_cls = FailingPostLoad if spec.after_load_fails else CountingAdapter

    # Directly: the flag the strategy raises.
    adapter = adapter_cls(lambda: RecordingModel(ckpt.reference, names))
    model = RecordingModel(ckpt.reference, names)
    with pytest.raises(StrategyFailed) as caught:
        spec.strategy_cls().load(LoadResult(value=model, model=model), make_context(model_config(), adapter))
    assert caught.value.mutated is spec.mutated
    assert spec.message in str(caught.value)
    assert untouched(model) is not spec.mutated

    # Through the chain: what the flag makes ModelExpress do.
    if case.startswith(("shard_", "tensor_")):  # the race changed the files: start again from a fresh copy
        shutil.rmtree(ckpt.path)
        ckpt = write_checkpoint(ckpt.path, tiny_shards(3))
    attempt = failed_chain(
        model_config(), ckpt.reference, names=names, strategy_cls=spec.strategy_cls, adapter_cls=adapter_cls
    )
    assert attempt.adapter.reinit_calls == (1 if spec.mutated else 0)


# -- 10. streamer settings and tensor ownership -----------------------------------


class EnvironmentRecorder(CountingAdapter):
    """Notes the runai variables in force while the weights are applied."""

    seen: dict[str, Optional[str]] = {}

    def apply_weight_iter(self, result, weights_iter):
        for var in ("RUNAI_STREAMER_CONCURRENCY", "RUNAI_STREAMER_MEMORY_LIMIT", "RUNAI_STREAMER_CHUNK_BYTESIZE"):
            type(self).seen[var] = os.environ.get(var)
        return super().apply_weight_iter(result, weights_iter)


def test_streamer_settings_apply_during_the_load_only(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "3")
    monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", "0")
    monkeypatch.setenv("MX_ROBUST_STREAMER_CHUNK_BYTESIZE", "4096")
    monkeypatch.setenv("RUNAI_STREAMER_CONCURRENCY", "7")  # the deployment's own, restored afterwards
    monkeypatch.delenv("RUNAI_STREAMER_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("RUNAI_STREAMER_CHUNK_BYTESIZE", raising=False)
    EnvironmentRecorder.seen = {}
    adapter = EnvironmentRecorder(lambda: RecordingModel(ckpt.reference))
    model = RecordingModel(ckpt.reference)
    RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), make_context(model_config(), adapter))
    assert_loaded(model, ckpt)
    assert EnvironmentRecorder.seen == {
        "RUNAI_STREAMER_CONCURRENCY": "3",
        "RUNAI_STREAMER_MEMORY_LIMIT": "0",
        "RUNAI_STREAMER_CHUNK_BYTESIZE": "4096",
    }
    assert os.environ["RUNAI_STREAMER_CONCURRENCY"] == "7"
    assert "RUNAI_STREAMER_MEMORY_LIMIT" not in os.environ
    assert "RUNAI_STREAMER_CHUNK_BYTESIZE" not in os.environ


class KeepingAdapter(CountingAdapter):
    """An engine that keeps the streamed tensors themselves instead of copying them."""

    kept: dict[str, torch.Tensor] = {}

    def apply_weight_iter(self, result, weights_iter):
        self.kept = dict(weights_iter)
        return result


def test_streamed_tensors_are_owned(monkeypatch, tmp_path):
    """With runai's smallest ring its buffers are reused; a kept tensor must not change."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(6, hidden=32))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", "0")
    adapter = KeepingAdapter(lambda: None)
    model = RecordingModel(ckpt.reference)
    RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), make_context(model_config(), adapter))
    assert set(adapter.kept) == set(ckpt.reference)
    changed = [n for n, t in adapter.kept.items() if not torch.equal(t, ckpt.reference[n])]
    assert changed == []


# -- 11. what is read, and in which order -------------------------------------------


def test_s3_load_streams_each_tensor_byte_once(monkeypatch, s3, tmp_path):
    """Probe reads headers only, runai reads the data once: a load costs ~1x the checkpoint."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, hidden=64))
    uri = upload(s3, ckpt.path, "tiny")
    data_bytes = sum(t.numel() * t.element_size() for t in ckpt.reference.values())
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


def test_plan_order_holds_with_the_smallest_ring(monkeypatch, tmp_path):
    """runai completes reads out of order; the model still gets plan order, run after run."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(12, hidden=64))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    for limit in ("0", "40000", "-1"):
        monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", limit)
        for _ in range(3):
            attempt = direct_load(model_config(), ckpt.reference)
            assert attempt.error is None
            assert_loaded(attempt.model, ckpt)


def _named(*names: str) -> list[tuple[str, torch.Tensor]]:
    return [(name, torch.zeros(4, dtype=torch.uint8)) for name in names]  # 4 bytes each


def _released(in_order: InOrder, arrivals) -> list[str]:
    out = [name for name, tensor in arrivals for name, _ in in_order.push(name, tensor)]
    return out + [name for name, _ in in_order.drain()]


def test_in_order_releases_in_plan_order_with_repeats_and_strangers_last():
    in_order = InOrder(["a", "b", "c", "d"], limit_bytes=1 << 20)
    assert _released(in_order, _named("c", "a", "x", "b", "a", "d")) == ["a", "b", "c", "d", "x", "a"]
    assert in_order.ordered


def test_in_order_skips_a_missing_name_at_the_end():
    in_order = InOrder(["a", "b", "c"], limit_bytes=1 << 20)
    assert _released(in_order, _named("c", "a")) == ["a", "c"]


def test_in_order_gives_up_ordering_rather_than_hold_too_much():
    """An expected tensor that never comes must not make the whole checkpoint wait in memory."""
    in_order = InOrder(["a", "b", "c", "d", "e"], limit_bytes=8)
    released = []
    for name, tensor in _named("b", "c", "d", "e"):
        released.append([n for n, _ in in_order.push(name, tensor)])
    assert released == [[], [], ["b", "c", "d"], ["e"]]  # held 12 > 8 bytes: arrival order from then on
    assert not in_order.ordered
