"""Streaming with runai-model-streamer, and verification of what arrived.

The plan is fixed before the model is touched: the non-empty shards in
natural order, and the exact tensor names each must deliver. runai's
``SafetensorsStreamer`` then streams exactly those (``tensor_names`` when a
subset is wanted), tensors owned by the caller so nothing is copied twice.
A :class:`DeliveryLedger` checks every name off; a shortfall, a duplicate
or a stranger fails the load instead of serving a model with a weight
missing (vLLM #38991: 335 of 447 tensors silently dropped).
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from .checkpoint import Checkpoint, Shard
from .settings import RobustSettings

# Our settings -> the runai variables they set for the duration of a load.
STREAMER_ENV = {
    "streamer_concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "streamer_memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT",
    "streamer_chunk_bytesize": "RUNAI_STREAMER_CHUNK_BYTESIZE",
}
MISSING_NAMES_SHOWN = 10


class IncompleteDelivery(RuntimeError):
    """A load delivered fewer, more or other tensors than its plan."""


class StreamStartError(RuntimeError):
    """The streamer failed before the first tensor reached the model."""


@dataclass(frozen=True)
class LoadPlan:
    """What one load streams: shards in order and the names each delivers."""

    source: str
    shards: tuple[Shard, ...]
    names: Optional[frozenset[str]]  # None: every tensor of those shards

    @property
    def expected(self) -> list[str]:
        return [n for s in self.shards for n in s.tensors if self.names is None or n in self.names]

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for n, t in s.tensors.items() if self.names is None or n in self.names)

    @property
    def uris(self) -> list[str]:
        return [s.uri for s in self.shards]


def plan_full(checkpoint: Checkpoint, settings: RobustSettings) -> LoadPlan:
    """Every tensor of every shard; empty shards left out unless configured."""
    shards = [s for s in checkpoint.shards if s.readable and (s.tensors or not settings.skip_empty_shards)]
    return LoadPlan(checkpoint.uri, tuple(shards), None)


def plan_subset(checkpoint: Checkpoint, names: set[str]) -> LoadPlan:
    """Only ``names``, from only the shards that hold them."""
    shards = [s for s in checkpoint.loadable_shards if any(n in names for n in s.tensors)]
    return LoadPlan(checkpoint.uri, tuple(shards), frozenset(names))


class DeliveryLedger:
    """Checks every expected tensor off exactly once."""

    def __init__(self, expected: list[str]) -> None:
        self.expected = expected
        self._expected_set = frozenset(expected)
        self.delivered: Counter[str] = Counter()
        self.strangers: list[str] = []

    def check_in(self, name: str) -> None:
        if name not in self._expected_set:
            self.strangers.append(name)
        self.delivered[name] += 1

    @property
    def missing(self) -> list[str]:
        return [n for n in self.expected if self.delivered[n] == 0]

    @property
    def duplicated(self) -> list[str]:
        return sorted(n for n, c in self.delivered.items() if c > 1)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.duplicated or self.strangers)

    def shortfall(self, source: str) -> str:
        """One message with counts and the first names of each kind."""
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} of {len(self.expected)} expected tensors missing: {_first(self.missing)}")
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} delivered more than once: {_first(self.duplicated)}")
        if self.strangers:
            parts.append(f"{len(self.strangers)} not expected: {_first(self.strangers)}")
        return f"incomplete load from {source}: " + "; ".join(parts)


def _first(names: list[str]) -> str:
    shown = ", ".join(names[:MISSING_NAMES_SHOWN])
    return shown + (", ..." if len(names) > MISSING_NAMES_SHOWN else "")


@contextmanager
def streamer_environment(settings: RobustSettings) -> Iterator[None]:
    """Set the runai knobs we were configured with, restoring them afterwards."""
    saved = {}
    try:
        for field, var in STREAMER_ENV.items():
            value = getattr(settings, field)
            if value is not None:
                saved[var] = os.environ.get(var)
                os.environ[var] = str(value)
        yield
    finally:
        for var, old in saved.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old


class VerifiedStream:
    """A runai streaming session for one plan, owning the streamer.

    Entering starts the stream and fetches the first tensor, so anything that
    fails before the model is touched raises :class:`StreamStartError`.
    ``tensors()`` yields (name, tensor) and, when exhausted, raises
    :class:`IncompleteDelivery` under the ``fail`` policy.
    """

    def __init__(
        self,
        plan: LoadPlan,
        settings: RobustSettings,
        *,
        device: str = "cpu",
        distributed: bool = False,
        on_warning=None,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self.device = device
        self.distributed = distributed
        self.ledger = DeliveryLedger(plan.expected)
        self.bytes_delivered = 0
        self.exhausted = False
        self._settled = False
        self._on_warning = on_warning
        self._env = None
        self._streamer = None
        self._iter = None
        self._first = None

    def __enter__(self) -> "VerifiedStream":
        from runai_model_streamer import SafetensorsStreamer

        self._env = streamer_environment(self.settings)
        self._env.__enter__()
        try:
            self._streamer = SafetensorsStreamer().__enter__()
            if self.plan.shards:
                self._streamer.stream_files(
                    self.plan.uris,
                    device=self.device,
                    is_distributed=self.distributed,
                    tensor_names=self.plan.names,
                    owned=True,
                )
                self._iter = self._streamer.get_tensors()
                self._first = next(self._iter, None)
        except Exception as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise StreamStartError(f"streaming {self.plan.source} did not start: {type(exc).__name__}: {exc}") from exc
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._streamer is not None:
                self._streamer.__exit__(exc_type, exc, tb)
                self._streamer = None
        finally:
            if self._env is not None:
                self._env.__exit__(None, None, None)
                self._env = None

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        pending = self._first
        self._first = None
        while pending is not None:
            name, tensor = pending
            self.ledger.check_in(name)
            self.bytes_delivered += tensor.numel() * tensor.element_size()
            yield name, tensor
            pending = next(self._iter, None) if self._iter is not None else None
        self.exhausted = True
        self.settle()

    def settle(self) -> None:
        """Apply the completeness policy; safe to call more than once."""
        if self._settled:
            return
        self._settled = True
        if self.ledger.complete and self.exhausted:
            return
        message = self.ledger.shortfall(self.plan.source)
        if not self.exhausted:
            message += " (the engine stopped reading before the stream ended)"
        if self.settings.completeness == "fail":
            raise IncompleteDelivery(message)
        if self._on_warning is not None:
            self._on_warning(message)
