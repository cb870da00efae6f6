"""One load, one question: the built module is asked once, the selection takes one object, the report is the
selection's and the plan's.

vLLM 0.32's real ``DeepseekV3ForCausalLM`` and ``DeepSeekMTP`` load through
ModelExpress's real chain with robust (the adapter's post-load step on the CPU,
as in tests/test_mtp_architectures.py). What a user would see: each load asks
its module once and matches its table row once; the report's selection fields
are exactly what the load's selection and plan say (``observe.report.report_of``), and the log
lines are the load's own (``observe.report.planned_lines``).
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("vllm")

from test_mtp_architectures import load_draft, load_target, target_and_draft_checkpoint, vllm_cpu  # noqa: E402, F401

import mx_strategies.robust as robust_module  # noqa: E402
from mx_strategies.engine import EngineView  # noqa: E402
from mx_strategies.select import module_reads, mtp_table  # noqa: E402
from mx_strategies.select.built_module import BuiltModule  # noqa: E402
from mx_strategies.select.selection import LEFT_TO_DRAFT, NOT_HELD, NOT_READ, UNUSED_BY_MODEL  # noqa: E402


class Described:
    """One load as it was described before it streamed: its log lines and the report fields its selection and
    plan decide (what ``LoadPlan.describe`` said of a plan before the selection was one object)."""

    def __init__(self, load, lines):
        self.lines = tuple(lines)
        selection, plan, left = load.selection, load.plan, load.selection.left_bytes
        answer = selection.answer
        reads = answer if isinstance(answer, module_reads.ModuleReads) else None
        self.report_fields = {
            "role": selection.role,
            "convention": selection.convention,
            "shards": tuple(plan.shard_keys),
            "tensors": len(plan.expected),
            "bytes_streamed": plan.bytes,
            "unused_by_model": tuple(sorted(selection.of_kind(UNUSED_BY_MODEL))),
            "architecture": selection.architecture,
            "left_to_draft": len(selection.of_kind(LEFT_TO_DRAFT)),
            "left_to_draft_bytes": left.get(LEFT_TO_DRAFT, 0),
            "selection_source": selection.source,
            "module_class": answer.module_class if answer is not None else "",
            "selection_note": answer.reason if isinstance(answer, module_reads.Unanswered) else "",
            "selection_seconds": reads.seconds if reads else 0.0,
            "selection_cached": bool(reads and reads.cached),
            "left_out": len(selection.of_kind(NOT_READ, NOT_HELD)),
            "left_out_bytes": left.get(NOT_READ, 0),
            "not_held": len(selection.of_kind(NOT_HELD)),
            "not_held_bytes": left.get(NOT_HELD, 0),
        }


@pytest.fixture
def counted(monkeypatch):
    """Every question asked (module_reads.ask_cached), every BuiltModule made, every table match, every load
    described (with what it said), recorded in the order they happened."""
    seen = {"asked": [], "made": [], "match": 0, "match_target": 0, "described": []}
    ask, made, match, match_target, describe = (
        module_reads.ask_cached, BuiltModule.of.__func__, mtp_table.match, mtp_table.match_target,
        robust_module.planned_lines,
    )  # fmt: skip

    def asking(model, *args, **kwargs):
        seen["asked"].append(type(model).__name__)
        return ask(model, *args, **kwargs)

    def making(cls, model, *args, **kwargs):
        seen["made"].append(type(model).__name__)
        return made(cls, model, *args, **kwargs)

    def matching(*args, **kwargs):
        seen["match"] += 1
        return match(*args, **kwargs)

    def matching_target(*args, **kwargs):
        seen["match_target"] += 1
        return match_target(*args, **kwargs)

    def describing(load):
        lines = describe(load)
        seen["described"].append(Described(load, lines))
        return lines

    monkeypatch.setattr(module_reads, "ask_cached", asking)
    monkeypatch.setattr(BuiltModule, "of", classmethod(making))
    monkeypatch.setattr(mtp_table, "match", matching)
    monkeypatch.setattr(mtp_table, "match_target", matching_target)
    monkeypatch.setattr(robust_module, "planned_lines", describing)
    return seen


def test_a_target_load_asks_its_module_once_and_reports_what_its_plan_says(
    tmp_path, robust, monkeypatch, caplog, vllm_cpu, counted
):
    folder, _, _, (target, vc, config, truth, _), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    counted["match_target"] = 0  # building the checkpoint above matched nothing of the load's
    with caplog.at_level(logging.INFO, logger="modelexpress"):
        loaded, _, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target and report["outcome"] == "loaded"
    assert counted["made"] == ["DeepseekV3ForCausalLM"]
    assert counted["asked"] == ["DeepseekV3ForCausalLM"]
    # DeepSeek-V3's target has no row (its module answers): looked up once by the engine's config, once by the
    # checkpoint's config.json, and not again.
    assert counted["match_target"] == 2
    (description,) = counted["described"]
    assert report["selection_source"] == "dry_run" and report["left_out"] == len(mtp)
    assert {key: report[key] for key in description.report_fields} == dict(description.report_fields)
    logged = [r.getMessage() for r in caplog.records]
    for _, line in description.lines:
        assert any(message.endswith(line) for message in logged), line


def test_a_draft_load_asks_its_module_once_and_matches_its_row_once(tmp_path, robust, monkeypatch, vllm_cpu, counted):
    built, ckpt, _, loaded, reports = load_draft("deepseek_v3", tmp_path, monkeypatch)
    assert loaded is built.module
    (report,) = reports
    assert counted["made"] == ["DeepSeekMTP"] and counted["asked"] == ["DeepSeekMTP"]
    assert counted["match"] == 1
    # DeepSeekMTP builds here: its module answers, and the table has no row for it (nothing to name).
    assert report["selection_source"] == "dry_run" and report["architecture"] is None
    (description,) = counted["described"]
    assert {key: report[key] for key in description.report_fields} == dict(description.report_fields)
    assert sorted(description.report_fields) == sorted(
        ["role", "convention", "shards", "tensors", "bytes_streamed", "unused_by_model", "architecture",
         "left_to_draft", "left_to_draft_bytes", "selection_source", "module_class", "selection_note",
         "selection_seconds", "selection_cached", "left_out", "left_out_bytes", "not_held", "not_held_bytes"]
    )  # fmt: skip
    assert set(description.report_fields) <= set(report)  # every one a field of the report itself


def test_without_a_module_nothing_is_asked_and_the_row_still_decides():
    """doctor's case: the engine alone (a Qwen3.5 draft, whose class cannot be built on a CPU: its table row
    decides). No question, the row matched once at construction, and the engine fills the draft's shared
    embedding and head at pipeline parallel 1, as the row says."""
    engine = EngineView(True, "mtp", (), 1, 1, {}, {}, architectures=("Qwen3_5MTP",), model_type="qwen3_5_mtp")
    module = BuiltModule(engine)
    assert module.question is None and module.reads(object()) is None
    assert module.draft_row is not None and module.draft_row.key == "qwen3_5_mtp"
    assert module.row() is module.draft_row
    assert module.filled_by_engine("model.embed_tokens.weight") and module.filled_by_engine("lm_head.weight")
    assert not module.filled_by_engine("mtp.fc.weight")
