"""Inconsistent checkpoints are refused before the model is touched, locally and on S3.

Each case damages a real checkpoint the way exporters, interrupted uploads and
hand edits do (``helpers.checkpoints.INCONSISTENT``); the strategy must fail
with ``mutated=False``, name the file and the damage, and leave the model as
it was, directly and through ModelExpress's chain.
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers.checkpoints import INCONSISTENT, NEEDS_INDEX, Written, place, store_fixture, tiny_shards, write_checkpoint
from helpers.engine import direct_load, failed_chain, model_config, untouched


def _as_uri(fragment: str, ckpt: Written, uri: str) -> str:
    """A local path in an expected message, as it reads for the S3 copy."""
    return fragment.replace(ckpt.path, uri) if fragment.startswith(ckpt.path) else fragment


# An index mismatch needs an index; the file-level damage is checked with and without one.
INCONSISTENT_LAYOUTS = [(case, True) for case in sorted(INCONSISTENT)] + [
    (case, False) for case in sorted(INCONSISTENT) if case not in NEEDS_INDEX
]


@pytest.mark.parametrize("kind", ["local", "s3"])
@pytest.mark.parametrize(
    ("case", "index"),
    INCONSISTENT_LAYOUTS,
    ids=[f"{c}-{'index' if i else 'no_index'}" for c, i in INCONSISTENT_LAYOUTS],
)
def test_inconsistent_checkpoint_is_refused_unmutated(monkeypatch, request, tmp_path, kind, index, case):
    s3 = store_fixture(kind, request)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3), index=index)
    fragments = INCONSISTENT[case](ckpt)
    uri = place(kind, ckpt, s3)
    monkeypatch.setenv("MX_MODEL_URI", uri)

    attempt = direct_load(model_config(), ckpt.reference)

    assert attempt.error is not None, "an inconsistent checkpoint was loaded"
    assert attempt.error.mutated is False
    message = str(attempt.error)
    assert message.startswith(f"checkpoint {uri} is inconsistent, not loading it: ")
    for fragment in fragments:
        assert _as_uri(fragment, ckpt, uri) in message
    assert untouched(attempt.model)


def test_duplicate_tensor_across_shards_names_tensor_and_files(monkeypatch, tmp_path):
    shards = tiny_shards(3)
    shards[0]["model.layers.1.input_layernorm.weight"] = torch.ones(16)  # also in shard 2
    for index in (True, False):
        ckpt = write_checkpoint(str(tmp_path / f"ckpt-{index}"), shards, index=index)
        monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
        attempt = direct_load(model_config(), {**ckpt.reference})
        assert attempt.error is not None and attempt.error.mutated is False
        message = str(attempt.error)
        first, second = (os.path.basename(f) for f in ckpt.files[:2])
        assert f"tensor 'model.layers.1.input_layernorm.weight' is in both {first} and {second}" in message
        assert untouched(attempt.model)


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_inconsistent_checkpoint_through_the_chain_serves_nothing(monkeypatch, caplog, tmp_path, case):
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    fragments = INCONSISTENT[case](ckpt)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    attempt = failed_chain(model_config(), ckpt.reference)

    assert attempt.adapter.reinit_calls == 0
    assert untouched(attempt.model)
    failures = [r.getMessage() for r in caplog.records if "Strategy robust_model_streamer failed" in r.getMessage()]
    assert len(failures) == 1
    for fragment in fragments:
        assert fragment in failures[0]
