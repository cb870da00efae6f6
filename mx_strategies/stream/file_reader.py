"""Which reader streams a load's local files, and the page-cache reader itself.

runai-model-streamer reads local files with ``O_DIRECT`` by default, so the
page cache never serves it: a pod restarting on a node that already read the
checkpoint, or a folder on a file system whose pages are cached, is read from
the device again at runai's pace (about 1.7 GB/s here), where safetensors'
``load_file`` and a copy into the model run at about 10 GB/s (issue 48).

:func:`choose_reader` decides once per load: where every shard of a local
checkpoint is already in the page cache (asked of the kernel with
``mincore(2)`` over a sample of each file's pages, the headers' cost), the
:class:`PageCacheReader` hands the plan's tensors out of the cache;
otherwise runai streams (direct I/O on a cold file, its own buffered
fallback where a file system refuses ``O_DIRECT``). Object stores always
stream with runai. ``MX_ROBUST_FILE_READER`` overrides the choice.

The page-cache reader maps each file under a read lease, so that no
process can cut it short under the mapping during the load, and reads with
``preadv`` where no lease can be had (:class:`PageCacheReader`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import mmap
import os
import signal
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import torch

from ..inspect.checkpoint import Shard, TensorInfo
from ..inspect.headers import runai_dtypes, storage_shape

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan

_PAGE_CACHE = "page_cache"
RUNAI = "runai"
_READERS = (_PAGE_CACHE, RUNAI)

# How much of each file mincore is asked about: this many windows, spread evenly, of this many pages each.
_SAMPLE_WINDOWS = 64
_WINDOW_PAGES = 16


@dataclass(frozen=True)
class ReaderChoice:
    """The reader of one load's files, and why (said in the load's log and report)."""

    reader: str  # one of _READERS
    why: str


def choose_reader(uris: Sequence[str], setting: str) -> ReaderChoice:
    """The reader for a load of ``uris`` under ``MX_ROBUST_FILE_READER`` (``auto``, ``page_cache``, ``runai``)."""
    if not uris:
        return ReaderChoice(RUNAI, "nothing to read")
    remote = [uri for uri in uris if "://" in uri]
    if remote:
        return ReaderChoice(RUNAI, f"an object store ({remote[0].split('://', 1)[0]}://)")
    if setting == RUNAI:
        return ReaderChoice(RUNAI, "MX_ROBUST_FILE_READER=runai")
    if setting == _PAGE_CACHE:
        return ReaderChoice(_PAGE_CACHE, "MX_ROBUST_FILE_READER=page_cache")
    cached, sampled = 0, 0
    for path in uris:
        resident = _resident_pages(path)
        if resident is None:
            return ReaderChoice(RUNAI, f"the page cache could not be asked about {path}")
        cached, sampled = cached + resident[0], sampled + resident[1]
    share = cached / sampled if sampled else 1.0
    if share >= 0.99:
        return ReaderChoice(_PAGE_CACHE, f"the files are in the page cache ({share:.0%} of the pages sampled)")
    return ReaderChoice(RUNAI, f"the files are not in the page cache ({share:.0%} of the pages sampled): direct reads")


_libc = None


def _libc_calls():
    """libc's mmap, mincore and munmap (ctypes): Python's mmap gives no address of a read-only mapping."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        libc.mmap.restype = ctypes.c_void_p
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
        libc.mincore.restype = ctypes.c_int
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.munmap.restype = ctypes.c_int
        _libc = libc
    return _libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def _resident_pages(path: str) -> Optional[tuple[int, int]]:
    """(pages in the page cache, pages asked about) over a sample of ``path``'s pages; None: cannot tell.

    ``mincore(2)`` on a read-only shared mapping of the file: mapping reads nothing, and the answer is the
    kernel's view of the file's cached pages. Bounded: at most _SAMPLE_WINDOWS x _WINDOW_PAGES pages per file.
    """
    try:
        libc = _libc_calls()
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return 0, 0
            base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, handle.fileno(), 0)
        if base in (None, _MAP_FAILED):
            return None
        try:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            windows = min(_SAMPLE_WINDOWS, max(1, pages // _WINDOW_PAGES))
            step = pages // windows
            vector = (ctypes.c_ubyte * _WINDOW_PAGES)()
            cached = asked = 0
            for i in range(windows):
                first = i * step
                count = min(_WINDOW_PAGES, pages - first)
                if libc.mincore(base + first * page, count * page, vector) != 0:
                    return None
                cached += sum(vector[j] & 1 for j in range(count))
                asked += count
            return cached, asked
        finally:
            libc.munmap(base, size)
    except (OSError, AttributeError):
        return None


class PageCacheReader:
    """Hands a plan's tensors out of the page cache, in plan order, as the model asks for them.

    The interface of :class:`.runai_plan.PlannedStreamer` that :class:`.streaming.VerifiedStream` uses:
    ``stream_plan``, ``get_tensors``, ``bytes_from_storage``, and a context manager that gives back what it holds.

    Each file is mapped and its tensors are views of the mapping (one copy, the model's, as safetensors'
    ``load_file`` does), but only under a read lease (``fcntl(F_SETLEASE, F_RDLCK)``): while the lease is held
    no process can open the file for writing or truncate it without first being made to wait and this process
    told (``SIGIO``), so a file cut short under the mapping (a ``SIGBUS``, the process killed) cannot happen
    during the load. A broken lease fails the load at the next tensor, naming the file; the writer waits for
    that. Where a lease cannot be taken (not the file's owner and no ``CAP_LEASE``, a file system without
    leases, a file open for writing, a load outside the main thread, which alone can take the signal), the
    file is read with ``preadv`` into memory of each tensor's own: two copies, never a mapping.
    """

    def __init__(self) -> None:
        self._work: list[tuple[Shard, list[TensorInfo]]] = []
        self._bytes = 0
        self._fds: list[int] = []
        self._leased: list[int] = []
        self._broken = False
        self._previous_handler: object = None
        self.mapped_files = 0  # files read through a leased mapping (the others with preadv)

    def __enter__(self) -> "PageCacheReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._release()

    def stream_plan(self, plan: "LoadPlan", *, device: str = "cpu", is_distributed: bool = False) -> None:
        """Take the plan's files (``device`` cpu and not distributed only: runai does those)."""
        if device != "cpu" or is_distributed:
            raise ValueError("the page-cache reader reads into host memory for one rank")
        self._work = [(shard, sorted((t for t in shard.tensors.values() if plan.names is None or t.name in plan.names),
                                     key=lambda t: t.start or 0))
                      for shard in plan.shards]  # fmt: skip
        self._bytes = sum(t.nbytes for _, infos in self._work for t in infos)

    def bytes_from_storage(self) -> int:
        return self._bytes

    def get_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) in plan order."""
        try:
            for shard, infos in self._work:
                if not infos:
                    continue
                fd = os.open(shard.uri, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._fds.append(fd)
                mapped = self._mapped(fd, shard.uri)
                for info in infos:
                    if self._broken:
                        raise OSError(
                            f"{shard.uri}: another process opened a file of the load for writing or truncated it "
                            "while it was read (its read lease was broken); not loading a file that changes"
                        )
                    if mapped is not None:
                        yield info.name, _tensor_of(mapped, shard.uri, info)
                    else:
                        yield info.name, _read_tensor(fd, shard.uri, info)
        finally:
            self._release()

    def _mapped(self, fd: int, path: str) -> Optional[torch.Tensor]:
        """The file mapped (bytes, private: a write by the model stays its own) under a read lease, or None."""
        if not self._lease(fd):
            return None
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        self.mapped_files += 1
        return torch.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_COPY), dtype=torch.uint8)

    def _lease(self, fd: int) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if self._previous_handler is None:
            self._previous_handler = signal.signal(signal.SIGIO, self._lease_broken)
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError:
            return False
        self._leased.append(fd)
        return True

    def _lease_broken(self, signum, frame) -> None:
        self._broken = True

    def _release(self) -> None:
        """Leases given back (a waiting writer goes on), files closed, the signal's handler restored."""
        for fd in self._leased:
            with suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        for fd in self._fds:
            with suppress(OSError):
                os.close(fd)
        self._leased, self._fds = [], []
        if self._previous_handler is not None:
            signal.signal(signal.SIGIO, self._previous_handler)
            self._previous_handler = None


def _dtype_and_shape(path: str, info: TensorInfo) -> tuple[torch.dtype, tuple[int, ...]]:
    dtype = runai_dtypes().get(info.dtype)
    if dtype is None or info.start is None:
        raise OSError(f"{path}: cannot read tensor {info.name} ({info.dtype}) from the page cache")
    return dtype, storage_shape(info.dtype, tuple(info.shape))


def _tensor_of(mapped: torch.Tensor, path: str, info: TensorInfo) -> torch.Tensor:
    """One tensor as a view of its file's mapping, as runai hands it out (dtype, shape)."""
    dtype, shape = _dtype_and_shape(path, info)
    if info.start + info.nbytes > mapped.numel():
        raise OSError(f"{path}: ends before tensor {info.name} does ({mapped.numel()} bytes)")
    return mapped[info.start : info.start + info.nbytes].view(dtype).reshape(shape)


def _read_tensor(fd: int, path: str, info: TensorInfo) -> torch.Tensor:
    """One tensor read from its byte range into memory of its own, as runai hands it out (dtype, shape)."""
    dtype, shape = _dtype_and_shape(path, info)
    buffer = torch.empty(info.nbytes, dtype=torch.uint8)
    view, done = memoryview(buffer.numpy()), 0
    while done < info.nbytes:
        got = os.preadv(fd, [view[done:]], info.start + done)
        if got == 0:
            raise OSError(f"{path}: ends before tensor {info.name} does (read {done} of its {info.nbytes} bytes)")
        done += got
    return buffer.view(dtype).reshape(shape)
