"""vLLM's reader: the :class:`~.view.EngineView` of a load ModelExpress's ``VllmAdapter`` runs.

A draft is what ModelExpress's vLLM adapter calls one: a speculative config
is present *and* the model runs as the draft; the speculative method says
MTP. Scripts and stand-in adapters without ``vllm_config`` read as vLLM
targets, with the identity's parallel sizes.
"""

from __future__ import annotations

from typing import Any

from . import vllm_rules
from .view import EngineView, _parallel_size, _uris, engine_of, loader_options, model_identity


def is_speculative_draft(vllm_config: Any, model_config: Any) -> bool:
    """The draft pass of a speculative load (ModelExpress's rule: both markers)."""
    if getattr(vllm_config, "speculative_config", None) is None:
        return False
    return getattr(model_config, "runner_type", None) == "draft"


def vllm_view(ctx: Any) -> EngineView:
    """vLLM's draft marker, parallel sizes, the target's sources and loader options (also scripts')."""
    model_config = ctx.model_config
    adapter = getattr(ctx, "adapter", None)
    vllm_config = getattr(adapter, "vllm_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    speculative = getattr(vllm_config, "speculative_config", None)
    target = getattr(speculative, "target_model_config", None)
    load_config = getattr(adapter, "load_config", None) or getattr(vllm_config, "load_config", None)
    hf_config = getattr(model_config, "hf_config", None)
    architectures, model_type = model_identity(hf_config)
    target_hf_config = getattr(target, "hf_config", None)
    if target_hf_config is None and getattr(vllm_config, "model_config", None) is not model_config:
        target_hf_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    is_draft = is_speculative_draft(vllm_config, model_config)
    pipeline_parallel_size = _parallel_size(ctx, parallel, "pipeline_parallel_size")
    # The installed vLLM and the draft's class decide whether the engine gives the draft the target's embedding
    # and head(s).
    draft_cls = vllm_rules.draft_class(architectures) if is_draft else None
    embed_replaced = vllm_rules.draft_embedding_replaced(pipeline_parallel_size, draft_cls) if is_draft else None
    heads_replaced = vllm_rules.draft_heads_replaced(draft_cls) if draft_cls is not None else None
    return EngineView(
        is_draft=is_draft,
        speculative_method=vllm_rules.speculative_method(speculative),
        target_uris=_uris(getattr(target, "model_weights", None), getattr(target, "model", None)),
        tensor_parallel_size=_parallel_size(ctx, parallel, "tensor_parallel_size"),
        pipeline_parallel_size=pipeline_parallel_size,
        hf_config=hf_config,
        loader_extra_config=loader_options(load_config),
        architectures=architectures,
        model_type=model_type,
        target_hf_config=target_hf_config,
        engine=engine_of(ctx),
        draft_sources=_uris(getattr(model_config, "model_weights", None), getattr(model_config, "model", None))
        if is_draft else (),
        embed_replaced=embed_replaced,
        heads_replaced=heads_replaced,
        mtp_load_checks=vllm_rules.mtp_load_demands_every_parameter(),
    )
