"""Draft selection by the naming conventions (:func:`mx_strategies.select.mtp_table.convention_tensors`) on its own: names in, the MTP head's names out.

No files, no streamer: the tensor names of real exporters' layouts, the
configs that say how many layers the target and the MTP head have, and the
settings that pick conventions and shared weights.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import pytest

from mx_strategies.engine.config import LayerLayout
from mx_strategies.select.mtp_table import _convention_rows, convention_tensors as select_draft_tensors
from mx_strategies.select.mtp_table import conventions_layout as layer_layout
from mx_strategies.errors import DraftPlanError
from mx_strategies.settings import _DraftConvention, load_settings

TARGET = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]
QWEN_HEAD = ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"]
DEEPSEEK_HEAD = ["model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight", "model.layers.2.shared_head.norm.weight"]
TWO_LAYERS_ONE_HEAD = LayerLayout(first=2, count=1)


def select(names, *, layout=TWO_LAYERS_ONE_HEAD, share_with_target=True):
    return select_draft_tensors(set(names), load_settings(), layout, share_with_target=share_with_target)


# -- layer counts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, layout",
    [
        ({"num_hidden_layers": 61, "num_nextn_predict_layers": 1}, LayerLayout(61, 1)),  # DeepSeek-V3, GLM
        ({"num_hidden_layers": 48, "mtp_num_hidden_layers": 1}, LayerLayout(48, 1)),  # Qwen3-Next
        ({"text_config": {"num_hidden_layers": 40, "num_nextn_predict_layers": 2}}, LayerLayout(40, 2)),
        ({"num_hidden_layers": 4, "num_nextn_predict_layers": 0, "n_predict": 3}, LayerLayout(4, 3)),
        ({"num_hidden_layers": "4"}, LayerLayout(None, None)),  # not an integer: unknown
        (None, LayerLayout(None, None)),
    ],
)
def test_layer_layout_from_a_config(config, layout):
    assert layer_layout(config) == layout


def test_layer_layout_takes_each_value_from_the_first_config_that_knows_it():
    checkpoint_config = {"num_hidden_layers": 4}
    hf_config = SimpleNamespace(num_hidden_layers=99, text_config=SimpleNamespace(num_nextn_predict_layers=2))
    assert layer_layout(checkpoint_config, hf_config) == LayerLayout(4, 2)
    assert layer_layout(None, hf_config) == LayerLayout(99, 2)


# -- conventions -----------------------------------------------------------------------------


def test_every_convention_setting_has_its_prefixes():
    """A convention the settings accept but the table lacks would be a KeyError at load time."""
    settings = load_settings(MX_ROBUST_DRAFT_CONVENTIONS=",".join(get_args(_DraftConvention)))
    assert set(_convention_rows(settings)) == set(get_args(_DraftConvention))


def test_qwen_mtp_head():
    selection = select(TARGET + QWEN_HEAD)
    assert selection.names == set(QWEN_HEAD)
    assert selection.convention == "mtp" and selection.shared == set()


def test_deepseek_nextn_layers_after_the_target_layers():
    selection = select(TARGET + DEEPSEEK_HEAD)
    assert selection.names == set(DEEPSEEK_HEAD)
    assert selection.convention == "nextn_layers"


@pytest.mark.parametrize("prefix", ["model.layers.", "layers.", "model.language_model.layers."])
def test_nextn_layers_under_every_layer_prefix(prefix):
    names = [f"{prefix}0.w", f"{prefix}1.w", f"{prefix}2.w", f"{prefix}3.w", f"{prefix}20.w"]
    selection = select(names, layout=LayerLayout(2, 2))
    assert selection.names == {f"{prefix}2.w", f"{prefix}3.w"}  # layers 2 and 3, not 20


def test_nextn_layers_need_both_counts_and_say_so():
    with pytest.raises(DraftPlanError) as caught:
        select(TARGET + DEEPSEEK_HEAD, layout=LayerLayout(None, None))
    message = str(caught.value)
    assert message.startswith(f"no draft tensor found among {len(TARGET) + len(DEEPSEEK_HEAD)} tensors")
    assert "nextn_layers (needs num_hidden_layers and num_nextn_predict_layers, not found in the config)" in message
    assert "mtp (mtp.*)" in message and "mtp_layers (model.mtp.layers.*)" in message


def test_mtp_layers_and_extra_prefixes(monkeypatch):
    assert select(TARGET + ["model.mtp.layers.0.fc.weight"]).convention == "mtp_layers"
    monkeypatch.setenv("MX_ROBUST_DRAFT_EXTRA_PREFIXES", "language_model.mtp_head.")
    selection = select(TARGET + ["language_model.mtp_head.fc.weight"])
    assert selection.names == {"language_model.mtp_head.fc.weight"}
    assert selection.convention == "extra_prefixes"


def test_several_conventions_matching_are_all_named():
    selection = select(TARGET + QWEN_HEAD + DEEPSEEK_HEAD)
    assert selection.names == set(QWEN_HEAD) | set(DEEPSEEK_HEAD)
    assert selection.convention == "mtp+nextn_layers"


def test_only_the_configured_conventions_are_tried(monkeypatch):
    monkeypatch.setenv("MX_ROBUST_DRAFT_CONVENTIONS", "mtp")
    with pytest.raises(DraftPlanError, match=r"conventions tried: mtp \(mtp\.\*\)$"):
        select(TARGET + DEEPSEEK_HEAD)


# -- shared embed_tokens / lm_head ---------------------------------------------------------


@pytest.mark.parametrize(
    "policy, share_with_target, streams_shared",
    [("auto", True, False), ("auto", False, True), ("never", False, False), ("always", True, True)],
)
def test_shared_weights_policy(monkeypatch, policy, share_with_target, streams_shared):
    monkeypatch.setenv("MX_ROBUST_DRAFT_SHARED_WEIGHTS", policy)
    selection = select(TARGET + QWEN_HEAD, share_with_target=share_with_target)
    shared = {"model.embed_tokens.weight", "lm_head.weight"} if streams_shared else set()
    assert selection.shared == shared
    assert selection.names == set(QWEN_HEAD) | shared
