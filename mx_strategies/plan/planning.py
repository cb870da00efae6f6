"""The load plan: what streams, and nothing about why.

A :class:`LoadPlan` is the source, the shards in load order and the names
each delivers; bytes and the expected names are derived from them. Which
names, and why the others are left out, is the selection's to say
(:mod:`..select.selection`); :func:`plan_of` only places names on the
checkpoint's shards: natural order (``checkpoint.shards``), empty shards
left out unless ``MX_ROBUST_SKIP_EMPTY_SHARDS=false``, and only the shards
that hold a name. Every narrower plan (the read-ahead's head and rest) is
:meth:`LoadPlan.narrowed`; a load of one rank, or of one rank among many, is
a :class:`PlannedLoad`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from ..inspect.checkpoint import Checkpoint, Shard, loaded_shards, shards_holding
from ..inspect.sources import Resolution
from ..select.selection import Selection
from ..settings import RobustSettings

if TYPE_CHECKING:
    from .distributed import RankShares


@dataclass(frozen=True)
class LoadPlan:
    """What one load streams: shards in order, and the names they deliver."""

    source: str
    shards: tuple[Shard, ...]
    names: Optional[frozenset[str]]  # None: every tensor of those shards

    def _holds(self, name: str) -> bool:
        return self.names is None or name in self.names

    @property
    def expected(self) -> list[str]:
        return [n for s in self.shards for n in s.tensors if self._holds(n)]

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for n, t in s.tensors.items() if self._holds(n))

    @property
    def uris(self) -> list[str]:
        return [s.uri for s in self.shards]

    @property
    def shard_keys(self) -> list[str]:
        return [s.key for s in self.shards]

    def narrowed(self, names: Iterable[str]) -> "LoadPlan":
        """This plan less every name not in ``names``, from the shards that still hold one."""
        keep = frozenset(names)
        kept = frozenset(n for n in self.expected if n in keep)
        return LoadPlan(self.source, tuple(shards_holding(self.shards, kept)), kept)


def plan_of(checkpoint: Checkpoint, names: Optional[Iterable[str]], settings: RobustSettings) -> LoadPlan:
    """``names`` (None: every tensor) placed on ``checkpoint``'s loaded shards, in load order."""
    names = None if names is None else frozenset(names)
    return LoadPlan(checkpoint.uri, tuple(loaded_shards(checkpoint, settings, names)), names)


@dataclass(frozen=True)
class PlannedLoad:
    """One rank's load before it streams: the source chosen, the selection, its plan, and in a distributed
    load every rank's share and what this rank streams for its host (``carrier``; None: its own plan)."""

    resolution: Resolution
    selection: Selection
    plan: LoadPlan
    shares: "Optional[RankShares]" = None
    carrier: Optional[LoadPlan] = None

    @classmethod
    def of(
        cls, resolution: Resolution, selection: Selection, settings: RobustSettings, shares: "Optional[RankShares]" = None
    ) -> "PlannedLoad":
        """The plan of ``selection``; where this host's ranks read different shares (:mod:`.distributed`), every
        rank of the host streams their union once (the carrier) and feeds its model its own plan."""
        checkpoint = resolution.checkpoint
        carrier = plan_of(checkpoint, shares.carried, settings) if shares is not None and shares.shares_differ else None
        return cls(resolution, selection, plan_of(checkpoint, selection.names, settings), shares, carrier)
