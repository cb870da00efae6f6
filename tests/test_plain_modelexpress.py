"""The written-down selection of plain ModelExpress (``mx_strategies.testing.plain_modelexpress``) is its own.

The demo and the benchmark set robust's bytes beside what plain ModelExpress
streams; that column is only true while the written rule equals the
installed release's code. Checked against the real functions on real
safetensors checkpoints (index, empty shards and all): ModelExpress 0.7.0's
``_select_draft_weight_files`` in the main venv; 0.8's
``_legacy_draft_weight_rule`` and ``_select_remote_weight_files`` in the 0.8
venv (``scripts/test.sh``). 0.8's rule asks the draft's class and its vLLM
module: the model here is an object of a class with vLLM's name, module and
config (no vLLM is installed beside 0.8 here); the layer rule that module
lends it is vLLM 0.32's own, checked against vLLM's function where vLLM is
installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from mx_strategies.releases import chain_finalizes
from mx_strategies.testing import synthetic
from mx_strategies.testing.plain_modelexpress import LAYER_CLASSES, QWEN_CLASSES, _spec_layer, plain_selection

ON_08 = chain_finalizes()
STYLES = {"deepseek": "DeepSeekMTP", "qwen": "Qwen3NextMTP"}


def _checkpoint(tmp_path, style):
    made = synthetic.mtp_checkpoint(str(tmp_path / style), style=style, empty_shards=(1,), hidden=16, vocab=32,
                                    num_hidden_layers=6, layers_per_shard=2, dtype=torch.float32)  # fmt: skip
    with open(os.path.join(made.path, "model.safetensors.index.json")) as handle:
        weight_map = json.load(handle)["weight_map"]
    shards = {name: {} for name in made.shard_names}
    for tensor, shard in weight_map.items():
        shards[shard][tensor] = made.tensors[tensor].numel() * made.tensors[tensor].element_size()
    with open(os.path.join(made.path, "config.json")) as handle:
        config = json.load(handle)
    return made, shards, config


@pytest.mark.skipif(ON_08, reason="ModelExpress 0.7.0's function; the main venv runs this")
@pytest.mark.parametrize("style", sorted(STYLES))
def test_the_07_rule_is_modelexpress_07s(tmp_path, style):
    from modelexpress.engines.vllm.adapter import _select_draft_weight_files

    made, shards, config = _checkpoint(tmp_path, style)
    files = [os.path.join(made.path, name) for name in made.shard_names]
    _, subset = _select_draft_weight_files(made.path, files)
    real = [os.path.basename(f) for f in subset] or list(made.shard_names)  # anything but SELECTED: every shard

    written = plain_selection("0.7.0", shards, draft_class=STYLES[style], config=config)

    assert list(written.shards) == real
    if style == "deepseek":  # no mtp. name: 0.7.0 streams the whole checkpoint for the draft
        assert real == list(made.shard_names)
    else:
        assert len(real) < len(made.shard_names)


def _vllm_class(class_name: str, module: str, config: dict):
    """An object of a class named and placed as vLLM's, with its config, as 0.8's rule reads a draft model."""
    name = f"vllm.model_executor.models.{module}"
    stand_in = types.ModuleType(name)
    stand_in.get_spec_layer_idx_from_weight_name = lambda cfg, weight: 0 if _spec_layer(weight, vars(cfg)) else None
    cls = type(class_name, (), {"__module__": name})
    model = cls()
    model.config = SimpleNamespace(**config)
    return model, stand_in


MODULES = {"DeepSeekMTP": "deepseek_mtp", "Glm4MoeMTP": "glm4_moe_mtp", "Glm4MoeLiteMTP": "glm4_moe_lite_mtp",
           "Qwen3NextMTP": "qwen3_next_mtp", "Qwen3_5MTP": "qwen3_5_mtp", "Qwen3_5MoeMTP": "qwen3_5_mtp"}  # fmt: skip


@pytest.mark.skipif(not ON_08, reason="ModelExpress 0.8's functions; the 0.8 venv runs this")
@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("draft_class", sorted(MODULES))
def test_the_08_rule_is_modelexpress_08s(tmp_path, monkeypatch, style, draft_class):
    from modelexpress.engines.vllm.adapter import _legacy_draft_weight_rule, _select_remote_weight_files

    made, shards, config = _checkpoint(tmp_path, style)
    model, module = _vllm_class(draft_class, MODULES[draft_class], config)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    unused = _legacy_draft_weight_rule(model)
    files = [os.path.join(made.path, name) for name in made.shard_names]
    if unused is None:  # the rule declines (a layer class on a config without num_nextn_predict_layers)
        assert draft_class in LAYER_CLASSES and "num_nextn_predict_layers" not in config
        real = list(made.shard_names)  # every shard (adapter.py: no rule)
    else:
        real = [os.path.basename(f) for f in _select_remote_weight_files(made.path, files, unused)]

    written = plain_selection("0.8", shards, draft_class=draft_class, config=config)

    assert list(written.shards) == real
    assert made.shard_names[1] in real  # the empty shard: the index never names it, and 0.8 keeps it


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM's own function; the main venv has vLLM")
def test_the_layer_rule_is_vllms():
    from vllm.model_executor.models.utils import get_spec_layer_idx_from_weight_name

    config = {"num_hidden_layers": 61, "num_nextn_predict_layers": 2}
    names = [f"{p}layers.{i}.mlp.gate.weight" for p in ("model.", "", "model.language_model.", "mtp.") for i in (60, 61, 62, 63)]
    names += ["model.layers.610.x", "model.embed_tokens.weight", "lm_head.weight"]
    for name in names:
        assert _spec_layer(name, config) is (get_spec_layer_idx_from_weight_name(SimpleNamespace(**config), name) is not None), name


def test_a_target_streams_every_shard_and_classes_are_known():
    shards = {"a.safetensors": {"model.layers.0.x": 4}, "b.safetensors": {"mtp.0.x": 2}, "c.safetensors": {}}
    for release in ("0.7.0", "0.8"):
        target = plain_selection(release, shards)
        assert target.shards == ("a.safetensors", "b.safetensors", "c.safetensors") and target.bytes == 6
    assert set(MODULES) == set(LAYER_CLASSES) | set(QWEN_CLASSES)
    unknown = plain_selection("0.8", shards, draft_class="EagleLlamaForCausalLM", config={})
    assert unknown.shards == tuple(shards)  # no rule for the class: every shard
    with pytest.raises(ValueError, match="release '0.9'"):
        plain_selection("0.9", shards)
