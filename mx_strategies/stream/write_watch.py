"""What a load really wrote into the model: every write into a parameter, with its region.

The module question (:mod:`.dry_run`) says, before a byte streams, which
elements of each parameter the plan's names will fill. :func:`watched`
checks the same on the real load: while the engine applies the streamed
tensors (``apply_weight_iter``), a :class:`~torch.overrides.TorchFunctionMode`
notes each in-place write (:func:`.coverage.writes_in_place`) whose target
lies in a parameter's storage, as a :class:`.coverage.Write`. After the
stream, :func:`.coverage.gaps` over those writes says what the load left
unwritten: a load whose real ``load_weights`` diverged from its twin's, a
tensor the adapter dropped, a table-decided plan that missed a stacked
member.

The mode only looks at each call's name and first argument; it never
changes what the call does. Torch function modes are per thread: work the
loading thread hands to a thread pool (SGLang's DeepSeek loader submits
each ``weight_loader`` call) is watched in that worker too, for the call's
duration.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from ..select.coverage import Layout, Write, writes_in_place, written_part
from ..thread_pools import submits_from_this_thread


@dataclass
class Written:
    """The writes a load made into the model's parameters (filled while :func:`watched` runs)."""

    writes: list[Write] = field(default_factory=list)
    calls: int = 0  # torch calls seen (what the watch cost)


@contextmanager
def watched(model: Any, judged: Mapping[str, Layout]) -> Iterator[Written]:
    """Record every write into the parameters named in ``judged`` while the block runs."""
    import torch
    from torch.overrides import TorchFunctionMode

    written = Written()
    if model is None or not judged or not hasattr(model, "named_parameters"):
        yield written
        return
    lock = threading.Lock()
    params = dict(model.named_parameters(remove_duplicate=False))
    by_storage: dict[int, set[str]] = {}
    by_object: dict[int, set[str]] = {}
    for name in judged:
        tensor = params.get(name)
        if tensor is None:
            continue
        by_object.setdefault(id(tensor), set()).add(name)
        if _storage(tensor):
            by_storage.setdefault(_storage(tensor), set()).add(name)

    def note(func_name: str, target: Any) -> None:
        if func_name in ("__set__", "set_") and id(target) in by_object:
            # ``param.data = tensor``: the parameter now is that tensor, whole.
            names = by_object[id(target)]
            region = Layout(tuple(target.shape), tuple(target.stride()), 0)
            with lock:
                written.writes.extend(Write(n, region, frozenset()) for n in names)
            return
        names = by_storage.get(_storage(target) or -1)
        if names:
            region = Layout(tuple(target.shape), tuple(target.stride()), target.storage_offset())
            with lock:
                written.writes.extend(Write(n, region, frozenset()) for n in names)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            written.calls += 1
            name = getattr(func, "__name__", "")
            out = kwargs.get("out")
            if isinstance(out, torch.Tensor):
                note(name, out)
            if args and isinstance(args[0], torch.Tensor) and writes_in_place(name):
                target = args[0]
                note(name, written_part(name, args))
                if name in ("__set__", "set_") and id(target) in by_object:
                    by_storage.setdefault(_storage(target), set()).update(by_object[id(target)])
            return result

    def watched_in_pool(real_submit, pool, fn, /, *args, **kwargs):
        def run(*a, **k):
            with Watch():
                return fn(*a, **k)

        return real_submit(pool, run, *args, **kwargs)

    with submits_from_this_thread(watched_in_pool), Watch():
        yield written


def _storage(tensor: Any) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0


__all__ = ["Written", "watched"]
