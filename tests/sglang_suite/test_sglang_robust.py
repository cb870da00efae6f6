"""robust in SGLang 0.5.23, through ModelExpress 0.7.0's real SglangAdapter and chain.

SGLang's real classes (tests/sglang_support/builders.py) load from S3 (moto on
127.0.0.1) the way SGLang's ``RemoteInstanceModelLoader`` calls ModelExpress
for ``--load-format remote_instance --remote-instance-weight-loader-backend
modelexpress``: ``MxModelLoader(load_config).load_model(model=..., model_config=...,
device_config=...)``. The reference is SGLang's own ``DefaultModelLoader`` on a
local copy, into a model built the same way.

Stand-ins, because no real part runs here: ModelExpress's accelerator backend
for a ``cpu`` device (0.7.0 has cuda and xpu only) is the test-only
``mx_cpu_shim.CpuAcceleratorBackend``, and torchvision is a stub
(tests/stubs/sglang). Everything else is SGLang's and ModelExpress's own code.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from mx_strategies.observe.report import recent_reports
from sglang_support import builders as sb
from sglang_support.loads import HTTP_OVERHEAD, Checkpoint, delivered_names, measured_load, mx_load

ARCHS = ("deepseek_v3", "qwen3_next")
# No table row for either: their classes build here, and their modules answer (the table is the fallback).
DRAFT_ARCHITECTURE = {"deepseek_v3": None, "qwen3_next": None}








def reference(ckpt: Checkpoint, *, draft: bool):
    built = sb.build_model(ckpt.full, draft=draft)
    trace = sb.trace_native_load(built)
    return built, trace




@pytest.mark.parametrize("sources", ["dry_run,table,convention", "dry_run,convention"], ids=["default", "table-off"])
@pytest.mark.parametrize("name", ARCHS)
def test_target_then_its_mtp_draft_load_from_s3_with_robust(
    name, sources, runtime, cpu_backend, reinits, robust_sglang, s3, tmp_path, monkeypatch
):
    """Whichever answers: the module (its dry run), with the table on (the default) or off."""
    ckpt = Checkpoint(tmp_path, name, s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))

    # -- the target: every tensor but the MTP layer, which only the draft reads
    target = sb.build_model(ckpt.config_only, draft=False)
    loaded = measured_load(target, s3)
    fed_target, target_bytes = loaded.fed, loaded.served
    (report,) = [r for r in recent_reports() if r["role"] == "target"]
    assert report["outcome"] == "loaded" and report["source"] == ckpt.uri
    assert report["architecture"] == DRAFT_ARCHITECTURE[name]
    ref_target, ref_target_trace = reference(ckpt, draft=False)
    sb.assert_same_parameters(target.model, ref_target.model)
    left = set(ckpt.tensors) - set(fed_target)
    # SGLang's target module, asked (its dry run), does not read the MTP layer: left out of its plan.
    assert report["selection_source"] == "dry_run" and report["left_out"] == len(left) > 0
    assert not left & ref_target_trace.consumed  # SGLang's target reads none of what robust left out
    assert target_bytes <= 1.01 * ckpt.nbytes(fed_target) + report["metadata_bytes"] + HTTP_OVERHEAD

    # -- the draft: its own tensors only, into the module SGLang built, no rebuild
    draft = sb.build_model(ckpt.config_only, draft=True)
    loaded = measured_load(draft, s3)
    fed_draft, draft_bytes = loaded.fed, loaded.served
    assert not reinits
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["outcome"] == "loaded" and report["architecture"] == DRAFT_ARCHITECTURE[name]
    assert report["selection_source"] == "dry_run", report["selection_note"]
    ref_draft, ref_draft_trace = reference(ckpt, draft=True)
    assert sorted(fed_draft) == sorted(ref_draft_trace.consumed)  # exactly what SGLang's draft reads
    assert set(fed_draft) <= left  # and nothing the target streamed
    sb.assert_same_parameters(draft.model, ref_draft.model)
    kept = ckpt.nbytes(fed_draft)
    assert report["bytes_streamed"] == kept
    assert draft_bytes <= 1.02 * kept + report["metadata_bytes"] + HTTP_OVERHEAD, (draft_bytes, kept)
    # Target and draft together: each checkpoint byte crossed the wire once.
    assert target_bytes + draft_bytes <= 1.02 * ckpt.data_bytes + 2 * (report["metadata_bytes"] + HTTP_OVERHEAD)


def test_qwen3_next_target_is_checked_for_completeness(runtime, cpu_backend, robust_sglang, s3, tmp_path, monkeypatch):
    """Qwen3-Next's SGLang target returns the names it loaded (qwen3_next.py:1276): robust checks them off."""
    ckpt = Checkpoint(tmp_path, "qwen3_next", s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    target = sb.build_model(ckpt.config_only, draft=False)
    from mx_strategies.verify import after as completeness

    outcomes = []
    real = completeness.check

    def recorded(*args, **kwargs):
        outcome = real(*args, **kwargs)
        outcomes.append(outcome)
        return outcome

    monkeypatch.setattr(completeness, "check", recorded)
    mx_load(target)
    (outcome,) = outcomes
    assert outcome.checked and outcome.complete and outcome.required > 0


def test_upstream_model_streamer_on_the_same_sglang_streams_the_whole_checkpoint_for_the_draft(
    runtime, cpu_backend, s3, tmp_path, monkeypatch
):
    """The baseline: plain ModelExpress (its own model_streamer), given the getters SGLang 0.5.23 lacks.

    On 0.7, without them it cannot start at all (tests/sglang_suite/test_sglang_activation.py). With them, its
    draft load reads every byte of the checkpoint: the draft is planned as a target. 0.8's model_streamer
    (RoleAwareModelStreamerLoader) picks the shards the draft's rule names, and reads those whole.
    """
    from mx_strategies.patches import apply_sglang_patches

    apply_sglang_patches()
    ckpt = Checkpoint(tmp_path, "deepseek_v3", s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    draft = sb.build_model(ckpt.config_only, draft=True)
    s3.proxy.reset()
    mx_load(draft)
    ref_draft, ref_trace = reference(ckpt, draft=True)
    sb.assert_same_parameters(draft.model, ref_draft.model)  # right, because SGLang's load_weights filters names
    if importlib.util.find_spec("modelexpress.engines.sglang.role_aware_streamer") is None:  # 0.7
        assert s3.bytes_served >= ckpt.data_bytes > 3 * ckpt.nbytes(ref_trace.consumed)
        return
    with open(os.path.join(ckpt.full, "model.safetensors.index.json")) as handle:
        shard_of = json.load(handle)["weight_map"]
    holding = {shard_of[n] for n in ref_trace.consumed}
    whole = ckpt.nbytes(n for n, shard in shard_of.items() if shard in holding)
    assert ckpt.data_bytes > s3.bytes_served >= whole > ckpt.nbytes(ref_trace.consumed)



def test_a_model_with_secondary_weights_is_refused_before_it_is_touched(
    runtime, cpu_backend, robust_sglang, s3, tmp_path, monkeypatch
):
    """SGLang's loader reads a model's ``secondary_weights`` sources after the checkpoint (loader.py:759);
    robust streams one checkpoint, so it refuses by name (mutated=False) rather than drop them."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    ckpt = Checkpoint(tmp_path, "deepseek_v3", s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    target = sb.build_model(ckpt.config_only, draft=False)
    target.model.secondary_weights = [DefaultModelLoader.Source(model_or_path=ckpt.full, revision=None, prefix="x.")]
    fed = delivered_names(target.model)
    s3.proxy.reset()
    with pytest.raises(Exception):
        mx_load(target)  # then ModelExpress's own strategies find no weights at the config-only model_path
    failed = [r for r in recent_reports() if r["outcome"] == "failed"]
    assert failed and failed[0]["mutated"] is False
    assert "DeepseekV3ForCausalLM.secondary_weights lists 1 more weight source(s)" in failed[0]["error"]
    assert fed == [] and s3.bytes_served == 0  # nothing listed, nothing read, nothing written
