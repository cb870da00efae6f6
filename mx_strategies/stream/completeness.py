"""Model-side completeness: every parameter the model keeps was written from the checkpoint.

The ledger of :mod:`.streaming` checks the plan off: every planned tensor
delivered once. It cannot see a plan that misses something the model needs
(a LongCat draft whose ``model.mtp.norm.weight`` was never planned keeps its
init value). vLLM's default loader closes that gap with the names a model's
``load_weights`` returns ("Following weights were not initialized from
checkpoint", ``vllm/model_executor/model_loader/default_loader.py:520``);
ModelExpress's ``VllmAdapter.apply_weight_iter`` drops that return value.

:func:`capture_loaded` gets it back without touching the adapter: for the
duration of the call it wraps the model's ``load_weights`` (an instance
attribute, removed afterwards) and keeps what each call returns.
:func:`check` then compares it with the module's parameters and persistent
buffers, less what the engine fills afterwards (an MTP draft's shared
embedding and head, :func:`mx_strategies.select.mtp_table.filled_by_engine`) and
what no checkpoint carries (empty placeholders, KV-cache scales, which keep
their defaults when a checkpoint has none, online-quantization and
config-built parameters: the exemptions vLLM's own check makes for a
quantized model, ``default_loader.py:528``).

The check judges tensors, not names: a parameter registered under two
names (vLLM's Transformers backend registers a MoE block's ``gate`` and
``shared_experts`` under the block and under its experts wrapper;
``named_parameters()`` keeps the first name, ``load_weights`` reports the
other) counts as written when any of its names was reported
(:func:`required_tensors`).

A model whose ``load_weights`` returns no set of names is not checked, with
a warning: vLLM's default loader skips its check then too. In SGLang 0.5.23
some models return their names (Qwen3-Next's target, ``qwen3_next.py:1276``,
and about a fifth of its model files) and are checked; its MTP/NextN drafts
and DeepSeek's target return nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from ..select.coverage import Gap, Layout, Write, gaps as coverage_gaps
from ..errors import IncompleteModel, listed
from ..select.kept import GAPS_SHOWN, Required, required_tensors

NAMES_SHOWN = 10
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


@contextmanager
def capture_loaded(model: Any) -> Iterator[LoadedNames]:
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
class Completeness:
    """The outcome of one check."""

    checked: bool
    required: int = 0
    missing: list[str] = field(default_factory=list)
    exempt: list[str] = field(default_factory=list)  # filled by the engine afterwards
    reason: str = ""  # why it was not checked

    @property
    def complete(self) -> bool:
        return not self.missing


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


def check(
    model: Any,
    loaded: LoadedNames,
    *,
    role: str,
    policy: str,
    filled_by_engine: Callable[[str], bool] = lambda name: False,
    on_warning: Callable[[str], None] = lambda message: None,
) -> Completeness:
    """Compare what the model reported loaded with what it keeps; fail or warn per ``policy``.

    Raises IncompleteModel (``mutated=True``) under ``fail`` when something
    the model keeps was not written from the checkpoint.
    """
    if not loaded.reported:
        reason = (
            "the model's load_weights returned no set of loaded names"
            if loaded.calls
            else "the model's load_weights was not called"
        )
        on_warning(f"{role} completeness not checked: {reason} (vLLM's default loader skips its check then too)")
        return Completeness(False, reason=reason)
    tensors = required_tensors(model)
    exempt = sorted(r.name for r in tensors if any(filled_by_engine(alias) for alias in r.aliases))
    written = _written(tensors, loaded.names)
    missing = sorted(r.name for r in tensors if r.name not in written and r.name not in exempt)
    result = Completeness(True, len(tensors), missing, exempt)
    if missing:
        kind_of = {r.name: r.kind for r in tensors}
        kinds = {kind_of[name] for name in missing}
        what = "parameters and buffers" if len(kinds) > 1 else f"{kinds.pop()}s"
        _enforce(
            f"{role} model incomplete: {len(missing)} of {len(tensors)} {what} it keeps were not written "
            f"from the checkpoint: {listed(missing, NAMES_SHOWN)}",
            policy,
            on_warning,
        )
    return result


def _enforce(message: str, policy: str, on_warning: Callable[[str], None]) -> None:
    """``MX_ROBUST_MODEL_COMPLETENESS``: raise IncompleteModel (``mutated=True``) under ``fail``, else warn."""
    if policy == "fail":
        raise IncompleteModel(message + " (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)")
    on_warning(message)


def check_written(
    model: Any,
    judged: Mapping[str, Layout],
    writes: Sequence[Write],
    *,
    role: str,
    policy: str,
    on_warning: Callable[[str], None] = lambda message: None,
) -> list[Gap]:
    """What the load really wrote (:mod:`.write_watch`): every element of every judged parameter, or fail/warn.

    A parameter the load replaced by another object (a loader that sets a new ``Parameter``) is not
    judged: the writes were into the one it replaced. Raises IncompleteModel (``mutated=True``) under ``fail``.
    """
    now = dict(model.named_parameters(remove_duplicate=False)) if model is not None else {}
    kept = {n: layout for n, layout in judged.items() if n in now}
    found = coverage_gaps(kept, writes, streamed=lambda name: True)
    if found:
        parts = [g.describe(provenance=False) for g in found]  # the watch sees writes, not checkpoint names
        _enforce(
            f"{role} model incomplete: the load wrote {len(found)} of the {len(kept)} parameters it checks only in "
            f"part: {listed(parts, GAPS_SHOWN, '; ')}",
            policy,
            on_warning,
        )
    return found


def engine_missing_shards(model: Any) -> list[str]:
    """The parts of stacked parameters the engine's own record says this load never delivered.

    vLLM 0.34's ``StackedColumnParallelLinear`` (``gate_up_proj``, ``qkv_proj``, ``fused_qkv_a_proj``) marks
    each shard its ``weight_loader`` receives (``loaded_shard_ids``) and its default loader refuses a load
    that left one out (``pop_missing_shards``, ``default_loader.py``); ModelExpress's path asks nothing.
    Asked here after robust's load, as ``<parameter>.<shard id>``; popping clears the record, as vLLM's loader
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


def check_engine_marks(
    model: Any, *, role: str, policy: str, on_warning: Callable[[str], None] = lambda message: None
) -> list[str]:
    """The engine's own per-shard record agrees that every part of every stacked parameter was loaded, or fail/warn.

    robust's own checks (before streaming, and on what the load wrote) come first and are at least as strict;
    this is the engine's word beside them (raises IncompleteModel, ``mutated=True``, under ``fail``).
    """
    missing = engine_missing_shards(model)
    if missing:
        _enforce(
            f"{role} model incomplete: vLLM's own per-shard record says {len(missing)} part(s) of stacked "
            f"parameters were never loaded: {listed(missing, GAPS_SHOWN, ', ')}",
            policy,
            on_warning,
        )
    return missing


def refusal_advice(role: str, source: str) -> str:
    """What a user reads when every tensor streamed and the model still lacks some: robust's streaming is
    lost for this load (ModelExpress rebuilds the model for its next strategy), and what to do about it."""
    return (
        f"refused the {role} load it streamed from {source}: the model reported weights it keeps as not "
        f"written. ModelExpress now rebuilds the model and tries its next strategy, without robust. If the "
        f"model is right as loaded, MX_ROBUST_MODEL_COMPLETENESS=warn accepts it; `mx-strategies doctor "
        f"{source}` shows what robust plans for this checkpoint."
    )


def check_all(model: Any, loaded: LoadedNames, judged: Mapping[str, Layout], writes: Sequence[Write], *, role: str,
              policy: str, filled_by_engine: Callable[[str], bool], on_warning: Callable[[str], None]) -> None:  # fmt: skip
    """Every check of a finished load, in order: the names the model reported loaded (:func:`check`), what
    the load wrote into the judged parameters (:func:`check_written`), the engine's own per-shard record
    (:func:`check_engine_marks`). Raises IncompleteModel (``mutated=True``) under ``fail``."""
    check(model, loaded, role=role, policy=policy, filled_by_engine=filled_by_engine, on_warning=on_warning)
    check_written(model, judged, writes, role=role, policy=policy, on_warning=on_warning)
    check_engine_marks(model, role=role, policy=policy, on_warning=on_warning)


__all__ = [
    "Completeness", "LoadedNames", "capture_loaded", "check", "check_all", "check_engine_marks", "check_written",
    "engine_missing_shards", "refusal_advice",
]  # fmt: skip
