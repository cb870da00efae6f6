"""Ask a built module which checkpoint names its own ``load_weights`` reads, without touching it.

The engine built the module; its ``load_weights`` is the one authority on
which checkpoint tensors it takes (which names it renames, stacks, fuses or
skips). :func:`dry_run` runs that very method over the checkpoint's names
with tensors that hold no data (``device="meta"``, the header's shape and
dtype) and records which names the model actually uses, and into which of
its parameters each one flows.

How the model is kept untouched:

- every parameter and buffer is swapped, in its module's ``_parameters`` /
  ``_buffers``, for a meta tensor of the same class, shape, stride, dtype and
  Python attributes (``weight_loader`` and the like); the originals are put
  back in a ``finally`` block, so the model holds the same objects, storage
  and bytes as before (``param.data = <meta>`` is refused by torch on a CPU
  parameter, hence the swap); every module's attributes are put back as they
  were too (a ``load_weights`` that stores derived tensors on its modules);
- a :class:`~torch.overrides.TorchFunctionMode` refuses any in-place write
  into a tensor that is not a meta tensor (a loader holding a stale
  reference to a real parameter), before it happens;
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

# Torch calls that only look at a tensor's metadata: no use of its values.
METADATA_CALLS = frozenset(
    {
        "__get__", "size", "dim", "numel", "stride", "element_size", "is_contiguous", "__len__", "ndimension",
        "nelement", "__repr__", "__format__", "data_ptr", "storage_offset", "is_floating_point", "is_complex",
        "get_device", "untyped_storage", "__hash__",
    }
)
# Reading a value out of a data-less tensor: answered with a zero (the dry run only follows where data goes).
SCALAR_CALLS = frozenset({"item", "__int__", "__float__", "__index__"})


class DryRunFailed(Exception):
    """The dry run could not answer (the class needs real data, took too long, or touched the model)."""


@dataclass
class DryRun:
    """What one dry run saw: the names the module used, and the parameters each flowed into."""

    read: frozenset[str]
    written: Mapping[str, frozenset[str]]  # checkpoint name -> names of the parameters/buffers it was copied into
    full: Mapping[str, bool]  # checkpoint name -> every write of it filled its parameter whole
    whole_writes: tuple  # (parameters, names) of each write that filled its parameter whole, in order
    fed: int
    seconds: float
    returned: Optional[frozenset[str]] = None  # what load_weights returned (names it says it loaded), if a set


@dataclass
class _Swap:
    """The originals of one module's swapped entries."""

    table: dict
    key: str
    original: Any


@dataclass
class _State:
    param_of_storage: dict  # storage cdata of a swapped meta tensor -> (its names in the model, numel)
    deadline: float
    read: set = field(default_factory=set)
    written: dict = field(default_factory=dict)
    partial: set = field(default_factory=set)  # names written into part of a parameter (stacked, sharded)
    whole_writes: list = field(default_factory=list)
    scalar_from: frozenset = frozenset()  # names whose value was last read out as a number (``param.fill_(w.item())``)


def _meta_like(tensor: Any) -> Any:
    """A meta tensor of the same class, shape, stride, dtype and Python attributes as ``tensor``."""
    import torch

    data = torch.empty_strided(tuple(tensor.size()), tuple(tensor.stride()), dtype=tensor.dtype, device="meta")
    if type(tensor) is torch.Tensor:
        meta = data
    else:
        meta = torch.Tensor._make_subclass(type(tensor), data, tensor.requires_grad)
    meta.__dict__.update(getattr(tensor, "__dict__", {}))
    return meta


@contextmanager
def meta_swapped(model: Any) -> Iterator[dict]:
    """Every parameter and buffer of ``model`` replaced by a meta twin while the block runs.

    Yields ``storage cdata -> (names, numel)`` of the twins (a parameter shared by two
    modules gets one twin, keeping the tie). Restores the originals, and
    checks it did, whatever happens inside.
    """
    twins: dict[int, Any] = {}
    swaps: list[_Swap] = []
    # Every module's attributes as they are: a load_weights that derives tensors and stores them on its
    # modules (SGLang's DeepSeek keeps w_kc / w_vc made from kv_b_proj) leaves meta tensors there; all go back.
    attributes = {id(m): (m, dict(m.__dict__)) for _, m in model.named_modules(remove_duplicate=False)}
    names_of: dict[int, set[str]] = {}
    done: set[tuple[int, str]] = set()  # a module reached under two names is swapped once
    try:
        for prefix, module in model.named_modules(remove_duplicate=False):
            for table_name in ("_parameters", "_buffers"):
                table = getattr(module, table_name, None) or {}
                for key, original in list(table.items()):
                    if original is None:
                        continue
                    twin = twins.get(id(original), original)  # reached again: the entry is already a twin
                    if (id(table), key) not in done:
                        done.add((id(table), key))
                        if twin is original:
                            twin = twins[id(original)] = _meta_like(original)
                        swaps.append(_Swap(table, key, original))
                        table[key] = twin
                    names_of.setdefault(twin.untyped_storage()._cdata, set()).add(f"{prefix}.{key}" if prefix else key)
        numel = {t.untyped_storage()._cdata: t.numel() for t in twins.values()}
        yield {cdata: (frozenset(names), numel[cdata]) for cdata, names in names_of.items()}
    finally:
        for swap in reversed(swaps):
            swap.table[swap.key] = swap.original
        for module, saved in attributes.values():
            if module.__dict__.keys() != saved.keys() or any(module.__dict__[k] is not v for k, v in saved.items()):
                module.__dict__.clear()
                module.__dict__.update(saved)
    left = [s.key for s in swaps if s.table.get(s.key) is not s.original]
    if left:
        raise DryRunFailed(f"could not restore {len(left)} parameter(s) after the dry run: {left[:5]}")


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

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if now() > state.deadline:
                raise DryRunFailed("took longer than its time bound")
            name = getattr(func, "__name__", "")
            used = names_in(args) | names_in(kwargs.values())
            if name in METADATA_CALLS:
                # Looking at a tensor is no use of its values; a view it returns (``.T``, ``.data``) carries its names.
                result = func(*args, **kwargs)
                if used and isinstance(result, torch.Tensor) and result.is_meta:
                    result.__dict__["_mx_dry_names"] = frozenset(used)
                return result
            if used:
                state.read |= used
            if name in SCALAR_CALLS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                state.scalar_from = frozenset(used)  # the number flows into the next write
                return 0.0 if args[0].is_floating_point() and name != "__index__" else 0
            if name == "tolist" and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                return torch.zeros(args[0].shape, dtype=args[0].dtype).tolist()
            target = args[0] if args else None
            writes = (
                (name.endswith("_") and not name.startswith("__"))
                or name in ("__setitem__", "__set__", "set_")
                or (name.startswith("__i") and name.endswith("__") and name not in ("__index__", "__int__"))
            )
            if writes and not used and state.scalar_from:
                used, state.scalar_from = set(state.scalar_from), frozenset()
            if writes and isinstance(target, torch.Tensor):
                if not target.is_meta:
                    raise DryRunFailed(
                        f"load_weights wrote into a tensor that is not part of the swapped model ({name}); "
                        "refused before the write"
                    )
                entry = state.param_of_storage.get(target.untyped_storage()._cdata)
                if entry and used:
                    params, numel = entry
                    whole = target.numel() == numel and target.storage_offset() == 0
                    if whole:
                        state.whole_writes.append((params, frozenset(used)))
                    for checkpoint_name in used:
                        state.written[checkpoint_name] = state.written.get(checkpoint_name, frozenset()) | params
                        if not whole:
                            state.partial.add(checkpoint_name)
            out = kwargs.get("out")
            if isinstance(out, torch.Tensor) and not out.is_meta:
                raise DryRunFailed(f"load_weights wrote into a real tensor ({name}, out=); refused before the write")
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


@contextmanager
def _inline_executors() -> Iterator[None]:
    """Thread pools started by the dry run's thread run their work inline in it.

    Torch function modes are per thread, and SGLang's DeepSeek loader hands each
    ``weight_loader`` call to a ``ThreadPoolExecutor``: inline, the recorder sees
    those calls too (and refuses their writes into real tensors). Other threads'
    pools are left alone.
    """
    import concurrent.futures
    import threading

    me = threading.get_ident()
    real_submit = concurrent.futures.ThreadPoolExecutor.submit

    def submit(self, fn, /, *args, **kwargs):
        if threading.get_ident() != me:
            return real_submit(self, fn, *args, **kwargs)
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future, as the pool would
            future.set_exception(exc)
        return future

    concurrent.futures.ThreadPoolExecutor.submit = submit
    try:
        yield
    finally:
        concurrent.futures.ThreadPoolExecutor.submit = real_submit


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
) -> DryRun:
    """Run ``model.load_weights`` over ``headers`` (name -> (shape, torch dtype)) with data-less tensors.

    ``call(model, weights)``: how the engine feeds the model (default
    ``model.load_weights(weights)``). Raises :class:`DryRunFailed` on any
    error; the model holds its own parameters and buffers afterwards in every case.
    """
    import torch

    if model is None or not callable(getattr(model, "load_weights", None)):
        raise DryRunFailed("the model has no load_weights to ask")
    call = call or (lambda m, weights: m.load_weights(weights))
    started = time.perf_counter()
    shots = _snapshot(_global_registries())
    fed = 0
    try:
        with meta_swapped(model) as param_of_storage:
            state = _State(param_of_storage, started + timeout_s)

            def weights() -> Iterator[tuple[str, Any]]:
                nonlocal fed
                for name, (shape, dtype) in headers.items():
                    if time.perf_counter() > state.deadline:
                        raise DryRunFailed(f"took longer than its time bound ({timeout_s:g} s)")
                    tensor = torch.empty(shape, dtype=dtype, device="meta")
                    tensor.__dict__["_mx_dry_names"] = frozenset((name,))
                    fed += 1
                    yield name, tensor

            with _inline_executors(), _mode(state), torch.no_grad():
                returned = call(model, weights())
    except DryRunFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - a class that cannot run on data-less tensors: the caller falls back
        raise DryRunFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        changed = _restore(shots)
    if changed:
        raise DryRunFailed(f"load_weights added to {', '.join(changed)} (undone)")
    names = None
    if isinstance(returned, (set, frozenset, list, tuple)) and all(isinstance(n, str) for n in returned):
        names = frozenset(returned)
    full = {name: name not in state.partial for name in state.written}
    return DryRun(
        frozenset(state.read), dict(state.written), full, tuple(state.whole_writes), fed, time.perf_counter() - started, names
    )


__all__ = ["DryRun", "DryRunFailed", "dry_run", "meta_swapped"]
