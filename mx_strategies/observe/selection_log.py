"""What a load's selection says to the user: its log lines and its report fields.

The selection (:mod:`..select.selection`) is plain data: the names, each
left-out name's kind and why, and the module's answer. How that reads, in
the log before streaming and in the load report after, is decided here
only, from those fields.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import listed
from ..verify.kept import GAPS_SHOWN
from ..select.module_reads import ModuleReads, Unanswered, left_out_summary
from ..select.selection import LEFT_TO_DRAFT, NOT_HELD, NOT_READ, SKIPPED, UNUSED_BY_MODEL

if TYPE_CHECKING:
    from ..select.selection import Selection


def selection_fields(selection: "Selection") -> dict[str, Any]:
    """The load report's fields that the selection decides (:class:`.report.LoadReport`)."""
    answer, left_bytes = selection.answer, selection.left_bytes
    reads = answer if isinstance(answer, ModuleReads) else None
    return dict(
        convention=selection.convention, architecture=selection.architecture, selection_source=selection.source,
        module_class=answer.module_class if answer is not None else "",
        selection_note=answer.reason if isinstance(answer, Unanswered) else "",
        selection_seconds=reads.seconds if reads else 0.0, selection_cached=bool(reads and reads.cached),
        unused_by_model=tuple(sorted(selection.of_kind(UNUSED_BY_MODEL))),
        left_to_draft=len(selection.of_kind(LEFT_TO_DRAFT)), left_to_draft_bytes=left_bytes.get(LEFT_TO_DRAFT, 0),
        left_out=len(selection.of_kind(NOT_READ, NOT_HELD)),
        left_out_bytes=left_bytes.get(NOT_READ, 0),
        not_held=len(selection.of_kind(NOT_HELD)), not_held_bytes=left_bytes.get(NOT_HELD, 0),
    )  # fmt: skip


def selection_lines(selection: "Selection", tensors: int) -> tuple[tuple[int, str], ...]:
    """The load's log lines about ``selection``, (level, message); ``tensors``: how many stream."""
    role, answer, lines = selection.role, selection.answer, []
    reads = answer if isinstance(answer, ModuleReads) else None
    module_class = answer.module_class if answer is not None else ""
    if selection.shared:
        lines.append((logging.INFO, f"draft also streams shared weights: {sorted(selection.shared)}"))
    if selection.source == "dry_run":
        how = "kept answer" if reads and reads.cached else f"{reads.seconds if reads else 0.0:.2f}s"
        reasons = {n: why.why for n, why in selection.left_out.items() if why.kind in (NOT_READ, NOT_HELD)}
        lines.append((logging.INFO, f"{role} selection_source=dry_run ({module_class}, {how}): {tensors} tensor(s) "
                                    f"read by the module; {left_out_summary(reasons)}"))  # fmt: skip
    elif isinstance(answer, Unanswered) and answer.reason:
        decides = f"; table row {selection.architecture} decides" if selection.source == "table" else ""
        lines.append((logging.INFO if answer.declined else logging.WARNING,
                      f"{role} selection_source={selection.source}: the module {module_class or '(none)'} "
                      f"could not be asked what it reads ({answer.reason}){decides}"))  # fmt: skip
    if selection.architecture and role == "draft" and selection.source == "table":
        lines.append((logging.INFO, f"draft architecture {selection.architecture}: "
                                    f"{len(selection.of_kind(SKIPPED))} tensor(s) not streamed"))  # fmt: skip
    if left_to_draft := selection.of_kind(LEFT_TO_DRAFT):
        lines.append((logging.INFO, f"target: {len(left_to_draft)} tensor(s), {selection.left_bytes.get(LEFT_TO_DRAFT, 0)} "
                                    f"bytes, are the MTP draft's own ({selection.architecture}); not streamed for the "
                                    f"target (MX_ROBUST_TARGET_SELECTION=all streams them)"))  # fmt: skip
    if unused := selection.of_kind(UNUSED_BY_MODEL):
        # The model's own word overrides the selection: a table row or a convention picked too much.
        shown = listed(sorted(unused), 10, ", ")
        architecture, convention = selection.architecture, selection.convention
        picked = f"table row {architecture}" if architecture else f"convention {convention}"
        lines.append((logging.WARNING, f"{role}: {picked} selected {len(unused)} tensor(s) the model says it does not "
                                       f"load (is_unused_checkpoint_weight, skip_checkpoint_weight); not streaming "
                                       f"them: {shown}"))  # fmt: skip
    if reads and reads.gaps:
        lines.append((logging.WARNING, f"{role}: {len(reads.gaps)} parameter(s) the checkpoint fills only in part, "
                                       f"loaded anyway (MX_ROBUST_MODEL_COMPLETENESS=warn): "
                                       + listed([g.describe() for g in reads.gaps], GAPS_SHOWN, "; ")))  # fmt: skip
    if not_held := selection.of_kind(NOT_HELD):
        lines.append((logging.INFO, f"{role}: {len(not_held)} tensor(s), {selection.left_bytes.get(NOT_HELD, 0)} bytes, "
                                    f"are other ranks' (pipeline stages, expert-parallel ranks: the module's "
                                    f"structure); not streamed here"))  # fmt: skip
    return tuple(lines)
