"""The names-only rank-share benchmark (``python -m benchmarks --rank-shares``) adds up.

DeepSeek-V3's real name set (about 92k tensors, 689 GB); each rank's share is
decided by robust's planning and ``rank_share`` from vLLM's own placement
rules (``get_pp_indices``, ``compute_local_expert_ids``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM's placement rules: scripts/test.sh installs vLLM")

from benchmarks.rank_shares import EXPERTS, checkpoint, deepseek_v3_names, run_rank_shares  # noqa: E402


@pytest.fixture(scope="module")
def result():
    return run_rank_shares()


def test_the_name_set_is_deepseek_v3s():
    names = deepseek_v3_names()
    ckpt = checkpoint()
    assert 91_000 < len(names) < 93_000
    assert 685e9 < ckpt.data_bytes < 690e9  # the released checkpoint: 689 GB
    assert len(ckpt.shards) == 163 and sum(len(s.tensors) for s in ckpt.shards) == len(names)
    assert sum(1 for n in names if n.startswith("model.layers.5.mlp.experts.") and n.endswith(".weight")) == 3 * EXPERTS


def test_pipeline_stages_add_up_to_the_target_once(result):
    layout = result["layouts"]["PP=2 (2 nodes x TP=8)"]
    stages = layout["per_rank"]["robust"]
    assert sum(stages) == result["target_bytes"] == layout["storage"]["robust"]
    assert all(0.4 < s / result["target_bytes"] < 0.6 for s in stages)
    assert layout["storage"]["runai"] == 2 * result["checkpoint_bytes"]


def test_expert_ranks_read_their_experts_and_the_node_reads_the_target_once(result):
    layout = result["layouts"]["EP=8 (1 node, TP=8)"]
    ranks = layout["per_rank"]["robust"]
    assert len(set(ranks)) == 1 and ranks[0] < 0.16 * result["target_bytes"]
    assert layout["storage"]["robust"] == result["target_bytes"]  # the union of the node's shares
    # vLLM's default loader keeps the other experts' scales and the MTP layer: robust reads less on every rank.
    assert all(r < d for r, d in zip(ranks, layout["per_rank"]["default"]))


def test_data_parallel_replicas_read_dense_weights_each_and_experts_once(result):
    layout = result["layouts"]["DP=8 x EP=8 (8 engines)"]
    served = layout["storage"]
    assert served["robust"] == sum(layout["per_rank"]["robust"])
    assert served["robust"] < served["default"] < served["robust before"] < served["runai"] == 8 * result["checkpoint_bytes"]
    assert 1.0 < served["robust"] / result["checkpoint_bytes"] < 1.3
