"""What a rank checks of the files another rank inspected: that it can read them, unchanged, itself.

Rank 0 alone probes the source; every other rank streams the same files through its own credentials, mounts
and network path. Before the ranks agree on a plan, each re-lists the shards it will stream and compares their
identities with rank 0's inspection, so a rank that cannot take part says so before any rank loads.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..errors import listed
from ..inspect.checkpoint import Shard
from ..inspect.object_stores import source_changes
from ..settings import RobustSettings


def unreachable(uri: str, shards: Sequence[Shard], settings: RobustSettings) -> Optional[str]:
    """Why this process cannot stream ``shards`` of the checkpoint at ``uri`` as they were inspected; None: it
    can. A file it cannot read, or one changed since."""
    if not shards:
        return None
    changed, unknown = source_changes(uri, shards, settings)
    problems = [f"changed since rank 0 inspected it: {c}" for c in changed] + [f"cannot read: {u}" for u in unknown]
    return listed(problems, 3, "; ") if problems else None
