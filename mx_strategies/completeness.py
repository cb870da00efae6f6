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
embedding and head, :func:`mx_strategies.mtp_table.filled_by_engine`) and
what no checkpoint carries (empty placeholders, KV-cache scales, which keep
their defaults when a checkpoint has none, online-quantization and
config-built parameters: the exemptions vLLM's own check makes for a
quantized model, ``default_loader.py:528``).

A model whose ``load_weights`` returns no set of names is not checked, with
a warning: vLLM's default loader skips its check then too (SGLang's models
return nothing).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from . import mtp_table
from .engine import EngineView
from .errors import IncompleteModel

NAMES_SHOWN = 10
# KV-cache quantization scales registered by attention layers: defaults when a checkpoint has none.
KV_SCALE_BUFFER = re.compile(r"(^|\.)_?(k|v|q|prob)_scale(_float)?$")
# Parameters a quantization config builds rather than a checkpoint
# (vllm/model_executor/model_loader/default_loader.py:52, _CONFIG_BUILT_PARAMS).
CONFIG_BUILT_PARAMS = ("input_scale_ub",)
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


def _quantization_exempt(module: Any) -> bool:
    """Parameters vLLM's own check lets a quantized model miss: online and KV-cache quantization."""
    method = getattr(module, "quant_method", None)
    if method is None:
        return False
    return bool(getattr(method, "uses_meta_device", False)) or "KVCache" in type(method).__name__


def required_names(model: Any) -> dict[str, str]:
    """Parameters and persistent buffers a checkpoint must fill: name -> "parameter" or "buffer"."""
    required: dict[str, str] = {}
    named_modules = getattr(model, "named_modules", None)
    if named_modules is None:
        return required
    for module_name, module in named_modules():
        prefix = f"{module_name}." if module_name else ""
        quant_exempt = _quantization_exempt(module)
        for name, param in module.named_parameters(recurse=False):
            if param is None or param.numel() == 0 or quant_exempt or name in CONFIG_BUILT_PARAMS:
                continue
            required.setdefault(prefix + name, "parameter")
        non_persistent = getattr(module, "_non_persistent_buffers_set", set())
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is None or name in non_persistent or buffer.numel() == 0:
                continue
            if KV_SCALE_BUFFER.search(name) or quant_exempt:
                continue
            required.setdefault(prefix + name, "buffer")
    # A tied parameter is required once, under the name named_parameters() gives it.
    canonical = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    return {name: kind for name, kind in required.items() if name in canonical}


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
    required = required_names(model)
    exempt = sorted(name for name in required if filled_by_engine(name))
    missing = sorted(name for name in required if name not in loaded.names and name not in exempt)
    result = Completeness(True, len(required), missing, exempt)
    if missing:
        shown = ", ".join(missing[:NAMES_SHOWN])
        more = f" (and {len(missing) - NAMES_SHOWN} more)" if len(missing) > NAMES_SHOWN else ""
        kinds = {required[name] for name in missing}
        what = "parameters and buffers" if len(kinds) > 1 else f"{kinds.pop()}s"
        message = (
            f"{role} model incomplete: {len(missing)} of {len(required)} {what} it keeps were not written "
            f"from the checkpoint: {shown}{more}"
        )
        if policy == "fail":
            raise IncompleteModel(message + " (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)")
        on_warning(message)
    return result


def engine_fills(engine: EngineView) -> Callable[[str], bool]:
    """The parameters the engine writes after this load: none for a target; a draft's shared embedding and head."""
    if not engine.is_draft:
        return lambda name: False
    row = mtp_table.match(engine.architectures, engine.model_type, engine.speculative_method)
    return mtp_table.filled_by_engine(row, shares_target_weights=engine.shares_target_weights)


__all__ = ["Completeness", "LoadedNames", "capture_loaded", "check", "engine_fills", "required_names"]
