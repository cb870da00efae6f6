"""The checkpoints a run measures: sizes, the generated one, and what a site holds.

``describe_site`` reads a checkpoint's listing and headers (never tensor
data) and plans its loads with ``mx_strategies.plan.planning``, the functions the
strategy itself plans with: the target's non-empty shards in natural order,
and the MTP draft's tensors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from . import BenchError

logger = logging.getLogger("mx_strategies.bench")

SHARD_COUNT = 8
EMPTY_SHARD_POSITION = 4  # 0-based: the fifth of eight files holds no tensor
DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip

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


# The MTP layer's share of a real checkpoint: DeepSeek-V3's is about 11.5 GB of 689 GB (1.7%), Qwen3-Next-80B's
# about 1.5 GB of 80 GB (1.9%). The target leaves it to the draft; runai + copy streams it anyway.
MTP_SHARE = 0.017


def mtp_head(hidden: int, size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Qwen3-Next-style ``mtp.*`` tensors of about ``MTP_SHARE`` of ``size``: the fc, norms and experts."""
    head = {
        "mtp.fc.weight": _randn(generator, hidden, 2 * hidden),
        "mtp.norm.weight": _randn(generator, hidden),
        "mtp.pre_fc_norm_embedding.weight": _randn(generator, hidden),
        "mtp.pre_fc_norm_hidden.weight": _randn(generator, hidden),
        "mtp.layers.0.input_layernorm.weight": _randn(generator, hidden),
    }
    expert = hidden * (hidden // 2) * 2  # bf16 bytes of one expert's down projection
    have = sum(t.numel() * t.element_size() for t in head.values())
    experts = max(1, round((MTP_SHARE * size - have) / expert))
    for e in range(experts):
        head[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = _randn(generator, hidden, hidden // 2)
    return head


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
    mtp = mtp_head(hidden, size, generator)
    shards = target_shards + [mtp]
    shards.insert(EMPTY_SHARD_POSITION, {})
    write_shards(path, shards, index=True)
    # Qwen3.5's naming (mtp.*, as Qwen3-Next's). The stand-in models here are not asked (they hold every tensor),
    # so robust plans with the table, which keeps a row for Qwen3.5's draft (its class is not built on these CPUs)
    # and none for Qwen3-Next's (its module answers).
    config = {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
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
    path = os.path.join(workdir, f"checkpoint-{size}-mtp{MTP_SHARE}")
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
    tensors: dict[str, tuple[str, list[int]]]  # name -> (safetensors dtype, shape), every loadable tensor
    target_names: list[str]  # what a robust target streams: all but the MTP draft's own (selection.select_tensors)
    draft_names: list[str]
    draft_names_source: str
    data_bytes: int
    target_bytes: int  # what a robust target streams of data_bytes
    draft_bytes: int
    metadata_bytes: int  # every shard header + index + config
    config_only: str  # what vLLM's runai pull leaves: the *.json files only
    reference: Optional[str]  # a local folder with the same files, for value checks
    bytes_counter: str  # how bytes read are counted here
    identity_recheck_s: float = 0.0  # one identity re-check of the target's shards (a load does two)

    def expected(self, loader: str) -> list[str]:
        """The tensors ``loader`` delivers: the draft's own; a robust target's (all but the MTP draft's own,
        which it leaves to the draft); everything for the others (runai + copy, plain ModelExpress)."""
        if loader == "draft":
            return self.draft_names
        if loader in ("robust", "robust_quiet", "robust_observed", "robust_runai"):
            return self.target_names
        return list(self.tensors)

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
    otherwise the draft is what the strategy's planning picks (said so in
    ``draft_names_source``).
    """
    from mx_strategies.inspect.index import inspect
    from mx_strategies.engine import EngineView
    from mx_strategies.errors import DraftPlanError, InconsistentCheckpoint
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors
    from mx_strategies.settings import load_settings
    from mx_strategies.inspect.object_stores import open_store

    settings = load_settings()
    store = open_store(uri)
    checkpoint = inspect(store, settings.discovery_depth)
    target_view = EngineView(False, None, (), 1, 1, None, {})

    def planned(engine, settings):
        """The plan a load of ``engine`` streams from the target's checkpoint (the table and the conventions
        decide: no module is built here)."""
        selection = select_tensors(checkpoint, BuiltModule(engine), settings, source_is_target=True)
        return plan_of(checkpoint, selection.names, settings)

    try:
        target = planned(target_view, settings)
    except InconsistentCheckpoint as exc:
        raise BenchError(f"{uri}: {exc}") from exc
    # Every loadable tensor: what runai + copy and plain ModelExpress stream, and the models hold.
    everything = planned(target_view, settings.model_copy(update={"target_selection": "all"}))
    info = {n: i for s in everything.shards for n, i in s.tensors.items()}
    tensors = {n: (i.dtype, list(i.shape)) for n, i in info.items()}
    try:
        draft_view = EngineView(True, "mtp", (), 1, 1, None, {})
        draft = sorted(planned(draft_view, settings).expected)
        draft_source = "mx_strategies.select.selection.select_tensors (an MTP draft, default conventions)"
    except DraftPlanError:  # no MTP head: no draft load
        draft, draft_source = [], "none found"
    if generated:
        # Our generated head: every mtp.* tensor, independent of the selector.
        draft = sorted(n for n in tensors if n.startswith("mtp."))
        draft_source = "generated: every mtp.* tensor"
    listing = {o.key: o for o in store.list(settings.discovery_depth)}
    at_root = {k: o for k, o in listing.items() if posixpath.dirname(k) == checkpoint.root_key}
    json_bytes = sum(o.size for k, o in at_root.items() if k.endswith(".json"))
    identity_recheck_s = time_identity_recheck(target, settings)
    config_only = os.path.join(workdir, f"config-only-{name}-{hashlib.sha1(uri.encode()).hexdigest()[:10]}")
    _config_only_copy(store, at_root, config_only)
    return Site(
        name=name,
        uri=checkpoint.uri,
        shard_uris=everything.uris,
        shard_files=sum(1 for k in at_root if k.endswith(".safetensors")),
        empty_shards=sum(1 for p in checkpoint.problems if p.kind == "empty_shard"),
        tensors=tensors,
        target_names=sorted(target.expected),
        draft_names=draft,
        draft_names_source=draft_source,
        data_bytes=everything.bytes,
        target_bytes=target.bytes,
        draft_bytes=sum(info[n].nbytes for n in draft),
        metadata_bytes=checkpoint.metadata_bytes + json_bytes,
        config_only=config_only,
        reference=reference,
        bytes_counter="",
        identity_recheck_s=identity_recheck_s,
    )


def time_identity_recheck(plan, settings, reps: int = 3) -> float:
    """Median seconds of one ``checkpoint.source_changes`` over the plan's shards.

    A robust load re-reads every planned shard's identity (size/mtime/inode
    locally, the ETag on S3: one listing of the source) before and after
    streaming: verification's store round trips, which the load report
    counts inside its stream phase. Timed here, the way the load calls it.
    """
    import statistics

    from mx_strategies.inspect.object_stores import source_changes

    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        changed, _unknown = source_changes(plan.source, plan.shards, settings)
        samples.append(time.perf_counter() - started)
        if changed:
            raise BenchError(f"{plan.source}: shards changed while benchmarking: {changed}")
    return statistics.median(samples)


def _config_only_copy(store, at_root: dict, dest: str) -> None:
    """The *.json files of a source (index included), no weights: vLLM's runai pull."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for key, obj in at_root.items():
        if key.endswith(".json"):
            with open(os.path.join(dest, posixpath.basename(key)), "wb") as handle:
                handle.write(store.read(obj, 0, obj.size))
