"""Distributed loads: every rank streams the plan rank 0 made, or none does.

With tensor parallel > 1 and ``MX_MS_DISTRIBUTED``, runai splits the reads
between the ranks and shares the bytes over torch.distributed. Its
collectives assume every rank asks for the same files and tensors: ranks
that planned apart (one saw a transient error and chose another source,
or a different listing) hang or mix data. So rank 0 resolves and plans
alone, the plan goes to the others over the engine's process group
(``EngineAdapter.broadcast_state``), and every rank reports whether it can
stream it (``all_gather_state``) before any of them starts. A failure on
any rank fails all of them, ``mutated=False``, naming the rank and cause.

Ranks need not read the same tensors: a pipeline stage reads its layers, an
expert-parallel rank its experts (:mod:`.rank_share`). runai groups the
ranks of one host and requires every rank of the group to ask for the same
tensors (a mismatch hangs, runai #198), and its groups cannot be scoped to
a model-parallel group (runai #165). So each rank plans its own share of
rank 0's checkpoint, the ranks exchange their shares (:func:`agreed_shares`,
a bit per tensor of the checkpoint), and every rank of a host streams the
union of that host's shares: storage serves each host's share once, and each
rank hands its model only its own tensors. Ranks whose shares are equal (plain
tensor parallel) stream exactly their plan, as before.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence, TypeVar

import numpy as np

from ..errors import MxStrategiesError, RanksDisagree
from ..inspect.checkpoint import loaded_shards
from ..inspect.sources import Candidate, Resolution, resolve
from ..select.selection import Selection
from ..settings import RobustSettings
from .rank_checks import unreachable

_Plan = TypeVar("_Plan")

_PLANNED = "planned"
_FAILED = "failed"


def _agreed_plan(
    adapter: Any,
    rank: int,
    plan: Callable[[], _Plan],
    check: Optional[Callable[[_Plan], Optional[str]]] = None,
) -> _Plan:
    """Rank 0's ``plan()``, shared with every rank, once every rank accepted it.

    ``check(plan)`` runs on every rank and returns why this rank cannot
    stream the plan (None when it can). Raises RanksDisagree (an
    MxStrategiesError, ``mutated=False``) on every rank when rank 0 could
    not plan or any rank refused.
    """
    mine: Optional[tuple[str, Any]] = None
    if rank == 0:
        try:
            mine = (_PLANNED, plan())
        except MxStrategiesError as exc:
            mine = (_FAILED, str(exc))
    try:
        shared = adapter.broadcast_state(mine)
    except Exception as exc:  # the process group itself failed: no rank can trust a plan
        raise RanksDisagree(f"rank {rank}: could not receive rank 0's load plan: {type(exc).__name__}: {exc}") from exc
    if shared is None:
        raise RanksDisagree(
            f"rank {rank}: the engine adapter did not share rank 0's load plan "
            f"({type(adapter).__name__}.broadcast_state); not streaming distributed without it"
        )
    kind, payload = shared
    if kind == _FAILED:
        raise RanksDisagree(f"rank 0 could not plan the load, so no rank streams it: {payload}")
    refusal = None
    if check is not None:
        try:
            refusal = check(payload)
        except MxStrategiesError as exc:
            refusal = str(exc)
    try:
        verdicts = adapter.all_gather_state((rank, refusal))
    except Exception as exc:
        raise RanksDisagree(f"rank {rank}: could not gather the ranks' verdicts: {type(exc).__name__}: {exc}") from exc
    if refused := [(r, why) for r, why in verdicts if why]:
        detail = "; ".join(f"rank {r}: {why}" for r, why in sorted(refused))
        raise RanksDisagree(f"{len(refused)} of {len(verdicts)} ranks cannot stream rank 0's plan, so none does: {detail}")
    return payload


def distributes(engine: Any, enabled: bool) -> tuple[bool, str]:
    """Whether this load streams distributed, and why not when it does not.

    With ``MX_MS_DISTRIBUTED`` at tensor parallel > 1, as ModelExpress's
    own strategy. Never for a draft at pipeline parallel > 1: the engine
    builds it on the last stage only (vLLM's ``gpu_model_runner``:
    ``speculative_config and get_pp_group().is_last_rank``), while both the
    plan's exchange (the engine's world group) and runai's host groups need
    every rank: the other stages would never join (runai #165's hang).
    """
    if not enabled:
        return False, "MX_MS_DISTRIBUTED is off"
    if engine.tensor_parallel_size <= 1:
        return False, "tensor parallel 1"
    if engine.is_draft and engine.pipeline_parallel_size > 1:
        return False, (
            f"a draft at pipeline parallel {engine.pipeline_parallel_size} is built on the last stage only, "
            "so the other stages' ranks cannot stream with it; each of its ranks streams its own"
        )
    return True, ""


@dataclass(frozen=True)
class _RankRead:
    """One rank's share of a distributed load, as every rank learns it."""

    rank: int
    host: str
    tensors: int
    bytes: int


@dataclass(frozen=True)
class RankShares:
    """Who reads what: every rank's share, and what this rank's host streams together."""

    rank: int
    own: frozenset[str]  # what this rank's model is fed
    carried: frozenset[str]  # the union of the shares of this rank's host: what runai streams on every rank of it
    host_ranks: tuple[int, ...]
    ranks: tuple[_RankRead, ...]  # every rank, in rank order

    @property
    def shares_differ(self) -> bool:
        """True when this host's ranks need different tensors (the host streams their union)."""
        return self.carried != self.own


def _mask(universe: Sequence[str], names: frozenset[str]) -> bytes:
    """``names`` as one bit per name of ``universe`` (little-endian bit order): 11.5 kB for 92k tensors."""
    return np.packbits(np.fromiter((n in names for n in universe), dtype=bool, count=len(universe)),
                       bitorder="little").tobytes()  # fmt: skip


def _bits(mask: bytes, count: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(mask, dtype=np.uint8), count=count, bitorder="little").astype(bool)


def _agreed_shares(
    adapter: Any,
    rank: int,
    universe: Sequence[str],
    sizes: Sequence[int],
    own: Optional[frozenset[str]],
    refusal: Optional[str] = None,
    host: Optional[str] = None,
) -> RankShares:
    """Every rank's share of the agreed checkpoint, exchanged; raises RanksDisagree on every rank alike.

    ``universe``: the names of the checkpoint's loaded shards, in plan order
    (the same on every rank: rank 0's checkpoint); ``sizes``: their bytes;
    ``own``: the names this rank reads (None when it could not plan, with
    ``refusal`` saying why). Every rank calls this, so a rank that failed
    still takes part and no rank waits for ever. The gathered states are the
    same on every rank, so every rank reaches the same verdict.
    """
    host = host if host is not None else socket.gethostname()  # runai groups the ranks of a host by this name
    digest = hashlib.sha256("\n".join(universe).encode()).hexdigest()
    mine = (rank, host, digest, None if own is None else _mask(universe, own), refusal)
    try:
        states = adapter.all_gather_state(mine)
    except Exception as exc:
        raise RanksDisagree(f"rank {rank}: could not gather the ranks' shares: {type(exc).__name__}: {exc}") from exc
    problems = []
    for r, _, their_digest, mask, why in states:
        if why or mask is None:
            problems.append(f"rank {r}: {why or 'did not plan its share'}")
        elif their_digest != digest:
            problems.append(f"rank {r}: planned against another list of tensors than rank {rank} "
                            f"({their_digest[:12]} != {digest[:12]})")  # fmt: skip
    if problems:
        raise RanksDisagree(
            f"{len(problems)} of {len(states)} ranks cannot take their share of rank 0's plan, so none streams: "
            + "; ".join(sorted(problems))
        )
    weights = np.asarray(sizes, dtype=np.int64)
    bits = {r: _bits(mask, len(universe)) for r, _, _, mask, _ in states}
    reads = tuple(
        _RankRead(r, h, int(bits[r].sum()), int(weights[bits[r]].sum())) for r, h, _, _, _ in sorted(states)
    )
    host_ranks = tuple(r for r, h, _, _, _ in sorted(states) if h == host)
    union = np.zeros(len(universe), dtype=bool)
    for r in host_ranks:
        union |= bits[r]
    carried = frozenset(n for n, keep in zip(universe, union) if keep)
    return RankShares(rank, frozenset(own), carried, host_ranks, reads)


class _AgreedSelection(NamedTuple):
    """What every rank agreed to: rank 0's source, this rank's own selection of it, every rank's share."""

    resolution: Resolution
    selection: Selection
    shares: RankShares


def agreed_selection(
    adapter: Any,
    rank: int,
    cands: list[Candidate],
    module: Any,
    settings: RobustSettings,
    select: Callable[[Resolution, Any, RobustSettings], Selection],
) -> _AgreedSelection:
    """Rank 0 resolves and selects (``select``: :func:`..select.selection.select_resolved`, asking ``module``,
    the :class:`..select.built_module.BuiltModule`); every rank checks
    it reaches the files rank 0's selection streams, selects its own share of rank 0's checkpoint, and the
    ranks exchange their shares. Raises RanksDisagree (``mutated=False``) on every rank alike when any rank
    cannot take part; a rank that cannot select still joins the exchange, so all refuse together, never
    a hang."""

    def decide() -> tuple[Resolution, Selection]:
        resolution = resolve(cands, settings)
        return resolution, select(resolution, module, settings)

    def reaches(decided: tuple[Resolution, Selection]) -> Optional[str]:
        checkpoint = decided[0].checkpoint
        return unreachable(checkpoint.uri, loaded_shards(checkpoint, settings, decided[1].names), settings)

    resolution, selection = _agreed_plan(adapter, rank, decide, reaches)
    checkpoint, refusal = resolution.checkpoint, None
    if rank != 0:  # rank 0's selection is rank 0's share; every other rank selects its own
        checked = {s.key for s in loaded_shards(checkpoint, settings, selection.names)}  # rank 0's, checked already
        try:
            selection = select(resolution, module, settings)
            only_mine = [s for s in loaded_shards(checkpoint, settings, selection.names) if s.key not in checked]
            refusal = unreachable(checkpoint.uri, only_mine, settings)  # the files only it reads
        except MxStrategiesError as exc:
            refusal = str(exc)
    # Every rank's share is a subset of the loaded shards' tensors (in load order; an empty shard holds none).
    universe = list(checkpoint.tensors().values())
    own = None if refusal else frozenset(t.name for t in universe if selection.names is None or t.name in selection.names)
    shares = _agreed_shares(adapter, rank, [t.name for t in universe], [t.nbytes for t in universe], own, refusal)
    return _AgreedSelection(resolution, selection, shares)
