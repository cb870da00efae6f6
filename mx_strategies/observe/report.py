"""The load report: what one load did, as data.

Every successful load of ``robust_model_streamer`` leaves a :class:`LoadReport`
in ``LoadResult.metadata["robust_model_streamer"]`` (as a dict) and in this
process's :func:`recent_reports`. The log line, the demo, the benchmark and
the end-to-end scripts read it; none of them parses log text or patches the
strategy's internals. In an engine worker, ``recent_reports()`` is what a
``collective_rpc`` call reads back.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the parts a report is built from (:func:`report_of`); none of them imported to run
    from ..inspect.sources import Rejection
    from ..plan.planning import PlannedLoad
    from ..stream.streaming import VerifiedStream

METADATA_KEY = "robust_model_streamer"
_RECENT_LIMIT = 32  # reports kept per process: a target, a draft and their retries fit many times over

_recent: deque[dict] = deque(maxlen=_RECENT_LIMIT)
_lock = threading.Lock()


@dataclass(frozen=True)
class LoadReport:
    """What one load did."""

    role: str  # "target" or "draft"
    rank: int
    source: str
    source_label: str  # "model_weights", "model", "MX_MODEL_URI" or "explicit"
    rejected: "tuple[Rejection, ...]"  # the candidates passed over, in the order they were probed
    convention: Optional[str]  # the draft naming convention that matched; None for a full load
    shards: tuple[str, ...]  # shard keys streamed, in plan order
    tensors: int
    bytes_streamed: int  # tensor bytes the plan delivered to this rank's model
    checkpoint_bytes: int  # tensor bytes in the whole checkpoint
    metadata_bytes: int  # header bytes the probe read
    distributed: bool
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds: resolve, stream, post_load, total
    # Tensors the selection picked and the model said it does not load (is_unused_checkpoint_weight): not streamed.
    unused_by_model: tuple[str, ...] = ()
    # A target's: the MTP draft's own tensors it left to the draft (mtp_table row ``architecture``).
    architecture: Optional[str] = None
    left_to_draft: int = 0
    left_to_draft_bytes: int = 0
    # Of bytes_streamed, what this rank read from storage itself (all of it unless distributed; its share of
    # runai's partition when distributed, the rest from the other ranks). None: runai did not say.
    bytes_from_storage: Optional[int] = None
    # Which source decided what was streamed (dry_run, table, convention, whole) and how it went.
    selection_source: str = "whole"
    module_class: str = ""  # the class asked (dry run), or the one that could not be asked
    selection_note: str = ""  # why the module could not be asked, when the table or a convention answered
    selection_seconds: float = 0.0
    selection_cached: bool = False
    left_out: int = 0  # checkpoint tensors of the chosen shards' set the module does not read (not streamed)
    left_out_bytes: int = 0
    # Left out because this rank's module does not hold them (another pipeline stage, another expert-parallel
    # rank), where a table row or a convention decided; the module's own answer leaves them out by itself.
    not_held: int = 0
    not_held_bytes: int = 0
    # The tensor bytes that reached this rank: bytes_streamed, plus the tensors of the other ranks of its host when
    # their shares differ (the host streams their union once; each rank feeds its model its own). None: as streamed.
    bytes_carried: Optional[int] = None
    # Read by runai while the module was asked (the head of the selection made without
    # asking, less what only the answer settles: mx_strategies.stream.read_ahead), and of
    # those the bytes the answered plan did not hold: dropped, never delivered.
    read_ahead_bytes: int = 0
    read_ahead_discarded_bytes: int = 0
    host_ranks: tuple[int, ...] = ()  # the ranks of this rank's host that streamed together (distributed)
    # Who reads what, in a distributed load: every rank's (rank, host, tensors, bytes), the same on every rank.
    ranks: tuple[tuple[int, str, int, int], ...] = ()
    # Who read the files (mx_strategies.stream.file_reader): runai, or the page-cache reader; and why.
    reader: str = "runai"
    reader_why: str = ""
    files_mapped: int = 0  # of them, files the page-cache reader mapped under a read lease (the rest: preadv)
    refit: bool = False  # a live model reloaded in place (ModelExpress 0.8's reload_model): ``source`` is the revision

    @property
    def bytes_arrived(self) -> int:
        """The tensor bytes that reached this rank, its own and those it carried for its host's other ranks."""
        return self.bytes_streamed if self.bytes_carried is None else self.bytes_carried

    @property
    def bytes_from_peers(self) -> Optional[int]:
        """What reached this rank from the other ranks of its host (runai's broadcast), not from storage."""
        return None if self.bytes_from_storage is None else max(self.bytes_arrived - self.bytes_from_storage, 0)

    def as_dict(self) -> dict:
        rejected = tuple(r.as_dict() for r in self.rejected)
        return {"outcome": "loaded", **asdict(self), "rejected": rejected, "bytes_from_peers": self.bytes_from_peers,
                "trail": self.trail()}  # fmt: skip

    def trail(self) -> str:
        return "; ".join([*(f"passed over {r}" for r in self.rejected), f"chose {self.source_label}={self.source!r}"])

    def summary(self) -> str:
        """The one log line a load ends with."""
        share = 100.0 * self.bytes_streamed / self.checkpoint_bytes if self.checkpoint_bytes else 0.0
        convention = f", convention {self.convention}" if self.convention else ""
        distributed = ", distributed" if self.distributed else ""
        if self.distributed and self.bytes_from_storage is not None:
            distributed += f" ({self.bytes_from_storage} read from storage, {self.bytes_from_peers} from the other ranks"
            if self.bytes_carried is not None and self.bytes_carried != self.bytes_streamed:
                distributed += f"; {self.bytes_carried - self.bytes_streamed} carried for ranks {list(self.host_ranks)}"
            distributed += ")"
        if self.not_held:
            distributed += f", {self.not_held} tensors ({self.not_held_bytes} bytes) held by other ranks"
        left = (
            f", {self.left_to_draft} tensors ({self.left_to_draft_bytes} bytes) left to the MTP draft "
            f"({self.architecture})"
            if self.left_to_draft
            else ""
        )
        if self.read_ahead_discarded_bytes:
            distributed += f", {self.read_ahead_discarded_bytes} bytes read ahead and dropped (not in the module's answer)"
        selection = ""
        if self.selection_source != "whole":
            selection = f", selection_source={self.selection_source}" + (" (kept answer)" if self.selection_cached else "")
        return (
            f"{self.role} {'refitted' if self.refit else 'loaded'} from {self.source_label}={self.source!r}{convention}: "
            f"{self.tensors} tensors verified, {self.bytes_streamed} of {self.checkpoint_bytes} "
            f"checkpoint bytes streamed ({share:.1f}%){distributed}{left}{selection}, read by {self.reader} "
            f"in {self.timings.get('total', 0.0):.2f}s"
        )


def planned_lines(load: "PlannedLoad") -> list[tuple[int, str]]:
    """A load's log lines before it streams, (level, message), from its own values: its source, what
    inspection noticed, the selection, and a host's union where the ranks' shares differ."""
    role, plan, carrier, shares = load.selection.role, load.plan, load.carrier, load.shares
    lines = [(logging.INFO, f"{role} source: {load.resolution.trail()}")]
    lines += [(logging.INFO, f"{p.kind}: {p.message}") for p in load.resolution.checkpoint.problems]
    from .selection_log import selection_lines

    lines += selection_lines(load.selection, len(plan.expected))
    if shares is not None and carrier is not None:
        lines.append((logging.INFO, (
            f"{role}: the ranks of this host ({list(shares.host_ranks)}) read different shares; streaming their "
            f"union once ({len(carrier.expected)} tensors, {carrier.bytes} bytes) and feeding this rank's model "
            f"its own {len(plan.expected)} ({plan.bytes} bytes)"
        )))  # fmt: skip
    return lines


def _timings(started: float, planned: float, streamed: float, finished: float, stream: "VerifiedStream") -> dict[str, float]:
    """A load's phases in seconds, from its clock readings (``time.perf_counter``) and the stream's own."""
    return {
        "resolve": planned - started,
        "stream": streamed - planned,
        "post_load": finished - streamed,  # on ModelExpress 0.8 from the end of load() to the end of finalize()
        "total": finished - started,
        "verify": stream.verify_seconds,  # verify and completeness lie inside stream
        "completeness": streamed - (stream.closed_at or streamed),
    }


def report_of(
    rank: int,
    load: "PlannedLoad",
    stream: "VerifiedStream",
    clock: tuple[float, float, float, float],
    refit: bool = False,
) -> LoadReport:
    """One load's report, from its typed parts: where it came from, what was selected and why, what the
    plan streamed (``load``: the resolution, selection, plan and rank shares the load planned), what the stream
    saw (``clock``: its readings started, planned, streamed and finished), and who read what."""
    from .selection_log import selection_fields

    resolution, selection, plan, shares = load.resolution, load.selection, load.plan, load.shares
    checkpoint = resolution.checkpoint
    return LoadReport(
        # where it came from
        role=selection.role, rank=rank, source=resolution.candidate.uri, source_label=resolution.candidate.label,
        rejected=tuple(resolution.rejected), checkpoint_bytes=checkpoint.data_bytes, metadata_bytes=checkpoint.metadata_bytes,
        **selection_fields(selection),  # what the selection decided, and what it left out
        # what the plan streamed, and what the stream saw
        shards=tuple(plan.shard_keys), tensors=len(plan.expected), bytes_streamed=plan.bytes,
        distributed=stream.distributed,
        bytes_from_storage=stream.bytes_from_storage, read_ahead_bytes=stream.read_ahead_bytes,
        read_ahead_discarded_bytes=stream.bytes_discarded, timings=_timings(*clock, stream), reader=stream.reader.reader,
        reader_why=stream.reader.why, files_mapped=stream.files_mapped,
        # who read what, in a distributed load
        bytes_carried=None if shares is None else stream.bytes_carried,
        host_ranks=() if shares is None else shares.host_ranks,
        ranks=() if shares is None else tuple((r.rank, r.host, r.tensors, r.bytes) for r in shares.ranks),
        refit=refit,
    )  # fmt: skip


@dataclass(frozen=True)
class LoadFailure:
    """A load the strategy gave up, as the chain was told (``StrategyFailed``)."""

    role: str
    rank: int
    error: str
    mutated: bool  # whether the model had been written to (the chain rebuilds it)

    def as_dict(self) -> dict:
        return {"outcome": "failed", **asdict(self)}


def record(report: "LoadReport | LoadFailure") -> dict:
    """Keep ``report`` in this process's recent reports; return it as a dict."""
    data = report.as_dict()
    with _lock:
        _recent.append(data)
    return data


def attach(report: LoadReport, *results: Any) -> dict:
    """Record ``report`` (:func:`record`) and put it in each result's ``metadata`` under :data:`METADATA_KEY`:
    the chain's envelope carries it, and so does the adapter's result where it made a new one."""
    entry = record(report)
    for result in results:
        result.metadata[METADATA_KEY] = entry
    return entry


def recent_reports() -> list[dict]:
    """This process's latest loads, oldest first (at most RECENT_LIMIT).

    Each is a dict with ``outcome`` "loaded" (a :class:`LoadReport`) or
    "failed" (a :class:`LoadFailure`).
    """
    with _lock:
        return [dict(r) for r in _recent]


def clear_reports() -> None:
    with _lock:
        _recent.clear()

