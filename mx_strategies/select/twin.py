"""An isolated, data-less twin of a built module: what the module question runs on, never the model.

The module's own ``load_weights`` is the authority on what it reads, but
running it changes state in place: vLLM 0.34 marks shards loaded
(``loaded_shard_ids``), plugin models count or list what they were handed,
SGLang's DeepSeek derives ``w_kc``/``w_vc`` onto its attention modules. A
shallow swap of parameters cannot keep those out of the model. :func:`make_twin`
copies the module tree instead:

- every parameter and persistent buffer becomes a meta tensor of the same
  class, shape, stride and dtype (no data is copied); its Python attributes
  (``weight_loader``, ``output_dim``, shard marks) are copied too, with
  bound methods rebound to the twin's modules, so a loader that writes
  into ``self`` writes into the twin;
- every module, container (list, dict, set, tuple), ``functools.partial``,
  function holding the module in its closure or default arguments (a
  wrapper around the module's own method) and plain Python object
  reachable from the tree is the twin's own copy; non-persistent buffers
  and other tensors up to 1 MiB (an expert map a loader reads values
  from) are cloned, as their values steer the answer; larger ones
  (weights kept outside the parameters) get meta twins;
- shared with the model, by reference, and never state of this module: the
  engine's configs and parallel groups (vLLM's ``VllmConfig`` and
  ``GroupCoordinator``, transformers' and SGLang's configs, torch's process
  groups), classes, functions and Python modules. Engine-global registries
  are guarded by :mod:`.dry_run` as before.

An object the walk cannot copy (a C object that is not engine
infrastructure, an open file, a socket) raises
:class:`TwinFailed` naming the attribute's path: the caller falls back to
the table and never runs the real module.
"""

from __future__ import annotations

import collections
import contextvars
import copy
import enum
import functools
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# Objects shared with the model by reference: immutable values, code and types.
_ATOMIC = (
    type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis), type(NotImplemented),
    type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.CodeType, enum.Enum,
    weakref.ref, property, staticmethod, classmethod,
    # Process infrastructure a decorator or a cache closes over: shared, as a copy could not coordinate anything.
    contextvars.ContextVar, type(threading.Lock()), type(threading.RLock()),
)
# The engine's own infrastructure a module refers to but does not own (matched by the class's module and
# name along its MRO, so no engine has to be importable): configs and parallel groups.
_ENGINE_SHARED_MODULES = (
    "vllm.config",  # VllmConfig, ModelConfig, ParallelConfig, ... (read by loaders; the engine's)
    "vllm.transformers_utils.configs",
    "transformers.configuration_utils",  # PretrainedConfig, and so every model config derived from it (MRO)
    "sglang.srt.configs",
    "sglang.srt.server_args",
    "torch.distributed",
    "torch._C._distributed_c10d",
    "torch._dynamo",  # compiled ops' guards and configs
    "torch._inductor",
)
_ENGINE_SHARED_CLASSES = frozenset(
    {
        "vllm.distributed.parallel_state.GroupCoordinator",
        "sglang.srt.distributed.parallel_state.GroupCoordinator",
    }
)
_MAX_DEPTH = 200
# A tensor outside the parameters and persistent buffers is cloned with its values up to this size (an expert
# map, a routing table); a larger one is weights kept elsewhere, and gets a meta twin (no device memory).
_MAX_CLONED_BYTES = 1 << 20
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a C type


class TwinFailed(Exception):
    """The module holds something the twin cannot copy (named by its path): ask the table, not the module."""


@dataclass
class _Twin:
    """The twin module and its bookkeeping."""

    module: Any
    twin_of: dict  # id(real tensor) -> its meta twin (parameters and buffers)
    owned_storages: frozenset  # storage cdata of every real tensor the twin owns (clones): writable in the dry run
    objects: int  # how many objects the walk copied
    seconds: float


def _shared(obj: Any) -> bool:
    kind = type(obj)
    found = _SHARED_BY_TYPE.get(kind)
    if found is None:
        found = _shared_uncached(obj)
        if obj.__class__ is kind and not any(c.__name__ == "FakeScriptObject" for c in kind.__mro__):
            _SHARED_BY_TYPE[kind] = found  # the answer depends on the class alone (torch's opaque objects aside)
    return found


# Whether instances of a class are shared (:func:`_shared` depends on the class alone). Classes are never freed
# while instances of them are walked; a class made and dropped again (a test's) stays here, at a few bytes.
_SHARED_BY_TYPE: dict[type, bool] = {}


def _shared_uncached(obj: Any) -> bool:
    if isinstance(obj, _ATOMIC):
        return True
    import torch

    if isinstance(obj, (torch.nn.Module, torch.Tensor)):
        return False  # whatever package defines it (a transformers model inside vLLM's backend): the module's state
    if isinstance(obj, (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format, torch.Generator)):
        return True
    for cls in type(obj).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if f"{module}.{cls.__qualname__}" in _ENGINE_SHARED_CLASSES or module.startswith(_ENGINE_SHARED_MODULES):
            return True
    return False


# Exact classes the walk returns as they are before anything else (the commonest values in a module's state).
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})


# Exact container classes whose empty instances the walk copies without further checks.
_EMPTY_READY = frozenset({dict, list, set, collections.OrderedDict})


def _render(path: Any) -> str:
    """An attribute path as the walk carries it (a string, or ``(parent, format, key)`` built lazily), as text."""
    parts = []
    while isinstance(path, tuple):
        path, form, key = path
        parts.append(form.format(key))
    return str(path) + "".join(reversed(parts))


def _state_is_dict(kind: type) -> bool:
    """A class made by class statements on ``object`` alone (no tuple, dict or C base) with no slots
    (``abc.ABC``'s empty ones aside): all its instances' state is in ``__dict__``."""
    return all(c is object or c.__flags__ & _HEAP_TYPE for c in kind.__mro__) and not any(
        vars(c).get("__slots__") for c in kind.__mro__
    )


def _meta_twin(tensor: Any) -> Any:
    """A meta tensor of the same class, shape, stride and dtype as ``tensor`` (no attributes yet)."""
    import torch

    data = torch.empty_strided(tuple(tensor.size()), tuple(tensor.stride()), dtype=tensor.dtype, device="meta")
    if type(tensor) is torch.Tensor:
        return data
    return torch.Tensor._make_subclass(type(tensor), data, tensor.requires_grad)


class _Walker:
    def __init__(self, model: Any, as_built: Optional[Mapping[int, tuple[dict, dict]]] = None):
        import torch

        self.torch = torch
        self.memo: dict[int, Any] = {}
        self.keep: list[Any] = []  # originals kept alive while their ids key the memo
        self.twin_of: dict[int, Any] = {}
        self.owned: set[int] = set()
        self.as_built = as_built or {}
        # Parameters and persistent buffers first: each gets one meta twin, so a tie stays a tie. Non-persistent
        # buffers are the engine's own state, not the checkpoint's (an expert map a loader reads values from):
        # the walk clones them with their values.
        for _, module in model.named_modules(remove_duplicate=False):
            own_state = getattr(module, "_non_persistent_buffers_set", set())
            params, buffers = self.as_built.get(id(module), (module._parameters, module._buffers))
            entries = list(params.items()) + [(k, t) for k, t in buffers.items() if k not in own_state]
            for _, tensor in entries:
                if tensor is not None and id(tensor) not in self.twin_of:
                    self.twin_of[id(tensor)] = self.memo[id(tensor)] = _meta_twin(tensor)
                    self.keep.append(tensor)
        self.pending = [(id(t), t) for t in self.keep]

    def copy(self, obj: Any, path: Any, depth: int = 0) -> Any:
        if type(obj) in _PLAIN:
            return obj
        found = self.memo.get(id(obj), self)
        if found is not self:
            return found
        if type(obj) in _EMPTY_READY and not obj:  # an empty dict, list or set (most of a module's hook tables)
            new = self.memo[id(obj)] = type(obj)()
            self.keep.append(obj)
            return new
        if isinstance(obj, types.FunctionType) and self._holds_the_module(obj):
            return self._closure(obj, path, depth)
        if _shared(obj):
            return obj
        if depth > _MAX_DEPTH:
            raise TwinFailed(f"{_render(path)}: nested deeper than {_MAX_DEPTH} levels")
        torch = self.torch
        self.keep.append(obj)
        if isinstance(obj, torch.Tensor):
            small = obj.numel() * obj.element_size() <= _MAX_CLONED_BYTES
            clone = obj.detach().clone() if small and not obj.is_meta else _meta_twin(obj)
            if type(obj) is not torch.Tensor and not isinstance(clone, type(obj)):
                clone = torch.Tensor._make_subclass(type(obj), clone, obj.requires_grad)
            self.memo[id(obj)] = clone
            if not clone.is_meta:
                self.owned.add(clone.untyped_storage()._cdata)
            self._attributes(obj, clone, path, depth)
            return clone
        kind = type(obj)
        if kind in (list, set, frozenset, tuple) or kind.__name__ in ("OrderedDict", "defaultdict", "dict") and isinstance(obj, dict):
            return self._container(obj, path, depth)
        if isinstance(obj, types.MethodType):
            bound_to = self.copy(obj.__self__, (path, ".__self__", ""), depth + 1)
            new = self.memo[id(obj)] = types.MethodType(obj.__func__, bound_to)
            return new
        if isinstance(obj, functools.partial):
            new = self.memo[id(obj)] = functools.partial(
                self.copy(obj.func, (path, ".func", ""), depth + 1),
                *self.copy(obj.args, (path, ".args", ""), depth + 1),
                **self.copy(obj.keywords, (path, ".keywords", ""), depth + 1),
            )
            return new
        if isinstance(obj, torch.nn.Module) or (_state_is_dict(kind) and hasattr(obj, "__dict__")):
            new = self.memo[id(obj)] = self._blank(obj, path)
            state = vars(obj)
            if id(obj) in self.as_built:  # the module's tensors as it was built, not as processing left them
                params, buffers = self.as_built[id(obj)]
                state = {**state, "_parameters": collections.OrderedDict(params),
                         "_buffers": collections.OrderedDict(buffers)}  # fmt: skip
            new.__dict__.update(self._values(state, path, depth + 1))
            return new
        try:  # anything else: the copy protocol, through the same memo (so what it reaches is the twin's)
            return copy.deepcopy(obj, self.memo)
        except Exception as exc:  # noqa: BLE001 - the object cannot be copied: say which, the caller falls back
            raise TwinFailed(f"{_render(path)}: a {kind.__module__}.{kind.__qualname__} cannot be copied ({exc})") from None

    def _blank(self, obj: Any, path: Any) -> Any:
        """An empty instance of ``obj``'s class, made without running its ``__init__``.

        A module through ``object.__new__`` (vLLM's ``SupportsQuant.__new__`` reads the engine's config);
        any other object through its class's own ``__new__`` (``SimpleNamespace`` needs it)."""
        kind = type(obj)
        makers = [object.__new__] if isinstance(obj, self.torch.nn.Module) else [kind.__new__, object.__new__]
        for make in makers:
            try:
                return make(kind)
            except Exception:  # noqa: BLE001 - the next maker, else say which object could not be copied
                continue
        raise TwinFailed(f"{_render(path)}: a {kind.__module__}.{kind.__qualname__} cannot be copied (no way to make one)")

    def _holds_the_module(self, func: Any) -> bool:
        """Whether a function holds, in its closure or its default arguments, a module, a tensor or a module's
        bound method (a wrapper around ``load_weights``): it is copied; any other function (a compiled op's,
        a decorator's) is shared."""
        held = []
        for cell in func.__closure__ or ():
            try:
                held.append(cell.cell_contents)
            except ValueError:
                continue
        held += list(func.__defaults__ or ()) + list((func.__kwdefaults__ or {}).values())
        unbound = (value.__self__ if isinstance(value, types.MethodType) else value for value in held)
        return any(isinstance(value, (self.torch.nn.Module, self.torch.Tensor)) for value in unbound)

    def _closure(self, func: Any, path: Any, depth: int) -> Any:
        """A function holding the module (a wrapper around its own method): its cells and defaults copied."""
        cells = tuple(types.CellType() for _ in func.__closure__ or ())
        new = types.FunctionType(func.__code__, func.__globals__, func.__name__, None, cells or None)
        new.__dict__.update(func.__dict__)
        self.memo[id(func)] = new  # before the cells: a closure that reaches itself gets the copy
        self.keep.append(func)
        for index, (cell, mine) in enumerate(zip(func.__closure__ or (), cells)):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell (a name bound later)
                continue
            mine.cell_contents = self.copy(contents, (path, ".<closure {}>", func.__code__.co_freevars[index]), depth + 1)
        if func.__defaults__:
            new.__defaults__ = self.copy(func.__defaults__, (path, ".<defaults>", ""), depth + 1)
        if func.__kwdefaults__:
            new.__kwdefaults__ = self.copy(func.__kwdefaults__, (path, ".<kwdefaults>", ""), depth + 1)
        return new

    def _container(self, obj: Any, path: Any, depth: int) -> Any:
        kind = type(obj)
        if isinstance(obj, dict):
            new = self.memo[id(obj)] = kind(obj.default_factory) if kind.__name__ == "defaultdict" else kind()
            if obj:
                new.update(self._values(obj, path, depth + 1))
            return new
        if kind is list:
            new = self.memo[id(obj)] = []
            new.extend(self.copy(v, (path, "[{}]", i), depth + 1) for i, v in enumerate(obj))
            return new
        items = [self.copy(v, (path, "[{}]", i), depth + 1) for i, v in enumerate(obj)]
        new = self.memo[id(obj)] = kind(items)
        return new

    def _values(self, mapping: Any, path: Any, depth: int) -> dict:
        """Each key and value of ``mapping`` the twin's (plain values as they are, without a call)."""
        plain, copy = _PLAIN, self.copy
        return {
            (key if type(key) in plain else copy(key, path, depth)): (
                value if type(value) in plain else copy(value, (path, ".{}", key), depth)
            )
            for key, value in mapping.items()
        }

    def _attributes(self, real: Any, twin: Any, path: Any, depth: int) -> None:
        attributes = getattr(real, "__dict__", None)
        if attributes:
            twin.__dict__.update(self._values(attributes, path, depth + 1))


def make_twin(model: Any, as_built: Optional[Mapping[int, tuple[dict, dict]]] = None) -> _Twin:
    """The isolated, data-less twin of ``model`` (see the module docstring). Raises :class:`TwinFailed`.

    ``as_built``: for a module (by ``id``), the parameters and buffers its twin gets instead of its own (a live
    model's, as it was built: :func:`..engine.layerwise.as_built`)."""
    import time

    started = time.perf_counter()
    walker = _Walker(model, as_built)
    try:
        module = walker.copy(model, type(model).__name__)
        for key, real in walker.pending:  # the parameters' own attributes, rebound to the twin's modules
            walker._attributes(real, walker.twin_of[key], f"{type(model).__name__}<{tuple(real.shape)} tensor>", 0)
    except TwinFailed:
        raise
    except RecursionError:
        raise TwinFailed("the module's objects nest too deeply to copy") from None
    except Exception as exc:  # noqa: BLE001 - whatever a copy raises, the module is not asked (never the model)
        raise TwinFailed(f"{type(exc).__name__}: {exc}") from None
    return _Twin(module, walker.twin_of, frozenset(walker.owned), len(walker.memo), time.perf_counter() - started)


def as_built(model: Any, tensors: Mapping[int, tuple[dict, dict]]) -> Any:
    """``model``'s twin with the modules in ``tensors`` (by ``id``) holding those parameters and buffers: a live
    model as its engine built it (:func:`..engine.layerwise.built_tensors`), what a refit asks. The model itself
    where ``tensors`` is empty or the twin cannot be made (the question then falls back as for the model)."""
    if not tensors:
        return model
    try:
        return make_twin(model, tensors).module
    except TwinFailed:
        return model
