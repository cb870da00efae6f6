"""Source resolution: which candidate actually holds the checkpoint.

vLLM points a model at several places at once: ``model_weights`` (the
object-store URI when it pulled a config-only copy), ``model`` (that local
config-only copy, or a snapshot folder), and ModelExpress adds
``MX_MODEL_URI``. For an MTP draft on vLLM <= 0.28, ``model`` is the
config-only cache dir and ``model_weights`` is unset, so the first guess
holds no weights (the "Cannot find any safetensors model weights" reports).
We probe each candidate in the configured order, reading listings and
headers only, and keep the first that holds a non-empty shard, with the
trail of why the others were passed over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import INDEX_NAME, Checkpoint, ProbeLimits, inspect
from .errors import NoCheckpoint, NoStreamableSource, StoreError
from .settings import RobustSettings
from .storage import normalize_uri, open_store


@dataclass(frozen=True)
class Candidate:
    label: str  # "model_weights", "model" or "MX_MODEL_URI"
    uri: str


@dataclass(frozen=True)
class Rejection:
    candidate: Candidate
    reason: str

    def __str__(self) -> str:
        return f"{self.candidate.label}={self.candidate.uri!r}: {self.reason}"


@dataclass
class Resolution:
    candidate: Candidate
    checkpoint: Checkpoint
    rejected: list[Rejection] = field(default_factory=list)

    def trail(self) -> str:
        steps = [f"passed over {r}" for r in self.rejected]
        steps.append(f"chose {self.candidate.label}={self.candidate.uri!r}")
        return "; ".join(steps)


def no_source(rejected: list[Rejection]) -> NoStreamableSource:
    """The error for a chain whose every candidate was rejected, listing each and why."""
    detail = "; ".join(str(r) for r in rejected) if rejected else "no candidate was set"
    return NoStreamableSource(f"no candidate source holds streamable safetensors: {detail}", rejected)


def candidates(model_config: object, settings: RobustSettings) -> list[Candidate]:
    """The configured candidates, in order, skipping unset ones and repeats."""
    values = {
        "model_weights": getattr(model_config, "model_weights", None),
        "model": getattr(model_config, "model", None) or getattr(model_config, "model_path", None),
        "MX_MODEL_URI": settings.model_uri,
    }
    seen: set[str] = set()
    result = []
    for label in settings.source_order:
        uri = values.get(label)
        if not uri or not isinstance(uri, str):
            continue
        if normalize_uri(uri) in seen:
            continue
        seen.add(normalize_uri(uri))
        result.append(Candidate(label, uri))
    return result


def probe(candidate: Candidate, settings: RobustSettings) -> Checkpoint:
    """Inspect one candidate; raise NoCheckpoint/StoreError when it is no source."""
    store = open_store(
        candidate.uri,
        timeout_s=settings.probe_timeout_s,
        max_attempts=settings.probe_max_attempts,
        max_entries=settings.max_discovery_entries,
    )
    checkpoint = inspect(store, settings.discovery_depth, ProbeLimits.from_settings(settings))
    if not checkpoint.loadable_shards and not checkpoint.errors:
        # An index never names an empty shard, so count them from the problems, not checkpoint.shards.
        empty = sum(1 for p in checkpoint.problems if p.kind == "empty_shard")
        unindexed = sum(1 for p in checkpoint.problems if p.kind == "unindexed_shard")
        if unindexed:
            raise NoCheckpoint(f"no shard to load: {empty} empty, {unindexed} not named by {INDEX_NAME}")
        raise NoCheckpoint(f"all {empty} safetensors shard(s) are empty")
    return checkpoint


def resolve(cands: list[Candidate], settings: RobustSettings) -> Resolution:
    """The first candidate holding a non-empty shard.

    A candidate whose checkpoint is broken (bad header, index mismatch) is
    still chosen: falling through to another copy would hide the damage. The
    caller fails the load on ``checkpoint.errors``.
    """
    rejected: list[Rejection] = []
    for candidate in cands:
        try:
            checkpoint = probe(candidate, settings)
        except (NoCheckpoint, StoreError) as exc:
            rejected.append(Rejection(candidate, str(exc)))
            continue
        return Resolution(candidate, checkpoint, rejected)
    raise no_source(rejected)

