"""TEST ONLY: SGLang 0.5.23's real model classes, tiny, built and loaded on the CPU.

Four targets, each with the draft SGLang builds for it when serving MTP (``--speculative-algorithm
NEXTN``, which SGLang resolves to ``EAGLE``: sglang/srt/arg_groups/speculative_hook.py:109-115):

* ``deepseek_v3``: ``DeepseekV3ForCausalLM`` (MLA, MoE with ``noaux_tc`` routing) and its draft
  ``DeepseekV3ForCausalLMNextN`` (sglang/srt/models/deepseek_nextn.py), which reads the checkpoint's
  ``model.layers.{num_hidden_layers}.*``.
* ``qwen3_next``: ``Qwen3NextForCausalLM`` (gated-delta-net linear attention every layer but each
  ``full_attention_interval``-th, MoE with a gated shared expert) and its draft
  ``Qwen3NextForCausalLMMTP`` (sglang/srt/models/qwen3_next_mtp.py), which reads ``mtp.*``.
* ``glm4_moe``: ``Glm4MoeForCausalLM`` (GLM-4.5: q/k/v biases, q/k norms, partial rotary, MoE after one
  dense layer) and its draft ``Glm4MoeForCausalLMNextN`` (sglang/srt/models/glm4_moe_nextn.py), which
  reads ``model.layers.{num_hidden_layers}.*`` as DeepSeek's does.
* ``mimo_v2_flash``: ``MiMoV2FlashForCausalLM`` (full + sliding-window attention with sink bias, MoE)
  and its draft ``MiMoV2MTP`` (sglang/srt/models/mimo_v2_nextn.py). The checkpoint has three MTP layers
  ``model.mtp.layers.{k}.*``; each multi-layer-EAGLE draft runner reads one, chosen by
  ``LoadConfig.draft_model_idx`` (``build_model(draft_model_idx=k)``).

What a caller uses:

* :data:`TINY`: the ``config.json`` of each target (hidden 64, vocab 128, 2 layers, 1 MTP layer (MiMo-V2:
  3), bf16).
* :func:`sglang_runtime`: SGLang's process state for building its classes on the CPU (published
  ``ServerArgs``, gloo WORLD and model-parallel groups), torn down at exit. World size 2 (TP=2) works:
  call it in two processes with one ``init_method``.
* :func:`write_target_checkpoint`: a sharded safetensors checkpoint under real HF names, target and
  MTP layer, random (seeded).
* :func:`build_model`: the target or the draft, as SGLang's worker builds it (``ModelConfig``,
  ``LoadConfig``, ``DeviceConfig``, ``_initialize_model``); :class:`Built`. Its parameters start as
  NaN (:func:`fill_sentinel`; ``sentinel=False`` keeps SGLang's ``torch.empty``).
* :func:`native_load` / :func:`trace_native_load`: SGLang's own ``DefaultModelLoader`` into a built
  model (the reference), with the names fed to ``load_weights`` and the names it used.
* :func:`fill_sentinel` / :func:`sentinel_parameters`: NaN in every parameter before a load, and which
  are still NaN after it (never written).
* :func:`reference_parameters`: what each parameter holds after a TP=1 load, from the tensors written.
* :func:`assert_same_parameters`: two models' parameters and buffers, bit for bit.

SGLang on the CPU needs, and gets here (nothing is patched in SGLang's files):

* ``sglang.srt.layers.rotary_embedding.base._is_cpu = True`` while the runtime is up. SGLang decides
  CPU mode once, at import, from ``SGLANG_USE_CPU_ENGINE=1`` (sglang/srt/utils/common.py:221), and that
  mode needs the CPU build of ``sgl_kernel`` (sglang/kernels/ops/kvcache/cache_move.py:10 imports it),
  which is not installed. Without CPU mode ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops``
  for its fallback kernel (rotary_embedding/base.py:122-138): ``ModuleNotFoundError: vllm``.
* DeepSeek's attention on a ``cpu`` device builds its rotary embedding with ``get_rope_cpu``, which
  accepts only YaRN scaling (rotary_embedding/factory.py:478-482; deepseek_v2.py:2065 renames
  ``rope_scaling`` to ``deepseek_yarn``): :data:`TINY` gives DeepSeek-V3 a YaRN ``rope_scaling``, as
  the real config has.
* The published ``ServerArgs`` names a dummy model (as ``sglang.test.test_utils.publish_build_topology``
  does): with a real Qwen3-Next path SGLang's resolution asserts a Mamba-cache platform
  (arg_groups/mamba_hook.py:120-121, "extra_buffer requires platform support for Mamba cache state
  snapshots."). The ``ModelConfig`` is made for the real folder (``model_path=``), as the worker does.
"""

from __future__ import annotations

import copy
import json
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from helpers import configs as helper_configs
from helpers.checkpoints import write_shard

BASE = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    vocab_size=128, max_position_embeddings=256, num_hidden_layers=2, rms_norm_eps=1e-6, torch_dtype="bfloat16",
    tie_word_embeddings=False, hidden_act="silu",
)
MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4)
MOE = dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=True)

TINY: dict[str, dict] = {
    # DeepSeek-V3's own routing (noaux_tc + sigmoid: the gate has an fp32 e_score_correction_bias) and
    # its YaRN rope_scaling (the real one: factor 40, original 4096), which get_rope_cpu requires.
    "deepseek_v3": dict(
        BASE, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_nextn_predict_layers=1,
        topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, **MOE, **MLA,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    ),
    # Layer 0 linear attention (gated delta net), layer 1 full attention; every layer MoE; one MTP layer.
    "qwen3_next": dict(
        BASE, model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        decoder_sparse_step=1, full_attention_interval=2, mtp_num_hidden_layers=1,
    ),
    # GLM-4.5: layer 0 dense, layer 1 and the NextN layer MoE (the gate has an fp32
    # e_score_correction_bias); q/k/v biases, per-head q/k norms, rotary on half of each head.
    "glm4_moe": dict(
        BASE, model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], num_nextn_predict_layers=1,
        partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True, **MOE,
    ),
    # MiMo-V2-Flash: layer 0 full attention + dense MLP, layer 1 sliding-window attention (with its
    # per-head attention-sink bias) + MoE (noaux_tc); THREE MTP layers at model.mtp.layers.{k} (the
    # real checkpoint has 3), each a sliding-window attention layer with a dense MLP.
    "mimo_v2_flash": dict(
        BASE, model_type="mimo_v2_flash", architectures=["MiMoV2FlashForCausalLM"], num_nextn_predict_layers=3,
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, topk_method="noaux_tc", scoring_func="sigmoid",
        v_head_dim=16, layernorm_epsilon=1e-5, hybrid_layer_pattern=[0, 1], moe_layer_freq=[0, 1],
        layer_types=["full_attention", "sliding_attention"], mlp_layer_types=["dense", "sparse"],
        swa_head_dim=16, swa_v_head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2,
        sliding_window=64, sliding_window_size=64, attention_bias=False, add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False, encoder_only=False,
        # A flat rope_parameters: transformers 5.19's MiMoV2FlashConfig defaults it to a dict per layer type,
        # which SGLang 0.5.23 reads back as rope_scaling (config.rope_scaling aliases rope_parameters) and
        # hands get_rope as a cache key: "TypeError: unhashable type: 'dict'" (rotary_embedding/factory.py:107).
        # rope_type "default" is what MiMoV2DecoderLayer turns into no scaling (mimo_v2.py:869-876).
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}

# (target class, draft class) per target: ModelConfig._config_draft_model renames the architecture
# for a draft (sglang/srt/configs/model_config.py:1032-1036 and :1134-1136).
ARCHITECTURES = {
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN"),
    "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3NextForCausalLMMTP"),
    "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeForCausalLMNextN"),  # model_config.py:1063-1064
    "mimo_v2_flash": ("MiMoV2FlashForCausalLM", "MiMoV2MTP"),  # model_config.py:1094-1096
}


# --------------------------------------------------------------------------------------------------
# The runtime
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Runtime:
    """What :func:`sglang_runtime` set up."""

    server_args: Any  # the published sglang.srt.server_args.ServerArgs
    rank: int
    world_size: int
    tp: int
    init_method: str


@contextmanager
def sglang_runtime(
    *,
    rank: int = 0,
    world_size: int = 1,
    init_method: Optional[str] = None,
    tp: Optional[int] = None,
    speculative_algorithm: Optional[str] = "EAGLE",
    model_path: str = "dummy",
) -> Iterator[Runtime]:
    """SGLang's process state for building its model classes on the CPU; all of it undone at exit.

    What ``init_parallel_runtime`` (sglang/srt/distributed/bootstrap.py:90, ``_init_parallel_groups``
    at :304-343) does for a worker, on gloo: publish the ``ServerArgs`` (``runtime_context.publish`` with
    this rank's ``SpawnRanks``: SGLang 0.5.23 reads every width and rank from it, and
    ``initialize_model_parallel`` takes no sizes, parallel_state.py:2566), then
    ``init_distributed_environment(backend="gloo")``, ``initialize_model_parallel`` and
    ``initialize_dp_attention``. ``tp`` (default ``world_size``) is the published ``tp_size``; SGLang
    requires ``world_size == tp * pp`` (pp is 1). ``speculative_algorithm``: the resolved name a server
    started with ``--speculative-algorithm NEXTN`` publishes (``EAGLE``), which the draft's
    ``ModelConfig`` records; ``None`` for a server without a draft. ``model_path``: the server's
    ``--model-path`` (a dummy by default: a real Qwen3-Next folder trips SGLang's Mamba-cache check).

    At exit: ``destroy_model_parallel``, ``destroy_distributed_environment`` (the process group too)
    and the runtime context as it was, so another build can follow in the same process. Two
    processes with one ``init_method`` (``tcp://127.0.0.1:PORT``), ranks 0 and 1, make TP=2.
    """
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.server_args import ServerArgs

    tp = world_size if tp is None else tp
    if torch.distributed.is_initialized() or parallel_state._WORLD is not None:
        raise RuntimeError("sglang_runtime: a process group already exists in this process")
    init_method = init_method or f"tcp://127.0.0.1:{free_port()}"
    saved_context = runtime_context.snapshot_context()
    saved_is_cpu = rope_base._is_cpu
    rope_base._is_cpu = True
    try:
        server_args = ServerArgs(
            model_path=model_path, device="cpu", tp_size=tp, speculative_algorithm=speculative_algorithm,
        )
        runtime_context.reset_context()
        runtime_context.publish(server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=rank))
        parallel_state.init_distributed_environment(
            world_size=world_size, rank=rank, local_rank=rank, backend="gloo", distributed_init_method=init_method,
        )
        parallel_state.initialize_model_parallel(backend="gloo")
        initialize_dp_attention(server_args=server_args)
        yield Runtime(server_args=server_args, rank=rank, world_size=world_size, tp=tp, init_method=init_method)
    finally:
        try:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
        finally:
            runtime_context.reset_context()
            runtime_context.restore_context(saved_context)
            rope_base._is_cpu = saved_is_cpu


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------

Spec = tuple[str, tuple[int, ...], torch.dtype]
BF16, FP32 = torch.bfloat16, torch.float32


def _nextn_layer_extras(p: str, V: int, H: int) -> list["Spec"]:
    """What a DeepSeek-style NextN layer (DeepSeek-V3, GLM-4.5) holds beside a decoder layer's tensors."""
    return [(p + "embed_tokens.weight", (V, H), BF16), (p + "enorm.weight", (H,), BF16),
            (p + "hnorm.weight", (H,), BF16), (p + "eh_proj.weight", (H, 2 * H), BF16),
            (p + "shared_head.norm.weight", (H,), BF16), (p + "shared_head.head.weight", (V, H), BF16)]


def _dense_mlp(p: str, inter: int, H: int) -> list["Spec"]:
    return [(p + "mlp.gate_proj.weight", (inter, H), BF16), (p + "mlp.up_proj.weight", (inter, H), BF16),
            (p + "mlp.down_proj.weight", (H, inter), BF16)]


def _routed_moe(p: str, H: int, experts: int, moe_i: int, shared_i: int) -> list["Spec"]:
    """DeepSeek-style MoE (DeepSeek-V3, GLM-4.5): noaux_tc gate with its fp32 bias, experts, a shared expert."""
    out = [(p + "mlp.gate.weight", (experts, H), BF16), (p + "mlp.gate.e_score_correction_bias", (experts,), FP32)]
    for e in range(experts):
        out += [(p + f"mlp.experts.{e}.gate_proj.weight", (moe_i, H), BF16),
                (p + f"mlp.experts.{e}.up_proj.weight", (moe_i, H), BF16),
                (p + f"mlp.experts.{e}.down_proj.weight", (H, moe_i), BF16)]
    return out + [(p + "mlp.shared_experts.gate_proj.weight", (shared_i, H), BF16),
                  (p + "mlp.shared_experts.up_proj.weight", (shared_i, H), BF16),
                  (p + "mlp.shared_experts.down_proj.weight", (H, shared_i), BF16)]


def _deepseek_v3_tensors(cfg: dict) -> list[Spec]:
    """Every tensor of a DeepSeek-V3 checkpoint (HF names), the MTP layer at model.layers.{N}."""
    H, V, heads = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    nope, rope, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    n_layers, n_mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    experts, moe_i, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    shared_i = moe_i * cfg["n_shared_experts"]
    out: list[Spec] = [("model.embed_tokens.weight", (V, H), BF16)]
    for i in range(n_layers + n_mtp):
        p = f"model.layers.{i}."
        if i >= n_layers:  # the MTP layer: its own embedding, projections and head (DeepSeek-V3's config.json)
            out += _nextn_layer_extras(p, V, H)
        out += [(p + "input_layernorm.weight", (H,), BF16), (p + "post_attention_layernorm.weight", (H,), BF16),
                (p + "self_attn.q_a_proj.weight", (q_lora, H), BF16),
                (p + "self_attn.q_a_layernorm.weight", (q_lora,), BF16),
                (p + "self_attn.q_b_proj.weight", (heads * (nope + rope), q_lora), BF16),
                (p + "self_attn.kv_a_proj_with_mqa.weight", (kv_lora + rope, H), BF16),
                (p + "self_attn.kv_a_layernorm.weight", (kv_lora,), BF16),
                (p + "self_attn.kv_b_proj.weight", (heads * (nope + v_dim), kv_lora), BF16),
                (p + "self_attn.o_proj.weight", (H, heads * v_dim), BF16)]
        moe = i >= n_layers or (i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0)
        if not moe:
            out += _dense_mlp(p, inter, H)
            continue
        out += _routed_moe(p, H, experts, moe_i, shared_i)
    out += [("model.norm.weight", (H,), BF16), ("lm_head.weight", (V, H), BF16)]
    return out


def _qwen3_next_layer(p: str, cfg: dict, full_attention: bool) -> list[Spec]:
    H, heads, kv_heads, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out: list[Spec] = [(p + "input_layernorm.weight", (H,), BF16), (p + "post_attention_layernorm.weight", (H,), BF16)]
    if full_attention:
        # q_proj carries the output gate too (attn_output_gate, Qwen3-Next's default): 2 x heads x head_dim.
        out += [(p + "self_attn.q_proj.weight", (2 * heads * hd, H), BF16),
                (p + "self_attn.k_proj.weight", (kv_heads * hd, H), BF16),
                (p + "self_attn.v_proj.weight", (kv_heads * hd, H), BF16),
                (p + "self_attn.o_proj.weight", (H, heads * hd), BF16),
                (p + "self_attn.q_norm.weight", (hd,), BF16), (p + "self_attn.k_norm.weight", (hd,), BF16)]
    else:
        k_heads, v_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        key_dim, value_dim = k_heads * cfg["linear_key_head_dim"], v_heads * cfg["linear_value_head_dim"]
        # The released checkpoints ship in_proj_qkvz / in_proj_ba fused (SGLang loads them with
        # shard_id None: Qwen3GatedDeltaNet._make_packed_weight_loader, qwen3_next.py:306).
        out += [(p + "linear_attn.in_proj_qkvz.weight", (2 * key_dim + 2 * value_dim, H), BF16),
                (p + "linear_attn.in_proj_ba.weight", (2 * v_heads, H), BF16),
                (p + "linear_attn.conv1d.weight", (2 * key_dim + value_dim, 1, cfg["linear_conv_kernel_dim"]), BF16),
                (p + "linear_attn.dt_bias", (v_heads,), BF16),
                # SGLang keeps A_log in fp32 (qwen3_next.py:217); written fp32 here.
                (p + "linear_attn.A_log", (v_heads,), FP32),
                (p + "linear_attn.norm.weight", (cfg["linear_value_head_dim"],), BF16),
                (p + "linear_attn.out_proj.weight", (H, value_dim), BF16)]
    experts, moe_i, shared_i = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    out.append((p + "mlp.gate.weight", (experts, H), BF16))
    for e in range(experts):
        out += [(p + f"mlp.experts.{e}.gate_proj.weight", (moe_i, H), BF16),
                (p + f"mlp.experts.{e}.up_proj.weight", (moe_i, H), BF16),
                (p + f"mlp.experts.{e}.down_proj.weight", (H, moe_i), BF16)]
    out += [(p + "mlp.shared_expert.gate_proj.weight", (shared_i, H), BF16),
            (p + "mlp.shared_expert.up_proj.weight", (shared_i, H), BF16),
            (p + "mlp.shared_expert.down_proj.weight", (H, shared_i), BF16),
            (p + "mlp.shared_expert_gate.weight", (1, H), BF16)]
    return out


def _qwen3_next_tensors(cfg: dict) -> list[Spec]:
    """Every tensor of a Qwen3-Next checkpoint (HF names), the MTP module under mtp.*."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    out: list[Spec] = [("model.embed_tokens.weight", (V, H), BF16)]
    for i in range(cfg["num_hidden_layers"]):
        out += _qwen3_next_layer(f"model.layers.{i}.", cfg, (i + 1) % cfg["full_attention_interval"] == 0)
    out += [("model.norm.weight", (H,), BF16), ("lm_head.weight", (V, H), BF16)]
    # The MTP module: no embedding or head of its own (the draft shares the target's).
    out += [("mtp.fc.weight", (H, 2 * H), BF16), ("mtp.pre_fc_norm_embedding.weight", (H,), BF16),
            ("mtp.pre_fc_norm_hidden.weight", (H,), BF16)]
    for j in range(cfg["mtp_num_hidden_layers"]):
        out += _qwen3_next_layer(f"mtp.layers.{j}.", cfg, True)
    out.append(("mtp.norm.weight", (H,), BF16))
    return out


def _glm4_moe_tensors(cfg: dict) -> list[Spec]:
    """Every tensor of a GLM-4.5 checkpoint (HF names), the NextN layer at model.layers.{N} (as DeepSeek-V3's)."""
    H, V, heads, kv_heads, hd = (cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"],
                                 cfg["num_key_value_heads"], cfg["head_dim"])
    n_layers, n_mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    experts, moe_i, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    shared_i = moe_i * cfg["n_shared_experts"]
    out: list[Spec] = [("model.embed_tokens.weight", (V, H), BF16)]
    for i in range(n_layers + n_mtp):
        p = f"model.layers.{i}."
        if i >= n_layers:  # the NextN layer: its own embedding, projections and head, as GLM-4.5's checkpoint has
            out += _nextn_layer_extras(p, V, H)
        out += [(p + "input_layernorm.weight", (H,), BF16), (p + "post_attention_layernorm.weight", (H,), BF16),
                (p + "self_attn.q_proj.weight", (heads * hd, H), BF16), (p + "self_attn.q_proj.bias", (heads * hd,), BF16),
                (p + "self_attn.k_proj.weight", (kv_heads * hd, H), BF16),
                (p + "self_attn.k_proj.bias", (kv_heads * hd,), BF16),
                (p + "self_attn.v_proj.weight", (kv_heads * hd, H), BF16),
                (p + "self_attn.v_proj.bias", (kv_heads * hd,), BF16),
                (p + "self_attn.o_proj.weight", (H, heads * hd), BF16),
                (p + "self_attn.q_norm.weight", (hd,), BF16), (p + "self_attn.k_norm.weight", (hd,), BF16)]
        if i < n_layers and i < cfg["first_k_dense_replace"]:
            out += _dense_mlp(p, inter, H)
            continue
        out += _routed_moe(p, H, experts, moe_i, shared_i)
    out += [("model.norm.weight", (H,), BF16), ("lm_head.weight", (V, H), BF16)]
    return out


def _mimo_v2_attention(p: str, heads: int, kv_heads: int, hd: int, v_hd: int, H: int, sink: bool) -> list[Spec]:
    out: list[Spec] = [(p + "self_attn.q_proj.weight", (heads * hd, H), BF16),
                       (p + "self_attn.k_proj.weight", (kv_heads * hd, H), BF16),
                       (p + "self_attn.v_proj.weight", (kv_heads * v_hd, H), BF16),
                       (p + "self_attn.o_proj.weight", (H, heads * v_hd), BF16)]
    if sink:
        out.append((p + "self_attn.attention_sink_bias", (heads,), BF16))
    return out


def _mimo_v2_flash_tensors(cfg: dict) -> list[Spec]:
    """Every tensor of a MiMo-V2-Flash checkpoint (HF names), its MTP layers at model.mtp.layers.{k}."""
    H, V, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    experts, moe_i = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    full = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["v_head_dim"])
    swa = (cfg["swa_num_attention_heads"], cfg["swa_num_key_value_heads"], cfg["swa_head_dim"], cfg["swa_v_head_dim"])
    out: list[Spec] = [("model.embed_tokens.weight", (V, H), BF16)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        is_swa = cfg["hybrid_layer_pattern"][i] == 1
        out += [(p + "input_layernorm.weight", (H,), BF16), (p + "post_attention_layernorm.weight", (H,), BF16)]
        out += _mimo_v2_attention(p, *(swa if is_swa else full), H,
                                  cfg["add_swa_attention_sink_bias" if is_swa else "add_full_attention_sink_bias"])
        if not cfg["moe_layer_freq"][i]:
            out += _dense_mlp(p, inter, H)
            continue
        out += [(p + "mlp.gate.weight", (experts, H), BF16), (p + "mlp.gate.e_score_correction_bias", (experts,), FP32)]
        for e in range(experts):
            out += [(p + f"mlp.experts.{e}.gate_proj.weight", (moe_i, H), BF16),
                    (p + f"mlp.experts.{e}.up_proj.weight", (moe_i, H), BF16),
                    (p + f"mlp.experts.{e}.down_proj.weight", (H, moe_i), BF16)]
    out += [("model.norm.weight", (H,), BF16), ("lm_head.weight", (V, H), BF16)]
    # The MTP layers: sliding-window attention and a dense MLP each (MiMoV2MTPLayer, mimo_v2_nextn.py:60); the
    # draft's load_weights renames pre_mlp_layernorm to post_attention_layernorm (mimo_v2_nextn.py:365).
    for k in range(cfg["num_nextn_predict_layers"]):
        p = f"model.mtp.layers.{k}."
        out += [(p + "enorm.weight", (H,), BF16), (p + "hnorm.weight", (H,), BF16),
                (p + "eh_proj.weight", (H, 2 * H), BF16), (p + "input_layernorm.weight", (H,), BF16),
                (p + "pre_mlp_layernorm.weight", (H,), BF16)]
        out += _mimo_v2_attention(p, *swa, H, cfg["add_swa_attention_sink_bias"])
        out += _dense_mlp(p, inter, H)
        out.append((p + "final_layernorm.weight", (H,), BF16))
    return out


CHECKPOINT_TENSORS: dict[str, Callable[[dict], list[Spec]]] = {
    "deepseek_v3": _deepseek_v3_tensors,
    "qwen3_next": _qwen3_next_tensors,
    "glm4_moe": _glm4_moe_tensors,
    "mimo_v2_flash": _mimo_v2_flash_tensors,
}


def checkpoint_specs(name: str) -> list[Spec]:
    """(name, shape, dtype) of every tensor :func:`write_target_checkpoint` writes for target ``name``."""
    return CHECKPOINT_TENSORS[name](TINY[name])


# ``write_config(folder, name)``: config.json of target ``name`` (TINY's, read at the call); returns the config.
write_config = partial(helper_configs.write_config, configs=TINY, indent=1)


def write_target_checkpoint(folder: str, name: str, *, shards: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """config.json and a ``shards``-file safetensors checkpoint (+ model.safetensors.index.json) of target
    ``name``: the target's tensors and its MTP layer's, under the names the released checkpoint uses,
    random (``seed``), bf16 (fp32 where SGLang keeps fp32: DeepSeek's e_score_correction_bias, which the
    real checkpoint has in fp32, and Qwen3-Next's A_log). Files hold contiguous runs of tensors in
    checkpoint order, as a real sharded checkpoint does. Returns the tensors written, by name.

    ModelConfig needs config.json only (no tokenizer: nothing here tokenizes).
    """
    write_config(folder, name)
    specs = checkpoint_specs(name)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for tensor_name, shape, dtype in specs:
        tensors[tensor_name] = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
    shards = max(1, min(shards, len(specs)))
    per_shard, extra = divmod(len(specs), shards)
    weight_map: dict[str, str] = {}
    total = start = 0
    for index in range(shards):
        count = per_shard + (1 if index < extra else 0)
        names = [spec[0] for spec in specs[start:start + count]]
        start += count
        filename = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        write_shard(os.path.join(folder, filename), {n: tensors[n] for n in names}, metadata={"format": "pt"})
        for n in names:
            weight_map[n] = filename
            total += tensors[n].numel() * tensors[n].element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=1)
    return tensors


# --------------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------------


@dataclass
class Built:
    model: torch.nn.Module
    model_config: Any  # sglang.srt.configs.model_config.ModelConfig
    load_config: Any  # sglang.srt.configs.load_config.LoadConfig
    device_config: Any  # sglang.srt.configs.device_config.DeviceConfig


def model_config_for(folder: str, *, draft: bool):
    """The ``ModelConfig`` SGLang's worker makes for the checkpoint in ``folder``.

    ``TpModelWorker._init_model_config`` (sglang/srt/managers/tp_worker.py:465-482):
    ``ModelConfig.from_server_args(server_args, model_path=..., is_draft_model=self.is_draft_worker)``,
    the draft's path being ``speculative_draft_model_path`` (an MTP draft: the target's folder).
    ``from_server_args`` (configs/model_config.py:924-979) passes ``is_draft_model`` and the published
    ``speculative_algorithm``; ``ModelConfig.__init__`` then calls ``_config_draft_model``
    (model_config.py:720), which for a draft renames ``architectures[0]``:
    ``DeepseekV3ForCausalLM`` -> ``DeepseekV3ForCausalLMNextN`` (:1032-1036),
    ``Qwen3NextForCausalLM`` -> ``Qwen3NextForCausalLMMTP`` with ``num_nextn_predict_layers = 1``
    (:1134-1136). Needs :func:`sglang_runtime` (the published ServerArgs).
    """
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import get_server_args

    return ModelConfig.from_server_args(get_server_args(), model_path=folder, is_draft_model=draft)


def build_model(
    folder: str, *, draft: bool, tp_rank: int = 0, sentinel: bool = True, draft_model_idx: Optional[int] = None,
) -> Built:
    """SGLang's model for the checkpoint in ``folder`` (the target, or with ``draft`` its MTP draft), on the
    CPU. With ``sentinel`` (the default) every parameter then holds :func:`fill_sentinel`'s NaN, so what a
    load never writes is deterministic (two builds compare equal) and shows in :func:`sentinel_parameters`
    (a draft's embedding and head: the target's at run time); ``sentinel=False`` leaves the values
    SGLang's constructors give (mostly ``torch.empty``).

    ``ModelConfig``: :func:`model_config_for`. ``LoadConfig``: what ``build_load_config``
    (model_executor/model_runner_components/load_model_utils.py:200) makes for a worker with this
    server's defaults: ``load_format`` auto, ``tp_rank``, ``draft_model_idx`` None (no multi-layer
    EAGLE) unless given: under multi-layer EAGLE (MiMo-V2) draft runner ``k`` gets ``draft_model_idx=k``
    (managers/tp_worker.py:498 and :519), which ``_initialize_model`` passes to the class
    (loader.py:305-306) and SGLang's weight iterator filters on (loader.py:729-757). ``DeviceConfig("cpu")``. The model: ``_initialize_model`` (model_loader/loader.py:285)
    under ``set_default_torch_dtype(model_config.dtype)`` and the target device, with the quantization
    config SGLang derives (None here), as ``DefaultModelLoader.load_model`` does (loader.py:996-1018).
    ``tp_rank`` must be the rank :func:`sglang_runtime` published.
    """
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig, LoadFormat
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_parallel

    if get_parallel().tp_rank != tp_rank:
        raise ValueError(f"build_model(tp_rank={tp_rank}) in a runtime published for tp_rank {get_parallel().tp_rank}")
    model_config = model_config_for(folder, draft=draft)
    load_config = LoadConfig(load_format=LoadFormat.AUTO, tp_rank=tp_rank, draft_model_idx=draft_model_idx)
    device_config = DeviceConfig("cpu")
    quant_config = _get_quantization_config(model_config, load_config)
    with set_default_torch_dtype(model_config.dtype):
        with torch.device(device_config.device):
            model = _initialize_model(model_config, load_config, quant_config)
    if sentinel:
        fill_sentinel(model)
    return Built(model=model, model_config=model_config, load_config=load_config, device_config=device_config)


# --------------------------------------------------------------------------------------------------
# SGLang's own load, traced
# --------------------------------------------------------------------------------------------------

# Tensor methods that read no values: a loader asking a checkpoint tensor these has not used it.
_METADATA_ONLY = frozenset({
    "__get__", "size", "dim", "numel", "nelement", "ndimension", "is_contiguous", "element_size", "stride",
    "storage_offset", "data_ptr", "untyped_storage", "get_device", "is_floating_point", "is_complex",
    "__len__", "__repr__", "__format__",
})


class _CheckpointTensor(torch.Tensor):
    """A checkpoint tensor that notes its name when any torch operation reads it (copy_, narrow, cat, ...).

    Results are plain tensors: only the tensors the checkpoint iterator yielded are traced.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") not in _METADATA_ONLY:
            for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(leaf, _CheckpointTensor):
                    sink = leaf.__dict__.get("_mx_sink")
                    if sink is not None:
                        sink(leaf.__dict__["_mx_name"])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


@dataclass
class LoadTrace:
    fed: list[str] = field(default_factory=list)  # names the iterator gave load_weights, in order
    consumed: set[str] = field(default_factory=set)  # names whose values load_weights read

    @property
    def skipped(self) -> set[str]:
        return set(self.fed) - self.consumed


def _traced(weights: Iterable[tuple[str, torch.Tensor]], trace: LoadTrace) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        trace.fed.append(name)
        if isinstance(tensor, torch.Tensor) and type(tensor) is torch.Tensor:
            traced = tensor.as_subclass(_CheckpointTensor)
            traced._mx_name = name
            traced._mx_sink = trace.consumed.add
            tensor = traced
        yield name, tensor


def trace_native_load(built: Built, folder: Optional[str] = None) -> LoadTrace:
    """Load ``folder`` (default: the built model's) into ``built.model`` with SGLang's own
    ``DefaultModelLoader``, as ModelExpress's ``SglangAdapter.load_via_native`` does
    (``_get_all_weights`` then ``DefaultModelLoader.load_weights_and_postprocess``) and as
    ``DefaultModelLoader.load_model`` does (loader.py:1012-1022: under ``set_default_torch_dtype``).
    Returns the names the model's ``load_weights`` was fed and those whose values it read.
    """
    from sglang.srt.configs.load_config import LoadFormat
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    model_config = built.model_config
    if folder is not None and os.path.realpath(folder) != os.path.realpath(model_config.model_path):
        model_config = copy.copy(model_config)
        model_config.model_path = folder
    load_config = copy.copy(built.load_config)
    load_config.load_format = LoadFormat.AUTO
    loader = DefaultModelLoader(load_config)
    trace = LoadTrace()
    weights = _traced(loader._get_all_weights(model_config, built.model), trace)
    with set_default_torch_dtype(model_config.dtype):
        DefaultModelLoader.load_weights_and_postprocess(built.model, weights, torch.device(built.device_config.device))
    return trace


def native_load(built: Built, folder: Optional[str] = None) -> set[str]:
    """SGLang's default load (:func:`trace_native_load`); the checkpoint names ``load_weights`` was fed."""
    return set(trace_native_load(built, folder).fed)


# --------------------------------------------------------------------------------------------------
# What each parameter should hold (TP=1)
# --------------------------------------------------------------------------------------------------

# Names a draft keeps for the target's tensors: SGLang's EAGLE worker replaces them with the target's
# (set_embed_and_head, speculative/eagle_worker_v2.py:377-378), so no loader writes them.
DRAFT_SHARED_WITH_TARGET = ("model.embed_tokens.weight", "lm_head.weight")


def _checkpoint_name(name: str, param: str, draft: bool) -> Optional[str]:
    """The checkpoint-side name of SGLang parameter ``param`` before any fusion (None: not from the
    checkpoint: a draft's embedding and head)."""
    if draft and param in DRAFT_SHARED_WITH_TARGET:
        return None
    if name == "deepseek_v3":
        if not draft:
            return param
        mtp = f"model.layers.{TINY[name]['num_hidden_layers']}."
        if param.startswith("model.decoder."):  # deepseek_weight_loader.py:321-335
            return mtp + param[len("model.decoder."):]
        if param.startswith(("model.enorm.", "model.hnorm.", "model.eh_proj.", "model.shared_head.norm.")):
            return mtp + param[len("model."):]
        raise KeyError(param)
    if name == "qwen3_next":
        if not draft:
            return param
        if param.startswith(("fc.", "pre_fc_norm_")):  # qwen3_next.py:1177-1184
            return "mtp." + param
        if param.startswith("model."):
            return "mtp." + param[len("model."):]
        raise KeyError(param)
    raise KeyError(name)


def reference_parameters(
    name: str, model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, draft: bool,
) -> dict[str, Optional[torch.Tensor]]:
    """What each parameter of ``model`` (target ``name``, or its draft; TP=1) holds after a load of
    ``tensors``: SGLang's fusions undone by hand (q_a_proj + kv_a_proj_with_mqa ->
    fused_qkv_a_proj_with_mqa; gate_proj + up_proj -> gate_up_proj; q/k/v_proj -> qkv_proj, SGLang's
    Qwen3-Next dropping ``self_attn.``; experts.{e}.gate/up -> w13_weight[e], down -> w2_weight[e]),
    in the parameter's dtype. None for a draft's embedding and head (the target's, at run time).
    Raises KeyError for a parameter it cannot place."""
    experts = TINY[name].get("n_routed_experts") or TINY[name].get("num_experts")
    out: dict[str, Optional[torch.Tensor]] = {}
    for param_name, param in model.named_parameters():
        source = _checkpoint_name(name, param_name, draft)
        if source is None:
            out[param_name] = None
            continue
        stem, _, leaf = source.rpartition(".")
        module = stem.rpartition(".")[2]
        parent = stem[: -len(module)]  # ends with "."
        if name == "qwen3_next" and module in ("qkv_proj", "o_proj", "q_norm", "k_norm"):
            parent += "self_attn."  # SGLang's Qwen3-Next attention has no self_attn level (qwen3_next.py:1192)
        if module == "qkv_proj":
            value = torch.cat([tensors[f"{parent}{p}.{leaf}"] for p in ("q_proj", "k_proj", "v_proj")])
        elif module == "fused_qkv_a_proj_with_mqa":
            value = torch.cat([tensors[f"{parent}{p}.{leaf}"] for p in ("q_a_proj", "kv_a_proj_with_mqa")])
        elif module == "gate_up_proj":
            value = torch.cat([tensors[f"{parent}{p}.{leaf}"] for p in ("gate_proj", "up_proj")])
        elif module == "experts" and leaf == "w13_weight":
            value = torch.stack([torch.cat([tensors[f"{stem}.{e}.gate_proj.weight"], tensors[f"{stem}.{e}.up_proj.weight"]])
                                 for e in range(experts)])
        elif module == "experts" and leaf == "w2_weight":
            value = torch.stack([tensors[f"{stem}.{e}.down_proj.weight"] for e in range(experts)])
        else:
            value = tensors[f"{parent}{module}.{leaf}"]
        out[param_name] = value.to(param.dtype)
    return out


# --------------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------------


def fill_sentinel(model: torch.nn.Module) -> None:
    """NaN in every floating parameter and persistent buffer (the dtype's max in integer ones), so that
    after a load :func:`sentinel_parameters` names what was never written. Deterministic, unlike the
    ``torch.empty`` SGLang's constructors leave."""
    with torch.no_grad():
        for _, tensor in _parameters_and_persistent_buffers(model):
            _fill(tensor)


def _fill(tensor: torch.Tensor) -> None:
    if tensor.numel() == 0 or tensor.dtype == torch.bool:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def _is_sentinel(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_floating_point() or tensor.is_complex():
        return torch.isnan(tensor)
    if tensor.dtype == torch.bool:
        return torch.zeros_like(tensor, dtype=torch.bool)
    return tensor == torch.iinfo(tensor.dtype).max


def sentinel_parameters(model: torch.nn.Module) -> dict[str, float]:
    """Parameters and persistent buffers still holding :func:`fill_sentinel`'s value: name -> the fraction
    of their elements (1.0: never written; below 1.0: written in part)."""
    out = {}
    for name, tensor in _parameters_and_persistent_buffers(model):
        if tensor.numel() == 0:
            continue
        fraction = _is_sentinel(tensor.detach()).float().mean().item()
        if fraction > 0:
            out[name] = fraction
    return out


def _parameters_and_persistent_buffers(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module._buffers.items():
            if buffer is not None and buffer_name not in module._non_persistent_buffers_set:
                yield (f"{module_name}.{buffer_name}" if module_name else buffer_name), buffer


def model_tensors(
    model: torch.nn.Module, *, non_persistent_buffers: bool = True, tensor_attributes: bool = True,
) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of ``model`` by name; with ``non_persistent_buffers`` the
    others too (``GemmaRMSNorm.gemma_weight``, derived from the weight at load; rotary caches); with
    ``tensor_attributes`` the bare tensors modules hold as attributes (DeepSeek MLA's ``w_kc`` / ``w_vc``,
    made by ``post_load_weights``). Shared modules appear under each of their names."""
    out: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for name, param in module._parameters.items():
            if param is not None:
                out[prefix + name] = param
        for name, buffer in module._buffers.items():
            if buffer is None:
                continue
            if name in module._non_persistent_buffers_set and not non_persistent_buffers:
                continue
            out[prefix + name] = buffer
        if tensor_attributes:
            for name, value in vars(module).items():
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    out.setdefault(prefix + name, value)
    return out


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``'s values, in logical (row-major) order, as a flat uint8 CPU tensor."""
    tensor = tensor.detach()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> Optional[str]:
    """None when ``a`` and ``b`` have one shape, one dtype and the same bytes; else what differs."""
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    bytes_a, bytes_b = tensor_bytes(a), tensor_bytes(b)
    if torch.equal(bytes_a, bytes_b):
        return None
    element = max(1, a.element_size()) if not a.is_quantized else 1
    differing = (bytes_a != bytes_b).reshape(-1, element).any(dim=1)
    first = int(differing.nonzero()[0])
    flat_a, flat_b = a.detach().reshape(-1), b.detach().reshape(-1)
    return (f"{int(differing.sum())} of {a.numel()} elements differ, first at flat index {first}: "
            f"{flat_a[first].item()!r} != {flat_b[first].item()!r}")


def assert_same_parameters(
    a: torch.nn.Module, b: torch.nn.Module, *, non_persistent_buffers: bool = True, tensor_attributes: bool = True,
) -> None:
    """Every parameter and persistent buffer of ``a`` equals ``b``'s bit for bit (same names, shapes,
    dtypes and bytes; NaNs compare by their bits; empty tensors by shape). By default also the
    non-persistent buffers and bare tensor attributes (:func:`model_tensors`). The message names the
    first mismatch in ``a``'s order."""
    ta = model_tensors(a, non_persistent_buffers=non_persistent_buffers, tensor_attributes=tensor_attributes)
    tb = model_tensors(b, non_persistent_buffers=non_persistent_buffers, tensor_attributes=tensor_attributes)
    missing, extra = [n for n in ta if n not in tb], [n for n in tb if n not in ta]
    assert not missing and not extra, f"tensor names differ: only in a {missing[:5]}, only in b {extra[:5]}"
    for name, tensor in ta.items():
        problem = same_tensor(tensor, tb[name])
        assert problem is None, f"{name}: {problem}"
