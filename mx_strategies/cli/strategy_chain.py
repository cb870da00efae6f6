"""ModelExpress's strategy chain as a deployment will run it, for doctor: each strategy in order, whether it is
available here and why, what it reads, and whether robust's inspection lets it.

The order is the installed ModelExpress's own: its ``LoadStrategyChain.run`` builds the list (0.7's fixed six;
0.8's with the plugin ``MX_LOAD_PLUGIN`` names inserted), caught before it runs, with robust in the place the
activation gives it. Availability is read from the environment as each strategy's ``is_available`` reads it
(without an engine: no adapter to ask, so a CUDA device is one visible to torch). Robust's verdict for the
local-folder readers (:data:`mx_strategies.chain_guard.FOLDER_READERS`) is the guard's own
(:func:`mx_strategies.chain_guard.judge_folder`) on the engine's ``model``, with no module to ask: where the load
would ask it (a folder without an index, or ``MX_ROBUST_GUARD_CHAIN=module``), the row says so.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace
from typing import Any, Optional

from ..chain_guard import CHECKED_AFTER, DEFAULT_LINK, FOLDER_READERS, SETTING, FolderVerdict, judge_folder
from ..engine import VLLM, missing_hooks
from ..inspect.sources import Resolution
from ..select.built_module import BuiltModule
from ..settings import RobustSettings
from .module_build import cuda_visible

ROBUST = "robust_model_streamer"
# mx_strategies' name in vLLM's general plugins (pyproject.toml's entry point), what VLLM_PLUGINS must list.
PLUGIN_ENTRY = "mx_strategies"


class _Captured(Exception):
    """The chain's list, caught before ModelExpress runs it."""

    def __init__(self, strategies: list) -> None:
        super().__init__("captured")
        self.strategies = strategies


def installed_order(engine: str) -> tuple[list[Any], Optional[str], tuple[Optional[str], str]]:
    """The strategies the installed ModelExpress's chain holds, in order, robust where this node's switch puts
    it; why the order could not be read (None when it was); and :func:`switched_on`'s door and reason (door
    None: robust is not switched on, and the chain is ModelExpress's own)."""
    import modelexpress.load_strategy as chain

    from .. import activation
    from ..robust import RobustModelStreamerStrategy

    def capture(model: Any, ctx: Any, strategies: list) -> None:
        raise _Captured(list(strategies))

    original = chain.execute_load_strategies
    chain.execute_load_strategies = capture
    try:
        chain.LoadStrategyChain.run(None, SimpleNamespace(global_rank=0))
    except _Captured as captured:
        switch = switched_on(captured.strategies, engine)
        if switch[0] is None:
            return captured.strategies, None, switch
        return activation._substitute(captured.strategies, RobustModelStreamerStrategy), None, switch
    except Exception as exc:  # noqa: BLE001 - a plugin folder that does not load: said, not raised
        return [], f"{type(exc).__name__}: {exc}", (None, f"ModelExpress's chain could not be read: {exc}")
    finally:
        chain.execute_load_strategies = original
    return [], "ModelExpress's chain ran no strategy list", (None, "ModelExpress's chain ran no strategy list")


def switched_on(strategies: list, engine: str) -> tuple[Optional[str], str]:
    """The door robust enters this node's chain by, and how: ModelExpress 0.8's plugin folder (the chain
    ModelExpress built holds it: ``MX_LOAD_PLUGIN``), or ``MX_STRATEGY`` naming it, where vLLM's plugin filter
    ``VLLM_PLUGINS`` lets the activation run. Door None where neither, with why and what to set."""
    from ..activation import STRATEGY_ENV, resolve_strategy_class
    from ..errors import ActivationError
    from ..robust import RobustModelStreamerStrategy

    if any(getattr(s, "name", None) == ROBUST for s in strategies):
        return "MX_LOAD_PLUGIN", f"MX_LOAD_PLUGIN={ROBUST} (ModelExpress's plugin folder)"
    spec = os.environ.get(STRATEGY_ENV, "").strip()
    if not spec:
        return None, (f"{STRATEGY_ENV} is unset and ModelExpress's chain holds no plugin named {ROBUST}: "
                      f"set {STRATEGY_ENV}=mx_strategies.robust")  # fmt: skip
    allowed = os.environ.get("VLLM_PLUGINS")
    if engine == VLLM and allowed is not None and PLUGIN_ENTRY not in [n.strip() for n in allowed.split(",")]:
        return None, (f"{STRATEGY_ENV} is set, but VLLM_PLUGINS={allowed!r} keeps vLLM from loading mx_strategies' "
                      f"plugin: add {PLUGIN_ENTRY} to VLLM_PLUGINS")  # fmt: skip
    try:
        named = resolve_strategy_class(spec)
    except ActivationError as exc:
        return None, str(exc)
    if not issubclass(named, RobustModelStreamerStrategy):
        return None, f"{STRATEGY_ENV}={spec} names {named.__name__}: set {STRATEGY_ENV}=mx_strategies.robust"
    return STRATEGY_ENV, f"{STRATEGY_ENV}={spec}"


def robust_status(rows: list[dict], switch: tuple[Optional[str], str]) -> dict:
    """Whether robust will run on this node, in one line (``line``) and its parts: ``switched_on``, its ``door``
    (``MX_STRATEGY`` or ``MX_LOAD_PLUGIN``), ``offered`` by robust's rule (its row's; None: not switched on), ``why``."""
    door, how = switch
    if door is None:
        return {"switched_on": False, "door": None, "offered": None, "runs": False, "why": how,
                "line": f"robust will not run on this node: {how}"}  # fmt: skip
    offered, why = next((row["available"], row["why"]) for row in rows if row["name"] == ROBUST)
    line = (f"robust will run on this node: switched on by {how}; offered: {why}" if offered else
            f"robust is switched on by {how} but will not run on this node: {why}")  # fmt: skip
    return {"switched_on": True, "door": door, "offered": bool(offered), "runs": bool(offered), "why": why,
            "line": line}


def availability(strategy: Any, settings: RobustSettings, engine: str) -> tuple[Optional[bool], str]:
    """Whether ``strategy`` is offered here, and why (None: doctor cannot tell without the engine)."""
    from modelexpress import envs

    from ..activation import offered

    name = getattr(strategy, "name", type(strategy).__name__)
    missing = missing_hooks(engine, tuple(getattr(strategy, "requires", ())))
    if missing:  # ModelExpress's own rule: the engine's adapter overrides every hook the strategy requires
        return False, f"ModelExpress's {engine} adapter does not override {', '.join(missing)}"
    if name == "rdma":
        return None, "needs a ModelExpress server with a peer serving this model (P2P); asked at load"
    if name == "server-cache":
        return None, "needs a ModelExpress server holding this model; asked at load"
    if name == "instant_tensor":
        if not envs.MX_INSTANT_TENSOR:
            return False, "MX_INSTANT_TENSOR disabled"
        if _skips_for_object_store_uri():
            return False, "MX_MODEL_URI is an object-store URI (ModelExpress 0.8 skips it then)"
        if importlib.util.find_spec("instanttensor") is None:
            return False, "the instanttensor package is not installed"
        if not cuda_visible():
            return False, "no CUDA device"
        return True, "MX_INSTANT_TENSOR on (the default), instanttensor installed, a CUDA device"
    if name in (ROBUST, "model_streamer"):
        if importlib.util.find_spec("runai_model_streamer") is None:
            return False, "runai-model-streamer is not installed"
        if name == ROBUST:
            return offered(settings)
        return (True, "MX_MODEL_URI is set") if settings.model_uri else (False, "MX_MODEL_URI is not set")
    if name == "gds":
        if not cuda_visible():
            return False, "no CUDA device"
        return None, "a CUDA device; GPUDirect Storage is asked at load"
    if name == "default":
        return True, "the engine's own loader: always offered"
    return None, "not one of ModelExpress's strategies (a plugin): asked at load"


def _skips_for_object_store_uri() -> bool:
    """Whether the installed InstantTensor steps aside for this MX_MODEL_URI: ModelExpress 0.8's own test (an
    object-store URI); 0.7 has none and never does."""
    from modelexpress.load_strategy import instant_tensor_strategy

    skips = getattr(instant_tensor_strategy, "_has_object_store_model_uri", None)
    return bool(skips is not None and skips())


READS = {
    "rdma": "a peer's GPU memory (NIXL)",
    "server-cache": "the ModelExpress server's cache",
    "instant_tensor": "the engine's model folder (vLLM's own file list), unchecked",
    ROBUST: "its source chain (model_weights, model, MX_MODEL_URI), verified",
    "model_streamer": "MX_MODEL_URI, then model_weights, model",
    "gds": "the engine's model folder, unchecked",
    "default": "the engine's model folder, with the engine's own checks",
}


def robust_verdict(
    name: str, verdict: Optional[FolderVerdict], folder: Optional[str], settings: RobustSettings, door: Optional[str]
) -> str:
    """Whether robust lets ``name`` read the engine's folder (only the folder readers are asked), in words."""
    if door is None:
        return "not asked: robust is not switched on"
    if name == ROBUST:
        return "robust itself: refuses what it would not load whole, before the model is touched"
    if name not in FOLDER_READERS:
        return "not asked (reads no local folder unchecked)"
    if settings.guard_chain == "off":
        return f"not asked: {SETTING}=off"
    if folder is None:
        return "no engine model given (--model): judged at load"
    if verdict is None:
        return "not judged: not a local folder (a hub id the engine downloads)"
    if verdict.refused:
        return f"kept off: {verdict.refusal}"
    if verdict.module_asked:
        return "allowed: the folder is consistent (the module's answer is asked at load)"
    return "allowed: the folder is consistent"


def checked_after(name: str, settings: RobustSettings, door: Optional[str]) -> Optional[str]:
    """Whether robust checks ``name`` after it loads (:func:`mx_strategies.chain_guard.checks_after`), in words; None
    where it does not."""
    if door is None or settings.guard_chain == "off" or name not in CHECKED_AFTER:
        return None
    if name == DEFAULT_LINK:
        return ("where the model is quantized (vLLM's own check skips it then): what load_weights reported against "
                "what the model keeps")  # fmt: skip
    return "always: what load_weights reported against what the model keeps, before the post-load pass"


def strategy_chain_view(
    folder: Optional[str], settings: RobustSettings, module: BuiltModule, resolution: Optional[Resolution] = None
) -> dict:
    """The ``--json`` object's ``strategies``: the order, and one row per strategy, for the engine's ``folder``.

    ``module``: doctor's stand-in for the built module (no question: the load asks it); ``resolution``: doctor's
    inspection of ``folder`` where its source chain made one."""
    verdict = judge_folder(folder, settings, lambda: module, resolution) if folder is not None else None
    strategies, error, switch = installed_order(module.engine.engine)
    door = switch[0]
    order = [getattr(s, "name", type(s).__name__) for s in strategies]
    rows = []
    for name, strategy in zip(order, strategies):
        available, why = availability(strategy, settings, module.engine.engine)
        rows.append({"name": name, "available": available, "why": why, "reads": READS.get(name, "unknown (a plugin)"),
                     "robust": robust_verdict(name, verdict, folder, settings, door),
                     "checked_after": checked_after(name, settings, door)})  # fmt: skip
    robust = robust_status(rows, switch)
    return {"order": order, "error": error, "strategies": rows, "folder": folder, "robust": robust}


__all__ = ["strategy_chain_view"]
