"""What a rank holds, read from its module's structure (mx_strategies.rank_share), and the plan narrowed by it.

The modules here are plain torch modules shaped as vLLM's: placeholders
whose class is named ``PPMissingLayer`` (vLLM's and SGLang's name), MoE
layers with an ``expert_map`` tensor (vLLM's FusedMoE). vLLM's real classes
at PP=2 and TP=2+EP are in tests/test_rank_shares.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.checkpoints import write_checkpoint

from mx_strategies.planning import narrow_to_rank, plan_for
from mx_strategies.rank_share import OTHER_EXPERT_RANK, OTHER_STAGE, RankShare, share_of
from mx_strategies.settings import load_settings
from mx_strategies.sources import Candidate, probe
from helpers.engine import TARGET


class PPMissingLayer(torch.nn.Identity):  # the engines' placeholder for another stage's layer, by its name
    pass


class Experts(torch.nn.Module):
    def __init__(self, expert_map, eplb=False):
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.zeros(2, 2))
        self.expert_map = None if expert_map is None else torch.tensor(expert_map)
        self.enable_eplb = eplb


class Layer(torch.nn.Module):
    def __init__(self, expert_map=None, eplb=False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(2)
        self.mlp = torch.nn.Module()
        self.mlp.experts = Experts(expert_map, eplb)


class Stage(torch.nn.Module):
    """Stage 1 of 2 with expert parallel rank 1 of 2: layers 0-1 are elsewhere; experts 2-3 are here."""

    def __init__(self, eplb=False):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(
            [PPMissingLayer(), PPMissingLayer()] + [Layer([-1, -1, 0, 1], eplb) for _ in range(2)]
        )
        self.lm_head = torch.nn.Linear(2, 2)


def test_the_structure_says_which_layers_and_experts_this_rank_holds():
    share = share_of(Stage())
    assert share.missing_layers == ("model.layers.0.", "model.layers.1.")
    assert dict(share.local_experts) == {"model.layers.2.mlp.experts.": {2, 3}, "model.layers.3.mlp.experts.": {2, 3}}
    assert share.why_not_held("model.layers.1.self_attn.q_proj.weight") == OTHER_STAGE
    assert share.why_not_held("model.layers.10.norm.weight") is None  # the prefix ends at the dot: not layer 1
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight") == OTHER_EXPERT_RANK
    assert share.why_not_held("model.layers.2.mlp.experts.3.gate_proj.weight") is None
    # As vLLM's ep_weight_filter: only the heavy weights are skipped; scales stay.
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight_scale_inv") is None
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight_packed") == OTHER_EXPERT_RANK
    assert share.why_not_held("model.layers.2.mlp.shared_experts.gate_proj.weight") is None
    assert share.why_not_held("lm_head.weight") is None


def test_under_eplb_every_expert_is_read():
    share = share_of(Stage(eplb=True))
    assert share.local_experts == {} and share.missing_layers == ("model.layers.0.", "model.layers.1.")


def test_a_whole_module_holds_everything():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Layer(expert_map=None))
    assert share_of(model).whole and share_of(object()).whole


def test_the_structure_narrows_a_table_plan_but_not_the_modules_own_answer(tmp_path):
    names = {
        "model.embed_tokens.weight": torch.zeros(4, 2),
        "model.layers.0.norm.weight": torch.zeros(2),
        "model.layers.2.norm.weight": torch.zeros(2),
        "model.layers.2.mlp.experts.0.down_proj.weight": torch.zeros(2, 2),
        "model.layers.2.mlp.experts.2.down_proj.weight": torch.zeros(2, 2),
        "lm_head.weight": torch.zeros(4, 2),
    }
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), [names])
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", ckpt.path), settings)
    full = plan_for(checkpoint, TARGET, settings, source_is_target=True)
    share = RankShare(("model.layers.0.",), {"model.layers.2.mlp.experts.": frozenset({2, 3})})

    narrowed = narrow_to_rank(full, share)
    assert set(narrowed.expected) == {"model.embed_tokens.weight", "model.layers.2.norm.weight",
                                      "model.layers.2.mlp.experts.2.down_proj.weight", "lm_head.weight"}  # fmt: skip
    assert narrowed.not_held == {"model.layers.0.norm.weight", "model.layers.2.mlp.experts.0.down_proj.weight"}
    assert narrowed.not_held_bytes == 2 * 4 + 2 * 2 * 4
    assert narrowed.left_out["model.layers.0.norm.weight"] == OTHER_STAGE
    assert narrowed.bytes == full.bytes - narrowed.not_held_bytes

    # The module's own answer already is the rank's share: the structure is not asked again.
    from dataclasses import replace

    answered = replace(full, selection_source="dry_run")
    assert narrow_to_rank(answered, share) is answered
    assert narrow_to_rank(full, None) is full and narrow_to_rank(full, RankShare()) is full


@pytest.mark.parametrize("prefix", ["model.layers.2.mlp.experts.", "layers.2.mlp.experts."])
def test_expert_ids_are_read_at_the_moe_path_only(prefix):
    share = RankShare((), {prefix: frozenset({1})})
    assert share.why_not_held(prefix + "0.w1.weight") == OTHER_EXPERT_RANK
    assert share.why_not_held(prefix + "1.w1.weight") is None
    assert share.why_not_held(prefix + "w13_weight") is None  # a fused 3-D tensor: no id, left to the loader
