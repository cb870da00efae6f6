"""Bytes a load reads: plain ModelExpress 0.7.0 and 0.8 (whole shards) against robust (per tensor).

``python -m benchmarks --plain-selection``. Names and sizes only, no data:
for the demo's two checkpoints (``mx-strategies demo``: Qwen3-Next style,
``mtp.*`` in a shard of its own; DeepSeek-V3 style, the MTP layer sharing
the last shard with the last layers, empty shards in both) and for
DeepSeek-V3's released checkpoint written down as names (163 shards,
``benchmarks.rank_shares``). What plain ModelExpress streams comes from
``mx_strategies.testing.plain_modelexpress`` (each release's rule, checked
against its own code by tests/test_plain_modelexpress.py), what robust streams
from ``selection.select_tensors`` and ``planning.plan_of``, the functions a load selects
and plans with (a draft streams its own tensors; a target's module leaves the MTP
layer to the draft, which is applied here by the layer's names, as a rank share:
no module is built for a names-only checkpoint).

Plain ModelExpress streams whole files (header included); robust's figure is
the tensor data it plans (its header reads are a few MB on DeepSeek-V3).
"""

from __future__ import annotations

import json
import os
import tempfile

def _shard_map(checkpoint) -> tuple[dict, dict]:
    """``{shard: {tensor: bytes}}`` and each shard's file size, from robust's inspected Checkpoint."""
    shards = {_file_name(s.key): {n: t.nbytes for n, t in s.tensors.items()} for s in checkpoint.shards}
    sizes = {_file_name(s.key): s.size for s in checkpoint.shards}
    return shards, sizes


def _file_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _compare(name: str, checkpoint, config: dict, draft_class: str) -> dict:
    from mx_strategies.engine import EngineView
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors
    from mx_strategies.settings import load_settings
    from mx_strategies.testing.plain_modelexpress import plain_selection

    settings = load_settings()
    shards, sizes = _shard_map(checkpoint)
    target_view = EngineView(False, None, (), 1, 1, dict(config), {})
    draft_view = EngineView(True, "mtp", (), 1, 1, dict(config), {})
    from mx_strategies.select.rank_share import RankShare

    def planned(module):
        return plan_of(checkpoint, select_tensors(checkpoint, module, settings, source_is_target=True).names, settings)

    # What the target's module answers (its load_weights skips the MTP layers: tests/test_module_reads.py).
    n = config["num_hidden_layers"]
    mtp = ("mtp.",) if "num_nextn_predict_layers" not in config else tuple(
        f"model.layers.{n + i}." for i in range(config["num_nextn_predict_layers"]))
    target_plan = planned(BuiltModule(target_view, share=RankShare(mtp, {})))
    robust = {
        "target": target_plan.bytes,
        "draft": planned(BuiltModule(draft_view)).bytes,
    }
    rows = []
    for role, draft in (("target", None), ("draft", draft_class)):
        plain = {
            release: plain_selection(release, shards, draft_class=draft, config=config, shard_bytes=sizes)
            for release in ("0.7.0", "0.8")
        }
        rows.append(dict(
            role=role,
            robust_bytes=robust[role],
            plain_07_bytes=plain["0.7.0"].bytes, plain_07_shards=len(plain["0.7.0"].shards),
            plain_08_bytes=plain["0.8"].bytes, plain_08_shards=len(plain["0.8"].shards),
            shards=len(shards),
        ))  # fmt: skip
    return dict(checkpoint=name, draft_class=draft_class, checkpoint_bytes=sum(sizes.values()), rows=rows)


def run_plain_selection() -> dict:
    from mx_strategies.inspect.index import inspect
    from mx_strategies.cli.demo import CHECKPOINTS, EMPTY_SHARDS, MODEL_SHAPE
    from mx_strategies.inspect.object_stores import open_store
    from mx_strategies.testing import synthetic

    from .rank_shares import CONFIG, checkpoint

    results = []
    with tempfile.TemporaryDirectory(prefix="mx-plain-selection-") as folder:
        for spec in CHECKPOINTS:
            made = synthetic.mtp_checkpoint(os.path.join(folder, spec.name), style=spec.style,
                                            empty_shards=EMPTY_SHARDS, **MODEL_SHAPE)  # fmt: skip
            with open(os.path.join(made.path, "config.json")) as handle:
                config = json.load(handle)
            inspected = inspect(open_store(made.path), 1)
            results.append(_compare(f"demo: {spec.name}", inspected, config, spec.draft_class))
    results.append(_compare("DeepSeek-V3 (names only, 163 shards)", checkpoint(), dict(CONFIG), "DeepSeekMTP"))
    return {"checkpoints": results}


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def render_plain_selection(result: dict) -> str:
    lines = [
        "| checkpoint | load | plain ModelExpress 0.7.0 | plain ModelExpress 0.8 | robust | 0.8 over robust |",
        "|---|---|---|---|---|---|",
    ]
    for ckpt in result["checkpoints"]:
        for row in ckpt["rows"]:
            load = row["role"] if row["role"] == "target" else f"draft ({ckpt['draft_class']})"
            over = row["plain_08_bytes"] - row["robust_bytes"]
            lines.append(
                f"| {ckpt['checkpoint']} | {load} | {_size(row['plain_07_bytes'])} ({row['plain_07_shards']}/"
                f"{row['shards']} shards) | {_size(row['plain_08_bytes'])} ({row['plain_08_shards']}/{row['shards']} "
                f"shards) | {_size(row['robust_bytes'])} | +{_size(over)} ({row['plain_08_bytes'] / row['robust_bytes']:.2f}x) |"
            )
    return "\n".join(lines)


__all__ = ["render_plain_selection", "run_plain_selection"]
