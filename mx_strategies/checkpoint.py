"""Checkpoint inspection: shards, headers and index, never tensor data.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header naming every tensor with its dtype, shape and byte range. Reading
only that (two ranged reads per shard) tells us, before the model is touched,
which tensors a load must deliver, which shards are empty, and whether the
index and the files agree. The results are plain data; deciding what to do
about a problem is the caller's job (the strategy fails, ``doctor`` reports).
"""

from __future__ import annotations

import json
import posixpath
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from math import prod
from typing import Iterable, Optional

from .errors import NoCheckpoint, StoreError
from .storage import ObjectInfo, Store

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
SAFETENSORS_SUFFIX = ".safetensors"

# Largest header we accept; real ones are a few MB at most.
MAX_HEADER_BYTES = 100 * 1024 * 1024
HEADER_READ_WORKERS = 16

DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    """Something wrong with a checkpoint, tied to the file/tensor it concerns."""

    kind: str
    severity: str
    file: Optional[str]
    tensor: Optional[str]
    message: str

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "tensor": self.tensor,
            "message": self.message,
        }


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    start: Optional[int] = None  # absolute offset of its data in the file, when read from a header


@dataclass
class Shard:
    """One safetensors file and what its header says it holds."""

    key: str
    uri: str
    size: int
    header_bytes: int = 0  # 8 + JSON length, once read
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    readable: bool = False

    @property
    def empty(self) -> bool:
        return self.readable and not self.tensors

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@dataclass
class Checkpoint:
    """A source's shards in load order, its index and what is wrong with it."""

    uri: str
    root_key: str  # folder below the source holding the index or shards ("" = top)
    shards: list[Shard]
    index: Optional[dict]
    config: Optional[dict]
    problems: list[Problem]
    outside_index: list[Shard] = field(default_factory=list)  # shards next to an index that it does not name

    @property
    def loadable_shards(self) -> list[Shard]:
        """Readable shards holding at least one tensor, in load order."""
        return [s for s in self.shards if s.readable and s.tensors]

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def tensor_count(self) -> int:
        return sum(len(s.tensors) for s in self.loadable_shards)

    @property
    def data_bytes(self) -> int:
        return sum(s.data_bytes for s in self.loadable_shards)

    @property
    def metadata_bytes(self) -> int:
        """Bytes a probe reads: every header plus the index and config."""
        return sum(s.header_bytes for s in self.shards)

    def tensors(self) -> dict[str, TensorInfo]:
        return {name: info for s in self.loadable_shards for name, info in s.tensors.items()}

    def shard_of(self) -> dict[str, Shard]:
        return {name: s for s in self.loadable_shards for name in s.tensors}


def natural_key(name: str) -> list:
    """Sort key putting ``model-2`` before ``model-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def locate(objects: Iterable[ObjectInfo]) -> tuple[str, list[ObjectInfo], Optional[ObjectInfo], Optional[ObjectInfo]]:
    """Find the checkpoint folder among the listed files.

    The top wins when it holds shards or an index; otherwise the shallowest
    folder that does (vLLM's ``model_streamer/<hash>`` cache and HF's
    ``snapshots/<rev>`` put them below). Two such folders at the same depth
    are ambiguous and rejected rather than guessed.
    Returns (root key, all files, index file, config file).
    """
    objects = list(objects)
    folders: dict[str, list[ObjectInfo]] = {}
    for obj in objects:
        folder = posixpath.dirname(obj.key)
        if obj.key.endswith(SAFETENSORS_SUFFIX) or posixpath.basename(obj.key) == INDEX_NAME:
            folders.setdefault(folder, []).append(obj)
    if not folders:
        names = sorted(o.key for o in objects)
        held = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "") if names else "nothing"
        raise NoCheckpoint(f"no *.safetensors file (holds {held})")

    def depth(folder: str) -> int:
        return 0 if folder == "" else folder.count("/") + 1

    shallowest = min(depth(f) for f in folders)
    candidates = sorted(f for f in folders if depth(f) == shallowest)
    if len(candidates) > 1:
        raise NoCheckpoint(f"several checkpoint folders at the same depth: {', '.join(candidates)}")
    root = candidates[0]
    by_key = {o.key: o for o in objects}
    index = by_key.get(posixpath.join(root, INDEX_NAME) if root else INDEX_NAME)
    config = by_key.get(posixpath.join(root, CONFIG_NAME) if root else CONFIG_NAME)
    return root, objects, index, config


def read_header(store: Store, obj: ObjectInfo) -> tuple[Shard, list[Problem]]:
    """Read one shard's header (8 bytes, then the JSON) and validate it."""
    shard = Shard(key=obj.key, uri=obj.uri, size=obj.size)

    def corrupt(message: str, kind: str = "corrupt_header") -> tuple[Shard, list[Problem]]:
        return shard, [Problem(kind, ERROR, obj.key, None, f"{obj.uri}: {message}")]

    if obj.size < 8:
        return corrupt(f"file is {obj.size} bytes, shorter than the 8-byte safetensors header length")
    prefix = store.read(obj, 0, 8)
    if len(prefix) != 8:
        return corrupt(f"read {len(prefix)} of the 8 header-length bytes")
    header_len = int.from_bytes(prefix, "little")
    if header_len > obj.size - 8:
        return corrupt(
            f"header length {header_len} exceeds the file size {obj.size} (truncated, or not a safetensors file?)"
        )
    if header_len > MAX_HEADER_BYTES:
        return corrupt(f"header length {header_len} is implausible (not a safetensors file?)")
    raw = store.read(obj, 8, header_len)
    if len(raw) != header_len:
        return corrupt(f"read {len(raw)} of {header_len} header bytes")
    shard.header_bytes = 8 + header_len
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return corrupt(f"header is not valid JSON ({exc}); not a safetensors file?")
    if not isinstance(header, dict):
        return corrupt("header is not a JSON object; not a safetensors file?")

    data_size = obj.size - 8 - header_len
    located: list[tuple[int, TensorInfo]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            start, end = (int(x) for x in entry["data_offsets"])
            itemsize = DTYPE_SIZES[dtype]
        except (KeyError, TypeError, ValueError):
            return corrupt(f"tensor {name!r} has a malformed header entry: {entry!r}")
        if end - start != prod(shape) * itemsize or start < 0:
            return corrupt(f"tensor {name!r}: byte range {start}-{end} does not match {dtype}{list(shape)}")
        if end > data_size:
            return corrupt(
                f"truncated: tensor {name!r} ends at byte {end} of the data, which holds only {data_size}",
                kind="truncated_shard",
            )
        located.append((start, TensorInfo(name, dtype, shape, end - start, start=8 + header_len + start)))
    # In file order (as runai reads them: by offset, then size), not the header's key order.
    located.sort(key=lambda item: (item[0], item[1].nbytes))
    shard.tensors = {info.name: info for _, info in located}
    shard.readable = True
    return shard, []


def _read_json(store: Store, obj: ObjectInfo, problems: list[Problem], kind: str) -> Optional[dict]:
    try:
        data = json.loads(store.read(obj, 0, obj.size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(Problem(kind, ERROR, obj.key, None, f"{obj.uri}: not valid JSON ({exc})"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(kind, ERROR, obj.key, None, f"{obj.uri}: not a JSON object"))
        return None
    return data


def inspect(store: Store, max_depth: int) -> Checkpoint:
    """List ``store`` and read every header; raise NoCheckpoint if it has no shard.

    StoreError (listing, access) propagates: the caller names the candidate.
    """
    root, objects, index_obj, config_obj = locate(store.list(max_depth))
    problems: list[Problem] = []
    index = _read_json(store, index_obj, problems, "corrupt_index") if index_obj else None
    config = _read_json(store, config_obj, [], "corrupt_config") if config_obj else None

    def in_root(key: str) -> bool:
        return posixpath.dirname(key) == root

    by_key = {o.key: o for o in objects}
    weight_map: dict[str, str] = {}
    if index is not None:
        raw_map = index.get("weight_map")
        if not isinstance(raw_map, dict):
            problems.append(Problem("corrupt_index", ERROR, index_obj.key, None, f"{index_obj.uri}: no weight_map"))
        else:
            weight_map = {t: posixpath.normpath(posixpath.join(root, f)) for t, f in raw_map.items()}
        shard_keys = set(weight_map.values())
        if shard_keys and not any(k in by_key for k in shard_keys):
            raise NoCheckpoint(
                f"holds {INDEX_NAME} but none of the {len(shard_keys)} shard(s) it names (a config-only copy?)"
            )
        for key in sorted(shard_keys):
            if key not in by_key:
                count = sum(1 for f in weight_map.values() if f == key)
                problems.append(
                    Problem(
                        "missing_shard", ERROR, key, None,
                        f"{store.root}/{key}: named by {INDEX_NAME} for {count} tensor(s) but not found",
                    )
                )  # fmt: skip
    else:
        shard_keys = set()
    local_shards = {o.key for o in objects if in_root(o.key) and o.key.endswith(SAFETENSORS_SUFFIX)}
    shard_objs = sorted(
        (by_key[k] for k in (shard_keys | local_shards) if k in by_key), key=lambda o: natural_key(o.key)
    )
    with ThreadPoolExecutor(max_workers=min(HEADER_READ_WORKERS, max(1, len(shard_objs)))) as pool:
        read = list(pool.map(lambda o: read_header(store, o), shard_objs))
    shards = []
    outside_index = []
    for shard, shard_problems in read:
        if index is None or shard.key in shard_keys:
            shards.append(shard)
            problems.extend(shard_problems)
            continue
        outside_index.append(shard)
        if shard.empty:
            problems.append(Problem("empty_shard", WARNING, shard.key, None, f"{shard.uri}: holds no tensor; skipped"))
        else:
            # vLLM, too, loads only the files the index names (e.g. not consolidated.safetensors).
            problems.append(
                Problem("unindexed_shard", WARNING, shard.key, None, f"{shard.uri}: not named by {INDEX_NAME}; not loaded")
            )

    owner: dict[str, str] = {}
    for shard in shards:
        if shard.empty:
            problems.append(Problem("empty_shard", WARNING, shard.key, None, f"{shard.uri}: holds no tensor; skipped"))
        for name in shard.tensors:
            if name in owner:
                problems.append(
                    Problem(
                        "duplicate_tensor", ERROR, shard.key, name,
                        f"tensor {name!r} is in both {owner[name]} and {shard.key}",
                    )
                )  # fmt: skip
            else:
                owner[name] = shard.key
    if weight_map:
        # A name in two shards is a duplicate_tensor already; only a header really lacking it is this.
        held = {s.key: s.tensors for s in shards if s.readable}
        for name, key in weight_map.items():
            if key in held and name not in held[key]:
                where = f"; it is in {owner[name]}" if name in owner else ""
                problems.append(
                    Problem(
                        "missing_tensor", ERROR, key, name,
                        f"{INDEX_NAME} names tensor {name!r} in {key}, but that shard's header lacks it{where}",
                    )
                )  # fmt: skip
        for name, key in owner.items():
            if name not in weight_map:
                problems.append(
                    Problem("unindexed_tensor", WARNING, key, name, f"tensor {name!r} in {key} is not in {INDEX_NAME}")
                )

    return Checkpoint(
        uri=store.root,
        root_key=root,
        shards=shards,
        index=index,
        config=config,
        problems=problems,
        outside_index=outside_index,
    )


__all__ = [
    "Checkpoint",
    "NoCheckpoint",
    "Problem",
    "Shard",
    "StoreError",
    "TensorInfo",
    "inspect",
    "natural_key",
]
