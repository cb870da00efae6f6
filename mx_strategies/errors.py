"""Every error mx-strategies raises, under one root that knows whether the model was touched.

ModelExpress's chain needs one fact from a failed strategy: was the model
already written to (``StrategyFailed(mutated=True)``: rebuild it before the
next strategy) or not (``mutated=False``: try the next one on the same
module). Each error here carries that fact, decided where the error is
raised, so the strategy converts it without guessing:

- configuration, source and checkpoint errors happen before a load starts:
  never mutated;
- stream errors carry the fact as the stream saw it: a stream that had not
  handed a tensor to the model when it broke left the model as it was.
"""

from __future__ import annotations

from typing import Optional, Sequence


def listed(items: Sequence[str], shown: int, separator: str = ", ") -> str:
    """The first ``shown`` of ``items``, then `` (and N more)``: how every error names a long list."""
    more = f" (and {len(items) - shown} more)" if len(items) > shown else ""
    return separator.join(items[:shown]) + more


class MxStrategiesError(Exception):
    """Root of the package's errors. ``mutated``: whether the model had been written to; ``remedy``: what the
    operator can do about it, one line (the refusal's hint line), None where the message says it already."""

    mutated: bool = False
    remedy: Optional[str] = None

    def __init__(self, message: str, *, mutated: Optional[bool] = None, remedy: Optional[str] = None) -> None:
        super().__init__(message)
        if mutated is not None:
            self.mutated = mutated
        if remedy is not None:
            self.remedy = remedy


# -- configuration (activation time) -------------------------------------------


class ConfigurationError(MxStrategiesError, ValueError):
    """A setting or ``MX_STRATEGY`` has a value the strategies cannot use; the message names it."""

    remedy = "correct or unset the variable the message names (docs/settings.md lists each with its values)"


class ActivationError(ConfigurationError):
    """``MX_STRATEGY`` names nothing usable; the message names the value."""


# -- sources and checkpoints (before the model is touched) ---------------------


class StoreError(MxStrategiesError):
    """A storage location could not be listed or read; the message names it. An object store's access error
    also names, on the same line, the variables its client read, those set, what to set next and the section
    of docs/troubleshooting.md about that store (:func:`mx_strategies.inspect.access_hints.access_error`)."""


class NoCheckpoint(MxStrategiesError):
    """A source holds no loadable safetensors shard; the message says what it holds."""


class NoStreamableSource(MxStrategiesError):
    """Every candidate source was rejected; the message lists each and why (``rejected``)."""

    def __init__(self, message: str, rejected: Sequence[object] = (), remedy: Optional[str] = None) -> None:
        super().__init__(message, remedy=remedy)
        self.rejected = list(rejected)


class InconsistentCheckpoint(MxStrategiesError):
    """The chosen checkpoint has errors (bad header, index mismatch); the message lists them."""


class DraftPlanError(MxStrategiesError):
    """What a draft should load cannot be decided from this source (no draft tensor, a foreign checkpoint)."""

    remedy = ("run mx-strategies doctor on the checkpoint to see what the draft would stream; a draft with weights "
              "of its own needs its own checkpoint in the speculative config")


class RanksDisagree(MxStrategiesError):
    """A rank could not plan or take part in a distributed load; no rank starts it."""

    remedy = "give every rank the same checkpoint and settings; the failing rank's own line says what it met"


# -- streaming ----------------------------------------------------------------


class StreamStartError(MxStrategiesError):
    """The streamer failed before the first tensor reached the model."""


class StreamBroken(MxStrategiesError):
    """The streamer failed part-way; the message names the source and unfinished files."""


class ContentMismatch(MxStrategiesError):
    """A delivered tensor differs from the plan or the stored bytes (or could not be compared)."""


class IncompleteDelivery(MxStrategiesError):
    """A load delivered fewer, more or other tensors than its plan."""

    mutated = True


class IncompleteModel(MxStrategiesError):
    """Parameters the model keeps were not written from the checkpoint."""

    mutated = True


class PartialParameters(MxStrategiesError):
    """The checkpoint fills a parameter only in part (a stacked or fused one lacks a member): refused before
    a byte streams, so never mutated."""

    remedy = "re-export the checkpoint with every member of the parameters named (each shard of a stacked one)"


__all__ = [
    "ActivationError",
    "ConfigurationError",
    "ContentMismatch",
    "DraftPlanError",
    "IncompleteDelivery",
    "IncompleteModel",
    "InconsistentCheckpoint",
    "MxStrategiesError",
    "NoCheckpoint",
    "NoStreamableSource",
    "PartialParameters",
    "RanksDisagree",
    "StoreError",
    "StreamBroken",
    "StreamStartError",
]
