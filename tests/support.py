"""Test doubles for the engine side of ModelExpress, which needs vLLM and a GPU.

``RecordingModel`` stands in for a vLLM model: preallocated tensors and a
strict ``load_weights`` that copies into them and records every name it
was given. ``CountingAdapter`` is a real ``EngineAdapter`` subclass that
applies the iterator through ``model.load_weights`` (as vLLM's adapter does)
and counts ``reinit_for_retry`` calls. Everything else in the chain is real.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Iterable, Iterator, Optional

import torch
from modelexpress import p2p_pb2
from modelexpress.adapter import EngineAdapter
from modelexpress.load_strategy import LoadContext, LoadResult, LoadStrategyChain


class RecordingModel(torch.nn.Module):
    def __init__(self, reference: dict[str, torch.Tensor], names: Optional[Iterable[str]] = None) -> None:
        super().__init__()
        names = list(reference) if names is None else list(names)
        self.weights = {n: torch.zeros_like(reference[n]) for n in names}
        self.order: list[str] = []

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> set[str]:
        for name, tensor in weights:
            if name not in self.weights:
                raise KeyError(f"model has no parameter {name!r}")
            self.weights[name].copy_(tensor)
            self.order.append(name)
        return set(self.order)


class CountingAdapter(EngineAdapter):
    """Applies weights like vLLM's adapter; counts re-initializations."""

    def __init__(self, make_model, vllm_config=None) -> None:
        self.make_model = make_model
        self.vllm_config = vllm_config
        self.reinit_calls = 0
        self.after_load_calls = 0

    def apply_weight_iter(self, result: LoadResult, weights_iter) -> LoadResult:
        result.model.load_weights(weights_iter)
        return result

    def after_weight_iter_load(self, result: LoadResult) -> LoadResult:
        self.after_load_calls += 1
        return result

    def build_model_streamer_weight_iter(self, model_uri: str, model=None):
        # What vLLM's RunaiModelStreamerLoader does: list (unsorted, not
        # recursive), stream everything, clone each tensor.
        from runai_model_streamer import SafetensorsStreamer, list_safetensors

        files = list_safetensors(model_uri)
        if not files:
            raise RuntimeError(f"Cannot find any safetensors model weights with `{model_uri}`")
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            for name, tensor in streamer.get_tensors():
                yield name, tensor.clone()

    def reinit_for_retry(self, result: LoadResult) -> LoadResult:
        self.reinit_calls += 1
        model = self.make_model()
        return LoadResult(value=model, model=model, publishable=result.publishable)


def model_config(model=None, model_weights=None, runner_type="generate", hf_config=None):
    return SimpleNamespace(model=model, model_weights=model_weights, runner_type=runner_type, hf_config=hf_config)


def vllm_config(method=None, target=None, tp=1, pp=1):
    speculative = None if method is None else SimpleNamespace(method=method, target_model_config=target)
    return SimpleNamespace(
        speculative_config=speculative,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
    )


def make_context(mc, adapter, *, draft: bool = False) -> LoadContext:
    return LoadContext(
        model_config=mc,
        load_config=SimpleNamespace(),
        target_device=torch.device("cpu"),
        global_rank=0,
        worker_rank=0,
        local_rank=0,
        device_id=0,
        identity=p2p_pb2.SourceIdentity(model_name="tiny"),
        mx_client=None,
        worker_id="test",
        adapter=adapter,
        p2p_enabled=not draft,
    )


def run_chain(mc, reference, names=None, *, vcfg=None, draft=False):
    """Run ModelExpress's real chain; return (model, adapter)."""
    make = lambda: RecordingModel(reference, names)  # noqa: E731
    adapter = CountingAdapter(make, vllm_config=vcfg)
    model = LoadStrategyChain.run(make(), make_context(mc, adapter, draft=draft))
    return model, adapter
