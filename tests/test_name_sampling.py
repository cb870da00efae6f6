"""mx_strategies.select.name_sampling on DeepSeek-V3's naming: the units a sampled dry run feeds, and the members an
unfed unit lacks (pure functions over names)."""

from __future__ import annotations

from mx_strategies.select.name_sampling import Sample


def expert_names(layers, experts, leave_out=()):
    names = [f"model.layers.{layer}.self_attn.q_a_proj.weight" for layer in layers]
    for layer in layers:
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                if name not in leave_out:
                    names.append(name)
    return names


def test_an_unfed_expert_that_lacks_a_stacked_member_is_named():
    missing = "model.layers.7.mlp.experts.5.up_proj.weight"
    sample = Sample(expert_names(range(3, 8), 8, leave_out={missing}))
    fed = sample.first_round()
    assert missing.replace(".up_proj.", ".gate_proj.") not in fed  # expert 5 of layer 7: no round fed it
    stacked = [n for n in fed if n.endswith(("gate_proj.weight", "up_proj.weight"))]  # what fills part of w13
    assert sample.missing_members(fed, stacked) == {missing: "model.layers.3.mlp.experts.0.up_proj.weight"}


def test_a_complete_checkpoint_lacks_nothing_and_only_templates_written_in_part_are_asked_about():
    sample = Sample(expert_names(range(3, 8), 8))
    fed = sample.first_round()
    assert sample.missing_members(fed, [n for n in fed if "_proj" in n]) == {}
    lacking = Sample(expert_names(range(3, 8), 8, leave_out={"model.layers.6.mlp.experts.2.down_proj.weight"}))
    # Only the templates the module wrote into part of a parameter are asked about (here: not down_proj).
    assert lacking.missing_members(lacking.first_round(), [n for n in fed if "gate_proj" in n or "up_proj" in n]) == {}
