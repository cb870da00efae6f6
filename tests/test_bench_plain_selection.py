"""The names-only selection benchmark (``python -m benchmarks --plain-selection``) adds up.

Plain ModelExpress's bytes come from its shards as each release chooses them
(``mx_strategies.testing.plain_modelexpress``, checked against each release's
code in tests/test_plain_modelexpress.py); robust's from its own planning.
"""

from __future__ import annotations

import pytest

from benchmarks.plain_selection import render_plain_selection, run_plain_selection
from benchmarks.rank_shares import checkpoint


@pytest.fixture(scope="module")
def result():
    return run_plain_selection()


def _row(result, name: str, role: str) -> dict:
    (ckpt,) = [c for c in result["checkpoints"] if c["checkpoint"].startswith(name)]
    (row,) = [r for r in ckpt["rows"] if r["role"] == role]
    return row


def test_plain_targets_stream_every_shard_and_robust_leaves_the_mtp_layer(result):
    for ckpt in result["checkpoints"]:
        target = _row(result, ckpt["checkpoint"], "target")
        assert target["plain_07_bytes"] == target["plain_08_bytes"] == ckpt["checkpoint_bytes"]
        assert target["plain_07_shards"] == target["plain_08_shards"] == target["shards"]
        assert target["robust_bytes"] < target["plain_08_bytes"]


def test_deepseek_v3_draft_08_streams_the_shards_of_its_layer_whole(result):
    draft = _row(result, "DeepSeek-V3", "draft")
    ckpt = checkpoint()
    mtp_shards = [s for s in ckpt.shards if any(n.startswith("model.layers.61.") for n in s.tensors)]
    assert draft["plain_08_shards"] == len(mtp_shards) < draft["shards"] == 163
    assert draft["plain_08_bytes"] == sum(s.size for s in mtp_shards)
    assert draft["plain_07_bytes"] == sum(s.size for s in ckpt.shards)  # no mtp. name: 0.7.0 streams everything
    layer = sum(t.nbytes for s in ckpt.shards for n, t in s.tensors.items() if n.startswith("model.layers.61."))
    assert draft["robust_bytes"] == layer < draft["plain_08_bytes"]


def test_qwen_style_draft_08_reads_the_embedding_and_head_shards_too(result):
    draft = _row(result, "demo: qwen3-next-tiny", "draft")
    assert draft["plain_07_shards"] < draft["plain_08_shards"]  # 0.8 also takes embed_tokens' and lm_head's shards
    assert draft["robust_bytes"] <= draft["plain_07_bytes"] < draft["plain_08_bytes"]
    assert "| demo: qwen3-next-tiny | draft (Qwen3NextMTP) |" in render_plain_selection(result)
