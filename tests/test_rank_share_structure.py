"""What a rank holds, read from its module's structure (mx_strategies.select.rank_share), and the selection narrowed by it.

The modules here are plain torch modules shaped as vLLM's: placeholders
whose class is named ``PPMissingLayer`` (vLLM's and SGLang's name), MoE
layers with an ``expert_map`` tensor (vLLM's FusedMoE). vLLM's real classes
at PP=2 and TP=2+EP are in tests/test_rank_shares.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers.checkpoints import write_checkpoint

from mx_strategies.plan.planning import plan_of
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.select.module_reads import ModuleReads
from mx_strategies.select.rank_share import _OTHER_EXPERT_RANK, _OTHER_STAGE, RankShare, share_of
from mx_strategies.select.selection import NOT_HELD, select_tensors
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, probe
from helpers.engine import TARGET

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM resolves its platform at the first config (no GPU here)


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
    assert share.why_not_held("model.layers.1.self_attn.q_proj.weight") == _OTHER_STAGE
    assert share.why_not_held("model.layers.10.norm.weight") is None  # the prefix ends at the dot: not layer 1
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight") == _OTHER_EXPERT_RANK
    assert share.why_not_held("model.layers.2.mlp.experts.3.gate_proj.weight") is None
    # As vLLM's ep_weight_filter: only the heavy weights are skipped; scales stay.
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight_scale_inv") is None
    assert share.why_not_held("model.layers.2.mlp.experts.0.gate_proj.weight_packed") == _OTHER_EXPERT_RANK
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

    def planned(**module):
        selection = select_tensors(checkpoint, BuiltModule(TARGET, **module), settings, source_is_target=True)
        return selection, plan_of(checkpoint, selection.names, settings)

    _, full = planned()
    share = RankShare(("model.layers.0.",), {"model.layers.2.mlp.experts.": frozenset({2, 3})})

    selection, narrowed = planned(share=share)
    assert set(narrowed.expected) == {"model.embed_tokens.weight", "model.layers.2.norm.weight",
                                      "model.layers.2.mlp.experts.2.down_proj.weight", "lm_head.weight"}  # fmt: skip
    assert selection.of_kind(NOT_HELD) == {"model.layers.0.norm.weight", "model.layers.2.mlp.experts.0.down_proj.weight"}
    assert selection.left_bytes.get(NOT_HELD, 0) == 2 * 4 + 2 * 2 * 4
    assert selection.left_out["model.layers.0.norm.weight"].why == _OTHER_STAGE
    assert narrowed.bytes == full.bytes - selection.left_bytes.get(NOT_HELD, 0)

    # The module's own answer already is the rank's share: the structure is not asked again.
    everything = frozenset(names)
    answered, answered_plan = planned(share=share, question=lambda c: ModuleReads(everything, "dry_run"))
    assert answered.source == "dry_run" and not answered.of_kind(NOT_HELD) and answered_plan.expected == full.expected
    assert planned(share=None)[1] == full and planned(share=RankShare())[1] == full


@pytest.mark.parametrize("prefix", ["model.layers.2.mlp.experts.", "layers.2.mlp.experts."])
def test_expert_ids_are_read_at_the_moe_path_only(prefix):
    share = RankShare((), {prefix: frozenset({1})})
    assert share.why_not_held(prefix + "0.w1.weight") == _OTHER_EXPERT_RANK
    assert share.why_not_held(prefix + "1.w1.weight") is None
    assert share.why_not_held(prefix + "w13_weight") is None  # a fused 3-D tensor: no id, left to the loader


# -- under EPLB: what the installed vLLM's own rule loads (0.34: the initial placement) -------------------------


class EplbExperts(torch.nn.Module):
    """vLLM 0.34's RoutedExperts as rank_share reads it: ``expert_map`` over the physical slots (logical plus
    redundant), ``moe_config`` with the logical count, the EPLB flag and the expert-parallel rank."""

    def __init__(self, logical: int, redundant: int, ep_size: int, ep_rank: int):
        super().__init__()
        physical = logical + redundant
        per_rank = physical // ep_size  # vLLM's linear split of the physical slots (EPLB needs it even)
        mine = range(ep_rank * per_rank, (ep_rank + 1) * per_rank)
        self.expert_map = torch.tensor([slot - mine.start if slot in mine else -1 for slot in range(physical)])
        self.w13_weight = torch.nn.Parameter(torch.zeros(2, 2))
        parallel = type("P", (), dict(enable_eplb=True, ep_size=ep_size, ep_rank=ep_rank))()
        self.moe_config = type("C", (), dict(num_logical_experts=logical, moe_parallel_config=parallel))()


def _eplb_model(ep_rank: int) -> torch.nn.Module:
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].experts = EplbExperts(logical=4, redundant=2, ep_size=2, ep_rank=ep_rank)
    return model


def _vllms_eplb_rule():
    """vLLM's own ``compute_eplb_local_expert_ids`` (0.34), or None where the installed vLLM has none."""
    import importlib

    try:
        return importlib.import_module("vllm.model_executor.model_loader.ep_weight_filter").compute_eplb_local_expert_ids
    except Exception:  # noqa: BLE001 - no vLLM, or one without the rule
        return None


def _load_config(tmp_path):
    """The VllmConfig a load runs under (vLLM's loader asks it whether expert parallel is elastic)."""
    from mtp_arch import builders

    folder = str(tmp_path / "config")
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        target, _, _ = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        return builders.engine_config(target, None)


@pytest.mark.parametrize("ep_rank", [0, 1])
def test_under_eplb_a_rank_reads_what_vllms_own_rule_loads(ep_rank, tmp_path):
    """4 experts, 2 redundant slots, 2 ranks: rank 0's slots hold experts 0, 1, 2; rank 1's hold 3, 0, 1 (EPLB's
    initial placement). Where the installed vLLM filters under EPLB (0.34, ``compute_eplb_local_expert_ids``) a
    rank leaves out exactly the experts vLLM's rule leaves out; elsewhere (0.32, 0.33) it reads every expert."""
    rule = _vllms_eplb_rule()
    if rule is None:
        assert share_of(_eplb_model(ep_rank)).local_experts == {}
        return
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(_load_config(tmp_path)):
        share = share_of(_eplb_model(ep_rank))
    assert share_of(_eplb_model(ep_rank)).local_experts == {}  # no load config: elastic or not is unknown, all read
    compute_eplb_local_expert_ids = rule

    expected = compute_eplb_local_expert_ids(4, 2, 2, ep_rank)
    assert expected == ({0, 1, 2} if ep_rank == 0 else {0, 1, 3})
    assert dict(share.local_experts) == {"layers.0.experts.": expected}
    absent = ({0, 1, 2, 3} - expected).pop()
    assert share.why_not_held(f"layers.0.experts.{absent}.down_proj.weight") == _OTHER_EXPERT_RANK
    assert share.why_not_held(f"layers.0.experts.{absent}.down_proj.weight_scale") is None  # scales stay, as vLLM's
    assert all(share.why_not_held(f"layers.0.experts.{e}.down_proj.weight") is None for e in expected)


def test_under_eplb_slots_that_disagree_with_vllms_placement_read_every_expert():
    """A layer whose slots are not EPLB's initial placement (here rank 1 holding the first slots): nothing is left
    out, on any vLLM."""
    model = _eplb_model(1)
    model.layers[0].experts.expert_map = torch.tensor([0, 1, 2, -1, -1, -1])
    assert share_of(model).local_experts == {}
