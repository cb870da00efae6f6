"""What a model keeps that a load must write, and the entry before streaming: would the names planned fill it?

Its parameters and persistent buffers, less what no checkpoint carries and
what the engine writes itself after loading. Asked before a byte streams, of
the module or of its twin (:mod:`..select.twin`: the same names, shapes and
strides), by the module question (:mod:`..select.module_reads`), through
:func:`before_streaming`: every element of each judged parameter must be
filled by the names planned (:mod:`.coverage`); and after streaming by the
checks of what was written (:mod:`.after`). One place decides what counts,
for both.

Exempt, as vLLM's own check makes them for a quantized model
(``default_loader.py:528``): empty placeholders, KV-cache scales (defaults
when a checkpoint has none), online-quantization and config-built
parameters. A tensor registered under several names is one entry with every
name (:class:`Required`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from .coverage import Gap, Layout, Write, gaps

GAPS_SHOWN = 3  # parameters an error or a warning names, of those a load would leave in part
# KV-cache quantization scales registered by attention layers: defaults when a checkpoint has none.
_KV_SCALE_BUFFER = re.compile(r"(^|\.)_?(k|v|q|prob)_scale(_float)?$")
# Parameters a quantization config builds rather than a checkpoint
# (vllm/model_executor/model_loader/default_loader.py:52, _CONFIG_BUILT_PARAMS).
_CONFIG_BUILT_PARAMS = ("input_scale_ub",)


def _quantization_exempt(module: Any) -> bool:
    """Parameters vLLM's own check lets a quantized model miss: online and KV-cache quantization."""
    method = getattr(module, "quant_method", None)
    if method is None:
        return False
    return bool(getattr(method, "uses_meta_device", False)) or "KVCache" in type(method).__name__


@dataclass
class Required:
    """One tensor a checkpoint must fill, under every name the module tree registers it."""

    name: str  # the name named_parameters()/named_buffers() gives it (the first it meets)
    kind: str  # "parameter" or "buffer"
    aliases: tuple[str, ...]  # every name, ``name`` first
    storage: tuple[int, int, int]  # (storage pointer, first byte, end byte); (0, 0, 0) when unknown (meta)


def _storage_span(tensor: Any) -> tuple[int, int, int]:
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return (0, 0, 0)
    if not pointer:
        return (0, 0, 0)
    start = tensor.storage_offset() * tensor.element_size()
    extent = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())) + 1
    return (pointer, start, start + extent * tensor.element_size())


def required_tensors(model: Any) -> list[Required]:
    """Parameters and persistent buffers a checkpoint must fill, one entry per tensor.

    A tensor registered under several names (a module held by two parents, as
    vLLM's Transformers backend holds a MoE block's ``gate`` both as
    ``mlp.gate`` and ``mlp.experts.gate``; tied embeddings; one buffer
    registered twice) is one entry with every name in ``aliases``: it was
    written when any of them was reported loaded (:func:`.after.check`).
    """
    named_modules = getattr(model, "named_modules", None)
    if named_modules is None:
        return []
    by_tensor: dict[int, dict] = {}
    for module_name, module in named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        quant_exempt = _quantization_exempt(module)
        non_persistent = getattr(module, "_non_persistent_buffers_set", set())
        members = [(n, t, "parameter") for n, t in module._parameters.items()]
        members += [(n, t, "buffer") for n, t in module._buffers.items() if n not in non_persistent]
        for name, tensor, kind in members:
            if tensor is None:
                continue
            entry = by_tensor.setdefault(id(tensor), {"tensor": tensor, "kind": kind, "aliases": [], "exempt": False})
            entry["aliases"].append(prefix + name)
            if tensor.numel() == 0 or quant_exempt or name in _CONFIG_BUILT_PARAMS:
                entry["exempt"] = True
            if kind == "buffer" and _KV_SCALE_BUFFER.search(name):
                entry["exempt"] = True
    # The name torch's own iterators give a shared tensor: the one vLLM's default loader and users see.
    canonical = {id(t): n for n, t in model.named_parameters()} | {id(t): n for n, t in model.named_buffers()}
    required = []
    for key, entry in by_tensor.items():
        if entry["exempt"] or key not in canonical:
            continue
        first = canonical[key]
        aliases = (first, *sorted(set(entry["aliases"]) - {first}))
        required.append(Required(first, entry["kind"], aliases, _storage_span(entry["tensor"])))
    return sorted(required, key=lambda r: r.name)


def judged_parameters(model: Any, filled_by_engine: Callable[[str], bool]) -> dict[str, Layout]:
    """The parameters whose every element a load must write from the checkpoint, with their layouts.

    The model's parameters less what no checkpoint carries (:func:`required_tensors`) and what the engine
    fills afterwards (``filled_by_engine``, :attr:`..select.built_module.BuiltModule.filled_by_engine`). Asked of the
    model or of its twin (:mod:`..select.twin`): both have the same names, shapes and strides.
    """
    named = dict(model.named_parameters(remove_duplicate=False))
    judged = {}
    for required in required_tensors(model):
        if required.kind != "parameter" or any(filled_by_engine(alias) for alias in required.aliases):
            continue
        tensor = named.get(required.name)
        if tensor is not None:
            judged[required.name] = Layout(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())
    return judged


def _required_names(model: Any) -> dict[str, str]:
    """Each required tensor's name (as named_parameters()/named_buffers() give it) -> "parameter" or "buffer"."""
    return {r.name: r.kind for r in required_tensors(model)}


def before_streaming(model: Any, writes: Iterable[Write], *, layouts: Mapping[str, Layout], replaced: Callable[[str], bool],
                     streamed: Callable[[str], bool], present: Callable[[str], bool],
                     unit: Optional[Callable[[str], Optional[tuple]]] = None) -> tuple[dict[str, Layout], list[Gap]]:  # fmt: skip
    """The check before a byte streams: the parameters ``model`` keeps (:func:`judged_parameters`, less what the engine
    fills afterwards, ``replaced``; laid out as in ``layouts``, the twin's, whose storages the dry run's ``writes``
    were in), and those the writes of the names ``streamed`` would leave in part (:func:`.coverage.gaps`)."""
    judged = {n: layouts.get(n, layout) for n, layout in judged_parameters(model, replaced).items()}
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return judged, gaps(judged, writes, streamed=streamed, present=present, packed=packed, unit=unit)
