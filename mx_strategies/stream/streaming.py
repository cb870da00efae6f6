"""Streaming with runai-model-streamer, and verification of what arrived.

The plan is fixed before the model is touched: the non-empty shards in
natural order, and the exact tensor names each must deliver. runai then
streams exactly those byte ranges (:mod:`.runai_plan`: the probe's headers
are not read again), tensors owned by the caller so nothing is copied twice.
A :class:`DeliveryLedger` checks every name off; a shortfall, a duplicate
or a stranger fails the load instead of serving a model with a weight
missing (vLLM #38991: 335 of 447 tensors silently dropped).

runai yields tensors in whatever order its reads complete, which differs
from run to run even for one file list. By default they go to the model in
that order, as vLLM's own runai loader hands them on: ``load_weights`` does
not need an order, and holding tensors back costs time and host memory.
With ``MX_ROBUST_DELIVERY_ORDER=plan``, :class:`InOrder` hands them on in
plan order instead (shards in natural order, tensors by offset), so the
sequence of ``load_weights`` calls is the same on every load, holding early
arrivals back up to ``MX_ROBUST_PLAN_ORDER_HOLD_BYTES``.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional

import torch

from ..inspect.checkpoint import source_changes
from .content_check import ContentCheck
from ..errors import ContentMismatch, IncompleteDelivery, StreamBroken, StreamStartError
from ..settings import RobustSettings
from .file_reader import RUNAI, PageCacheReader, ReaderChoice
from .read_ahead import ReadAhead
from .runai_env import claim_backend, streamer_environment, streamer_variables

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan

MISSING_NAMES_SHOWN = 10


def _quietly(future) -> Optional[str]:
    """A finished re-check's message; None when it found nothing or could not run."""
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - the start's own error is raised instead
        return None


def _delivery_mismatch(info, tensor: torch.Tensor) -> Optional[str]:
    """How ``tensor`` differs from its header entry ``info`` (dtype, shape, bytes), or None."""
    from ..inspect.checkpoint import runai_dtypes, storage_shape

    expected = runai_dtypes().get(info.dtype)
    shape = tuple(tensor.shape)
    nbytes = tensor.numel() * tensor.element_size()
    # A packed dtype (F4 on runai 0.17.1) arrives with fewer elements than the header's values on its last axis.
    wanted = storage_shape(info.dtype, tuple(info.shape))
    if (expected is None or tensor.dtype == expected) and shape == wanted and nbytes == info.nbytes:
        return None
    return f"{tensor.dtype}{list(shape)} ({nbytes} bytes)"


class DeliveryLedger:
    """Checks every expected tensor off exactly once."""

    def __init__(self, expected: list[str]) -> None:
        self.expected = expected
        self._expected_set = frozenset(expected)
        self.delivered: Counter[str] = Counter()
        self.strangers: list[str] = []

    def check_in(self, name: str) -> None:
        if name not in self._expected_set:
            self.strangers.append(name)
        self.delivered[name] += 1

    @property
    def missing(self) -> list[str]:
        return [n for n in self.expected if self.delivered[n] == 0]

    @property
    def duplicated(self) -> list[str]:
        return sorted(n for n, c in self.delivered.items() if c > 1)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.duplicated or self.strangers)

    def shortfall(self, source: str) -> str:
        """One message with counts and the first names of each kind."""
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} of {len(self.expected)} expected tensors missing: {_first(self.missing)}")
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} delivered more than once: {_first(self.duplicated)}")
        if self.strangers:
            parts.append(f"{len(self.strangers)} not expected: {_first(self.strangers)}")
        return f"incomplete load from {source}: " + "; ".join(parts)


def _first(names: list[str]) -> str:
    shown = ", ".join(names[:MISSING_NAMES_SHOWN])
    return shown + (", ..." if len(names) > MISSING_NAMES_SHOWN else "")


class InOrder:
    """Releases streamed tensors in plan order, holding early arrivals back.

    A read that completes late (its thread descheduled on a busy host) lets
    runai's other buffers refill meanwhile, so how far a complete delivery
    runs ahead is not bounded by runai's ring: ``limit_bytes``
    (``MX_ROBUST_PLAN_ORDER_HOLD_BYTES``) bounds what is held. Past it,
    everything held is released in arrival order, and so is the rest
    (an expected tensor that is not coming: the ledger will say which),
    rather than buffering a whole checkpoint.
    Names the plan does not expect, and repeats, come out at the end.
    """

    def __init__(self, expected: list[str], limit_bytes: int) -> None:
        self._next = deque(expected)
        self._limit = limit_bytes
        self._held: dict[int, tuple[str, torch.Tensor]] = {}  # arrival number -> item, in arrival order
        self._by_name: dict[str, deque[int]] = {}
        self._held_bytes = 0
        self._arrivals = itertools.count()
        self.ordered = True
        self.peak_bytes = 0  # the most tensor bytes held at once

    def push(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """What may go to the model now that ``(name, tensor)`` arrived."""
        if not self.ordered:
            yield name, tensor
            return
        if self._next and self._next[0] == name and not self._held:
            self._next.popleft()
            yield name, tensor
            return
        number = next(self._arrivals)
        self._held[number] = (name, tensor)
        self._by_name.setdefault(name, deque()).append(number)
        self._held_bytes += tensor.numel() * tensor.element_size()
        self.peak_bytes = max(self.peak_bytes, self._held_bytes)
        yield from self._release_due()
        if self._held_bytes > self._limit:
            self.ordered = False
            yield from self._release_all()

    def drain(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Everything still held once the stream has ended: in plan order, past the missing."""
        while self._next:
            waiting = self._by_name.get(self._next.popleft())
            if waiting:
                yield self._take(waiting.popleft())
        yield from self._release_all()

    def _release_due(self) -> Iterator[tuple[str, torch.Tensor]]:
        while self._next and self._by_name.get(self._next[0]):
            yield self._take(self._by_name[self._next.popleft()].popleft())

    def _release_all(self) -> Iterator[tuple[str, torch.Tensor]]:
        while self._held:
            number = next(iter(self._held))
            self._by_name[self._held[number][0]].remove(number)
            yield self._take(number)

    def _take(self, number: int) -> tuple[str, torch.Tensor]:
        name, tensor = self._held.pop(number)
        self._held_bytes -= tensor.numel() * tensor.element_size()
        return name, tensor


class VerifiedStream:
    """A runai streaming session for one plan, owning the streamer.

    Entering starts the stream and fetches the first tensor, so anything that
    fails before the model is touched raises :class:`StreamStartError`.
    ``tensors()`` yields (name, tensor) in plan order and, when exhausted,
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
        self.bytes_discarded = 0  # read ahead, then not in the answered plan: never delivered
        self.carrier = carrier if carrier is not None else plan
        self._own = None if carrier is None or plan.names is None else plan.names
        self.bytes_passed_on = 0  # carried for the host's other ranks, not fed to this rank's model
        self.settings = settings
        self.device = device
        self.distributed = distributed
        self.variables = streamer_variables(settings, loader_extra_config, on_warning, distributed=distributed)
        self.ledger = DeliveryLedger(plan.expected)
        self.bytes_delivered = 0
        self.exhausted = False
        # Whether the engine's weight loading holds the stream (tensors() was handed to it): from then on, what it
        # did before a failure is not robust's to know.
        self.handed_over = False
        self._settled = False
        self._on_warning = on_warning
        self._warned_unordered = False
        self._env = None
        self._streamer = None
        self._files_mapped = 0
        self._started = False
        self._from_storage: Optional[int] = 0  # nothing planned: nothing read
        self._iter = None
        self._first = None
        self._in_order: Optional[InOrder] = None  # only with MX_ROBUST_DELIVERY_ORDER=plan
        self.content = ContentCheck.for_load(plan.source, plan.shards, plan.expected, settings)
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
            self._from_storage = self._ahead.bytes
            self._iter = self._after_read_ahead()
            self._first = next(self._iter, None)
        elif self.carrier.shards:
            reader = PlannedStreamer if self.reader.reader == RUNAI else PageCacheReader
            self._streamer = reader().__enter__()
            # The probe's headers, not a second read of them (runai_plan).
            self._streamer.stream_plan(self.carrier, device=self.device, is_distributed=self.distributed)
            self._from_storage = self._streamer.bytes_from_storage()
            self._iter = self._streamer.get_tensors()
            self._first = next(self._iter, None)
        if self.carrier.shards and self.settings.delivery_order == "plan":
            # The setting alone bounds what is held: runai's ring does not bound how far a complete
            # delivery runs ahead, since a read that stalls (a busy host) lets the other buffers refill.
            self._in_order = InOrder(self.ledger.expected, self.settings.plan_order_hold_bytes)

    def _after_read_ahead(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The read-ahead's tensors the plan holds (the others dropped, never delivered), then the plan's rest."""
        from .runai_plan import PlannedStreamer

        ahead = self._ahead
        wanted = frozenset(self.plan.expected)
        for name, tensor in ahead.take():
            if name in wanted:
                yield name, tensor
            else:
                self.bytes_discarded += tensor.numel() * tensor.element_size()
        ahead.close()  # its buffers go before the rest's are taken
        remaining = self.plan.rest(ahead.plan.expected)
        if remaining is None:
            return
        self._streamer = PlannedStreamer().__enter__()
        self._streamer.stream_plan(remaining, device=self.device)
        self._from_storage += remaining.bytes
        yield from self._streamer.get_tensors()

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
        """The plan's tensors, checked in, in arrival order or (opt-in) plan order, for the engine's weight
        loading: from this call on, the engine holds the stream (:attr:`handed_over`)."""
        self.handed_over = True
        return self._tensors()

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._in_order is None:
            for name, tensor in self._arrivals():
                yield self._check_in(name, tensor)
        else:
            for name, tensor in self._arrivals():
                for item in self._in_order.push(name, tensor):
                    yield self._check_in(*item)
                self._warn_if_unordered()
            for item in self._in_order.drain():
                yield self._check_in(*item)
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
    def delivery_order(self) -> str:
        """How tensors reached the model: arrival, plan, or plan until the hold-back bound was passed."""
        if self._in_order is None:
            return "arrival"
        return "plan" if self._in_order.ordered else "plan, then arrival (hold-back bound passed)"

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
    def files_mapped(self) -> int:
        """Files the page-cache reader mapped under a read lease (0: runai read, or preadv without a lease)."""
        return getattr(self._streamer, "mapped_files", 0) if self._streamer is not None else self._files_mapped

    @property
    def held_peak_bytes(self) -> int:
        return 0 if self._in_order is None else self._in_order.peak_bytes

    @property
    def bytes_carried(self) -> int:
        """The tensor bytes that reached this rank: its plan's, plus the host's other ranks' (a carrier)."""
        return self.carrier.bytes

    @property
    def bytes_from_storage(self) -> Optional[int]:
        """What this rank read from storage itself (runai's partition share when distributed), or None."""
        return self._from_storage

    def _warn_if_unordered(self) -> None:
        if not self._in_order.ordered and not self._warned_unordered:
            self._warned_unordered = True
            if self._on_warning is not None:
                self._on_warning(
                    f"plan-order delivery from {self.plan.source} held more than {self._in_order._limit} bytes "
                    f"(MX_ROBUST_PLAN_ORDER_HOLD_BYTES); the rest arrives in arrival order"
                )

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
        # What arrived must be what the inspected header promised: a file rewritten under the
        # load with the same names but another dtype or shape never reaches the model.
        planned = self.__dict__.get("_planned")
        if planned is None:
            planned = self.__dict__["_planned"] = {
                n: (shard, info) for shard in self.plan.shards for n, info in shard.tensors.items()
            }
        if name in planned:
            shard, info = planned[name]
            wrong = _delivery_mismatch(info, tensor)
            if wrong:
                raise ContentMismatch(
                    f"tensor {name!r} from {shard.uri} arrived as {wrong}, but its header said "
                    f"{info.dtype}{list(info.shape)} ({info.nbytes} bytes) when inspected: the file changed "
                    "under the load, or the streamer misread it",
                    mutated=self.touched,
                )
        if self.content is not None:
            try:
                self.content.check(name, tensor)  # wrong bytes never reach the model
            except ContentMismatch as exc:
                exc.mutated = self.touched
                raise
        self.ledger.check_in(name)
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_delivered += nbytes
        if self.progress is not None:
            self.progress.add(planned[name][0].uri if name in planned else None, nbytes)
        return name, tensor

    def settle(self) -> None:
        """Apply the completeness policy; safe to call more than once."""
        if self._settled:
            return
        self._settled = True
        if self.ledger.complete and self.exhausted:
            return
        message = self.ledger.shortfall(self.plan.source)
        if not self.exhausted:
            message += " (the engine stopped reading before the stream ended)"
        if self.settings.completeness == "fail":
            raise IncompleteDelivery(message, mutated=self.touched)
        if self._on_warning is not None:
            self._on_warning(message)
