#!/usr/bin/env python
"""Load-time benchmark: the robust strategy against raw runai-model-streamer.

Why this exists: the robust strategy adds work a plain runai load does not
do (listing, header reads, an index check, a ledger of delivered tensors).
The promise is that this costs next to nothing: at least 0.95x raw runai's
throughput, inspection + verification under 2% of a 2 GB load, an MTP draft
that reads only its own tensors, and no more peak memory than raw runai.
This script measures exactly that, on a checkpoint of your own (``--uri``)
or on a generated one (bf16, 8 shards, one empty, a Qwen3-Next style
``mtp.*`` head) cached under ``--workdir`` so repeated runs reuse it.

Loaders, all timed in ONE process, interleaved (rotating order) over
``--reps`` repetitions after ``--warmup`` untimed ones:

- ``runai_raw``: ``SafetensorsStreamer.stream_files(non-empty shards)`` and
  iterate ``get_tensors()``; nothing is kept: the ceiling;
- ``runai_copy``: the same, copying each tensor into a preallocated model
  (what every engine does with what it is given): the like-for-like baseline;
- ``robust``: ``mx_strategies.robust`` through ModelExpress's real
  ``LoadStrategyChain.run``, the adapter's ``apply_weight_iter`` calling
  ``model.load_weights`` which copies into preallocated tensors;
- ``robust_unordered``: the same with plan-order delivery (``InOrder``)
  switched off, a diagnostic: the difference is what the ordering costs;
- ``upstream``: ModelExpress's own ``ModelStreamerStrategy`` the same way,
  its adapter iterator built like vLLM's runai path (``list_safetensors``,
  stream everything, clone each tensor);
- ``safetensors``: ``safetensors.torch.load_file`` of every non-empty shard
  into the same model (local only);
- ``draft``: the robust strategy loading an MTP draft from the target's
  checkpoint (runner_type="draft", speculative method "mtp", ``model`` a
  config-only copy, ``MX_MODEL_URI`` the checkpoint).

Peak memory is measured per loader in a short child process (see
``child_main``). Results print as tables; ``--json`` writes them and
``--plot`` draws throughput per loader (needs matplotlib, the optional
``bench`` extra; without it the tables still print).

    python benchmarks/bench.py --json docs/benchmarks.json --plot docs/benchmarks.png
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import gc
import hashlib
import io
import json
import logging
import os
import platform
import posixpath
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Callable, Iterator, Mapping, Optional

import torch

LOADERS = ("runai_raw", "runai_copy", "robust", "robust_unordered", "upstream", "safetensors", "draft")
LOCAL_ONLY = ("safetensors",)
LABELS = {
    "runai_raw": "runai raw (iterate only)",
    "runai_copy": "runai + copy into model",
    "robust": "robust (MX chain)",
    "robust_unordered": "robust, in-order delivery off",
    "upstream": "upstream ModelStreamer (MX chain)",
    "safetensors": "safetensors load_file",
    "draft": "robust MTP draft",
}
BASELINE = "runai_raw"
LIKE_FOR_LIKE = "runai_copy"

TARGET_THROUGHPUT_RATIO = 0.95
TARGET_OVERHEAD_SHARE = 0.02
TARGET_DRAFT_READ_RATIO = 1.1
TARGET_PEAK_RATIO = 1.10

SHARD_COUNT = 8
EMPTY_SHARD_POSITION = 4  # 0-based: the fifth of eight files holds no tensor
DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip

logger = logging.getLogger("mx_strategies.bench")


class BenchError(RuntimeError):
    """A load did not do what the benchmark asked; its timing would be meaningless."""


# -- sizes -------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """``2GB`` (decimal), ``512MiB`` (binary) or a byte count."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 2GB, 512MB or 64MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def human(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


# -- the checkpoint ------------------------------------------------------------


@dataclass
class Layout:
    """Shapes of the generated model, chosen so the files total about ``size``."""

    hidden: int
    vocab: int
    layers: int

    @staticmethod
    def for_size(size: int) -> "Layout":
        hidden = 2048
        # A block (q, o, 2x-wide down projection) is 4*hidden^2 bf16 values.
        while hidden > 32 and 12 * 8 * hidden * hidden > size:
            hidden //= 2
        vocab = 16 * hidden
        block = 4 * hidden * hidden * 2
        fixed = 2 * vocab * hidden * 2 + block + 2 * hidden * hidden * 2  # embed, lm_head, mtp layer + fc
        layers = max(SHARD_COUNT - 2, (size - fixed) // block)
        return Layout(hidden, vocab, int(layers))


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=torch.float32).normal_(generator=generator).to(torch.bfloat16)


def _block(prefix: str, hidden: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.input_layernorm.weight": _randn(generator, hidden),
        f"{prefix}.self_attn.q_proj.weight": _randn(generator, hidden, hidden),
        f"{prefix}.self_attn.o_proj.weight": _randn(generator, hidden, hidden),
        f"{prefix}.mlp.down_proj.weight": _randn(generator, hidden, 2 * hidden),
    }


def generate_checkpoint(path: str, size: int) -> None:
    """bf16 weights in 8 shards (one empty) with an ``mtp.*`` head, + config.json.

    Written with ``mx_strategies.testing.synthetic.write_shards`` (and its index); a
    ``.complete`` marker written last lets later runs reuse the folder.
    """
    from mx_strategies.testing.synthetic import write_shards

    layout = Layout.for_size(size)
    generator = torch.Generator().manual_seed(1234)
    hidden = layout.hidden
    target_shards: list[dict[str, torch.Tensor]] = [{} for _ in range(SHARD_COUNT - 2)]
    target_shards[0]["model.embed_tokens.weight"] = _randn(generator, layout.vocab, hidden)
    for i in range(layout.layers):
        target_shards[i * len(target_shards) // layout.layers].update(_block(f"model.layers.{i}", hidden, generator))
    target_shards[-1]["model.norm.weight"] = _randn(generator, hidden)
    target_shards[-1]["lm_head.weight"] = _randn(generator, layout.vocab, hidden)
    mtp = _block("mtp.layers.0", hidden, generator)
    mtp["mtp.fc.weight"] = _randn(generator, hidden, 2 * hidden)
    mtp["mtp.norm.weight"] = _randn(generator, hidden)
    mtp["mtp.pre_fc_norm_embedding.weight"] = _randn(generator, hidden)
    mtp["mtp.pre_fc_norm_hidden.weight"] = _randn(generator, hidden)
    shards = target_shards + [mtp]
    shards.insert(EMPTY_SHARD_POSITION, {})
    write_shards(path, shards, index=True)
    config = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": layout.layers,
        "mtp_num_hidden_layers": 1,
        "hidden_size": hidden,
        "vocab_size": layout.vocab,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    with open(os.path.join(path, ".complete"), "w") as handle:
        json.dump({"size": size, **asdict(layout)}, handle)


def cached_checkpoint(workdir: str, size: int) -> str:
    """The generated checkpoint of ``size`` under ``workdir``, made once."""
    path = os.path.join(workdir, f"checkpoint-{size}")
    if os.path.exists(os.path.join(path, ".complete")):
        logger.info(f"reusing {path}")
        return path
    free = shutil.disk_usage(workdir).free
    if free < 2 * size:
        raise BenchError(f"{workdir}: {human(free)} free, not enough to generate {human(size)} safely")
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    print(f"generating a {human(size)} checkpoint in {path} ...", flush=True)
    generate_checkpoint(path, size)
    print(f"  done in {time.perf_counter() - started:.1f}s", flush=True)
    return path


@dataclass
class Site:
    """One place a checkpoint is loaded from, and what it holds."""

    name: str  # "local" or "s3"
    uri: str
    shard_uris: list[str]  # non-empty shards, natural order
    shard_files: int  # every *.safetensors file, empty ones included
    empty_shards: int
    tensors: dict[str, tuple[str, list[int]]]  # name -> (safetensors dtype, shape)
    draft_names: list[str]
    draft_names_source: str
    data_bytes: int
    draft_bytes: int
    metadata_bytes: int  # every shard header + index + config
    config_only: str  # what vLLM's runai pull leaves: the *.json files only
    reference: Optional[str]  # a local folder with the same files, for value checks
    bytes_counter: str  # how bytes read are counted here

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "Site":
        data = dict(data)
        data["tensors"] = {k: (v[0], list(v[1])) for k, v in data["tensors"].items()}
        return Site(**data)


def describe_site(name: str, uri: str, workdir: str, reference: Optional[str], generated: bool = False) -> Site:
    """Read the checkpoint's listing and headers (never tensor data) to plan the loads.

    ``reference``: a local folder with the same files, for value checks.
    ``generated``: ours, so the draft is exactly its ``mtp.*`` tensors;
    otherwise the draft is what mx_strategies' selector picks (said so in
    ``draft_names_source``).
    """
    from mx_strategies.checkpoint import inspect
    from mx_strategies.draft import layer_layout, select_draft_tensors
    from mx_strategies.settings import load_settings
    from mx_strategies.storage import open_store

    store = open_store(uri)
    checkpoint = inspect(store, 3)
    if checkpoint.errors:
        raise BenchError(f"{uri}: " + "; ".join(p.message for p in checkpoint.errors))
    tensors = {
        n: (info.dtype, list(info.shape)) for s in checkpoint.loadable_shards for n, info in s.tensors.items()
    }
    try:
        settings = load_settings()
        layout = layer_layout(checkpoint.config)
        draft = sorted(select_draft_tensors(set(tensors), settings, layout, share_with_target=True).names)
        draft_source = "mx_strategies.draft.select_draft_tensors (default conventions)"
    except Exception:  # no MTP head: no draft load
        draft, draft_source = [], "none found"
    if generated:
        # Our generated head: every mtp.* tensor, independent of the selector.
        draft = sorted(n for n in tensors if n.startswith("mtp."))
        draft_source = "generated: every mtp.* tensor"
    info = {n: i for s in checkpoint.loadable_shards for n, i in s.tensors.items()}
    listing = {o.key: o for o in store.list(3)}
    json_bytes = sum(o.size for k, o in listing.items() if k.endswith(".json") and posixpath.dirname(k) == checkpoint.root_key)
    config_only = os.path.join(workdir, f"config-only-{name}-{hashlib.sha1(uri.encode()).hexdigest()[:10]}")
    _config_only_copy(store, listing, config_only, checkpoint.root_key)
    return Site(
        name=name,
        uri=checkpoint.uri,
        shard_uris=[s.uri for s in checkpoint.loadable_shards],
        shard_files=sum(1 for k in listing if posixpath.dirname(k) == checkpoint.root_key and k.endswith(".safetensors")),
        empty_shards=sum(1 for p in checkpoint.problems if p.kind == "empty_shard"),
        tensors=tensors,
        draft_names=draft,
        draft_names_source=draft_source,
        data_bytes=checkpoint.data_bytes,
        draft_bytes=sum(info[n].nbytes for n in draft),
        metadata_bytes=checkpoint.metadata_bytes + json_bytes,
        config_only=config_only,
        reference=reference,
        bytes_counter="",
    )


def _config_only_copy(store, listing: dict, dest: str, root_key: str) -> None:
    """The *.json files of a source (index included), no weights: vLLM's runai pull."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for key, obj in listing.items():
        if key.endswith(".json") and posixpath.dirname(key) == root_key:
            with open(os.path.join(dest, posixpath.basename(key)), "wb") as handle:
                handle.write(store.read(obj, 0, obj.size))


# -- the engine side ------------------------------------------------------------


class _Shapes(Mapping):
    """Tensor specs as the ``reference`` mapping ``StandInModel`` allocates from.

    ``StandInModel`` zero-fills a copy of each reference tensor; this hands
    it one empty tensor of the right shape at a time, so a 2 GB model is
    allocated once, not twice.
    """

    def __init__(self, specs: dict[str, tuple[str, list[int]]]) -> None:
        self._specs = specs

    def __getitem__(self, name: str) -> torch.Tensor:
        dtype, shape = self._specs[name]
        return torch.empty(shape, dtype=DTYPES[dtype])

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def make_model(specs: dict[str, tuple[str, list[int]]], names: list[str], *, strict: bool):
    """The project's stand-in engine model: preallocated, zero-filled weights.

    Its ``load_weights`` copies each delivered tensor into them, as vLLM's
    default weight loader does; ``strict`` refuses a name the model lacks (a
    target), otherwise it is skipped (vLLM's MTP module skips the target's).
    """
    from mx_strategies.testing.standin import StandInModel

    return StandInModel(_Shapes(specs), names, strict=strict)


def clear_model(model) -> None:
    """Zero the weights and forget what was delivered, so a value check starts from scratch."""
    for tensor in model.weights.values():
        tensor.zero_()
    model.loaded.clear()
    model.skipped.clear()
    model.received_bytes = 0


class ChainWatcher(logging.Handler):
    """Which strategy ModelExpress's chain tried, and whether one failed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.tried: list[str] = []
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = re.search(r"Trying strategy: (\S+)", message)
        if match:
            self.tried.append(match.group(1))
        elif record.levelno >= logging.WARNING:
            self.failures.append(message)

    def reset(self) -> None:
        self.tried, self.failures = [], []


class Phases:
    """Wall time spent in the robust strategy's inspection, planning and verification.

    Measured inside the real loads by wrapping what the strategy calls:
    ``sources.resolve`` (listing, headers, index, config: inspection), the
    plan builders, and the delivery checks (``DeliveryLedger`` construction
    and ``check_in``, ``VerifiedStream.settle``, ``ContentCheck.check`` when
    content verification is on). Only what exists in the installed version
    is wrapped; ``instrumented`` lists it. ``InOrder`` (plan-order delivery)
    is deliberately not wrapped: wrapping its generators changed when
    released tensors were freed, and so the timings; its cost is measured
    by the ``robust_unordered`` loader instead.
    """

    def __init__(self) -> None:
        self.seconds = {"inspection": 0.0, "planning": 0.0, "verification": 0.0}
        self.store_calls = {"list": 0, "read": 0}
        self.instrumented: list[str] = []

    def reset(self) -> None:
        for key in self.seconds:
            self.seconds[key] = 0.0
        for key in self.store_calls:
            self.store_calls[key] = 0

    def _replace(self, owner, attribute: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(owner, attribute, None)
        if original is None:
            return
        wrapper = make(original)
        wrapper.__wrapped__ = original
        setattr(owner, attribute, wrapper)
        self.instrumented.append(f"{getattr(owner, '__name__', owner)}.{attribute}")

    def timed(self, phase: str) -> Callable[[Callable], Callable]:
        def make(function: Callable) -> Callable:
            def timed(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    self.seconds[phase] += time.perf_counter() - started

            return timed

        return make

    def counted(self, kind: str) -> Callable[[Callable], Callable]:
        def make(function: Callable) -> Callable:
            def counted(*args, **kwargs):
                self.store_calls[kind] += 1
                return function(*args, **kwargs)

            return counted

        return make

    def install(self) -> None:
        import mx_strategies.robust as robust_module
        from mx_strategies import storage, streaming

        self._replace(robust_module, "resolve", self.timed("inspection"))
        self._replace(robust_module, "plan_full", self.timed("planning"))
        self._replace(robust_module, "plan_subset", self.timed("planning"))
        for store_class in (storage.LocalStore, storage.S3Store, storage.GcsStore, storage.AzureStore):
            self._replace(store_class, "list", self.counted("list"))
            self._replace(store_class, "read", self.counted("read"))
        self._replace(streaming.DeliveryLedger, "__init__", self.timed("verification"))
        self._replace(streaming.DeliveryLedger, "check_in", self.timed("verification"))
        self._replace(streaming.VerifiedStream, "settle", self.timed("verification"))
        try:
            from mx_strategies import content_check
        except ImportError:
            return
        self._replace(content_check.ContentCheck, "check", self.timed("verification"))


_INSTRUMENTS: Optional[tuple[ChainWatcher, Phases]] = None


def instrumentation() -> tuple[ChainWatcher, Phases]:
    """The chain watcher and phase timers, installed once per process."""
    global _INSTRUMENTS
    if _INSTRUMENTS is None:
        watcher = ChainWatcher()
        chain_logger = logging.getLogger("modelexpress.load_strategy")
        chain_logger.setLevel(logging.INFO)
        chain_logger.addHandler(watcher)
        chain_logger.propagate = False  # its INFO lines are for the watcher, not the terminal
        phases = Phases()
        phases.install()
        _INSTRUMENTS = (watcher, phases)
    return _INSTRUMENTS


@contextmanager
def arrival_order() -> Iterator[None]:
    """Diagnostic: the robust strategy with ``InOrder`` passing tensors on as they arrive.

    Everything else (probe, plan, ledger, checks) is unchanged, so the
    difference to ``robust`` is what plan-order delivery costs.
    """
    from mx_strategies import streaming

    in_order = getattr(streaming, "InOrder", None)
    if in_order is None:
        yield
        return

    def push(self, name, tensor):
        yield name, tensor

    def drain(self):
        return iter(())

    saved = in_order.push, in_order.drain
    in_order.push, in_order.drain = push, drain
    try:
        yield
    finally:
        in_order.push, in_order.drain = saved


class Harness:
    """Runs each loader once on a site, as an engine would, and checks what arrived."""

    def __init__(self, site: Site) -> None:
        from modelexpress.load_strategy import LoadStrategyChain

        self.site = site
        self.chain = LoadStrategyChain
        self.watcher, self.phases = instrumentation()
        self._target_model = None  # StandInModel, allocated on first use
        self._draft_model = None

    # models are allocated once per site and reused, like an engine's
    def target_model(self):
        if self._target_model is None:
            self._target_model = make_model(self.site.tensors, list(self.site.tensors), strict=True)
        return self._target_model

    def draft_model(self):
        if self._draft_model is None:
            self._draft_model = make_model(self.site.tensors, self.site.draft_names, strict=False)
        return self._draft_model

    def release(self) -> None:
        self._target_model = self._draft_model = None
        gc.collect()

    def model_for(self, loader: str):
        if loader == "runai_raw":
            return None
        return self.draft_model() if loader == "draft" else self.target_model()

    def run(self, loader: str) -> int:
        """Load once; return the number of tensors the model (or iterator) received."""
        model = self.model_for(loader)
        if model is not None:
            model.loaded.clear()
        if loader == "runai_raw":
            return self._runai(copy_into=None)
        if loader == "runai_copy":
            self._runai(copy_into=model)
        elif loader == "safetensors":
            self._safetensors(model)
        else:
            self._chain(loader, model)
        return len(model.loaded)

    def _runai(self, copy_into) -> int:
        from runai_model_streamer import SafetensorsStreamer

        count = 0
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(self.site.shard_uris)
            if copy_into is not None:
                copy_into.load_weights(streamer.get_tensors())
            else:
                for _name, _tensor in streamer.get_tensors():
                    count += 1
        return count

    def _safetensors(self, model) -> None:
        from safetensors.torch import load_file

        for path in self.site.shard_uris:
            model.load_weights(iter(load_file(path).items()))

    def _chain(self, loader: str, model) -> None:
        from mx_strategies import activation
        from mx_strategies.testing.standin import StandInAdapter, load_context

        if loader == "upstream":
            activation.uninstall()
            expected = "model_streamer"
        elif loader == "robust_unordered":
            with arrival_order():
                return self._chain("robust", model)
        else:
            activation.activate("mx_strategies.robust")
            expected = "robust_model_streamer"
        os.environ["MX_MODEL_URI"] = self.site.uri
        parallel = SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1)
        target_config = SimpleNamespace(model=self.site.uri, model_weights=None, runner_type="generate", hf_config=None)
        if loader == "draft":
            model_config = SimpleNamespace(
                model=self.site.config_only, model_weights=None, runner_type="draft", hf_config=None
            )
            speculative = SimpleNamespace(method="mtp", target_model_config=target_config)
        else:
            model_config, speculative = target_config, None
        # The project's stand-in adapter: a real EngineAdapter applying weights
        # through model.load_weights, and for upstream, vLLM's runai path (list,
        # stream every file, clone each tensor). A rebuild for a retry is a
        # failed load here: the watcher below turns it into an error.
        adapter = StandInAdapter(
            lambda: model, vllm_config=SimpleNamespace(speculative_config=speculative, parallel_config=parallel)
        )
        context = load_context(model_config, adapter, name="bench", p2p_enabled=loader != "draft")
        self.watcher.reset()
        self.chain.run(model, context)
        if adapter.reinit_calls or self.watcher.failures or not self.watcher.tried or self.watcher.tried[-1] != expected:
            raise BenchError(
                f"{loader}: expected {expected} to load, the chain tried {self.watcher.tried}: {self.watcher.failures}"
            )

    def check(self, loader: str, delivered: int) -> None:
        """Every expected tensor arrived, and (where a local copy exists) with the right values."""
        expected = self.site.draft_names if loader == "draft" else list(self.site.tensors)
        if delivered != len(expected):
            raise BenchError(f"{loader}: {delivered} tensors delivered, {len(expected)} expected")
        model = self.model_for(loader)
        if model is None:
            return
        if sorted(model.loaded) != sorted(expected):
            raise BenchError(f"{loader}: delivered the wrong set of tensors")
        if self.site.reference is None:
            return
        from safetensors import safe_open

        wanted = set(expected)
        for name in sorted(os.listdir(self.site.reference)):
            if not name.endswith(".safetensors"):
                continue
            with safe_open(os.path.join(self.site.reference, name), framework="pt") as handle:
                for tensor_name in handle.keys():
                    if tensor_name in wanted and not torch.equal(handle.get_tensor(tensor_name), model.weights[tensor_name]):
                        raise BenchError(f"{loader}: {tensor_name} differs from safetensors.torch.load_file")


# -- byte counters --------------------------------------------------------------


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(": ") for line in handle)}


class ByteCounter:
    """Bytes a load pulled: the loopback proxy's count on S3, /proc/self/io locally."""

    def __init__(self, s3=None, *, enabled: bool = True) -> None:
        self.s3 = s3
        self.enabled = enabled
        self._start: dict[str, int] = {}

    @property
    def method(self) -> str:
        if not self.enabled:
            return "not counted (an object store without the loopback proxy)"
        if self.s3 is not None:
            return "bytes served by LoopbackS3's counting proxy (HTTP bodies + headers, listings, ranged header reads)"
        return (
            "/proc/self/io deltas of the process: read_bytes (storage reads: runai reads local files with "
            "O_DIRECT, so every byte it streams is counted, warm cache or not) + rchar (buffered read() "
            "syscalls: our header/index/config reads, served from the page cache)"
        )

    def start(self) -> None:
        if not self.enabled:
            return
        if self.s3 is not None:
            self.s3.proxy.reset()
        else:
            self._start = proc_io()

    def stop(self) -> dict[str, int]:
        if not self.enabled:
            return {}
        if self.s3 is not None:
            return {"served": self.s3.bytes_served, "requests_connections": self.s3.proxy.connections}
        now = proc_io()
        rchar = now["rchar"] - self._start["rchar"]
        read_bytes = now["read_bytes"] - self._start["read_bytes"]
        return {"read": rchar + read_bytes, "rchar": rchar, "read_bytes": read_bytes}


# -- one site: interleaved repetitions --------------------------------------------


@dataclass
class LoaderResult:
    loader: str
    seconds: list[float] = field(default_factory=list)
    bytes_read: list[dict] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    peak: Optional[dict] = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def loaders_for(site: Site, wanted: tuple[str, ...]) -> list[str]:
    chosen = [l for l in wanted if not (site.name != "local" and l in LOCAL_ONLY)]
    if not site.draft_names:
        chosen = [l for l in chosen if l != "draft"]
    return chosen


def measure_site(
    site: Site, loaders: list[str], reps: int, warmup: int, counter: ByteCounter, load_timeout: float = 900.0
) -> dict[str, LoaderResult]:
    """Every loader ``warmup + reps`` times, interleaved, the order rotating each round."""
    harness = Harness(site)
    results = {l: LoaderResult(l) for l in loaders}
    checked: set[str] = set()
    for round_index in range(warmup + reps):
        shift = round_index % len(loaders)
        order = loaders[shift:] + loaders[:shift]
        timed = round_index >= warmup
        for loader in order:
            model = harness.model_for(loader)
            verify = loader not in checked
            if verify and model is not None:
                clear_model(model)  # so a value check cannot pass on a previous loader's copy
            gc.collect()
            harness.phases.reset()
            counter.start()
            faulthandler.dump_traceback_later(load_timeout, exit=True)  # a hung load ends the run, with stacks
            started = time.perf_counter()
            try:
                delivered = harness.run(loader)
            except Exception as exc:  # recorded and reported; three strikes end the run
                results[loader].failures.append(f"round {round_index + 1}: {traceback.format_exc()}")
                print(f"  [{site.name}] round {round_index + 1} {loader}: FAILED {type(exc).__name__}: {exc}", flush=True)
                if len(results[loader].failures) >= 3:
                    raise BenchError(f"{loader} failed three times:\n" + "\n".join(results[loader].failures)) from exc
                continue
            finally:
                faulthandler.cancel_dump_traceback_later()
            seconds = time.perf_counter() - started
            read = counter.stop()
            if verify:
                harness.check(loader, delivered)
                checked.add(loader)
            elif delivered != (len(site.draft_names) if loader == "draft" else len(site.tensors)):
                raise BenchError(f"{loader}: {delivered} tensors delivered")
            tag = "" if timed else " (warm-up)"
            print(f"  [{site.name}] round {round_index + 1}/{warmup + reps} {loader:12s} {seconds:7.3f}s{tag}", flush=True)
            if timed:
                result = results[loader]
                result.seconds.append(seconds)
                result.bytes_read.append(read)
                if loader in ("robust", "draft"):
                    result.phases.append({**harness.phases.seconds, **{
                        f"store_{k}s": v for k, v in harness.phases.store_calls.items()}})  # fmt: skip
    harness.release()
    return results


def profile_robust(site: Site, top: int = 25) -> str:
    """cProfile of one more robust target load: where its Python time goes."""
    harness = Harness(site)
    profiler = cProfile.Profile()
    profiler.enable()
    harness.run("robust")
    profiler.disable()
    harness.release()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- peak memory, one child process per loader -------------------------------------


def read_status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def child_main(spec_path: str) -> None:
    """Peak resident memory of one load, in a process of its own.

    Allocates the same preallocated model every loader fills (so absolute
    peaks compare like for like), does one untimed load (lazy imports,
    library start-up), then resets the kernel's high-water mark with
    ``echo 5 > /proc/self/clear_refs`` and loads again: ``VmHWM`` afterwards
    is the peak of that load alone, ``VmHWM - VmRSS before`` what it added.
    """
    with open(spec_path) as handle:
        spec = json.load(handle)
    site = Site.from_dict(spec["site"])
    loader = spec["loader"]
    harness = Harness(site)
    harness.target_model()
    if loader == "draft":
        harness.draft_model()
    harness.run(loader)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    before = read_status()
    harness.run(loader)
    after = read_status()
    print(json.dumps({"before": before, "after": after, "peak": after["VmHWM"], "added": after["VmHWM"] - before["VmRSS"]}))


def measure_peaks(site: Site, loaders: list[str], workdir: str, reps: int = 3) -> dict[str, dict]:
    """Median peak RSS of ``reps`` children per loader, interleaved like the timings.

    One child's peak varies by tens of MiB with how far runai's ring ran
    ahead of the consumer, so a single sample cannot carry a 10% comparison.
    """
    if not loaders:
        return {}
    samples: dict[str, list[dict]] = {l: [] for l in loaders}
    failures: dict[str, list[str]] = {}
    spec_paths = {}
    for loader in loaders:
        spec_paths[loader] = os.path.join(workdir, f"child-{site.name}-{loader}.json")
        with open(spec_paths[loader], "w") as handle:
            json.dump({"site": site.as_dict(), "loader": loader}, handle)
    try:
        for round_index in range(reps):
            shift = round_index % len(loaders)
            for loader in loaders[shift:] + loaders[:shift]:
                sample = None
                for _attempt in range(3):  # a failed load (e.g. moto stalling) is retried, and reported
                    completed = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--child", spec_paths[loader]],
                        capture_output=True,
                        text=True,
                        timeout=1800,
                    )
                    if completed.returncode == 0:
                        sample = json.loads(completed.stdout.strip().splitlines()[-1])
                        break
                    failures.setdefault(loader, []).append(completed.stderr[-3000:])
                    print(f"  [{site.name}] peak RSS {loader}: child FAILED, retrying: "
                          f"{completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else completed.returncode}",
                          flush=True)  # fmt: skip
                if sample is None:
                    raise BenchError(f"peak-memory child for {loader} failed three times:\n{failures[loader][-1]}")
                samples[loader].append(sample)
                print(
                    f"  [{site.name}] peak RSS {round_index + 1}/{reps} {loader:12s} {sample['peak'] / 2**20:8.0f} MiB "
                    f"(+{sample['added'] / 2**20:.0f} MiB over the loaded-model baseline)",
                    flush=True,
                )
    finally:
        for path in spec_paths.values():
            os.unlink(path)
    return {
        loader: {
            "peak": statistics.median(s["peak"] for s in runs),
            "added": statistics.median(s["added"] for s in runs),
            "peak_min": min(s["peak"] for s in runs),
            "peak_max": max(s["peak"] for s in runs),
            "samples": runs,
            "failed_children": failures.get(loader, []),
        }
        for loader, runs in samples.items()
    }


# -- summarising -----------------------------------------------------------------


def summarise_site(site: Site, results: dict[str, LoaderResult], reps: int, warmup: int, counter_method: str) -> dict:
    rows = {}
    base = results.get(BASELINE)
    like = results.get(LIKE_FOR_LIKE)
    for loader, result in results.items():
        if not result.seconds:
            raise BenchError(f"{loader}: no successful timed load:\n" + "\n".join(result.failures))
        nbytes = site.draft_bytes if loader == "draft" else site.data_bytes
        row = {
            "label": LABELS[loader],
            "samples_s": result.seconds,
            "median_s": result.median,
            "min_s": min(result.seconds),
            "max_s": max(result.seconds),
            "bytes": nbytes,
            "throughput_gbps": nbytes / result.median / 1e9,
            "throughput_min_gbps": nbytes / max(result.seconds) / 1e9,
            "throughput_max_gbps": nbytes / min(result.seconds) / 1e9,
            "bytes_read_samples": result.bytes_read,
            "failures": result.failures,
        }
        if loader != "draft":
            if base is not None:
                row["ratio_to_runai_raw"] = base.median / result.median
            if like is not None:
                row["ratio_to_runai_copy"] = like.median / result.median
        read_key = "served" if site.bytes_counter.startswith("bytes served") else "read"
        reads = [r.get(read_key) for r in result.bytes_read if r.get(read_key) is not None]
        if reads:
            row["bytes_read_median"] = statistics.median(reads)
            row["bytes_read_ratio"] = statistics.median(reads) / nbytes if nbytes else None
        if result.phases:
            phases = {k: statistics.median(p[k] for p in result.phases) for k in result.phases[0]}
            row["store_requests"] = {"list": phases.pop("store_lists"), "read": phases.pop("store_reads")}
            row["phases_median_s"] = phases
            overhead = phases["inspection"] + phases["verification"]
            row["inspection_verification_s"] = overhead
            row["inspection_verification_share"] = overhead / result.median
        if result.peak is not None:
            row["peak_rss"] = result.peak
            if base is not None and base.peak is not None:
                row["peak_ratio_to_runai_raw"] = result.peak["peak"] / base.peak["peak"]
        rows[loader] = row
    return {
        "site": {k: v for k, v in site.as_dict().items() if k != "tensors"},
        "tensor_count": len(site.tensors),
        "reps": reps,
        "warmup": warmup,
        "bytes_counter": counter_method,
        "loaders": rows,
    }


def evaluate_targets(sites: dict[str, dict]) -> list[dict]:
    """Each target, per site, with the measured figure and whether it is met."""
    verdicts = []
    for name, summary in sites.items():
        if "error" in summary:
            continue
        rows = summary["loaders"]
        robust = rows.get("robust")
        if robust and "ratio_to_runai_raw" in robust:
            verdicts.append({
                "site": name, "target": f"robust throughput >= {TARGET_THROUGHPUT_RATIO}x raw runai",
                "value": robust["ratio_to_runai_raw"], "met": robust["ratio_to_runai_raw"] >= TARGET_THROUGHPUT_RATIO,
                "note": f"vs runai + copy (like for like): {robust.get('ratio_to_runai_copy', float('nan')):.3f}x",
            })  # fmt: skip
        if robust and "inspection_verification_share" in robust:
            verdicts.append({
                "site": name, "target": f"inspection + verification <= {TARGET_OVERHEAD_SHARE:.0%} of the load",
                "value": robust["inspection_verification_share"],
                "met": robust["inspection_verification_share"] <= TARGET_OVERHEAD_SHARE,
                "note": f"{robust['inspection_verification_s'] * 1e3:.1f} ms of {robust['median_s']:.3f} s "
                        f"({human(summary['site']['data_bytes'])} checkpoint)",
            })  # fmt: skip
        draft = rows.get("draft")
        if draft and "bytes_read_median" in draft:
            site = summary["site"]
            allowed = TARGET_DRAFT_READ_RATIO * site["draft_bytes"] + site["metadata_bytes"]
            verdicts.append({
                "site": name,
                "target": f"draft reads <= {TARGET_DRAFT_READ_RATIO}x the MTP tensors' bytes (+ headers, index, config)",
                "value": draft["bytes_read_median"] / site["draft_bytes"],
                "met": draft["bytes_read_median"] <= allowed,
                "note": f"read {human(draft['bytes_read_median'])} for {human(site['draft_bytes'])} of MTP tensors; "
                        f"allowed {human(allowed)} (metadata {human(site['metadata_bytes'])})",
            })  # fmt: skip
        if robust and "peak_ratio_to_runai_raw" in robust:
            base = rows[BASELINE]["peak_rss"]
            verdicts.append({
                "site": name, "target": f"robust peak RSS <= {TARGET_PEAK_RATIO:.2f}x raw runai's",
                "value": robust["peak_ratio_to_runai_raw"], "met": robust["peak_ratio_to_runai_raw"] <= TARGET_PEAK_RATIO,
                "note": f"{robust['peak_rss']['peak'] / 2**20:.0f} vs {base['peak'] / 2**20:.0f} MiB "
                        f"(added over the model: {robust['peak_rss']['added'] / 2**20:.0f} vs {base['added'] / 2**20:.0f} MiB)",
            })  # fmt: skip
    return verdicts


def render_tables(report: dict) -> str:
    lines = []
    for name, summary in report["sites"].items():
        lines.append("")
        if "error" in summary:
            lines.append(f"{name}: FAILED, no figures: {summary['error'].strip().splitlines()[-1]}")
            continue
        site = summary["site"]
        lines.append(
            f"{name}: {site['uri']}  {human(site['data_bytes'])} in {site['shard_files']} shard files "
            f"({site['empty_shards']} empty), {summary['tensor_count']} tensors; "
            f"median of {summary['reps']} interleaved reps after {summary['warmup']} warm-up"
        )
        header = (
            f"{'loader':36s} {'median s':>9s} {'min s':>8s} {'max s':>8s} {'GB/s':>7s} "
            f"{'x raw':>7s} {'x copy':>7s} {'read':>10s} {'peak MiB':>9s} {'+MiB':>7s}"
        )
        lines.append(header)
        lines.append("-" * len(header))
        for loader, row in summary["loaders"].items():
            peak = row.get("peak_rss")
            lines.append(
                f"{row['label']:36s} {row['median_s']:9.3f} {row['min_s']:8.3f} {row['max_s']:8.3f} "
                f"{row['throughput_gbps']:7.3f} {_ratio(row.get('ratio_to_runai_raw')):>7s} "
                f"{_ratio(row.get('ratio_to_runai_copy')):>7s} "
                f"{human(row['bytes_read_median']) if 'bytes_read_median' in row else '-':>10s} "
                f"{peak['peak'] / 2**20 if peak else float('nan'):9.0f} {peak['added'] / 2**20 if peak else float('nan'):7.0f}"
            )
        for loader, row in summary["loaders"].items():
            if row["failures"]:
                lines.append(f"{row['label']}: {len(row['failures'])} failed load(s), retried; first: "
                             f"{row['failures'][0].strip().splitlines()[-1]}")  # fmt: skip
        robust = summary["loaders"].get("robust")
        if robust and "phases_median_s" in robust:
            p = robust["phases_median_s"]
            lines.append(
                f"robust phases (median): inspection {p['inspection'] * 1e3:.1f} ms, planning "
                f"{p['planning'] * 1e3:.2f} ms, verification {p['verification'] * 1e3:.2f} ms = "
                f"{robust['inspection_verification_share']:.2%} of the load"
                + (f"; the probe listed {robust['store_requests']['list']:.0f}x and made "
                   f"{robust['store_requests']['read']:.0f} reads ({human(site['metadata_bytes'])} of headers, index, config)"
                   if "store_requests" in robust else "")
            )
        draft = summary["loaders"].get("draft")
        if draft:
            lines.append(
                f"draft: {draft['median_s']:.3f} s for {human(site['draft_bytes'])} of MTP tensors; read "
                f"{human(draft.get('bytes_read_median', float('nan')))} ({summary['bytes_counter']})"
            )
    lines.append("")
    lines.append("targets:")
    for verdict in report["targets"]:
        lines.append(
            f"  [{'met' if verdict['met'] else 'MISSED':6s}] {verdict['site']:5s} {verdict['target']}: "
            f"{verdict['value']:.3f}  ({verdict['note']})"
        )
    return "\n".join(lines)


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(report: dict, path: str) -> bool:
    """Throughput per loader, one panel per site; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'mx-strategies[bench]'); not drawing {path}")
        return False
    sites = {name: summary for name, summary in report["sites"].items() if "error" not in summary}
    if not sites:
        return False
    figure, axes = plt.subplots(1, len(sites), figsize=(6.5 * len(sites), 4.2), squeeze=False)
    for axis, (name, summary) in zip(axes[0], sites.items()):
        rows = [(l, r) for l, r in summary["loaders"].items() if l != "draft"]
        labels = [r["label"] for _, r in rows]
        values = [r["throughput_gbps"] for _, r in rows]
        low = [r["throughput_gbps"] - r["throughput_min_gbps"] for _, r in rows]
        high = [r["throughput_max_gbps"] - r["throughput_gbps"] for _, r in rows]
        colors = ["#2b8a3e" if l == "robust" else "#868e96" if l.startswith("runai") else "#1c7ed6" for l, _ in rows]
        positions = range(len(rows))
        axis.barh(positions, values, xerr=[low, high], color=colors, capsize=3)
        axis.set_yticks(list(positions), labels)
        axis.invert_yaxis()
        right = max(r["throughput_max_gbps"] for _, r in rows)
        for y, (_, row) in zip(positions, rows):
            ratio = row.get("ratio_to_runai_raw")
            copy_ratio = row.get("ratio_to_runai_copy")
            text = f"{row['throughput_gbps']:.2f} GB/s"
            if ratio is not None and copy_ratio is not None:
                text += f"\n{ratio:.2f}x raw, {copy_ratio:.2f}x copy"
            axis.text(row["throughput_max_gbps"] + right * 0.02, y, text, va="center", ha="left", fontsize=8)
        axis.set_xlim(0, right * 1.6)
        axis.set_xlabel("GB/s (median; whiskers: min-max)")
        axis.set_title(f"{name}: {human(summary['site']['data_bytes'])}, {summary['reps']} reps")
    figure.suptitle("Checkpoint load throughput (CPU only, 2 cores shared)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


# -- machine ----------------------------------------------------------------------


def machine_info() -> dict:
    import importlib.metadata as metadata

    memory = None
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((l.split(":", 1)[1].strip() for l in handle if l.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for package in ("torch", "runai-model-streamer", "modelexpress", "safetensors", "moto", "mx-strategies"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_bytes": memory,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": torch.cuda.is_available(),
        "versions": versions,
    }


def _settings_snapshot() -> dict:
    """The robust strategy's settings in force (defaults unless the environment says otherwise)."""
    from mx_strategies.settings import load_settings

    return {k: v for k, v in load_settings().model_dump(mode="json").items() if k != "model_uri"}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg())


# -- main -------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", help="measure this checkpoint (local folder or s3://...) instead of a generated one")
    parser.add_argument("--size", type=parse_size, default=parse_size("2GB"), help="generated local checkpoint size (default 2GB)")
    parser.add_argument(
        "--s3-size", type=parse_size, default=parse_size("512MB"),
        help="generated checkpoint size served by the loopback S3 server (default 512MB; moto is slow); 0 skips S3",
    )  # fmt: skip
    parser.add_argument(
        "--s3-chunk-bytes", type=parse_size, default=parse_size("64MiB"),
        help="RUNAI_STREAMER_CHUNK_BYTESIZE for every loader on the loopback S3 site (default 64MiB; 0 keeps runai's)",
    )  # fmt: skip
    parser.add_argument("--no-local", action="store_true", help="skip the local-folder measurements")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "mx-strategies-bench"),
                        help="where generated checkpoints are cached (default: %(default)s)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per loader (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    parser.add_argument("--memory", default="all",
                        help="loaders whose peak RSS is measured in a child process: all, none, or a comma list")  # fmt: skip
    parser.add_argument("--load-timeout", type=float, default=900.0,
                        help="seconds one load may take before the run is ended with stack traces (default 900)")  # fmt: skip
    parser.add_argument("--memory-reps", type=int, default=3, help="child processes per loader for peak RSS (default 3)")
    parser.add_argument("--profile", action="store_true", help="cProfile one extra robust load per site")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="draw throughput per loader here (PNG; needs matplotlib)")
    parser.add_argument("--from-json", help="print tables (and --plot) from a saved --json file; measure nothing")
    parser.add_argument("--clean", action="store_true", help="delete the generated checkpoints at the end")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0 or args.memory_reps < 1:
        parser.error("--reps and --memory-reps must be >= 1, --warmup >= 0")
    unknown = set(args.loaders.split(",")) - set(LOADERS)
    if unknown:
        parser.error(f"unknown loader(s): {', '.join(sorted(unknown))}")
    return args


def _memory_loaders(spec: str, loaders: list[str]) -> list[str]:
    if spec == "none":
        return []
    if spec == "all":
        chosen = loaders
    else:
        chosen = [l for l in loaders if l in spec.split(",")]
    if "robust" in chosen and BASELINE in loaders and BASELINE not in chosen:
        chosen = [BASELINE] + chosen  # the ratio needs the baseline
    return chosen


def run_site(
    name: str, uri: str, reference: Optional[str], args, wanted: tuple[str, ...], counter: ByteCounter, generated: bool
) -> dict:
    """One site's measurements; a failure is reported in its place, not lost with the other site's."""
    try:
        return _run_site(name, uri, reference, args, wanted, counter, generated)
    except Exception as exc:
        print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", flush=True)
        return {"error": traceback.format_exc()}


def _run_site(
    name: str, uri: str, reference: Optional[str], args, wanted: tuple[str, ...], counter: ByteCounter, generated: bool
) -> dict:
    site = describe_site(name, uri, args.workdir, reference, generated)
    site.bytes_counter = counter.method
    loaders = loaders_for(site, wanted)
    print(f"\n[{name}] {uri}: {human(site.data_bytes)}, {len(site.tensors)} tensors, loaders {', '.join(loaders)}", flush=True)
    results = measure_site(site, loaders, args.reps, args.warmup, counter, args.load_timeout)
    memory_error = None
    try:
        peaks = measure_peaks(site, _memory_loaders(args.memory, loaders), args.workdir, args.memory_reps)
    except BenchError as exc:  # the timings stand; say why the peaks are missing
        print(f"[{name}] peak memory not measured: {exc}", flush=True)
        peaks, memory_error = {}, str(exc)
    for loader, peak in peaks.items():
        results[loader].peak = peak
    summary = summarise_site(site, results, args.reps, args.warmup, counter.method)
    if memory_error:
        summary["memory_error"] = memory_error
    if args.profile and "robust" in loaders:
        summary["robust_profile"] = profile_robust(site)
    shutil.rmtree(site.config_only, ignore_errors=True)
    return summary


@contextmanager
def s3_chunking(chunk_bytes: int) -> Iterator[None]:
    """RUNAI_STREAMER_CHUNK_BYTESIZE for every loader of the loopback S3 site.

    moto answers each ranged GET by copying the whole object in Python, so
    runai's default chunks over 100 MB objects stall it past the AWS CRT's
    minimum-throughput check ("failure to meet throughput minimum", then
    "File access error"); larger chunks mean fewer such requests. Every
    loader (children included) streams with the same value.
    """
    saved = os.environ.get("RUNAI_STREAMER_CHUNK_BYTESIZE")
    if chunk_bytes > 0:
        os.environ["RUNAI_STREAMER_CHUNK_BYTESIZE"] = str(chunk_bytes)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RUNAI_STREAMER_CHUNK_BYTESIZE", None)
        else:
            os.environ["RUNAI_STREAMER_CHUNK_BYTESIZE"] = saved


def quiet_logging() -> None:
    """Warnings only: runai, moto's werkzeug and ModelExpress log every load at INFO."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    # moto's werkzeug server logs each request through a handler of its own.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        quiet_logging()
        child_main(args.child)
        return 0
    if args.from_json:
        with open(args.from_json) as handle:
            report = json.load(handle)
        print(render_tables(report))
        if args.plot:
            plot(report, args.plot)
        return 0

    quiet_logging()
    os.makedirs(args.workdir, exist_ok=True)
    wanted = tuple(l for l in LOADERS if l in args.loaders.split(","))
    report = {
        "command": " ".join([os.path.relpath(sys.argv[0]) if sys.argv[0] else "bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine_info(),
        "uptime_start": uptime(),
        "robust_settings": _settings_snapshot(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "sites": {},
    }
    print(f"start: {report['uptime_start']}", flush=True)
    generated: list[str] = []
    try:
        local_uri = s3_source = None
        if args.uri and "://" not in args.uri:
            local_uri = args.uri
        elif not args.uri and not args.no_local:
            local_uri = cached_checkpoint(args.workdir, args.size)
            generated.append(local_uri)
        if local_uri and not args.no_local:
            report["sites"]["local"] = run_site("local", local_uri, local_uri, args, wanted, ByteCounter(), generated=not args.uri)
        if args.uri and "://" in args.uri:
            report["sites"]["s3"] = run_site("s3", args.uri, None, args, wanted, ByteCounter(enabled=False), generated=False)
        elif not args.uri and args.s3_size > 0:
            s3_source = cached_checkpoint(args.workdir, args.s3_size)
            generated.append(s3_source)
            from mx_strategies.testing.loopback import LoopbackS3

            with LoopbackS3() as s3, s3_chunking(args.s3_chunk_bytes):
                started = time.perf_counter()
                uri = s3.upload(s3_source, "bench", "model")
                print(f"uploaded {s3_source} to {uri} in {time.perf_counter() - started:.1f}s", flush=True)
                report["sites"]["s3"] = run_site("s3", uri, s3_source, args, wanted, ByteCounter(s3), generated=True)
                report["sites"]["s3"]["runai_chunk_bytesize"] = args.s3_chunk_bytes
    finally:
        if args.clean:
            for path in generated:
                shutil.rmtree(path, ignore_errors=True)
    report["uptime_end"] = uptime()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    report["targets"] = evaluate_targets(report["sites"])
    report["instrumented"] = instrumentation()[1].instrumented
    print(render_tables(report))
    print(f"\nend: {report['uptime_end']}")
    for name, summary in report["sites"].items():
        if "robust_profile" in summary:
            print(f"\n[{name}] cProfile of one robust load (cumulative):\n{summary['robust_profile']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.plot:
        plot(report, args.plot)
    return 1 if any("error" in summary for summary in report["sites"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
