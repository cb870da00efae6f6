"""Give ModelExpress's SGLang adapter the parallel-state getters SGLang 0.5.21 stopped exporting.

ModelExpress 0.7.x's ``SglangAdapter`` (``engines/sglang/adapter.py``) calls
``sglang.srt.distributed.get_world_group()``,
``get_tensor_model_parallel_rank()``, ``get_tensor_model_parallel_world_size()``,
``get_pipeline_model_parallel_rank()``, ``get_pipeline_model_parallel_world_size()``
and ``get_moe_expert_parallel_world_size()``. SGLang 0.5.21 deprecated them in
favour of ``sglang.srt.runtime_context.get_parallel()`` and left them out of
``parallel_state.__all__``, so the package no longer has them:

- ``build_sglang_load_context`` calls ``get_world_group()`` unguarded and raises
  ``AttributeError`` before any strategy runs (every ModelExpress load on
  SGLang >= 0.5.21, upstream's own included);
- the identity's parallel sizes are read under ``except Exception: return 1``,
  so a TP=8 load reports TP=1 and never streams distributed.

The patch puts each missing name back on ``sglang.srt.distributed``, answered
by ``get_parallel()`` (the replacement SGLang names in its deprecation
warning). A name SGLang still exports is left alone, so on SGLang <= 0.5.20
this does nothing; it is guarded to ModelExpress 0.7.x, the release whose
adapter makes these calls.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

from ._versions import installed, modelexpress_in

_logger = logging.getLogger("modelexpress.mx_strategies.patches")

# ModelExpress's name -> the field of SGLang's ParallelContext that answers it.
_GETTERS = {
    "get_world_group": "world_group",
    "get_tensor_model_parallel_rank": "tp_rank",
    "get_tensor_model_parallel_world_size": "tp_size",
    "get_pipeline_model_parallel_rank": "pp_rank",
    "get_pipeline_model_parallel_world_size": "pp_size",
    "get_moe_expert_parallel_world_size": "moe_ep_size",
}
_MARK = "__mx_strategies_patch__"


def _getter(name: str, field: str, get_parallel: Callable[[], Any]) -> Callable[[], Any]:
    def getter():
        return getattr(get_parallel(), field)

    getter.__name__ = name
    getter.__doc__ = f"SGLang's get_parallel().{field} (mx-strategies compatibility patch for ModelExpress 0.7)."
    setattr(getter, _MARK, True)
    return getter


def patch_sglang_parallel_getters() -> bool:
    """Restore the missing getters; True when this call added any."""
    if not modelexpress_in((0, 7), (0, 8)):
        return False
    try:
        distributed = importlib.import_module("sglang.srt.distributed")
        get_parallel = importlib.import_module("sglang.srt.runtime_context").get_parallel
    except (ImportError, AttributeError):
        return False  # no SGLang, or one from before get_parallel: its getters are exported
    missing = [name for name in _GETTERS if not callable(getattr(distributed, name, None))]
    if not missing:
        return False
    for name in missing:
        setattr(distributed, name, _getter(name, _GETTERS[name], get_parallel))
    version = ".".join(map(str, installed("sglang") or ())) or "unknown"
    _logger.info(
        f"mx-strategies: SGLang {version} does not export {', '.join(missing)} from sglang.srt.distributed, "
        f"which ModelExpress's SglangAdapter calls; provided them from sglang.srt.runtime_context.get_parallel()"
    )
    return True
