"""Give ModelExpress's ``SglangAdapter`` the rank collectives its vLLM adapter has.

``EngineAdapter.broadcast_state`` and ``all_gather_state`` default to the
one-process answers (``state``, ``(state,)``). ModelExpress 0.7.x's
``VllmAdapter`` overrides both over vLLM's world group; its ``SglangAdapter``
overrides neither. A strategy that plans on rank 0 and shares the plan
(robust with ``MX_MS_DISTRIBUTED`` at TP > 1, :mod:`mx_strategies.plan.distributed`)
then gets ``None`` on every rank but 0.

The patch defines both on ``SglangAdapter`` over SGLang's world group, as
vLLM's adapter does over vLLM's: ``broadcast_object`` from rank 0 and
``torch.distributed.all_gather_object`` on the group's CPU (gloo) group. Only
when the class has none of its own, so a ModelExpress that adds them keeps
its own; guarded to ModelExpress 0.7.x and 0.8.x (0.8.0.dev20261026's
SglangAdapter still has neither).
"""

from __future__ import annotations

import importlib
import logging

from ._versions import modelexpress_in

_logger = logging.getLogger("modelexpress.mx_strategies.patches")
_MARK = "__mx_strategies_patch__"


def _world_group():
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().world_group


def broadcast_state(self, state):
    """Rank 0's ``state`` on every rank, through SGLang's world group (mx-strategies patch)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return state
    return _world_group().broadcast_object(state, src=0)


def all_gather_state(self, state):
    """Every rank's ``state``, in rank order, over SGLang's world CPU group (mx-strategies patch)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return (state,)
    group = _world_group()
    states = [None] * group.world_size
    dist.all_gather_object(states, state, group=group.cpu_group)
    return tuple(states)


broadcast_state.__mx_strategies_patch__ = True
all_gather_state.__mx_strategies_patch__ = True


def patch_sglang_adapter_state() -> bool:
    """Define the two collectives on SglangAdapter where it lacks them; True when this call did."""
    if not modelexpress_in((0, 7), (0, 9)):
        return False
    try:
        from modelexpress.adapter import EngineAdapter

        adapter_cls = importlib.import_module("modelexpress.engines.sglang.adapter").SglangAdapter
        importlib.import_module("sglang.srt.runtime_context").get_parallel  # noqa: B018 - SGLang with get_parallel
    except (ImportError, AttributeError):
        return False
    added = []
    for name, function in (("broadcast_state", broadcast_state), ("all_gather_state", all_gather_state)):
        current = getattr(adapter_cls, name, None)
        if getattr(current, _MARK, False) or current is not getattr(EngineAdapter, name, None):
            continue  # ours already, or ModelExpress's own
        setattr(adapter_cls, name, function)
        added.append(name)
    if added:
        _logger.info(
            f"mx-strategies: ModelExpress's SglangAdapter has no {' or '.join(added)}; defined over SGLang's "
            f"world group (CPU group for gathers), as its VllmAdapter does over vLLM's"
        )
    return bool(added)
