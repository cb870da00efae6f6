"""What robust's verdict adds before InstantTensor loads a whole local folder (issue 47; ``python -m benchmarks --chain-guard``).

With robust switched on, ModelExpress's InstantTensor asks robust's inspection of the engine's folder before it
loads (:mod:`mx_strategies.chain_guard`): the folder's listing, index and headers, and the built module's answer to
what it reads. On a whole folder that is all it adds. Measured on vLLM 0.32's real ``DeepseekV3ForCausalLM`` at
DeepSeek-V3's full name set (~94k names, 61 layers, 256 experts, fp8; built on the meta device at tiny widths,
:func:`benchmarks.question.build`), over a local folder of 163 shards and an index holding those names with the
headers' shapes and dtypes; the data is sparse (never read: the verdict reads headers only).

Figures, medians of ``reps``, per ``MX_ROBUST_GUARD_CHAIN``: ``auto`` (the default: listing, index and headers;
the index vouches, no question), ``module`` (the module's answer asked each time: a first start) and ``module``
with the answer kept (``MX_ROBUST_READS_CACHE_DIR``: a restart): the verdict's seconds
(``chain_guard.folder_verdict``, what the guarded ``load`` runs once per load); and ``after``, the check after
InstantTensor's load (``chain_guard.checked_after``: what ``load_weights`` reported, every name the model keeps,
against the model, and the engine's per-shard record); each with its share of an InstantTensor
load of the 689 GB checkpoint at 35 GB/s (InstantTensor's own figure for one H200, FACTS.md; not measured here,
no GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import tempfile
import time
from types import SimpleNamespace

CHECKPOINT_BYTES = 689e9
INSTANT_TENSOR_GBPS = 35.0  # InstantTensor on one H200 (Qwen3-30B-A3B), its authors' figure
SHARDS = 163  # DeepSeek-V3's released checkpoint
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def write_sparse_checkpoint(folder: str, names: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """``names`` in ``SHARDS`` safetensors files with an index; the data regions sparse. Returns the data bytes."""
    ordered = sorted(names)
    per_shard = -(-len(ordered) // SHARDS)
    weight_map, total = {}, 0
    for number in range(SHARDS):
        chunk = ordered[number * per_shard : (number + 1) * per_shard]
        file = f"model-{number + 1:05d}-of-{SHARDS:05d}.safetensors"
        header, offset = {}, 0
        for name in chunk:
            shape, dtype = names[name]
            size = DTYPE_BYTES[dtype]
            for dim in shape:
                size *= dim
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(folder, file), "wb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            handle.truncate(8 + len(raw) + offset)  # sparse: the verdict reads headers only
        total += offset
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle)
    return total


def run_chain_guard(workdir: str, reps: int) -> dict:
    from vllm.config import set_current_vllm_config

    from mx_strategies.chain_guard import folder_verdict
    from mx_strategies.settings import load_settings
    from mx_strategies.verify import after as completeness

    from .question import build, checkpoint_names

    folder = tempfile.mkdtemp(prefix="chain-guard-", dir=workdir)
    built = build(folder)
    try:
        names = checkpoint_names(built.target, built.draft)
        data_bytes = write_sparse_checkpoint(folder, names)
        model_config = built.vllm_config.model_config
        ctx = SimpleNamespace(model_config=model_config, global_rank=0, identity=None,
                              adapter=SimpleNamespace(vllm_config=built.vllm_config, model_config=model_config))  # fmt: skip
        # auto: the default (the index vouches, no question); module: the module asked each time (a first start),
        # then with its answer kept (MX_ROBUST_READS_CACHE_DIR: a restart).
        modes = {"auto": ("auto", ""), "module": ("module", ""), "module_kept": ("module", os.path.join(folder, "kept"))}
        runs: dict[str, list[float]] = {mode: [] for mode in modes}
        verdicts = {}
        with set_current_vllm_config(built.vllm_config):
            for mode, (guard, cache) in modes.items():
                os.environ["MX_ROBUST_GUARD_CHAIN"] = guard
                os.environ["MX_ROBUST_READS_CACHE_DIR"] = cache
                settings = load_settings()
                if cache:
                    folder_verdict(built.target, ctx, settings)  # the first start, which keeps the answer
                for _ in range(reps):
                    started = time.perf_counter()
                    verdict = folder_verdict(built.target, ctx, settings)
                    runs[mode].append(time.perf_counter() - started)
                verdicts[mode] = verdict
            # The check after a whole load (chain_guard.checked_after): what load_weights reported (every parameter
            # and buffer name the model keeps, as a whole load reports them) against what the model keeps.
            reported = completeness.LoadedNames({name for name, _ in built.target.named_parameters()} |
                                                {name for name, _ in built.target.named_buffers()}, calls=1)  # fmt: skip
            runs["after"] = []
            for _ in range(reps):
                started = time.perf_counter()
                checked = completeness.check(built.target, reported, role="target", policy="fail")  # and the shard marks
                runs["after"].append(time.perf_counter() - started)
            verdicts["after"] = SimpleNamespace(refusal=None) if checked.complete else SimpleNamespace(refusal="incomplete")
        for name in ("MX_ROBUST_READS_CACHE_DIR", "MX_ROBUST_GUARD_CHAIN"):
            os.environ.pop(name, None)
    finally:
        built.context.__exit__(None, None, None)
        shutil.rmtree(folder, ignore_errors=True)
    load_s = CHECKPOINT_BYTES / (INSTANT_TENSOR_GBPS * 1e9)
    medians = {kind: statistics.median(times) for kind, times in runs.items()}
    return {
        "names": len(names),
        "shards": SHARDS,
        "header_data_bytes": data_bytes,
        "reps": reps,
        "verdict": {kind: (None if v is None else (v.refusal or "whole")) for kind, v in verdicts.items()},
        "seconds": {kind: round(value, 3) for kind, value in medians.items()},
        "all_seconds": {kind: [round(t, 3) for t in times] for kind, times in runs.items()},
        "instant_tensor_load_s": round(load_s, 1),
        "share_of_instant_tensor_load": {kind: round(value / load_s, 4) for kind, value in medians.items()},
    }


def render_chain_guard(result: dict) -> str:
    share = result["share_of_instant_tensor_load"]
    lines = [
        f"robust's verdict before InstantTensor: vLLM 0.32's DeepseekV3ForCausalLM, {result['names']} names in "
        f"{result['shards']} local shards and an index (sparse), medians of {result['reps']}; against InstantTensor's "
        f"{result['instant_tensor_load_s']} s for 689 GB at 35 GB/s",
    ]
    for mode, what in (("auto", "auto (default): listing, index, headers"), ("module", "module: and the module asked"),
                       ("module_kept", "module, its answer kept (a restart)"),
                       ("after", "the check after InstantTensor loaded")):  # fmt: skip
        lines.append(f"  {what:42s} {result['seconds'][mode]:.3f} s ({100 * share[mode]:.1f}%), "
                     f"verdict: {result['verdict'][mode]}")  # fmt: skip
    return "\n".join(lines)


__all__ = ["render_chain_guard", "run_chain_guard"]
