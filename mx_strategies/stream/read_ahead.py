"""runai reading the head of a load while the module is asked (the strategy decides what: the head of the
selection made without asking, less :attr:`..select.selection.Selection.uncertain`).

:class:`ReadAhead` owns a runai streamer started on the foreseen plan's
head, before the question; runai's ring fills without Python (its buffers,
bounded by ``RUNAI_STREAMER_MEMORY_LIMIT``, wait for a consumer). Nothing is
taken from it until :class:`.streaming.VerifiedStream` has the answered plan:
it admits what that plan holds and drops the rest. A read-ahead is only ever
a head start: one that cannot start is logged and the load streams as it
would have; one never used is closed with the model untouched.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

import torch

from ..settings import RobustSettings
from .runai_env import claim_backend, streamer_environment, streamer_variables

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan


class ReadAhead:
    """A runai stream of ``head`` started now and consumed later, once; a context manager owning it."""

    def __init__(
        self,
        head: Optional[LoadPlan],
        settings: RobustSettings,
        *,
        loader_extra_config: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.plan = head
        self.variables = streamer_variables(settings, loader_extra_config)  # the stream warns of overrides
        self.failed: Optional[str] = None  # why it did not start
        self.started_at: Optional[float] = None
        self._env = None
        self._streamer = None
        self._iter: Optional[Iterator[tuple[str, torch.Tensor]]] = None

    @property
    def live(self) -> bool:
        """Started, and not yet taken or closed."""
        return self._iter is not None

    @property
    def bytes(self) -> int:
        """The tensor bytes it reads (0: none, it did not start)."""
        return self.plan.bytes if self.started_at is not None and self.plan is not None else 0

    def __enter__(self) -> "ReadAhead":
        if self.plan is None or not self.plan.shards:
            return self
        from .runai_plan import PlannedStreamer  # imports runai, which a plan-only caller never needs

        try:
            claim_backend(self.plan.source, self.plan.uris)
            self._env = streamer_environment(self.variables)
            self._env.__enter__()
            self._streamer = PlannedStreamer().__enter__()
            self._streamer.stream_plan(self.plan, device="cpu")
            self._iter = self._streamer.get_tensors()
            self.started_at = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - a head start only: the load streams without it
            self.failed = f"{type(exc).__name__}: {exc}"
            self.close()
        return self

    def take(self) -> Iterator[tuple[str, torch.Tensor]]:
        """runai's tensors of the head, in arrival order; taken once, by the stream that admits them."""
        if self._iter is None:
            raise RuntimeError("ReadAhead is not started, or already taken")
        tensors, self._iter = self._iter, None
        return tensors

    def close(self) -> None:
        """Stop runai's reads and free its buffers (the runai variables stay set until the context ends,
        so a stream started inside it keeps them)."""
        self._iter = None
        if self._streamer is not None:
            streamer, self._streamer = self._streamer, None
            streamer.__exit__(None, None, None)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        finally:
            if self._env is not None:
                self._env.__exit__(None, None, None)
                self._env = None


__all__ = ["ReadAhead"]
