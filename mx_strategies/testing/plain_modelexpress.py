"""What plain ModelExpress streams through its vLLM adapter, per release: whole shards, chosen by name.

ModelExpress's own selection, written down so the demo and the benchmark can
set it beside robust's per-tensor plan without its release, vLLM or a GPU
installed. ``tests/test_plain_modelexpress.py`` checks each rule against the
installed ModelExpress's own functions: 0.7.0's in the main venv, 0.8's in
the 0.8 venv (``scripts/test.sh``).

* **0.7.0** (``engines/vllm/adapter.py``: ``build_model_streamer_weight_iter``,
  ``_select_draft_weight_files``): a target streams every shard; an MTP draft
  the shards whose index lists a name starting with ``mtp.``, and every shard
  when no name does (every DeepSeek-V3 and GLM checkpoint).
* **0.8** (0.8.0.dev20261026, same file: ``build_model_streamer_weight_iter``,
  ``_legacy_draft_weight_rule``, ``_select_remote_weight_files``): the model's
  ``is_unused_checkpoint_weight`` when its class has one, else, for a draft of
  one of six classes, a legacy rule; a shard streams whole when one of its
  names is used, every shard when none is or no rule applies. With vLLM 0.32
  no target class has the hook: a target streams every shard. The names a
  chosen shard holds beyond the used ones are streamed and then dropped by the
  model's ``load_weights``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

RELEASES = ("0.7.0", "0.8")
# ModelExpress 0.7.0's draft prefixes (``_DRAFT_WEIGHT_PREFIXES``).
DRAFT_PREFIXES_07 = ("mtp.",)
# 0.8's legacy rule: class -> how a used name is told (``_legacy_draft_weight_rule``). The Qwen classes
# define ``is_unused_checkpoint_weight`` in vLLM 0.32 with the same rule.
QWEN_CLASSES = ("Qwen3_5MTP", "Qwen3_5MoeMTP", "Qwen3NextMTP")
LAYER_CLASSES = ("DeepSeekMTP", "Glm4MoeMTP", "Glm4MoeLiteMTP")
SHARED_KEPT_BY = {"Glm4MoeMTP": ("lm_head.weight", "model.embed_tokens.weight")}


def _spec_layer(name: str, config: Mapping) -> bool:
    """vLLM's ``get_spec_layer_idx_from_weight_name`` (``models/utils.py``) is not None."""
    count = config.get("num_nextn_predict_layers") or 0
    base = config.get("num_hidden_layers")
    if not isinstance(count, int) or count <= 0 or not isinstance(base, int) or base < 0:
        return False
    prefixes = tuple(p for i in range(count) for p in (f"model.layers.{base + i}.", f"layers.{base + i}.",
                                                        f"model.language_model.layers.{base + i}."))  # fmt: skip
    return name.startswith(prefixes)


def used_by_draft_08(draft_class: str, config: Mapping) -> Optional[Callable[[str], bool]]:
    """0.8's rule for a draft of ``draft_class``: which checkpoint names it uses; None when it has none."""
    if draft_class in QWEN_CLASSES:
        return lambda name: name.startswith("mtp.") or "embed_tokens" in name or "lm_head" in name
    if draft_class in LAYER_CLASSES:
        count, base = config.get("num_nextn_predict_layers"), config.get("num_hidden_layers")
        if not (isinstance(count, int) and count > 0 and isinstance(base, int) and base >= 0):
            return None  # the rule declines: every shard
        kept = SHARED_KEPT_BY.get(draft_class, ())
        return lambda name: _spec_layer(name, config) or name in kept
    return None


@dataclass(frozen=True)
class PlainSelection:
    """The shards plain ModelExpress streams for one load, and their bytes."""

    release: str
    role: str  # "target" or "draft"
    shards: tuple[str, ...]
    bytes: int


def plain_selection(
    release: str,
    shards: Mapping[str, Mapping[str, int]],
    *,
    draft_class: Optional[str] = None,
    config: Optional[Mapping] = None,
    shard_bytes: Optional[Mapping[str, int]] = None,
    object_store: bool = True,
) -> PlainSelection:
    """What ``release`` streams of a checkpoint given as ``{shard: {tensor: bytes}}`` (files in listing order).

    ``draft_class`` None is a target load. ``shard_bytes`` (a shard's file size, header included) defaults
    to the sum of its tensors. ``object_store``: 0.8 chooses from the index there and keeps a shard the
    index never names (an empty one); from a local folder vLLM's header filter drops it.
    """
    if release not in RELEASES:
        raise ValueError(f"release {release!r}: one of {RELEASES}")
    files: Sequence[str] = list(shards)
    chosen: Sequence[str] = files
    if draft_class is not None:
        if release == "0.7.0":
            used: Optional[Callable[[str], bool]] = lambda name: name.startswith(DRAFT_PREFIXES_07)  # noqa: E731
        else:
            used = used_by_draft_08(draft_class, config or {})
        if used is not None:
            needed = [f for f in files if any(used(name) for name in shards[f])]
            if release != "0.7.0" and object_store:  # 0.8 from the index: a shard it never names is kept
                chosen = [f for f in files if f in needed or not shards[f]] or files
            else:
                chosen = needed or files
    sizes = shard_bytes or {f: sum(shards[f].values()) for f in files}
    return PlainSelection(release, "draft" if draft_class else "target", tuple(chosen), sum(sizes[f] for f in chosen))


__all__ = ["PlainSelection", "RELEASES", "plain_selection", "used_by_draft_08"]
