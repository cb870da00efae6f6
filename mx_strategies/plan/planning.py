"""The load plan: the one place that decides what a load streams.

Given an inspected checkpoint and what the engine is loading (a target, an
MTP draft, another kind of draft), :func:`plan_for` fixes, before the model
is touched, the shards in load order and the exact tensor names each must
deliver. :func:`plan_load` adds the source chain in front of it. The
strategy streams what the plan says and ``doctor`` shows it, so the two
cannot disagree about which shards load or which tensors a draft takes.

Rules, each decided here only:

- shards load in natural order (``checkpoint.shards``), empty ones left
  out unless ``MX_ROBUST_SKIP_EMPTY_SHARDS=false``;
- a checkpoint with errors (bad header, index mismatch) is not loaded;
- what a target, or a draft on the target's checkpoint, streams is what the
  module the engine built reads (:mod:`.module_reads`: what it declares,
  then a dry run of its own ``load_weights``); where the module cannot be
  asked, the row of :mod:`.mtp_table` (a target: every tensor but its MTP
  draft's own layers, :func:`target_selection`; a draft: its own tensors,
  less what the engine skips or replaces), then the generic conventions of
  :mod:`.draft`. ``MX_ROBUST_SELECTION_SOURCES`` picks which of these answer;
  ``MX_ROBUST_TARGET_SELECTION=all`` loads a target's checkpoint whole;
- any draft the engine points at the target's checkpoint takes its own
  tensors out of it, whatever its method (``mtp``, ``dspark``, ...); a draft
  with a checkpoint of its own (EAGLE, a separate draft model, Gemma-4's
  assistant, Qwen3's DSpark) loads it whole; it is never fed the target's
  checkpoint;
- a rank reads its share only: a pipeline stage its own layers, an
  expert-parallel rank its own experts. The module's answer already is the
  rank's share; where a table row or a convention decided, the module's
  structure narrows the plan (:func:`narrow_to_rank`, :mod:`.rank_share`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional

from ..select import mtp_table
from ..select.built_module import BuiltModule
from ..inspect.checkpoint import Checkpoint, Shard
from ..select.kept import GAPS_SHOWN
from ..select.draft import layer_layout, select_draft_tensors
from ..engine import EngineView
from ..errors import DraftPlanError, InconsistentCheckpoint, PartialParameters, listed
from ..select.coverage import Gap
from ..select.module_reads import Answer, ModuleReads, Unanswered, left_out_summary
from ..select.rank_share import RankShare
from ..settings import RobustSettings
from ..inspect.sources import Candidate, Resolution, resolve
from ..inspect.storage import normalize_uri

PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class PlanDescription:
    """What a plan says of itself: the load's log lines and the report's selection fields, from one place."""

    lines: tuple[tuple[int, str], ...]  # (logging level, message), in order; the caller adds the worker prefix
    report_fields: Mapping[str, Any]  # the LoadReport fields the plan decides


@dataclass(frozen=True)
class LoadPlan:
    """What one load streams (shards in order, the names each delivers) and the answer that decided it."""

    source: str
    shards: tuple[Shard, ...]
    names: Optional[frozenset[str]]  # None: every tensor of those shards
    role: str = "target"
    # Which source decided the names (module_reads.SOURCES): dry_run, table, convention, or whole (everything).
    selection_source: str = "whole"
    # The module's answer (ModuleReads: it decided), or why it could not answer (Unanswered); None: not asked.
    answer: Optional[Answer] = None
    architecture: Optional[str] = None  # the mtp_table row of this load (a draft's, or a target's MTP draft's)
    convention: Optional[str] = None  # the draft naming convention that matched
    shared: frozenset[str] = field(default_factory=frozenset)  # weights a draft streams that the target also has
    skipped: frozenset[str] = field(default_factory=frozenset)  # draft-side names left out: vLLM skips or replaces them
    unused_by_model: frozenset[str] = field(default_factory=frozenset)  # selected, then dropped: the model said so
    left_to_draft: frozenset[str] = field(default_factory=frozenset)  # a target's: the MTP draft's own, not streamed
    left_to_draft_bytes: int = 0
    left_out: Mapping[str, str] = field(default_factory=dict)  # name -> why not streamed (the answer, the rank share)
    left_out_bytes: int = 0  # bytes of the checkpoint's tensors the module's answer leaves out
    not_held: frozenset[str] = frozenset()  # left out by the module's structure: other stages' layers, other experts
    not_held_bytes: int = 0

    # -- the answer's own facts, read from it (never copied) -------------------

    @property
    def module_class(self) -> str:
        return self.answer.module_class if self.answer is not None else ""

    @property
    def selection_note(self) -> str:
        """Why the module could not be asked, when a table, a convention or the whole checkpoint answered."""
        return self.answer.reason if isinstance(self.answer, Unanswered) else ""

    @property
    def selection_declined(self) -> bool:
        """The module itself said it cannot be asked (``supports_dry_run = False``)."""
        return isinstance(self.answer, Unanswered) and self.answer.declined

    @property
    def selection_seconds(self) -> float:
        return self.answer.seconds if isinstance(self.answer, ModuleReads) else 0.0

    @property
    def selection_cached(self) -> bool:
        return isinstance(self.answer, ModuleReads) and self.answer.cached

    @property
    def gaps(self) -> tuple[Gap, ...]:
        """Parameters this plan fills only in part, accepted under MX_ROBUST_MODEL_COMPLETENESS=warn (else refused)."""
        return self.answer.gaps if isinstance(self.answer, ModuleReads) else ()

    @property
    def judged(self) -> int:
        """Parameters whose every element the module's answer was checked to fill."""
        return self.answer.judged if isinstance(self.answer, ModuleReads) else 0

    @property
    def expected(self) -> list[str]:
        return [n for s in self.shards for n in s.tensors if self.names is None or n in self.names]

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for n, t in s.tensors.items() if self.names is None or n in self.names)

    @property
    def uris(self) -> list[str]:
        return [s.uri for s in self.shards]

    @property
    def shard_keys(self) -> list[str]:
        return [s.key for s in self.shards]

    def describe(self) -> PlanDescription:
        """The load's log lines about this plan, and the report's fields: one place writes both."""
        role, lines = self.role, []
        if self.shared:
            lines.append((logging.INFO, f"draft also streams shared weights: {sorted(self.shared)}"))
        if self.selection_source == "dry_run":
            how = "kept answer" if self.selection_cached else f"{self.selection_seconds:.2f}s"
            lines.append((logging.INFO, (
                f"{role} selection_source=dry_run ({self.module_class}, {how}): {len(self.expected)} tensor(s) "
                f"read by the module; {left_out_summary(self.left_out)}"
            )))  # fmt: skip
        elif self.selection_note:
            decides = f"; table row {self.architecture} decides" if self.selection_source == "table" else ""
            lines.append((logging.INFO if self.selection_declined else logging.WARNING, (
                f"{role} selection_source={self.selection_source}: the module {self.module_class or '(none)'} "
                f"could not be asked what it reads ({self.selection_note}){decides}"
            )))  # fmt: skip
        if self.architecture and role == "draft" and self.selection_source == "table":
            lines.append((logging.INFO, f"draft architecture {self.architecture}: {len(self.skipped)} tensor(s) not streamed"))
        if self.left_to_draft:
            lines.append((logging.INFO, (
                f"target: {len(self.left_to_draft)} tensor(s), {self.left_to_draft_bytes} bytes, are the MTP "
                f"draft's own ({self.architecture}); not streamed for the target (MX_ROBUST_TARGET_SELECTION=all "
                f"streams them)"
            )))  # fmt: skip
        if self.unused_by_model:
            # The model's own word overrides the selection: a table row or a convention picked too much.
            shown = listed(sorted(self.unused_by_model), 10, ", ")
            selection = f"table row {self.architecture}" if self.architecture else f"convention {self.convention}"
            lines.append((logging.WARNING, (
                f"{role}: {selection} selected {len(self.unused_by_model)} tensor(s) the model says it does not "
                f"load (is_unused_checkpoint_weight); not streaming them: {shown}"
            )))  # fmt: skip
        if self.gaps:
            lines.append((logging.WARNING, (
                f"{role}: {len(self.gaps)} parameter(s) the checkpoint fills only in part, loaded anyway "
                f"(MX_ROBUST_MODEL_COMPLETENESS=warn): " + listed([g.describe() for g in self.gaps], GAPS_SHOWN, "; ")
            )))  # fmt: skip
        if self.not_held:
            lines.append((logging.INFO, (
                f"{role}: {len(self.not_held)} tensor(s), {self.not_held_bytes} bytes, are other ranks' (pipeline "
                f"stages, expert-parallel ranks: the module's structure); not streamed here"
            )))  # fmt: skip
        fields = {
            "role": role,
            "convention": self.convention,
            "shards": tuple(self.shard_keys),
            "tensors": len(self.expected),
            "bytes_streamed": self.bytes,
            "unused_by_model": tuple(sorted(self.unused_by_model)),
            "architecture": self.architecture,
            "left_to_draft": len(self.left_to_draft),
            "left_to_draft_bytes": self.left_to_draft_bytes,
            "selection_source": self.selection_source,
            "module_class": self.module_class,
            "selection_note": self.selection_note,
            "selection_seconds": self.selection_seconds,
            "selection_cached": self.selection_cached,
            "left_out": len(self.left_out),
            "left_out_bytes": self.left_out_bytes,
            "not_held": len(self.not_held),
            "not_held_bytes": self.not_held_bytes,
        }
        return PlanDescription(tuple(lines), fields)


def loaded_shards(checkpoint: Checkpoint, settings: RobustSettings) -> list[Shard]:
    """The shards a full load streams, in load order."""
    return [s for s in checkpoint.shards if s.readable and (s.tensors or not settings.skip_empty_shards)]


def describe_errors(checkpoint: Checkpoint) -> str:
    errors = checkpoint.errors
    return f"checkpoint {checkpoint.uri} is inconsistent, not loading it: {listed([p.message for p in errors], PROBLEMS_SHOWN, '; ')}"


def plan_for(checkpoint: Checkpoint, module: BuiltModule, settings: RobustSettings, *, source_is_target: bool) -> LoadPlan:
    """What to stream from ``checkpoint`` for this load of ``module``.

    ``source_is_target``: the checkpoint is the target's (a draft the engine
    points at it takes its own tensors out of it; any other draft must not be
    fed it). ``module``: what the built module answers (its reads, its
    structure, its table row), or the engine alone where there is no module
    (doctor). Raises InconsistentCheckpoint or DraftPlanError, both before
    the model is touched.
    """
    engine = module.engine
    if checkpoint.errors:
        raise InconsistentCheckpoint(describe_errors(checkpoint))
    full = LoadPlan(checkpoint.uri, tuple(loaded_shards(checkpoint, settings)), None, role=engine.role)
    if not engine.is_draft:
        if settings.target_selection == "all":
            return full
        answer = module.reads(checkpoint)
        if isinstance(answer, ModuleReads):
            refuse_partial(answer, checkpoint, engine.role, settings)
            row = module.row(checkpoint)
            return replace(_plan_from_reads(full, checkpoint, answer), architecture=row.key if row else None)
        if "table" not in settings.selection_sources:
            return _noted(full, answer, "whole")
        return _noted(target_selection(full, checkpoint, module, settings), answer)
    row = module.row(checkpoint)
    if not source_is_target:
        # A draft with a checkpoint of its own (whatever the method): all of it.
        return full if row is None else replace(full, architecture=row.key)
    if row is not None and row.own_checkpoint:
        raise DraftPlanError(
            f"draft {row.key} ({row.family}) has a checkpoint of its own, but only the target's "
            f"checkpoint {checkpoint.uri} holds weights; not feeding it the target's tensors"
        )
    if not (engine.is_mtp or engine.speculative_method is None or points_at_target(engine)):
        # EAGLE and separate draft models have weights of their own.
        raise DraftPlanError(
            f"draft (method {engine.speculative_method}) has a checkpoint of its own, but only the "
            f"target's checkpoint {checkpoint.uri} holds weights; not feeding it the target's tensors"
        )
    if row is not None and row.per_runner_layer and engine.draft_layer is not None:
        # SGLang's iterator, not the module, picks this runner's one MTP layer (draft_model_idx): the module
        # would read every layer into the same parameters. The engine's rule is the row's.
        answer = Unanswered("", "the engine gives this draft runner one MTP layer (SGLang's draft_model_idx), "
                            "which its load_weights does not know")
    else:
        answer = module.reads(checkpoint)
    if isinstance(answer, ModuleReads):
        refuse_partial(answer, checkpoint, engine.role, settings)
        plan = _plan_from_reads(full, checkpoint, answer)
        # The naming its checkpoint uses, in the reports' vocabulary, where the table knows the class.
        convention = mtp_table.convention_name(row) if row is not None else None
        return replace(plan, architecture=row.key if row is not None else None, convention=convention)
    if row is not None and "table" in settings.selection_sources:
        return _noted(_plan_for_row(checkpoint, engine, settings, row), answer)
    if "convention" not in settings.selection_sources:
        why = answer.reason if isinstance(answer, Unanswered) else "no module to ask"
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: no selection source answered (MX_ROBUST_SELECTION_SOURCES="
            f"{','.join(settings.selection_sources)}): the module could not be asked ({why})"
            + ("" if row is None else f", and the table (row {row.key}) is left out")
        )
    layout = layer_layout(checkpoint.config, engine.hf_config)
    try:
        selection = select_draft_tensors(
            set(checkpoint.tensors()),
            settings,
            layout,
            share_with_target=engine.shares_target_weights,
        )
    except DraftPlanError as exc:
        raise DraftPlanError(f"draft load from {checkpoint.uri}: {exc}") from None
    return _noted(
        _draft_plan(checkpoint, frozenset(selection.names), selection.convention, frozenset(selection.shared)),
        answer,
        "convention",
    )


def points_at_target(engine: EngineView) -> bool:
    """Whether the engine points the draft itself at the target's checkpoint (vLLM's SpeculativeConfig does for
    ``mtp`` and DeepSeek-V4's ``dspark``; EAGLE's and Qwen3's DSpark point at checkpoints of their own)."""
    mine = {normalize_uri(u) for u in engine.draft_sources}
    return bool(mine & {normalize_uri(u) for u in engine.target_uris})


def refuse_partial(answer: ModuleReads, checkpoint: Checkpoint, role: str, settings: RobustSettings) -> None:
    """Refuse, before a byte streams, a load that would leave part of a parameter at its init values.

    vLLM stacks ``gate_proj``/``up_proj`` into ``gate_up_proj``, ``q/k/v_proj`` into ``qkv_proj``, experts'
    ``w1``/``w3`` into ``w13``: a checkpoint that lacks one member would load "fine" by name. Under
    ``MX_ROBUST_MODEL_COMPLETENESS=warn`` the plan carries the gaps and the strategy warns instead.
    """
    if not answer.gaps or settings.model_completeness != "fail":
        return
    parts = listed([gap.describe() for gap in answer.gaps], GAPS_SHOWN, "; ")
    raise PartialParameters(
        f"{role} load from {checkpoint.uri} refused before streaming: {len(answer.gaps)} parameter(s) the "
        f"checkpoint fills only in part: {parts} (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
    )


def _plan_from_reads(full: LoadPlan, checkpoint: Checkpoint, answer: ModuleReads) -> LoadPlan:
    """The plan of a load whose module said what it reads: those names, from the shards that hold them."""
    names = frozenset(n for n in full.expected if n in answer.names)
    left_bytes = sum(t.nbytes for s in full.shards for n, t in s.tensors.items() if n not in names)
    return replace(
        full,
        names=names,
        shards=_shards_holding(full.shards, names),
        convention=None,
        selection_source=answer.source,
        answer=answer,
        left_out=dict(answer.left_out),
        left_out_bytes=left_bytes,
    )


def _noted(plan: LoadPlan, answer: Optional[Answer], source: Optional[str] = None) -> LoadPlan:
    """``plan`` as the table or the conventions made it, with why the module could not answer."""
    if source is None:
        source = "table" if plan.architecture and (plan.names is not None or plan.role == "draft") else "whole"
    return replace(plan, selection_source=source, answer=answer)


def target_selection(full: LoadPlan, checkpoint: Checkpoint, module: BuiltModule, settings: RobustSettings) -> LoadPlan:
    """A target's plan: every tensor but its MTP draft's own layers, which only the draft reads.

    The row of :mod:`.mtp_table` that vLLM picks for this target's draft
    names the MTP layers (:func:`mtp_table.draft_roots`); the target's
    ``load_weights`` skips them, and the draft streams them itself, so they
    cross the network once. A layer the built model holds parameters under
    (``module.held``) stays in: the model's own structure overrides the table. The
    completeness check still guards the load. Without a row, with
    ``MX_ROBUST_TARGET_SELECTION=all`` or when N or the MTP layer count is
    unknown, the plan is the whole checkpoint.
    """
    if settings.target_selection == "all":
        return full
    row = module.row(checkpoint)
    if row is None:
        return full
    draft_only = mtp_table.draft_only(row, row_layout_for(row, checkpoint, module.engine), full.expected, module.held)
    if not draft_only:
        return replace(full, architecture=row.key)
    return _less(full, draft_only, architecture=row.key, left_to_draft=draft_only,
                 left_to_draft_bytes=_bytes_of(full, draft_only))  # fmt: skip


def row_layout_for(
    row: mtp_table.MtpArchitecture, checkpoint: Optional[Checkpoint], engine: EngineView
) -> mtp_table.RowLayout:
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


def _plan_for_row(
    checkpoint: Checkpoint, engine: EngineView, settings: RobustSettings, row: mtp_table.MtpArchitecture
) -> LoadPlan:
    layout = row_layout_for(row, checkpoint, engine)
    names = set(checkpoint.tensors())
    if row.per_runner_layer and engine.draft_layer is not None and layout.count == 0:
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: {mtp_table.describe(row)}: this draft runner serves MTP layer "
            f"{engine.draft_layer} (SGLang's draft_model_idx), but the checkpoint has no MTP layer "
            f"{engine.draft_layer} (its layer count: {layout.count_from}); SGLang would leave this runner's "
            f"weights at their init values: lower --speculative-num-steps to the checkpoint's MTP layers"
        )
    if row.layout in ("nextn", "indexed") and not layout.indices(row):
        missing = []
        if layout.first is None:
            missing.append("num_hidden_layers (N)")
        if layout.count is None:
            missing.append("/".join(row.count_keys))
        raise DraftPlanError(
            f"draft load from {checkpoint.uri}: {mtp_table.describe(row)}: cannot place its MTP layers: "
            f"{' and '.join(missing)} not in the draft's config nor in the checkpoint's config.json"
        )
    selection = mtp_table.select(
        row,
        names,
        layout,
        shares_target_weights=engine.shares_target_weights,
        shared_policy=settings.draft_shared_weights,
        load_checks_parameters=engine.mtp_load_checks,
        heads_replaced=engine.heads_replaced,
    )
    if not selection.own:
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
    return replace(
        _draft_plan(
            checkpoint, frozenset(selection.names), mtp_table.convention_name(row), frozenset(selection.shared)
        ),
        architecture=row.key,
        skipped=frozenset(selection.skipped),
    )


def _less(plan: LoadPlan, dropped: frozenset[str], **changes) -> LoadPlan:
    """``plan`` without the names in ``dropped``, from the shards that still hold one of its names."""
    names = frozenset(n for n in plan.expected if n not in dropped)
    return replace(plan, names=names, shards=_shards_holding(plan.shards, names), **changes)


def _bytes_of(plan: LoadPlan, names: frozenset[str]) -> int:
    """The bytes of ``names`` in the plan's shards."""
    return sum(t.nbytes for s in plan.shards for n, t in s.tensors.items() if n in names)


def _shards_holding(shards: Iterable[Shard], names: frozenset[str]) -> tuple[Shard, ...]:
    """The shards that hold at least one of ``names``, in their order: the only ones a draft reads."""
    return tuple(s for s in shards if any(n in names for n in s.tensors))


def _draft_plan(checkpoint: Checkpoint, names: frozenset[str], convention: str, shared: frozenset[str]) -> LoadPlan:
    shards = _shards_holding(checkpoint.loadable_shards, names)
    return LoadPlan(checkpoint.uri, shards, names, role="draft", convention=convention, shared=shared)


def narrow_to_model(plan: LoadPlan, unused: Optional[Callable[[str], bool]]) -> LoadPlan:
    """A plan less the tensors the model itself says it will not load (``engine.declared_unused``).

    Such a tensor in the plan is a selection error (a table row, the generic
    conventions, ``MX_ROBUST_DRAFT_EXTRA_PREFIXES``, or a target's whole
    checkpoint where the table knows no MTP layers): it is left out and named
    in ``unused_by_model``, so no byte is streamed that ``load_weights``
    throws away. With ``MX_ROBUST_TARGET_SELECTION=all`` a target's plan stays whole
    (the caller passes no ``unused``).
    """
    if unused is None:
        return plan
    dropped = frozenset(n for n in plan.expected if unused(n))
    if not dropped:
        return plan
    return _less(plan, dropped, shared=plan.shared - dropped, unused_by_model=dropped)


def share_universe(checkpoint: Checkpoint, settings: RobustSettings) -> tuple[list[str], list[int]]:
    """The names every rank's share is a subset of (the loaded shards' tensors, in plan order), and their bytes."""
    infos = [t for s in loaded_shards(checkpoint, settings) for t in s.tensors.values()]
    return [t.name for t in infos], [t.nbytes for t in infos]


def carrier_plan(plan: LoadPlan, checkpoint: Checkpoint, settings: RobustSettings, names: frozenset[str]) -> LoadPlan:
    """What this rank streams when its host's ranks read different shares: ``plan`` widened to ``names``,
    the union of the host's shares (:func:`.distributed.agreed_shares`). The model is still fed ``plan``."""
    if names == frozenset(plan.expected):
        return plan
    return replace(plan, names=names, shards=_shards_holding(loaded_shards(checkpoint, settings), names))


MODULE_ANSWERED = frozenset({"dry_run"})


def narrow_to_rank(plan: LoadPlan, share: Optional[RankShare]) -> LoadPlan:
    """A plan less what this rank's module does not hold (another stage's layers, another rank's experts).

    Only where a table row, a convention or the whole checkpoint decided:
    the module's own answer (``selection_source`` dry_run or declared) is
    already this rank's share. ``share`` comes from
    :func:`.rank_share.share_of` on the built module; None (doctor, no
    module) or a whole share leaves the plan as it is.
    """
    if share is None or share.whole or plan.selection_source in MODULE_ANSWERED:
        return plan
    reasons = {n: why for n in plan.expected if (why := share.why_not_held(n))}
    if not reasons:
        return plan
    not_held = frozenset(reasons)
    return _less(plan, not_held, shared=plan.shared - not_held, left_out={**plan.left_out, **reasons},
                 not_held=not_held, not_held_bytes=_bytes_of(plan, not_held))  # fmt: skip


def is_target_source(candidate: Candidate, engine: EngineView, settings: RobustSettings) -> bool:
    """Whether ``candidate`` is the target's checkpoint (MX_MODEL_URI or one of the target's sources)."""
    shared = {normalize_uri(u) for u in engine.target_uris}
    if settings.model_uri:
        shared.add(normalize_uri(settings.model_uri))
    return normalize_uri(candidate.uri) in shared


def plan_load(cands: list[Candidate], module: BuiltModule, settings: RobustSettings) -> tuple[Resolution, LoadPlan]:
    """Walk the source chain, then plan the load of ``module`` from the chosen source.

    Raises NoStreamableSource, InconsistentCheckpoint or DraftPlanError (all ``mutated=False``).
    """
    resolution = resolve(cands, settings)
    return resolution, plan_resolved(resolution, module, settings)


def plan_resolved(resolution: Resolution, module: BuiltModule, settings: RobustSettings) -> LoadPlan:
    """This rank's plan from a source already chosen (by this rank, or by rank 0 for every rank): the
    module's answer (or the table's, or a convention's), less what the model says it does not load
    (:func:`narrow_to_model`) and what this rank does not hold (:func:`narrow_to_rank`)."""
    source_is_target = is_target_source(resolution.candidate, module.engine, settings)
    plan = plan_for(resolution.checkpoint, module, settings, source_is_target=source_is_target)
    unused, share = module.unused, module.share
    if plan.role == "target" and settings.target_selection == "all":
        unused = share = None
    narrowed = narrow_to_model(plan, unused)
    if plan.expected and not narrowed.expected:
        raise DraftPlanError(
            f"{plan.role} load from {resolution.checkpoint.uri}: the model says it loads none of the "
            f"{len(plan.expected)} tensors selected for it (is_unused_checkpoint_weight)"
        )
    return narrow_to_rank(narrowed, share)


__all__ = [
    "LoadPlan",
    "PlanDescription",
    "carrier_plan",
    "describe_errors",
    "is_target_source",
    "loaded_shards",
    "narrow_to_model",
    "narrow_to_rank",
    "plan_for",
    "plan_load",
    "plan_resolved",
    "points_at_target",
    "row_layout_for",
    "share_universe",
    "target_selection",
]
