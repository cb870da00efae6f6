"""The rows of the MTP table: where each draft's tensors live in its target's checkpoint, as plain data.

One question, "which tensors does a draft whose module cannot be asked read?", has one answer: a row of
this table, read by the one algorithm of :mod:`.mtp_table`. Two kinds of row:

- :data:`TABLE`: an engine's draft class, matched by what the engine says of the draft (architecture or
  model type, speculative method). Each is here because its class cannot be built on the CPUs the tests
  run on (names only, read from the cited ``load_weights``) or because of an engine rule no module says
  (a draft runner that serves one MTP layer, a checkpoint of its own, heads or an embedding the engine
  keeps, an embedding ``load_weights`` demands). docs/mtp-architectures.md has the reasons in full.
- :data:`CONVENTIONS`: the generic naming conventions (see FACTS.md), for a draft no class row matches;
  ``MX_ROBUST_DRAFT_CONVENTIONS`` picks which apply, ``MX_ROBUST_DRAFT_EXTRA_PREFIXES`` adds one. Every
  one that finds tensors answers; a name under its layers is the draft's own even where it looks like an
  embedding or a head, and the target's embedding and head are the shared copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..engine.sglang import SGLANG_MTP_METHODS
from ..engine.view import MTP_METHODS
from ..inspect.checkpoint import NEXTN_COUNT_KEYS
from ..releases import SGLANG, VLLM

# Checked against vLLM 0.32.0 (and the releases the rows' since name), 2026-12-03.
_MODELS = "vllm/model_executor/models"
_SPECULATIVE = "vllm/config/speculative.py"

# Layer-indexed name prefixes of the DeepSeek-style "nextn" layout (vllm/model_executor/models/utils.py:575).
NEXTN_PREFIXES = ("model.layers.", "layers.", "model.language_model.layers.")
# A draft's embedding or output head, at any depth (DeepSeek's per-layer embed_tokens and shared_head.head):
# the engine may fill it from the target's, which only the module's answer says.
EMBEDDING_OR_HEAD_PATTERN = re.compile(r"(^|\.)(embed_tokens|lm_head|head)\.weight$")


@dataclass(frozen=True, kw_only=True)
class MtpArchitecture:
    """One MTP draft class of an engine (or one naming convention) and where its tensors live in the target's
    checkpoint."""

    key: str  # short name, shown by doctor and in the load report (a convention's: its setting value)
    # Where the MTP layers are: "nextn" (model.layers.{N+i}.*), "indexed" ({prefix}{i}.*), "prefix" (prefix*) or
    # "own" (a checkpoint of its own).
    layout: str
    family: str = ""  # the models it serves
    draft_architectures: tuple[str, ...] = ()  # hf_config.architectures[0] of the draft (after hf_config_override)
    model_types: tuple[str, ...] = ()  # hf_config.model_type of the draft
    load_weights: str = ""  # file:line of the draft class's load_weights, in the release it was read from
    override: str = ""  # file:line where the engine makes this draft's config from the target's
    prefixes: tuple[str, ...] = NEXTN_PREFIXES
    also: tuple[str, ...] = ()  # name prefixes the draft reads besides its MTP layers (DSpark's context_wkv_proj.)
    count_keys: tuple[str, ...] = ("num_nextn_predict_layers", "n_predict")  # number of MTP layers
    default_count: Optional[int] = None  # what the class assumes when the config has none
    layers_built: Optional[int] = None  # MTP layers the class builds (later ones are skipped)
    text_config: bool = False  # N and the count come from hf_config.text_config
    # SGLang's multi-layer EAGLE: each draft runner serves one MTP layer (LoadConfig.draft_model_idx).
    per_runner_layer: bool = False
    # Checkpoint names (regexes; {L} = an MTP layer index, {L0} = the first) the draft reads into ...
    embed: tuple[str, ...] = ()  # ... its embedding, preferred first
    head: tuple[str, ...] = ()  # ... its head(s), preferred first
    # A name under the MTP layers is the draft's own, never an embedding or head copy (the conventions).
    copies_outside: bool = False
    dropped: tuple[str, ...] = ()  # names under its own prefixes that load_weights skips
    # load_weights fails without the embedding, even where the proposer replaces it, where the engine checks MTP
    # loads (vLLM 0.32, 0.33: engine.vllm_rules.mtp_load_demands_every_parameter; 0.34 removed the checks)
    embed_required: bool = False
    heads_kept: bool = False  # the proposer keeps the draft's own heads
    embed_kept: bool = False  # the proposer's shared embedding does not replace what the draft needs
    methods: tuple[str, ...] = MTP_METHODS
    # The target's architectures / model types the engine makes this draft for (doctor's key, and what a target
    # whose module cannot be asked leaves to its draft: selection.select).
    targets: tuple[str, ...] = ()
    # The first release (major, minor) of its engine whose class this row describes; None: every release.
    since: Optional[tuple[int, ...]] = None
    # The engine whose class this row reads ("vllm" or "sglang"); since is that engine's release.
    engine: str = VLLM

    @property
    def own_checkpoint(self) -> bool:
        """The draft has a checkpoint of its own."""
        return self.layout == "own"

    def describes(self, release: Optional[tuple[int, ...]]) -> bool:
        """Whether this row is the rule of ``release`` of its engine (None: the newest the table knows)."""
        return release is None or self.since is None or release >= self.since


def _m(name: str, line: int) -> str:
    return f"{_MODELS}/{name}:{line}"


def _s(line: int) -> str:
    return f"{_SPECULATIVE}:{line}"


# Per-layer copies the DeepSeek-style drafts read: the first MTP layer's embedding, each layer's head.
_LAYER_EMBED = r"^(model\.|model\.language_model\.)?layers\.{L0}\.embed_tokens\.weight$"
_LAYER_HEAD = r"^(model\.|model\.language_model\.)?layers\.{L}\.shared_head\.head\.weight$"
_TOP_EMBED = r"^model\.embed_tokens\.weight$"
_ANY_EMBED = r"(^|\.)embed_tokens\.weight$"
_TOP_HEAD = r"^lm_head\.weight$"
_NOT_FIRST_EMBED = r"^(model\.|model\.language_model\.)?layers\.{Lrest}\.embed_tokens\.weight$"

# Each row says why it is here: "not built" (its class cannot be built on these CPUs: names only, read from the
# cited load_weights) or "rule" (an engine rule no module says). docs/mtp-architectures.md has the reasons in full.
# Lines are vLLM 0.32.0's unless the row's since says otherwise (0.33.0's, 0.34.0's); SGLang's are 0.5.23's.
TABLE: tuple[MtpArchitecture, ...] = (
    # Not built: DeepseekV32MTPModel resolves to DeepSeekMTP on a CPU, whose sparse attention the CPU refuses.
    # Its naming is DeepSeekMTP's, which builds here (the module answers for DeepSeekMTPModel).
    MtpArchitecture(
        key="deepseek_v32_mtp", targets=("deepseek_v32", "glm_moe_dsa"),
        family="DeepSeek-V3.2, GLM-5.2 (glm_moe_dsa)",
        # Its model type is deepseek_mtp, as DeepSeek-V3's draft's: only the architecture tells them apart.
        draft_architectures=("DeepseekV32MTPModel",), load_weights="vllm/models/deepseek_v32/nvidia/mtp.py:365",
        override=_s(663), layout="nextn", embed=(_LAYER_EMBED, _TOP_EMBED), head=(_LAYER_HEAD,),
        dropped=(_NOT_FIRST_EMBED,),
    ),
    # Not built: on a CPU vllm.models.deepseek_v4 is cpu/mtp.py, whose __init__ raises NotImplementedError.
    MtpArchitecture(
        key="deepseek_v4_mtp", targets=("deepseek_v4",), family="DeepSeek-V4",
        # The draft model type is deepseek_mtp, as V3's: only the architecture tells them apart.
        draft_architectures=("DeepSeekV4MTPModel",), load_weights="vllm/models/deepseek_v4/nvidia/mtp.py:363",
        override=_s(695), layout="indexed", prefixes=("mtp.",), embed=(r"^mtp\.{L0}\.emb\.tok_emb\.weight$",),
        head=(r"^mtp\.{L}\.head\.weight$",), dropped=(r"^mtp\.{Lrest}\.emb\.tok_emb\.",),
    ),
    # Not built: vllm/models/deepseek_v4/cpu/dspark.py raises NotImplementedError in __init__.
    MtpArchitecture(
        key="deepseek_v4_dspark",
        family="DeepSeek-V4 / V4.1 DSpark (method dspark; its weights ship in the target's checkpoint)",
        # hf_config_override keeps the target's model type (deepseek_v4 / deepseek_v41): only the architecture
        # tells the draft apart.
        draft_architectures=("DSparkDraftModel", "DSparkV41DraftModel"),
        load_weights="vllm/models/deepseek_v4/nvidia/dspark.py:448", override=_s(1432), layout="indexed",
        prefixes=("mtp.",), also=("context_wkv_proj.",), count_keys=("n_mtp_layers",), default_count=3,
        methods=("dspark",),
    ),
    # Not built: the CUDA class is used on a CPU too, and its __init__ creates torch.cuda.Stream.
    MtpArchitecture(
        key="kimi_k3_mtp", targets=("kimi_k3",), family="Kimi-K3", draft_architectures=("KimiK3MTPModel",),
        model_types=("kimi_k3_mtp",), load_weights="vllm/models/kimi_k3/nvidia/mtp.py:251", override=_s(715),
        layout="nextn",
        # A leading language_model. is stripped; model.language_model.layers.* and bare layers.* are not loaded.
        prefixes=("model.layers.", "language_model.model.layers."), text_config=True,
        embed=(r"^(language_model\.)?model\.layers\.{L0}\.embed_tokens\.weight$",),
        head=(r"^(language_model\.)?model\.layers\.{L}\.shared_head\.head\.weight$",),
        dropped=(
            r"^(language_model\.)?model\.layers\.{Lrest}\.embed_tokens\.",
            r"^(language_model\.)?model\.layers\.{L}\.(self_attention_res|mlp_res)_(norm|proj)\.",
        ),
    ),
    # Not built: vllm.models.minimax_m3 imports torchvision, absent here. 0.34's class maps names as 0.32's.
    MtpArchitecture(
        key="minimax_m3_mtp", targets=("minimax_m3_vl", "MiniMaxM3SparseForConditionalGeneration"),
        family="MiniMax-M3 (VL)", draft_architectures=("MiniMaxM3MTP",), model_types=("minimax_m3_mtp",),
        load_weights="vllm/models/minimax_m3/nvidia/mtp.py:226", override=_s(1030), layout="indexed",
        prefixes=("model.mtp.layers.", "language_model.model.mtp.layers."), count_keys=("num_mtp_modules",),
        default_count=1, text_config=True, embed=(r"^(language_model\.)?model\.embed_tokens\.weight$",),
        head=(r"^(language_model\.)?lm_head\.weight$",),
    ),
    # Not built (vllm.models.dots3_note imports vllm_flash_attn), and a rule: the draft keeps its own embedding.
    MtpArchitecture(
        key="dots3_note_mtp", targets=("dots3_note",), family="dots3 NOTE",
        draft_architectures=("Dots3NoteMTPModel",), model_types=("dots3_note_mtp",),
        load_weights="vllm/models/dots3_note/nvidia/mtp.py:190", override=_s(664), layout="nextn",
        prefixes=("model.layers.",),  # layers.{N}. and model.language_model.layers.{N}. raise KeyError in vLLM
        default_count=1,
        embed=(r"^model\.mtp\.embed_tokens\.weight$", r"^model\.layers\.{L0}\.embed_tokens\.weight$", _TOP_EMBED),
        head=(r"^model\.layers\.{L}\.shared_head\.head\.weight$",),
        dropped=(r"^model\.layers\.{Lrest}\.embed_tokens\.weight$",), embed_kept=True,
    ),
    # Not built: its __init__ raises "Sparse Attention is not supported on CPU".
    MtpArchitecture(
        key="glm5_next_mtp", targets=("glm5_next",), family="GLM-5-Next (Glm5Next, text and VL)",
        draft_architectures=("Glm5NextMTPModel",), model_types=("glm5_next_mtp",),
        load_weights="vllm/models/glm5next/common/mtp.py:300", override=_s(1059), layout="nextn",
        prefixes=("model.layers.", "model.language_model.layers."),  # bare layers.{N}. raises KeyError
        text_config=True, embed=(r"^model\.(language_model\.)?layers\.{L0}\.embed_tokens\.weight$",),
        dropped=(_NOT_FIRST_EMBED, r"^model\.(language_model\.)?layers\.{L}\.shared_head\.head\."),
    ),
    # A rule (it builds here): load_weights demands the embedding the proposer replaces (vLLM 0.32, 0.33), and
    # Step3p5MTPProposer keeps each layer's head, which the 0.32 class does not say (no has_own_lm_head).
    MtpArchitecture(
        key="step3p5_mtp", targets=("step3p5", "step3p7", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"),
        family="Step-3.5-Flash, Step-3.7", draft_architectures=("Step3p5MTP",), model_types=("step3p5_mtp",),
        load_weights=_m("step3p5_mtp.py", 202), override=_s(969), layout="nextn", embed=(_LAYER_EMBED, _ANY_EMBED),
        head=(r"^(model\.)?layers\.{L}\.shared_head\.(head|output)\.weight$",), embed_required=True, heads_kept=True,
    ),
    # Not built: qwen3_5_mtp.py imports qwen3_vl.py, which imports torchvision, absent here.
    MtpArchitecture(
        key="qwen3_5_mtp",
        targets=("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "intern_s2_preview", "interns2_mobius"),
        family="Qwen3.5, Qwen3.5-MoE, Intern-S2 (Qwen3.5 naming)",
        draft_architectures=("Qwen3_5MTP", "Qwen3_5MoeMTP", "InternS2MobiusMTP"), model_types=("qwen3_5_mtp",),
        load_weights=_m("qwen3_5_mtp.py", 307), override=_s(917), layout="prefix", prefixes=("mtp.",),
        embed=(_ANY_EMBED,), head=(r"lm_head\.weight$",),
    ),
    # Not built: vllm.models.qwen4_exp imports qwen3_vl.py, which imports torchvision, absent here.
    MtpArchitecture(
        key="qwen4_exp_mtp",
        targets=("qwen4_exp", "qwen4_exp_text", "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"),
        family="Qwen4-Exp (text and VL)", draft_architectures=("Qwen4ExpMTP",), model_types=("qwen4_exp_mtp",),
        load_weights="vllm/models/qwen4_exp/nvidia/mtp.py:470", override=_s(845), layout="prefix",
        prefixes=("mtp.", "model.mtp.", "language_model.mtp.", "model.language_model.mtp."),
        count_keys=("mtp_num_hidden_layers",), default_count=1, text_config=True,
        embed=(r"^(model\.language_model\.|language_model\.)?(model\.)?(mtp\.)?embed_tokens\.weight$",),
        head=(r"^(model\.language_model\.|language_model\.)?(model\.)?(lm_head|(mtp\.)?shared_head\.head)\.weight$",),
        dropped=(r"(^|\.)hyper_connection_mixer\.block_inject_weight\.",),
    ),
    # A rule (it builds here): a checkpoint of its own, and Gemma4Proposer keeps its head (tied to its embedding).
    MtpArchitecture(
        key="gemma4_mtp", targets=("gemma4_assistant", "gemma4_unified_assistant"), family="Gemma-4 assistant",
        draft_architectures=("Gemma4MTPModel",), model_types=("gemma4_mtp",), load_weights=_m("gemma4_mtp.py", 590),
        override=_s(1019), layout="own", heads_kept=True, embed_kept=True,
    ),
    # Not built (vLLM 0.33.0; vllm.models.step5 imports torchvision, absent here), and Step-3.5's rules.
    MtpArchitecture(
        key="step5_mtp", targets=("step5", "step5_vl", "Step5ForCausalLM", "Step5ForConditionalGeneration"),
        family="Step5 (text and VL)", draft_architectures=("Step5MTP",), model_types=("step5_mtp",),
        load_weights="vllm/models/step5/nvidia/mtp.py:353", override=_s(1055), layout="nextn",
        # model.language_model.layers.{N+i}.* reach no parameter (skipped with a warning); layers.{N+i}.* do.
        prefixes=("model.layers.", "layers."), text_config=True, embed=(_LAYER_EMBED, _ANY_EMBED),
        head=(r"^(model\.)?layers\.{L}\.shared_head\.(head|output)\.weight$",), dropped=(r"(^|\.)tok_embeddings\.",),
        embed_required=True, heads_kept=True, since=(0, 33),
    ),
    # Not built (vLLM 0.34.0): vllm.models.mistral.mistral_large4 raises NotImplementedError on a CPU.
    MtpArchitecture(
        key="mistral_large4_dspark",
        # The target's load_weights skips every mtp_* name (vllm/models/mistral/mistral_large4/nvidia/model.py:388).
        targets=("mistral_large_4", "MistralLarge4ForCausalLM"),
        family="Mistral Large 4 DSpark (method dspark; its BF16 weights ship in the target's checkpoint)",
        # The override keeps model type mistral_large_4: only the architecture tells the draft apart.
        draft_architectures=("MistralLarge4DSparkModel",),
        load_weights="vllm/models/mistral/mistral_large4/nvidia/dspark.py:352", override=_s(823), layout="prefix",
        prefixes=("mtp_dspark.",), methods=("dspark",), since=(0, 34),
    ),
    # Not built (vLLM 0.34.0; it imports vllm.models.minimax_m3.nvidia.model, which imports torchvision), and a
    # rule: a checkpoint of its own, the target's dspark/ sub-folder.
    MtpArchitecture(
        key="minimax_m3_dspark",
        family="MiniMax-M3 DSpark (method dspark; a checkpoint of its own, the target's dspark/ sub-folder)",
        draft_architectures=("DSparkMiniMaxDraftModel",), model_types=("minimax_m3_dspark",),
        load_weights="vllm/models/minimax_m3/common/dspark.py:429", override=_s(1234), layout="own",
        methods=("dspark",), since=(0, 34),
    ),
    # A rule (SGLang 0.5.23; it builds there): one draft runner per MTP layer. SGLang's iterator, not the class,
    # keeps runner i's layer (LoadConfig.draft_model_idx); the class maps every layer onto one set of parameters.
    MtpArchitecture(
        key="sglang_mimo_v2_mtp", engine=SGLANG, targets=("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM"),
        family="SGLang: MiMo-V2 / MiMo-V2-Flash (multi-layer EAGLE, one draft runner per MTP layer)",
        draft_architectures=("MiMoV2MTP",), load_weights="sglang/srt/models/mimo_v2_nextn.py:278",
        override="sglang/srt/configs/model_config.py:1094", layout="indexed", prefixes=("model.mtp.layers.",),
        # _config_draft_model sets the draft's num_nextn_predict_layers to 1; the checkpoint's config.json counts.
        count_keys=("num_nextn_predict_layers",), layers_built=1, per_runner_layer=True, embed=(_TOP_EMBED,),
        head=(_TOP_HEAD,), methods=SGLANG_MTP_METHODS,
    ),
)

# The generic naming conventions (MX_ROBUST_DRAFT_CONVENTIONS values), for a draft no row above matches:
# mtp.* (Qwen3-Next, Qwen3.5); model.layers.{N+i}.*, layers.{N+i}.* and model.language_model.layers.{N+i}.* for
# i < num_nextn_predict_layers with N = num_hidden_layers (DeepSeek-V3, GLM-4.5+); model.mtp.layers.* (some
# exporters). The target's embedding and head, wherever they sit, are the copies the engine may share.
_CONVENTION = dict(embed=(_ANY_EMBED,), head=(r"(^|\.)lm_head\.weight$",), copies_outside=True, family="generic")
CONVENTIONS: tuple[MtpArchitecture, ...] = (
    MtpArchitecture(key="mtp", layout="prefix", prefixes=("mtp.",), **_CONVENTION),
    MtpArchitecture(key="nextn_layers", layout="nextn", count_keys=NEXTN_COUNT_KEYS, **_CONVENTION),
    MtpArchitecture(key="mtp_layers", layout="prefix", prefixes=("model.mtp.layers.",), **_CONVENTION),
)
# MX_ROBUST_DRAFT_EXTRA_PREFIXES: a convention of the operator's, its prefixes filled in from the setting.
EXTRA_PREFIXES = MtpArchitecture(key="extra_prefixes", layout="prefix", prefixes=(), **_CONVENTION)
