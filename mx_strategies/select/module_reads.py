"""The one question asked of the module the engine built: what does it read from this checkpoint?

The selection (:mod:`.selection`) asks it once per load, for targets and drafts,
on vLLM and SGLang, and gets one answer, :class:`ModuleReads`: the names,
which source answered (``selection_source``) and what was left out and why.
The sources, in order:

1. ``dry_run``: the built module's own ``load_weights`` run over the
   checkpoint's names with tensors that hold no data (:mod:`.dry_run`), on
   an isolated twin; a name is read when the model uses it, and the
   parameters it flows into say whether the engine replaces it afterwards.
   What the model or the engine says itself shapes it: vLLM's
   ``is_unused_checkpoint_weight`` (names the model never loads are not even
   fed) and the engine's replacement of a draft's embedding and head after
   loading (:func:`.mtp_table.filled_by_engine`, :mod:`.engine.vllm_rules`);
2. ``table``: :mod:`.mtp_table`, only where the dry run cannot answer (the
   class raises on data-less tensors, or there is no model), with a WARNING
   naming the class and the reason;
3. ``convention``: the generic MTP naming conventions (rows of :mod:`.mtp_rows`).

Sources 2 and 3 are decided in :mod:`.selection` (they need no model); this
module answers 1, or says why it could not (:class:`Unanswered`).

The answer is cached (:mod:`.reads_cache`): a restart with the same class,
parameters, parallel layout and checkpoint names asks nothing. A kept answer
a load proves wrong (the model-side check fails with it) is dropped
(:func:`drop_disproved`): the next load asks again.
"""

from __future__ import annotations

import collections
import functools
import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from ..inspect.checkpoint import Checkpoint
from ..inspect.headers import runai_dtypes, storage_shape
from ..verify.coverage import Gap
from ..verify.kept import before_streaming
from .dry_run import DryRunFailed, dry_run
from ..settings import RobustSettings

# The sources that may answer, in this order (the setting MX_ROBUST_SELECTION_SOURCES until issue 53); "whole" is
# what a load falls back to. Read at call time, so a test may leave one out.
SELECTION_ORDER = ("dry_run", "table", "convention")
# Above this many names the dry run feeds a sample of them (:mod:`.name_sampling`), not every one.
DRY_RUN_SAMPLE_ABOVE = 8192

# Why a name is not streamed (stable codes: the cache stores them, reports show the text).
_FED_NOT_READ = "not read by the module's load_weights (dry run)"
_INFERRED_NOT_READ = "not read by the module's load_weights (dry run of names of the same template)"
_DECLARED_UNUSED = "the model declares it unused (is_unused_checkpoint_weight, skip_checkpoint_weight)"
_REPLACED = "written only into parameters the engine replaces after loading (the target's embedding/head)"
_OVERWRITTEN = "a later checkpoint tensor overwrites the same parameter whole"


@dataclass(frozen=True)
class ModuleReads:
    """What a module reads from a checkpoint, which source said so, and what is left out and why."""

    names: frozenset[str]
    source: str  # one of SELECTION_ORDER, or "whole"
    left_out: Mapping[str, str] = field(default_factory=dict)  # name -> why it is not streamed
    module_class: str = ""
    seconds: float = 0.0  # time the question took (0 from the cache)
    cached: bool = False
    kept_key: str = ""  # the reads cache's key of the kept answer it was read from (:mod:`.reads_cache`); "": asked
    note: str = ""  # for a table/convention answer: why the module could not be asked
    # Parameters the answer's names would leave in part at their init values (a stacked or fused parameter
    # the checkpoint fills only in part): the load is refused before a byte streams (coverage.Gap).
    gaps: tuple[Gap, ...] = ()
    judged: int = 0  # how many parameters the coverage was checked on


@dataclass(frozen=True)
class Unanswered:
    """The module could not be asked (no model, no load_weights, or the dry run failed): why."""

    module_class: str
    reason: str
    declined: bool = False  # the module said so itself (``supports_dry_run = False``): no anomaly, no WARNING


Answer = Union[ModuleReads, Unanswered]


def class_name(model: Any) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def _overwritten(whole_writes: tuple, full: Mapping[str, bool]) -> dict[str, str]:
    """Names whose every write filled parameters whole that a later write, of other names, fills whole again.

    What a sequential load leaves is the last write (DeepSeek's MTP draft reads its embedding from the
    top-level name and from the MTP layer's copy: one is enough). Names written together (a fused
    ``torch.cat`` of q_a_proj and kv_a_proj) are one write and never overwrite each other.
    """
    last = {param: index for index, (params, _) in enumerate(whole_writes) for param in params}
    writes_of: dict[str, list[int]] = {}
    for index, (_, names) in enumerate(whole_writes):
        for name in names:
            writes_of.setdefault(name, []).append(index)
    dropped = {}
    for name, indices in writes_of.items():
        if not full.get(name):
            continue
        winners = {last[p] for i in indices for p in whole_writes[i][0]}
        if all(w > max(indices) and name not in whole_writes[w][1] for w in winners):
            params = sorted({p for i in indices for p in whole_writes[i][0]})
            kept = sorted({n for w in winners for n in whole_writes[w][1]})
            dropped[name] = f"{_OVERWRITTEN} ({', '.join(params)}; streamed: {', '.join(kept)})"
    return dropped


def _collector_paused(function: Callable) -> Callable:
    """``function`` run with Python's cyclic garbage collector held off (and restored as it was after).

    The question allocates a few hundred thousand short-lived objects (names' parses, the twin); with an
    engine's millions of objects alive, each full collection they trigger costs a large part of a second,
    at random. What the question leaves for the collector is collected at the next collection after it.
    """

    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


@_collector_paused
def ask(
    model: Any,
    checkpoint: Checkpoint,
    settings: RobustSettings,
    *,
    unused: Optional[Callable[[str], bool]] = None,
    replaced: Callable[[str], bool] = lambda name: False,
    call: Optional[Callable[[Any, Any], Any]] = None,
) -> Answer:
    """Ask ``model`` which of ``checkpoint``'s tensors it reads (sources 1 and 2 of the module docstring).

    ``unused``: the model's ``is_unused_checkpoint_weight`` (:func:`.engine.declared_unused`);
    ``replaced``: the parameters the engine writes after loading (:attr:`.built_module.BuiltModule.filled_by_engine`);
    ``call``: how the engine's adapter feeds the model (default ``model.load_weights(weights)``).
    Never raises for what the model does; the model is as before.
    """
    started = time.perf_counter()
    cls = class_name(model) if model is not None else ""
    if "dry_run" not in SELECTION_ORDER:
        return Unanswered(cls, "the selection sources leave out dry_run")
    if model is None or not callable(getattr(model, "load_weights", None)):
        return Unanswered(cls, "the engine has no module with a load_weights to ask")
    if getattr(model, "supports_dry_run", True) is False:
        return Unanswered(cls, "the module says it cannot be asked (supports_dry_run = False)", declined=True)
    tensors = checkpoint.tensors()
    left_out = dict.fromkeys(filter(unused, tensors), _DECLARED_UNUSED) if unused is not None else {}
    # name -> TensorInfo; a dry run is fed header(info) of the names it gets
    headers: Mapping[str, Any] = {n: i for n, i in tensors.items() if n not in left_out} if left_out else tensors
    dtypes = runai_dtypes()  # torch's dtype for each safetensors dtype string (the headers')
    if not {info.dtype for info in headers.values()} <= dtypes.keys():
        name, info = next((n, i) for n, i in headers.items() if i.dtype not in dtypes)
        return Unanswered(cls, f"tensor {name} has dtype {info.dtype}, which torch cannot represent")

    def header(info: Any) -> tuple:
        return storage_shape(info.dtype, info.shape), dtypes[info.dtype]  # as runai will hand it out

    try:
        run = _run(model, headers, header, settings, call)
    except DryRunFailed as exc:
        return Unanswered(cls, str(exc))
    for name in headers:
        if name not in run.read:
            left_out[name] = _FED_NOT_READ if name in run.fed_names else _INFERRED_NOT_READ
    read = [n for n in headers if n in run.read]
    copies = [n for n in read if run.written.get(n) and all(replaced(p) for p in run.written[n])]
    if copies:
        # The engine replaces these afterwards; but a load_weights that demands them (Step-3.5 asserts its
        # embedding arrived) must still get them: a second dry run without them says which it is.
        try:
            fed = run.fed_names
            dry_run(model, {n: header(h) for n, h in headers.items() if n in fed and n not in copies},
                    timeout_s=settings.dry_run_timeout_s, call=call)  # fmt: skip
        except DryRunFailed:
            copies = []
    left_out.update(dict.fromkeys(copies, _REPLACED))
    left_out.update({n: why for n, why in _overwritten(run.whole_writes, run.full).items() if n not in left_out})
    names = frozenset(n for n in read if n not in left_out)
    if not names and read:
        return Unanswered(cls, f"the dry run found {len(read)} name(s) read, all replaced by the engine")
    if not names:
        return Unanswered(cls, f"the dry run found none of the {len(headers)} names fed read by the module")
    unit = None
    if run.sample is not None:
        ints_of = run.sample.ints
        unit = lambda name: (lambda ints: ints if len(ints) >= 2 else None)(ints_of(name))  # noqa: E731
    # Which parameters are judged: the model's; their layouts: the twin's, whose storages the writes were in.
    judged, found = before_streaming(model, run.writes, layouts=run.layouts, replaced=replaced,
                                     streamed=names.__contains__, present=tensors.__contains__, unit=unit)  # fmt: skip
    if run.sample is not None:  # the units no dry run was fed: a member their fed peers have, missing
        stacked = [n for n in run.fed_names if n in names and not run.full.get(n, True)]
        found += _unfed_gaps(run, run.sample.missing_members(run.fed_names, stacked), judged)
    return ModuleReads(names, "dry_run", left_out, cls, time.perf_counter() - started, gaps=tuple(found), judged=len(judged))


def _unfed_gaps(run: "_Runs", missing: Mapping[str, str], judged: Mapping[str, Any]) -> list[Gap]:
    """Gaps for names a sampled checkpoint lacks in units no dry run was fed (:meth:`.name_sampling.Sample.missing_members`)."""
    ints_of = run.sample.ints
    gaps = []
    for name, example in sorted(missing.items()):
        params = sorted(run.written.get(example, ()))
        if not params:
            continue
        # The parameter the missing name would fill: its fed peer's, at the missing name's own layer.
        layer, peer_layer = ints_of(name)[0], ints_of(example)[0]
        param = params[0].replace(f".{peer_layer}.", f".{layer}.", 1)
        layout = judged.get(param)
        if layout is None:
            continue  # not a parameter this rank keeps (another stage's layer, another rank's expert)
        size = next((w.view.numel for w in run.writes if w.names == frozenset((example,))), 0)
        part = f"the part {example.rsplit('.', 2)[-2]} fills for unit {ints_of(name)}"
        gaps.append(Gap(param, layout.shape, (part,), size, (), (name,)))
    return gaps


@dataclass
class _Runs:
    """One exact dry run, or the rounds of a sampled one (:mod:`.name_sampling`), merged."""

    read: frozenset
    written: dict
    full: dict
    whole_writes: tuple
    fed_names: frozenset
    writes: tuple = ()
    layouts: Mapping = field(default_factory=dict)
    sample: Any = None  # the name_sampling.Sample of a sampled run; None for an exact one


def _run(model: Any, headers: Mapping, header: Callable, settings: RobustSettings, call: Optional[Callable]) -> _Runs:
    """The dry run of ``headers`` (name -> TensorInfo, fed as ``header(info)``): all of them, or above
    :data:`DRY_RUN_SAMPLE_ABOVE` names, a sample."""
    from . import name_sampling

    timeout = settings.dry_run_timeout_s
    if len(headers) <= DRY_RUN_SAMPLE_ABOVE:
        run = dry_run(model, {n: header(info) for n, info in headers.items()}, timeout_s=timeout, call=call)
        return _Runs(run.read, dict(run.written), dict(run.full), run.whole_writes, frozenset(headers), run.writes, run.layouts)
    started = time.perf_counter()
    sample = name_sampling.Sample(headers)
    first = sample.first_round()
    runs = [dry_run(model, {n: header(headers[n]) for n in first}, timeout_s=timeout, call=call)]
    second = sample.second_round(first, runs[0].read)
    if second:
        left = max(timeout - (time.perf_counter() - started), 0.001)
        runs.append(dry_run(model, {n: header(headers[n]) for n in second}, timeout_s=left, call=call))
    fed = frozenset(first) | frozenset(second)
    read = frozenset(sample.infer(fed, set().union(*(r.read for r in runs))))
    written = {k: v for r in runs for k, v in r.written.items()}
    full = {k: v for r in runs for k, v in r.full.items()}
    return _Runs(
        read, written, full, tuple(w for r in runs for w in r.whole_writes), fed,
        tuple(w for r in runs for w in r.writes), runs[0].layouts, sample,
    )  # fmt: skip


@_collector_paused
def ask_cached(
    model: Any,
    checkpoint: Checkpoint,
    settings: RobustSettings,
    context: tuple,
    **how: Any,
) -> Answer:
    """:func:`ask`, through the cache of :mod:`.reads_cache` (``context``: engine, release, role, layout, rank)."""
    from . import reads_cache

    if model is None or "dry_run" not in SELECTION_ORDER or not hasattr(model, "named_parameters"):
        return ask(model, checkpoint, settings, **how)
    started = time.perf_counter()
    tensors = checkpoint.tensors()
    key = reads_cache.cache_key(model, tensors, context)
    kept = reads_cache.load(settings.reads_cache_dir, key)
    if kept is not None:
        left_out = kept["left_out"]
        names = frozenset(n for n in tensors if n not in left_out)
        return ModuleReads(names, kept["source"], left_out, kept["module_class"], time.perf_counter() - started, True,
                           judged=kept["judged"], kept_key=key)  # fmt: skip
    answer = ask(model, checkpoint, settings, **how)
    if isinstance(answer, ModuleReads) and not answer.gaps:  # a refused checkpoint is asked again next time
        reads_cache.store(settings.reads_cache_dir, key, answer)
    return answer


def drop_disproved(answer: Optional[Answer], settings: RobustSettings, on_warning: Callable[[str], None]) -> None:
    """A load that streamed what ``answer`` selected failed the model-side check (IncompleteModel): where the
    answer was a kept one, the load proved it wrong (a stale or edited file leaving out tensors the module reads),
    and its file is dropped (:func:`.reads_cache.drop`), so the next load asks the module again instead of failing
    the same way. One WARNING through ``on_warning``; never raises. An answer asked by this load is left as kept:
    asked again, the module would answer the same."""
    from . import reads_cache

    if not isinstance(answer, ModuleReads) or not answer.cached or not answer.kept_key:
        return
    path, why = reads_cache.drop(settings.reads_cache_dir, answer.kept_key)
    kept = f"kept answer {path} ({answer.module_class}) was proven wrong by this load (the model-side check failed)"
    if why is None:
        on_warning(f"{kept} and was dropped: the next load asks the module again")
    else:
        on_warning(f"{kept} but could not be dropped ({why}): the next load with it fails the same way; delete the "
                   f"file, or point MX_ROBUST_READS_CACHE_DIR at a folder this process can write")  # fmt: skip


def left_out_summary(left_out: Mapping[str, str], shown: int = 5) -> str:
    """``N tensor(s) left out: reason (k), ...`` for the INFO line."""
    counts = collections.Counter(reason.split(" (", 1)[0] for reason in left_out.values())
    parts = [f"{reason} ({count})" for reason, count in counts.most_common(shown)]
    return f"{len(left_out)} tensor(s) left out: {'; '.join(parts)}" if left_out else "nothing left out"
