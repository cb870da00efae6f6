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
with ``MX_ROBUST_REQUIRE_MODEL_URI=false``) vLLM takes the URI for a hub id.

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

What it costs a whole folder is robust's inspection (``auto``, the default: the
index vouches for what the files hold, and the headers are checked against
it; the module is asked only where there is no index) or that and the module's
answer (``module``): ``python -m benchmarks --chain-guard``, docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from modelexpress.adapter import StrategyFailed

from .engine import engine_view
from .errors import ConfigurationError, MxStrategiesError
from .inspect.sources import Candidate, Resolution, engine_model, resolve
from .inspect.storage import is_object_store_uri
from .select.built_module import BuiltModule
from .select.selection import select_resolved
from .settings import load_settings

logger = logging.getLogger("modelexpress.mx_strategies.chain_guard")

# ModelExpress's strategies that read the engine's own local folder and check nothing of what they loaded.
FOLDER_READERS = ("instant_tensor", "gds")
SETTING = "MX_ROBUST_GUARD_CHAIN"
_GUARDED_MARK = "__mx_strategies_guarded__"


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

    def __init__(self) -> None:
        self._verdict: Optional[tuple[Optional[FolderVerdict]]] = None

    def of(self, model: Any, ctx: Any) -> Optional[FolderVerdict]:
        if self._verdict is None:
            self._verdict = (self._agreed(self._judged(model, ctx), ctx),)
        return self._verdict[0]

    @staticmethod
    def _judged(model: Any, ctx: Any) -> Optional[FolderVerdict]:
        try:
            settings = load_settings()
        except ConfigurationError:
            return None  # robust skips itself with the reason; the chain runs as ModelExpress's
        if settings.guard_chain == "off":
            return None
        try:
            return folder_verdict(model, ctx, settings)
        except Exception as exc:  # noqa: BLE001 - the guard never breaks a load ModelExpress would make
            logger.warning(f"[Worker {getattr(ctx, 'global_rank', 0)}] robust could not judge the engine's folder "
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


def _several_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def guarded(strategies: list, robust_name: str) -> list:
    """``strategies`` with each folder reader asking robust's verdict before its ``load`` runs (same instances,
    same order). Nothing changes where robust is not in the chain."""
    if not any(getattr(s, "name", None) == robust_name for s in strategies):
        return strategies
    verdicts = _Verdicts()
    for strategy in strategies:
        if getattr(strategy, "name", None) in FOLDER_READERS and not getattr(strategy.load, _GUARDED_MARK, False):
            strategy.load = _guarded_load(strategy, verdicts, robust_name)
    return strategies


def _guarded_load(strategy: Any, verdicts: _Verdicts, robust_name: str) -> Callable:
    load = strategy.load

    def guarded_load(result: Any, ctx: Any) -> Any:
        verdict = verdicts.of(getattr(result, "model", result), ctx)
        if verdict is not None and verdict.refused:
            message = (f"{strategy.name} kept off {verdict.folder}: robust would refuse it: {verdict.refusal}; "
                       f"{robust_name} decides this load ({SETTING}=off lets {strategy.name} read it)")  # fmt: skip
            logger.warning(f"[Worker {ctx.global_rank}] {message}")
            raise StrategyFailed(message, mutated=False)
        return load(result, ctx)

    setattr(guarded_load, _GUARDED_MARK, True)
    return guarded_load


__all__ = [
    "FOLDER_READERS", "SETTING", "FolderVerdict", "folder_verdict", "guarded", "judge_folder",
]  # fmt: skip
