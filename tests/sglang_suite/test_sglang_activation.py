"""Activation in SGLang's processes: our ``sglang.srt.plugins`` entry point, loaded by SGLang's own loader.

SGLang spawns its scheduler processes itself and calls ``load_plugins()`` in
each (``managers/scheduler.py:6313``), so the launcher's ``activate()`` never
reaches them. Each case runs in a fresh interpreter, as a scheduler process
starts: SGLang's ``load_plugins()``, then what ModelExpress sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mx_strategies.patches._versions import modelexpress_in

ON_07 = modelexpress_in((0, 7), (0, 8))  # 0.8's SglangAdapter reads get_parallel(): no getters patch there

PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from sglang.srt.plugins import load_plugins
import sglang.srt.distributed as distributed
before = hasattr(distributed, "get_world_group")
load_plugins()
from mx_strategies import activation
from modelexpress.engines.sglang.adapter import SglangAdapter
from modelexpress.adapter import EngineAdapter
installed = activation.installed_strategy()
result = {
    "getters_before": before,
    "getters_after": all(hasattr(distributed, n) for n in (
        "get_world_group", "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size",
        "get_pipeline_model_parallel_rank", "get_pipeline_model_parallel_world_size",
        "get_moe_expert_parallel_world_size")),
    "broadcast_state_patched": SglangAdapter.broadcast_state is not EngineAdapter.broadcast_state,
    "installed": installed.name if installed else None,
}
if result["getters_after"]:
    # The getters answer from SGLang's own parallel state once a group exists.
    from sglang_support.builders import sglang_runtime
    with sglang_runtime():
        result["tp_size"] = distributed.get_tensor_model_parallel_world_size()
        result["world_group_ranks"] = list(distributed.get_world_group().ranks)
else:
    from sglang_support.builders import sglang_runtime, TINY
    from types import SimpleNamespace
    import torch
    import modelexpress.engines.sglang.adapter as adapter_module
    from modelexpress.engines.sglang.adapter import build_sglang_load_context
    from mx_cpu_shim import CpuAcceleratorBackend  # TEST ONLY: ModelExpress 0.7.0 has no cpu backend
    adapter_module.accelerator_backend_for = lambda device: CpuAcceleratorBackend()
    with sglang_runtime():
        try:
            build_sglang_load_context(SimpleNamespace(tp_rank=0), SimpleNamespace(model_path="/m"),
                                      SimpleNamespace(device="cpu"))
        except Exception as exc:
            result["upstream_error"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(result))
"""


def _probe(**env: str) -> dict:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "SGLANG_PLUGINS"))}
    environ["PYTHONPATH"] = os.pathsep.join([here, os.path.join(here, "stubs", "sglang"), environ.get("PYTHONPATH", "")])
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240, env=environ)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_sglang_plugin_loader_installs_robust_and_the_patches_when_mx_strategy_is_set():
    result = _probe(MX_STRATEGY="mx_strategies.robust")
    assert result["installed"] == "robust_model_streamer"
    assert result["getters_before"] is False  # SGLang 0.5.23 does not export them
    assert result["getters_after"] is ON_07 and result["broadcast_state_patched"] is True
    if ON_07:
        assert result["tp_size"] == 1 and result["world_group_ranks"] == [0]
    else:
        assert "upstream_error" not in result  # 0.8's own adapter builds its context on SGLang 0.5.23


def test_sglang_plugin_loader_changes_nothing_without_mx_strategy():
    """Unset: no strategy, no patch; ModelExpress 0.7.0's own adapter then fails on SGLang 0.5.23 (0.8's does not)."""
    result = _probe()
    assert result["installed"] is None
    assert result["getters_after"] is False and result["broadcast_state_patched"] is False
    if ON_07:
        assert result["upstream_error"].startswith("AttributeError") and "get_world_group" in result["upstream_error"]
    else:
        assert "upstream_error" not in result


@pytest.mark.parametrize("allowed, installed", [("mx_strategies", "robust_model_streamer"), ("other", None)])
def test_sglang_plugins_allow_list_is_honoured(allowed, installed):
    """SGLANG_PLUGINS is SGLang's allow-list of plugin names: ours is ``mx_strategies``."""
    result = _probe(MX_STRATEGY="mx_strategies.robust", SGLANG_PLUGINS=allowed)
    assert result["installed"] == installed
