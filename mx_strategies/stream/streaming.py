"""Streaming with runai-model-streamer, and verification of what arrived.

The plan is fixed before the model is touched: the non-empty shards in
natural order, and the exact tensor names each must deliver. runai then
streams exactly those byte ranges (:mod:`.runai_plan`: the probe's headers
are not read again), tensors owned by the caller so nothing is copied twice.
The ledger (:class:`..verify.ledger.DeliveryLedger`) checks every name off
as it arrives; a shortfall, a duplicate or a stranger fails the load instead
of serving a model with a weight missing (vLLM #38991: 335 of 447 tensors
silently dropped).

runai yields tensors in whatever order its reads complete, which differs
from run to run even for one file list. They go to the model in that order,
as vLLM's own runai loader hands them on: ``load_weights`` does not need an
order, and holding tensors back costs time and host memory.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional

import torch

from ..inspect.object_stores import source_changes
from ..errors import ContentMismatch, StreamBroken, StreamStartError
from ..settings import RobustSettings
from ..verify.ledger import DeliveryLedger, names_shown as _first
from .file_reader import RUNAI, PageCacheReader, ReaderChoice
from .read_ahead import ReadAhead
from .runai_env import claim_backend, streamer_environment, streamer_variables

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan


def _quietly(future) -> Optional[str]:
    """A finished re-check's message; None when it found nothing or could not run."""
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - the start's own error is raised instead
        return None


class VerifiedStream:
    """A runai streaming session for one plan, owning the streamer.

    Entering starts the stream and fetches the first tensor, so anything that
    fails before the model is touched raises :class:`StreamStartError`.
    ``tensors()`` yields (name, tensor) in arrival order and, when exhausted,
    raises :class:`IncompleteDelivery` under the ``fail`` policy.
    """

    def __init__(
        self,
        plan: LoadPlan,
        settings: RobustSettings,
        *,
        device: str = "cpu",
        distributed: bool = False,
        loader_extra_config: Optional[Mapping[str, Any]] = None,
        on_warning: Optional[Callable[[str], None]] = None,
        progress: Any = None,  # a progress.ProgressLog, told of every tensor (None: no progress lines)
        carrier: Optional[LoadPlan] = None,
        read_ahead: Optional["ReadAhead"] = None,
        reader: Optional[ReaderChoice] = None,
    ) -> None:
        """``carrier``: what runai streams when it is more than ``plan`` (the union of the shares of
        this host's ranks, :func:`.distributed.agreed_shares`); only ``plan``'s tensors reach the model.
        ``read_ahead``: a stream of the load's foreseen head, started before ``plan`` was answered
        (:mod:`.read_ahead`): what of it ``plan`` holds is delivered first, the rest dropped, and
        ``plan``'s other tensors streamed after it. ``reader``: which reader reads the files
        (:func:`.file_reader.choose_reader`; None: runai); the page-cache reader reads a load of one rank."""
        if read_ahead is not None and (carrier is not None or distributed):
            raise ValueError("a read-ahead serves a load of one rank, streamed on its own")
        self.reader = reader if reader is not None else ReaderChoice(RUNAI, "runai streams")
        if self.reader.reader != RUNAI and (carrier is not None or distributed or read_ahead is not None):
            raise ValueError("the page-cache reader reads a load of one rank, without a read-ahead")
        self.plan = plan
        self._ahead = read_ahead if read_ahead is not None and read_ahead.live else None
        self.carrier = carrier if carrier is not None else plan
        self._own = None if carrier is None or plan.names is None else plan.names
        self.bytes_passed_on = 0  # carried for the host's other ranks, not fed to this rank's model
        self.settings = settings
        self.device = device
        self.distributed = distributed
        self.variables = streamer_variables(settings, loader_extra_config, on_warning, distributed=distributed)
        self.ledger = DeliveryLedger(plan, settings)
        self.bytes_delivered = 0
        self.exhausted = False
        # Whether the engine's weight loading holds the stream (tensors() was handed to it): from then on, what it
        # did before a failure is not robust's to know.
        self.handed_over = False
        self._on_warning = on_warning
        self._env = None
        self._streamer = None
        self._files_mapped = 0
        self._started = False
        self._from_storage: Optional[int] = 0  # nothing planned: nothing read
        self._iter = None
        self._first = None
        self.progress = progress
        # perf_counter marks for the load report's phases: last tensor checked in, checks done, streamer closed.
        self.delivered_at: Optional[float] = None
        self.verified_at: Optional[float] = None
        self.closed_at: Optional[float] = None

    def __enter__(self) -> "VerifiedStream":
        """Start streaming and fetch the first tensor; raises StreamStartError.

        A stream is entered once: a second start would stream everything
        twice and leak the first runai streamer, whose late responses break
        the next load in the process.
        """
        if self._started:
            raise RuntimeError("VerifiedStream is already started")
        self._started = True
        claim_backend(self.carrier.source, self.carrier.uris)
        # The identity re-check "before streaming" runs while runai starts and fetches the first
        # tensor (one round trip less on an object store); nothing reaches the model before it passed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mx-recheck") as recheck:
            before = recheck.submit(self._source_change, "before streaming")
            try:
                self._start()
            except Exception as exc:
                self.__exit__(type(exc), exc, exc.__traceback__)
                changed = _quietly(before)  # a changed source explains a failed start best
                why = changed or f"{type(exc).__name__}: {exc}"
                raise StreamStartError(f"streaming {self.plan.source} did not start: {why}", mutated=False) from exc
            try:
                changed = before.result()
            except BaseException as exc:
                self.__exit__(type(exc), exc, exc.__traceback__)
                raise
            if changed:
                self.__exit__(None, None, None)
                raise StreamStartError(f"streaming {self.plan.source} did not start: {changed}", mutated=False)
        if self.progress is not None:
            self.progress.start()
        return self

    def _start(self) -> None:
        """Start runai on the plan and fetch the first tensor (held until ``tensors()``)."""
        from .runai_plan import PlannedStreamer  # imports runai, which a plan-only caller never needs

        self._env = streamer_environment(self.variables)
        self._env.__enter__()
        if self._ahead is not None and self.carrier.shards:
            self._iter = self._ahead.then(self.plan, self.device)  # what it read that the plan holds, then the rest
            self._first = next(self._iter, None)
        elif self.carrier.shards:
            reader = PlannedStreamer if self.reader.reader == RUNAI else PageCacheReader
            self._streamer = reader().__enter__()
            # The probe's headers, not a second read of them (runai_plan).
            self._streamer.stream_plan(self.carrier, device=self.device, is_distributed=self.distributed)
            self._from_storage = self._streamer.bytes_from_storage()
            self._iter = self._streamer.get_tensors()
            self._first = next(self._iter, None)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._ahead is not None:
                self._ahead.close()
            if self._streamer is not None:
                self._files_mapped = getattr(self._streamer, "mapped_files", 0)
                self._streamer.__exit__(exc_type, exc, tb)
                self._streamer = None
        finally:
            if self._env is not None:
                self._env.__exit__(None, None, None)
                self._env = None
            if self.progress is not None:
                self.progress.stop()
            self.closed_at = time.perf_counter()

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The plan's tensors, checked in, in arrival order, for the engine's weight loading: from this call on,
        the engine holds the stream (:attr:`handed_over`)."""
        self.handed_over = True
        return self._tensors()

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._arrivals():
            yield self._check_in(name, tensor)
        self.delivered_at = time.perf_counter()
        self._check_sources_unchanged("after streaming")
        self.exhausted = True
        self.settle()
        self.verified_at = time.perf_counter()

    def _check_sources_unchanged(self, when: str) -> None:
        """Fail the load when a planned shard's identity differs from the one inspected (see _source_change)."""
        message = self._source_change(when)
        if message:
            raise ContentMismatch(message, mutated=self.touched)

    def _source_change(self, when: str) -> Optional[str]:
        """What changed since inspection, as a message; None when nothing did.

        Size, mtime and inode locally, the ETag (or generation) on object
        stores: a shard rewritten between inspection and the end of
        streaming mixes old and new tensors, even with the same names,
        dtypes and shapes. An identity that cannot be read now is warned
        about, not failed on (MX_ROBUST_VERIFY_CONTENT covers the bytes).
        """
        shards = [s for s in self.carrier.shards if getattr(s, "identity", None)]
        if not shards:
            return None
        changed, unknown = source_changes(self.plan.source, shards, self.settings)
        if unknown and self._on_warning is not None:
            self._on_warning(f"could not re-check {len(unknown)} file(s) of {self.plan.source} {when}: {_first(unknown)}")
        if not changed:
            return None
        return (
            f"{len(changed)} file(s) of {self.plan.source} changed since they were inspected ({when}), "
            f"not loading a mix of old and new tensors: {_first(changed)}"
        )

    @property
    def verify_seconds(self) -> float:
        """From the last tensor to the end of the checks after it (the source re-check, the ledger); 0 if not reached."""
        if self.delivered_at is None or self.verified_at is None:
            return 0.0
        return self.verified_at - self.delivered_at

    @property
    def read_ahead_bytes(self) -> int:
        """The bytes runai read ahead, before the plan was answered (0: no read-ahead)."""
        return 0 if self._ahead is None else self._ahead.bytes

    @property
    def bytes_discarded(self) -> int:
        """The bytes read ahead, then not in the answered plan: never delivered."""
        return 0 if self._ahead is None else self._ahead.discarded

    @property
    def files_mapped(self) -> int:
        """Files the page-cache reader mapped under a read lease (0: runai read, or preadv without a lease)."""
        return getattr(self._streamer, "mapped_files", 0) if self._streamer is not None else self._files_mapped

    @property
    def bytes_carried(self) -> int:
        """The tensor bytes that reached this rank: its plan's, plus the host's other ranks' (a carrier)."""
        return self.carrier.bytes

    @property
    def bytes_from_storage(self) -> Optional[int]:
        """What this rank read from storage itself (runai's partition share when distributed), or None."""
        return self._ahead.from_storage if self._ahead is not None and self.carrier.shards else self._from_storage

    def _arrivals(self) -> Iterator[tuple[str, torch.Tensor]]:
        """runai's tensors in arrival order, starting with the prefetched one."""
        pending = self._first
        self._first = None
        arrived: set[str] = set()
        while pending is not None:
            arrived.add(pending[0])
            if self._own is None or pending[0] in self._own:
                yield pending
            else:  # another rank's of this host: runai's broadcast brought it here; dropped at once
                self.bytes_passed_on += pending[1].numel() * pending[1].element_size()
            try:
                pending = next(self._iter, None) if self._iter is not None else None
            except Exception as exc:
                raise StreamBroken(self._broken(exc, arrived), mutated=self.touched) from exc

    def _broken(self, exc: Exception, arrived: set[str]) -> str:
        """runai's error says neither the source nor the file: add both."""
        names = self.plan.names
        unfinished = [
            s.uri for s in self.plan.shards if any(n not in arrived for n in s.tensors if names is None or n in names)
        ]
        return (
            f"streaming {self.plan.source} failed after {len(arrived)} of {len(self.ledger.expected)} tensors "
            f"arrived (unfinished: {_first(unfinished)}): {type(exc).__name__}: {exc}"
        )

    @property
    def touched(self) -> bool:
        """Whether a tensor was handed to the model (so a failure now leaves it changed)."""
        return bool(self.ledger.delivered)

    def _check_in(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        uri = self.ledger.check_in(name, tensor)  # its header, its bytes where checked, then off
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_delivered += nbytes
        if self.progress is not None:
            self.progress.add(uri, nbytes)
        return name, tensor

    def settle(self) -> None:
        """Apply the completeness policy (:meth:`..verify.ledger.DeliveryLedger.settle`); safe to call more than once."""
        self.ledger.settle(self.exhausted, self._on_warning)
