"""Reading a model's config: one reader for config.json (a mapping) and the engine's ``hf_config`` (an object).

A value sits at the top level or, for multimodal classes, in ``text_config``;
which comes first depends on which the model class reads (:func:`config_value`).
The layer layout (N, the number of MTP layers, and where each was read) is
read from a list of configs in priority order (:func:`layer_layout`): the
table's rows, the generic conventions and doctor all ask it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence


def config_get(config: Any, key: str) -> Any:
    """``key`` at the top level of ``config`` (a mapping or an object); None where it is absent."""
    if config is None:
        return None
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _config_value(config: Any, key: str, *, text_first: bool = False) -> Any:
    """``key`` of ``config`` at its top level or in its ``text_config``, the first that has it (the text
    config first where the model class reads its text model's values: ``text_first``)."""
    text = config_get(config, "text_config")
    for scope in (text, config) if text_first else (config, text):
        value = config_get(scope, key)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class LayerLayout:
    """N (the first MTP layer's index: the target's layer count), the number of MTP layers, and where each
    was read (for messages and doctor)."""

    first: Optional[int]
    count: Optional[int]
    first_from: str = field(default="not found", compare=False)
    count_from: str = field(default="not found", compare=False)

    def indices(self, built: Optional[int] = None) -> list[int]:
        """The MTP layers' indices, at most ``built`` of them (a class that builds fewer than the config has)."""
        if self.first is None or self.count is None:
            return []
        return [self.first + i for i in range(self.count if built is None else min(self.count, built))]

    def for_runner(self, index: int) -> "LayerLayout":
        """The layout of the draft runner that serves MTP layer ``index`` alone (SGLang's draft_model_idx)."""
        if self.first is None or self.count is None:
            return self
        return LayerLayout(self.first + index, max(self.count - index, 0), self.first_from, self.count_from)


def _count(value: Any, least: int) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= least else None


def layer_layout(
    configs: Sequence[tuple[str, Any]], count_keys: Sequence[str], *, text_first: bool = False
) -> LayerLayout:
    """N and the MTP layer count from ``(label, config)`` pairs in priority order, each value from the first
    config that knows it; a later config's real N (> 0) beats an earlier 0 (vLLM gives some drafts
    ``num_hidden_layers=0``). The count is the first positive value of ``count_keys``."""
    first = count = None
    first_from = count_from = "not found"
    for label, config in configs:
        value = _count(_config_value(config, "num_hidden_layers", text_first=text_first), 0)
        if value is not None and (first is None or first == 0 < value):
            first, first_from = value, f"num_hidden_layers of {label}"
        for key in count_keys if count is None else ():
            value = _count(_config_value(config, key, text_first=text_first), 1)
            if value is not None:
                count, count_from = value, f"{key} of {label}"
                break
    return LayerLayout(first, count, first_from, count_from)
