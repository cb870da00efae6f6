"""The SGLang compatibility patches (mx_strategies/patches): they apply where ModelExpress 0.7's adapter is
broken on the installed SGLang, do nothing where it is not, and never twice.

Run against SGLang 0.5.23 and ModelExpress 0.7.0 themselves; what is changed between cases is the
state those packages are in (a getter present, an adapter with its own collectives, another
ModelExpress version), each restored by monkeypatch.
"""

from __future__ import annotations

import sglang.srt.distributed as distributed
from modelexpress.adapter import EngineAdapter
from modelexpress.engines.sglang.adapter import SglangAdapter

from mx_strategies.patches import _versions, apply_sglang_patches, sglang_adapter_state, sglang_parallel_getters
from mx_strategies.patches.sglang_parallel_getters import _GETTERS, patch_sglang_parallel_getters
from mx_strategies.patches.sglang_adapter_state import patch_sglang_adapter_state


# ModelExpress 0.8's SglangAdapter reads SGLang's get_parallel() itself: only the collectives patch applies there.
ON_07 = _versions.modelexpress_in((0, 7), (0, 8))


def _as_07(monkeypatch):
    """Have the patches see ModelExpress 0.7.0 (the getters patch is 0.7's only)."""
    real = _versions.installed
    monkeypatch.setattr(_versions, "installed", lambda d: (0, 7, 0) if d == "modelexpress" else real(d))


def _without_patches(monkeypatch):
    for name in _GETTERS:
        if getattr(getattr(distributed, name, None), "__mx_strategies_patch__", False):
            monkeypatch.delattr(distributed, name)
    for name in ("broadcast_state", "all_gather_state"):
        if getattr(vars(SglangAdapter).get(name), "__mx_strategies_patch__", False):
            monkeypatch.delattr(SglangAdapter, name)


def test_each_patch_applies_once_where_sglang_0523_lacks_what_modelexpress_07_calls(monkeypatch, caplog):
    _without_patches(monkeypatch)
    assert not any(hasattr(distributed, name) for name in _GETTERS)
    assert SglangAdapter.broadcast_state is EngineAdapter.broadcast_state
    expected = ("patch_sglang_parallel_getters",) if ON_07 else ()
    with caplog.at_level("INFO", logger="modelexpress.mx_strategies.patches"):
        assert apply_sglang_patches() == expected + ("patch_sglang_adapter_state",)
        assert apply_sglang_patches() == ()  # idempotent: nothing left to do, nothing logged again
    assert len(caplog.records) == len(expected) + 1
    if ON_07:
        assert "get_world_group" in caplog.records[0].getMessage()
    assert all(callable(getattr(distributed, name, None)) for name in _GETTERS) is ON_07
    assert SglangAdapter.broadcast_state is sglang_adapter_state.broadcast_state


def test_a_getter_sglang_still_exports_is_left_alone(monkeypatch):
    _without_patches(monkeypatch)
    _as_07(monkeypatch)
    own = lambda: 7  # noqa: E731 - SGLang's own getter, as an SGLang <= 0.5.20 exports it
    monkeypatch.setattr(distributed, "get_tensor_model_parallel_world_size", own, raising=False)
    assert patch_sglang_parallel_getters() is True
    assert distributed.get_tensor_model_parallel_world_size is own
    for name in _GETTERS:
        if name != "get_tensor_model_parallel_world_size":
            assert getattr(distributed, name).__mx_strategies_patch__


def test_an_adapter_with_collectives_of_its_own_keeps_them(monkeypatch):
    _without_patches(monkeypatch)

    def broadcast_state(self, state):  # a future ModelExpress's own
        return state

    monkeypatch.setattr(SglangAdapter, "broadcast_state", broadcast_state)
    assert patch_sglang_adapter_state() is True  # all_gather_state only
    assert SglangAdapter.broadcast_state is broadcast_state
    assert SglangAdapter.all_gather_state is sglang_adapter_state.all_gather_state


def test_only_the_collectives_patch_on_modelexpress_08_and_none_after(monkeypatch):
    _without_patches(monkeypatch)
    real = _versions.installed
    monkeypatch.setattr(_versions, "installed", lambda d: (0, 9, 0) if d == "modelexpress" else real(d))
    assert apply_sglang_patches() == ()
    monkeypatch.setattr(_versions, "installed", lambda d: (0, 8, 0) if d == "modelexpress" else real(d))
    assert apply_sglang_patches() == ("patch_sglang_adapter_state",)  # 0.8's SglangAdapter has neither collective
    assert not any(hasattr(distributed, name) for name in _GETTERS)
    assert sglang_parallel_getters.modelexpress_in((0, 7), (0, 8)) is False


def test_the_08_plugin_entry_applies_the_patches_under_sglang(monkeypatch):
    """ModelExpress 0.8's plugin file (MX_LOAD_PLUGIN, no MX_STRATEGY): the same patches as SGLang's entry point."""
    from mx_strategies import activation
    from mx_strategies.robust import RobustModelStreamerStrategy

    _without_patches(monkeypatch)
    assert SglangAdapter.broadcast_state is EngineAdapter.broadcast_state
    try:
        assert activation.follow_plugin(RobustModelStreamerStrategy) is RobustModelStreamerStrategy
        assert SglangAdapter.broadcast_state is sglang_adapter_state.broadcast_state
        assert all(callable(getattr(distributed, name, None)) for name in _GETTERS) is ON_07
    finally:
        activation.uninstall()
