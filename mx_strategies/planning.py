"""The load plan: the one place that decides what a load streams.

Given an inspected checkpoint and what the engine is loading (a target, an
MTP draft, another kind of draft), :func:`plan_for` fixes, before the model
is touched, the shards in load order and the exact tensor names each must
deliver. :func:`plan_load` adds the source chain in front of it. The
strategy streams what the plan says and ``doctor`` shows it, so the two
cannot disagree about which shards load or which tensors a draft takes.

Rules, each decided here only:

- shards load in natural order (``checkpoint.shards``), empty ones left
  out unless ``MX_ROBUST_SKIP_EMPTY_SHARDS=false``;
- a checkpoint with errors (bad header, index mismatch) is not loaded;
- a target loads every tensor of every loadable shard;
- an MTP draft on the target's checkpoint loads its own tensors
  (:mod:`.draft`), only from the shards that hold them;
- a draft with a checkpoint of its own loads it whole; it is never fed
  the target's checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .checkpoint import Checkpoint, Shard
from .draft import layer_layout, select_draft_tensors
from .engine import EngineView
from .errors import DraftPlanError, InconsistentCheckpoint
from .settings import RobustSettings
from .sources import Candidate, Resolution, resolve
from .storage import normalize_uri

PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class LoadPlan:
    """What one load streams: shards in order and the names each delivers."""

    source: str
    shards: tuple[Shard, ...]
    names: Optional[frozenset[str]]  # None: every tensor of those shards
    role: str = "target"
    convention: Optional[str] = None  # the draft naming convention that matched
    shared: frozenset[str] = field(default_factory=frozenset)  # weights a draft streams that the target also has

    @property
    def expected(self) -> list[str]:
        return [n for s in self.shards for n in s.tensors if self.names is None or n in self.names]

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for n, t in s.tensors.items() if self.names is None or n in self.names)

    @property
    def uris(self) -> list[str]:
        return [s.uri for s in self.shards]

    @property
    def shard_keys(self) -> list[str]:
        return [s.key for s in self.shards]


def loaded_shards(checkpoint: Checkpoint, settings: RobustSettings) -> list[Shard]:
    """The shards a full load streams, in load order."""
    return [s for s in checkpoint.shards if s.readable and (s.tensors or not settings.skip_empty_shards)]


def describe_errors(checkpoint: Checkpoint) -> str:
    errors = checkpoint.errors
    shown = "; ".join(p.message for p in errors[:PROBLEMS_SHOWN])
    more = f" (and {len(errors) - PROBLEMS_SHOWN} more)" if len(errors) > PROBLEMS_SHOWN else ""
    return f"checkpoint {checkpoint.uri} is inconsistent, not loading it: {shown}{more}"


def plan_for(
    checkpoint: Checkpoint,
    engine: EngineView,
    settings: RobustSettings,
    *,
    source_is_target: bool,
) -> LoadPlan:
    """What to stream from ``checkpoint`` for this engine load.

    ``source_is_target``: the checkpoint is the target's (an MTP draft takes
    its own tensors out of it; any other draft must not be fed it).
    Raises InconsistentCheckpoint or DraftPlanError, both before the model
    is touched.
    """
    if checkpoint.errors:
        raise InconsistentCheckpoint(describe_errors(checkpoint))
    full = LoadPlan(checkpoint.uri, tuple(loaded_shards(checkpoint, settings)), None, role=engine.role)
    if not engine.is_draft or not source_is_target:
        return full  # a target, or a draft with its own checkpoint: all of it
    if not (engine.is_mtp or engine.speculative_method is None):
        # EAGLE and separate draft models have weights of their own.
        raise DraftPlanError(
            f"draft (method {engine.speculative_method}) has a checkpoint of its own, but only the "
            f"target's checkpoint {checkpoint.uri} holds weights; not feeding it the target's tensors"
        )
    layout = layer_layout(checkpoint.config, engine.hf_config)
    try:
        selection = select_draft_tensors(
            set(checkpoint.tensors()),
            settings,
            layout,
            share_with_target=engine.shares_target_weights,
        )
    except DraftPlanError as exc:
        raise DraftPlanError(f"draft load from {checkpoint.uri}: {exc}") from None
    names = frozenset(selection.names)
    shards = tuple(s for s in checkpoint.loadable_shards if any(n in names for n in s.tensors))
    return LoadPlan(
        checkpoint.uri,
        shards,
        names,
        role="draft",
        convention=selection.convention,
        shared=frozenset(selection.shared),
    )


def is_target_source(candidate: Candidate, engine: EngineView, settings: RobustSettings) -> bool:
    """Whether ``candidate`` is the target's checkpoint (MX_MODEL_URI or one of the target's sources)."""
    shared = {normalize_uri(u) for u in engine.target_uris}
    if settings.model_uri:
        shared.add(normalize_uri(settings.model_uri))
    return normalize_uri(candidate.uri) in shared


def plan_load(
    cands: list[Candidate], engine: EngineView, settings: RobustSettings
) -> tuple[Resolution, LoadPlan]:
    """Walk the source chain, then plan the load from the chosen source.

    Raises NoStreamableSource, InconsistentCheckpoint or DraftPlanError
    (all ``mutated=False``).
    """
    resolution = resolve(cands, settings)
    plan = plan_for(
        resolution.checkpoint,
        engine,
        settings,
        source_is_target=is_target_source(resolution.candidate, engine, settings),
    )
    return resolution, plan


__all__ = ["LoadPlan", "describe_errors", "is_target_source", "loaded_shards", "plan_for", "plan_load"]
