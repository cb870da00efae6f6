"""The SGLang suite: collected only where SGLang is installed (its own venv, .venv-sglang).

The main suite runs in a vLLM venv without SGLang: there nothing here is collected. Where SGLang is
installed without torchvision (the lean install: SGLang imports torchvision at module level), the
test-only stub in tests/stubs/sglang goes first on sys.path, and on PYTHONPATH for child processes
(the TP=2 ranks).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

_STUBS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stubs", "sglang")


def _torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or a wheel built for another torch
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def _sglang_installed() -> bool:
    # Not just find_spec("sglang") is not None: with tests/ on sys.path (pytest's pythonpath), this very
    # folder is an importable namespace package named sglang. A real SGLang is a regular package, with
    # an origin (its __init__.py); a namespace package has none.
    spec = importlib.util.find_spec("sglang")
    return spec is not None and spec.origin is not None


if not _sglang_installed():
    collect_ignore_glob = ["test_*.py"]
else:
    if not _torchvision_importable():
        if _STUBS not in sys.path:
            sys.path.insert(0, _STUBS)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if _STUBS not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([_STUBS, *paths])


# -- fixtures the suite's loads share ------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime():
    """SGLang's process state (published ServerArgs, a one-process gloo group), per test module."""
    from sglang_support import builders

    with builders.sglang_runtime() as rt:
        yield rt


@pytest.fixture
def cpu_backend(monkeypatch):
    """TEST ONLY: ModelExpress 0.7.0's accelerator backends are cuda and xpu; cpu gets the shim's."""
    import modelexpress.engines.sglang.adapter as adapter_module
    import torch
    from mx_cpu_shim import CpuAcceleratorBackend

    original = adapter_module.accelerator_backend_for
    monkeypatch.setattr(
        adapter_module,
        "accelerator_backend_for",
        lambda device: CpuAcceleratorBackend() if torch.device(device).type == "cpu" else original(device),
    )


@pytest.fixture
def reinits(monkeypatch):
    """How often the chain asked SglangAdapter to rebuild the model (the real method still runs)."""
    from modelexpress.engines.sglang.adapter import SglangAdapter

    calls = []
    real = SglangAdapter.reinit_for_retry

    def counted(self, result):
        calls.append(result)
        return real(self, result)

    monkeypatch.setattr(SglangAdapter, "reinit_for_retry", counted)
    return calls


@pytest.fixture
def robust_sglang(monkeypatch):
    """MX_STRATEGY=mx_strategies.robust, activated as SGLang's plugin loader does (register_sglang)."""
    from mx_strategies import activation
    from mx_strategies.observe.report import clear_reports

    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register_sglang()
    clear_reports()
    yield
    activation.uninstall()
