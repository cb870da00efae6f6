"""Target checkpoints with each architecture's real MTP naming, written from a built vLLM draft module.

:func:`draft_checkpoint` gives every parameter of the draft a random value
(the *truth*), then writes the checkpoint tensors vLLM's ``load_weights``
turns back into that value: fused projections split into their checkpoint
parts (``qkv_proj`` -> ``q_proj``/``k_proj``/``v_proj``, ``gate_up_proj`` ->
``gate_proj``/``up_proj``, ``fused_qkv_a_proj`` -> ``q_a_proj``/
``kv_a_proj_with_mqa``, fused experts -> ``experts.{e}.*``), and module names
renamed to the checkpoint's by the per-architecture rules in :data:`RENAMES`
(the inverse of each class's ``load_weights``). Around the draft it writes
what a real target checkpoint also holds: target layers, the target's
embedding, final norm and head, and the per-MTP-layer embedding/head copies
some exporters write. The load itself proves the inverse: a wrong name is
skipped by ``load_weights`` and the completeness check names the parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mx_strategies.testing.synthetic import write_shards

FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
}

# Per-architecture overrides of FUSED (Inkling: qkvr is four checkpoint tensors, and its MLP's gate_up_proj is
# one ColumnParallelLinear the checkpoint holds whole, as mlp.w13_dn).
ARCH_FUSED = {
    "inkling": {"qkvr": ("wq_du", "wk_dv", "wv_dv", "wr_du")},
}

_MTP_BLOCK = [(r"^model\.layers\.(\d+)\.mtp_block\.", r"model.layers.\1.")]
_TARGET_LAYERS = 2  # num_hidden_layers of every tiny target (builders.BASE)
# Module name -> checkpoint name, per architecture (applied in order, first match of each rule).
RENAMES: dict[str, list[tuple[str, str | Callable[[re.Match], str]]]] = {
    "deepseek_v3": _MTP_BLOCK,
    "glm4_moe": _MTP_BLOCK,
    "glm4_moe_lite": _MTP_BLOCK,
    "pangu_ultra_moe": _MTP_BLOCK,
    "glm_ocr": [(r"^model\.layers\.(\d+)\.(mtp_block\.)?", r"model.language_model.layers.\1.")],
    "hy_v3": _MTP_BLOCK,
    "step3p5": _MTP_BLOCK + [(r"shared_head\.head\.", "shared_head.output.")],
    "bailing_hybrid": [
        (r"\.self_attn\.o_proj\.", ".attention.dense."),
        (r"\.self_attn\.", ".attention."),
        (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
    ],
    "bailing_moe_v3": [(r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias")],
    "longcat_flash": [
        (r"^model\.layers\.\d+\.(enorm|hnorm)\.weight$", r"model.mtp.layers.0.\1.m.weight"),
        (r"^model\.layers\.\d+\.eh_proj\.", "model.mtp.layers.0.eh_proj."),
        (r"^model\.layers\.\d+\.final_layernorm\.", "model.mtp.norm."),
        (r"^model\.layers\.\d+\.mtp_block\.mlp\.", "model.mtp.layers.0.transformer_layer.mlp."),
        (r"^model\.layers\.\d+\.mtp_block\.", "model.mtp.layers.0."),
        (r"^model\.embed_tokens\.", "model.mtp.embed_tokens."),
    ],
    "mimo": [(r"^model\.mtp_layers\.(\d+)\.mtp_block\.", r"model.mtp_layers.\1.")],
    "mimo_v2_flash": [],
    "ernie4_5_moe": [
        (r"^model\.layers\.\d+\.(mtp_emb_norm|mtp_hidden_norm|mtp_linear_proj)\.", r"model.\1.0."),
        (r"^model\.layers\.\d+\.mtp_block\.", "model.mtp_block.0."),
    ],
    "nemotron_h": [
        (r"^model\.embed_tokens\.", "backbone.embeddings."),
        (r"^model\.layers\.", "mtp.layers."),
    ],
    "qwen3_next": [(r"^model\.(?!embed_tokens)", "mtp.")],
    "exaone_moe": [(r"^model\.(?!embed_tokens)", "mtp.")],
    "exaone4_5": [(r"^model\.(?!embed_tokens)", "mtp.")],
    "gemma4_assistant": [(r"^model\.(pre_projection|post_projection)\.", r"\1.")],
    # HY-V4 checkpoints name MTP layer i model.mtp_layers.{i}; load_weights maps it to model.layers.{N+i}
    # (vLLM 0.32 nvidia/mtp.py:801) and adds mtp_block. but for enorm/hnorm/eh_proj/final_layernorm (nvidia/mtp.py:614).
    "hy_v4": [
        (r"^model\.layers\.(\d+)\.(?:mtp_block\.)?", lambda m: f"model.mtp_layers.{int(m.group(1)) - _TARGET_LAYERS}."),
    ],
    # Inkling (vLLM 0.32 nvidia/mtp.py:341): model.mtp.layers.{i} / model.mtp.chain_norm, the target's embed_norm as the
    # draft's backbone_embed_norm (nvidia/mtp.py:386), w13_dn / w2_md for the MLP (nvidia/mtp.py:421).
    "inkling": [
        (r"^model\.layers\.", "model.mtp.layers."),
        (r"^model\.chain_norm\.", "model.mtp.chain_norm."),
        (r"^model\.backbone_embed_norm\.", "model.llm.embed_norm."),
        (r"\.mlp\.gate_up_proj\.", ".mlp.w13_dn."),
        (r"\.mlp\.down_proj\.", ".mlp.w2_md."),
    ],
}


# vLLM >= 0.33. The Transformers modeling backend's MTP drafts (transformers/mtp.py): the module is transformers'
# MtpModel, MTP layer k at model.layers.{k} (enorm / hnorm / eh_proj / post_norm, the decoder layer as mtp_block),
# read from checkpoint layer N+k by its WeightRenaming (transformers modeling_layers.py:626); vLLM's MoE fuser puts
# the routed experts, the router and the shared experts under mlp.experts (routed_experts / gate /
# _shared_experts._layer.shared_experts).
def _transformers_mtp(first_layer: int) -> list:
    return [
        (r"\.mlp\.experts\._shared_experts\._layer\.shared_experts\.", ".mlp.shared_experts."),
        (r"\.mlp\.experts\.gate\.", ".mlp.gate."),
        (r"^model\.layers\.(\d+)\.post_norm\.", r"model.layers.\1.shared_head.norm."),
        (r"^model\.layers\.(\d+)\.(?:mtp_block\.)?", lambda m: f"model.layers.{first_layer + int(m.group(1))}."),
    ]


RENAMES["deepseek_v3-transformers"] = _transformers_mtp(61)
RENAMES["glm4_moe-transformers"] = _transformers_mtp(46)
# vLLM >= 0.33. Nemotron Parse 3.5's ParseAuxMTPModel (nemotron_parse3_5_mtp.py:34): its mapper's inverse.
RENAMES["nemotron_parse3_5"] = [
    (r"^model\.embed_tokens\.", "decoder.embed_tokens."),
    (r"^model\.extra_head\.", "decoder.extra_heads.0."),
    (r"^model\.extra_proj\.", "decoder.extra_proj.0."),
]
# vLLM >= 0.34. Nemotron-3.5-Transcribe's MTP head (Nemotron3_5TranscribeMTP, nemotron3_5_transcribe.py:634): NeMo
# names it llm.mtp.layers.{i}; _mtp_weights (:388) strips llm., NemotronHMTP.load_weights (nemotron_h_mtp.py:462) maps
# mtp.layers. to model.layers. (The MoE layer with NeMo's packed experts is not built on a CPU: builders.py.)
RENAMES["nemotron3_5_transcribe"] = [(r"^model\.layers\.", "llm.mtp.layers.")]

# Checkpoint tensors beside the draft and the target's embedding / head / norm / a layer, per architecture, that the
# draft must not be fed: Nemotron-3.5-Transcribe's TransformerEngine _extra_state (which _mtp_weights drops, also
# under llm.mtp.), its audio tower (perception.*) and CTC timestamp head (ctc_timestamp.*).
ARCH_EXTRAS = {
    "nemotron3_5_transcribe": {
        "llm.mtp.layers.0.mixer.o_proj._extra_state": lambda: torch.zeros(16, dtype=torch.uint8),
        "llm.model.layers.1.mixer.o_proj._extra_state": lambda: torch.zeros(16, dtype=torch.uint8),
        "perception.encoder.layers.0.weight": lambda: torch.ones(64, 64, dtype=torch.bfloat16),
        "ctc_timestamp.proj.weight": lambda: torch.ones(8, 64, dtype=torch.bfloat16),
    },
}

# The target's own tensors each checkpoint also holds (hidden 64, vocab 128).
TARGET_EMBED = {
    "bailing_hybrid": "model.word_embeddings.weight",
    "bailing_moe_v3": "model.word_embeddings.weight",
    "nemotron_h": "backbone.embeddings.weight",
    "glm_ocr": "model.language_model.embed_tokens.weight",
    "inkling": "model.llm.embed.weight",
    "nemotron_parse3_5": "decoder.embed_tokens.weight",
    "nemotron3_5_transcribe": "llm.model.embed_tokens.weight",
}
TARGET_LAYER = {
    "glm_ocr": "model.language_model.layers.1.",
    "nemotron_h": "backbone.layers.1.",
    "glm4_moe_lite": "model.layers.1.",
    "inkling": "model.llm.layers.1.",
    "deepseek_v3-transformers": "model.layers.60.",  # the last target layer, next to the MTP layer's regex
    "glm4_moe-transformers": "model.layers.45.",
    "nemotron_parse3_5": "decoder.layers.1.",
    "nemotron3_5_transcribe": "llm.model.layers.1.",
}
TARGET_HEAD = {"inkling": "model.llm.unembed.weight", "nemotron3_5_transcribe": "llm.lm_head.weight"}
TARGET_NORM = {"nemotron_h": "backbone.norm_f.weight", "inkling": "model.llm.norm.weight",
               "nemotron_parse3_5": "decoder.layer_norm.weight", "nemotron3_5_transcribe": "llm.model.norm.weight"}
# Exporters that write the target's embedding/head into each MTP layer too (vLLM's proposer replaces them).
LAYER_COPIES = {"deepseek_v3", "glm4_moe", "glm4_moe_lite", "pangu_ultra_moe", "glm_ocr", "hy_v3", "bailing_hybrid",
                "hy_v4", "deepseek_v3-transformers", "glm4_moe-transformers"}
# Per-MTP-layer tensors some exporters also write and the class skips (HY-V4: shared_head.*, nvidia/mtp.py:611).
LAYER_EXTRAS = {"hy_v4": ("shared_head.norm.weight",)}


def _rename(arch: str, name: str) -> str:
    for pattern, replacement in RENAMES[arch]:
        name = re.sub(pattern, replacement, name, count=1)
    return name


def _qkv_sizes(module) -> list[int]:
    head = module.head_size
    v_head = getattr(module, "v_head_size", head)
    return [module.total_num_heads * head, module.total_num_kv_heads * head, module.total_num_kv_heads * v_head]


def persistent_buffers(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Persistent buffers a checkpoint carries (Gemma-4's layer_scalar); KV-cache scales keep their defaults."""
    from mx_strategies.verify.kept import _required_names

    required = _required_names(model)
    return [(name, buf) for name, buf in model.named_buffers() if required.get(name) == "buffer"]


# A fused-MoE parameter (vLLM's) and the per-expert checkpoint suffix it is loaded from: the weight and, for a
# quantized model, its scales (block FP8 weight_scale_inv, compressed-tensors / NVFP4 weight_scale, NVFP4's
# per-tensor weight_scale_2 and input_scale).
EXPERT_LEAF = re.compile(r"^(w13|w2)_(weight|weight_scale|weight_scale_inv|weight_scale_2|input_scale)$")


def split(
    model: torch.nn.Module, name: str, value: torch.Tensor, fused: dict[str, tuple[str, ...]] = FUSED
) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint parts (module-side names) of one draft parameter's value (``fused``: ARCH_FUSED's).

    A quantized fused projection's scales split as vLLM's loader puts them back: a row per output row
    (channel scales, NVFP4's group scales), a row per ``weight_block_size[0]`` rows, rounded up (block FP8's
    ``weight_scale_inv``: a shard whose rows are not a multiple of the block, as DeepSeek's 576-row
    ``kv_a_proj_with_mqa``, has its last grid row only partly filled), or one scalar per shard (per-tensor)."""
    owner_name, leaf = name.rsplit(".", 1)
    parts = owner_name.split(".")
    expert_leaf = EXPERT_LEAF.match(leaf)
    if expert_leaf and "experts" in parts:
        base = ".".join(parts[: parts.index("experts") + 1])
        stacked, suffix = expert_leaf.groups()
        out = []
        for expert in range(value.shape[0]):
            if stacked == "w13":
                each = value[expert]  # per-tensor scales: one per shard, written as scalars
                gate, up = (each[0], each[1]) if each.shape == (2,) else each.chunk(2, dim=0)
                out += [(f"{base}.{expert}.gate_proj.{suffix}", gate), (f"{base}.{expert}.up_proj.{suffix}", up)]
            else:
                out.append((f"{base}.{expert}.down_proj.{suffix}", value[expert]))
        return out
    if parts[-1] in fused:
        owner = model.get_submodule(owner_name)
        sizes = list(getattr(owner, "output_sizes", None) or _qkv_sizes(owner))
        if parts[-1] == "qkv_proj" and len(sizes) != 3:
            sizes = _qkv_sizes(owner)
        stem = ".".join(parts[:-1])
        if value.dim() == 1 and value.shape[0] == len(sizes) != sum(sizes):  # a per-tensor scale per shard
            return [(f"{stem}.{part}.{leaf}", value[i]) for i, part in enumerate(fused[parts[-1]])]
        if value.shape[0] != sum(sizes):  # a block scale grid: ceil(rows / block_n) rows per shard
            block_n = owner.weight_block_size[0]
            sizes = [-(-size // block_n) for size in sizes]
        pieces = value.split(sizes, dim=0)
        assert len(pieces) == len(fused[parts[-1]]), (name, sizes)
        return [(f"{stem}.{part}.{leaf}", piece) for part, piece in zip(fused[parts[-1]], pieces)]
    return [(name, value)]


@dataclass
class DraftCheckpoint:
    path: str
    truth: dict[str, torch.Tensor]  # draft parameter -> the value its checkpoint tensors make
    tensors: dict[str, torch.Tensor]  # every tensor written
    draft_tensors: dict[str, str] = field(default_factory=dict)  # checkpoint name -> draft parameter
    extra: set[str] = field(default_factory=set)  # target tensors and the embedding/head copies


def random_value(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if like.dtype == torch.uint8:  # packed FP4 values, E8M0 scales: every byte pattern
        return torch.randint(0, 256, like.shape, generator=generator, dtype=torch.uint8)
    return torch.randn(like.shape, generator=generator, dtype=torch.float32).to(like.dtype)


def write_checkpoint(folder: str, tensors: dict[str, torch.Tensor], *, shards: int = 2) -> None:
    """``tensors`` in ``shards`` files with a consistent model.safetensors.index.json."""
    names = sorted(tensors)
    per_shard = max(1, -(-len(names) // shards))
    chunks = [names[i * per_shard : (i + 1) * per_shard] for i in range(shards)]
    write_shards(folder, [{n: tensors[n] for n in chunk} for chunk in chunks if chunk])


def draft_checkpoint(
    arch: str,
    model: torch.nn.Module,
    folder: str,
    *,
    skip_params: tuple[str, ...] = (),
    shards: int = 2,
    seed: int = 0,
    hidden: int = 64,
) -> DraftCheckpoint:
    """Write ``folder`` as a target checkpoint holding ``model``'s MTP weights under ``arch``'s names.

    ``hidden``: the target's hidden size, for the target tensors and per-layer copies written around the draft."""
    generator = torch.Generator().manual_seed(seed)
    truth: dict[str, torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    owner: dict[str, str] = {}
    for name, param in list(model.named_parameters()) + persistent_buffers(model):
        value = random_value(param, generator)
        truth[name] = value
        if name in skip_params:
            continue
        for part_name, part in split(model, name, value, ARCH_FUSED.get(arch, FUSED)):
            ckpt = _rename(arch, part_name)
            assert ckpt not in tensors, (arch, ckpt)
            tensors[ckpt] = part.contiguous().clone()
            owner[ckpt] = name
    extra: dict[str, torch.Tensor] = {}
    layer = TARGET_LAYER.get(arch, "model.layers.1.")
    extra[f"{layer}mlp.down_proj.weight"] = torch.randn(hidden, 128, generator=generator).to(torch.bfloat16)
    extra[f"{layer}input_layernorm.weight"] = torch.randn(hidden, generator=generator).to(torch.bfloat16)
    extra[TARGET_EMBED.get(arch, "model.embed_tokens.weight")] = torch.randn(128, hidden, generator=generator).to(
        torch.bfloat16
    )
    extra[TARGET_HEAD.get(arch, "lm_head.weight")] = torch.randn(128, hidden, generator=generator).to(torch.bfloat16)
    extra[TARGET_NORM.get(arch, "model.norm.weight")] = torch.randn(hidden, generator=generator).to(torch.bfloat16)
    if arch in LAYER_COPIES:
        for ckpt, param in list(owner.items()):
            match = re.match(r"^(model\.(?:language_model\.)?(?:mtp_)?layers\.\d+\.)", ckpt)
            if match and param.startswith("model.layers.") and ".enorm." in ckpt:
                prefix = match.group(1)
                extra.setdefault(f"{prefix}embed_tokens.weight", torch.randn(128, hidden, generator=generator).to(torch.bfloat16))
                if arch != "bailing_hybrid":
                    extra.setdefault(
                        f"{prefix}shared_head.head.weight", torch.randn(128, hidden, generator=generator).to(torch.bfloat16)
                    )
                for suffix in LAYER_EXTRAS.get(arch, ()):
                    extra.setdefault(f"{prefix}{suffix}", torch.randn(hidden, generator=generator).to(torch.bfloat16))
    if arch == "mimo_v2_flash":
        # MiMo-V2-Flash checkpoints hold more MTP layers than vLLM builds (layer 0 only).
        for ckpt in list(owner):
            if ckpt.startswith("model.mtp.layers.0."):
                extra[ckpt.replace(".layers.0.", ".layers.1.", 1)] = tensors[ckpt].clone()
    for name, make in ARCH_EXTRAS.get(arch, {}).items():
        extra[name] = make()
    for name, value in extra.items():
        if name in tensors:
            continue  # the draft's own (e.g. a per-layer head the draft keeps)
        tensors[name] = value
    write_checkpoint(folder, tensors, shards=shards)
    return DraftCheckpoint(folder, truth, tensors, owner, set(tensors) - set(owner))


__all__ = ["ARCH_EXTRAS", "ARCH_FUSED", "EXPERT_LEAF", "RENAMES", "DraftCheckpoint", "draft_checkpoint", "random_value",
           "split", "write_checkpoint"]
