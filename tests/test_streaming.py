"""Streaming and delivery verification (:mod:`mx_strategies.stream.streaming`).

``VerifiedStream`` on its own (a plan from real files, real runai), a
read-ahead taken over, the runai variables a load sets, and the
shortfalls a checkpoint changing under a load produces through the strategy.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import pytest
import torch
from helpers.checkpoints import DROPPED, replace_without, shard_path, tiny_shards, write_checkpoint, write_shard
from helpers.engine import (
    TARGET,
    CountingAdapter,
    RecordingModel,
    assert_loaded,
    direct_load,
    drop_from_stream,
    failed_chain,
    model_config,
    racing,
    robust_messages,
    vllm_config,
)

from mx_strategies.inspect.checkpoint import loaded_shards
from mx_strategies.inspect.index import inspect
from mx_strategies.errors import IncompleteDelivery, InconsistentCheckpoint
from mx_strategies.plan.planning import LoadPlan, plan_of
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.select.selection import select_tensors
from mx_strategies.settings import load_settings
from mx_strategies.inspect.storage import LocalStore
from mx_strategies.stream.read_ahead import ReadAhead, plan_head
from mx_strategies.stream.streaming import VerifiedStream, streamer_variables
from mx_strategies.verify.tensor_bytes import same_bytes


def target_plan(path: str, settings) -> LoadPlan:
    return planned_target(inspect(LocalStore(path), settings.discovery_depth), settings)


def planned_target(checkpoint, settings) -> LoadPlan:
    """A plain target's plan of ``checkpoint``, as the strategy makes it."""
    selection = select_tensors(checkpoint, BuiltModule(TARGET), settings, source_is_target=True)
    return plan_of(checkpoint, selection.names, settings)


# -- VerifiedStream ----------------------------------------------------------------


def test_verified_stream_reports_a_tensor_that_never_came(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    settings = load_settings()
    plan = target_plan(ckpt.path, settings)
    drop_from_stream(monkeypatch, DROPPED)  # runai loses it

    delivered = []
    with pytest.raises(IncompleteDelivery) as caught:
        with VerifiedStream(plan, settings) as stream:
            for name, tensor in stream.tensors():
                delivered.append(name)
                assert same_bytes(tensor, ckpt.reference[name])

    assert str(caught.value) == (
        f"incomplete load from {ckpt.path}: 1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    )
    assert sorted(delivered) == sorted(n for n in ckpt.order if n != DROPPED)  # in arrival order


def test_a_read_ahead_delivers_only_what_the_answered_plan_holds_then_the_rest(tmp_path):
    """runai reads the first two shards ahead, DROPPED among them; the answered plan leaves DROPPED out. The
    model gets exactly the plan's tensors, each once, equal to safetensors' own; DROPPED's bytes are counted."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    settings = load_settings()
    whole = target_plan(ckpt.path, settings)
    first_two = frozenset(n for shard in whole.shards[:2] for n in shard.tensors)
    assert DROPPED in first_two
    answered = whole.narrowed(n for n in whole.expected if n != DROPPED)
    head = plan_head(whole.narrowed(first_two), 1 << 30)
    assert set(head.expected) == first_two

    delivered = []
    with ReadAhead(head, settings) as ahead:
        assert ahead.live
        with VerifiedStream(answered, settings, read_ahead=ahead) as stream:
            for name, tensor in stream.tensors():
                delivered.append(name)
                assert same_bytes(tensor, ckpt.reference[name]), name
        assert not ahead.live
    assert sorted(delivered) == sorted(answered.expected)
    dropped = ckpt.reference[DROPPED]
    assert stream.bytes_discarded == dropped.numel() * dropped.element_size()
    assert stream.read_ahead_bytes == head.bytes
    rest = sum(ckpt.reference[n].numel() * ckpt.reference[n].element_size() for n in answered.expected if n not in first_two)
    assert stream.bytes_from_storage == head.bytes + rest  # the head read once, the rest after it
    in_head = [n for n in delivered if n in first_two]
    assert delivered[: len(in_head)] == in_head  # the head's (in arrival order), then the rest's


def test_a_read_ahead_that_cannot_start_leaves_the_load_as_it_was(monkeypatch, caplog, tmp_path):
    """runai refuses the read-ahead's start (here: a RuntimeError of its own, once); the load is told at INFO
    and streams after the answer, every tensor once."""
    from mx_strategies.stream import runai_plan

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    real, calls = runai_plan.PlannedStreamer.stream_plan, []

    def stream_plan(self, plan, **kwargs):
        calls.append(len(plan.expected))
        if len(calls) == 1:
            raise RuntimeError("no reader threads left")
        return real(self, plan, **kwargs)

    monkeypatch.setattr(runai_plan.PlannedStreamer, "stream_plan", stream_plan)
    with caplog.at_level(logging.INFO):
        attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is None
    assert_loaded(attempt.model, ckpt)
    assert calls == [len(ckpt.reference), len(ckpt.reference)]  # the read-ahead's start, then the stream's own
    assert (
        "[Worker 0] target: runai did not read ahead while the module was asked (RuntimeError: no reader threads "
        "left); streaming after its answer"
    ) in robust_messages(caplog)


def test_verified_stream_warn_policy_reports_and_returns(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "warn")
    settings = load_settings()
    plan = target_plan(ckpt.path, settings)
    drop_from_stream(monkeypatch, DROPPED)
    warnings: list[str] = []
    with VerifiedStream(plan, settings, on_warning=warnings.append) as stream:
        delivered = [name for name, _ in stream.tensors()]
    assert len(delivered) == len(ckpt.reference) - 1
    assert warnings == [
        f"incomplete load from {ckpt.path}: 1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    ]


def test_verified_stream_reports_duplicates(tmp_path):
    """What a load without header checks would do with one name in two shards."""
    shards = tiny_shards(3)
    shards[2]["model.layers.0.input_layernorm.weight"] = torch.ones(16)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), shards, index=False)
    settings = load_settings()
    checkpoint = inspect(LocalStore(ckpt.path), settings.discovery_depth)
    assert [p.kind for p in checkpoint.errors] == ["duplicate_tensor"]  # the strategy would stop here
    with pytest.raises(InconsistentCheckpoint):  # and the selection is where it stops
        select_tensors(checkpoint, BuiltModule(TARGET), settings, source_is_target=True)
    unchecked = LoadPlan(checkpoint.uri, tuple(loaded_shards(checkpoint, settings)), None)
    names: list[str] = []
    with pytest.raises(IncompleteDelivery, match="1 delivered more than once: model.layers.0.input_layernorm.weight"):
        with VerifiedStream(unchecked, settings) as stream:
            names.extend(name for name, _ in stream.tensors())
    assert names.count("model.layers.0.input_layernorm.weight") == 2
    assert len(names) == len(ckpt.reference) + 1


def test_verified_stream_reports_a_plan_listing_a_shard_twice(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    settings = load_settings()
    full = target_plan(ckpt.path, settings)
    twice = LoadPlan(full.source, (full.shards[0], full.shards[1], full.shards[0]), None)
    model = RecordingModel(ckpt.reference)
    with pytest.raises(IncompleteDelivery, match="3 delivered more than once"):
        with VerifiedStream(twice, settings) as stream:
            model.load_weights(stream.tensors())
    assert len(model.order) == len(ckpt.reference) + 3


def test_verified_stream_notices_an_engine_that_stopped_reading(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    settings = load_settings()
    plan = target_plan(ckpt.path, settings)
    with pytest.raises(IncompleteDelivery, match="the engine stopped reading before the stream ended"):
        with VerifiedStream(plan, settings) as stream:
            tensors = stream.tensors()
            next(tensors)
            stream.settle()


def test_verified_stream_is_entered_once(tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    settings = load_settings()
    stream = VerifiedStream(target_plan(ckpt.path, settings), settings)
    with stream:
        with pytest.raises(RuntimeError, match="already started"):
            stream.__enter__()
        assert len(list(stream.tensors())) == len(ckpt.reference)


# -- shortfalls through the strategy: a tensor runai never delivered ------------------------


def test_shortfall_after_the_model_was_touched_is_mutated(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    drop_from_stream(monkeypatch, DROPPED)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is not None and attempt.error.mutated is True
    assert f"1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}" in str(attempt.error)
    assert len(attempt.model.order) == len(ckpt.reference) - 1  # the model really was written to
    assert attempt.adapter.after_load_calls == 0


def test_shortfall_through_the_chain_reinitializes_the_model(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    drop_from_stream(monkeypatch, DROPPED)
    attempt = failed_chain(model_config(), ckpt.reference)
    assert attempt.adapter.reinit_calls == 1
    assert DROPPED in robust_messages(caplog, logging.WARNING)


def test_shortfall_under_warn_policy_loads_and_warns(monkeypatch, caplog, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "warn")
    drop_from_stream(monkeypatch, DROPPED)
    attempt = direct_load(model_config(), ckpt.reference)
    assert attempt.error is None
    assert attempt.adapter.after_load_calls == 1
    assert not attempt.model.weights[DROPPED].any()  # what the user is warned about
    assert sorted(attempt.model.order) == sorted(n for n in ckpt.order if n != DROPPED)  # in arrival order
    warnings = robust_messages(caplog, logging.WARNING)
    shortfall = f"1 of {len(ckpt.reference)} expected tensors missing: {DROPPED}"
    assert f"[Worker 0] incomplete load from {ckpt.path}: {shortfall}" in warnings


def test_a_shard_rewritten_after_planning_is_refused_before_streaming(monkeypatch, tmp_path):
    """Another writer's copy, same names: its identity changed, so no tensor of it is streamed."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(4))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    attempt = direct_load(
        model_config(), ckpt.reference, strategy_cls=racing(lambda path: replace_without(path, DROPPED))
    )
    assert attempt.error is not None and attempt.error.mutated is False
    message = str(attempt.error)
    assert f"streaming {ckpt.path} did not start: 1 file(s) of {ckpt.path} changed since they were inspected" in message
    assert shard_path(ckpt, 2) in message
    assert attempt.model.order == []


# -- the runai variables a load sets ---------------------------------------------------------

RUNAI_VARIABLES = ("RUNAI_STREAMER_CONCURRENCY", "RUNAI_STREAMER_MEMORY_LIMIT", "RUNAI_STREAMER_CHUNK_BYTESIZE")


class EnvironmentRecorder(CountingAdapter):
    """Notes the runai variables in force while the weights are applied."""

    seen: dict[str, Optional[str]] = {}

    def apply_weight_iter(self, result, weights_iter):
        for var in RUNAI_VARIABLES:
            type(self).seen[var] = os.environ.get(var)
        return super().apply_weight_iter(result, weights_iter)


def test_streamer_settings_apply_during_the_load_only(monkeypatch, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "3")
    monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", "0")
    monkeypatch.setenv("MX_ROBUST_STREAMER_CHUNK_BYTESIZE", "4096")
    monkeypatch.setenv("RUNAI_STREAMER_CONCURRENCY", "7")  # the deployment's own, restored afterwards
    monkeypatch.delenv("RUNAI_STREAMER_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("RUNAI_STREAMER_CHUNK_BYTESIZE", raising=False)
    EnvironmentRecorder.seen = {}
    attempt = direct_load(model_config(), ckpt.reference, adapter_cls=EnvironmentRecorder)
    assert attempt.error is None
    assert_loaded(attempt.model, ckpt)
    assert EnvironmentRecorder.seen == {
        "RUNAI_STREAMER_CONCURRENCY": "3",
        "RUNAI_STREAMER_MEMORY_LIMIT": "0",
        "RUNAI_STREAMER_CHUNK_BYTESIZE": "4096",
    }
    assert os.environ["RUNAI_STREAMER_CONCURRENCY"] == "7"
    assert "RUNAI_STREAMER_MEMORY_LIMIT" not in os.environ
    assert "RUNAI_STREAMER_CHUNK_BYTESIZE" not in os.environ


def _variables_in_force(monkeypatch, tmp_path, extra: dict) -> dict[str, Optional[str]]:
    """The runai variables in force while a load with ``model_loader_extra_config=extra`` applied weights."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    for var in RUNAI_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    EnvironmentRecorder.seen = {}
    attempt = direct_load(model_config(), ckpt.reference, adapter_cls=EnvironmentRecorder, vcfg=vllm_config(extra=extra))
    assert attempt.error is None
    assert_loaded(attempt.model, ckpt)
    assert not any(var in os.environ for var in RUNAI_VARIABLES)  # restored afterwards
    return EnvironmentRecorder.seen


def test_model_loader_extra_config_runai_keys_are_honoured(monkeypatch, caplog, tmp_path):
    """vLLM's ``--model-loader-extra-config '{"concurrency": 5, "memory_limit": 0}'``, as the parent honours it."""
    seen = _variables_in_force(monkeypatch, tmp_path, {"concurrency": 5, "memory_limit": 0, "distributed": False})
    assert seen == {
        "RUNAI_STREAMER_CONCURRENCY": "5",
        "RUNAI_STREAMER_MEMORY_LIMIT": "0",
        "RUNAI_STREAMER_CHUNK_BYTESIZE": None,
    }
    assert robust_messages(caplog, logging.WARNING) == ""  # nothing overridden, nothing to say


def test_our_streamer_settings_win_over_model_loader_extra_config_and_say_so(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "3")
    seen = _variables_in_force(monkeypatch, tmp_path, {"concurrency": 5, "memory_limit": 1024})
    assert seen["RUNAI_STREAMER_CONCURRENCY"] == "3"
    assert seen["RUNAI_STREAMER_MEMORY_LIMIT"] == "1024"  # not ours to override
    assert (
        "MX_ROBUST_STREAMER_CONCURRENCY=3 overrides model_loader_extra_config concurrency=5 "
        "(RUNAI_STREAMER_CONCURRENCY)"
    ) in robust_messages(caplog, logging.WARNING)


def test_streamer_variables_extra_config_then_ours(monkeypatch):
    warnings: list[str] = []
    assert streamer_variables(load_settings(), None, warnings.append) == {}
    assert streamer_variables(load_settings(), {"concurrency": 8, "memory_limit": -1, "other": 1}, warnings.append) == {
        "RUNAI_STREAMER_CONCURRENCY": "8",
        "RUNAI_STREAMER_MEMORY_LIMIT": "-1",
    }
    assert warnings == []
    monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", "0")
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "8")  # the same value: nothing overridden
    variables = streamer_variables(load_settings(), {"concurrency": 8, "memory_limit": -1}, warnings.append)
    assert variables == {"RUNAI_STREAMER_CONCURRENCY": "8", "RUNAI_STREAMER_MEMORY_LIMIT": "0"}
    assert warnings == [
        "MX_ROBUST_STREAMER_MEMORY_LIMIT=0 overrides model_loader_extra_config memory_limit=-1 "
        "(RUNAI_STREAMER_MEMORY_LIMIT)"
    ]


# -- tensor ownership ---------------------------------------------------------------------------


class KeepingAdapter(CountingAdapter):
    """An engine that keeps the streamed tensors themselves instead of copying them."""

    kept: dict[str, torch.Tensor] = {}

    def apply_weight_iter(self, result, weights_iter):
        self.kept = dict(weights_iter)
        return result


def test_streamed_tensors_are_owned(monkeypatch, tmp_path):
    """With runai's smallest ring its buffers are reused; a kept tensor must not change."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(6, hidden=32))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_STREAMER_MEMORY_LIMIT", "0")
    attempt = direct_load(model_config(), ckpt.reference, adapter_cls=KeepingAdapter)
    assert attempt.error is None
    kept = attempt.adapter.kept
    assert set(kept) == set(ckpt.reference)
    changed = [n for n, t in kept.items() if not same_bytes(t, ckpt.reference[n])]
    assert changed == []


# -- packed F4 (runai 0.17.1 streams it as float4_e2m1fn_x2, two values per element) --------------------------


def _f4_checkpoint(folder: str) -> dict[str, torch.Tensor]:
    """safetensors' own file: an F4 weight (header shape [4, 16]: 64 four-bit values) beside a bf16 one."""
    generator = torch.Generator().manual_seed(3)
    tensors = {
        "model.layers.0.mlp.down_proj.weight": torch.randint(0, 256, (4, 8), generator=generator, dtype=torch.uint8)
        .view(torch.float4_e2m1fn_x2),
        "model.layers.0.mlp.down_proj.weight_scale": torch.randn(4, 2, generator=generator).to(torch.bfloat16),
    }
    os.makedirs(folder, exist_ok=True)
    write_shard(os.path.join(folder, "model.safetensors"), tensors)
    return tensors


def test_f4_streams_where_runai_packs_it_and_is_refused_by_name_where_it_cannot(tmp_path):
    """runai >= 0.17.1 hands F4 out packed (``PACKED_VALUES_PER_ELEMENT``): robust streams it, each tensor equal
    to safetensors' own load. runai 0.17.0 reads a byte per element: the checkpoint is refused at inspection,
    naming the tensor and the dtype, before anything streams."""
    from safetensors.torch import load_file

    from mx_strategies.releases import installed_release

    folder = str(tmp_path / "f4")
    _f4_checkpoint(folder)
    reference = load_file(os.path.join(folder, "model.safetensors"))
    settings = load_settings()
    checkpoint = inspect(LocalStore(folder), settings.discovery_depth)
    if installed_release("runai-model-streamer") < (0, 17, 1):
        (problem,) = [p for p in checkpoint.problems if p.kind == "unsupported_dtype"]
        assert problem.tensor == "model.layers.0.mlp.down_proj.weight"
        assert "dtype F4 is valid safetensors, but runai-model-streamer cannot stream it" in problem.message
        return
    assert not checkpoint.problems, checkpoint.problems
    plan = planned_target(checkpoint, settings)
    delivered = {}
    with VerifiedStream(plan, settings) as stream:
        for name, tensor in stream.tensors():
            delivered[name] = tensor.clone()
    assert sorted(delivered) == sorted(reference)
    f4 = delivered["model.layers.0.mlp.down_proj.weight"]
    assert (f4.dtype, tuple(f4.shape)) == (torch.float4_e2m1fn_x2, (4, 8))
    assert all(same_bytes(delivered[name], reference[name]) for name in reference)


def test_an_f4_tensor_whose_last_axis_runai_cannot_pack_is_refused_at_inspection(tmp_path):
    """An F4 entry of shape [4, 3] is valid safetensors (12 values, 6 bytes) but runai 0.17.1 cannot give it a
    torch shape: refused when inspected, naming the tensor (runai 0.17.0: refused as a dtype it cannot stream)."""
    import json
    import struct

    from mx_strategies.releases import installed_release

    folder = tmp_path / "f4-odd"
    folder.mkdir()
    header = json.dumps({"w": {"dtype": "F4", "shape": [4, 3], "data_offsets": [0, 6]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(6))
    checkpoint = inspect(LocalStore(str(folder)), load_settings().discovery_depth)
    (problem,) = checkpoint.problems
    assert problem.tensor == "w"
    if installed_release("runai-model-streamer") < (0, 17, 1):
        assert problem.kind == "unsupported_dtype"
    else:
        assert problem.kind == "bad_shape"
        assert "packs 2 F4 values per element along the last axis" in problem.message


def test_the_module_is_asked_about_f4_with_the_shape_runai_will_hand_it(tmp_path):
    """The dry run feeds each name a data-less tensor shaped as runai will deliver it: a module holding the
    packed F4 weight ([4, 8] float4_e2m1fn_x2, as safetensors loads it) answers for both tensors."""
    from safetensors.torch import load_file

    from mx_strategies.select import module_reads
    from mx_strategies.releases import installed_release
    from mx_strategies.testing.standin import StandInModel

    if installed_release("runai-model-streamer") < (0, 17, 1):
        pytest.skip("runai 0.17.0 cannot stream F4: the checkpoint is refused before any question (test above)")
    folder = str(tmp_path / "f4")
    _f4_checkpoint(folder)
    reference = load_file(os.path.join(folder, "model.safetensors"))
    settings = load_settings()
    checkpoint = inspect(LocalStore(folder), settings.discovery_depth)
    fed: dict[str, tuple] = {}

    class Recording(StandInModel):
        def load_weights(self, weights):
            def tap():
                for name, tensor in weights:
                    fed[name] = (tensor.dtype, tuple(tensor.shape))
                    yield name, tensor

            return super().load_weights(tap())

    answer = module_reads.ask(Recording(reference, answers_dry_run=True), checkpoint, settings)
    assert isinstance(answer, module_reads.ModuleReads), answer
    assert answer.source == "dry_run" and set(answer.names) == set(reference)
    assert fed["model.layers.0.mlp.down_proj.weight"] == (torch.float4_e2m1fn_x2, (4, 8))
