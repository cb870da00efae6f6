"""vLLM's layerwise reload, read on a refit: which layers took the new revision, which wait, which would mix.

A refit (ModelExpress 0.8's ``reload_model``) enters vLLM's layerwise reload
(``model_loader/reload/layerwise.py``): each layer's parameters go back to the
meta device, what its weight loaders receive is buffered, and once a layer has
received every element (``load_numel >= load_numel_total``) it is materialised,
processed and copied into the layer's live tensors. A layer that received
nothing gets its live tensors back when the reload ends; a layer that received
part of its elements would be processed from that part and zeros. vLLM keeps no
copy to restore: its live tensors are the only copy of the old revision, and a
processed layer's are overwritten.

So robust reads the record vLLM keeps per layer (``LAYERWISE_INFO``): after the
stream, every layer that keeps a weight must be processed or whole; on a failed
refit, a layer that received part of its elements is given back its live
tensors (its buffered part dropped), so each layer holds one revision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import listed


def _records(model: Any) -> dict[str, tuple[Any, Any]]:
    """Each module of ``model`` with vLLM's reload record, by name: (module, record); empty where vLLM has no
    layerwise reload."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return {}
    return {name: (module, LAYERWISE_INFO[module]) for name, module in model.named_modules() if module in LAYERWISE_INFO}


def built_tensors(model: Any) -> dict[int, tuple[dict, dict]]:
    """For each module of ``model`` (by ``id``) that vLLM's reload record covers: its parameters and buffers as vLLM
    built it (checkpoint format, on meta: the record's), not as post-load processing left them (repacked experts,
    MLA's derived ``W_UV``). What a refit's question and check must see (:func:`..select.twin.as_built`); empty
    where vLLM keeps no such record."""
    records = _records(model)
    if not records:
        return {}
    from vllm.model_executor.model_loader.reload.meta import SKIP_TENSORS

    built = {}
    for module, info in records.values():
        if not (info.restore_metadata[0] or info.restore_metadata[1]):
            continue
        (params, buffers), own = info.restore_metadata, module._non_persistent_buffers_set
        kept = {n: t for n, t in module._parameters.items() if t is not None and n in SKIP_TENSORS}
        live = {n: t for n, t in module._buffers.items() if t is not None and (n in SKIP_TENSORS or n in own)}
        built[id(module)] = ({**kept, **{n: _bound(t, module) for n, t in params.items()}},
                             {**{n: _bound(t, module) for n, t in buffers.items()}, **live})  # fmt: skip
    return built


def _bound(meta: Any, module: Any) -> Any:
    """A new meta tensor like vLLM's recorded ``meta``, its loaders bound to ``module`` again (vLLM keeps them bound
    to a placeholder, ``layer_ref_sentinel``); the record itself is left as it is."""
    from types import MethodType

    from vllm.model_executor.model_loader.reload.sanitize import layer_ref_sentinel

    tensor = meta.data.to("meta")
    tensor.__class__ = meta.__class__
    tensor.__dict__ = {k: (v.__func__.__get__(module) if isinstance(v, MethodType) and v.__self__ is layer_ref_sentinel
                           else v) for k, v in meta.__dict__.items()}  # fmt: skip
    return tensor


@dataclass(frozen=True)
class LayerStates:
    """Where each layer of a refit stands, as vLLM's record says."""

    new: tuple[str, ...]  # processed from the new revision (or whole, waiting only for the reload's end)
    old: tuple[str, ...]  # received nothing: vLLM puts the live (old) tensors back
    partial: tuple[tuple[str, int, int], ...]  # (layer, elements received, elements it holds)

    def describe(self) -> str:
        parts = [f"{len(self.new)} layer(s) hold the new revision"]
        if self.old:
            parts.append(f"{len(self.old)} the previous one ({listed(list(self.old), 4)})")
        if self.partial:
            parts.append(f"{len(self.partial)} received part of theirs ({listed([n for n, _, _ in self.partial], 4)})")
        return ", ".join(parts)


@dataclass(frozen=True)
class ReloadLayers:
    """The layers a refit's layerwise reload waits to fill (entered, with elements to load), read when it begins."""

    model: Any
    names: frozenset[str]
    built: Any  # the model's twin as vLLM built it (:func:`..select.twin.as_built`): what the model keeps, judged after the stream

    @classmethod
    def of(cls, model: Any, built: Any) -> "ReloadLayers":
        waiting = frozenset(n for n, (_, info) in _records(model).items() if info.can_load() and info.load_numel_total)
        return cls(model, waiting, built)

    def states(self, keeps: Callable[[str], bool] = lambda name: True) -> LayerStates:
        """Where each layer stands now. ``keeps(name)``, asked of each parameter's and buffer's full name: whether the
        load must fill it; a layer with none of those (the engine fills it, another rank holds it) is left out."""
        records = _records(self.model)
        new, old, partial = [], [], []
        for name in sorted(self.names):
            module, info = records.get(name, (None, None))
            if info is None or not info.can_load() or info.load_numel >= info.load_numel_total:
                new.append(name)
            elif not any(keeps(f"{name}.{t}" if name else t) for t in _tensor_names(module)):
                continue
            elif info.load_numel <= 0:
                old.append(name)
            else:
                partial.append((name, info.load_numel, info.load_numel_total))
        return LayerStates(tuple(new), tuple(old), tuple(partial))

    def give_back_partial(self) -> None:
        """Drop what the layers that received part of their elements buffered, so vLLM's reload, when it ends,
        puts their live tensors back rather than processing them from a part and zeros."""
        records = _records(self.model)
        for name in self.names:
            _, info = records.get(name, (None, None))
            if info is not None and info.can_load() and 0 < info.load_numel < info.load_numel_total:
                info.loaded_weights.clear()
                info.load_numel = 0


def _tensor_names(module: Any) -> list[str]:
    return [n for n, t in {**module._parameters, **module._buffers}.items() if t is not None]
