"""A refit: a live model reloads a new revision in place (ModelExpress 0.8's ``reload_model``, ``ctx.is_reload``).

What robust promises there (docs/refit.md): whatever can refuse runs before the
live model is touched (the revision's source, listing, index, headers, the
selection, and the tensors robust's last load of this model streamed, found
again), so a broken revision leaves the model wholly on the previous one; a
failure once layers began changing gives each layer back whole, old or new
(:meth:`.engine.layerwise.ReloadLayers.give_back_partial`), and says which is which.

Either way the chain stops (:class:`RefitFailed`): ModelExpress's chain never
rebuilds a model on a reload, and each later link either cannot read the
revision robust read or refits without robust's checks (measured: a revision
missing a shard served half refitted, reported as a success).
"""

from __future__ import annotations

from typing import Any, Iterable
from weakref import WeakKeyDictionary

from modelexpress.adapter import StrategyRecoveryError

from .engine.layerwise import LayerStates
from .errors import listed

# What robust last loaded into each live model (its plan's tensor names), by model: what a refit must find again.
_LOADED: "WeakKeyDictionary[Any, frozenset[str]]" = WeakKeyDictionary()
_UNTOUCHED = "the live model keeps every weight of the previous revision"


class RefitFailed(StrategyRecoveryError):
    """A refit robust gave up; the chain stops. ``mutated``: whether a layer of the live model changed."""

    def __init__(self, message: str, *, mutated: bool) -> None:
        super().__init__(message)
        self.mutated = mutated

    @classmethod
    def refused(cls, role: str, source: str, why: object) -> "RefitFailed":
        """A refit refused before the live model was touched."""
        return cls(f"{role} refit to {source} refused before the live model was touched ({_UNTOUCHED}): {why}",
                   mutated=False)  # fmt: skip

    @classmethod
    def broken(cls, role: str, source: str, why: object, states: LayerStates) -> "RefitFailed":
        """A refit that failed once the stream reached the model: which layers hold which revision (``states``, read
        after the layers that received part of theirs were given back their live tensors)."""
        if not states.new:
            return cls(f"{role} refit to {source} failed before a layer changed ({_UNTOUCHED}): {why}", mutated=False)
        return cls(f"{role} refit to {source} failed after the live model began changing: {states.describe()}; each "
                   f"layer holds one revision whole, the model mixes the two until a refit succeeds: {why}",
                   mutated=True)  # fmt: skip


def remember(model: Any, names: Iterable[str]) -> None:
    """Note the tensors a load of ``model`` streamed, once it succeeded."""
    try:
        _LOADED[model] = frozenset(names)
    except TypeError:  # a model that cannot be weakly referenced: nothing to compare a refit with
        pass


def lacking(model: Any, names: Iterable[str]) -> str:
    """Why a refit's plan (``names``) cannot be whole: the tensors robust's last load of ``model`` streamed that the
    new revision does not hold (a shard missing without an index, a tensor dropped); "" when none, or when robust
    did not load this model before (then the check after the stream judges it, with the model changing)."""
    before = _LOADED.get(model) if model is not None else None
    missing = sorted(before - set(names)) if before else []
    if not missing:
        return ""
    return (f"the new revision lacks {len(missing)} of the {len(before)} tensors the live model loaded from the "
            f"previous one: {listed(missing, 5)}")  # fmt: skip
