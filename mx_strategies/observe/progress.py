"""Progress of a load while it streams: a line at INFO every few seconds and per shard.

A full-size checkpoint streams for minutes per rank. Without a word in
between, an operator watching a pod cannot tell a slow store from a hang.
While :class:`~.streaming.VerifiedStream` delivers tensors, each one is
counted here (:meth:`ProgressTracker.add`: the shard it came from and its
bytes), and :class:`ProgressLog` writes one line:

- every ``MX_ROBUST_PROGRESS_INTERVAL_S`` seconds (10 by default), from a
  daemon thread, so a stalled stream still says so (its rate falls, its ETA
  grows), and
- when a shard's last expected tensor arrived.

The line gives bytes done of planned, the rate, the ETA, shards done of
planned, and the source::

    [Worker 0] target streaming s3://models/tiny: 1.2 GB of 2.4 GB (50.0%), 1.1 GB/s, ETA 1s, 1 of 2 shards

Rank 0 writes it (the other ranks stream the same bytes at the same pace);
``MX_ROBUST_PROGRESS_INTERVAL_S=0`` turns the lines off. Where vLLM
shows its own progress bar (``use_tqdm_on_load`` in its load config, rank
0), a tqdm bar over the planned bytes is shown too. The lines go to the
logger ``modelexpress.strategy_robust_model_streamer.progress``; a test
suite that wants them quiet sets its level (tests/conftest.py does).

Counting a tensor is a dict lookup and two additions; the clock is read
only by the thread, so streaming pays nothing measurable (see
docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

_logger = logging.getLogger("modelexpress.strategy_robust_model_streamer.progress")

# vLLM's runai loader names its bar this way (weight_utils.runai_safetensors_weights_iterator).
_BAR_DESCRIPTION = "Loading safetensors using Runai Model Streamer (robust)"
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human_bytes(n: float) -> str:
    """Decimal units, three significant figures: 950 B, 1.20 kB, 12.4 MB, 689 GB."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            break
        value /= 1000
    if unit == "B":
        return f"{int(value)} B"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {unit}"


def _human_seconds(seconds: float) -> str:
    """``42s``, ``4m52s``, ``1h03m``."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{(whole % 3600) // 60:02d}m"


@dataclass(frozen=True)
class Progress:
    """One look at a load's progress."""

    source: str
    done_bytes: int
    planned_bytes: int
    shards_done: int
    shards_total: int
    seconds: float  # since streaming started

    @property
    def rate(self) -> float:
        """Bytes per second so far (0 before any time passed)."""
        return self.done_bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> Optional[float]:
        """Seconds left at the rate so far; None while nothing arrived."""
        if self.done_bytes >= self.planned_bytes:
            return 0.0
        rate = self.rate
        return (self.planned_bytes - self.done_bytes) / rate if rate > 0 else None

    @property
    def percent(self) -> float:
        return 100.0 * self.done_bytes / self.planned_bytes if self.planned_bytes else 100.0

    def text(self) -> str:
        eta = "unknown" if self.eta is None else _human_seconds(self.eta)
        return (
            f"{human_bytes(self.done_bytes)} of {human_bytes(self.planned_bytes)} ({self.percent:.1f}%), "
            f"{human_bytes(self.rate)}/s, ETA {eta}, {self.shards_done} of {self.shards_total} shards"
        )


class ProgressTracker:
    """Counts delivered tensors against the plan: bytes, and shards whose last expected tensor arrived.

    Fed ``(shard, nbytes)`` per tensor; ``shard`` is None for a tensor the
    plan does not name (its bytes count, it completes nothing). Pure: the
    clock is injected, nothing is logged.
    """

    def __init__(self, source: str, shards: Iterable[tuple[str, int, int]], *, clock: Callable[[], float] = time.monotonic) -> None:
        """``shards``: (shard, expected tensors, planned bytes) in plan order."""
        self.source = source
        self._clock = clock
        self._left: dict[str, int] = {}
        self.planned_bytes = 0
        self.shards_total = 0
        self.shards_done = 0
        for shard, tensors, nbytes in shards:
            self.planned_bytes += nbytes
            if tensors > 0:
                self.shards_total += 1
                self._left[shard] = tensors
        self.done_bytes = 0
        self.started = clock()

    def add(self, shard: Optional[str], nbytes: int) -> bool:
        """Count one delivered tensor; True when it was its shard's last expected one."""
        self.done_bytes += nbytes
        left = self._left.get(shard)
        if left is None:
            return False
        if left <= 1:
            del self._left[shard]
            self.shards_done += 1
            return True
        self._left[shard] = left - 1
        return False

    @property
    def complete(self) -> bool:
        """Everything planned arrived (bytes and every shard's tensors)."""
        return self.done_bytes >= self.planned_bytes and self.shards_done == self.shards_total

    def snapshot(self) -> Progress:
        seconds = self._clock() - self.started
        return Progress(self.source, self.done_bytes, self.planned_bytes, self.shards_done, self.shards_total, seconds)


class ProgressLog:
    """Writes a tracker's progress: per finished shard, every ``interval_s`` (a thread), and to a tqdm bar.

    ``emit`` receives each line (default: INFO on the progress logger); ``bar`` is
    a tqdm-like object (``update(n)``, ``close()``) or None.
    """

    def __init__(
        self,
        tracker: ProgressTracker,
        *,
        prefix: str = "",
        interval_s: float = 10.0,
        lines: bool = True,
        emit: Optional[Callable[[str], None]] = None,
        bar: Any = None,
    ) -> None:
        self.tracker = tracker
        self.prefix = prefix
        self.interval_s = interval_s
        self.lines = lines and interval_s > 0
        self._emit = emit or _logger.info
        self.bar = bar
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def line(self, note: str = "") -> str:
        text = f"{self.prefix}streaming {self.tracker.source}: {self.tracker.snapshot().text()}"
        return f"{text} ({note})" if note else text

    def add(self, shard: Optional[str], nbytes: int) -> None:
        """One delivered tensor (called by the stream for each)."""
        finished = self.tracker.add(shard, nbytes)
        if self.bar is not None:
            self.bar.update(nbytes)
        if finished and self.lines:
            self._emit(self.line(f"shard {shard.rsplit('/', 1)[-1]} done"))

    def beat(self) -> None:
        """The interval line (the thread's; a test calls it directly); none once everything arrived."""
        if self.lines and not self.tracker.complete:
            self._emit(self.line())

    def start(self) -> None:
        if not self.lines or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="mx-robust-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - a progress line never breaks a load
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        bar, self.bar = self.bar, None
        try:
            if bar is not None:
                bar.close()
        except Exception:  # noqa: BLE001 - a progress bar never breaks a load
            pass


def _plan_shards(plan: Any) -> list[tuple[str, int, int]]:
    """(shard URI, expected tensors, planned bytes) for each shard of a :class:`~.planning.LoadPlan`."""
    names = plan.names
    chosen = [[info for name, info in shard.tensors.items() if names is None or name in names] for shard in plan.shards]
    return [(shard.uri, len(infos), sum(info.nbytes for info in infos)) for shard, infos in zip(plan.shards, chosen)]


def _engine_shows_bar(ctx: Any) -> bool:
    """Whether the engine shows its own load progress bar here: ``use_tqdm_on_load``, on rank 0 (vLLM's rule)."""
    load_config = getattr(ctx, "load_config", None)
    return bool(getattr(load_config, "use_tqdm_on_load", False)) and getattr(ctx, "global_rank", 0) == 0


def _bar(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with the engines, not with us
        return None
    return tqdm(total=total, desc=_BAR_DESCRIPTION, unit="B", unit_scale=True, mininterval=2)  # as vLLM's bar


def for_load(plan: Any, settings: Any, ctx: Any, role: str) -> Optional[ProgressLog]:
    """The progress of this load, or None when this rank shows none (never raises)."""
    try:
        rank = getattr(ctx, "global_rank", 0)
        lines = settings.progress_interval_s > 0 and rank == 0
        show_bar = _engine_shows_bar(ctx)
        if not (lines or show_bar):
            return None
        tracker = ProgressTracker(plan.source, _plan_shards(plan))
        bar = _bar(tracker.planned_bytes) if show_bar else None
        return ProgressLog(
            tracker, prefix=f"[Worker {rank}] {role} ", interval_s=settings.progress_interval_s, lines=lines, bar=bar
        )
    except Exception as exc:  # noqa: BLE001 - progress is never worth a failed load
        _logger.debug(f"no progress for this load: {exc}")
        return None

