"""Tiny real-architecture configs and vLLM's own MTP draft modules, built on the CPU.

Each entry of :data:`TARGET_CONFIGS` is the ``config.json`` of a tiny target
(hidden 64, vocab 128, 2 layers, 1 MTP layer) with the real model type and
architecture, so vLLM's ``SpeculativeConfig.hf_config_override`` turns it into
the draft config it makes for the real model. ``_remote`` marks model types
transformers 5.19 does not know: their checkpoints ship a configuration
module (``auto_map``), as the real ones do.

:func:`build_draft` builds the draft the way vLLM does (``ModelConfig``,
``SpeculativeConfig(method="mtp")``, ``initialize_model`` under
``set_current_vllm_config``), with one change for speed: vLLM inspects each
model class in a subprocess (``registry._run_in_subprocess``: a fresh Python
importing vLLM, ~30 s on these cores); :func:`in_process_inspection` runs
that inspection in this process instead, as nothing here touches CUDA.
"""

from __future__ import annotations

import json
import os
import socket
from collections import ChainMap
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Optional

BASE = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    vocab_size=128, max_position_embeddings=256, num_hidden_layers=2, rms_norm_eps=1e-6, torch_dtype="bfloat16",
    tie_word_embeddings=False, hidden_act="silu",
)


def cfg(**fields) -> dict:
    return {**BASE, **fields}


MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4)
MOE = dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=True)
TARGET_CONFIGS = {
 "deepseek_v3": cfg(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_nextn_predict_layers=1, **MOE, **MLA),
 "glm4_moe": cfg(model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], num_nextn_predict_layers=1,
                 partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True, **MOE),
 "glm4_moe_lite": cfg(model_type="glm4_moe_lite", architectures=["Glm4MoeLiteForCausalLM"], num_nextn_predict_layers=1,
                 mlp_layer_types=["dense", "sparse"], **MOE, **MLA),
 "glm_ocr": dict(model_type="glm_ocr", architectures=["GlmOcrForConditionalGeneration"], torch_dtype="bfloat16",
                 text_config=dict(model_type="glm_ocr_text", **{k: v for k, v in BASE.items() if k != "torch_dtype"},
                                  num_nextn_predict_layers=1),
                 vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2)),
 "ernie4_5_moe": cfg(model_type="ernie4_5_moe", architectures=["Ernie4_5_MoeForCausalLM"], num_nextn_predict_layers=1,
                 moe_intermediate_size=32, moe_k=2, moe_num_experts=4, moe_num_shared_experts=1, moe_layer_start_index=1,
                 moe_layer_end_index=2, moe_layer_interval=1),
 "nemotron_h": cfg(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], num_nextn_predict_layers=1,
                 hybrid_override_pattern="M*", mtp_hybrid_override_pattern="*", layers_block_type=["mamba", "attention"],
                 mtp_layers_block_type=["attention", "moe"],
                 ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=16, n_groups=1, conv_kernel=4, expand=1, chunk_size=16,
                 n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                 num_experts_per_tok=2, mlp_hidden_act="relu2", layer_norm_epsilon=1e-5),
 "qwen3_next": cfg(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        decoder_sparse_step=1, full_attention_interval=2, mtp_num_hidden_layers=1),
 "qwen3_5": cfg(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"], mtp_num_hidden_layers=1),
 "qwen3_5_moe": cfg(model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"], mtp_num_hidden_layers=1,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
 "longcat_flash": cfg(model_type="longcat_flash", architectures=["LongcatFlashForCausalLM"], num_layers=2,
        num_nextn_predict_layers=1, ffn_hidden_size=128, expert_ffn_hidden_size=32, moe_topk=2, n_routed_experts=4,
        zero_expert_num=2, routed_scaling_factor=1.0, mla_scale_q_lora=False, mla_scale_kv_lora=False, zero_expert_type="identity", **{k: v for k, v in MLA.items()}),
 "step3p5": cfg(model_type="step3p5", architectures=["Step3p5ForCausalLM"], num_nextn_predict_layers=1,
        num_experts_per_tok=2, n_routed_experts=4, moe_intermediate_size=32, share_expert_dim=32,
        mlp_layer_types=["dense", "sparse"], moe_num_experts=4, moe_top_k=2, use_moe_router_bias=True, moe_router_scaling_factor=1.0, num_attention_groups=2, att_impl_type="GQA",
        num_sliding_attention_heads=4, sliding_window=64, query_pre_attn_scalar=16),
 "hy_v3": cfg(model_type="hy_v3", architectures=["HYV3ForCausalLM"], num_nextn_predict_layers=1, num_experts=4,
        num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, expert_hidden_dim=32, route_norm=True),
 "mimo": cfg(model_type="mimo", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1, _remote=("mimo", "transformers.Qwen2Config")),
 "mimo_v2_flash": cfg(model_type="mimo_v2_flash", architectures=["MiMoV2FlashForCausalLM"], num_nextn_predict_layers=2,
        moe_intermediate_size=32, num_experts_per_tok=2, n_routed_experts=4, n_group=1, topk_group=1, head_dim=16,
        v_head_dim=16, sliding_window=64, layernorm_epsilon=1e-5, hybrid_layer_pattern=[0, 1], moe_layer_freq=[0, 1],
        swa_head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, sliding_window_size=64, attention_bias=False),
 "bailing_hybrid": cfg(model_type="bailing_hybrid", architectures=["BailingMoeV2_5ForCausalLM"], num_nextn_predict_layers=1,
        num_experts=4, num_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
        n_group=1, topk_group=1, use_bias=False, use_qkv_bias=False, moe_shared_expert_intermediate_size=32, layer_group_size=2, attention_type="mla", embedding_dropout=0.0, routed_scaling_factor=1.0, score_function="sigmoid", moe_router_enable_expert_bias=True, _remote="bailing_hybrid", **MLA),
 "bailing_moe_v3": cfg(model_type="bailing_moe_v3", architectures=["BailingMoeV3ForCausalLM"], num_nextn_predict_layers=1,
        num_experts=4, num_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
        n_group=1, topk_group=1, use_bias=False, use_qkv_bias=False, moe_shared_expert_intermediate_size=32, layer_group_size=2, short_conv_kernel_size=4, embedding_dropout=0.0, routed_scaling_factor=1.0, score_function="sigmoid", _remote="bailing_moe_v3"),
 "exaone_moe": cfg(model_type="exaone_moe", architectures=["ExaoneMoEForCausalLM"], num_nextn_predict_layers=1,
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        layer_types=["full_attention", "full_attention"], mlp_layer_types=["dense", "sparse"], sliding_window=64),
 "exaone4_5": cfg(model_type="exaone4_5", architectures=["Exaone4_5_ForConditionalGeneration"],
        num_nextn_predict_layers=1, layer_types=["full_attention", "full_attention"], sliding_window=64,
        text_config=dict(model_type="exaone4", **{k: v for k, v in BASE.items() if k != "torch_dtype"}, num_nextn_predict_layers=1,
                         layer_types=["full_attention", "full_attention"], sliding_window=64)),
 "pangu_ultra_moe": cfg(model_type="pangu_ultra_moe", architectures=["PanguUltraMoEForCausalLM"], num_nextn_predict_layers=1,
        _remote=("pangu_ultra_moe", "transformers.DeepseekV3Config"), **MOE, **MLA),
 # HY-V4 (vLLM's HYV4Config, transformers_utils/configs/hy_v4.py): dense MLPs and full (not DSA) attention build
 # on the CPU; the MTP layer copies the last entry of each list (vLLM 0.32 nvidia/mtp.py:355). iHC off: the MTP
 # layers are built without it anyway (nvidia/mtp.py:354).
 "hy_v4": cfg(model_type="hy_v4", architectures=["HYV4ForCausalLM"], num_nextn_predict_layers=1,
        moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        mlp_layer_types=["dense", "dense"], layer_types=["full_attention", "full_attention"],
        index_topk=16, index_head_dim=16, index_n_heads=2, enable_ihc=False, hc_mult=2,
        pad_token_id=None, bos_token_id=0, eos_token_id=1, **MLA),
 # Inkling's text target (models/inkling/configs.py); the MTP depths are described by mtp_config, which
 # hf_config_override promotes onto the draft config (config/speculative.py:1000).
 "inkling": cfg(model_type="inkling_model", architectures=["InklingForCausalLM"], use_embed_norm=True,
        mtp_config={"num_nextn_predict_layers": 1, "chain_hidden_post_norm": True, "local_layer_ids": []}),
}

# vLLM >= 0.33 only. The Transformers modeling backend's MTP drafts (TransformersMoEForMTP, transformers/mtp.py;
# model_impl="transformers", TARGET_MODEL_IMPL): the layers the class reads are the regex transformers hard-codes
# per model class (MtpModel.get_mtp_weights_regex, modeling_layers.py:600), model\.layers\.61.* for DeepSeek-V3
# and model\.layers\.(46|92).* for GLM-4.5, kept only at >= num_hidden_layers: hence 61 / 46 layers. Only the
# draft is built (one MTP layer, hidden 64), so the layer count costs nothing.
TARGET_CONFIGS["deepseek_v3-transformers"] = dict(TARGET_CONFIGS["deepseek_v3"], num_hidden_layers=61)
TARGET_CONFIGS["glm4_moe-transformers"] = dict(TARGET_CONFIGS["glm4_moe"], num_hidden_layers=46)
# Nemotron Parse 3.5 (RADIO encoder + mBART decoder with a causal visual prefix): hf_config_override makes
# ParseAuxMTPModel only when decoder.causal_vision_prefix (speculative.py:721); the class reads decoder.vocab_size
# and decoder.d_model (nemotron_parse3_5_mtp.py:46). The checkpoint's configuration module (auto_map, as the real
# one's) makes encoder / decoder sub-configs (REMOTE_CONFIG_CLASSES); the RADIO encoder is never built here.
TARGET_CONFIGS["nemotron_parse3_5"] = dict(
    model_type="nemotron_parse", architectures=["RadioMBartPrefixForCausalLM"], torch_dtype="bfloat16",
    tie_word_embeddings=False, _remote="nemotron_parse",
    decoder=dict(vocab_size=128, d_model=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
                 encoder_layers=0, encoder_attention_heads=4, encoder_ffn_dim=128, max_position_embeddings=256,
                 causal_vision_prefix=True, add_cross_attention=False, is_decoder=True),
    encoder=dict(patch_size=16, image_size=64, hidden_size=32),
)
# vLLM >= 0.34 only. Nemotron-3.5-Transcribe: a NeMo SpeechLM config.json (model type nemo_speechlm, vLLM's own
# Nemotron3_5TranscribeConfig, transformers_utils/configs/nemotron3_5_transcribe.py) whose decoder is llm_config, here
# the tiny NemotronH target above; hf_config_override promotes that text_config to the draft's config, model type
# nemotron3_5_transcribe_mtp, architecture Nemotron3_5TranscribeMTPModel (config/speculative.py:993). No perception /
# pe_encoder_config: the audio tower is the target's, never built here (the config then leaves audio_config empty).
# Its MTP block is the NemotronH target's ("*": the attention layer alone). The real one's is attention then MoE
# ("*E", NeMo's llm.mtp.layers.1 holding packed routed experts), but NemotronH's MoE is non-gated and vLLM 0.34's
# fused MoE refuses that on a CPU ("is_act_and_mul=False is supported only for CUDA, XPU and ROCm"): the packed
# experts are checked on names, through the class's own _mtp_weights (test_vllm_034_rows_agree_with_the_classes_own_code).
TARGET_CONFIGS["nemotron3_5_transcribe"] = dict(
    model_type="nemo_speechlm", architectures=["Nemotron3_5TranscribeForConditionalGeneration"], torch_dtype="bfloat16",
    llm_config=dict(TARGET_CONFIGS["nemotron_h"]),
)
# model_impl passed to the target's ModelConfig (None: vLLM's default, "auto"); the draft ModelConfig vLLM makes
# inherits none (speculative.py:1406), its architecture Transformers{MoE}ForMTP says it (speculative.py:1396).
TARGET_MODEL_IMPL = {"deepseek_v3-transformers": "transformers", "glm4_moe-transformers": "transformers"}
# Environment the engine's config is made (and the draft built) under, per target. Parse 3.5's MTP runs on the V2
# model runner only (VllmConfig._get_v1_model_runner_unsupported_features, config/vllm.py:3127, raises on V1), which
# vLLM picks by default but not without Triton (config/vllm.py:752), as here.
ENGINE_ENV = {"nemotron_parse3_5": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}

from helpers import configs as helper_configs  # noqa: E402
from mx_strategies.select.mtp_table import _installed_vllm  # noqa: E402
from mx_strategies.stream.streaming import streamer_environment  # noqa: E402

VLLM_VERSION = _installed_vllm() or (0, 0)

# Published Step-3.5 configs pad layer_types with one entry per MTP layer (vLLM 0.32's
# transformers_utils/configs/step3p5.py:83 and transformers 5.20's configuration_step3p7.py:186 say so; both
# cut the list to N). vLLM 0.33 (transformers 5.20's Step3p7TextConfig) types the MTP layer from that pad
# (models/step3p5.py:65); a padded "full_attention" MTP layer in a config with sliding layers then reads
# per_layer_config[N], which has N entries, and vLLM 0.33 raises IndexError itself (noticed, left alone:
# docs/mtp-architectures.md). vLLM 0.32 cuts the pad and indexes its MTP layer past the end
# (models/step3p5.py:152), so its fixture has no layer_types, as before.
if VLLM_VERSION >= (0, 33):
    TARGET_CONFIGS["step3p5"]["layer_types"] = ["full_attention", "sliding_attention", "sliding_attention"]

# LongCat's real configs scale the MLA LoRA norms while loading (mla_scale_q_lora, longcat_flash_mtp.py:48):
# the parameter is then not the checkpoint's bytes. Off here, so the byte comparison holds; the naming is the same.

# Gemma-4's assistant is a draft with a checkpoint of its own (method "mtp").
GEMMA4_ASSISTANT = dict(
    model_type="gemma4_assistant", architectures=["Gemma4AssistantForCausalLM"], torch_dtype="bfloat16",
    backbone_hidden_size=64, use_ordered_embeddings=False, tie_word_embeddings=True,
    text_config=dict(model_type="gemma4_text", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=128,
                     max_position_embeddings=256, sliding_window=64, hidden_size_per_layer_input=0,
                     vocab_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"],
                     num_kv_shared_layers=0, tie_word_embeddings=True),
)

# Targets whose own class cannot be imported here (vLLM's multimodal modules
# import torchvision, which has no torch 2.13 CPU build): the target's
# ModelConfig inspects a text-only class of the same family instead
# (hf_overrides, which vLLM does not pass on to the draft); its hf_config
# keeps every other field, and the draft config is made from config.json.
TARGET_ARCHITECTURE_STANDIN = {
    "glm_ocr": "Glm4ForCausalLM",
    "exaone4_5": "Exaone4ForCausalLM",
}

# Gemma-4's assistant drafts for a Gemma-4 target; a tiny text-only one.
GEMMA4_TARGET = dict(
    model_type="gemma4_text", architectures=["Gemma4ForCausalLM"], torch_dtype="bfloat16", hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    vocab_size=128, max_position_embeddings=256, sliding_window=64, hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True,
)

REMOTE_CONFIG = """import importlib

_module, _name = "{base}".rsplit(".", 1)


class TinyConfig(getattr(importlib.import_module(_module), _name)):
    model_type = "{model_type}"
"""


# Configuration modules that are not REMOTE_CONFIG's one-line subclass, per _remote model type.
REMOTE_CONFIG_CLASSES = {
    # A composite config as the Parse checkpoints' own (encoder and decoder sub-configs, not dicts): the override
    # and ParseAuxMTPModel read attributes of config.decoder.
    "nemotron_parse": """from transformers import MBartConfig, PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "nemotron_parse"

    def __init__(self, encoder=None, decoder=None, **kwargs):
        super().__init__(**kwargs)
        self.encoder = PretrainedConfig(**encoder) if isinstance(encoder, dict) else encoder
        self.decoder = MBartConfig(**decoder) if isinstance(decoder, dict) else decoder

    def to_dict(self):
        out = super().to_dict()
        for key in ("encoder", "decoder"):
            if isinstance(out.get(key), PretrainedConfig):
                out[key] = out[key].to_dict()
        return out
""",
}


def remote_config_module(remote) -> str:
    """The configuration module of a ``_remote`` config: ``model_type`` or ``(model_type, base class)``."""
    model_type, base = remote if isinstance(remote, tuple) else (remote, "transformers.PretrainedConfig")
    return REMOTE_CONFIG_CLASSES.get(model_type) or REMOTE_CONFIG.format(base=base, model_type=model_type)


# ``write_config(folder, name)``: config.json (and a configuration module for remote-code types) of target
# ``name`` (Gemma-4's two, or a TARGET_CONFIGS entry); returns the config.
write_config = partial(
    helper_configs.write_config,
    configs=ChainMap({"gemma4_assistant": GEMMA4_ASSISTANT, "gemma4_target": GEMMA4_TARGET}, TARGET_CONFIGS),
    remote_code=remote_config_module,
)


def engine_env(name: str):
    """ENGINE_ENV[name] set, and the environment as it was afterwards."""
    return streamer_environment(ENGINE_ENV.get(name, {}))


@contextmanager
def in_process_inspection() -> Iterator[None]:
    import vllm.model_executor.models.registry as registry

    original = registry._run_in_subprocess
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = original


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def distributed_env(vllm_config) -> Iterator[None]:
    """vLLM's world and model-parallel groups (gloo, 127.0.0.1), unless a caller already made them."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.distributed import parallel_state

    if parallel_state._WORLD is not None:
        yield
        return
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        )
        ensure_model_parallel_initialized(1, 1)
    try:
        yield
    finally:
        cleanup_dist_env_and_memory()


@dataclass
class BuiltDraft:
    module: Any  # the vLLM draft nn.Module
    vllm_config: Any
    draft_model_config: Any
    target_model_config: Any


def configs_for(
    folder: str, name: str, *, trust_remote_code: bool, draft_folder: Optional[str] = None, method: str = "mtp"
):
    """(target ModelConfig, SpeculativeConfig, draft ModelConfig) as vLLM makes them for the target in ``folder``.

    ``draft_folder``: a draft with a checkpoint of its own (Gemma-4's assistant). ``method``: the speculative
    method as a user names it (a custom method registered with vLLM 0.34's ``register_speculative_method``).
    """
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    common = dict(dtype="bfloat16", max_model_len=256, trust_remote_code=trust_remote_code)
    standin = TARGET_ARCHITECTURE_STANDIN.get(name)
    overrides = {"hf_overrides": {"architectures": [standin]}} if standin else {}
    if name in TARGET_MODEL_IMPL:
        overrides["model_impl"] = TARGET_MODEL_IMPL[name]
    target = ModelConfig(model=folder, **overrides, **common)
    spec = SpeculativeConfig(
        method=method, model=draft_folder, num_speculative_tokens=1, target_model_config=target,
        target_parallel_config=ParallelConfig(),
    )
    return target, spec, spec.draft_model_config


def engine_config(model_config, spec):
    """The VllmConfig the proposer builds the draft with: the target's (llm_base_proposer.py:1266;
    Step3p5MTPProposer puts the draft's ModelConfig in it, v1/spec_decode/step3p5.py:162)."""
    from vllm.config import CacheConfig, LoadConfig, ParallelConfig, VllmConfig

    # LoadConfig(device="cuda:0"): ModelExpress's VllmAdapter accepts only CUDA/XPU devices; nothing touches CUDA.
    # mamba_block_size = max_model_len: vLLM's CPU platform turns prefix caching off, and a hybrid
    # (mamba) target would otherwise get a block size that needs it.
    return VllmConfig(
        model_config=model_config,
        speculative_config=spec,
        parallel_config=ParallelConfig(),
        cache_config=CacheConfig(mamba_block_size=256),
        load_config=LoadConfig(load_format="modelexpress", device="cuda:0"),
    )


def build_module(vllm_config, draft_model_config):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(vllm_config), set_default_torch_dtype(draft_model_config.dtype):
        return initialize_model(vllm_config=vllm_config, model_config=draft_model_config)


def build_draft(folder: str, name: str, *, draft_folder: Optional[str] = None, method: str = "mtp") -> BuiltDraft:
    """vLLM's MTP draft for target ``name`` whose config.json is in ``folder`` (weights uninitialized).

    As the proposer does: the target's VllmConfig, the draft's ModelConfig
    (``get_model(vllm_config=..., model_config=draft_model_config)``).
    """
    config = json.load(open(os.path.join(folder, "config.json")))
    target, spec, draft = configs_for(
        folder, name, trust_remote_code="auto_map" in config, draft_folder=draft_folder, method=method
    )
    with engine_env(name):
        vc = engine_config(draft if name == "step3p5" else target, spec)
        return BuiltDraft(build_module(vc, draft), vc, draft, target)


__all__ = [
    "BuiltDraft", "GEMMA4_ASSISTANT", "GEMMA4_TARGET", "TARGET_CONFIGS", "TARGET_MODEL_IMPL", "ENGINE_ENV", "configs_for", "engine_config", "build_module", "build_draft", "distributed_env", "engine_env", "in_process_inspection",
    "write_config",
]
