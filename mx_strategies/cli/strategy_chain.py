"""ModelExpress's strategy chain as a deployment will run it, for doctor: each strategy in order, whether it is
available here and why, what it reads, and whether robust's inspection lets it.

The order is the installed ModelExpress's own: its ``LoadStrategyChain.run`` builds the list (0.7's fixed six;
0.8's with the plugin ``MX_LOAD_PLUGIN`` names inserted), caught before it runs, with robust in the place the
activation gives it. Availability is read from the environment as each strategy's ``is_available`` reads it
(without an engine: no adapter to ask, so CUDA is ``torch.cuda.is_available()``). Robust's verdict for the
local-folder readers (:data:`mx_strategies.chain_guard.FOLDER_READERS`) comes from the inspection doctor already
made of the engine's ``model``; the module's answer (a folder of some shards without an index) is asked at load.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace
from typing import Any, Optional

from ..chain_guard import FOLDER_READERS, SETTING, object_store_refusal
from ..engine import missing_hooks
from ..errors import MxStrategiesError
from ..inspect.checkpoint import Checkpoint
from ..inspect.sources import Candidate, probe
from ..inspect.storage import is_object_store_uri
from ..select.selection import describe_errors
from ..releases import VLLM
from ..settings import RobustSettings

ROBUST = "robust_model_streamer"


class _Captured(Exception):
    """The chain's list, caught before ModelExpress runs it."""

    def __init__(self, strategies: list) -> None:
        super().__init__("captured")
        self.strategies = strategies


def installed_order() -> tuple[list[Any], Optional[str]]:
    """The strategies the installed ModelExpress's chain holds, in order, robust in its place; and why the
    order could not be read (None when it was)."""
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
        return activation._substitute(captured.strategies, RobustModelStreamerStrategy), None
    except Exception as exc:  # noqa: BLE001 - a plugin folder that does not load: said, not raised
        return [], f"{type(exc).__name__}: {exc}"
    finally:
        chain.execute_load_strategies = original
    return [], "ModelExpress's chain ran no strategy list"


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def availability(strategy: Any, settings: RobustSettings, engine: str) -> tuple[Optional[bool], str]:
    """Whether ``strategy`` is offered here, and why (None: doctor cannot tell without the engine)."""
    from modelexpress import envs

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
        uri = (settings.model_uri or "").strip().lower()
        if is_object_store_uri(uri) and _skips_object_store_uri():
            return False, "MX_MODEL_URI is an object-store URI (ModelExpress 0.8 skips it then)"
        if importlib.util.find_spec("instanttensor") is None:
            return False, "the instanttensor package is not installed"
        if not _cuda():
            return False, "no CUDA device"
        return True, "MX_INSTANT_TENSOR on (the default), instanttensor installed, a CUDA device"
    if name in (ROBUST, "model_streamer"):
        if importlib.util.find_spec("runai_model_streamer") is None:
            return False, "runai-model-streamer is not installed"
        if name == ROBUST and not settings.require_model_uri:
            return True, "MX_ROBUST_REQUIRE_MODEL_URI=false: offered with or without MX_MODEL_URI"
        return (True, "MX_MODEL_URI is set") if settings.model_uri else (False, "MX_MODEL_URI is not set")
    if name == "gds":
        if not _cuda():
            return False, "no CUDA device"
        return None, "a CUDA device; GPUDirect Storage is asked at load"
    if name == "default":
        return True, "the engine's own loader: always offered"
    return None, "not one of ModelExpress's strategies (a plugin): asked at load"


def _skips_object_store_uri() -> bool:
    """ModelExpress 0.8's InstantTensor steps aside for an object-store MX_MODEL_URI; 0.7's does not."""
    from modelexpress.load_strategy import instant_tensor_strategy

    return hasattr(instant_tensor_strategy, "_has_object_store_model_uri")


READS = {
    "rdma": "a peer's GPU memory (NIXL)",
    "server-cache": "the ModelExpress server's cache",
    "instant_tensor": "the engine's model folder (vLLM's own file list), unchecked",
    ROBUST: "its source chain (model_weights, model, MX_MODEL_URI), verified",
    "model_streamer": "MX_MODEL_URI, then model_weights, model",
    "gds": "the engine's model folder, unchecked",
    "default": "the engine's model folder, with the engine's own checks",
}


def robust_verdict(name: str, folder: Optional[str], checkpoint: "Checkpoint | str", settings: RobustSettings) -> str:
    """Whether robust lets ``name`` read the engine's folder (only the folder readers are asked)."""
    if name == ROBUST:
        return "robust itself: refuses what it would not load whole, before the model is touched"
    if name not in FOLDER_READERS:
        return "not asked (reads no local folder unchecked)"
    if settings.guard_chain == "off":
        return f"not asked: {SETTING}=off"
    if folder is None:
        return "no engine model given (--model): judged at load"
    if is_object_store_uri(folder):
        return f"kept off: {object_store_refusal(folder)}"
    if not os.path.isdir(folder):
        return "not judged: not a local folder (a hub id the engine downloads)"
    if isinstance(checkpoint, str):
        return f"kept off: {checkpoint}"
    if checkpoint.errors:
        return f"kept off: {describe_errors(checkpoint)}"
    if checkpoint.index is None or settings.guard_chain == "module":
        return "allowed: the folder is consistent (the module's answer is asked at load)"
    return "allowed: the folder is consistent"


def _inspected(folder: Optional[str], settings: RobustSettings) -> "Checkpoint | str | None":
    """robust's inspection of a local folder (headers only), or why it finds no checkpoint there."""
    if folder is None or is_object_store_uri(folder) or not os.path.isdir(folder):
        return None
    try:
        return probe(Candidate("model", folder), settings)
    except MxStrategiesError as exc:
        return str(exc)


def strategy_chain_view(folder: Optional[str], settings: RobustSettings, engine: str = VLLM) -> dict:
    """The ``--json`` object's ``strategies``: the order, and one row per strategy, for the engine's ``folder``."""
    checkpoint = _inspected(folder, settings)
    strategies, error = installed_order()
    order = [getattr(s, "name", type(s).__name__) for s in strategies]
    rows = []
    for name, strategy in zip(order, strategies):
        available, why = availability(strategy, settings, engine)
        rows.append({"name": name, "available": available, "why": why, "reads": READS.get(name, "unknown (a plugin)"),
                     "robust": robust_verdict(name, folder, checkpoint, settings)})  # fmt: skip
    return {"order": order, "error": error, "strategies": rows, "folder": folder}


__all__ = ["strategy_chain_view"]
