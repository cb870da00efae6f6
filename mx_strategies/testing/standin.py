"""A stand-in for the engine side of ModelExpress: the demo's, the benchmark's, the tests'.

vLLM cannot build and run a model on a CPU, so these take the place of its
model and adapter while everything else stays real (ModelExpress's chain,
runai-model-streamer, the storage protocol, the safetensors files):

- :class:`StandInModel` holds preallocated weights and a ``load_weights``
  that copies into them, recording what it was given. ``strict`` models
  refuse a tensor they do not own (a test sees a stray tensor at once); the
  others skip it, as vLLM's target and MTP models skip each other's layers.
- :class:`StandInAdapter` is a real ``EngineAdapter`` subclass doing what
  vLLM's adapter does: weights go through ``model.load_weights``, the native
  ModelStreamer path lists and streams every shard like vLLM's runai loader,
  and ``reinit_for_retry`` builds a fresh model (and counts it).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
from modelexpress import p2p_pb2
from modelexpress.adapter import EngineAdapter
from modelexpress.load_strategy import LoadContext, LoadResult
from ..verify.tensor_bytes import same_bytes


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class StandInModel(torch.nn.Module):
    """Preallocated weights shaped like ``reference``; ``owned`` names which.

    It holds every tensor it is given, so it cannot say what a real engine's module would read (a real
    target skips its MTP draft's layers): it declines robust's dry run (``supports_dry_run = False``,
    :mod:`mx_strategies.select.module_reads`), and the table or the conventions decide, as for a module that
    cannot be asked. ``answers_dry_run=True`` lets it answer: it reads what it owns.
    """

    supports_dry_run = False

    def __init__(
        self,
        reference: Mapping[str, torch.Tensor],
        owned: Optional[Iterable[str]] = None,
        *,
        strict: bool = True,
        on_tensor: Optional[Callable[[int], None]] = None,
        answers_dry_run: bool = False,
    ) -> None:
        super().__init__()
        self.supports_dry_run = answers_dry_run
        names = sorted(reference) if owned is None else sorted(owned)
        # Non-persistent buffers, as a module holds its tensors: robust's dry run can swap them for data-less
        # twins and ask this load_weights what it reads (mx_strategies.select.dry_run); no checkpoint name is a buffer's.
        self._keys = {name: f"w{index}" for index, name in enumerate(names)}
        for name in names:
            self.register_buffer(self._keys[name], torch.zeros_like(reference[name]), persistent=False)
        self.strict = strict
        self.on_tensor = on_tensor
        self.loaded: list[str] = []  # in delivery order
        self.skipped: list[str] = []
        self.received_bytes = 0

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, key) for name, key in self._keys.items()}

    @property
    def order(self) -> list[str]:
        return self.loaded

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> set[str]:
        loaded, dry = set(), False
        for name, tensor in weights:
            dry = tensor.is_meta  # robust asking what it reads: no data, nothing to count
            if not dry:
                self.received_bytes += nbytes(tensor)
                if self.on_tensor is not None:
                    self.on_tensor(nbytes(tensor))
            if name not in self._keys:
                if self.strict:
                    raise KeyError(f"model has no parameter {name!r}")
                if not dry:
                    self.skipped.append(name)
                continue
            getattr(self, self._keys[name]).copy_(tensor)
            loaded.add(name)
            if not dry:
                self.loaded.append(name)
        return loaded if dry else set(self.loaded)

    def matching(self, reference: Mapping[str, torch.Tensor]) -> int:
        """How many owned weights hold exactly the checkpoint's values."""
        return sum(1 for name, value in self.weights.items() if same_bytes(value, reference[name]))


class StandInAdapter(EngineAdapter):
    """Applies weights like vLLM's adapter; counts post-load passes and rebuilds."""

    def __init__(
        self,
        make_model: Callable[[], StandInModel],
        vllm_config: Any = None,
        *,
        require_all_loaded: bool = False,
    ) -> None:
        self.make_model = make_model
        self.vllm_config = vllm_config
        self.require_all_loaded = require_all_loaded
        self.reinit_calls = 0
        self.after_load_calls = 0
        self.last_result: Optional[LoadResult] = None

    def apply_weight_iter(self, result: LoadResult, weights_iter) -> LoadResult:
        result.model.load_weights(weights_iter)
        return result

    def after_weight_iter_load(self, result: LoadResult) -> LoadResult:
        self.after_load_calls += 1
        if self.require_all_loaded:
            # vLLM's loader refuses a model whose weights were not all loaded.
            missing = sorted(set(result.model.weights) - set(result.model.loaded))
            if missing:
                raise ValueError(f"Following weights were not initialized from checkpoint: {set(missing[:5])}")
        self.last_result = result
        return result

    def build_model_streamer_weight_iter(self, model_uri: str, model=None):
        # vLLM's RunaiModelStreamerLoader: list the folder (not recursive, not
        # sorted), stream every file, clone each tensor.
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
        fresh = self.make_model()
        return LoadResult(value=fresh, model=fresh, publishable=result.publishable)


class PlainModelExpressAdapter(StandInAdapter):
    """:class:`StandInAdapter` streaming what plain ModelExpress ``release`` streams for an MTP draft.

    The shards its vLLM adapter chooses (:mod:`.plain_modelexpress`, checked
    against each release's code), streamed whole, in listing order; a target
    (``draft_class`` None) streams every shard. ``chosen`` keeps the last choice.
    """

    def __init__(self, make_model, vllm_config: Any, *, release: str, draft_class: Optional[str], config: Mapping,
                 require_all_loaded: bool = False) -> None:  # fmt: skip
        super().__init__(make_model, vllm_config, require_all_loaded=require_all_loaded)
        self.release, self.draft_class, self.config = release, draft_class, dict(config)
        self.chosen: tuple[str, ...] = ()
        self.shard_count = 0

    def build_model_streamer_weight_iter(self, model_uri: str, model=None):
        from runai_model_streamer import SafetensorsStreamer, list_safetensors

        from ..inspect.index import inspect
        from ..inspect.object_stores import open_store
        from .plain_modelexpress import plain_selection

        files = list_safetensors(model_uri)
        checkpoint = inspect(open_store(model_uri), 1)
        shards = {s.key.rsplit("/", 1)[-1]: {n: t.nbytes for n, t in s.tensors.items()} for s in checkpoint.shards}
        by_name = {f.rsplit("/", 1)[-1]: f for f in files}
        ordered = {name: shards.get(name, {}) for name in by_name}
        chosen = plain_selection(self.release, ordered, draft_class=self.draft_class, config=self.config).shards
        self.chosen, self.shard_count = chosen, len(by_name)
        with SafetensorsStreamer() as streamer:
            streamer.stream_files([by_name[name] for name in chosen])
            for name, tensor in streamer.get_tensors():
                yield name, tensor.clone()


def model_config(model=None, model_weights=None, runner_type="generate", hf_config=None) -> SimpleNamespace:
    """vLLM's ModelConfig, as far as a load strategy reads it."""
    return SimpleNamespace(model=model, model_weights=model_weights, runner_type=runner_type, hf_config=hf_config)


def vllm_config(method=None, target=None, tp=1, pp=1, extra=None) -> SimpleNamespace:
    """vLLM's VllmConfig as a strategy reads it: a speculative config for ``method`` (None: none),
    the parallel sizes, and the loader's ``model_loader_extra_config``."""
    speculative = None if method is None else SimpleNamespace(method=method, target_model_config=target)
    return SimpleNamespace(
        speculative_config=speculative,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
        load_config=SimpleNamespace(model_loader_extra_config=extra),
    )


def load_context(
    model_config: Any,
    adapter: EngineAdapter,
    *,
    name: str = "stand-in",
    p2p_enabled: bool = True,
    device: str = "cpu",
) -> LoadContext:
    """A LoadContext for one worker of rank 0, as vLLM's loader builds it."""
    return LoadContext(
        model_config=model_config,
        load_config=SimpleNamespace(),
        target_device=torch.device(device),
        global_rank=0,
        worker_rank=0,
        local_rank=0,
        device_id=0,
        identity=p2p_pb2.SourceIdentity(model_name=name),
        mx_client=None,
        worker_id=name,
        adapter=adapter,
        p2p_enabled=p2p_enabled,
    )
