"""What the installed vLLM does around a draft's load, asked of vLLM itself.

vLLM's rules change between releases: which runner gives an MTP draft the
target's embedding (and at which pipeline-parallel sizes), whether an MTP
class refuses a load that misses a parameter, which method a registered
speculative method stands for. Each rule is read here, from the installed
vLLM's modules, classes and config objects, and from its version only where
nothing else answers. Planning, completeness, doctor and the tests ask these
functions; none of them writes a release's behaviour down again.

Unknown (no vLLM installed, a module that does not import) reads as the
conservative answer: stream the weight. Streaming a tensor the engine then
replaces costs bytes; skipping one it keeps loses a weight.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Optional

# The V1 proposer (vLLM <= 0.33): shares a draft's embedding at pipeline parallel 1 only
# (``LLMBaseProposer._maybe_share_embeddings``).
_V1_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
# The V2 runner's draft loading (vLLM >= 0.33; the only one in 0.34): ``maybe_share_target_embed`` also shares at
# pipeline parallel > 1 with a draft class that defines ``has_own_embed_tokens`` (eagle/utils.py, about line 97).
_V2_DRAFT_LOADING = "vllm.v1.worker.gpu.spec_decode.eagle.utils"
# vLLM 0.32 and 0.33: MTP classes (Step-3.5, Step5) raise in load_weights when a parameter, their embedding
# included, was not loaded; 0.34 deleted the module and the checks.
_MTP_COMPLETENESS = "vllm.model_executor.model_loader.mtp_validation"


@functools.lru_cache(maxsize=None)
def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def mtp_load_demands_every_parameter() -> bool:
    """Whether the installed vLLM's MTP classes refuse a load that leaves a parameter unloaded.

    True on vLLM 0.32 and 0.33 (``model_loader/mtp_validation.py`` exists): Step-3.5's and Step5's
    ``load_weights`` then need their embedding even where the proposer replaces it afterwards.
    """
    return _has_module(_MTP_COMPLETENESS)


def _shares_embedding_beyond_pp1() -> bool:
    """Whether the installed vLLM may give a draft the target's embedding at pipeline parallel > 1.

    Only where the V2 runner is the one runner drafts load on (vLLM 0.34): its ``maybe_share_target_embed``
    shares with a draft that has ``has_own_embed_tokens`` (False after its load) when the target's embedding
    is on the draft's stage. Where the V1 proposer is still there (0.32, 0.33), a draft may run on it, which
    shares at size 1 only. docs/engines.md and tests/test_engine_rules.py show it; planning does not rely on it
    (:func:`draft_embedding_replaced`).
    """
    return _has_module(_V2_DRAFT_LOADING) and not _has_module(_V1_PROPOSER)


def draft_embedding_replaced(pipeline_parallel_size: int, draft: Any) -> bool:
    """Whether the engine replaces an MTP draft's embedding with the target's after loading.

    ``draft``: the draft's class, or the built module (its instance value wins: MiniMax-M3's sets
    ``has_own_embed_tokens`` in ``__init__``). A draft that says ``has_own_embed_tokens = True`` keeps its own
    unless it equals the target's, which only its loaded values can tell: not replaced. Otherwise pipeline
    parallel 1: every runner shares.

    Larger sizes: not replaced, although vLLM 0.34's runner (:func:`shares_embedding_beyond_pp1`) shares there
    too with a draft that declares the attribute. Whether it does is decided by the module's state *after*
    its load: the Transformers backend's MTP classes and MiniMax-M3 set ``has_own_embed_tokens`` in
    ``load_weights`` from what they read, and without the target's embedding on the draft's stage the
    runner raises instead. Streaming the embedding there costs bytes; leaving it out could cost the weight.
    """
    if getattr(draft, "has_own_embed_tokens", False) is True:
        return False
    return pipeline_parallel_size <= 1


def eplb_local_experts(num_logical: int, num_redundant: int, ep_size: int, ep_rank: int) -> Optional[frozenset[int]]:
    """The logical (checkpoint) experts an expert-parallel rank loads under EPLB, by the installed vLLM's own rule.

    vLLM 0.34: ``compute_eplb_local_expert_ids`` (``model_loader/ep_weight_filter.py``): the rank's linear share
    of the physical slots (logical plus redundant), each filled from EPLB's initial placement; rebalancing
    later moves weights between devices, so a load only has to satisfy that map. None where the installed
    vLLM has no such rule (0.32, 0.33: every expert is read under EPLB), a placement that evolves at runtime
    (elastic expert parallel), or anything it cannot answer.
    """
    try:
        from vllm.model_executor.model_loader.ep_weight_filter import compute_eplb_local_expert_ids
    except Exception:  # noqa: BLE001 - no such rule in this vLLM
        return None
    try:
        from vllm.config import get_current_vllm_config

        # Elastic expert parallel: vLLM's loader filters nothing. Asked of the load's config (no config: no
        # answer, every expert is read).
        if getattr(get_current_vllm_config().parallel_config, "enable_elastic_ep", True):
            return None
        ids = compute_eplb_local_expert_ids(num_logical, num_redundant, ep_size, ep_rank)
    except Exception:  # noqa: BLE001 - the engine's rule could not answer: every expert is read
        return None
    return None if ids is None else frozenset(int(i) for i in ids)


def eplb_initial_placement(num_logical: int, num_redundant: int) -> Optional[list[int]]:
    """vLLM's initial physical -> logical expert map under EPLB (``EplbState``), or None where it has none."""
    try:
        from vllm.distributed.eplb.eplb_state import EplbState

        return [int(i) for i in EplbState.build_initial_global_physical_to_logical_map(num_logical, num_redundant)]
    except Exception:  # noqa: BLE001 - another vLLM: no answer
        return None


def draft_heads_replaced(draft: Any) -> bool:
    """Whether the engine replaces an MTP draft's head(s) (``lm_head``, each layer's ``shared_head.head``) with
    the target's after loading: unless the draft (its class, or the built module) says ``has_own_lm_head =
    True``, which keeps its own unless it equals the target's (0.33's ``_maybe_share_lm_head``, 0.34's
    ``share_target_lm_head``, at any pipeline-parallel size). A table row can also say so (``heads_kept``)."""
    return getattr(draft, "has_own_lm_head", False) is not True


def draft_class(architectures: tuple[str, ...]) -> Optional[type]:
    """The class vLLM's registry builds for a draft's architectures, or None (no vLLM, or it does not import)."""
    if not architectures:
        return None
    try:
        from vllm.model_executor.models import ModelRegistry
    except Exception:  # noqa: BLE001 - no vLLM here: no class to ask
        return None
    for architecture in architectures:
        try:
            cls = ModelRegistry._try_load_model_cls(architecture)
        except Exception:  # noqa: BLE001 - a class that does not import here answers nothing
            cls = None
        if cls is not None:
            return cls
    return None


def speculative_method(speculative_config: Any) -> Optional[str]:
    """The method a vLLM speculative config runs, a registered custom method as the method it stands for.

    vLLM 0.34 accepts any method registered through ``register_speculative_method``: ``method`` then holds
    the registered method's base method (or None) and ``custom_method`` the registered name
    (``config/speculative.py``). The base method decides where the draft's weights are (an ``mtp`` base:
    the target's checkpoint); a custom method with no base method reads as its registered name.
    """
    if speculative_config is None:
        return None
    method = getattr(speculative_config, "method", None)
    if isinstance(method, str) and method:
        return method
    custom = getattr(speculative_config, "custom_method", None)
    return custom if isinstance(custom, str) and custom else None
