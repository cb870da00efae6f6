"""Property: any well-formed checkpoint loads completely, identically and in order.

Hypothesis draws checkpoints the way exporters vary them: 1 to 12 shards,
empty shards anywhere, dtypes including both float8 formats, bf16, f16, f32,
int8 and bool, scalars and zero-size tensors, files created in any order,
with or without ``model.safetensors.index.json``. Each is written with
``safetensors.torch.save_file``, loaded by the robust strategy through real
runai-model-streamer (local folders, and a smaller number through the
loopback S3 server), and compared with ``safetensors.torch.load_file``
bit for bit (``tensor_bytes.same_bytes``, so float8 NaN patterns and -0.0 count),
in plan order: shards in natural order, tensors by offset.

Examples are few (the suite runs on 2 shared cores) and the data tiny.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest
import torch
from helpers.checkpoints import Written, write_checkpoint
from helpers.engine import direct_load, model_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelexpress.adapter import StrategyFailed

from mx_strategies.stream.streaming import streamer_environment
from mx_strategies.verify.tensor_bytes import same_bytes

DTYPES = [
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.int8,
    torch.bool,
]
LOCAL_EXAMPLES = 25
S3_EXAMPLES = 8

_buckets = itertools.count()


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointSpec:
    shards: tuple[tuple[TensorSpec, ...], ...]
    write_order: tuple[int, ...]
    index: bool
    seed: int

    @property
    def tensor_count(self) -> int:
        return sum(len(s) for s in self.shards)


tensor_specs = st.builds(
    TensorSpec,
    dtype=st.sampled_from(DTYPES),
    # Up to 3 dims of 0..5: scalars (shape ()) and zero-size tensors included.
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
)


@st.composite
def checkpoints(draw) -> CheckpointSpec:
    count = draw(st.integers(1, 12))
    # Each shard holds 0..3 tensors, so empty shards fall anywhere.
    shards = tuple(tuple(draw(st.lists(tensor_specs, min_size=0, max_size=3))) for _ in range(count))
    order = tuple(draw(st.permutations(range(count))))
    return CheckpointSpec(shards, order, draw(st.booleans()), draw(st.integers(0, 2**31 - 1)))


def make_tensor(spec: TensorSpec, generator: torch.Generator) -> torch.Tensor:
    """Random bits of ``spec.dtype`` (any float8/bf16 bit pattern, bools 0/1)."""
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, spec.shape, generator=generator, dtype=torch.uint8).bool()
    itemsize = torch.empty((), dtype=spec.dtype).element_size()
    count = 1
    for dim in spec.shape:
        count *= dim
    raw = torch.randint(0, 256, (count * itemsize,), generator=generator, dtype=torch.uint8)
    return raw.view(spec.dtype).reshape(spec.shape)


def write(spec: CheckpointSpec, path: str) -> Written:
    generator = torch.Generator().manual_seed(spec.seed)
    shards = [
        {f"model.layers.{i}.w{j}": make_tensor(t, generator) for j, t in enumerate(shard)}
        for i, shard in enumerate(spec.shards)
    ]
    return write_checkpoint(path, shards, index=spec.index, write_order=spec.write_order)


def load_and_check(written: Written, uri: str) -> None:
    """Load ``uri``: every tensor once, in arrival order, with its own bytes."""
    with streamer_environment({"MX_MODEL_URI": uri}):
        attempt = direct_load(model_config(), written.reference)
    if not written.reference:
        # Every shard empty: no source, refused before the model is touched.
        assert isinstance(attempt.error, StrategyFailed)
        assert attempt.error.mutated is False
        assert "empty" in str(attempt.error)
        assert attempt.model.order == []
        return
    assert attempt.error is None, attempt.error
    model = attempt.model
    assert sorted(model.order) == sorted(written.order)  # each once, in arrival order
    for name, expected in written.reference.items():
        got = model.weights[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert same_bytes(got, expected), name


@pytest.fixture
def scratch():
    """A folder that outlives one hypothesis example only (examples share the test's fixtures)."""
    roots: list[str] = []

    def make() -> str:
        roots.append(tempfile.mkdtemp(prefix="mx-prop-"))
        return roots[-1]

    yield make
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=LOCAL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=checkpoints())
def test_any_checkpoint_loads_completely_and_identically_from_a_folder(spec, scratch):
    root = scratch()
    written = write(spec, os.path.join(root, "ckpt"))
    try:
        load_and_check(written, written.path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=S3_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=checkpoints())
def test_any_checkpoint_loads_completely_and_identically_from_s3(spec, s3_server, scratch):
    root = scratch()
    written = write(spec, os.path.join(root, "ckpt"))
    bucket = f"prop-{next(_buckets)}"
    uri = s3_server.upload(written.path, bucket, "model")
    try:
        load_and_check(written, uri)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_generated_tensors_cover_what_the_property_claims():
    """The generator can produce every dtype, scalars, zero-size tensors and empty shards."""
    generator = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for shape in [(), (0,), (2, 0, 3), (3, 2)]:
            tensor = make_tensor(TensorSpec(dtype, shape), generator)
            assert tensor.dtype == dtype and tuple(tensor.shape) == shape
    assert make_tensor(TensorSpec(torch.bool, (64,)), generator).any()
