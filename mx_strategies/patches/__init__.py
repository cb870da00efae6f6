"""Compatibility patches that let ModelExpress's engine adapters run on the engine a user has.

Kept the way ModelExpress keeps its own (``modelexpress/engines/vllm/patches/``):
one module per patch, each a function that applies itself only where the
upstream code is broken (detected by behaviour, guarded by version), does
nothing when it works, is idempotent, and says once per process what it did.
The activation applies them (:func:`mx_strategies.activation.activate`) when
``MX_STRATEGY`` is set; with it unset nothing is patched.

| patch | covers | upstream |
|---|---|---|
| :mod:`.sglang_parallel_getters` | ModelExpress 0.7.x on SGLang >= 0.5.21 | SGLang 0.5.21 stopped exporting six getters ModelExpress's SglangAdapter calls |
| :mod:`.sglang_adapter_state` | ModelExpress 0.7.x and 0.8.x's SglangAdapter | no ``broadcast_state``/``all_gather_state``: ranks cannot share a load plan |
"""

from __future__ import annotations

from .sglang_adapter_state import patch_sglang_adapter_state
from .sglang_parallel_getters import patch_sglang_parallel_getters

_SGLANG_PATCHES = (patch_sglang_parallel_getters, patch_sglang_adapter_state)


def apply_sglang_patches() -> tuple[str, ...]:
    """Apply every SGLang patch that the installed versions need; the names of those applied now."""
    return tuple(patch.__name__ for patch in _SGLANG_PATCHES if patch())
