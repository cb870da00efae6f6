"""The architectures of the target-load conformance sweep (tests/test_target_conformance.py).

Each entry names a transformers config and model class (they write the
checkpoint), tiny sizes, and how vLLM builds it: ``impl="auto"`` takes vLLM's
own class, ``impl="transformers"`` vLLM's Transformers backend (the path for
every model without a class of its own: ``TransformersForCausalLM``, and
``TransformersMoEForCausalLM`` for MoE blocks). ``drop`` removes one tensor
from the written checkpoint: a negative control that both loaders must refuse.
"""

from __future__ import annotations

_DENSE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
_QWEN3_MOE = dict(_DENSE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  decoder_sparse_step=1, mlp_only_layers=[])  # fmt: skip
_DEEPSEEK_V3 = dict(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
    v_head_dim=16, vocab_size=256, max_position_embeddings=256,
    topk_method="noaux_tc",  # vLLM's DeepSeek-V3 keeps gate.e_score_correction_bias only then (as real V3 configs say)
)  # fmt: skip

ARCHS = {
    # vLLM's own classes
    "llama": dict(config="LlamaConfig", hf_class="LlamaForCausalLM", kwargs=_DENSE),
    "qwen3-tied": dict(config="Qwen3Config", hf_class="Qwen3ForCausalLM",
                       kwargs=dict(_DENSE, head_dim=16, tie_word_embeddings=True)),
    "qwen3_moe": dict(config="Qwen3MoeConfig", hf_class="Qwen3MoeForCausalLM", kwargs=_QWEN3_MOE),
    "mixtral": dict(config="MixtralConfig", hf_class="MixtralForCausalLM",
                    kwargs=dict(_DENSE, num_local_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": dict(config="DeepseekV3Config", hf_class="DeepseekV3ForCausalLM", kwargs=_DEEPSEEK_V3),
    "gpt2-tied": dict(config="GPT2Config", hf_class="GPT2LMHeadModel",
                      kwargs=dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256)),
    # vLLM's Transformers backend: dense, tied, and MoE (the block's gate and shared experts registered twice)
    "llama-transformers": dict(config="LlamaConfig", hf_class="LlamaForCausalLM", impl="transformers", kwargs=_DENSE),
    "qwen3-tied-transformers": dict(config="Qwen3Config", hf_class="Qwen3ForCausalLM", impl="transformers",
                                    kwargs=dict(_DENSE, head_dim=16, tie_word_embeddings=True)),
    "qwen3_moe-transformers": dict(config="Qwen3MoeConfig", hf_class="Qwen3MoeForCausalLM", impl="transformers",
                                   kwargs=_QWEN3_MOE),
    "deepseek_v3-transformers": dict(config="DeepseekV3Config", hf_class="DeepseekV3ForCausalLM",
                                     impl="transformers", kwargs=_DEEPSEEK_V3),
    # negative control: a checkpoint that really lacks a tensor the model keeps
    "llama-missing-norm": dict(config="LlamaConfig", hf_class="LlamaForCausalLM", kwargs=_DENSE,
                               drop="model.norm.weight"),
}  # fmt: skip
