"""Feeding the model a verified stream, and checking what it kept: the engine's code runs only here.

:func:`deliver` hands the stream's tensors to the engine's own weight loading
(ModelExpress's ``apply_weight_iter``) while it watches what the model
reports loaded (:func:`.completeness.capture_loaded`) and what the load
really writes into every judged parameter (:mod:`.write_watch`), then settles
the stream (every expected tensor checked off) and runs every completeness
check (:func:`.completeness.check_all`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ..select import kept
from ..settings import RobustSettings
from . import completeness, write_watch
from .streaming import VerifiedStream


def deliver(
    stream: VerifiedStream,
    result: Any,
    apply: Callable[[Any, Iterator], Any],
    *,
    role: str,
    settings: RobustSettings,
    filled_by_engine: Callable[[str], bool],
    on_warning: Callable[[str], None],
) -> Any:
    """``apply(result, tensors)`` fed from ``stream``, watched and checked; returns what ``apply`` returned.

    Raises what the stream, the engine or the checks raise: robust's errors say whether the model was
    touched (``mutated``) before the engine holds the stream; after that (``stream.handed_over``) the caller counts every failure as mutated.
    """
    model = result.model
    judged = kept.judged_parameters(model, filled_by_engine) if model is not None else {}
    with stream:  # entering starts the stream and fetches the first tensor
        with completeness.capture_loaded(model) as loaded, write_watch.watched(model, judged) as written:
            result = apply(result, stream.tensors())
        stream.settle()
    completeness.check_all(result.model, loaded, judged, written.writes, role=role, policy=settings.model_completeness,
                           filled_by_engine=filled_by_engine, on_warning=on_warning)  # fmt: skip
    return result


__all__ = ["deliver"]
