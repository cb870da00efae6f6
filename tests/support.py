"""Test helpers for the engine side of ModelExpress, which needs vLLM and a GPU.

The model and adapter are mx_strategies.testing.standin's: a strict model (a tensor
it does not own fails the load) and a real ``EngineAdapter`` subclass that
applies weights through ``model.load_weights`` as vLLM's adapter does and
counts ``reinit_for_retry`` calls. Everything else in the chain is real.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import SimpleNamespace

import torch
from modelexpress.load_strategy import LoadStrategyChain
from safetensors.torch import load_file

from mx_strategies.testing.standin import StandInAdapter as CountingAdapter
from mx_strategies.testing.standin import StandInModel as RecordingModel
from mx_strategies.testing.standin import load_context

__all__ = [
    "CountingAdapter",
    "load_gpu_e2e",
    "RecordingModel",
    "make_context",
    "model_config",
    "reference_tensors",
    "run_chain",
    "vllm_config",
]


def model_config(model=None, model_weights=None, runner_type="generate", hf_config=None):
    return SimpleNamespace(model=model, model_weights=model_weights, runner_type=runner_type, hf_config=hf_config)


def vllm_config(method=None, target=None, tp=1, pp=1):
    speculative = None if method is None else SimpleNamespace(method=method, target_model_config=target)
    return SimpleNamespace(
        speculative_config=speculative,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
    )


def make_context(mc, adapter, *, draft: bool = False):
    return load_context(mc, adapter, name="tiny", p2p_enabled=not draft)


def reference_tensors(path: str) -> dict[str, torch.Tensor]:
    """What safetensors itself loads from every shard of ``path``."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(path, name)))
    return tensors


def run_chain(mc, reference, names=None, *, vcfg=None, draft=False):
    """Run ModelExpress's real chain; return (model, adapter)."""
    make = lambda: RecordingModel(reference, names)  # noqa: E731
    adapter = CountingAdapter(make, vllm_config=vcfg)
    model = LoadStrategyChain.run(make(), make_context(mc, adapter, draft=draft))
    return model, adapter


def load_script(name: str):
    """scripts/<name>.py as the module ``name`` (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(name, os.path.join(repo, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_gpu_e2e():
    return load_script("gpu_e2e")
