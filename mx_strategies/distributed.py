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
"""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from .errors import MxStrategiesError, RanksDisagree

Plan = TypeVar("Plan")

PLANNED = "planned"
FAILED = "failed"


def agreed_plan(
    adapter: Any,
    rank: int,
    plan: Callable[[], Plan],
    check: Optional[Callable[[Plan], Optional[str]]] = None,
) -> Plan:
    """Rank 0's ``plan()``, shared with every rank, once every rank accepted it.

    ``check(plan)`` runs on every rank and returns why this rank cannot
    stream the plan (None when it can). Raises RanksDisagree (an
    MxStrategiesError, ``mutated=False``) on every rank when rank 0 could
    not plan or any rank refused.
    """
    mine: Optional[tuple[str, Any]] = None
    if rank == 0:
        try:
            mine = (PLANNED, plan())
        except MxStrategiesError as exc:
            mine = (FAILED, str(exc))
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
    if kind == FAILED:
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
    refused = [(r, why) for r, why in verdicts if why]
    if refused:
        detail = "; ".join(f"rank {r}: {why}" for r, why in sorted(refused))
        raise RanksDisagree(f"{len(refused)} of {len(verdicts)} ranks cannot stream rank 0's plan, so none does: {detail}")
    return payload


def sees_same_files(settings) -> Callable[[tuple], Optional[str]]:
    """The per-rank check: this rank reaches every planned shard, and each is the file rank 0 inspected."""
    from .streaming import source_changes

    def check(planned: tuple) -> Optional[str]:
        _, plan = planned
        changed, unknown = source_changes(plan.source, list(plan.shards), settings)
        problems = [f"changed since rank 0 inspected it: {c}" for c in changed]
        problems += [f"cannot read: {u}" for u in unknown]
        if not problems:
            return None
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return "; ".join(problems[:3]) + more

    return check


__all__ = ["RanksDisagree", "agreed_plan", "sees_same_files"]
