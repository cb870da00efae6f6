"""A checkpoint's tensors by layer and expert, for the tests of what each rank reads."""

from __future__ import annotations

import os
from typing import Optional


def tensor_sizes(folder: str) -> dict[str, int]:
    """name -> bytes of every tensor of the safetensors files in ``folder``."""
    from safetensors import safe_open

    sizes = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), "pt") as handle:
                for key in handle.keys():
                    tensor = handle.get_tensor(key)
                    sizes[key] = tensor.numel() * tensor.element_size()
    return sizes


def layer_of(name: str) -> Optional[int]:
    """The decoder layer of ``model.layers.<i>.*``, or None."""
    return int(name.split(".")[2]) if name.startswith("model.layers.") else None


def expert_of(name: str) -> Optional[int]:
    """The routed expert of ``....mlp.experts.<e>.*``, or None (shared experts, dense weights)."""
    if ".mlp.experts." not in name:
        return None
    rest = name.split(".mlp.experts.")[1].split(".")[0]
    return int(rest) if rest.isdigit() else None


def probe_bytes(folder: str) -> int:
    """What the probe reads of the checkpoint in ``folder``: each shard's header, the index and config files."""
    total = 0
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            with open(path, "rb") as handle:
                total += 8 + int.from_bytes(handle.read(8), "little")
        elif name.endswith(".json"):
            total += os.path.getsize(path)
    return total


def stage_share(sizes: dict[str, int], stage: int, mtp_layer: int) -> set[str]:
    """What a stage of two holds of a three-layer model (vLLM's get_pp_indices: layers 0-1, then 2)."""
    if stage == 0:
        return {k for k in sizes if k == "model.embed_tokens.weight" or layer_of(k) in (0, 1)}
    return {k for k in sizes if k in ("model.norm.weight", "lm_head.weight") or layer_of(k) == 2}


def expert_share(sizes: dict[str, int], rank: int, mtp_layer: int, experts: int = 8, ranks: int = 2) -> set[str]:
    """An expert-parallel rank's target share: dense weights and its experts (linear placement), no MTP layer."""
    mine = set(range(rank * experts // ranks, (rank + 1) * experts // ranks))
    return {k for k in sizes if layer_of(k) != mtp_layer and (expert_of(k) is None or expert_of(k) in mine)}
