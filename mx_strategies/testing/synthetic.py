"""Small generated checkpoints with MTP heads, for the demo, benchmarks and tests.

Real safetensors files written by ``safetensors.torch.save_file``, laid out
as exporters lay them out: numbered shards, an optional index, optional empty
shards, and an MTP head named in one of the two conventions users meet:

- ``qwen``: Qwen3-Next style, ``mtp.*`` in a shard of its own;
- ``deepseek``: DeepSeek-V3 style, ``model.layers.{N}.*`` mixed into the last
  shard with target tensors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
from safetensors.torch import save_file

from ..inspect.checkpoint import INDEX_NAME


@dataclass
class SyntheticCheckpoint:
    path: str
    shard_names: list[str]  # in natural order, empty shards included
    tensors: dict[str, torch.Tensor]
    draft_names: set[str]
    shared_names: set[str]
    config: dict

    @property
    def target_names(self) -> set[str]:
        return set(self.tensors)

    def nbytes(self, names: Iterable[str]) -> int:
        return sum(self.tensors[n].numel() * self.tensors[n].element_size() for n in names)


def write_shards(
    path: str,
    shards: Sequence[dict[str, torch.Tensor]],
    *,
    index: bool = True,
    write_order: Optional[Sequence[int]] = None,
    prefix: str = "model",
    subfolder: str = "",
) -> list[str]:
    """Write ``shards`` as ``{prefix}-0000i-of-0000n.safetensors`` (+ index).

    ``write_order`` permutes the order files are created in, which changes
    ``readdir``/listing order on many filesystems and stores.
    """
    os.makedirs(os.path.join(path, subfolder), exist_ok=True)
    n = len(shards)
    names = [f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    order = list(write_order) if write_order is not None else list(range(n))
    for i in order:
        save_file({k: v.contiguous() for k, v in shards[i].items()}, os.path.join(path, subfolder, names[i]))
    if index:
        weight_map = {
            name: f"{subfolder}/{names[i]}" if subfolder else names[i]
            for i, shard in enumerate(shards)
            for name in shard
        }
        total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
        with open(os.path.join(path, INDEX_NAME), "w") as handle:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=1)
    return names


def _block(prefix: str, hidden: int, generator: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    return {
        f"{prefix}.input_layernorm.weight": rand(hidden),
        f"{prefix}.self_attn.q_proj.weight": rand(hidden, hidden),
        f"{prefix}.self_attn.o_proj.weight": rand(hidden, hidden),
        f"{prefix}.mlp.down_proj.weight": rand(hidden, 2 * hidden),
    }


def mtp_checkpoint(
    path: str,
    *,
    style: str = "qwen",
    num_hidden_layers: int = 4,
    num_nextn_layers: int = 1,
    hidden: int = 64,
    vocab: int = 256,
    layers_per_shard: int = 2,
    empty_shards: Sequence[int] = (),
    index: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> SyntheticCheckpoint:
    """A tiny random-weight model with an MTP head and its config.json.

    ``empty_shards`` inserts zero-tensor shards at those positions of the
    final shard list (exporters with fixed shard counts write them).
    """
    if style not in ("qwen", "deepseek"):
        raise ValueError(f"style must be 'qwen' or 'deepseek', not {style!r}")
    generator = torch.Generator().manual_seed(seed)
    embed = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=generator).to(dtype)}
    head = {
        "model.norm.weight": torch.randn(hidden, generator=generator).to(dtype),
        "lm_head.weight": torch.randn(vocab, hidden, generator=generator).to(dtype),
    }
    layers = [_block(f"model.layers.{i}", hidden, generator, dtype) for i in range(num_hidden_layers)]

    draft: dict[str, torch.Tensor] = {}
    for i in range(num_nextn_layers):
        if style == "qwen":
            prefix = f"mtp.layers.{i}"
        else:
            prefix = f"model.layers.{num_hidden_layers + i}"
        draft.update(_block(prefix, hidden, generator, dtype))
        draft[f"{prefix}.enorm.weight" if style == "deepseek" else "mtp.pre_fc_norm_embedding.weight"] = torch.randn(
            hidden, generator=generator
        ).to(dtype)
        if style == "deepseek":
            draft[f"{prefix}.eh_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=generator).to(dtype)
            draft[f"{prefix}.shared_head.norm.weight"] = torch.randn(hidden, generator=generator).to(dtype)
    if style == "qwen":
        draft["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator).to(dtype)
        draft["mtp.norm.weight"] = torch.randn(hidden, generator=generator).to(dtype)

    shards: list[dict[str, torch.Tensor]] = [dict(embed)]
    for start in range(0, num_hidden_layers, layers_per_shard):
        shard: dict[str, torch.Tensor] = {}
        for block in layers[start : start + layers_per_shard]:
            shard.update(block)
        shards.append(shard)
    if style == "qwen":
        shards[-1].update(head)
        shards.append(draft)  # mtp.safetensors-like: the head in a shard of its own
    else:
        shards[-1].update(head)
        shards[-1].update(draft)  # DeepSeek: the MTP layer mixed with target tensors
    for position in sorted(empty_shards):
        shards.insert(position, {})

    names = write_shards(path, shards, index=index)
    # The stand-in models these checkpoints are loaded into decline robust's question (they hold every tensor),
    # so the table decides for them: the configs name targets whose MTP drafts keep a table row (their classes
    # are not built on a CPU), with the same naming as Qwen3-Next's (mtp.*) and DeepSeek-V3's (model.layers.{N}.*).
    if style == "qwen":
        config = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "num_hidden_layers": num_hidden_layers,
            "mtp_num_hidden_layers": num_nextn_layers,
            "hidden_size": hidden,
            "vocab_size": vocab,
        }
    else:
        config = {
            "architectures": ["DeepseekV32ForCausalLM"],
            "model_type": "deepseek_v32",
            "num_hidden_layers": num_hidden_layers,
            "num_nextn_predict_layers": num_nextn_layers,
            "hidden_size": hidden,
            "vocab_size": vocab,
            # DeepSeek-V3.2's sparse-attention indexer: vLLM's DeepseekV32ForCausalLM config check asserts
            # index_topk is there, and its indexer reads the other two; without them vLLM refuses the config.
            "index_topk": 16,
            "index_n_heads": 2,
            "index_head_dim": 16,
        }
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    tensors = {k: v for shard in shards for k, v in shard.items()}
    return SyntheticCheckpoint(
        path=path,
        shard_names=names,
        tensors=tensors,
        draft_names=set(draft),
        shared_names={"model.embed_tokens.weight", "lm_head.weight"},
        config=config,
    )


def config_only_copy(checkpoint_path: str, dest: str) -> str:
    """What vLLM's runai pull leaves in ``model_streamer/<hash>``: ``*.json``
    (the index too), ``*.py``, ``*.model``, and no weights."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(checkpoint_path):
        if name.endswith((".json", ".py", ".model")):
            with open(os.path.join(checkpoint_path, name), "rb") as src, open(os.path.join(dest, name), "wb") as dst:
                dst.write(src.read())
    return dest
