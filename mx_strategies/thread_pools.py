"""Work a load's thread hands to a thread pool, seen by what watches that thread.

Torch function modes are per thread, and engines' loaders hand work to a
``ThreadPoolExecutor`` (SGLang's DeepSeek loader submits each
``weight_loader`` call). The dry run (:mod:`.dry_run`) runs such work inline,
so its recorder sees it; the write watch (:func:`.verify.after.watched`) runs it in the
pool under a watch of its own. Both go through :func:`submits_from_this_thread`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# submit(real_submit, pool, fn, *args, **kwargs) -> Future
_Submit = Callable[..., "concurrent.futures.Future[Any]"]


@contextmanager
def submits_from_this_thread(submit: _Submit) -> Iterator[None]:
    """While open, ``ThreadPoolExecutor.submit`` called from this thread goes through ``submit``.

    ``submit`` gets the real ``submit`` first, then the pool, the function and
    its arguments. Other threads' pools are left alone; the real method is
    back when the block ends, however it ends.
    """
    me = threading.get_ident()
    real_submit = concurrent.futures.ThreadPoolExecutor.submit

    def routed(pool, fn, /, *args, **kwargs):
        if threading.get_ident() != me:
            return real_submit(pool, fn, *args, **kwargs)
        return submit(real_submit, pool, fn, *args, **kwargs)

    concurrent.futures.ThreadPoolExecutor.submit = routed
    try:
        yield
    finally:
        concurrent.futures.ThreadPoolExecutor.submit = real_submit


def run_inline(real_submit, pool, fn, /, *args, **kwargs) -> "concurrent.futures.Future[Any]":
    """A :data:`Submit` that runs the work in the submitting thread, its result or error in the future."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - delivered through the future, as the pool would
        future.set_exception(exc)
    return future
