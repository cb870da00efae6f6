"""What the strategy needs to know about the engine, read defensively.

ModelExpress hands strategies a ``LoadContext``: the engine's own
``model_config``, an adapter (vLLM's ``VllmAdapter`` carries ``vllm_config``
and ``load_config``; SGLang's ``SglangAdapter`` SGLang's ``LoadConfig`` and
``ModelConfig``) and a ``SourceIdentity`` the adapter built, which holds the
parallel sizes for every engine. Every reader falls back to "unknown"
rather than failing: scripts give less than an engine.

:func:`engine_view` is the one place that decides which engine a load runs
in; the engine's reader (:mod:`.vllm`, :mod:`.sglang`) decides what a draft
is and whether it is an MTP draft, and returns the :class:`EngineView`
everything downstream reads.
"""

from __future__ import annotations

from typing import Any

from ..releases import ENGINES, SGLANG, TRTLLM, VLLM
from .sglang import bypassed_features, sglang_view, withhold_sglang_draft
from .view import (
    MTP_METHODS,
    EngineView,
    declared_unused,
    engine_of,
    held_names,
    loader_options,
    missing_hooks,
    model_identity,
)
from .vllm import is_speculative_draft, vllm_view


def engine_view(ctx: Any) -> EngineView:
    """The engine facts of this load, read by the reader of the engine it runs in."""
    return sglang_view(ctx) if engine_of(ctx) == SGLANG else vllm_view(ctx)
