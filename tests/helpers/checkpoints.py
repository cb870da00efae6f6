"""Checkpoints the tests write, and what a correct load of each delivers.

Real safetensors files written with ``mx_strategies.testing.synthetic.write_shards``
(numbered shards, an optional index), or one file at a time with
:func:`write_shard` (the tests' one direct writer of a safetensors file:
odd names, empty files, a shard rewritten under a load); :class:`Written` records the files in
natural order with the tensors ``safetensors`` itself reads from them and
the plan order (shards in natural order, tensors by offset) a load must
deliver them in. The damage functions break a written checkpoint the way
exporters, interrupted uploads and hand edits do, each returning the
fragments the refusal must name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file

from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.testing.synthetic import write_shards

from .headers import header_order, tensor_offsets

# (name suffix, shape in multiples of ``hidden``, dtype): one small layer of mixed
# dtypes and sizes, so tensors sit at different offsets in each file.
TINY_LAYER = (
    ("self_attn.q_proj.weight", (1, 1), torch.float32),
    ("mlp.down_proj.weight", (1, 2), torch.bfloat16),
    ("input_layernorm.weight", (1,), torch.float32),
)


def layer_shards(
    count: int,
    *,
    empty: Sequence[int] = (),
    hidden: int = 16,
    seed: int = 0,
    layer: Sequence[tuple[str, tuple, torch.dtype]] = TINY_LAYER,
) -> list[dict[str, torch.Tensor]]:
    """``count`` shards; those at ``empty`` hold no tensor, shard ``i`` the others ``model.layers.{i}.*``.

    A shape entry is a multiple of ``hidden`` or, as a string, a fixed size.
    """
    generator = torch.Generator().manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = []
    for i in range(count):
        if i in empty:
            shards.append({})
            continue
        shards.append(
            {
                f"model.layers.{i}.{suffix}": torch.randn(
                    *(int(d) if isinstance(d, str) else d * hidden for d in shape), generator=generator
                ).to(dtype)
                for suffix, shape, dtype in layer
            }
        )
    return shards


def tiny_shards(count: int, *, empty: Sequence[int] = (), hidden: int = 16, seed: int = 0) -> list[dict]:
    """``count`` shards of :data:`TINY_LAYER`; those at ``empty`` hold no tensor."""
    return layer_shards(count, empty=empty, hidden=hidden, seed=seed)


def reference_of(paths: Sequence[str]) -> dict[str, torch.Tensor]:
    """What safetensors itself reads from these files."""
    tensors: dict[str, torch.Tensor] = {}
    for path in paths:
        tensors.update(load_file(path))
    return tensors


def reference_tensors(folder: str) -> dict[str, torch.Tensor]:
    """What safetensors itself loads from every shard at the top of ``folder``."""
    return reference_of([os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".safetensors")])


@dataclass
class Written:
    """A checkpoint on disk and what a correct load of it delivers."""

    path: str
    files: list[str]  # every shard, in intended (natural) order, empty ones included
    reference: dict[str, torch.Tensor]
    order: list[str]  # shard by shard in natural order, tensors in file order

    @property
    def names(self) -> list[str]:
        """The shards' file names, natural order."""
        return [os.path.basename(f) for f in self.files]

    @property
    def loaded_files(self) -> list[str]:
        return [f for f in self.files if header_order(f)]

    @cached_property
    def offsets(self) -> dict[str, tuple[str, int, int]]:
        """tensor -> (shard file name, absolute start, end)."""
        found: dict[str, tuple[str, int, int]] = {}
        for file in self.files:
            found.update(tensor_offsets(file))
        return found

    @property
    def digests(self) -> dict[str, str]:
        """What safetensors reads, hashed as the strategy's content check hashes."""
        from mx_strategies.verify.tensor_bytes import sha256

        return {n: sha256(t) for n, t in self.reference.items()}

    @property
    def data_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.reference.values())


def write_shard(path: str, tensors: dict[str, torch.Tensor], *, metadata: Optional[dict[str, str]] = None) -> str:
    """One safetensors file at ``path`` (created or replaced) holding ``tensors``, as safetensors'
    ``save_file`` writes it (``metadata``: its ``__metadata__``, e.g. ``{"format": "pt"}``); returns ``path``.

    Tensors are made contiguous first, as ``write_shards`` makes them.
    """
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, path, metadata=metadata)
    return path


def written(path: str, files: Sequence[str]) -> Written:
    files = list(files)
    return Written(path, files, reference_of(files), [n for f in files for n in header_order(f)])


def write_checkpoint(
    path: str, shards: list[dict], *, index: bool = True, write_order=None, subfolder: str = ""
) -> Written:
    names = write_shards(path, shards, index=index, write_order=write_order, subfolder=subfolder)
    return written(path, [os.path.join(path, subfolder, n) for n in names])


def write_unpadded(path: str, shards: list[dict], *, index: bool, write_order: Sequence[int]) -> Written:
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


# -- where a load reads it from ---------------------------------------------------


def upload(s3, folder: str, prefix: str, order: Optional[list[int]] = None) -> str:
    """Upload every file of ``folder`` (sorted, then permuted by ``order``) to the test bucket."""
    files = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, names in os.walk(folder) for f in names)
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


# -- damage -------------------------------------------------------------------------

DROPPED = "model.layers.1.mlp.down_proj.weight"


def shard_path(ckpt: Written, number: int) -> str:
    """The ``number``-th shard (1-based, natural order)."""
    return ckpt.files[number - 1]


def edit_index(folder: str, change: Callable[[dict], None]) -> None:
    """Apply ``change`` to the weight map of the index in ``folder``."""
    path = os.path.join(folder, INDEX_NAME)
    with open(path) as handle:
        index = json.load(handle)
    change(index["weight_map"])
    with open(path, "w") as handle:
        json.dump(index, handle)


def replace_without(path: str, dropped: str) -> None:
    """Rewrite ``path`` as a valid safetensors file lacking ``dropped`` (another writer's copy)."""
    tensors = load_file(path)
    del tensors[dropped]
    write_shard(path, tensors)


def delete_file(path: str) -> None:
    os.remove(path)


def cut_tail(path: str, nbytes: int = 64) -> None:
    os.truncate(path, os.path.getsize(path) - nbytes)


def index_names_missing_tensor(ckpt: Written) -> list[str]:
    second = os.path.basename(shard_path(ckpt, 2))
    edit_index(ckpt.path, lambda wm: wm.__setitem__("model.layers.1.ghost.weight", second))
    return ["model.layers.1.ghost.weight", second, "header lacks it"]


def index_names_missing_shard(ckpt: Written) -> list[str]:
    os.remove(shard_path(ckpt, 3))
    return [os.path.basename(shard_path(ckpt, 3)), "not found"]


def corrupt_header(ckpt: Written) -> list[str]:
    path = shard_path(ckpt, 2)
    size = os.path.getsize(path)
    junk = b"{this is not json" + b" " * 15
    with open(path, "r+b") as handle:
        handle.write(len(junk).to_bytes(8, "little") + junk)
    assert os.path.getsize(path) == size
    return [path, "not valid JSON"]


def header_longer_than_file(ckpt: Written) -> list[str]:
    path = shard_path(ckpt, 2)
    with open(path, "r+b") as handle:
        handle.write((os.path.getsize(path) * 10).to_bytes(8, "little"))
    return [path, "exceeds the file size"]


def truncated_shard(ckpt: Written) -> list[str]:
    path = shard_path(ckpt, 2)
    cut_tail(path)
    return [path, "truncated"]


def zero_byte_shard(ckpt: Written) -> list[str]:
    path = shard_path(ckpt, 2)
    os.truncate(path, 0)
    return [path, "file is 0 bytes"]


def text_file_named_safetensors(ckpt: Written) -> list[str]:
    path = shard_path(ckpt, 2)
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
