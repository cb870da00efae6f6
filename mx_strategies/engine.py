"""What the strategy needs to know about the engine, read defensively.

ModelExpress hands strategies a ``LoadContext`` whose ``model_config`` is the
engine's own object and whose adapter may carry the engine config (vLLM's
``VllmAdapter.vllm_config``). SGLang and scripts give less; every reader here
falls back to "unknown" rather than failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

MTP_METHODS = ("mtp",)


@dataclass(frozen=True)
class EngineView:
    is_draft: bool
    speculative_method: Optional[str]
    target_uris: tuple[str, ...]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    hf_config: Any

    @property
    def is_mtp(self) -> bool:
        method = (self.speculative_method or "").lower()
        return method in MTP_METHODS or method.endswith("_mtp")


def _int(value: Any, default: int = 1) -> int:
    return value if isinstance(value, int) and value > 0 else default


def engine_view(ctx: Any) -> EngineView:
    """Read the draft marker, parallel sizes and the target's sources."""
    model_config = ctx.model_config
    vllm_config = getattr(getattr(ctx, "adapter", None), "vllm_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    speculative = getattr(vllm_config, "speculative_config", None)
    target = getattr(speculative, "target_model_config", None)
    target_uris = tuple(
        uri
        for uri in (getattr(target, "model_weights", None), getattr(target, "model", None))
        if isinstance(uri, str) and uri
    )
    return EngineView(
        # vLLM's marker for the draft pass of a speculative load.
        is_draft=getattr(model_config, "runner_type", None) == "draft",
        speculative_method=getattr(speculative, "method", None),
        target_uris=target_uris,
        tensor_parallel_size=_int(getattr(parallel, "tensor_parallel_size", 1)),
        pipeline_parallel_size=_int(getattr(parallel, "pipeline_parallel_size", 1)),
        hf_config=getattr(model_config, "hf_config", None),
    )
