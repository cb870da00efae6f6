"""A copy of mx_strategies/select/draft.py before issue 53 (test-only: the old naming conventions that
tests/test_draft_answerers.py compares the new table with)."""


from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mx_strategies.engine.config import LayerLayout
from mx_strategies.errors import DraftPlanError

from .config import layer_layout as read_layer_layout

NEXTN_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_predict")
RobustSettings = Any

LAYER_PREFIXES = ("model.layers.", "layers.", "model.language_model.layers.")
SHARED_WEIGHT_PATTERN = re.compile(r"(^|\.)(embed_tokens\.weight|lm_head\.weight)$")
# A draft's embedding or output head, at any depth (DeepSeek's per-layer embed_tokens and shared_head.head):
# the engine may fill it from the target's, which only the module's answer says.
EMBEDDING_OR_HEAD_PATTERN = re.compile(r"(^|\.)(embed_tokens|lm_head|head)\.weight$")


@dataclass
class DraftSelection:
    names: set[str]
    conventions: list[str]
    shared: set[str] = field(default_factory=set)

    @property
    def convention(self) -> str:
        return "+".join(self.conventions)


def layer_layout(*configs: Any) -> LayerLayout:
    """N and the NextN layer count for the conventions, each from the first config (the checkpoint's
    config.json, the engine's hf_config...) that knows it (:func:`..engine.config.layer_layout`)."""
    return read_layer_layout([(f"config {i + 1}", config) for i, config in enumerate(configs)], NEXTN_COUNT_KEYS)


def _nextn_prefixes(layout: LayerLayout) -> tuple[str, ...]:
    if not layout.first or not layout.count:
        return ()
    return tuple(
        f"{prefix}{layout.first + i}."
        for i in range(layout.count)
        for prefix in LAYER_PREFIXES
    )


def convention_prefixes(settings: RobustSettings, layout: LayerLayout) -> dict[str, tuple[str, ...]]:
    """Each enabled convention with the name prefixes it claims."""
    table = {
        "mtp": ("mtp.",),
        "nextn_layers": _nextn_prefixes(layout),
        "mtp_layers": ("model.mtp.layers.",),
    }
    prefixes = {name: table[name] for name in settings.draft_conventions}
    if settings.draft_extra_prefixes:
        prefixes["extra_prefixes"] = tuple(settings.draft_extra_prefixes)
    return prefixes


def describe_conventions(settings: RobustSettings, layout: LayerLayout) -> str:
    parts = []
    for name, prefixes in convention_prefixes(settings, layout).items():
        if prefixes:
            parts.append(f"{name} ({', '.join(p + '*' for p in prefixes[:3])}{', ...' if len(prefixes) > 3 else ''})")
        elif name == "nextn_layers" and layout.first == 0:
            parts.append(
                f"{name} (the draft's config says num_hidden_layers=0, as vLLM sets it for drafts that "
                "number their MTP layers from 0; the target's layer count is in the checkpoint's "
                "config.json, which could not be read)"
            )
        elif name == "nextn_layers":
            lacking = [
                key
                for key, value in (
                    ("num_hidden_layers", layout.first),
                    ("num_nextn_predict_layers", layout.count),
                )
                if value is None
            ]
            parts.append(f"{name} (needs {' and '.join(lacking)}, not found in the config)")
        else:
            parts.append(f"{name} (no prefix configured)")
    return "; ".join(parts)


def select_draft_tensors(
    names: set[str] | list[str],
    settings: RobustSettings,
    layout: LayerLayout,
    *,
    share_with_target: bool,
) -> DraftSelection:
    """Pick the draft's own tensors out of a checkpoint's tensor names."""
    selected: set[str] = set()
    matched: list[str] = []
    for convention, prefixes in convention_prefixes(settings, layout).items():
        if not prefixes:
            continue
        hits = {n for n in names if n.startswith(prefixes)}
        if hits:
            matched.append(convention)
            selected |= hits
    if not selected:
        raise DraftPlanError(
            f"no draft tensor found among {len(names)} tensors; conventions tried: "
            f"{describe_conventions(settings, layout)}"
        )
    shared: set[str] = set()
    if settings.draft_shared_weights == "always" or (
        settings.draft_shared_weights == "auto" and not share_with_target
    ):
        shared = {n for n in names if n not in selected and SHARED_WEIGHT_PATTERN.search(n)}
    return DraftSelection(selected | shared, matched, shared)
