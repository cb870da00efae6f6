"""What a rank checks of the files another rank inspected: that it can read them, unchanged, itself.

Rank 0 alone probes the source; every other rank streams the same files through its own credentials, mounts
and network path. Before the ranks agree on a plan, each re-lists the shards it will stream and compares their
identities with rank 0's inspection, so a rank that cannot take part says so before any rank loads.
"""

from __future__ import annotations

from typing import Collection, Optional

from ..errors import listed
from ..inspect.checkpoint import Checkpoint, loaded_shards
from ..inspect.object_stores import source_changes
from ..settings import RobustSettings


def unreachable(
    checkpoint: Checkpoint, settings: RobustSettings, names: Optional[Collection[str]], *, besides: Collection[str] = ()
) -> Optional[str]:
    """Why this process cannot stream the shards of ``checkpoint`` holding ``names`` (None: every loaded shard)
    as they were inspected, other than the shards in ``besides`` (keys); None: it can. A file it cannot read,
    or one changed since."""
    shards = [s for s in loaded_shards(checkpoint, settings, names) if s.key not in besides]
    if not shards:
        return None
    changed, unknown = source_changes(checkpoint.uri, shards, settings)
    problems = [f"changed since rank 0 inspected it: {c}" for c in changed] + [f"cannot read: {u}" for u in unknown]
    return listed(problems, 3, "; ") if problems else None
