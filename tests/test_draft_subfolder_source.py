"""A draft in a sub-folder of the target's checkpoint, found on an object store (issue 38).

vLLM 0.34 defaults MiniMax-M3 DSpark's draft to ``<target.model>/dspark``
(``vllm/v1/worker/gpu/spec_decode/dspark/config.py``, ``_get_minimax_m3_dspark_draft``
in ``vllm/config/speculative.py``). With the target on S3, the target's
``ModelConfig`` has ``model_weights="s3://bucket/ckpt"`` and ``model`` a local
config-only copy, so the draft's ``model`` is ``<copy>/dspark`` (no weights)
and it has no ``model_weights``. The source chain derives
``s3://bucket/ckpt/dspark`` from the target's ``model_weights`` and probes it
like any other candidate.

The configs are ``SimpleNamespace`` stand-ins shaped like vLLM's (the draft's
``ModelConfig`` with ``runner_type="draft"``, a ``VllmConfig`` whose
``speculative_config.target_model_config`` is the target's): building vLLM's
real ``SpeculativeConfig`` for MiniMax-M3 needs the model's config from the
hub. Everything else is real: a moto S3 server on 127.0.0.1 (tests/conftest.py),
safetensors files written by ``safetensors.torch``, the strategy's probe, and
ModelExpress's own chain with the robust strategy installed.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.checkpoints import reference_tensors, tiny_shards, upload, write_checkpoint
from helpers.engine import assert_loaded, direct_load, model_config, run_chain, untouched, vllm_config

from mx_strategies import cli
from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.cli.doctor import diagnose
from mx_strategies.errors import NoStreamableSource
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, candidates, resolve, _target_subfolder
from mx_strategies.verify.tensor_bytes import same_bytes
from mx_strategies.testing.synthetic import config_only_copy

LABEL = "target model_weights + dspark"


def _config(folder: str, model_type: str) -> None:
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"model_type": model_type}, handle)


def minimax_on_s3(tmp_path, s3, *, draft: bool = True):
    """A target checkpoint with its draft in ``dspark/``, uploaded to S3 under ``ckpt/``, and the config-only
    copy vLLM's runai pull leaves locally (the ``*.json`` of both folders, no weights).

    Returns (target URI, local copy, the draft's Written or None)."""
    root = str(tmp_path / "ckpt")
    write_checkpoint(root, tiny_shards(2, seed=1))
    _config(root, "minimax_m3")
    written = None
    if draft:
        written = write_checkpoint(os.path.join(root, "dspark"), tiny_shards(2, seed=7))
        _config(os.path.join(root, "dspark"), "minimax_m3_dspark")
    uri = upload(s3, root, "ckpt")
    copy = config_only_copy(root, str(tmp_path / "model_streamer" / "5e8f0c1d"))
    if draft:
        config_only_copy(os.path.join(root, "dspark"), os.path.join(copy, "dspark"))
    else:
        os.makedirs(os.path.join(copy, "dspark"))
        _config(os.path.join(copy, "dspark"), "minimax_m3_dspark")
    return uri, copy, written


def dspark_configs(uri: str, copy: str):
    """The target's and the draft's ModelConfig and the VllmConfig, as vLLM 0.34 leaves them."""
    target = model_config(model=copy, model_weights=uri)
    draft = model_config(model=os.path.join(copy, "dspark"), runner_type="draft")
    return target, draft, vllm_config("dspark", target)


# -- the derived candidate ----------------------------------------------------------------------


def test_draft_in_a_subfolder_of_the_targets_copy_is_found_on_s3(tmp_path, s3):
    uri, copy, draft_ckpt = minimax_on_s3(tmp_path, s3)
    target, draft, vcfg = dspark_configs(uri, copy)
    local = os.path.join(copy, "dspark")

    cands = candidates(draft, load_settings(), vcfg)
    assert cands == [Candidate("model", local), Candidate(LABEL, f"{uri}/dspark")]

    resolution = resolve(cands, load_settings())
    assert resolution.candidate == Candidate(LABEL, f"{uri}/dspark")
    assert [r.candidate for r in resolution.rejected] == [Candidate("model", local)]
    assert f"holds {INDEX_NAME} but none of the 2 shard(s) it names" in resolution.rejected[0].reason
    assert resolution.trail().endswith(f"chose {LABEL}={uri + '/dspark'!r}")
    # The chosen checkpoint is the draft's: its names, not the target's next to it.
    assert set(resolution.checkpoint.tensors()) == set(draft_ckpt.reference) == set(reference_tensors(draft_ckpt.path))
    assert resolution.checkpoint.uri.rstrip("/") == f"{uri}/dspark"


def test_a_dspark_draft_loads_through_modelexpress_chain_from_the_s3_subfolder(tmp_path, s3, robust, monkeypatch,
                                                                              caplog):
    """ModelExpress's real chain, robust installed, MX_MODEL_URI the target's URI (as ModelExpress sets it):
    the draft gets exactly the tensors safetensors reads from ``ckpt/dspark``, not the target's."""
    uri, copy, draft_ckpt = minimax_on_s3(tmp_path, s3)
    monkeypatch.setenv("MX_MODEL_URI", uri)
    _, draft, vcfg = dspark_configs(uri, copy)
    caplog.set_level("INFO")

    model, adapter = run_chain(draft, draft_ckpt.reference, vcfg=vcfg, draft=True)

    assert_loaded(model, draft_ckpt)  # every tensor once, equal to safetensors' own load of dspark/
    target_values = reference_tensors(str(tmp_path / "ckpt"))
    assert not any(same_bytes(model.weights[n], target_values[n]) for n in draft_ckpt.reference if n in target_values)
    assert adapter.reinit_calls == 0
    trail = " ".join(r.getMessage() for r in caplog.records if "draft source:" in r.getMessage())
    assert f"passed over model={os.path.join(copy, 'dspark')!r}" in trail
    assert f"chose {LABEL}={uri + '/dspark'!r}" in trail


def test_the_derived_candidate_follows_the_drafts_own_values(tmp_path, monkeypatch):
    monkeypatch.setenv("MX_MODEL_URI", "s3://bucket/ckpt")
    copy = str(tmp_path / "copy")
    target = model_config(model=copy, model_weights="s3://bucket/ckpt/")
    draft = model_config(model=os.path.join(copy, "dspark"), model_weights="gs://other/weights", runner_type="draft")
    assert candidates(draft, load_settings(), vllm_config("dspark", target)) == [
        Candidate("model_weights", "gs://other/weights"),
        Candidate("model", os.path.join(copy, "dspark")),
        Candidate(LABEL, "s3://bucket/ckpt/dspark"),
        Candidate("MX_MODEL_URI", "s3://bucket/ckpt"),
    ]
    monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", "model,MX_MODEL_URI,model_weights")
    assert [c.label for c in candidates(draft, load_settings(), vllm_config("dspark", target))] == [
        "model", "MX_MODEL_URI", "model_weights", LABEL,
    ]  # fmt: skip
    monkeypatch.delenv("MX_ROBUST_SOURCE_ORDER")
    # A deeper sub-folder keeps its path; a draft already pointing at it gets no second candidate.
    nested = model_config(model=os.path.join(copy, "drafts", "dspark"), runner_type="draft")
    assert _target_subfolder(nested, vllm_config("dspark", target)) == Candidate(
        "target model_weights + drafts/dspark", "s3://bucket/ckpt/drafts/dspark"
    )
    own = model_config(model=os.path.join(copy, "dspark"), model_weights="s3://bucket/ckpt/dspark/",
                       runner_type="draft")
    assert [c.label for c in candidates(own, load_settings(), vllm_config("dspark", target))] == [
        "model_weights", "model", "MX_MODEL_URI",
    ]  # fmt: skip


# -- no derived candidate -----------------------------------------------------------------------


def test_no_derived_candidate_where_the_draft_is_not_below_the_target(tmp_path):
    copy = str(tmp_path / "copy")
    target = model_config(model=copy, model_weights="s3://bucket/ckpt")
    vcfg = vllm_config("dspark", target)

    def derived(mc, config=vcfg):
        return [c for c in candidates(mc, load_settings(), config) if c.label.startswith("target ")]

    assert derived(target) == []  # the target's own load (runner_type generate)
    assert derived(model_config(model=copy, runner_type="draft")) == []  # the target's folder itself, no sub-path
    assert derived(model_config(model=str(tmp_path / "elsewhere" / "dspark"), runner_type="draft")) == []
    assert derived(model_config(model=f"{copy}-old/dspark", runner_type="draft")) == []  # a sibling, not below
    assert derived(model_config(model="s3://bucket/eagle", runner_type="draft")) == []
    # ".." leaves the target's folder: local paths are resolved first, object-store ones are refused as written.
    assert derived(model_config(model=os.path.join(copy, "dspark", "..", "..", "other"), runner_type="draft")) == []
    s3_target = vllm_config("dspark", model_config(model="s3://bucket/copy", model_weights="s3://bucket/ckpt"))
    assert derived(model_config(model_weights="s3://bucket/copy/../secret", runner_type="draft"), s3_target) == []
    assert derived(model_config(model_weights="s3://bucket/copy/./dspark", runner_type="draft"), s3_target) == []
    # No target model_weights (a local target), no speculative config, no vllm_config (SGLang): nothing derived.
    draft = model_config(model=os.path.join(copy, "dspark"), runner_type="draft")
    assert derived(draft, vllm_config("dspark", model_config(model=copy))) == []
    assert derived(draft, vllm_config(None)) == []
    assert derived(draft, None) == []
    # Local paths are compared resolved: "<copy>/../copy/dspark" is <copy>/dspark.
    roundabout = model_config(model=os.path.join(copy, "..", "copy", "dspark"), runner_type="draft")
    assert derived(roundabout) == [Candidate(LABEL, "s3://bucket/ckpt/dspark")]


# -- an empty sub-folder ------------------------------------------------------------------------


def test_an_empty_dspark_prefix_is_passed_over_with_its_reason(tmp_path, s3):
    uri, copy, _ = minimax_on_s3(tmp_path, s3, draft=False)
    _, draft, vcfg = dspark_configs(uri, copy)
    derived = f"{uri}/dspark"

    with pytest.raises(NoStreamableSource) as caught:
        resolve(candidates(draft, load_settings(), vcfg), load_settings())
    assert f"{LABEL}={derived!r}: no *.safetensors file (holds nothing)" in str(caught.value)
    assert [r.candidate.uri for r in caught.value.rejected] == [os.path.join(copy, "dspark"), derived]

    attempt = direct_load(draft, tiny_shards(1)[0], vcfg=vcfg, draft=True)
    assert attempt.error is not None and attempt.error.mutated is False
    assert f"{LABEL}={derived!r}: no *.safetensors file (holds nothing)" in str(attempt.error)
    assert untouched(attempt.model)


# -- doctor ---------------------------------------------------------------------------------------


def test_doctor_shows_the_derived_candidate(tmp_path, s3, capsys, monkeypatch):
    uri, copy, draft_ckpt = minimax_on_s3(tmp_path, s3)
    local = os.path.join(copy, "dspark")

    report = diagnose(model=local, target_model=copy, target_model_weights=uri).as_dict()
    chain = report["chain"]
    assert chain["candidates"] == [{"label": "model", "uri": local}, {"label": LABEL, "uri": f"{uri}/dspark"}]
    assert chain["chosen"] == {"label": LABEL, "uri": f"{uri}/dspark"}
    assert [r["uri"] for r in chain["rejected"]] == [local]
    assert chain["inputs"]["target_model_weights"] == uri and chain["inputs"]["target_model"] == copy
    assert report["source"]["uri"] == f"{uri}/dspark" and report["summary"]["tensors"] == len(draft_ckpt.reference)
    # Without the target's values the chain is the draft's own, as before.
    assert [c["label"] for c in diagnose(model=local).as_dict()["chain"]["candidates"]] == ["model"]

    monkeypatch.setenv("COLUMNS", "400")
    code = cli.main(["doctor", "--model", local, "--target-model", copy, "--target-model-weights", uri])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line for line in out.splitlines() if "│" in line]
    labels = [line.split("│")[1].strip() for line in rows]
    assert labels[:4] == ["model_weights", "model", LABEL, "MX_MODEL_URI"]
    assert f"{uri}/dspark" in rows[2] and "chosen" in rows[2]
    assert "passed over" in rows[1]
