"""What the strategy needs to know about the engine, read defensively.

ModelExpress hands strategies a ``LoadContext``: the engine's own
``model_config``, an adapter (vLLM's ``VllmAdapter`` carries ``vllm_config``
and ``load_config``; SGLang's its server args) and a ``SourceIdentity`` the
adapter built, which holds the parallel sizes for every engine. Every reader
here falls back to "unknown" rather than failing: SGLang and scripts give
less than vLLM.

This module is the one place that decides what a draft is (the same rule as
ModelExpress's vLLM adapter: a speculative config is present *and* the
model runs as the draft) and whether it is an MTP draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

MTP_METHODS = ("mtp",)


@dataclass(frozen=True)
class EngineView:
    """The engine facts a load plan depends on."""

    is_draft: bool
    speculative_method: Optional[str]
    target_uris: tuple[str, ...]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    hf_config: Any
    loader_extra_config: Mapping[str, Any] = None  # vLLM's model_loader_extra_config, {} when none
    # The draft's own architecture and model type, as vLLM's hf_config_override made them
    # (e.g. DeepSeekMTPModel / deepseek_mtp): what mtp_table matches a row on.
    architectures: tuple[str, ...] = ()
    model_type: Optional[str] = None
    # The target's hf_config: vLLM builds a draft with the target's VllmConfig
    # (llm_base_proposer.py:1266), so most MTP classes read N from it.
    target_hf_config: Any = None

    @property
    def role(self) -> str:
        return "draft" if self.is_draft else "target"

    @property
    def is_mtp(self) -> bool:
        """An MTP draft: its tensors live in the target's checkpoint (vLLM method ``mtp``, ``*_mtp``)."""
        method = (self.speculative_method or "").lower()
        return method in MTP_METHODS or method.endswith("_mtp")

    @property
    def shares_target_weights(self) -> bool:
        """Whether the engine gives the draft the target's embedding and head (pipeline parallel 1)."""
        return self.pipeline_parallel_size == 1


def _positive_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _parallel_size(ctx: Any, parallel: Any, field: str) -> int:
    """The adapter-built identity first (every engine), then vLLM's parallel config."""
    for source in (getattr(ctx, "identity", None), parallel):
        size = _positive_int(getattr(source, field, None))
        if size is not None:
            return size
    return 1


def is_speculative_draft(vllm_config: Any, model_config: Any) -> bool:
    """The draft pass of a speculative load (ModelExpress's rule: both markers)."""
    if getattr(vllm_config, "speculative_config", None) is None:
        return False
    return getattr(model_config, "runner_type", None) == "draft"


def model_identity(hf_config: Any) -> tuple[tuple[str, ...], Optional[str]]:
    """``(architectures, model_type)`` of an hf_config (object or mapping); empty when unknown."""
    if hf_config is None:
        return (), None
    get = hf_config.get if isinstance(hf_config, Mapping) else lambda key: getattr(hf_config, key, None)
    architectures = get("architectures")
    model_type = get("model_type")
    if not isinstance(architectures, (list, tuple)):
        architectures = ()
    return (
        tuple(a for a in architectures if isinstance(a, str)),
        model_type if isinstance(model_type, str) and model_type else None,
    )


def declared_unused(model: Any) -> Optional[Callable[[str], bool]]:
    """The model's own statement of checkpoint names it does not load, or None when it makes none.

    vLLM's ``is_unused_checkpoint_weight(name)`` (defined by Qwen3-Next's,
    Qwen3.5's, Nemotron-H's, DeepSeek-V3.2's and DeepSeek-V4's MTP classes in
    0.32; ``interfaces_base.py`` in 0.33). Only a method the model's class
    defines counts: a base default that answers False for every name says
    nothing. It is an upper bound: a name it calls unused is never loaded; a
    name it does not may still be skipped (embedding and head copies).
    """
    if model is None:
        return None
    owner = next((cls for cls in type(model).__mro__ if "is_unused_checkpoint_weight" in vars(cls)), None)
    if owner is None or owner.__module__.endswith("interfaces_base"):
        return None
    bound = getattr(model, "is_unused_checkpoint_weight")

    def unused(name: str) -> bool:
        try:
            return bool(bound(name))
        except Exception:  # noqa: BLE001 - a model that cannot answer makes no statement about the name
            return False

    return unused


def held_names(model: Any) -> Optional[frozenset[str]]:
    """Every name the built model holds a parameter or buffer under (aliases included), or None.

    The model's structure is the last word on whether a checkpoint tensor can
    be its: a target that holds a parameter under an MTP layer's prefix keeps
    that layer in its plan (``planning.target_selection``).
    """
    if not hasattr(model, "named_parameters"):
        return None
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    names |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    return frozenset(names)


def engine_view(ctx: Any) -> EngineView:
    """Read the draft marker, parallel sizes, the target's sources and loader options."""
    model_config = ctx.model_config
    adapter = getattr(ctx, "adapter", None)
    vllm_config = getattr(adapter, "vllm_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    speculative = getattr(vllm_config, "speculative_config", None)
    target = getattr(speculative, "target_model_config", None)
    target_uris = tuple(
        uri
        for uri in (getattr(target, "model_weights", None), getattr(target, "model", None))
        if isinstance(uri, str) and uri
    )
    load_config = getattr(adapter, "load_config", None) or getattr(vllm_config, "load_config", None)
    extra = getattr(load_config, "model_loader_extra_config", None)
    hf_config = getattr(model_config, "hf_config", None)
    architectures, model_type = model_identity(hf_config)
    target_hf_config = getattr(target, "hf_config", None)
    if target_hf_config is None and getattr(vllm_config, "model_config", None) is not model_config:
        target_hf_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    return EngineView(
        is_draft=is_speculative_draft(vllm_config, model_config),
        speculative_method=getattr(speculative, "method", None),
        target_uris=target_uris,
        tensor_parallel_size=_parallel_size(ctx, parallel, "tensor_parallel_size"),
        pipeline_parallel_size=_parallel_size(ctx, parallel, "pipeline_parallel_size"),
        hf_config=hf_config,
        loader_extra_config=dict(extra) if isinstance(extra, Mapping) else {},
        architectures=architectures,
        model_type=model_type,
        target_hf_config=target_hf_config,
    )
