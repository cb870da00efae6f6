"""A module's whole state, as a value two calls can compare: parameters, buffers and every attribute.

``module_state(model)`` walks the module tree and every object its modules' and parameters'
attributes reach, recursively (lists, dicts, sets, tuples, plain Python objects, bound methods),
and records for each: tensors by identity, storage, shape, dtype and bytes; containers by their
items; other objects by identity and, for Python objects, their attributes. Two snapshots are
equal when asking the module changed nothing: no attribute added or rebound, no list appended
to, no counter moved, no parameter attribute (vLLM 0.34's ``loaded_shard_ids``) marked. The
engine's configs and parallel groups are compared by identity only (shared with the twin by design,
mx_strategies/select/twin.py); functions, classes and modules likewise.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from mx_strategies.verify.tensor_bytes import same_bytes

_MAX_DEPTH = 40


class Bytes:
    """A tensor's bytes, equal to another's when every bit is (NaN sentinels included)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach().clone() if not tensor.is_meta else tensor

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bytes):
            return False
        a, b = self.tensor, other.tensor
        if a.is_meta or b.is_meta:
            return a.is_meta and b.is_meta and a.shape == b.shape and a.dtype == b.dtype
        return same_bytes(a, b)

    def __repr__(self) -> str:
        return f"Bytes({tuple(self.tensor.shape)}, {self.tensor.dtype})"


def _shared(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith(("vllm.config", "transformers", "sglang.srt.configs", "sglang.srt.server_args", "torch.distributed",
                              "torch._C", "torch._dynamo", "torch._inductor", "vllm.distributed", "sglang.srt.distributed"))  # fmt: skip


def _state(obj: Any, seen: dict, depth: int) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)):
        return obj
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
        return ("same object", id(obj))
    if id(obj) in seen:
        return ("seen", seen[id(obj)])
    seen[id(obj)] = len(seen)
    if depth > _MAX_DEPTH:
        return ("deep", id(obj))
    if isinstance(obj, torch.Tensor):
        pointer = None if obj.is_meta else obj.untyped_storage().data_ptr()
        attributes = _state(obj.__dict__, seen, depth + 1) if obj.__dict__ else None
        return ("tensor", id(obj), type(obj).__name__, pointer, obj.storage_offset(), tuple(obj.shape),
                tuple(obj.stride()), obj.dtype, Bytes(obj), attributes)  # fmt: skip
    if isinstance(obj, dict):
        return (type(obj).__name__, id(obj), tuple((repr(k), _state(v, seen, depth + 1)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, id(obj), tuple(_state(v, seen, depth + 1) for v in obj))
    if isinstance(obj, (set, frozenset)):
        return (type(obj).__name__, id(obj), tuple(sorted(repr(v) for v in obj)))
    if isinstance(obj, types.MethodType):
        return ("method", obj.__func__.__qualname__, id(obj.__self__))
    if _shared(obj):
        return ("shared", id(obj))
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        return ("object", type(obj).__qualname__, id(obj), _state(attributes, seen, depth + 1))
    return ("object", type(obj).__qualname__, id(obj))


def module_state(model: torch.nn.Module) -> Any:
    """Everything asking ``model`` could change, as a comparable value (see the module docstring)."""
    return _state(model, {}, 0)


def differences(before: Any, after: Any, path: str = "", out: list | None = None, limit: int = 10) -> list[str]:
    """Where two states differ (the first ``limit`` paths), for an assertion's message."""
    out = [] if out is None else out
    if len(out) >= limit or before == after:
        return out
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        for index, (a, b) in enumerate(zip(before, after)):
            differences(a, b, f"{path}[{index}]", out, limit)
        return out
    out.append(f"{path}: {before!r:.200} != {after!r:.200}")
    return out


__all__ = ["differences", "module_state"]
