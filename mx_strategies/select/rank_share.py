"""A rank's share of the checkpoint, read from the structure of the module the engine built.

With pipeline parallel a stage holds its own decoder layers and the others
are placeholders (vLLM's and SGLang's ``PPMissingLayer``, vLLM's
``StageMissingLayer``): the model's ``load_weights`` skips every name under
them (vLLM's ``is_pp_missing_parameter``). With expert parallel each rank's
fused-MoE layers know their experts (vLLM's hold an ``expert_map``: global
expert id -> local slot, -1 for the experts of other ranks; SGLang's map ids
with ``_map_global_expert_id_to_local_expert_id``), and ``load_weights``
drops the other experts' tensors.

The dry run (:mod:`.module_reads`) sees both without being told. This module
is the fallback where the module cannot be asked and a table row or a
convention decides: the names a rank does not hold are taken out of the
plan, with the engine's own rules:

- a name under a missing layer (``name.startswith(layer + ".")``, exactly
  vLLM's ``get_pp_missing_layer_names``);
- a per-expert weight (``<moe>.<id>.<...>.weight`` or ``.weight_packed``)
  whose expert the module's ``expert_map`` gives to another rank. As vLLM's
  own filter (``model_loader/ep_weight_filter.py``), scales and other
  per-expert metadata stay. Under EPLB, whose redundant slots may hold any
  expert, the rank reads what the installed vLLM's own rule says it loads
  (0.34: the initial placement, :func:`.engine.vllm_rules.eplb_local_experts`),
  checked against the module's own slots; where vLLM has no such rule (0.32,
  0.33), every expert.

Pure reading: the model is not touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..engine import vllm_rules

_MISSING_LAYER_CLASSES = frozenset({"PPMissingLayer", "StageMissingLayer"})
_OTHER_STAGE = "another pipeline stage's layer (the module holds a PPMissingLayer there)"
_OTHER_EXPERT_RANK = "another expert-parallel rank's expert (the module's expert_map)"
# vLLM's ep_weight_filter skips only these: "scale tensors are tiny and some backends need them from ALL experts".
_HEAVY_SUFFIXES = (".weight", ".weight_packed")
_EXPERT_ID = re.compile(r"\.(\d+)\.")  # matched at the MoE path's end (pattern.match anchors at pos)


@dataclass(frozen=True)
class RankShare:
    """What the built module holds, as far as its structure says: missing layers and local experts."""

    missing_layers: tuple[str, ...] = ()  # module paths, each with its trailing "."
    # MoE module path (with its trailing ".") -> the global expert ids this rank holds
    local_experts: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        """True when the module holds every layer and every expert (nothing to leave out)."""
        return not self.missing_layers and not self.local_experts

    def why_not_held(self, name: str) -> Optional[str]:
        """Why this rank does not read checkpoint tensor ``name``, or None when it may."""
        if any(name.startswith(prefix) for prefix in self.missing_layers):
            return _OTHER_STAGE
        if not name.endswith(_HEAVY_SUFFIXES):
            return None
        for prefix, local in self.local_experts.items():
            if name.startswith(prefix):
                match = _EXPERT_ID.match(name, len(prefix) - 1)
                if match and int(match.group(1)) not in local:
                    return _OTHER_EXPERT_RANK
        return None


def _expert_map(module: Any) -> Optional[list[int]]:
    """The module's global -> local expert map as a list, or None (not an expert-parallel MoE layer, or one
    whose experts do not sit in the slots of their checkpoint ids: every expert is read).

    vLLM: the fused-MoE layer's ``expert_map`` tensor. SGLang 0.5.23 keeps no such map: its ``FusedMoE``
    (layers/moe/fused_moe_triton/layer.py) holds ``_num_local_routed`` routed experts from
    ``_expert_storage_rank`` on, and its ``weight_loader`` drops every expert for which
    ``_map_global_expert_id_to_local_expert_id`` answers -1 (:1153-1161, :1188-1194); the map is that
    method over ``range(num_experts)`` (fused shared experts map to local slots: every rank holds them).
    A served target's loader first maps each checkpoint (logical) expert to its physical slots through
    the global expert-location metadata (:1196-1233; ``ModelRunner.maybe_init_expert_location_metadata``
    sets it before loading). Logical and physical ids are one only under the trivial placement without
    redundant experts: with ``--ep-num-redundant-experts``, another ``--init-expert-location``, SGLang's
    EPLB, or a parameter that takes every expert (``_sglang_require_global_experts``), there is no map.
    """
    try:
        value = getattr(module, "expert_map", None)
    except Exception:  # noqa: BLE001 - a property of an engine class; reading it must never fail a load
        return None
    if value is not None:  # vLLM
        if not hasattr(value, "tolist"):
            return None
        try:
            return [int(v) for v in value.tolist()]
        except Exception:  # noqa: BLE001 - a meta tensor or another shape: no answer
            return None
    if not hasattr(module, "_num_local_routed"):  # not SGLang's FusedMoE
        return None
    try:  # SGLang
        local_of = getattr(module, "_map_global_expert_id_to_local_expert_id", None)
        experts, slots = getattr(module, "num_experts", None), getattr(module, "num_local_experts", None)
        if not callable(local_of) or not isinstance(experts, int) or not isinstance(slots, int):
            return None
        if any(getattr(p, "_sglang_require_global_experts", False) for p in module.parameters(recurse=False)):
            return None
        if getattr(module, "uses_expert_location", False) is True:  # a target: the placement must be trivial
            from sglang.srt.eplb.expert_location import get_global_expert_location_metadata
            from sglang.srt.runtime_context import get_exec

            moe = get_exec().moe
            if getattr(moe, "enable_eplb", False) or getattr(moe, "ep_num_redundant_experts", 0):
                return None
            metadata = get_global_expert_location_metadata()
            if metadata is not None:  # None: the loader maps checkpoint ids directly
                if metadata.num_physical_experts != metadata.num_logical_experts:
                    return None
                layer, table = getattr(module, "layer_id", None), metadata.physical_to_logical_map_cpu
                if not isinstance(layer, int):
                    return None
                # A layer past the table's (a draft's) gets SGLang's identity fallback (logical_to_all_physical).
                if layer < table.shape[0] and [int(v) for v in table[layer].tolist()] != list(range(table.shape[1])):
                    return None
        return [slot if 0 <= slot < slots else -1 for slot in (int(local_of(g)) for g in range(experts))]
    except Exception:  # noqa: BLE001 - another SGLang, or its runtime not set up: no answer, every expert read
        return None


def _eplb(module: Any) -> bool:
    """Whether the layer runs vLLM's expert-parallel load balancer (redundant slots may hold any expert)."""
    if getattr(module, "enable_eplb", False) is True:
        return True
    parallel = getattr(getattr(module, "moe_config", None), "moe_parallel_config", None)
    return getattr(parallel, "enable_eplb", False) is True


def _logical_experts(module: Any) -> int:
    return getattr(getattr(module, "moe_config", None), "num_logical_experts", 0) or 0


def _eplb_held(module: Any, mapping: list[int]) -> Optional[frozenset[int]]:
    """Under EPLB, the logical experts this rank's layer loads (vLLM's own rule), or None: every expert is read.

    The layer's ``expert_map`` covers the physical slots (logical plus redundant); its ``moe_config`` says how
    many are logical and which expert-parallel rank it is. vLLM's rule must agree with the slots the layer
    holds, each filled from vLLM's initial placement: where they differ (another placement, a padded
    capacity), nothing is left out.
    """
    config = getattr(module, "moe_config", None)
    parallel = getattr(config, "moe_parallel_config", None)
    logical = _logical_experts(module)
    ep_size, ep_rank = getattr(parallel, "ep_size", None), getattr(parallel, "ep_rank", None)
    if not (isinstance(logical, int) and 0 < logical <= len(mapping)) or not isinstance(ep_size, int) or not isinstance(
        ep_rank, int
    ):
        return None
    held = vllm_rules.eplb_local_experts(logical, len(mapping) - logical, ep_size, ep_rank)
    placement = vllm_rules.eplb_initial_placement(logical, len(mapping) - logical)
    if held is None or placement is None or len(placement) != len(mapping):
        return None
    in_slots = frozenset(placement[p] for p, slot in enumerate(mapping) if slot >= 0)
    return held if in_slots == held else None


def share_of(model: Any) -> RankShare:
    """The share of the checkpoint the built ``model`` holds, read from its structure (see the module docstring)."""
    named = getattr(model, "named_modules", None)
    if named is None:
        return RankShare()
    missing: list[str] = []
    local: dict[str, frozenset[int]] = {}
    for path, module in named():
        if type(module).__name__ in _MISSING_LAYER_CLASSES:
            if path:
                missing.append(path + ".")
            continue
        mapping = _expert_map(module)
        if mapping is None or not path:
            continue
        if _eplb(module):
            held = _eplb_held(module, mapping)
            if held is None:
                return RankShare(tuple(missing))  # as vLLM <= 0.33: read every expert under EPLB
            if len(held) < _logical_experts(module):
                local[path + "."] = held
            continue
        held = frozenset(g for g, slot in enumerate(mapping) if slot >= 0)
        if len(held) < len(mapping):
            local[path + "."] = held
    # A MoE layer nested in another (vLLM's FusedMoE and its routed_experts) is checked by its outer path.
    outer = {p: ids for p, ids in local.items() if not any(p != q and p.startswith(q) for q in local)}
    return RankShare(tuple(missing), outer)
