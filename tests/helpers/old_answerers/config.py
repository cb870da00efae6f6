"""A copy of the config reading of mx_strategies/engine/config.py before issue 53 (test-only: what the old
answerers in this folder read N and the MTP layer count with). LayerLayout is the runtime's, so the old and
new layouts compare equal."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from mx_strategies.engine.config import LayerLayout


def config_get(config: Any, key: str) -> Any:
    if config is None:
        return None
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _config_value(config: Any, key: str, *, text_first: bool = False) -> Any:
    text = config_get(config, "text_config")
    for scope in (text, config) if text_first else (config, text):
        value = config_get(scope, key)
        if value is not None:
            return value
    return None


def _count(value: Any, least: int) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= least else None


def layer_layout(
    configs: Sequence[tuple[str, Any]], count_keys: Sequence[str], *, text_first: bool = False
) -> LayerLayout:
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
