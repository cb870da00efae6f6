"""A shard's header, read and checked as strictly as safetensors and runai-model-streamer do.

Two ranged reads at most per shard (one for all but the largest headers), then every rule safetensors
enforces, and runai's own: which dtypes it streams with this torch and how it packs the packed ones. A shard
whose header breaks a rule is a named problem, never an exception.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Optional

from ..settings import RUNAI_MAX_HEADER_BYTES
from .checkpoint import ERROR, Problem, Shard, TensorInfo, quote
from .jsonread import JsonRejected, read_json
from .storage import ObjectInfo, Store

# The first ranged read of a shard takes the 8-byte length and, speculatively, what follows: for
# most real shards (headers of tens of KB in files of GBs) the whole JSON, in one round trip. It
# reads at most 64 KiB and 1/1024 of the file, so a probe reads next to no tensor data.
_PREFETCH_BYTES = 64 * 1024
_PREFETCH_SHARE = 1024
# A file this small (an empty shard is 8 bytes of length and a padded "{}") is read whole in one
# round trip; by the 1/1024 rule it would take two.
_WHOLE_FILE_BYTES = 4 * 1024
_CORRUPT = "corrupt_header"

# Every dtype safetensors (0.8) defines, with its size in bits.
_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
}  # fmt: skip


@lru_cache(maxsize=1)
def _runai_packing() -> Mapping[str, int]:
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
    values), except that a packed dtype's last axis holds :func:`_runai_packing` values per element."""
    values = _runai_packing().get(dtype, 1)
    if values == 1 or not shape:
        return tuple(shape)
    return tuple(shape[:-1]) + (shape[-1] // values,)


@lru_cache(maxsize=1)
def runai_dtypes() -> Mapping[str, Any]:
    """safetensors dtype -> the torch dtype runai-model-streamer hands out, for those it can stream.

    runai's own table, less any dtype whose element size differs from the safetensors one times the values
    runai packs into an element (:func:`_runai_packing`): F4 on runai 0.17.0, which reads a byte per element
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
    packed = _runai_packing()
    return {name: dtype for name, dtype in safetensors_to_torch_dtype.items()
            if name in _DTYPE_BITS and dtype.itemsize * 8 == _DTYPE_BITS[name] * packed.get(name, 1)}  # fmt: skip


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
    return size if size <= _WHOLE_FILE_BYTES else min(size, max(8, min(_PREFETCH_BYTES, size // _PREFETCH_SHARE)))



def read_header(
    store: Store, obj: ObjectInfo, header_bytes: int = RUNAI_MAX_HEADER_BYTES
) -> tuple[Shard, list[Problem]]:
    """Read one shard's header (8 bytes, then the JSON) and validate it as strictly as safetensors does.

    Refused, each as a named problem: a header that is no JSON object or
    breaks the JSON reader's rules (duplicate_key for a tensor named twice),
    an unknown dtype (unknown_dtype) or one runai cannot stream
    (unsupported_dtype), a shape that is not a list of non-negative
    integers (bad_shape), offsets that are not two ordered non-negative
    integers (bad_offsets), a byte range that does not fit dtype and shape,
    data past the end of the file (truncated_shard), gaps (offset_gap) or
    overlaps (offset_overlap) between tensors, the first tensor not at 0,
    and bytes after the last tensor (trailing_bytes). ``header_bytes``: the longest header read
    (MX_ROBUST_MAX_HEADER_BYTES; runai's own limit when not given).
    """
    shard = Shard(key=obj.key, uri=obj.uri, size=obj.size, identity=obj.identity)
    try:
        header, header_len = _read_json_header(store, obj, header_bytes, shard)
        located = _located_tensors(header, header_len, obj.size - 8 - header_len)
    except _Refused as refused:
        kind, tensor, message = refused.args
        return shard, [Problem(kind, ERROR, obj.key, tensor, f"{obj.uri}: {message}")]
    shard.tensors = {info.name: info for info in located}
    shard.readable = True
    return shard, []


class _Refused(Exception):
    """A header breaks a rule: (problem kind, the tensor it concerns or None, message)."""


def _read_json_header(store: Store, obj: ObjectInfo, header_bytes: int, shard: Shard) -> tuple[dict, int]:
    """The header's JSON object and its length, in one ranged read for all but the largest headers (the bytes
    read go to ``shard.header_bytes``)."""
    if not obj.regular:
        raise _Refused("not_regular_file", None, f"is a {obj.kind}, not a regular file; not opened")
    if obj.size < 8:
        raise _Refused(_CORRUPT, None, f"file is {obj.size} bytes, shorter than the 8-byte safetensors header length")
    prefetch = _prefetch_bytes(obj.size)
    prefix = store.read(obj, 0, prefetch)
    if len(prefix) < 8:
        raise _Refused(_CORRUPT, None, f"read {len(prefix)} of the 8 header-length bytes")
    header_len = int.from_bytes(prefix[:8], "little")
    if header_len > obj.size - 8:
        raise _Refused(_CORRUPT, None, f"header length {header_len} exceeds the file size {obj.size} (truncated, or "
                                       "not a safetensors file?)")  # fmt: skip
    if header_len > header_bytes:
        raise _Refused(_CORRUPT, None, f"header length {header_len} is implausible: over MX_ROBUST_MAX_HEADER_BYTES="
                                       f"{header_bytes} (not a safetensors file?)")  # fmt: skip
    raw = prefix[8 : 8 + header_len]
    if len(raw) < header_len and len(prefix) == prefetch:
        raw += store.read(obj, len(prefix), header_len - len(raw))
    if len(raw) != header_len:
        raise _Refused(_CORRUPT, None, f"read {len(raw)} of {header_len} header bytes")
    shard.header_bytes = 8 + header_len
    try:
        header = read_json(raw, max_bytes=header_bytes, cap_name="MX_ROBUST_MAX_HEADER_BYTES")
    except JsonRejected as exc:
        if exc.reason == "duplicate_key":
            raise _Refused("duplicate_key", exc.key, f"header names tensor {quote(exc.key)} twice") from None
        raise _Refused(_CORRUPT, None, f"header: {exc}; not a safetensors file?") from None
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _Refused(_CORRUPT, None, "__metadata__ is not an object of strings")
    return header, header_len


def _located_tensors(header: dict, header_len: int, data_size: int) -> list[TensorInfo]:
    """Every tensor of ``header`` in file order, each entry, then their layout, checked."""
    located: list[TensorInfo] = []
    unsupported: Optional[tuple[str, str]] = None
    streamable = runai_dtypes()
    for name, entry in header.items():
        if name != "__metadata__":
            located.append(_tensor(name, entry, header_len, data_size, streamable))
            if unsupported is None and located[-1].dtype not in streamable:
                unsupported = (name, located[-1].dtype)
    # In file order (as runai reads them: by offset, then size), not the header's key order.
    located.sort(key=lambda info: (info.start, info.nbytes))
    covered = 0
    for info in located:
        start = info.start - 8 - header_len
        if start > covered:
            where = "the data section starts" if covered == 0 else f"the tensor before it ends at byte {covered}"
            raise _Refused("offset_gap", info.name, f"tensor {quote(info.name)} starts at byte {start} of the data, "
                           f"but {where}: a gap of {start - covered} bytes, which safetensors and runai-model-streamer "
                           "refuse")  # fmt: skip
        if start < covered:
            raise _Refused("offset_overlap", info.name, f"tensor {quote(info.name)} starts at byte {start} of the "
                           f"data, inside the tensor before it (which ends at byte {covered}): overlapping data")
        covered = start + info.nbytes
    if covered != data_size:
        raise _Refused("trailing_bytes", None, f"{data_size - covered} bytes after the last tensor's data (it ends at "
                       f"byte {covered} of {data_size}); safetensors refuses a file its header does not cover")
    if unsupported is not None:
        name, dtype = unsupported
        raise _Refused("unsupported_dtype", name, f"tensor {quote(name)}: dtype {dtype} is valid safetensors, but "
                       f"runai-model-streamer cannot stream it with this torch (it streams {', '.join(streamable)})")
    return located


def _tensor(name: str, entry: Any, header_len: int, data_size: int, streamable: Mapping[str, Any]) -> TensorInfo:
    """One header entry, checked: dtype, shape, offsets, and that they agree with each other and the file."""
    quoted = quote(name)
    if not isinstance(entry, dict):
        raise _Refused(_CORRUPT, name, f"tensor {quoted}: entry is not an object: {quote(entry)}")
    absent = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
    if absent:
        raise _Refused(_CORRUPT, name, f"tensor {quoted}: entry has no {', '.join(absent)}: {quote(entry)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
        raise _Refused("unknown_dtype", name, f"tensor {quoted}: unknown dtype {quote(dtype)} (safetensors knows "
                                              f"{', '.join(_DTYPE_BITS)})")  # fmt: skip
    # bool is an int in Python, not in JSON's sense (safetensors refuses true/false here).
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _Refused("bad_shape", name, f"tensor {quoted}: shape {quote(shape)} is not a list of non-negative "
                                          "integers")  # fmt: skip
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int and x >= 0 for x in offsets)
            and offsets[0] <= offsets[1]):  # fmt: skip
        raise _Refused("bad_offsets", name, f"tensor {quoted}: data_offsets {quote(offsets)} are not two ordered "
                                            "non-negative integers")  # fmt: skip
    start, end = offsets
    bits = _numel(shape, 8 * max(data_size, end)) * _DTYPE_BITS[dtype]
    if bits % 8:
        raise _Refused("bad_shape", name, f"tensor {quoted}: {dtype}{quote(shape)} is {bits} bits, not whole bytes")
    if end - start != bits // 8:
        raise _Refused(_CORRUPT, name, f"tensor {quoted}: byte range {start}-{end} does not match "
                                       f"{dtype}{quote(shape)}")  # fmt: skip
    if end > data_size:
        raise _Refused("truncated_shard", None, f"truncated: tensor {quoted} ends at byte {end} of the data, which "
                                                f"holds only {data_size}")  # fmt: skip
    values = _runai_packing().get(dtype, 1)
    if values > 1 and dtype in streamable and (not shape or shape[-1] % values):
        raise _Refused("bad_shape", name, f"tensor {quoted}: {dtype}{quote(shape)}: runai-model-streamer packs "
                       f"{values} {dtype} values per element along the last axis, and that axis does not hold a "
                       f"multiple of {values}")  # fmt: skip
    return TensorInfo(name, dtype, tuple(shape), end - start, start=8 + header_len + start)
