"""Failed loads, kept as the chain is told of them: in the load reports, the metrics and the traces."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from modelexpress.adapter import StrategyFailed

from ..engine import engine_view
from . import telemetry
from .report import LoadFailure, record


@contextmanager
def recorded_failures(ctx: Any) -> Iterator[None]:
    """Record every ``StrategyFailed`` raised inside (a :class:`.report.LoadFailure`, a failure metric and
    span), then let it go on to the chain."""
    started = time.perf_counter()
    try:
        yield
    except StrategyFailed as exc:
        role = engine_view(ctx).role
        record(LoadFailure(role, ctx.global_rank, str(exc), exc.mutated))
        telemetry.record_failure(exc, role, ctx.global_rank, mutated=exc.mutated, started=started)
        raise
