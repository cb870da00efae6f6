"""The installed versions the patches are guarded by."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Optional


def installed(distribution: str) -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of an installed distribution, or None when it is absent or unparsable."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if parts is None:
        return None
    return int(parts.group(1)), int(parts.group(2)), int(parts.group(3) or 0)


def modelexpress_in(low: tuple[int, int], high: tuple[int, int]) -> bool:
    """Whether the installed ModelExpress is in [low, high) by (major, minor)."""
    version = installed("modelexpress")
    return version is not None and low <= version[:2] < high
