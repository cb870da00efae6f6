"""What a load plan needs to know about the engine, as one value: :class:`EngineView`.

Each engine's reader (:mod:`.vllm`, :mod:`.sglang`) makes one from ModelExpress's
``LoadContext``; everything downstream (the selection, completeness, the strategy,
doctor) reads the view, never the engine's objects. The helpers here are the
parts every reader shares, and what the model itself says (``declared_unused``,
``held_names``).
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..releases import SGLANG, TRTLLM, VLLM
from .config import config_get

MTP_METHODS = ("mtp",)


def is_mtp_method(method: Optional[str], methods: tuple[str, ...] = MTP_METHODS) -> bool:
    """Whether speculative ``method`` runs an MTP draft, whose tensors live in the target's checkpoint: one of
    ``methods`` (vLLM's ``mtp``; a table row's own, such as ``dspark``) or any ``*_mtp``."""
    method = (method or "").lower()
    return method in methods or method.endswith("_mtp")


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
    # Which engine's classes load the model: picks the mtp_table rows (vLLM's or SGLang's).
    engine: str = VLLM
    # The engine reader's verdict on an MTP draft; None: vLLM's rule on the method (is_mtp).
    mtp: Optional[bool] = None
    # The one MTP layer this draft runner serves (SGLang's LoadConfig.draft_model_idx, multi-layer EAGLE).
    draft_layer: Optional[int] = None
    # Where the engine points the draft itself (its ModelConfig's model_weights and model): for an MTP or a
    # DeepSeek-V4 DSpark draft, the target's sources (vLLM's SpeculativeConfig), for EAGLE its own checkpoint.
    draft_sources: tuple[str, ...] = ()
    # The engine's answer (vLLM: :mod:`.vllm_rules`) to whether it gives this draft the target's embedding
    # (and head) after loading; None: pipeline parallel 1 does, larger sizes do not (every engine's base rule).
    embed_replaced: Optional[bool] = None
    # The engine's answer to whether it gives this draft the target's head(s) after loading (vLLM: the draft's
    # has_own_lm_head, :func:`.vllm_rules.draft_heads_replaced`); None: the table row's rule alone.
    heads_replaced: Optional[bool] = None
    # Whether the engine's MTP classes refuse a load that leaves a parameter unloaded (vLLM 0.32 and 0.33,
    # :func:`.vllm_rules.mtp_load_demands_every_parameter`): a row's ``embed_required`` holds only there.
    mtp_load_checks: bool = True

    @property
    def role(self) -> str:
        return "draft" if self.is_draft else "target"

    @property
    def is_mtp(self) -> bool:
        """An MTP draft: its tensors live in the target's checkpoint (vLLM method ``mtp``, ``*_mtp``)."""
        return self.mtp if self.mtp is not None else is_mtp_method(self.speculative_method)

    @property
    def shares_target_weights(self) -> bool:
        """Whether the engine gives the draft the target's embedding and head after loading.

        The engine reader's answer (:attr:`embed_replaced`), else pipeline parallel 1 only."""
        return self.embed_replaced if self.embed_replaced is not None else self.pipeline_parallel_size == 1


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


def _uris(*values: Any) -> tuple[str, ...]:
    """The paths among a config's ``values`` (non-empty strings; None and the rest are no source)."""
    return tuple(value for value in values if isinstance(value, str) and value)


def model_identity(hf_config: Any) -> tuple[tuple[str, ...], Optional[str]]:
    """``(architectures, model_type)`` of an hf_config (object or mapping); empty when unknown."""
    if hf_config is None:
        return (), None
    architectures = config_get(hf_config, "architectures")
    model_type = config_get(hf_config, "model_type")
    named = tuple(a for a in architectures if isinstance(a, str)) if isinstance(architectures, (list, tuple)) else ()
    return named, model_type if isinstance(model_type, str) and model_type else None


# The model hooks that name checkpoint tensors the model does not load, each ``(self, name) -> bool``: vLLM's
# ``is_unused_checkpoint_weight`` (its loader skips shards holding only such names), and ``skip_checkpoint_weight``
# (vLLM PR #58016, shipped by forks: its loader drops such tensors before reading them; a fork's model may raise
# when one reaches its load_weights).
_UNUSED_HOOKS = ("is_unused_checkpoint_weight", "skip_checkpoint_weight")


def declared_unused(model: Any) -> Optional[Callable[[str], bool]]:
    """The model's own statement of checkpoint names it does not load, or None when it makes none.

    Any of :data:`UNUSED_HOOKS` the model's class defines: vLLM's
    ``is_unused_checkpoint_weight(name)`` (defined by Qwen3-Next's, Qwen3.5's,
    Nemotron-H's, DeepSeek-V3.2's and DeepSeek-V4's MTP classes in 0.32;
    ``interfaces_base.py`` in 0.33) and ``skip_checkpoint_weight(name)``; a
    name either calls unused is unused. Only a method the model's class
    defines counts: a base default that answers False for every name says
    nothing. It is an upper bound: a name it calls unused is never loaded; a
    name it does not may still be skipped (embedding and head copies).
    """
    if model is None:
        return None
    hooks = []
    for hook in _UNUSED_HOOKS:
        owner = next((cls for cls in type(model).__mro__ if hook in vars(cls)), None)
        if owner is not None and not owner.__module__.endswith("interfaces_base"):
            hooks.append(getattr(model, hook))
    if not hooks:
        return None

    def unused(name: str) -> bool:
        for bound in hooks:
            try:
                if bound(name):
                    return True
            except Exception:  # noqa: BLE001 - a model that cannot answer makes no statement about the name
                continue
        return False

    return unused


def held_names(model: Any) -> Optional[frozenset[str]]:
    """Every name the built model holds a parameter or buffer under (aliases included), or None.

    The model's structure is the last word on whether a checkpoint tensor can
    be its: a target that holds a parameter under an MTP layer's prefix keeps
    that layer in its plan (``selection.select``).
    """
    if not hasattr(model, "named_parameters"):
        return None
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return frozenset(name for name, _ in named)


def engine_of(ctx: Any) -> str:
    """The engine a context comes from: its adapter's package, else the identity's backend framework."""
    module = type(getattr(ctx, "adapter", None)).__module__ or ""
    for name in (SGLANG, TRTLLM, VLLM):
        if module.startswith(f"modelexpress.engines.{name}."):
            return name
    framework = getattr(getattr(ctx, "identity", None), "backend_framework", 0)
    return {2: SGLANG, 3: TRTLLM}.get(framework if isinstance(framework, int) else 0, VLLM)


def loader_options(load_config: Any) -> dict:
    """``model_loader_extra_config`` as a dict ({} when none; SGLang's CLI gives it as JSON text)."""
    extra = getattr(load_config, "model_loader_extra_config", None)
    if isinstance(extra, str) and extra.strip():
        import json

        try:
            extra = json.loads(extra)
        except ValueError:
            return {}
    return dict(extra) if isinstance(extra, Mapping) else {}






# ModelExpress's adapter class for each engine: what a strategy's ``requires`` is checked against.
_ADAPTER_CLASSES = {
    VLLM: ("modelexpress.engines.vllm.adapter", "VllmAdapter"),
    SGLANG: ("modelexpress.engines.sglang.adapter", "SglangAdapter"),
    TRTLLM: ("modelexpress.engines.trtllm.adapter", "TrtllmAdapter"),
}


def missing_hooks(engine: str, requires: tuple) -> Optional[list[str]]:
    """The ``requires`` hooks the installed ModelExpress's adapter for ``engine`` does not override.

    ModelExpress's own rule (``LoadStrategy.is_available``): a strategy runs only where
    the adapter's class overrides every method it requires. None when the adapter
    cannot be imported. TensorRT-LLM's adapter in ModelExpress 0.7.0 overrides neither
    ``apply_weight_iter`` nor ``build_model_streamer_weight_iter``: neither robust nor
    upstream ``model_streamer`` is ever offered there.
    """
    import importlib

    module_name, class_name = _ADAPTER_CLASSES[engine]
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception:  # noqa: BLE001 - an adapter that does not import offers nothing
        return None
    return [hook.__name__ for hook in requires if getattr(cls, hook.__name__, hook) is hook]
