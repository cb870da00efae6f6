"""SGLang's reader: the :class:`~.view.EngineView` of a load ModelExpress's ``SglangAdapter`` runs.

SGLang reaches ModelExpress through ``--load-format remote_instance
--remote-instance-weight-loader-backend modelexpress``: its
``RemoteInstanceModelLoader`` hands ``MxModelLoader`` the model it built and
its own ``ModelConfig``, for the target and (unless
``--speculative-draft-load-format`` says otherwise) for the draft. What
differs from vLLM, read from SGLang 0.5.23:

- the draft marker is ``ModelConfig.is_draft_model``; there is no
  ``runner_type`` and no ``speculative_config``;
- ``speculative_algorithm`` is ``"EAGLE"`` for NEXTN too (SGLang turns
  NEXTN into EAGLE), so the method alone does not say MTP: the draft's
  architecture does. ``ModelConfig._config_draft_model``
  (``sglang/srt/configs/model_config.py:1010``) rewrites ``architectures[0]``
  to the draft class (``DeepseekV3ForCausalLMNextN``, ``Qwen3NextForCausalLMMTP``,
  ``MiMoV2MTP``...) and keeps the target's ``model_type`` and
  ``num_hidden_layers``: N is read from the draft's own hf_config;
- the target's checkpoint is the server's ``model_path``; the draft's
  ``model_path`` is ``speculative_draft_model_path``, which SGLang defaults to
  the target's for DeepSeek and GLM;
- the parallel sizes are SGLang's ``get_parallel()`` (``runtime_context.py``),
  the identity's as a fallback;
- ``model_loader_extra_config`` is on SGLang's ``LoadConfig`` (JSON text from
  the CLI, parsed by ``LoadConfig.__post_init__``);
- under multi-layer EAGLE (MiMo-V2) each draft runner serves one MTP layer,
  ``LoadConfig.draft_model_idx`` (``managers/tp_worker.py:498, 519``), which
  SGLang's own iterator filters on (``model_loader/loader.py:739``).

SGLang's weight iterator does more than list shards, and robust streams
without it: :func:`bypassed_features` names what a model relies on that
robust would drop, so the load is refused before the model is touched.
"""

from __future__ import annotations

from typing import Any, Optional

from .view import SGLANG, EngineView, _parallel_size, _positive_int, _uris, loader_options, model_identity

# Suffixes of SGLang's MTP draft classes (model_config.py _config_draft_model): every SGLang MTP draft class
# robust knows ends with one (tests/test_sglang_plans.py holds the table's SGLang rows to it).
_MTP_ARCHITECTURE_SUFFIXES = ("NextN", "MTP", "Mtp")
# SGLang's speculative algorithms under which a draft may be an MTP draft (NEXTN arrives as EAGLE).
SGLANG_MTP_METHODS = ("eagle", "nextn", "mtp")


def _server_args() -> Optional[Any]:
    """SGLang's process-wide ServerArgs, or None (not set, or an SGLang without runtime_context)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:  # noqa: BLE001 - "Global server args is not set yet!", or no SGLang
        return None


def _parallel(field: str) -> Optional[int]:
    try:
        from sglang.srt.runtime_context import get_parallel

        return _positive_int(getattr(get_parallel(), field))
    except Exception:  # noqa: BLE001 - parallel state not initialised (scripts, tests without a group)
        return None


def _method_of(model_config: Any) -> Optional[str]:
    """SGLang's speculative algorithm, lower case (a string or its SpeculativeAlgorithm enum)."""
    algorithm = getattr(model_config, "speculative_algorithm", None)
    algorithm = getattr(algorithm, "name", algorithm)
    return algorithm.lower() if isinstance(algorithm, str) and algorithm else None


def _is_mtp_draft(is_draft: bool, method: Optional[str], architectures: tuple[str, ...]) -> bool:
    """An SGLang draft whose class reads its layers out of the target's checkpoint (NextN / MTP)."""
    if not is_draft or method not in SGLANG_MTP_METHODS or not architectures:
        return False
    return architectures[0].endswith(_MTP_ARCHITECTURE_SUFFIXES)


def sglang_view(ctx: Any) -> EngineView:
    """What robust needs from an SGLang load context."""
    model_config = ctx.model_config
    adapter = getattr(ctx, "adapter", None)
    is_draft = bool(getattr(model_config, "is_draft_model", False))
    method = _method_of(model_config) if is_draft else None
    hf_config = getattr(model_config, "hf_config", None)
    architectures, model_type = model_identity(hf_config)
    server = _server_args()
    load_config = getattr(adapter, "load_config", None) or getattr(ctx, "load_config", None)
    return EngineView(
        is_draft=is_draft,
        speculative_method=method,
        target_uris=_uris(getattr(server, "model_path", None)),
        tensor_parallel_size=_parallel("tp_size") or _parallel_size(ctx, None, "tensor_parallel_size"),
        pipeline_parallel_size=_parallel("pp_size") or _parallel_size(ctx, None, "pipeline_parallel_size"),
        hf_config=hf_config,
        loader_extra_config=loader_options(load_config),
        architectures=architectures,
        model_type=model_type,
        target_hf_config=None,  # SGLang's draft hf_config keeps the target's num_hidden_layers
        engine=SGLANG,
        mtp=_is_mtp_draft(is_draft, method, architectures),
        draft_layer=_index(getattr(load_config, "draft_model_idx", None)) if is_draft else None,
        draft_sources=_uris(getattr(model_config, "model_path", None)) if is_draft else (),
    )


def withhold_sglang_draft(ctx: Any, engine: EngineView) -> Optional[str]:
    """ModelExpress 0.7 builds an SGLang draft's identity from its model_path, the target's: published for
    peer-to-peer transfer, its tensors would be offered to peers as the target's (0.8 publishes drafts under
    a namespace). Switches the draft's publication off (``ctx.p2p_enabled``) and says so; None: nothing to do."""
    if not (engine.engine == SGLANG and engine.is_draft and getattr(ctx, "p2p_enabled", False)):
        return None
    ctx.p2p_enabled = False
    return (
        f"SGLang draft: not published for peer-to-peer transfer (ModelExpress gives it the target's identity, "
        f"model_path {getattr(ctx.model_config, 'model_path', None)!r})"
    )


def _index(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def bypassed_features(model: Any) -> list[str]:
    """What SGLang's iterator would give this model that a stream of one checkpoint cannot.

    ``secondary_weights``: extra sources a model lists (``DefaultModelLoader._get_all_weights``,
    ``model_loader/loader.py:759``; cosmos3 in 0.5.23), each with its own path and prefix.
    """
    secondary = getattr(model, "secondary_weights", None) if model is not None else None
    try:
        count = len(secondary) if secondary else 0
    except TypeError:
        count = 1
    if not count:
        return []
    return [
        f"{type(model).__name__}.secondary_weights lists {count} more weight source(s), which SGLang's own "
        f"loader reads after the checkpoint (model_loader/loader.py:759) and robust does not"
    ]
