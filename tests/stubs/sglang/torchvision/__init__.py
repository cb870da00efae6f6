"""TEST ONLY: a stand-in for torchvision in the SGLang class venv.

SGLang 0.5.23 imports torchvision at module level in its multimodal helpers
(``sglang.srt.configs`` -> ``internvl_utils``), which every model loader
import reaches. PyPI's torchvision pulls a 6.6 GB CUDA torch, and its wheel's
operators do not register against torch 2.13.0+cpu. No test here runs a
vision model: every name resolves to an inert placeholder, and anything that
calls one fails loudly. Only on ``sys.path`` for the SGLang suite
(tests/sglang_suite/conftest.py); never installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+mx-strategies-test-stub"


class _PlaceholderType(type):
    """Class attributes (``InterpolationMode.BICUBIC``) are placeholders too."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _attribute(cls.__module__, f"{cls.__name__}.{name}")


class _Placeholder(metaclass=_PlaceholderType):
    """Any torchvision class or function: importable, and unusable."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision is a test stub in this environment (tests/stubs/sglang)")

    def __class_getitem__(cls, item):
        return cls


def _attribute(module_name: str, name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Placeholder,), {"__module__": module_name})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name, _m=spec.name: _attribute(_m, name)
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _StubFinder())


def __getattr__(name: str):
    return _attribute(__name__, name)
