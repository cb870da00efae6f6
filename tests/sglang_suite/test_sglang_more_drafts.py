"""robust in SGLang 0.5.23 for two more MTP drafts: GLM-4.5's NextN and MiMo-V2's multi-layer MTP.

As tests/sglang_suite/test_sglang_robust.py does for DeepSeek-V3 and Qwen3-Next: SGLang's real
classes (tests/sglang_support/builders.py), built on the CPU, load from S3 (moto on 127.0.0.1)
through ModelExpress 0.7.0's real ``MxModelLoader`` / ``SglangAdapter`` / strategy chain, the call
SGLang's ``RemoteInstanceModelLoader`` makes for ``--load-format remote_instance
--remote-instance-weight-loader-backend modelexpress``. The reference is SGLang's own
``DefaultModelLoader`` on a local copy, into a model built the same way (``trace_native_load``:
the names its iterator fed ``load_weights`` and those ``load_weights`` read).

* GLM-4.5: target ``Glm4MoeForCausalLM``, draft ``Glm4MoeForCausalLMNextN``
  (sglang/srt/models/glm4_moe.py, glm4_moe_nextn.py), which reads ``model.layers.{N}.*``.
* MiMo-V2-Flash: target ``MiMoV2FlashForCausalLM``, draft ``MiMoV2MTP``
  (sglang/srt/models/mimo_v2.py, mimo_v2_nextn.py), a checkpoint with three MTP layers
  ``model.mtp.layers.{k}.*``, each with its own random values. SGLang's multi-layer EAGLE builds one
  draft runner per MTP layer with ``LoadConfig.draft_model_idx = k`` (managers/tp_worker.py:498 and
  :519); its own iterator keeps layer k only and renames it to layer 0 (model_loader/loader.py:739).
  Each runner is built here as SGLang builds it (``build_model(draft_model_idx=k)``: the ``LoadConfig``
  and ``_initialize_model``); SGLang's ``MultiLayerEagleWorkerV2`` itself does not run.

Stand-ins, because no real part runs here: ModelExpress's accelerator backend for a ``cpu``
device (0.7.0 has cuda and xpu only) is the test-only ``mx_cpu_shim.CpuAcceleratorBackend``;
torchvision is a stub (tests/stubs/sglang); the EAGLE worker's ``set_embed_and_head`` (which
gives a draft the target's embedding and head after its load) is done by hand, less its
``torch.cuda`` calls (:func:`share_embed_and_head`); the tiny MiMo-V2 config gives a flat
``rope_parameters`` (builders.TINY says why). Everything else is SGLang's and ModelExpress's own code.
"""

from __future__ import annotations

import pytest
import torch

from mx_strategies.observe.report import clear_reports, recent_reports
from sglang_support import builders as sb
from sglang_support.loads import HTTP_OVERHEAD, Checkpoint, delivered_names, measured_load, mx_load

GLM, MIMO = "glm4_moe", "mimo_v2_flash"
# The table row each class matches: GLM's NextN builds here, so none (its module answers); MiMo-V2's is an engine
# rule (one MTP layer per draft runner, SGLang's draft_model_idx).
ROW = {GLM: None, MIMO: "sglang_mimo_v2_mtp"}
MTP_LAYERS = sb.TINY[MIMO]["num_nextn_predict_layers"]  # 3
SHARED = {"model.embed_tokens.weight", "lm_head.weight"}  # the target's, at run time










def reports(role: str, outcome: str = "loaded") -> list[dict]:
    return [r for r in recent_reports() if r["role"] == role and r["outcome"] == outcome]


def share_embed_and_head(model: torch.nn.Module, embed: torch.Tensor, head: torch.Tensor) -> None:
    """What the EAGLE worker does to a draft after its load (``set_embed_and_head``: eagle_worker_v2.py:378,
    multi_layer_eagle_worker_v2.py:379; for MiMoV2MTP mimo_v2_nextn.py:387-393), less the ``torch.cuda``
    calls that method ends with."""
    del model.model.embed_tokens.weight
    del model.lm_head.weight
    model.model.embed_tokens.weight = torch.nn.Parameter(embed.clone(), requires_grad=False)
    model.lm_head.weight = torch.nn.Parameter(head.clone(), requires_grad=False)


def mtp_layer(k: int) -> str:
    return f"model.mtp.layers.{k}."


def as_layer_0(name: str, k: int) -> str:
    """The name SGLang's own iterator gives a checkpoint name of MTP layer k (loader.py:754)."""
    return "model.mtp.layers.0." + name[len(mtp_layer(k)):] if name.startswith(mtp_layer(k)) else name


# --------------------------------------------------------------------------------------------------
# GLM-4.5
# --------------------------------------------------------------------------------------------------


def test_glm4_moe_target_then_its_nextn_draft_load_from_s3_with_robust(
    runtime, cpu_backend, reinits, robust_sglang, s3, tmp_path, monkeypatch
):
    ckpt = Checkpoint(tmp_path, GLM, s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    n = sb.TINY[GLM]["num_hidden_layers"]
    nextn = {name for name in ckpt.tensors if name.startswith(f"model.layers.{n}.")}

    # -- the target: every tensor but the NextN layer, which only the draft reads
    target = sb.build_model(ckpt.config_only, draft=False)
    assert type(target.model).__name__ == "Glm4MoeForCausalLM"
    loaded = measured_load(target, s3)
    fed_target, target_bytes = loaded.fed, loaded.served
    (report,) = reports("target")
    assert report["source"] == ckpt.uri and report["architecture"] == ROW[GLM]
    ref_target = sb.build_model(ckpt.full, draft=False)
    ref_target_trace = sb.trace_native_load(ref_target)
    sb.assert_same_parameters(target.model, ref_target.model)
    assert not sb.sentinel_parameters(target.model)
    left = set(ckpt.tensors) - set(fed_target)
    assert left == nextn  # the whole NextN layer is left to the draft, nothing else
    assert report["selection_source"] == "dry_run" and report["left_out"] == len(left)  # the module asked
    assert not left & ref_target_trace.consumed  # SGLang's target reads none of it (glm4_moe.py:1147-1155)
    assert sorted(fed_target) == sorted(ref_target_trace.consumed)
    assert target_bytes <= 1.01 * ckpt.nbytes(fed_target) + report["metadata_bytes"] + HTTP_OVERHEAD

    # -- the draft: exactly what SGLang's NextN load_weights reads, into the module SGLang built
    draft = sb.build_model(ckpt.config_only, draft=True)
    assert type(draft.model).__name__ == "Glm4MoeForCausalLMNextN"
    loaded = measured_load(draft, s3)
    fed_draft, draft_bytes = loaded.fed, loaded.served
    assert not reinits
    (report,) = reports("draft")
    assert report["architecture"] == ROW[GLM]
    ref_draft = sb.build_model(ckpt.full, draft=True)
    ref_draft_trace = sb.trace_native_load(ref_draft)
    assert sorted(fed_draft) == sorted(ref_draft_trace.consumed)
    # The layer's own embed_tokens and shared_head.head are skipped by SGLang (glm4_moe.py:1162-1164): not streamed.
    assert nextn - set(fed_draft) == {f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.shared_head.head.weight"}
    sb.assert_same_parameters(draft.model, ref_draft.model)
    assert sb.sentinel_parameters(draft.model) == {"model.embed_tokens.weight": 1.0, "lm_head.weight": 1.0}
    kept = ckpt.nbytes(fed_draft)
    assert report["bytes_streamed"] == kept
    assert draft_bytes <= 1.02 * kept + report["metadata_bytes"] + HTTP_OVERHEAD, (draft_bytes, kept)
    assert target_bytes + draft_bytes <= 1.02 * ckpt.data_bytes + 2 * (report["metadata_bytes"] + HTTP_OVERHEAD)


# --------------------------------------------------------------------------------------------------
# MiMo-V2: one draft runner per MTP layer (draft_model_idx)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def mimo(s3, tmp_path, monkeypatch):
    ckpt = Checkpoint(tmp_path, MIMO, s3)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.uri)
    return ckpt


def test_mimo_v2_each_draft_runner_streams_its_own_mtp_layer_with_robust(
    runtime, cpu_backend, reinits, robust_sglang, s3, mimo, monkeypatch
):
    ckpt = mimo
    layers = {k: {n for n in ckpt.tensors if n.startswith(mtp_layer(k))} for k in range(MTP_LAYERS)}
    assert all(len(names) == len(layers[0]) > 0 for names in layers.values())
    # The layers' values differ (else a runner fed the wrong layer would compare equal).
    for k in range(1, MTP_LAYERS):
        for name in layers[0]:
            assert not torch.equal(ckpt.tensors[name], ckpt.tensors[name.replace(mtp_layer(0), mtp_layer(k))]), name

    # -- the target leaves every MTP layer to the draft runners
    target = sb.build_model(ckpt.config_only, draft=False)
    fed_target = delivered_names(target.model)
    mx_load(target)
    (report,) = reports("target")
    assert report["architecture"] == ROW[MIMO]
    assert set(ckpt.tensors) - set(fed_target) == set().union(*layers.values())
    ref_target = sb.build_model(ckpt.full, draft=False)
    ref_target_trace = sb.trace_native_load(ref_target)
    assert sorted(fed_target) == sorted(ref_target_trace.consumed)
    sb.assert_same_parameters(target.model, ref_target.model)
    embed, head = target.model.model.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()

    runners: dict[int, dict[str, torch.Tensor]] = {}
    for k in range(MTP_LAYERS):
        clear_reports()
        draft = sb.build_model(ckpt.config_only, draft=True, draft_model_idx=k)
        assert type(draft.model).__name__ == "MiMoV2MTP" and draft.load_config.draft_model_idx == k
        loaded = measured_load(draft, s3)
        fed, draft_bytes = loaded.fed, loaded.served
        assert not reinits
        (report,) = reports("draft")
        assert report["architecture"] == ROW[MIMO]
        # robust fed runner k layer k's tensors, nothing else (not the shared embedding and head either) ...
        assert sorted(fed) == sorted(layers[k]), k
        # ... which is what SGLang's own load of this runner reads, less the embedding and head it reads and the
        # EAGLE worker then replaces (mimo_v2_nextn.py:335-343; multi_layer_eagle_worker_v2.py:379).
        ref = sb.build_model(ckpt.full, draft=True, draft_model_idx=k)
        ref_trace = sb.trace_native_load(ref)
        assert not any(n.startswith("model.mtp.layers.") and not n.startswith(mtp_layer(0)) for n in ref_trace.fed)
        assert {as_layer_0(n, k) for n in fed} == ref_trace.consumed - SHARED
        assert SHARED <= ref_trace.consumed
        assert sb.sentinel_parameters(draft.model) == {"model.embed_tokens.weight": 1.0, "lm_head.weight": 1.0}
        kept = ckpt.nbytes(fed)
        assert report["bytes_streamed"] == kept
        assert draft_bytes <= 1.02 * kept + report["metadata_bytes"] + HTTP_OVERHEAD, (k, draft_bytes, kept)
        # After the worker shares the target's embedding and head, runner k equals SGLang's own runner k.
        share_embed_and_head(draft.model, embed, head)
        share_embed_and_head(ref.model, embed, head)
        sb.assert_same_parameters(draft.model, ref.model)
        runners[k] = {n: p.detach().clone() for n, p in draft.model.named_parameters() if n not in SHARED}

    # Each runner holds its own layer: every MTP parameter differs between any two runners.
    for j in range(MTP_LAYERS):
        for k in range(j + 1, MTP_LAYERS):
            same = [n for n in runners[j] if torch.equal(runners[j][n], runners[k][n])]
            assert not same, (j, k, same)


def metadata_bytes(folder: str) -> int:
    """The bytes of a checkpoint's metadata: config.json, the index and each shard's safetensors header."""
    import os
    import struct

    total = 0
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            with open(path, "rb") as handle:
                total += 8 + struct.unpack("<Q", handle.read(8))[0]
        elif name.endswith(".json"):
            total += os.path.getsize(path)
    return total


def test_mimo_v2_draft_runner_past_the_checkpoints_mtp_layers_is_refused_before_the_model_is_touched(
    runtime, cpu_backend, reinits, robust_sglang, s3, mimo, monkeypatch
):
    """--speculative-num-steps above the checkpoint's MTP layers: runner MTP_LAYERS has no layer to load.

    SGLang's own load would leave that runner at its init values (its iterator keeps no MTP name,
    loader.py:752-753, and load_weights raises nothing). robust refuses it with
    ``StrategyFailed(mutated=False)`` having read only the checkpoint's metadata, and ModelExpress's
    chain moves on: here to its ``default`` strategy, which finds no weights in the config-only
    model_path (and, being ModelExpress's, asks for a rebuild), so the load fails as a whole.
    """
    from mx_strategies.robust import RobustModelStreamerStrategy

    draft = sb.build_model(mimo.config_only, draft=True, draft_model_idx=MTP_LAYERS)
    fed = delivered_names(draft.model)
    untouched = sb.sentinel_parameters(draft.model)  # all of it, as built
    assert untouched and set(untouched.values()) == {1.0}
    at_failure = {}
    real = RobustModelStreamerStrategy.load

    def observed(self, result, ctx):
        try:
            return real(self, result, ctx)
        except Exception:
            at_failure.update(untouched=sb.sentinel_parameters(draft.model), fed=list(fed),
                              reinits=len(reinits), bytes=s3.bytes_served)
            raise

    monkeypatch.setattr(RobustModelStreamerStrategy, "load", observed)
    s3.proxy.reset()
    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        mx_load(draft)
    (failure,) = reports("draft", "failed")  # robust's, as the chain was told
    assert failure["mutated"] is False
    assert "draft_model_idx" in failure["error"] and f"no MTP layer {MTP_LAYERS}" in failure["error"], failure["error"]
    assert not reports("draft")
    # When robust gave up: no name fed, not one parameter written, no rebuild asked, only metadata read.
    assert at_failure["fed"] == [] and at_failure["untouched"] == untouched and at_failure["reinits"] == 0
    assert at_failure["bytes"] <= metadata_bytes(mimo.full) + HTTP_OVERHEAD, at_failure["bytes"]
