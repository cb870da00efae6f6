"""What a store is (the files under a source root, listed with sizes, read by range), how a URI is spelt,
and the local folder.

Probing a candidate source must never read tensor data: a 700 GB checkpoint is inspected by listing its
prefix and reading each shard's header with one ranged read (two for a header larger than the first read).
The object stores are in :mod:`.object_stores`, which also opens the store for a URI.
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..errors import StoreError

S3_PREFIX = "s3://"
GCS_PREFIX = "gs://"
AZURE_PREFIX = "az://"
_OBJECT_STORE_PREFIXES = (S3_PREFIX, GCS_PREFIX, AZURE_PREFIX)

# Entries a local discovery walk looks at, at most: a wrong path such as / or a whole cache fails in seconds,
# naming the folder, instead of being walked for minutes. Fixed (it was MX_ROBUST_MAX_DISCOVERY_ENTRIES).
_MAX_DISCOVERY_ENTRIES = 100_000
_REGULAR = "file"



@dataclass(frozen=True)
class ObjectInfo:
    """One file under a source root."""

    key: str  # path relative to the root, "/"-separated
    uri: str  # what runai-model-streamer is given to stream it
    size: int
    # What changes when the file is rewritten: size, mtime and inode locally, the ETag or
    # generation on object stores. None when the store cannot say.
    identity: Optional[str] = field(default=None, compare=False)
    # "file" for a regular file; locally also "FIFO", "socket", "character device", ...
    # (listed so a checkpoint file that is one is reported, never opened).
    kind: str = field(default=_REGULAR, compare=False)

    @property
    def regular(self) -> bool:
        return self.kind == _REGULAR


class Store(Protocol):
    root: str

    def list(self, max_depth: int) -> list[ObjectInfo]:
        """Every file up to ``max_depth`` folders below the root, unordered."""

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        """``length`` bytes of ``obj`` from ``start`` (one ranged request)."""

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        """``obj``'s identity now (see :attr:`ObjectInfo.identity`); None when unknown."""


class ListingTooLarge(StoreError):
    """A local discovery walk met more than :data:`_MAX_DISCOVERY_ENTRIES` entries; the message names the folder."""


_KINDS = (
    (stat.S_ISREG, _REGULAR), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
)


def _file_kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def _local_identity(st: os.stat_result) -> str:
    return f"size={st.st_size} mtime_ns={st.st_mtime_ns} inode={st.st_ino}"


# "org/name" that is no local folder: a Hugging Face hub id, which we cannot stream.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_object_store_uri(uri: str) -> bool:
    return uri.startswith(_OBJECT_STORE_PREFIXES)


def normalize_uri(uri: str) -> str:
    """One spelling per location: object-store URIs without a trailing slash, local paths absolute."""
    if is_object_store_uri(uri) or "://" in uri:
        return uri.rstrip("/")
    return os.path.abspath(uri)


def split_bucket(uri: str, scheme: str) -> tuple[str, str]:
    """(bucket, prefix ending in "/" or empty) of an object-store URI of ``scheme``."""
    bucket, _, prefix = uri[len(scheme) :].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def looks_like_hub_id(uri: str) -> bool:
    """``org/name`` with no such local folder: someone passed a Hugging Face hub id."""
    return bool(_HUB_ID.match(uri)) and not uri.startswith((".", "/")) and not os.path.exists(uri)


class LocalStore:
    """A local folder. Discovery follows symlinks but visits each real folder once.

    Only regular files are ever opened: a FIFO, socket or device is listed
    with its ``kind`` (so inspection can name it) and refused by
    :meth:`read`, checked with ``stat`` before any ``open``. Folders that
    cannot be listed are kept in ``unreadable`` (key -> reason).
    """

    def __init__(self, root: str) -> None:
        self.root = normalize_uri(root)
        self.unreadable: dict[str, str] = {}

    def list(self, max_depth: int) -> list[ObjectInfo]:
        limit = _MAX_DISCOVERY_ENTRIES
        found: list[ObjectInfo] = []
        self.unreadable = {}
        try:
            top = os.stat(self.root)
        except OSError as exc:
            raise StoreError(f"{self.root}: {exc.strerror or exc}") from exc
        visited = {(top.st_dev, top.st_ino)}
        # Breadth first, names sorted: a folder reachable twice (a symlink and its target) is
        # listed under its shallowest, then alphabetically first, path.
        queue: deque[tuple[str, str, int]] = deque([("", self.root, 0)])
        seen = 0
        while queue:
            rel, path, depth = queue.popleft()
            entries = []
            try:
                with os.scandir(path) as listing:
                    for entry in listing:
                        seen += 1
                        if seen > limit:
                            raise ListingTooLarge(
                                f"{self.root}: more than {limit} entries (a fixed limit) within {max_depth} folder "
                                f"level(s) (stopped in {path}); point the source at the checkpoint folder, or lower "
                                "MX_ROBUST_DISCOVERY_DEPTH"
                            )
                        entries.append(entry)
            except OSError as exc:
                if rel:
                    self.unreadable[rel] = exc.strerror or str(exc)
                    continue
                raise StoreError(f"{self.root}: cannot list it: {exc.strerror or exc}") from exc
            entries.sort(key=lambda e: e.name)
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    st = entry.stat()  # follows symlinks; never opens
                except OSError:
                    continue  # a dangling symlink is no file
                kind = _file_kind(st.st_mode)
                if kind == "folder":
                    if entry.name.startswith(".") or depth >= max_depth:
                        continue
                    real = (st.st_dev, st.st_ino)
                    if real in visited:
                        continue  # a symlink loop, or a second way into a folder already listed
                    visited.add(real)
                    queue.append((key, entry.path, depth + 1))
                elif kind == _REGULAR:
                    found.append(ObjectInfo(key=key, uri=entry.path, size=st.st_size, identity=_local_identity(st)))
                else:
                    found.append(ObjectInfo(key=key, uri=entry.path, size=0, kind=kind))
        return found

    @staticmethod
    def _open_regular(path: str) -> int:
        """A descriptor for ``path`` if it is a regular file; never blocks on a FIFO."""
        try:
            kind = _file_kind(os.stat(path).st_mode)
            if kind != _REGULAR:
                raise StoreError(f"{path}: not a regular file (a {kind}); not opened")
            # O_NONBLOCK: should it have become a FIFO since the stat, open returns at once.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from exc
        try:
            kind = _file_kind(os.fstat(fd).st_mode)
            if kind == _REGULAR:
                return fd
            error = StoreError(f"{path}: not a regular file (a {kind}); not read")
        except OSError as exc:
            error = StoreError(f"{path}: {exc.strerror or exc}")
        os.close(fd)
        raise error

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        fd = self._open_regular(obj.uri)
        try:
            parts, done = [], 0
            while done < length and (chunk := os.pread(fd, length - done, start + done)):  # b"" at the end of file
                parts.append(chunk)
                done += len(chunk)
            return b"".join(parts)
        except OSError as exc:
            raise StoreError(f"{obj.uri}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        try:
            return _local_identity(os.stat(obj.uri))
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"

