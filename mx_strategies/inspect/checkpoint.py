"""Checkpoint inspection: shards, headers and index, never tensor data.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header naming every tensor with its dtype, shape and byte range. Reading
only that (two ranged reads per shard) tells us, before the model is touched,
which tensors a load must deliver, which shards are empty, and whether the
index and the files agree. The results are plain data; deciding what to do
about a problem is the caller's job (the strategy fails, ``doctor`` reports).
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Collection, Iterable, Mapping, Optional

from ..errors import NoCheckpoint, StoreError, listed
from .jsonread import JsonRejected, read_json
from .remedies import remedy
from ..settings import RobustSettings
from .storage import ObjectInfo, Store, open_store

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
SAFETENSORS_SUFFIX = ".safetensors"

# Largest header runai-model-streamer accepts (MX_ROBUST_MAX_HEADER_BYTES may lower it).
MAX_HEADER_BYTES = 100 * 1024 * 1024
HEADER_READ_WORKERS = 16
# The first ranged read of a shard takes the 8-byte length and, speculatively, what follows: for
# most real shards (headers of tens of KB in files of GBs) the whole JSON, in one round trip. It
# reads at most 64 KiB and 1/1024 of the file, so a probe reads next to no tensor data.
HEADER_PREFETCH_BYTES = 64 * 1024
HEADER_PREFETCH_SHARE = 1024
# A file this small (an empty shard is 8 bytes of length and a padded "{}") is read whole in one
# round trip; by the 1/1024 rule it would take two.
HEADER_WHOLE_FILE_BYTES = 4 * 1024
# The config.json keys that count a checkpoint's MTP layers: checked for plausibility here, read by draft selection.
NEXTN_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_predict")
# A layer count in config.json above this is no model (draft selection enumerates the layers).
MAX_LAYER_COUNT = 65_536
# Names and shapes quoted in a message are cut to this many characters.
QUOTE_CHARS = 200

# Every dtype safetensors (0.8) defines, with its size in bits.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
}  # fmt: skip


@lru_cache(maxsize=1)
def runai_packing() -> Mapping[str, int]:
    """safetensors dtype -> how many of its values one torch element holds, for the packed dtypes the installed
    runai-model-streamer streams as such: runai 0.17.1 hands F4 out as ``float4_e2m1fn_x2``, two values per
    element, along the last axis (its ``PACKED_VALUES_PER_ELEMENT``). Empty where runai has no such table
    (0.17.0 reads a byte per element: F4 is not streamable there)."""
    try:
        from runai_model_streamer.safetensors_streamer.safetensors_pytorch import PACKED_VALUES_PER_ELEMENT
    except Exception:  # noqa: BLE001 - an older runai, or none: no packed dtype
        return {}
    return {name: int(values) for name, values in PACKED_VALUES_PER_ELEMENT.items()}


def storage_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the tensor runai hands out for a header entry: the header's (safetensors records the
    values), except that a packed dtype's last axis holds :func:`runai_packing` values per element."""
    values = runai_packing().get(dtype, 1)
    if values == 1 or not shape:
        return tuple(shape)
    return tuple(shape[:-1]) + (shape[-1] // values,)


@lru_cache(maxsize=1)
def runai_dtypes() -> Mapping[str, Any]:
    """safetensors dtype -> the torch dtype runai-model-streamer hands out, for those it can stream.

    runai's own table, less any dtype whose element size differs from the safetensors one times the values
    runai packs into an element (:func:`runai_packing`): F4 on runai 0.17.0, which reads a byte per element
    and would refuse or misread those files after the load started; F4 on runai 0.17.1 streams.
    """
    try:
        from runai_model_streamer.safetensors_streamer.safetensors_pytorch import safetensors_to_torch_dtype
    except Exception:  # runai not importable (doctor on a machine without it): the common dtypes
        import torch

        safetensors_to_torch_dtype = {
            "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
            "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
        }  # fmt: skip
    packed = runai_packing()
    result = {}
    for name, dtype in safetensors_to_torch_dtype.items():
        bits = DTYPE_BITS.get(name)
        if bits is not None and dtype.itemsize * 8 == bits * packed.get(name, 1):
            result[name] = dtype
    return result


@dataclass(frozen=True)
class ProbeLimits:
    """Size caps for what a probe parses (MX_ROBUST_MAX_*_BYTES)."""

    header_bytes: int = MAX_HEADER_BYTES
    index_bytes: int = 64 * 1024 * 1024
    config_bytes: int = 16 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings) -> "ProbeLimits":
        return cls(settings.max_header_bytes, settings.max_index_bytes, settings.max_config_bytes)

    @classmethod
    def current(cls) -> "ProbeLimits":
        from ..settings import current_settings

        return cls.from_settings(current_settings())


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 5] + "...]"

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
            "remedy": remedy(self.kind),
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
    identity: Optional[str] = None  # the file's identity when inspected (ObjectInfo.identity)
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


def loaded_shards(checkpoint: Checkpoint, settings: Any, names: Optional[Collection[str]] = None) -> list[Shard]:
    """The shards a load streams, in load order: readable, empty ones only where not skipped
    (``MX_ROBUST_SKIP_EMPTY_SHARDS``); given ``names``, only those holding at least one of them."""
    shards = [s for s in checkpoint.shards if s.readable and (s.tensors or not settings.skip_empty_shards)]
    return shards if names is None else shards_holding(shards, names)


def shards_holding(shards: Iterable[Shard], names: Collection[str]) -> list[Shard]:
    """The shards that hold at least one of ``names``, in their order: the only ones a narrowed load reads."""
    return [s for s in shards if any(n in names for n in s.tensors)]


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


def _numel(shape: list[int], ceiling: int) -> int:
    """The product of ``shape``, or ``ceiling + 1`` once it passes ``ceiling`` (no huge integers)."""
    if 0 in shape:
        return 0
    count = 1
    for dim in shape:
        count *= dim
        if count > ceiling:
            return ceiling + 1
    return count


def _prefetch_bytes(size: int) -> int:
    if size <= HEADER_WHOLE_FILE_BYTES:
        return size
    return min(size, max(8, min(HEADER_PREFETCH_BYTES, size // HEADER_PREFETCH_SHARE)))


def read_header(store: Store, obj: ObjectInfo, limits: Optional[ProbeLimits] = None) -> tuple[Shard, list[Problem]]:
    """Read one shard's header (8 bytes, then the JSON) and validate it as strictly as safetensors does.

    Refused, each as a named problem: a header that is no JSON object or
    breaks the JSON reader's rules (duplicate_key for a tensor named twice),
    an unknown dtype (unknown_dtype) or one runai cannot stream
    (unsupported_dtype), a shape that is not a list of non-negative
    integers (bad_shape), offsets that are not two ordered non-negative
    integers (bad_offsets), a byte range that does not fit dtype and shape,
    data past the end of the file (truncated_shard), gaps (offset_gap) or
    overlaps (offset_overlap) between tensors, the first tensor not at 0,
    and bytes after the last tensor (trailing_bytes).
    """
    limits = limits or ProbeLimits.current()
    shard = Shard(key=obj.key, uri=obj.uri, size=obj.size, identity=obj.identity)

    def corrupt(message: str, kind: str = "corrupt_header", tensor: Optional[str] = None) -> tuple[Shard, list[Problem]]:
        return shard, [Problem(kind, ERROR, obj.key, tensor, f"{obj.uri}: {message}")]

    if not obj.regular:
        return corrupt(f"is a {obj.kind}, not a regular file; not opened", kind="not_regular_file")
    if obj.size < 8:
        return corrupt(f"file is {obj.size} bytes, shorter than the 8-byte safetensors header length")
    # One ranged read fetches the length and, for all but the largest headers, the JSON too.
    prefetch = _prefetch_bytes(obj.size)
    prefix = store.read(obj, 0, prefetch)
    if len(prefix) < 8:
        return corrupt(f"read {len(prefix)} of the 8 header-length bytes")
    header_len = int.from_bytes(prefix[:8], "little")
    if header_len > obj.size - 8:
        return corrupt(
            f"header length {header_len} exceeds the file size {obj.size} (truncated, or not a safetensors file?)"
        )
    if header_len > limits.header_bytes:
        return corrupt(
            f"header length {header_len} is implausible: over MX_ROBUST_MAX_HEADER_BYTES={limits.header_bytes} "
            "(not a safetensors file?)"
        )
    raw = prefix[8 : 8 + header_len]
    if len(raw) < header_len and len(prefix) == prefetch:
        raw += store.read(obj, len(prefix), header_len - len(raw))
    if len(raw) != header_len:
        return corrupt(f"read {len(raw)} of {header_len} header bytes")
    shard.header_bytes = 8 + header_len
    try:
        header = read_json(raw, max_bytes=limits.header_bytes, cap_name="MX_ROBUST_MAX_HEADER_BYTES")
    except JsonRejected as exc:
        if exc.reason == "duplicate_key":
            return corrupt(f"header names tensor {_quote(exc.key)} twice", kind="duplicate_key", tensor=exc.key)
        return corrupt(f"header: {exc}; not a safetensors file?")

    data_size = obj.size - 8 - header_len
    metadata = header.get("__metadata__")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        return corrupt("__metadata__ is not an object of strings")
    located: list[tuple[int, TensorInfo]] = []
    unsupported: Optional[tuple[str, str]] = None
    streamable = runai_dtypes()
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        quoted = _quote(name)
        if not isinstance(entry, dict):
            return corrupt(f"tensor {quoted}: entry is not an object: {_quote(entry)}", tensor=name)
        absent = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
        if absent:
            return corrupt(f"tensor {quoted}: entry has no {', '.join(absent)}: {_quote(entry)}", tensor=name)
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            return corrupt(
                f"tensor {quoted}: unknown dtype {_quote(dtype)} (safetensors knows {', '.join(DTYPE_BITS)})",
                kind="unknown_dtype", tensor=name,
            )  # fmt: skip
        # bool is an int in Python, not in JSON's sense (safetensors refuses true/false here).
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return corrupt(f"tensor {quoted}: shape {_quote(shape)} is not a list of non-negative integers",
                           kind="bad_shape", tensor=name)  # fmt: skip
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(x) is int and x >= 0 for x in offsets)
            and offsets[0] <= offsets[1]
        ):
            return corrupt(
                f"tensor {quoted}: data_offsets {_quote(offsets)} are not two ordered non-negative integers",
                kind="bad_offsets", tensor=name,
            )  # fmt: skip
        start, end = offsets
        bits = _numel(shape, 8 * max(data_size, end)) * DTYPE_BITS[dtype]
        if bits % 8:
            return corrupt(f"tensor {quoted}: {dtype}{_quote(shape)} is {bits} bits, not whole bytes",
                           kind="bad_shape", tensor=name)  # fmt: skip
        if end - start != bits // 8:
            return corrupt(
                f"tensor {quoted}: byte range {start}-{end} does not match {dtype}{_quote(shape)}", tensor=name
            )
        if end > data_size:
            return corrupt(
                f"truncated: tensor {quoted} ends at byte {end} of the data, which holds only {data_size}",
                kind="truncated_shard", tensor=None,
            )  # fmt: skip
        if unsupported is None and dtype not in streamable:
            unsupported = (name, dtype)
        values = runai_packing().get(dtype, 1)
        if values > 1 and dtype in streamable and (not shape or shape[-1] % values):
            return corrupt(
                f"tensor {quoted}: {dtype}{_quote(shape)}: runai-model-streamer packs {values} {dtype} values per "
                f"element along the last axis, and that axis does not hold a multiple of {values}",
                kind="bad_shape", tensor=name,
            )  # fmt: skip
        located.append((start, TensorInfo(name, dtype, tuple(shape), end - start, start=8 + header_len + start)))
    # In file order (as runai reads them: by offset, then size), not the header's key order.
    located.sort(key=lambda item: (item[0], item[1].nbytes))
    covered = 0
    for start, info in located:
        if start > covered:
            where = "the data section starts" if covered == 0 else f"the tensor before it ends at byte {covered}"
            return corrupt(
                f"tensor {_quote(info.name)} starts at byte {start} of the data, but {where}: a gap of "
                f"{start - covered} bytes, which safetensors and runai-model-streamer refuse",
                kind="offset_gap", tensor=info.name,
            )  # fmt: skip
        if start < covered:
            return corrupt(
                f"tensor {_quote(info.name)} starts at byte {start} of the data, inside the tensor before it "
                f"(which ends at byte {covered}): overlapping data",
                kind="offset_overlap", tensor=info.name,
            )  # fmt: skip
        covered = start + info.nbytes
    if covered != data_size:
        return corrupt(
            f"{data_size - covered} bytes after the last tensor's data (it ends at byte {covered} of "
            f"{data_size}); safetensors refuses a file its header does not cover",
            kind="trailing_bytes",
        )  # fmt: skip
    if unsupported is not None:
        name, dtype = unsupported
        return corrupt(
            f"tensor {_quote(name)}: dtype {dtype} is valid safetensors, but runai-model-streamer cannot stream "
            f"it with this torch (it streams {', '.join(streamable)})",
            kind="unsupported_dtype", tensor=name,
        )  # fmt: skip
    shard.tensors = {info.name: info for _, info in located}
    shard.readable = True
    return shard, []


def _read_json(
    store: Store, obj: ObjectInfo, problems: list[Problem], kind: str, cap: int, cap_name: str
) -> Optional[dict]:
    """The index or config.json through the guarded reader; a failure is a ``kind`` problem (or duplicate_key)."""
    if not obj.regular:
        problems.append(
            Problem("not_regular_file", ERROR, obj.key, None, f"{obj.uri}: is a {obj.kind}, not a regular file; not opened")
        )
        return None
    if obj.size > cap:
        problems.append(Problem(kind, ERROR, obj.key, None, f"{obj.uri}: {obj.size} bytes, over {cap_name}={cap}; not read"))
        return None
    raw = store.read(obj, 0, obj.size)
    try:
        return read_json(raw, max_bytes=cap, cap_name=cap_name)
    except JsonRejected as exc:
        problem_kind = "duplicate_key" if exc.reason == "duplicate_key" else kind
        problems.append(Problem(problem_kind, ERROR, obj.key, None, f"{obj.uri}: {exc}"))
        return None


def _check_config(config: dict, obj: ObjectInfo, problems: list[Problem]) -> Optional[dict]:
    """Layer counts draft selection relies on must be plausible integers; else a corrupt_config problem."""
    scopes = [config]
    if isinstance(config.get("text_config"), dict):
        scopes.append(config["text_config"])
    for scope in scopes:
        for key in ("num_hidden_layers", *NEXTN_COUNT_KEYS):
            value = scope.get(key)
            if isinstance(value, (int, float)) and not (type(value) is int and 0 <= value <= MAX_LAYER_COUNT):
                problems.append(
                    Problem(
                        "corrupt_config", ERROR, obj.key, None,
                        f"{obj.uri}: {key}={_quote(value)} is not a layer count (an integer from 0 to {MAX_LAYER_COUNT})",
                    )
                )  # fmt: skip
                return None
    return config


def _why_missing(key: str, max_depth: int, unreadable: Mapping[str, str]) -> str:
    """Why a listed checkpoint lacks ``key``, when the listing can tell."""
    depth = key.count("/")
    if not depth:
        return ""
    folder = key
    while unreadable and "/" in folder:
        folder = folder.rsplit("/", 1)[0]
        if folder in unreadable:
            return f"; its folder {folder} could not be listed ({unreadable[folder]})"
    if depth > max_depth:
        return f"; it lies {depth} folder levels down, beyond MX_ROBUST_DISCOVERY_DEPTH={max_depth}"
    return ""


def inspect(store: Store, max_depth: int, limits: Optional[ProbeLimits] = None) -> Checkpoint:
    """List ``store`` and read every header; raise NoCheckpoint if it has no shard.

    StoreError (listing, access) propagates: the caller names the candidate.
    Linear in the number of files, index entries and tensors.
    """
    limits = limits or ProbeLimits.current()
    root, objects, index_obj, config_obj = locate(store.list(max_depth))

    def in_root(key: str) -> bool:
        return posixpath.dirname(key) == root

    # Index, config and every header beside them are read at once: on an object store each read
    # is a round trip, and none of them depends on another (the index only adds shards elsewhere).
    local_shards = {o.key for o in objects if in_root(o.key) and o.key.endswith(SAFETENSORS_SUFFIX)}
    pool = ThreadPoolExecutor(max_workers=min(HEADER_READ_WORKERS, len(local_shards) + 2))
    try:
        index_problems: list[Problem] = []
        config_problems: list[Problem] = []

        def submit_json(obj: Optional[ObjectInfo], problems: list[Problem], kind: str, cap: int, cap_name: str):
            return pool.submit(_read_json, store, obj, problems, kind, cap, cap_name) if obj else None

        index_read = submit_json(
            index_obj, index_problems, "corrupt_index", limits.index_bytes, "MX_ROBUST_MAX_INDEX_BYTES"
        )
        config_read = submit_json(
            config_obj, config_problems, "corrupt_config", limits.config_bytes, "MX_ROBUST_MAX_CONFIG_BYTES"
        )
        headers = {
            key: pool.submit(read_header, store, obj, limits)
            for key, obj in ((o.key, o) for o in objects if o.key in local_shards)
        }
        index = index_read.result() if index_read else None
        config = config_read.result() if config_read else None
        return _assemble(store, max_depth, limits, root, objects, index_obj, index, config_obj, config,
                         index_problems + config_problems, headers, pool)  # fmt: skip
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _assemble(store, max_depth, limits, root, objects, index_obj, index, config_obj, config, problems, headers, pool):
    """Check the index against the headers (read in ``headers``, more submitted to ``pool`` as needed)."""
    if config is not None:
        config = _check_config(config, config_obj, problems)
    by_key = {o.key: o for o in objects}
    weight_map: dict[str, str] = {}
    if index is not None:
        raw_map = index.get("weight_map")
        if not isinstance(raw_map, dict):
            problems.append(Problem("corrupt_index", ERROR, index_obj.key, None, f"{index_obj.uri}: no weight_map"))
        else:
            bad = next(((t, f) for t, f in raw_map.items() if not isinstance(f, str) or not f), None)
            if bad is not None:
                problems.append(
                    Problem(
                        "corrupt_index", ERROR, index_obj.key, bad[0],
                        f"{index_obj.uri}: weight_map names {_quote(bad[1])} as the file of tensor {_quote(bad[0])}, "
                        "not a file name",
                    )
                )  # fmt: skip
            else:
                resolved: dict[str, str] = {}  # most files hold many tensors: resolve each name once
                for f in raw_map.values():
                    if f not in resolved:
                        resolved[f] = posixpath.normpath(posixpath.join(root, f))
                weight_map = {t: resolved[f] for t, f in raw_map.items()}
        shard_keys = set(weight_map.values())
        if shard_keys and not any(k in by_key for k in shard_keys):
            raise NoCheckpoint(
                f"holds {INDEX_NAME} but none of the {len(shard_keys)} shard(s) it names (a config-only copy?)"
            )
        counts = Counter(weight_map.values())
        unreadable = getattr(store, "unreadable", None) or {}
        for key in sorted(shard_keys):
            if key not in by_key:
                problems.append(
                    Problem(
                        "missing_shard", ERROR, key, None,
                        f"{store.root}/{key}: named by {INDEX_NAME} for {counts[key]} tensor(s) but not found"
                        f"{_why_missing(key, max_depth, unreadable)}",
                    )
                )  # fmt: skip
    else:
        shard_keys = set()
    for key in shard_keys:  # shards the index names outside the checkpoint folder
        if key in by_key and key not in headers:
            headers[key] = pool.submit(read_header, store, by_key[key], limits)
    read = [headers[key].result() for key in sorted(headers, key=natural_key)]
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


def source_changes(source: str, shards, settings: RobustSettings) -> tuple[list[str], list[str]]:
    """(shards whose identity changed, shards whose identity could not be read), as messages.

    One listing of the source gives every shard's identity at once (a page
    per 1,000 objects on an object store), instead of a request per shard.
    """
    try:
        store = open_store(source, timeout_s=settings.probe_timeout_s, max_attempts=settings.probe_max_attempts)
        depth = max((shard.key.count("/") for shard in shards), default=0)
        listed = {obj.key: obj.identity for obj in store.list(depth)}
    except StoreError as exc:
        return [], [f"{source} ({exc})"]
    changed, unknown = [], []
    for shard in shards:
        if shard.key not in listed:
            changed.append(f"{shard.uri} (was {shard.identity}, now gone)")
        elif listed[shard.key] is None:
            unknown.append(f"{shard.uri} (no identity)")
        elif listed[shard.key] != shard.identity:
            changed.append(f"{shard.uri} (was {shard.identity}, now {listed[shard.key]})")
    return changed, unknown


def unreachable(
    checkpoint: Checkpoint, settings: RobustSettings, names: Optional[Collection[str]], *, besides: Collection[str] = ()
) -> Optional[str]:
    """Why this process cannot stream the shards of ``checkpoint`` holding ``names`` (None: every loaded shard)
    as they were inspected, other than the shards in ``besides`` (keys); None: it can. A file it cannot read,
    or one changed since: what a rank checks of the files another rank inspected."""
    shards = [s for s in loaded_shards(checkpoint, settings, names) if s.key not in besides]
    if not shards:
        return None
    changed, unknown = source_changes(checkpoint.uri, shards, settings)
    problems = [f"changed since rank 0 inspected it: {c}" for c in changed] + [f"cannot read: {u}" for u in unknown]
    return listed(problems, 3, "; ") if problems else None


__all__ = [
    "Checkpoint",
    "DTYPE_BITS",
    "NoCheckpoint",
    "Problem",
    "ProbeLimits",
    "Shard",
    "StoreError",
    "TensorInfo",
    "inspect",
    "natural_key",
    "runai_dtypes",
    "loaded_shards",
    "shards_holding",
    "source_changes",
    "unreachable",
    "runai_packing",
    "storage_shape",
]
