"""Ask a built module which checkpoint names its own ``load_weights`` reads, on a twin, never the module.

The engine built the module; its ``load_weights`` is the one authority on
which checkpoint tensors it takes (which names it renames, stacks, fuses or
skips). :func:`dry_run` runs that very method, on an isolated data-less twin
of the module (:mod:`.twin`), over the checkpoint's names with tensors that
hold no data (``device="meta"``, the header's shape and dtype). It records
which names the module uses, into which of its parameters each one flows,
and which elements of each parameter each write reaches
(:class:`..verify.coverage.Write`: whole parameters or no load).

Why the model stays as it was:

- ``load_weights`` runs on the twin: its parameters and buffers are meta
  tensors, its modules, containers and Python state its own copies
  (shard marks, counters, lists of what it was handed, derived tensors all
  land on the twin);
- a :class:`~torch.overrides.TorchFunctionMode` refuses any in-place write
  into a tensor that is neither meta nor the twin's own (a loader holding a
  module-level reference to a real tensor), before it happens;
- the engine's global registries a ``load_weights`` could add to (vLLM's
  ``static_forward_context``) are compared before and after: a change is
  undone and the dry run fails;
- it is bounded in time: past ``timeout_s`` the next torch call or the next
  name raises :class:`DryRunFailed`.

Any failure raises :class:`DryRunFailed` (the caller falls back to the table);
the model is as before either way. Pure mechanism: it knows nothing of
engines' tables or plans (:mod:`.module_reads` asks it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from ..verify.coverage import Layout, Write, writes_in_place, written_part
from ..thread_pools import run_inline, submits_from_this_thread
from .twin import TwinFailed, make_twin

# Torch calls that only look at a tensor's metadata: no use of its values.
_METADATA_CALLS = frozenset(
    {
        "__get__", "size", "dim", "numel", "stride", "element_size", "is_contiguous", "__len__", "ndimension",
        "nelement", "__repr__", "__format__", "data_ptr", "storage_offset", "is_floating_point", "is_complex",
        "get_device", "untyped_storage", "__hash__",
    }
)
# Reading a value out of a data-less tensor: answered with a zero (the dry run only follows where data goes).
_SCALAR_CALLS = frozenset({"item", "__int__", "__float__", "__index__"})


class DryRunFailed(Exception):
    """The dry run could not answer (the class needs real data, took too long, or touched the model)."""


@dataclass
class _DryRun:
    """What one dry run saw: the names the module used, the parameters each flowed into, and every write's region."""

    read: frozenset[str]
    written: Mapping[str, frozenset[str]]  # checkpoint name -> names of the parameters/buffers it was copied into
    full: Mapping[str, bool]  # checkpoint name -> every write of it filled its parameter whole
    whole_writes: tuple  # (parameters, names) of each write that filled its parameter whole, in order
    fed: int
    seconds: float
    returned: Optional[frozenset[str]] = None  # what load_weights returned (names it says it loaded), if a set
    writes: tuple[Write, ...] = ()  # every write into a parameter or buffer: its region and the names it holds
    layouts: Mapping[str, Layout] = field(default_factory=dict)  # parameter/buffer name -> its own layout
    twin_seconds: float = 0.0


@dataclass
class _State:
    param_of_storage: dict  # storage cdata of a twin's meta tensor -> (its names in the module, numel)
    deadline: float
    owned: frozenset = frozenset()  # storages of the twin's own real tensors (clones): writing them is harmless
    read: set = field(default_factory=set)
    written: dict = field(default_factory=dict)
    partial: set = field(default_factory=set)  # names written into part of a parameter (stacked, sharded)
    whole_writes: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    scalar_from: frozenset = frozenset()  # names whose value was last read out as a number (``param.fill_(w.item())``)
    model: Any = None  # the real model: only to name a tensor a refused write aimed at

    def model_tensor_names(self, target: Any) -> str:
        """Which of the model's tensors (parameters, buffers, tensor attributes) share ``target``'s storage."""
        try:
            pointer = target.untyped_storage().data_ptr()
            found = [n for n, t in list(self.model.named_parameters(remove_duplicate=False))
                     + list(self.model.named_buffers(remove_duplicate=False)) if t.untyped_storage().data_ptr() == pointer]
            for prefix, module in self.model.named_modules(remove_duplicate=False):
                found += [f"{prefix}.{k}" for k, v in vars(module).items()
                          if hasattr(v, "untyped_storage") and v.untyped_storage().data_ptr() == pointer]
            return ", ".join(sorted(set(found))[:3])
        except Exception:  # noqa: BLE001 - only a better message
            return ""


def _storages(module: Any) -> tuple[dict, dict]:
    """``storage cdata -> (names, numel)`` of the twin's parameters and buffers, and each name's :class:`Layout`."""
    names_of: dict[int, set[str]] = {}
    numel: dict[int, int] = {}
    layouts: dict[str, Layout] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for table in (sub._parameters, sub._buffers):
            for key, tensor in table.items():
                if tensor is None:
                    continue
                cdata = tensor.untyped_storage()._cdata
                name = f"{prefix}.{key}" if prefix else key
                names_of.setdefault(cdata, set()).add(name)
                numel[cdata] = max(numel.get(cdata, 0), tensor.numel())
                layouts[name] = Layout(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())
    return {cdata: (frozenset(names), numel[cdata]) for cdata, names in names_of.items()}, layouts


def _mode(state: _State):
    import torch
    from torch.overrides import TorchFunctionMode

    now = time.perf_counter

    def names_in(values: Iterable[Any]) -> set:
        found = set()
        for value in values:
            if isinstance(value, torch.Tensor):
                tag = value.__dict__.get("_mx_dry_names") if hasattr(value, "__dict__") else None
                if tag:
                    found |= tag
            elif isinstance(value, (list, tuple)):
                found |= names_in(value)
        return found

    def record(target: Any, name: str, used: set) -> None:
        """A write into ``target``: refused unless it is the twin's; its region noted where it is a parameter's."""
        storage = target.untyped_storage()._cdata
        if not target.is_meta and storage not in state.owned:
            owner = state.model_tensor_names(target)
            raise DryRunFailed(
                f"load_weights wrote into a tensor that is not the twin's ({name} into a {type(target).__name__} "
                f"{list(target.shape)} {target.dtype}{', the model' + chr(39) + 's ' + owner if owner else ''}); "
                "refused before the write"
            )
        entry = state.param_of_storage.get(storage)
        if not entry:
            return
        params, numel = entry
        region = Layout(tuple(target.shape), tuple(target.stride()), target.storage_offset())
        for param in params:
            state.writes.append(Write(param, region, frozenset(used)))
        if not used:
            return
        whole = target.numel() == numel and target.storage_offset() == 0
        if whole:
            state.whole_writes.append((params, frozenset(used)))
        for checkpoint_name in used:
            state.written[checkpoint_name] = state.written.get(checkpoint_name, frozenset()) | params
            if not whole:
                state.partial.add(checkpoint_name)

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if now() > state.deadline:
                raise DryRunFailed("took longer than its time bound")
            name = getattr(func, "__name__", "")
            used = names_in(args) | names_in(kwargs.values())
            if name in _METADATA_CALLS:
                # Looking at a tensor is no use of its values; a view it returns (``.T``, ``.data``) carries its names.
                result = func(*args, **kwargs)
                if used and isinstance(result, torch.Tensor) and result.is_meta:
                    result.__dict__["_mx_dry_names"] = frozenset(used)
                return result
            if used:
                state.read |= used
            if name in _SCALAR_CALLS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                state.scalar_from = frozenset(used)  # the number flows into the next write
                return 0.0 if args[0].is_floating_point() and name != "__index__" else 0
            if name == "tolist" and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                return torch.zeros(args[0].shape, dtype=args[0].dtype).tolist()
            target = args[0] if args else None
            writes = writes_in_place(name)
            if writes and not used and state.scalar_from:
                used, state.scalar_from = set(state.scalar_from), frozenset()
            out = kwargs.get("out")
            if isinstance(out, torch.Tensor):
                record(out, name, used)
            if writes and isinstance(target, torch.Tensor):
                record(written_part(name, args), name, used)
                if not target.is_meta and any(isinstance(a, torch.Tensor) and a.is_meta for a in args[1:]):
                    # The twin's own engine state (a non-persistent buffer, cloned with its values) given a value
                    # derived from the data-less tensors: there is no value to give; the question needs none.
                    return target
            result = func(*args, **kwargs)
            if used and isinstance(result, torch.Tensor) and result.is_meta and not writes:
                # Derived tensors (views, casts, slices) carry the names they came from.
                tag = result.__dict__.get("_mx_dry_names")
                result.__dict__["_mx_dry_names"] = (tag | used) if tag else frozenset(used)
            elif used and isinstance(result, (list, tuple)) and not writes:
                for item in result:
                    if isinstance(item, torch.Tensor) and item.is_meta:
                        item.__dict__["_mx_dry_names"] = frozenset(used)
            return result

    return Recorder()


def _global_registries() -> list[tuple[str, Callable[[], Any]]]:
    """The engine registries a ``load_weights`` could add to, read through the engine's own accessors."""
    getters: list[tuple[str, Callable[[], Any]]] = []
    try:  # vLLM: attention layers register themselves here when built
        from vllm.config import get_current_vllm_config

        def forward_context() -> Any:
            return getattr(get_current_vllm_config().compilation_config, "static_forward_context", None)

        getters.append(("vLLM's static_forward_context", forward_context))
    except Exception:  # noqa: BLE001 - no vLLM, or a vLLM without it: nothing to guard
        pass
    return getters


def _snapshot(registries: list[tuple[str, Callable[[], Any]]]) -> list[tuple[str, Any, Optional[dict]]]:
    shots = []
    for label, getter in registries:
        try:
            value = getter()
        except Exception:  # noqa: BLE001 - no current config: nothing registered there
            value = None
        shots.append((label, value, dict(value) if isinstance(value, dict) else None))
    return shots


def _restore(shots: list[tuple[str, Any, Optional[dict]]]) -> list[str]:
    changed = []
    for label, value, before in shots:
        if before is None or not isinstance(value, dict):
            continue
        if value.keys() != before.keys() or any(value[k] is not before[k] for k in before):
            changed.append(label)
            value.clear()
            value.update(before)
    return changed


def dry_run(
    model: Any,
    headers: Mapping[str, tuple[tuple[int, ...], Any]],
    *,
    timeout_s: float,
    call: Optional[Callable[[Any, Iterator[tuple[str, Any]]], Any]] = None,
) -> _DryRun:
    """Run ``model.load_weights`` over ``headers`` (name -> (shape, torch dtype)) with data-less tensors.

    ``call(model, weights)``: how the engine feeds the model (default
    ``twin.load_weights(weights)``), called with the twin. Raises :class:`DryRunFailed`
    on any error; the model is never run, and holds what it held in every case.
    """
    import torch

    if model is None or not callable(getattr(model, "load_weights", None)):
        raise DryRunFailed("the model has no load_weights to ask")
    call = call or (lambda m, weights: m.load_weights(weights))
    started = time.perf_counter()
    try:
        twin = make_twin(model)
    except TwinFailed as exc:
        raise DryRunFailed(f"no isolated copy of the module could be made to ask: {exc}") from None
    shots = _snapshot(_global_registries())
    fed = 0
    param_of_storage, layouts = _storages(twin.module)
    state = _State(param_of_storage, started + timeout_s, twin.owned_storages, model=model)
    try:

        def weights() -> Iterator[tuple[str, Any]]:
            nonlocal fed
            for name, (shape, dtype) in headers.items():
                if time.perf_counter() > state.deadline:
                    raise DryRunFailed(f"took longer than its time bound ({timeout_s:g} s)")
                tensor = torch.empty(shape, dtype=dtype, device="meta")
                tensor.__dict__["_mx_dry_names"] = frozenset((name,))
                fed += 1
                yield name, tensor

        with submits_from_this_thread(run_inline), _mode(state), torch.no_grad():
            returned = call(twin.module, weights())
    except DryRunFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - a class that cannot run on data-less tensors: the caller falls back
        raise DryRunFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        changed = _restore(shots)
    if changed:
        raise DryRunFailed(f"load_weights added to {', '.join(changed)} (undone)")
    reported = isinstance(returned, (set, frozenset, list, tuple)) and all(isinstance(n, str) for n in returned)
    full = {name: name not in state.partial for name in state.written}
    return _DryRun(
        frozenset(state.read), dict(state.written), full, tuple(state.whole_writes), fed,
        time.perf_counter() - started, frozenset(returned) if reported else None, tuple(state.writes), layouts, twin.seconds,
    )  # fmt: skip
