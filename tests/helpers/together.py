"""Jobs of a test module that run side by side: as many at once as this process has cores.

Each job is a subprocess-driven check (a conformance child, a pair of rank
processes) that spends most of its time in one Python process starting and
importing: two of them side by side take little longer than one. The first
test that asks for a job starts every job the session collected for the
module, in the order given; each test then waits for its own. What a job
returns or raises reaches the test that asks for it, unchanged, so a job's
verdict does not depend on what ran beside it. On a one-core machine the
jobs run one at a time.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class Together:
    def __init__(self, jobs: dict[str, Callable[[], Any]], workers: int = 0) -> None:
        self._jobs = dict(jobs)
        self._workers = workers or max(1, min(2, len(os.sched_getaffinity(0))))
        self._futures: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def result(self, name: str) -> Any:
        """The job's return value (its exception is raised here)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="together")
                # The asked-for job first, then the rest in the order given.
                for job in [name] + [n for n in self._jobs if n != name]:
                    self._futures[job] = self._pool.submit(self._jobs[job])
        return self._futures[name].result()

    def close(self) -> None:
        """Wait for every started job (their processes must end before the module's fixtures go)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def collected_params(request, name: str) -> list:
    """The values of parameter ``name`` in this module's collected tests that are not marked skip, in collection
    order, once each."""
    seen: list = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("skip") is not None:
            continue
        if item.module is request.module and callspec is not None and name in callspec.params:
            if callspec.params[name] not in seen:
                seen.append(callspec.params[name])
    return seen
