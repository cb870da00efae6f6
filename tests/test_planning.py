"""The selection and the load plan (:mod:`mx_strategies.select.selection`, :mod:`mx_strategies.plan.planning`):
the one place that decides what a load streams.

Unit tests of ``loaded_shards``, ``select_tensors``/``plan_of`` and ``is_target_source`` on real
inspected checkpoints, and the promise the plan exists for: ``doctor`` and
the strategy agree on every checkpoint the tests build (doctor's view is
planned by the same functions; the strategy's load report says what it
actually streamed).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers.checkpoints import (
    hf_cache,
    tiny_shards,
    write_checkpoint,
    write_unpadded,
    written,
)
from helpers.engine import MTP_DRAFT, TARGET, direct_load, model_config, vllm_config

from mx_strategies.inspect.checkpoint import Shard, TensorInfo, loaded_shards
from mx_strategies.inspect.index import inspect
from mx_strategies.cli.doctor import diagnose
from mx_strategies.engine import EngineView
from mx_strategies.errors import DraftPlanError, InconsistentCheckpoint
from mx_strategies.plan.planning import LoadPlan, plan_of
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.select.selection import UNUSED_BY_MODEL, _is_target_source, select_resolved, select_tensors
from mx_strategies.stream import read_ahead
from mx_strategies.stream.read_ahead import plan_head
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, resolve
from mx_strategies.inspect.storage import LocalStore
from mx_strategies.testing.synthetic import mtp_checkpoint

EAGLE_DRAFT = EngineView(True, "eagle", (), 1, 1, None, {})


def inspected(path: str):
    return inspect(LocalStore(path), load_settings().discovery_depth)


def planned(checkpoint, module, settings, *, source_is_target, ask=True):
    """(selection, plan) of ``module``'s load from ``checkpoint``, as the strategy makes them."""
    selection = select_tensors(checkpoint, module, settings, source_is_target=source_is_target, ask=ask)
    return selection, plan_of(checkpoint, selection.names, settings)


# -- which shards load ---------------------------------------------------------------------


def test_loaded_shards_leave_empty_ones_out_unless_told(monkeypatch, tmp_path):
    """Without an index (an index never names an empty shard, so those are never loaded)."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4, empty=(0, 2)), index=False)
    checkpoint = inspected(ckpt.path)
    assert [s.key for s in loaded_shards(checkpoint, load_settings())] == [ckpt.names[1], ckpt.names[3]]
    monkeypatch.setenv("MX_ROBUST_SKIP_EMPTY_SHARDS", "false")
    assert [s.key for s in loaded_shards(checkpoint, load_settings())] == ckpt.names


def test_target_plan_is_every_tensor_in_plan_order(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3, empty=(1,)), write_order=[2, 0, 1])
    selection, plan = planned(inspected(ckpt.path), BuiltModule(TARGET), load_settings(), source_is_target=True)
    assert selection.role == "target" and plan.names is None and selection.convention is None
    assert plan.expected == ckpt.order
    assert plan.shard_keys == [ckpt.names[0], ckpt.names[2]]
    assert plan.uris == [ckpt.files[0], ckpt.files[2]]
    assert plan.bytes == ckpt.data_bytes


def test_a_checkpoint_with_errors_is_not_planned(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    os.truncate(ckpt.files[1], 0)
    with pytest.raises(InconsistentCheckpoint, match=f"^checkpoint {ckpt.path} is inconsistent, not loading it: "):
        select_tensors(inspected(ckpt.path), BuiltModule(TARGET), load_settings(), source_is_target=True)


# -- drafts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("style, convention", [("qwen", "mtp"), ("deepseek", "nextn_layers")])
def test_mtp_draft_plan_is_its_head_from_the_shards_holding_it(tmp_path, style, convention):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style=style, empty_shards=(1,))
    selection, plan = planned(inspected(ck.path), BuiltModule(MTP_DRAFT), load_settings(), source_is_target=True)
    assert selection.role == "draft" and selection.convention == convention
    assert plan.names == frozenset(ck.draft_names) and set(plan.expected) == ck.draft_names
    assert plan.shard_keys == [ck.shard_names[-1]]
    assert plan.bytes == ck.nbytes(ck.draft_names)
    assert selection.shared == frozenset()


def test_draft_at_pipeline_parallel_2_also_streams_the_shared_weights(tmp_path):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    draft_pp2 = EngineView(True, "mtp", (), 1, 2, None, {})
    selection, plan = planned(inspected(ck.path), BuiltModule(draft_pp2), load_settings(), source_is_target=True)
    assert selection.shared == frozenset(ck.shared_names)
    assert plan.names == frozenset(ck.draft_names | ck.shared_names)
    assert plan.shard_keys == [ck.shard_names[0], ck.shard_names[-2], ck.shard_names[-1]]  # embed, lm_head, head


def test_a_draft_with_a_checkpoint_of_its_own_loads_it_whole_and_is_never_fed_the_target(tmp_path):
    ck = mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek")
    checkpoint = inspected(ck.path)
    selection, whole = planned(checkpoint, BuiltModule(EAGLE_DRAFT), load_settings(), source_is_target=False)
    assert whole.names is None and selection.role == "draft" and set(whole.expected) == set(ck.tensors)
    with pytest.raises(DraftPlanError, match=r"draft \(method eagle\) has a checkpoint of its own"):
        select_tensors(checkpoint, BuiltModule(EAGLE_DRAFT), load_settings(), source_is_target=True)


def test_the_target_source_is_mx_model_uri_or_the_targets_own(monkeypatch):
    engine = EngineView(True, "mtp", ("s3://bucket/target",), 1, 1, None, {})
    settings = load_settings()
    assert _is_target_source(Candidate("model", "s3://bucket/target/"), engine, settings)
    assert not _is_target_source(Candidate("model", "s3://bucket/eagle"), engine, settings)
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/eagle")
    assert _is_target_source(Candidate("model", "s3://bucket/eagle"), engine, load_settings())


def test_resolve_walks_the_chain_then_the_load_is_planned(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    missing = str(tmp_path / "gone")
    settings = load_settings()
    resolution = resolve([Candidate("model", missing), Candidate("MX_MODEL_URI", ckpt.path)], settings)
    plan = plan_of(resolution.checkpoint, select_resolved(resolution, BuiltModule(TARGET), settings).names, settings)
    assert resolution.candidate == Candidate("MX_MODEL_URI", ckpt.path)
    assert [r.candidate.uri for r in resolution.rejected] == [missing]
    assert plan.expected == ckpt.order


# -- doctor and the strategy agree ----------------------------------------------------------------


def _tiny(count, **kwargs):
    return lambda path: write_checkpoint(path, tiny_shards(count, **{k: v for k, v in kwargs.items() if k == "empty"}),
                                         **{k: v for k, v in kwargs.items() if k != "empty"})  # fmt: skip


def _vllm_cache(path):
    inner = write_checkpoint(os.path.join(path, "model_streamer", "6f1c0b2a9e"), tiny_shards(3))
    return written(path, inner.files)


# Every kind of checkpoint the suite loads (layouts, empty shards, MTP heads), as path -> (root, tensors, draft?).
CHECKPOINTS = {
    "empty_first": _tiny(5, empty=(0,)),
    "empty_last": _tiny(5, empty=(4,)),
    "all_but_one_empty": _tiny(5, empty=(0, 1, 3, 4)),
    "forty_no_index": _tiny(40, empty=(3, 17), index=False),
    "subfolder": _tiny(3, subfolder="weights"),
    "unpadded_shuffled": lambda path: write_unpadded(path, tiny_shards(12, empty=(6,)), index=True,
                                                     write_order=[5, 11, 0, 9, 2, 7, 1, 10, 3, 8, 4, 6]),  # fmt: skip
    "hf_cache": lambda path: hf_cache(path, tiny_shards(3, empty=(1,))),
    "vllm_cache": _vllm_cache,
    "qwen_mtp": lambda path: mtp_checkpoint(path, style="qwen", empty_shards=(1,)),
    "deepseek_mtp": lambda path: mtp_checkpoint(path, style="deepseek", empty_shards=(1,)),
    "deepseek_two_heads": lambda path: mtp_checkpoint(path, style="deepseek", num_nextn_layers=2),
    # DeepSeek-V3's draft class builds here (its module answers; the table has no row): without a module its
    # target loads the whole checkpoint.
    "deepseek_v3_no_row": lambda path: _retargeted(path, "deepseek_v3", ["DeepseekV3ForCausalLM"], empty_shards=(1,)),
}
# Targets a table row names the draft of: the synthetic checkpoints name Qwen3.5 and DeepSeek-V3.2, whose draft
# classes are not built on these CPUs (their rows decide without a module).
ROW_TARGETS = {"qwen_mtp", "deepseek_mtp", "deepseek_two_heads"}


def _retargeted(path: str, model_type: str, architectures: list[str], **fields):
    """A DeepSeek-style MTP checkpoint whose config.json names another target of the same naming."""
    built = mtp_checkpoint(path, style="deepseek", **fields)
    config = dict(built.config, model_type=model_type, architectures=architectures)
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump(config, handle)
    return built


def _loadable(built):
    """(root folder, tensors, draft names or None) of what a CHECKPOINTS builder wrote."""
    if hasattr(built, "draft_names"):
        return built.path, built.tensors, built.draft_names
    return built.path, built.reference, None


@pytest.mark.parametrize("skip_empty", ["true", "false"])
@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_doctor_and_the_strategy_agree(monkeypatch, tmp_path, case, skip_empty):
    """doctor builds no module: it plans with the table and the conventions. The strategy agrees when it does
    too (these stand-in models hold every tensor, so asked, they would claim the draft's layers; real modules
    answer in test_mtp_architectures.py and test_module_reads.py). Only a target with a table row leaves its
    draft's layers out without a module (Qwen3.5's, DeepSeek-V3.2's); DeepSeek-V3's streams the whole checkpoint."""
    monkeypatch.setenv("MX_ROBUST_SKIP_EMPTY_SHARDS", skip_empty)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    path, tensors, draft_names = _loadable(CHECKPOINTS[case](str(tmp_path / "ckpt")))
    doctor = diagnose(path).as_dict()
    monkeypatch.setenv("MX_MODEL_URI", path)

    target = direct_load(model_config(), tensors)

    assert target.error is None, target.error
    report = target.report
    loads = [row["file"] for row in sorted(doctor["shards"], key=lambda r: r["load_order"] or 0) if row["status"] == "load"]
    assert list(report["shards"]) == loads
    assert [row["load_order"] for row in doctor["shards"] if row["status"] == "load"] == list(range(1, len(loads) + 1))
    # The target streams every tensor but the MTP draft's own layers, which it leaves to the draft.
    target_view = doctor["target"]
    assert report["tensors"] == target_view["tensors"] == len(target.model.order)
    assert report["bytes_streamed"] == target_view["bytes"]
    assert report["left_to_draft"] == target_view["left_to_draft"]
    assert report["left_to_draft_bytes"] == target_view["left_to_draft_bytes"]
    assert report["tensors"] + report["left_to_draft"] == doctor["summary"]["tensors"] == len(tensors)
    assert report["bytes_streamed"] + report["left_to_draft_bytes"] == report["checkpoint_bytes"]
    assert (report["left_to_draft"] > 0) is (draft_names is not None and case in ROW_TARGETS)
    assert report["checkpoint_bytes"] == doctor["summary"]["tensor_bytes"]
    assert report["metadata_bytes"] == doctor["summary"]["header_bytes"]

    draft_view = doctor["draft"]
    assert draft_view["found"] is (draft_names is not None)
    if draft_names is None:
        return
    draft = direct_load(
        model_config(model=str(tmp_path / "nowhere"), runner_type="draft"),
        tensors,
        names=draft_names,
        vcfg=vllm_config("mtp"),
        draft=True,
    )
    assert draft.error is None, draft.error
    assert list(draft.report["shards"]) == draft_view["shards"]
    assert draft.report["convention"] == draft_view["convention"]
    assert draft.report["tensors"] == draft_view["tensors"] == len(draft_names)
    assert draft.report["bytes_streamed"] == draft_view["bytes"]
    assert sorted(draft.model.order) == draft_view["names"]
    # Where a row names the draft's layers, each tensor crosses once: what the draft streams, the target did not
    # (the shared embedding and head excepted: at pipeline parallel 1 the draft streams neither). Without a row
    # the target streams the draft's layers too (its real load_weights skips them: more bytes, no wrong ones).
    both = set(draft.model.order) & set(target.model.order)
    assert both == (set() if case in ROW_TARGETS else set(draft_names))


# -- the model's own word on what it does not load (engine.declared_unused) ----------------------


def _shard(key: str, *names: str) -> Shard:
    return Shard(key, f"s3://b/{key}", 100, readable=True,
                 tensors={n: TensorInfo(n, "BF16", (2,), 4) for n in names})  # fmt: skip


def _one_by_one(path: str, *shards: tuple[str, ...]):
    """A checkpoint of tiny float32 tensors, shard by shard as given (the names' order is the plan's where each
    shard holds one), and its inspection."""
    ckpt = write_checkpoint(path, [{n: torch.zeros(2) for n in names} for names in shards])
    return ckpt, inspected(ckpt.path)


def test_the_selection_drops_what_the_model_says_it_does_not_load(tmp_path, monkeypatch):
    """A draft's convention picks ``mtp.*``, ``MX_ROBUST_DRAFT_EXTRA_PREFIXES`` a layer and, at pipeline parallel 2,
    the shared head; the model's word (``unused``) drops all but ``mtp.*``."""
    ckpt, checkpoint = _one_by_one(str(tmp_path / "ckpt"), ("mtp.fc.weight", "lm_head.weight"), ("model.layers.1.w",))
    monkeypatch.setenv("MX_ROBUST_DRAFT_EXTRA_PREFIXES", "model.layers.1.")
    settings = load_settings()
    draft_pp2 = EngineView(True, "mtp", (), 1, 2, None, {})
    unused = lambda name: not name.startswith("mtp.")  # noqa: E731 - Qwen3-Next's rule, less embed/head
    whole_selection, whole_plan = planned(checkpoint, BuiltModule(draft_pp2), settings, source_is_target=True)
    assert whole_selection.shared == {"lm_head.weight"}  # what the model's word then drops
    selection, narrowed = planned(checkpoint, BuiltModule(draft_pp2, unused=unused), settings, source_is_target=True)
    assert narrowed.expected == ["mtp.fc.weight"]
    assert narrowed.shard_keys == [ckpt.names[0]]  # shard b held only a dropped tensor: not read
    assert selection.of_kind(UNUSED_BY_MODEL) == {"lm_head.weight", "model.layers.1.w"}
    assert selection.shared == frozenset()
    assert whole_selection.of_kind(UNUSED_BY_MODEL) == frozenset() and set(whole_plan.expected) == {
        "mtp.fc.weight", "lm_head.weight", "model.layers.1.w"}  # fmt: skip
    # A target's whole-checkpoint plan is narrowed the same way (vLLM 0.33's targets say it too).
    target, full = planned(checkpoint, BuiltModule(TARGET, unused=unused), settings, source_is_target=True)
    assert full.expected == ["mtp.fc.weight"] and target.of_kind(UNUSED_BY_MODEL) == {"lm_head.weight", "model.layers.1.w"}


def test_a_draft_the_model_says_loads_nothing_is_refused_before_streaming(tmp_path, monkeypatch):
    folder = str(tmp_path / "ckpt")
    mtp_checkpoint(folder, style="qwen", num_hidden_layers=2, num_nextn_layers=1, hidden=16, vocab=32)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    settings = load_settings()
    engine = EngineView(True, "mtp", (folder,), 1, 1, {"num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    with pytest.raises(DraftPlanError, match="the model says it loads none of the .* tensors selected for it") as failure:
        resolution = resolve([Candidate("MX_MODEL_URI", folder)], settings)
        select_resolved(resolution, BuiltModule(engine, unused=lambda name: True), settings)
    assert failure.value.mutated is False


# -- what may stream before the module answers (stream.read_ahead: plan_head, uncertain) ---------------


def test_the_head_is_the_plans_first_tensors_within_the_budget_and_the_rest_follows():
    shards = (_shard("a", "x.0", "x.1", "x.2"), _shard("b", "x.3", "x.4"))  # 4 bytes each
    plan = LoadPlan("s3://b", shards, None)
    first = plan_head(plan, 12)
    assert first.expected == ["x.0", "x.1", "x.2"] and first.shard_keys == ["a"] and first.bytes == 12
    assert plan_head(plan, 13).expected == ["x.0", "x.1", "x.2"]  # a tensor is never split
    assert plan_head(plan, 1).expected == ["x.0"]  # a budget smaller than the first still reads it
    assert plan_head(plan, 1 << 40).expected == plan.expected
    assert plan_head(plan, 0) is None and plan_head(LoadPlan("s3://b", (), None), 8) is None
    rest = read_ahead._rest(plan, frozenset(first.expected))
    assert rest.expected == ["x.3", "x.4"] and rest.shard_keys == ["b"]
    assert read_ahead._rest(plan, frozenset(plan.expected)) is None
    # Only the plan's own names, in its order.
    narrowed = LoadPlan("s3://b", shards, frozenset({"x.1", "x.4"}))
    assert plan_head(narrowed, 1 << 40).expected == ["x.1", "x.4"]


def _foreseen_head(checkpoint, engine, held=None):
    """The read-ahead's head of ``engine``'s load, selected without asking (a module still to be asked)."""
    module = BuiltModule(engine, held=held, question=lambda checkpoint: pytest.fail("the module was asked"))
    settings = load_settings()
    selection, plan = planned(checkpoint, module, settings, source_is_target=True, ask=False)
    leave = read_ahead._uncertain(selection, checkpoint, plan_of(checkpoint, None, settings).expected, module, settings)
    return selection, plan_head(plan, 1 << 40, leave), leave


def test_a_drafts_head_leaves_its_embeddings_heads_and_shared_weights_to_the_answer(tmp_path):
    """A DeepSeek-style draft (layer N=2) at pipeline parallel 2 also streams the shared ``lm_head.weight``."""
    names = ("model.layers.2.embed_tokens.weight", "model.layers.2.enorm.weight", "model.layers.2.shared_head.head.weight",
             "model.layers.2.eh_proj.weight", "lm_head.weight", "model.norm.weight")  # fmt: skip
    _, checkpoint = _one_by_one(str(tmp_path / "ckpt"), *((name,) for name in names))
    draft_pp2 = EngineView(True, "mtp", (), 1, 2, {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}, {})
    selection, head, leave = _foreseen_head(checkpoint, draft_pp2)
    assert selection.shared == {"lm_head.weight"} and leave == {
        "model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight", "lm_head.weight"}  # fmt: skip
    assert head.expected == ["model.layers.2.enorm.weight", "model.layers.2.eh_proj.weight"]
    # A target's embedding and head are its own: read ahead.
    assert _foreseen_head(checkpoint, TARGET)[1].expected == list(names)


def test_a_layer_the_module_does_not_hold_is_not_read_ahead(tmp_path):
    """A target holds layers 0-1 (``held``: its parameter names); layer 2 is its MTP draft's. Layers are matched
    by container and index, so a module naming its tree otherwise still matches; a module that numbers no
    ``layers`` (a stand-in's flat buffers) says nothing."""
    names = ("model.embed_tokens.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.experts.3.w",
             "model.layers.2.eh_proj.weight", "model.layers.2.mlp.experts.3.w", "lm_head.weight")  # fmt: skip
    _, checkpoint = _one_by_one(str(tmp_path / "ckpt"), *((name,) for name in names))
    held = frozenset({"model.embed_tokens.weight", "model.layers.0.mlp.gate_up_proj.weight",
                      "model.layers.1.mlp.experts.w13_weight", "lm_head.weight"})  # fmt: skip
    expected = ["model.embed_tokens.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.experts.3.w",
                "lm_head.weight"]  # fmt: skip
    assert _foreseen_head(checkpoint, TARGET, held)[1].expected == expected
    renamed = frozenset("language_model." + name for name in held)
    assert _foreseen_head(checkpoint, TARGET, renamed)[1].expected == expected
    assert _foreseen_head(checkpoint, TARGET, frozenset({"w0", "w1"}))[1].expected == list(names)
    assert _foreseen_head(checkpoint, TARGET, None)[1].expected == list(names)
    assert read_ahead._layer_of("model.layers.².w") is None and read_ahead._layer_of("lm_head.weight") is None
