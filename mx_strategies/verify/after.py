"""The check after loading: the model holds every weight it keeps, written from the checkpoint.

The ledger (:mod:`.ledger`) checks the plan off: every planned tensor
delivered once. It cannot see a plan that misses something the model needs
(a LongCat draft whose ``model.mtp.norm.weight`` was never planned keeps its
init value). So :func:`after_loading`, the one entry after a load (robust's
own, and each ModelExpress link the chain guard checks), watches the engine's
weight loading and then checks the model three ways (:func:`check`):

- the names its ``load_weights`` returns, against what it keeps
  (:mod:`.kept`: the engine's own fills and vLLM's exemptions left out), as
  vLLM's default loader does ("Following weights were not initialized from
  checkpoint", ``default_loader.py:520``); ModelExpress's
  ``VllmAdapter.apply_weight_iter`` drops that return value, so
  :func:`_capture_loaded` wraps the model's ``load_weights`` for the duration
  (an instance attribute, removed afterwards) and keeps what each call returns.
  A tensor counts as written when any of its names was reported. A model that
  reports no set of names is not checked, with a warning: vLLM's default loader
  skips its check then too (SGLang's MTP/NextN drafts and DeepSeek's target
  return nothing; Qwen3-Next's target, ``qwen3_next.py:1276``, does);
- what the load really wrote into every judged parameter (robust's own load):
  :func:`watched` notes, through a :class:`~torch.overrides.TorchFunctionMode`,
  each in-place write (:func:`.coverage.writes_in_place`) into a parameter's
  storage, and :func:`.coverage.gaps` says what no write reached: a load whose
  real ``load_weights`` diverged from its twin's, a tensor the adapter
  dropped. The mode only looks at each call's name and first argument; work
  the loading thread hands to a thread pool is watched in that worker too;
- the engine's own per-shard record (vLLM 0.34's ``pop_missing_shards``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from ..errors import IncompleteModel, listed
from ..thread_pools import submits_from_this_thread
from .coverage import Layout, Write, gaps, writes_in_place, written_part
from .kept import GAPS_SHOWN, Required, judged_parameters, required_tensors

_NAMES_SHOWN = 10
_SENTINEL = object()


@dataclass
class LoadedNames:
    """What the model's ``load_weights`` reported during one load."""

    names: Optional[set[str]] = None  # None: no call returned a set of names
    calls: int = 0
    unreported_calls: int = 0  # calls that returned something other than a set of names

    @property
    def reported(self) -> bool:
        return self.names is not None and self.unreported_calls == 0


@dataclass
class _Completeness:
    """The outcome of the check of the reported names."""

    checked: bool
    required: int = 0
    missing: list[str] = field(default_factory=list)
    exempt: list[str] = field(default_factory=list)  # filled by the engine afterwards
    reason: str = ""  # why it was not checked

    @property
    def complete(self) -> bool:
        return not self.missing


@contextmanager
def after_loading(model: Any, *, role: str, policy: str, filled_by_engine: Callable[[str], bool],
                  on_warning: Callable[[str], None], stream: Any = None,
                  refit: Any = None) -> Iterator[Callable[[], None]]:  # fmt: skip
    """Run the engine's weight loading inside the block, then check the model (:func:`check`).

    What ``load_weights`` reports is captured. With ``stream`` (robust's own load) the stream is entered around
    the block (starting it fetches the first tensor), what the load writes into every judged parameter is watched,
    and the stream is settled after the block (every planned tensor checked off, :mod:`.ledger`) and closed before
    the checks. The checks run once: when the yielded function is called (a chain link's post-load hook) or when
    the block ends. Raises IncompleteDelivery or IncompleteModel (``mutated=True``) per policy; with ``stream``,
    an IncompleteModel's ``remedy`` says what robust's refusal means for the load. ``stream``: a
    :class:`..stream.streaming.VerifiedStream`, handed in (this stage imports nothing of streaming).

    ``refit`` (a refit, under vLLM's layerwise reload: :class:`..engine.layerwise.ReloadLayers`): what the model
    keeps is read from its twin as vLLM built it (``refit.built``, :func:`..select.twin.as_built`: post-load processing's own tensors are not the
    checkpoint's), and ``refit.states(keeps)`` says where the reload's layers stand; a layer the model keeps left
    ``old`` or ``partial`` is a gap. The write watch is off then: the reload buffers what arrives and writes a
    layer's live tensors only once it has all of them, so what vLLM materialised is judged, not values.
    """
    watch = stream is not None and model is not None and refit is None
    judged = judged_parameters(model, filled_by_engine) if watch else {}
    done: list[bool] = []
    with nullcontext() if stream is None else stream:
        with _capture_loaded(model) as loaded, watched(model, judged) as written:

            def checked() -> None:
                if done:
                    return
                done.append(True)
                try:
                    check(model, loaded, role=role, policy=policy, filled_by_engine=filled_by_engine,
                          on_warning=on_warning, judged=judged, writes=written.writes, refit=refit)  # fmt: skip
                except IncompleteModel as exc:
                    if stream is not None:
                        exc.remedy = _refusal_advice(role, stream.plan.source)
                    raise

            yield checked
        if stream is not None:
            stream.settle()
    checked()


def check(model: Any, loaded: LoadedNames, *, role: str, policy: str,
          filled_by_engine: Callable[[str], bool] = lambda name: False,
          on_warning: Callable[[str], None] = lambda message: None, judged: Mapping[str, Layout] = {},
          writes: Sequence[Write] = (), refit: Any = None) -> _Completeness:  # fmt: skip
    """Every check of a finished load, in order: the names the model reported loaded against what it keeps; what the
    load wrote into the ``judged`` parameters (``writes``, :func:`watched`); on a refit, the layers vLLM's reload
    did not fill (``refit``, :func:`after_loading`); the engine's own per-shard record.

    Raises IncompleteModel (``mutated=True``) under ``fail`` when something the model keeps was not written from
    the checkpoint; warns otherwise (``MX_ROBUST_MODEL_COMPLETENESS``).
    """
    kept_by = model if refit is None else refit.built  # a refit: the model as vLLM built it, not as processing left it
    tensors = required_tensors(kept_by) if loaded.reported or refit is not None else []
    result = _check_reported(tensors, loaded, role, policy, filled_by_engine, on_warning)
    if judged:
        now = dict(model.named_parameters(remove_duplicate=False)) if model is not None else {}
        # A parameter the load replaced by another object is not judged: the writes were into the one it replaced.
        kept = {n: layout for n, layout in judged.items() if n in now}
        if found := gaps(kept, writes, streamed=lambda name: True):
            parts = [g.describe(provenance=False) for g in found]  # the watch sees writes, not checkpoint names
            _enforce(f"{role} model incomplete: the load wrote {len(found)} of the {len(kept)} parameters it checks "
                     f"only in part: {listed(parts, GAPS_SHOWN, '; ')}", policy, on_warning)  # fmt: skip
    if refit is not None:
        kept = {alias for r in tensors for alias in r.aliases if not any(filled_by_engine(a) for a in r.aliases)}
        states = refit.states(kept.__contains__)
        if states.old or states.partial:
            _enforce(f"{role} model incomplete: vLLM's layerwise reload was not handed every element of "
                     f"{len(states.old) + len(states.partial)} layer(s) the model keeps: {states.describe()}",
                     policy, on_warning)  # fmt: skip
    if missing := _engine_missing_shards(model):
        _enforce(f"{role} model incomplete: vLLM's own per-shard record says {len(missing)} part(s) of stacked "
                 f"parameters were never loaded: {listed(missing, GAPS_SHOWN, ', ')}", policy, on_warning)  # fmt: skip
    return result


def _check_reported(tensors: list[Required], loaded: LoadedNames, role: str, policy: str,
                    filled_by_engine: Callable[[str], bool], on_warning: Callable[[str], None]) -> _Completeness:  # fmt: skip
    """What the model reported loaded against what it keeps (``tensors``: :func:`.kept.required_tensors`)."""
    if not loaded.reported:
        reason = "the model's load_weights " + ("returned no set of loaded names" if loaded.calls else "was not called")
        on_warning(f"{role} completeness not checked: {reason} (vLLM's default loader skips its check then too)")
        return _Completeness(False, reason=reason)
    exempt = sorted(r.name for r in tensors if any(filled_by_engine(alias) for alias in r.aliases))
    written = _written(tensors, loaded.names)
    missing = sorted(r.name for r in tensors if r.name not in written and r.name not in exempt)
    if missing:
        kind_of = {r.name: r.kind for r in tensors}
        kinds = {kind_of[name] for name in missing}
        what = "parameters and buffers" if len(kinds) > 1 else f"{kinds.pop()}s"
        _enforce(f"{role} model incomplete: {len(missing)} of {len(tensors)} {what} it keeps were not written "
                 f"from the checkpoint: {listed(missing, _NAMES_SHOWN)}", policy, on_warning)  # fmt: skip
    return _Completeness(True, len(tensors), missing, exempt)


def _written(required: list[Required], names: set[str]) -> set[str]:
    """The required tensors (by name) that a reported name wrote.

    Reported under any alias, or a view whose bytes lie inside a tensor reported
    loaded (two parameters over one storage: writing the whole writes the part).
    """
    written = {r.name for r in required if any(alias in names for alias in r.aliases)}
    spans: dict[int, list[tuple[int, int]]] = {}
    for r in required:
        if r.name in written and r.storage[0]:
            spans.setdefault(r.storage[0], []).append(r.storage[1:])
    for r in required:
        pointer, start, end = r.storage
        if r.name not in written and pointer and any(a <= start and end <= b for a, b in spans.get(pointer, ())):
            written.add(r.name)
    return written


def _enforce(message: str, policy: str, on_warning: Callable[[str], None]) -> None:
    """``MX_ROBUST_MODEL_COMPLETENESS``: raise IncompleteModel (``mutated=True``) under ``fail``, else warn."""
    if policy == "fail":
        raise IncompleteModel(message + " (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)")
    on_warning(message)


def _engine_missing_shards(model: Any) -> list[str]:
    """The parts of stacked parameters the engine's own record says this load never delivered.

    vLLM 0.34's ``StackedColumnParallelLinear`` (``gate_up_proj``, ``qkv_proj``, ``fused_qkv_a_proj``) marks
    each shard its ``weight_loader`` receives (``loaded_shard_ids``) and its default loader refuses a load
    that left one out (``pop_missing_shards``, ``default_loader.py``); ModelExpress's path asks nothing.
    Asked here after the load, as ``<parameter>.<shard id>``; popping clears the record, as vLLM's loader
    does, so the next load starts fresh. Empty where the engine keeps no such record (vLLM 0.32, 0.33,
    SGLang), asked by what the module has, not by release.
    """
    missing: list[str] = []
    for name, module in model.named_modules() if hasattr(model, "named_modules") else ():
        pop = getattr(module, "pop_missing_shards", None)
        if not callable(pop) or not isinstance(getattr(module, "loaded_shard_ids", None), dict):
            continue
        try:
            shards = pop()
        except Exception:  # noqa: BLE001 - an engine record that cannot answer states nothing
            continue
        missing += [f"{name}.{shard}" if name else str(shard) for shard in shards]
    return missing


def _refusal_advice(role: str, source: str) -> str:
    """What a user reads when every tensor streamed and the model still lacks some: robust's streaming is
    lost for this load (ModelExpress rebuilds the model for its next strategy), and what to do about it."""
    return (
        f"refused the {role} load it streamed from {source}: the model reported weights it keeps as not "
        f"written. ModelExpress now rebuilds the model and tries its next strategy, without robust. If the "
        f"model is right as loaded, MX_ROBUST_MODEL_COMPLETENESS=warn accepts it; `mx-strategies doctor "
        f"{source}` shows what robust plans for this checkpoint."
    )


@contextmanager
def _capture_loaded(model: Any) -> Iterator[LoadedNames]:
    """Record what ``model.load_weights`` returns while the block runs; leave the model as it was."""
    captured = LoadedNames()
    real = getattr(model, "load_weights", None)
    if model is None or real is None:
        yield captured
        return
    own = model.__dict__.get("load_weights", _SENTINEL)

    def load_weights(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        captured.calls += 1
        if isinstance(result, (set, frozenset, list, tuple)) and all(isinstance(n, str) for n in result):
            captured.names = (captured.names or set()) | set(result)
        else:
            captured.unreported_calls += 1
        return result

    object.__setattr__(model, "load_weights", load_weights)
    try:
        yield captured
    finally:
        if own is _SENTINEL:
            model.__dict__.pop("load_weights", None)
        else:
            object.__setattr__(model, "load_weights", own)


@dataclass
class _Written:
    """The writes a load made into the model's parameters (filled while :func:`watched` runs)."""

    writes: list[Write] = field(default_factory=list)
    calls: int = 0  # torch calls seen (what the watch cost)


@contextmanager
def watched(model: Any, judged: Mapping[str, Layout]) -> Iterator[_Written]:
    """Record every write into the parameters named in ``judged`` while the block runs."""
    import torch
    from torch.overrides import TorchFunctionMode

    written = _Written()
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
            names, region = by_object[id(target)], Layout(tuple(target.shape), tuple(target.stride()), 0)
        else:
            names = by_storage.get(_storage(target) or -1)
            region = Layout(tuple(target.shape), tuple(target.stride()), target.storage_offset()) if names else None
        if names:
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
