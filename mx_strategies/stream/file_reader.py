"""Which reader streams a load's local files, and the page-cache reader itself.

runai-model-streamer reads local files with ``O_DIRECT`` by default, so the
page cache never serves it: a pod restarting on a node that already read the
checkpoint, or a folder on a file system whose pages are cached, is read from
the device again at runai's pace (about 1.7 GB/s here), where safetensors'
``load_file`` and a copy into the model run at about 10 GB/s (issue 48).

:func:`choose_reader` decides once per load: where every shard of a local
checkpoint is already in the page cache (asked of the kernel with
``mincore(2)`` over a sample of each file's pages, the headers' cost), the
:class:`PageCacheReader` copies the plan's tensors out of the cache with
``preadv``; otherwise runai streams (direct I/O on a cold file, its own
buffered fallback where a file system refuses ``O_DIRECT``). Object stores
always stream with runai. ``MX_ROBUST_FILE_READER`` overrides the choice.

The page-cache reader hands out tensors that own their memory (no mapping of
the file outlives a read, so a file cut short mid-load is a clean error, not
a ``SIGBUS``), in plan order, one reader thread ahead of the consumer and at
most ``ahead_bytes`` of tensors waiting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import torch

from ..inspect.checkpoint import Shard, TensorInfo, runai_dtypes, storage_shape

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan

PAGE_CACHE = "page_cache"
RUNAI = "runai"
READERS = (PAGE_CACHE, RUNAI)

# How much of each file mincore is asked about: this many windows, spread evenly, of this many pages each.
SAMPLE_WINDOWS = 64
WINDOW_PAGES = 16


@dataclass(frozen=True)
class ReaderChoice:
    """The reader of one load's files, and why (said in the load's log and report)."""

    reader: str  # one of READERS
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
    if setting == PAGE_CACHE:
        return ReaderChoice(PAGE_CACHE, "MX_ROBUST_FILE_READER=page_cache")
    cached, sampled = 0, 0
    for path in uris:
        resident = resident_pages(path)
        if resident is None:
            return ReaderChoice(RUNAI, f"the page cache could not be asked about {path}")
        cached, sampled = cached + resident[0], sampled + resident[1]
    share = cached / sampled if sampled else 1.0
    if share >= 0.99:
        return ReaderChoice(PAGE_CACHE, f"the files are in the page cache ({share:.0%} of the pages sampled)")
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


def resident_pages(path: str) -> Optional[tuple[int, int]]:
    """(pages in the page cache, pages asked about) over a sample of ``path``'s pages; None: cannot tell.

    ``mincore(2)`` on a read-only shared mapping of the file: mapping reads nothing, and the answer is the
    kernel's view of the file's cached pages. Bounded: at most SAMPLE_WINDOWS x WINDOW_PAGES pages per file.
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
            windows = min(SAMPLE_WINDOWS, max(1, pages // WINDOW_PAGES))
            step = pages // windows
            vector = (ctypes.c_ubyte * WINDOW_PAGES)()
            cached = asked = 0
            for i in range(windows):
                first = i * step
                count = min(WINDOW_PAGES, pages - first)
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
    """Reads a plan's tensors from local files with ``preadv``, in plan order, one thread ahead.

    The interface of :class:`.runai_plan.PlannedStreamer` that :class:`.streaming.VerifiedStream` uses:
    ``stream_plan``, ``get_tensors``, ``bytes_from_storage``, and a context manager that stops the reader
    thread and closes the files.
    """

    def __init__(self, ahead_bytes: int = 256 << 20) -> None:
        self._ahead_bytes = max(1, ahead_bytes)
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._room = threading.Condition()
        self._waiting = 0  # bytes read and not yet taken
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._bytes = 0

    def __enter__(self) -> "PageCacheReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        with self._room:
            self._room.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stream_plan(self, plan: "LoadPlan", *, device: str = "cpu", is_distributed: bool = False) -> None:
        """Start reading the plan's tensors (``device`` cpu and not distributed only: runai does those)."""
        if device != "cpu" or is_distributed:
            raise ValueError("the page-cache reader reads into host memory for one rank")
        work = [(shard, [t for t in shard.tensors.values() if plan.names is None or t.name in plan.names])
                for shard in plan.shards]  # fmt: skip
        self._bytes = sum(t.nbytes for _, infos in work for t in infos)
        self._thread = threading.Thread(target=self._read_all, args=(work,), name="mx-page-cache", daemon=True)
        self._thread.start()

    def bytes_from_storage(self) -> int:
        return self._bytes

    def get_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) in plan order; what the reader thread raised, raised here."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            name, tensor, nbytes = item
            with self._room:
                self._waiting -= nbytes
                self._room.notify_all()
            yield name, tensor

    def _read_all(self, work: list[tuple[Shard, list[TensorInfo]]]) -> None:
        try:
            for shard, infos in work:
                if not infos:
                    continue
                fd = os.open(shard.uri, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    for info in sorted(infos, key=lambda t: t.start or 0):
                        tensor = read_tensor(fd, shard.uri, info)
                        with self._room:
                            while self._waiting and self._waiting + info.nbytes > self._ahead_bytes:
                                if self._stop.is_set():
                                    return
                                self._room.wait(0.5)
                            if self._stop.is_set():
                                return
                            self._waiting += info.nbytes
                        self._queue.put((info.name, tensor, info.nbytes))
                finally:
                    os.close(fd)
            self._queue.put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._queue.put(exc)


def read_tensor(fd: int, path: str, info: TensorInfo) -> torch.Tensor:
    """One tensor read from its byte range into memory of its own, as runai hands it out (dtype, shape)."""
    dtype = runai_dtypes().get(info.dtype)
    if dtype is None or info.start is None:
        raise OSError(f"{path}: cannot read tensor {info.name} ({info.dtype}) from the page cache")
    buffer = torch.empty(info.nbytes, dtype=torch.uint8)
    view, done = memoryview(buffer.numpy()), 0
    while done < info.nbytes:
        got = os.preadv(fd, [view[done:]], info.start + done)
        if got == 0:
            raise OSError(f"{path}: ends before tensor {info.name} does (read {done} of its {info.nbytes} bytes)")
        done += got
    return buffer.view(dtype).reshape(storage_shape(info.dtype, tuple(info.shape)))


__all__ = ["PAGE_CACHE", "READERS", "RUNAI", "PageCacheReader", "ReaderChoice", "choose_reader", "resident_pages"]
