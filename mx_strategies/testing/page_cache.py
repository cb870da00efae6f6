"""Put files in the page cache, or take them out of it: the warm and cold runs of the tests and benchmarks.

A file read whole is in the page cache; a file ``fsync``-ed and then dropped with
``posix_fadvise(POSIX_FADV_DONTNEED)`` is not (its clean pages are evicted; no root needed). A file system that
keeps every page in memory (tmpfs, ramfs) cannot drop them.
"""

from __future__ import annotations

import os
from typing import Iterable


def warm(paths: Iterable[str]) -> None:
    """Read each file whole, so the page cache holds it."""
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(16 << 20):
                pass


def cold(paths: Iterable[str]) -> None:
    """Write each file's dirty pages back, then drop all its pages from the page cache."""
    for path in paths:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


__all__ = ["cold", "warm"]
