"""The selection: which tensors a load streams and, for each one left out, why. Decided once, here.

Given an inspected checkpoint, the module the engine built (or the engine
alone, for doctor) and the settings, :func:`select_tensors` returns one
frozen :class:`Selection`, plain data. Planning turns it into shards
(:mod:`..plan.planning`), the read-ahead foresees one made without asking
(:mod:`..stream.read_ahead`), and the report and the log read it
(:mod:`..observe.selection_log`); none of them asks the module, the table
or the conventions again.

Rules, each decided here only:

- a checkpoint with errors (bad header, index mismatch) is not loaded;
- what a target, or a draft on the target's checkpoint, streams is what the
  module the engine built reads (:mod:`.module_reads`: what it declares,
  then a dry run of its own ``load_weights``); where the module cannot be
  asked, the row of :mod:`.mtp_table` (a target: every tensor but its MTP
  draft's own layers; a draft: its own tensors, less what the engine skips
  or replaces), then the conventions' rows of :mod:`.mtp_rows`.
  :data:`.module_reads.SELECTION_ORDER` names which of these answer;
  ``MX_ROBUST_TARGET_SELECTION=all`` loads a target's checkpoint whole;
- any draft the engine points at the target's checkpoint takes its own
  tensors out of it, whatever its method (``mtp``, ``dspark``, ...); a draft
  with a checkpoint of its own (EAGLE, a separate draft model, Gemma-4's
  assistant, Qwen3's DSpark) loads it whole; it is never fed the target's
  checkpoint;
- the model's own word (``is_unused_checkpoint_weight``) drops what a row or
  a convention picked too much;
- a rank reads its share only: a pipeline stage its own layers, an
  expert-parallel rank its own experts. The module's answer already is the
  rank's share; where a table row or a convention decided, the module's
  structure narrows the selection (:mod:`.rank_share`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from . import module_reads, mtp_table
from .built_module import BuiltModule
from ..verify.kept import GAPS_SHOWN
from .module_reads import Answer, ModuleReads, Unanswered
from ..engine import EngineView
from ..engine.config import LayerLayout
from ..errors import DraftPlanError, InconsistentCheckpoint, PartialParameters, listed
from ..inspect.checkpoint import Checkpoint, loaded_shards
from ..inspect.remedies import remedy_for
from ..inspect.sources import Candidate, Resolution
from ..inspect.storage import normalize_uri
from ..settings import RobustSettings

_PROBLEMS_SHOWN = 5

# Why a tensor of the checkpoint is not streamed for this load.
NOT_READ = "not_read"  # the module's answer does not read it
SKIPPED = "skipped"  # a table row's draft-side name the engine skips or replaces
UNUSED_BY_MODEL = "unused_by_model"  # selected, then dropped: the model says it does not load it
LEFT_TO_DRAFT = "left_to_draft"  # a target's: its MTP draft's own, streamed by the draft
NOT_HELD = "not_held"  # this rank's module does not hold it: another stage's layer, another rank's expert
_MODULE_ANSWERED = frozenset({"dry_run"})


@dataclass(frozen=True)
class _LeftOut:
    """Why one tensor of the checkpoint is not streamed: a kind (the constants above) and its text."""

    kind: str
    why: str


@dataclass(frozen=True)
class Selection:
    """What one load streams, what decided it, and why every other tensor it names is left out: plain data (its
    log lines and report fields: :mod:`..observe.selection_log`)."""

    role: str
    names: Optional[frozenset[str]]  # None: every tensor of the loaded shards
    # Which source decided (module_reads.SOURCES): dry_run, table, convention, or whole (everything).
    source: str = "whole"
    # The module's answer (ModuleReads: it decided), or why it could not answer (Unanswered); None: not asked.
    answer: Optional[Answer] = None
    architecture: Optional[str] = None  # the mtp_table row of this load (a draft's, or a target's MTP draft's)
    convention: Optional[str] = None  # the draft naming convention that matched
    shared: frozenset[str] = frozenset()  # weights a draft streams that the target also has
    left_out: Mapping[str, _LeftOut] = field(default_factory=dict)
    left_bytes: Mapping[str, int] = field(default_factory=dict)  # kind -> bytes of the checkpoint left out so

    def of_kind(self, *kinds: str) -> frozenset[str]:
        """The names left out for one of ``kinds`` (the constants above)."""
        return frozenset(n for n, why in self.left_out.items() if why.kind in kinds)


def _describe_errors(checkpoint: Checkpoint) -> str:
    errors = checkpoint.errors
    return f"checkpoint {checkpoint.uri} is inconsistent, not loading it: {listed([p.message for p in errors], _PROBLEMS_SHOWN, '; ')}"


# -- which checkpoint is whose ---------------------------------------------------


def _points_at_target(engine: EngineView) -> bool:
    """Whether the engine points the draft itself at the target's checkpoint (vLLM's SpeculativeConfig does for
    ``mtp`` and DeepSeek-V4's ``dspark``; EAGLE's and Qwen3's DSpark point at checkpoints of their own)."""
    mine = {normalize_uri(u) for u in engine.draft_sources}
    return bool(mine & {normalize_uri(u) for u in engine.target_uris})


def _is_target_source(candidate: Candidate, engine: EngineView, settings: RobustSettings) -> bool:
    """Whether ``candidate`` is the target's checkpoint (MX_MODEL_URI or one of the target's sources)."""
    shared = {normalize_uri(u) for u in engine.target_uris}
    if settings.model_uri:
        shared.add(normalize_uri(settings.model_uri))
    return normalize_uri(candidate.uri) in shared


# -- the selection ---------------------------------------------------------------


def select_resolved(resolution: Resolution, module: BuiltModule, settings: RobustSettings, *, ask: bool = True) -> Selection:
    """The selection of this load of ``module`` from a source already chosen (by this rank, or by rank 0)."""
    source_is_target = _is_target_source(resolution.candidate, module.engine, settings)
    return select_tensors(resolution.checkpoint, module, settings, source_is_target=source_is_target, ask=ask)


def select_tensors(
    checkpoint: Checkpoint, module: BuiltModule, settings: RobustSettings, *, source_is_target: bool, ask: bool = True
) -> Selection:
    """What to stream from ``checkpoint`` for this load of ``module``, and why the rest is left out.

    ``source_is_target``: the checkpoint is the target's (a draft the engine
    points at it takes its own tensors out of it; any other draft must not be
    fed it). ``ask``: False decides without the module's answer (the
    read-ahead's foresight, :mod:`..stream.read_ahead`); a module with no
    question to ask (doctor's) is decided by the table and the conventions
    either way.
    Raises InconsistentCheckpoint, DraftPlanError or PartialParameters, all
    before the model is touched.
    """
    if checkpoint.errors:
        raise InconsistentCheckpoint(_describe_errors(checkpoint), remedy=remedy_for(p.kind for p in checkpoint.errors))
    full = [n for s in loaded_shards(checkpoint, settings) for n in s.tensors]
    chosen = _chosen(checkpoint, full, module, settings, source_is_target, ask)
    if chosen.role == "target" and settings.target_selection == "all":
        return chosen
    selection = _narrowed(chosen, checkpoint, full, module)
    sizes = checkpoint.tensors()
    left_bytes: dict[str, int] = {}
    for name, why in selection.left_out.items():
        left_bytes[why.kind] = left_bytes.get(why.kind, 0) + (sizes[name].nbytes if name in sizes else 0)
    return replace(selection, left_bytes=left_bytes)


def _chosen(
    checkpoint: Checkpoint, full: list[str], module: BuiltModule, settings: RobustSettings, source_is_target: bool,
    ask: bool,
) -> Selection:
    """What the module's answer, a table row or a convention picks, before the model's word and the rank."""
    engine = module.engine
    role = engine.role
    whole = Selection(role, None)
    if not engine.is_draft:
        if settings.target_selection == "all":
            return whole
        answer = module.reads(checkpoint) if ask else None
        row = module.row(checkpoint)
        if isinstance(answer, ModuleReads):
            _refuse_partial(answer, checkpoint, role, settings)
            return replace(_from_reads(role, full, answer), architecture=row.key if row else None)
        if row is None or "table" not in module_reads.SELECTION_ORDER:
            return replace(whole, answer=answer)
        draft_only = mtp_table.draft_only(row, _row_layout_for(row, checkpoint, engine), full, module.held)
        if not draft_only:
            return replace(whole, architecture=row.key, answer=answer)
        why = _LeftOut(LEFT_TO_DRAFT, f"the MTP draft's own ({row.key})")
        return Selection(role, frozenset(n for n in full if n not in draft_only), "table", answer, row.key,
                         left_out=dict.fromkeys(draft_only, why))  # fmt: skip
    row = module.row(checkpoint)
    if not source_is_target:
        # A draft with a checkpoint of its own (whatever the method): all of it.
        return replace(whole, architecture=row.key if row is not None else None)
    if row is not None and row.own_checkpoint:
        raise DraftPlanError(
            f"draft {row.key} ({row.family}) has a checkpoint of its own, but only the target's "
            f"checkpoint {checkpoint.uri} holds weights; not feeding it the target's tensors"
        )
    if not (engine.is_mtp or engine.speculative_method is None or _points_at_target(engine)):
        # EAGLE and separate draft models have weights of their own.
        raise DraftPlanError(
            f"draft (method {engine.speculative_method}) has a checkpoint of its own, but only the "
            f"target's checkpoint {checkpoint.uri} holds weights; not feeding it the target's tensors"
        )
    if row is not None and row.per_runner_layer and engine.draft_layer is not None:
        # SGLang's iterator, not the module, picks this runner's one MTP layer (draft_model_idx): the module
        # would read every layer into the same parameters. The engine's rule is the row's.
        answer: Optional[Answer] = Unanswered("", "the engine gives this draft runner one MTP layer (SGLang's "
                                              "draft_model_idx), which its load_weights does not know")  # fmt: skip
    else:
        answer = module.reads(checkpoint) if ask else None
    if isinstance(answer, ModuleReads):
        _refuse_partial(answer, checkpoint, role, settings)
        # The naming its checkpoint uses, in the reports' vocabulary, where the table knows the class.
        return replace(_from_reads(role, full, answer), architecture=row.key if row is not None else None,
                       convention=mtp_table.convention_name(row) if row is not None else None)  # fmt: skip
    if row is not None and "table" in module_reads.SELECTION_ORDER:
        return replace(_draft_by_row(checkpoint, engine, settings, row), answer=answer)
    if "convention" not in module_reads.SELECTION_ORDER:
        why = answer.reason if isinstance(answer, Unanswered) else "no module to ask"
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: no selection source answered (sources "
            f"{','.join(module_reads.SELECTION_ORDER)}): the module could not be asked ({why})"
            + ("" if row is None else f", and the table (row {row.key}) is left out")
        )
    try:
        picked = mtp_table.convention_tensors(set(checkpoint.tensors()), settings, mtp_table.conventions_layout(
            checkpoint.config, engine.hf_config), share_with_target=engine.shares_target_weights, heads_replaced=engine.heads_replaced)  # fmt: skip
    except DraftPlanError as exc:
        raise DraftPlanError(f"draft load from {checkpoint.uri}: {exc}") from None
    return Selection(role, frozenset(picked.names), "convention", answer, convention=picked.convention,
                     shared=frozenset(picked.shared))  # fmt: skip


def _refuse_partial(answer: ModuleReads, checkpoint: Checkpoint, role: str, settings: RobustSettings) -> None:
    """Refuse, before a byte streams, a load that would leave part of a parameter at its init values.

    vLLM stacks ``gate_proj``/``up_proj`` into ``gate_up_proj``, ``q/k/v_proj`` into ``qkv_proj``, experts'
    ``w1``/``w3`` into ``w13``: a checkpoint that lacks one member would load "fine" by name. Under
    ``MX_ROBUST_MODEL_COMPLETENESS=warn`` the selection carries the gaps and the strategy warns instead.
    """
    if not answer.gaps or settings.model_completeness != "fail":
        return
    parts = listed([gap.describe() for gap in answer.gaps], GAPS_SHOWN, "; ")
    raise PartialParameters(
        f"{role} load from {checkpoint.uri} refused before streaming: {len(answer.gaps)} parameter(s) the "
        f"checkpoint fills only in part: {parts} (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
    )


def _from_reads(role: str, full: list[str], answer: ModuleReads) -> Selection:
    """The selection of a load whose module said what it reads: those names; the rest, not read."""
    names = frozenset(n for n in full if n in answer.names)
    left_out = {n: _LeftOut(NOT_READ, why) for n, why in answer.left_out.items()}
    left_out.update({n: _LeftOut(NOT_READ, "not read by the module") for n in full if n not in names and n not in left_out})
    return Selection(role, names, answer.source, answer, left_out=left_out)


def _row_layout_for(
    row: mtp_table.MtpArchitecture, checkpoint: Optional[Checkpoint], engine: EngineView
) -> LayerLayout:
    """N and the MTP layer count for ``row``: the target's config first (the VllmConfig the draft class is
    built with carries it), then the checkpoint's config.json (the target's too), then the draft's own.
    A draft runner that serves one MTP layer (SGLang's ``draft_model_idx``) gets that layer alone."""
    layout = mtp_table.row_layout(
        row,
        ("the target's hf_config", engine.target_hf_config),
        ("the checkpoint's config.json", getattr(checkpoint, "config", None)),
        ("the draft's hf_config", engine.hf_config),
    )
    if row.per_runner_layer and engine.is_draft and engine.draft_layer is not None:
        return layout.for_runner(engine.draft_layer)
    return layout


def _draft_by_row(
    checkpoint: Checkpoint, engine: EngineView, settings: RobustSettings, row: mtp_table.MtpArchitecture
) -> Selection:
    """A draft's own tensors as its table row places them, less what the engine skips or replaces."""
    layout = _row_layout_for(row, checkpoint, engine)
    names = set(checkpoint.tensors())
    if row.per_runner_layer and engine.draft_layer is not None and layout.count == 0:
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: {mtp_table.describe(row)}: this draft runner serves MTP layer "
            f"{engine.draft_layer} (SGLang's draft_model_idx), but the checkpoint has no MTP layer "
            f"{engine.draft_layer} (its layer count: {layout.count_from}); SGLang would leave this runner's "
            f"weights at their init values: lower --speculative-num-steps to the checkpoint's MTP layers"
        )
    if row.layout in ("nextn", "indexed") and not layout.indices(row.layers_built):
        missing = []
        if layout.first is None:
            missing.append("num_hidden_layers (N)")
        if layout.count is None:
            missing.append("/".join(row.count_keys))
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: {mtp_table.describe(row)}: cannot place its MTP layers: "
            f"{' and '.join(missing)} not in the draft's config nor in the checkpoint's config.json"
        )
    picked = mtp_table.row_tensors(
        row,
        names,
        layout,
        shares_target_weights=engine.shares_target_weights,
        shared_policy=settings.draft_shared_weights,
        load_checks_parameters=engine.mtp_load_checks,
        heads_replaced=engine.heads_replaced,
    )
    if not picked.own:
        outside = [s.key for s in checkpoint.outside_index if s.tensors]
        hint = (
            f"; {', '.join(outside)} holds tensors but is not in the index, and robust streams indexed shards "
            f"only (SGLang adds an unindexed GLM mtp.safetensors itself): add it to the index"
            if outside
            else ""
        )
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: no draft tensor found among {len(names)} tensors for "
            f"{mtp_table.describe(row, layout)} (N {layout.first_from}, {layout.count} MTP layer(s) "
            f"{layout.count_from}){hint}"
        )
    return Selection("draft", frozenset(picked.names), "table", architecture=row.key,
                     convention=mtp_table.convention_name(row), shared=frozenset(picked.shared),
                     left_out={n: _LeftOut(SKIPPED, why) for n, why in picked.skipped.items()})  # fmt: skip


def _narrowed(selection: Selection, checkpoint: Checkpoint, full: list[str], module: BuiltModule) -> Selection:
    """``selection`` less what the model says it does not load (``is_unused_checkpoint_weight``) and what
    this rank's module does not hold (another stage's layers, another rank's experts).

    A name the model declares unused in a selection is a selection error (a table row, the generic
    conventions, ``MX_ROBUST_DRAFT_EXTRA_PREFIXES``, or a target's whole checkpoint where the table knows
    no MTP layers): it is left out and named, so no byte streams that ``load_weights`` throws away. The
    rank's share narrows only what a table row, a convention or the whole checkpoint decided: the module's
    own answer already is this rank's share.
    """
    streamed = [n for n in full if selection.names is None or n in selection.names]
    left_out = dict(selection.left_out)
    if module.unused is not None:
        left_out.update({n: _LeftOut(UNUSED_BY_MODEL, "the model does not load it") for n in streamed if module.unused(n)})
        if streamed and all(n in left_out for n in streamed):
            raise DraftPlanError(
                f"{selection.role} load from {checkpoint.uri}: the model says it loads none of the "
                f"{len(streamed)} tensors selected for it (is_unused_checkpoint_weight, skip_checkpoint_weight)"
            )
    share = module.share
    if share is not None and not share.whole and selection.source not in _MODULE_ANSWERED:
        left_out.update({n: _LeftOut(NOT_HELD, why) for n in streamed if n not in left_out and (why := share.why_not_held(n))})
    if len(left_out) == len(selection.left_out):
        return selection
    dropped = frozenset(left_out) - frozenset(selection.left_out)
    names = frozenset(n for n in streamed if n not in dropped)
    return replace(selection, names=names, shared=selection.shared - dropped, left_out=left_out)
