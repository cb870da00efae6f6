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

A draft vLLM places in a sub-folder of the target's checkpoint (MiniMax-M3
DSpark: ``<target.model>/dspark``) gets one more candidate when the target
came from an object store: vLLM points the draft at the sub-folder of the
target's config-only local copy, which holds no weights, so the chain also
tries the same sub-folder of the target's ``model_weights``
(``s3://bucket/ckpt/dspark``), right after the draft's own values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .checkpoint import INDEX_NAME, Checkpoint
from ..engine.vllm import is_speculative_draft
from ..errors import NoCheckpoint, NoStreamableSource, StoreError
from ..settings import RobustSettings
from .index import inspect
from .object_stores import open_store
from .remedies import remedy
from .storage import normalize_uri

# The label of the candidate derived from the target's model_weights, e.g. "target model_weights + dspark".
_TARGET_SUBFOLDER_LABEL = "target model_weights + {sub}"


@dataclass(frozen=True)
class Candidate:
    label: str  # "model_weights", "model", "MX_MODEL_URI" or _TARGET_SUBFOLDER_LABEL's "target model_weights + <sub>"
    uri: str


@dataclass(frozen=True)
class Rejection:
    """A candidate source passed over, and why: in the trail, the load report and doctor's chain."""

    candidate: Candidate
    reason: str

    def __str__(self) -> str:
        return f"{self.candidate.label}={self.candidate.uri!r}: {self.reason}"

    def as_dict(self) -> dict:
        return {"label": self.candidate.label, "uri": self.candidate.uri, "reason": self.reason}


@dataclass
class Resolution:
    candidate: Candidate
    checkpoint: Checkpoint
    rejected: list[Rejection] = field(default_factory=list)

    def trail(self) -> str:
        chose = f"chose {self.candidate.label}={self.candidate.uri!r}"
        return "; ".join([*(f"passed over {r}" for r in self.rejected), chose])


def _no_source(rejected: list[Rejection]) -> NoStreamableSource:
    """The error for a chain whose every candidate was rejected, listing each and why."""
    detail = "; ".join(str(r) for r in rejected) if rejected else "no candidate was set"
    return NoStreamableSource(f"no candidate source holds streamable safetensors: {detail}", rejected,
                              remedy("no_streamable_source"))


def engine_model(model_config: object) -> Optional[str]:
    """The engine's own ``model``, what its readers load: vLLM's ``model``, SGLang's ``model_path``."""
    value = getattr(model_config, "model", None) or getattr(model_config, "model_path", None)
    return value if isinstance(value, str) and value else None


def candidates(model_config: object, settings: RobustSettings, vllm_config: Any = None) -> list[Candidate]:
    """The configured candidates, in order, skipping unset ones and repeats.

    With ``vllm_config`` (ModelExpress's ``ctx.adapter.vllm_config``), a draft in a sub-folder of the
    target's ``model`` also gets that sub-folder of the target's ``model_weights``
    (:func:`target_subfolder`), right after the later of the draft's own ``model_weights`` and ``model``.
    """
    values = {
        "model_weights": getattr(model_config, "model_weights", None),
        "model": engine_model(model_config),
        "MX_MODEL_URI": settings.model_uri,
    }
    derived = _target_subfolder(model_config, vllm_config)
    own = [label for label in settings.source_order if label in ("model_weights", "model")]
    result: dict[str, Candidate] = {}  # by location: the first label naming it
    for label in settings.source_order:
        uri = values.get(label)
        if uri and isinstance(uri, str):
            result.setdefault(normalize_uri(uri), Candidate(label, uri))
        if derived is not None and own and label == own[-1]:
            result.setdefault(normalize_uri(derived.uri), derived)
    return list(result.values())


def _target_subfolder(model_config: object, vllm_config: Any) -> Optional[Candidate]:
    """The target's ``model_weights`` joined with the sub-folder of the target's ``model`` the draft lies in.

    vLLM 0.34 defaults a MiniMax-M3 DSpark draft to ``<target.model>/dspark``; with the target on an
    object store ``target.model`` is a config-only local copy and ``target.model_weights`` the URI it
    came from, so the draft's weights are at ``<target.model_weights>/dspark``. None for a target load,
    a draft not strictly below the target's ``model`` (or ``..`` in the sub-path), or a target without
    ``model_weights``.
    """
    if not is_speculative_draft(vllm_config, model_config):
        return None
    target = getattr(getattr(vllm_config, "speculative_config", None), "target_model_config", None)
    base, weights = getattr(target, "model", None), getattr(target, "model_weights", None)
    if not (isinstance(base, str) and base and isinstance(weights, str) and weights):
        return None
    for value in (getattr(model_config, "model_weights", None), getattr(model_config, "model", None)):
        sub = _sub_path(value, base) if isinstance(value, str) and value else None
        if sub is not None:
            return Candidate(_TARGET_SUBFOLDER_LABEL.format(sub=sub), f"{normalize_uri(weights)}/{sub}")
    return None


def _sub_path(path: str, base: str) -> Optional[str]:
    """``path`` relative to ``base`` (both normalized) when strictly below it, with no ``.``/``..`` part."""
    path, base = normalize_uri(path), normalize_uri(base)
    prefix = base.rstrip("/") + "/"
    sub = path[len(prefix) :] if path.startswith(prefix) else ""  # "": not below base
    return None if any(part in ("", ".", "..") for part in sub.split("/")) else sub


def probe(candidate: Candidate, settings: RobustSettings) -> Checkpoint:
    """Inspect one candidate; raise NoCheckpoint/StoreError when it is no source."""
    store = open_store(candidate.uri, timeout_s=settings.probe_timeout_s)
    checkpoint = inspect(store, settings.discovery_depth, settings.max_header_bytes)
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
    raise _no_source(rejected)

