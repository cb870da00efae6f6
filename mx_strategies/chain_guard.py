"""Keep ModelExpress's local-folder readers off a folder robust would refuse.

Two strategies of ModelExpress's chain load the engine's own local folder
with none of the checks of vLLM's ``DefaultModelLoader.load_weights`` (every
parameter loaded; on vLLM 0.34 every shard of a stacked one):
``instant_tensor`` (ahead of robust, on by default on every CUDA node:
vLLM's ``DefaultModelLoader.get_all_weights`` fed to ``apply_weight_iter``)
and ``gds`` (after it). On a folder partly downloaded or mounted they serve
a half-loaded model (an index naming a shard that is not there: the others
load) or fail after touching it (a shard cut short: ``mutated=True``, the
model rebuilt), and on an object-store ``model`` (robust streaming ``s3://``
without ``MX_MODEL_URI``) vLLM takes the URI for a hub id.

With robust in the chain, each of them asks robust first, when it is about to
run (after RDMA and the server cache missed), once per load: robust inspects
the folder and asks the built module what it reads, as for a load of its
own (:func:`folder_verdict`, headers only, the model untouched). A folder
robust would refuse is kept from them (``StrategyFailed(mutated=False)``
before their code runs, one log line with the reason and the setting), and
robust's chain decides the load; a whole folder goes to them unchanged.
Ranks agree (``all_gather_state``): one rank's refusal keeps every rank's
reader off, as their readers load together. ``MX_ROBUST_GUARD_CHAIN=off``
turns this off.

What robust cannot judge before a reader runs (a folder without an index under
a module that cannot be asked) is checked after it: each folder reader, and the
engine's default loader where vLLM skips its own check (a quantized model:
``default_loader.py`` checks only when ``model_config.quantization`` is unset),
has the model's ``load_weights`` report watched, and robust's model-side check
(:func:`.verify.after.after_loading`: what the model reported written against
what it keeps, the engine's own fills and vLLM's exemptions left out; then the
engine's per-shard record) runs when the link's weights are in, before the
engine's post-load pass and before ModelExpress publishes them
(:func:`checked_after`). A link that leaves a parameter unwritten fails
``mutated=True`` with one line naming it and the parameters, and the chain
goes on to robust. A model that reports no names is let through with one line.

What it costs a whole folder is robust's inspection (``auto``, the default: the
index vouches for what the files hold, and the headers are checked against
it; the module is asked only where there is no index) or that and the module's
answer (``module``): ``python -m benchmarks --chain-guard``, docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from modelexpress.adapter import StrategyFailed

from .engine import engine_view
from .errors import ConfigurationError, IncompleteModel, MxStrategiesError
from .inspect.sources import Candidate, Resolution, engine_model, resolve
from .inspect.storage import is_object_store_uri
from .select.built_module import BuiltModule
from .select.selection import select_resolved
from .settings import load_settings
from .verify.after import after_loading

_logger = logging.getLogger("modelexpress.mx_strategies.chain_guard")

# ModelExpress's strategies that read the engine's own local folder and check nothing of what they loaded.
FOLDER_READERS = ("instant_tensor", "gds")
# The engine's own loader: vLLM's default loader checks what it loaded, except for a quantized model.
DEFAULT_LINK = "default"
# The adapter's hook each link calls once its weights are in (ModelExpress 0.7, inside the link's load); 0.8 calls
# it from the chain's finalize, after load returns.
_POST_LOAD_HOOK = {"instant_tensor": "after_weight_iter_load", "gds": "after_weight_iter_load",
                   DEFAULT_LINK: "after_native_load"}  # fmt: skip
# The links robust may check after they load (:func:`checks_after` says when): what doctor lists too.
CHECKED_AFTER = tuple(_POST_LOAD_HOOK)
SETTING = "MX_ROBUST_GUARD_CHAIN"
_GUARDED_MARK = "__mx_strategies_guarded__"
_ABSENT = object()


@dataclass(frozen=True)
class FolderVerdict:
    """Robust's word on the folder the engine's own readers would load."""

    folder: str
    refusal: Optional[str] = None  # why robust would refuse it; None: robust would load it whole
    module_asked: bool = False  # whether the verdict asks the built module what it reads (else inspection alone)

    @property
    def refused(self) -> bool:
        return self.refusal is not None


def judge_folder(
    folder: str, settings: Any, module: Callable[[], Optional[BuiltModule]], resolution: Optional[Resolution] = None
) -> Optional[FolderVerdict]:
    """robust's word on the engine's ``folder``; None where robust cannot judge it (a hub id the engine downloads,
    a module robust does not load). ``module`` makes the module to ask (None: one robust does not load), only for a
    local folder; ``resolution``: the folder's inspection where the caller has made it already (doctor's chain).
    The one verdict: the guard's at load (:func:`folder_verdict`) and doctor's (``mx_strategies.cli.strategy_chain``)."""
    if is_object_store_uri(folder):
        return FolderVerdict(folder, f"the engine's model is the object-store URI {folder}, which the engine's own "
                                     f"readers take for a hub id; robust streams it")  # fmt: skip
    if not os.path.isdir(folder):
        return None
    built = module()
    if built is None:
        return None
    ask = False
    try:
        resolution = resolution or resolve([Candidate("model", folder)], settings)
        # Under auto the index vouches for what the files hold; without one only the module can say.
        ask = settings.guard_chain == "module" or resolution.checkpoint.index is None
        select_resolved(resolution, built, settings, ask=ask)
    except MxStrategiesError as exc:
        return FolderVerdict(folder, str(exc), ask)
    return FolderVerdict(folder, None, ask)


def folder_verdict(model: Any, ctx: Any, settings: Any) -> Optional[FolderVerdict]:
    """What robust's inspection says of the folder ``ctx``'s engine reads (:func:`judge_folder`) at load."""
    folder = engine_model(getattr(ctx, "model_config", None))
    if folder is None:
        return None

    def module() -> Optional[BuiltModule]:
        built = BuiltModule.of(model, engine_view(ctx), settings, ctx.global_rank)
        return None if built.bypassed else built

    return judge_folder(folder, settings, module)


class _Verdicts:
    """One verdict per load, shared by the chain's guarded strategies, agreed by every rank."""

    _verdict: Optional[tuple[Optional[FolderVerdict]]] = None  # the instance's own once judged

    def of(self, model: Any, ctx: Any) -> Optional[FolderVerdict]:
        if self._verdict is None:
            self._verdict = (self._agreed(self._judged(model, ctx), ctx),)
        return self._verdict[0]

    @staticmethod
    def _judged(model: Any, ctx: Any) -> Optional[FolderVerdict]:
        settings = _guard_settings()
        if settings is None:
            return None
        try:
            return folder_verdict(model, ctx, settings)
        except Exception as exc:  # noqa: BLE001 - the guard never breaks a load ModelExpress would make
            _logger.warning(f"[Worker {getattr(ctx, 'global_rank', 0)}] robust could not judge the engine's folder "
                           f"({type(exc).__name__}: {exc}); ModelExpress's readers read it unjudged")  # fmt: skip
            return None

    @staticmethod
    def _agreed(verdict: Optional[FolderVerdict], ctx: Any) -> Optional[FolderVerdict]:
        gather = getattr(getattr(ctx, "adapter", None), "all_gather_state", None)
        if gather is None or not _several_ranks():
            return verdict
        refusals = [v for v in gather(verdict) if isinstance(v, FolderVerdict) and v.refused]
        if (verdict is not None and verdict.refused) or not refusals:
            return verdict
        first = refusals[0]
        return FolderVerdict(first.folder, f"another rank's copy: {first.refusal}")


def _guard_settings() -> Any:
    """The settings where the guard is on; None where it is off or the settings do not load (robust skips itself
    with the reason, and the chain runs as ModelExpress's)."""
    try:
        settings = load_settings()
    except ConfigurationError:
        return None
    return None if settings.guard_chain == "off" else settings


def _checks_after(name: str, ctx: Any) -> bool:
    """Whether robust checks link ``name`` after it loads: the folder readers always, the default loader where vLLM
    skips its own check (a quantized model); never a layerwise reload of a live model (ModelExpress 0.8's
    ``is_reload``: its parameters wait on the meta device until each layer is whole, which robust's check of a
    cold load does not judge)."""
    quantized = bool(getattr(getattr(ctx, "model_config", None), "quantization", None))
    return not getattr(ctx, "is_reload", False) and (name in FOLDER_READERS or (name == DEFAULT_LINK and quantized))


@contextmanager
def checked_after(name: str, result: Any, ctx: Any, settings: Any) -> Iterator[None]:
    """Run link ``name``'s load inside this block: what the model's ``load_weights`` reports is watched, and robust's
    model-side check runs once its weights are in (at the adapter's post-load hook where the link calls it inside
    its load, ModelExpress 0.7; else when the block ends, before 0.8's finalize). A parameter left unwritten:
    ``IncompleteModel`` (``mutated=True``), logged in one line naming the link; the chain rebuilds and goes on."""
    model = getattr(result, "model", result)
    adapter = getattr(ctx, "adapter", None)
    hook_name = _POST_LOAD_HOOK[name]
    rank = getattr(ctx, "global_rank", 0)
    engine = engine_view(ctx)
    said = []

    def failed(exc: IncompleteModel) -> None:
        if not said:
            said.append(True)
            _logger.warning(f"[Worker {rank}] {name} loaded {engine_model(ctx.model_config)} and robust's check after "
                            f"it failed: {exc}; ModelExpress rebuilds the model and robust's chain loads it")  # fmt: skip

    try:
        with after_loading(model, role=engine.role, policy=settings.model_completeness,
                           filled_by_engine=BuiltModule(engine).filled_by_engine,
                           on_warning=lambda message: _logger.warning(f"[Worker {rank}] {name}: {message}")) as check:
            hook = getattr(adapter, hook_name, None)
            if hook is None:
                yield
                return

            def post_load(*args: Any, **kwargs: Any) -> Any:
                try:
                    check()
                except IncompleteModel as exc:
                    failed(exc)
                    raise
                return hook(*args, **kwargs)

            own = adapter.__dict__.get(hook_name, _ABSENT)
            object.__setattr__(adapter, hook_name, post_load)
            try:
                yield
            finally:
                if own is _ABSENT:
                    adapter.__dict__.pop(hook_name, None)
                else:
                    object.__setattr__(adapter, hook_name, own)
    except IncompleteModel as exc:
        failed(exc)
        raise


def _several_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def guarded(strategies: list, robust_name: str) -> list:
    """``strategies`` with each folder reader asking robust's verdict before its ``load`` runs, and the folder
    readers and the default loader checked after (same instances, same order). Nothing changes where robust is
    not in the chain."""
    if not any(getattr(s, "name", None) == robust_name for s in strategies):
        return strategies
    verdicts = _Verdicts()
    for strategy in strategies:
        if getattr(strategy, "name", None) in CHECKED_AFTER and not getattr(strategy.load, _GUARDED_MARK, False):
            strategy.load = _guarded_load(strategy, verdicts, robust_name)
    return strategies


def _guarded_load(strategy: Any, verdicts: _Verdicts, robust_name: str) -> Callable:
    load = strategy.load

    def guarded_load(result: Any, ctx: Any) -> Any:
        if strategy.name in FOLDER_READERS:
            verdict = verdicts.of(getattr(result, "model", result), ctx)
            if verdict is not None and verdict.refused:
                message = (f"{strategy.name} kept off {verdict.folder}: robust would refuse it: {verdict.refusal}; "
                           f"{robust_name} decides this load ({SETTING}=off lets {strategy.name} read it)")  # fmt: skip
                _logger.warning(f"[Worker {ctx.global_rank}] {message}")
                raise StrategyFailed(message, mutated=False)
        settings = _guard_settings()
        if settings is None or not _checks_after(strategy.name, ctx):
            return load(result, ctx)
        try:
            with checked_after(strategy.name, result, ctx, settings):
                result = load(result, ctx)
        except IncompleteModel as exc:  # found after the link returned (0.8); at its post-load hook the link raises
            raise StrategyFailed(str(exc), mutated=True) from exc
        return result

    setattr(guarded_load, _GUARDED_MARK, True)
    return guarded_load

