"""SGLang's MTP drafts on names: what robust plans for each SGLang draft class where no module is asked.

These need no SGLang: the plan is decided from the checkpoint's names and
the engine view SGLang's reader makes (:mod:`mx_strategies.engine.sglang`).
The real classes load through ModelExpress's chain in tests/sglang_suite (SGLang
venv), where their modules answer (compared with SGLang's own loader in
test_sglang_module_reads.py). One SGLang row remains, an engine rule: MiMo-V2's
one MTP layer per draft runner (docs/mtp-architectures.md); DeepSeek's, GLM's
and Qwen3-Next's classes build there, so without a module they fall back to
the generic conventions.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers.checkpoints import write_shard
from modelexpress import p2p_pb2

from mx_strategies.select import mtp_table
from mx_strategies.inspect.index import inspect
from mx_strategies.engine import SGLANG, EngineView, engine_view
from mx_strategies.errors import DraftPlanError
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.engine.sglang import SGLANG_MTP_METHODS, _is_mtp_draft
from mx_strategies.plan.planning import plan_of
from mx_strategies.select.selection import LEFT_TO_DRAFT, select_tensors
from mx_strategies.settings import load_settings
from mx_strategies.inspect.storage import LocalStore


def write_names(folder: str, names: list[str], config: dict, *, shards: int = 2, unindexed: dict | None = None) -> str:
    """A real safetensors checkpoint holding ``names`` (2-element bf16 tensors), indexed, with config.json."""
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    for number in range(shards):
        part = names[number::shards]
        file = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        write_shard(os.path.join(folder, file), {n: torch.full((2,), float(i), dtype=torch.bfloat16) for i, n in enumerate(part)})
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    for file, extra in (unindexed or {}).items():
        write_shard(os.path.join(folder, file), {n: torch.zeros(2, dtype=torch.bfloat16) for n in extra})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def draft(architecture: str, **fields) -> EngineView:
    """An SGLang NEXTN/MTP draft as mx_strategies.engine.sglang reads it (method EAGLE, the draft's own architecture)."""
    return replace(
        EngineView(True, "eagle", (), 1, 1, fields.pop("hf_config", None), {}),
        architectures=(architecture,), engine=SGLANG, mtp=True, **fields,
    )


def plan(folder: str, engine: EngineView):
    """(selection, plan) of ``engine``'s load from ``folder``, the target's checkpoint."""
    checkpoint, settings = inspect(LocalStore(folder), 2), load_settings()
    selection = select_tensors(checkpoint, BuiltModule(engine), settings, source_is_target=True)
    return selection, plan_of(checkpoint, selection.names, settings)


def layer(prefix: str, *parts: str) -> list[str]:
    return [f"{prefix}{p}" for p in parts]


DEEPSEEK_LAYER = ("self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "mlp.experts.0.up_proj.weight",
                  "input_layernorm.weight")
NEXTN_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def test_deepseek_nextn_without_its_module_takes_layer_n_by_the_nextn_convention(tmp_path):
    """No row: its module answers (it skips the layer's embed_tokens and shared_head.head,
    deepseek_weight_loader.py:319). Without one, the nextn convention takes model.layers.{N}.* whole: the two
    copies too, which SGLang's load_weights skips (bytes for nothing, no wrong weight)."""
    own = layer("model.layers.2.", *DEEPSEEK_LAYER, *NEXTN_OWN)
    skipped = ["model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"]
    target = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
              *layer("model.layers.0.", *DEEPSEEK_LAYER), *layer("model.layers.1.", *DEEPSEEK_LAYER)]
    folder = write_names(str(tmp_path / "ds"), own + skipped + target,
                         {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                          "num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    chosen, got = plan(folder, draft("DeepseekV3ForCausalLMNextN"))
    assert chosen.architecture is None and chosen.convention == "nextn_layers" and chosen.source == "convention"
    assert set(got.expected) == set(own) | set(skipped)


def test_deepseek_target_in_sglang_without_its_module_streams_the_whole_checkpoint(tmp_path):
    """No row: its module answers (it drops layers >= num_hidden_layers, deepseek_weight_loader.py:301), and
    without one the target streams layer N too."""
    own = layer("model.layers.2.", *DEEPSEEK_LAYER, *NEXTN_OWN, "embed_tokens.weight", "shared_head.head.weight")
    target = ["model.embed_tokens.weight", "lm_head.weight", *layer("model.layers.1.", *DEEPSEEK_LAYER)]
    folder = write_names(str(tmp_path / "ds"), own + target,
                         {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                          "num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    engine = replace(EngineView(False, None, (), 1, 1, None, {}), engine=SGLANG)
    chosen, got = plan(folder, engine)
    assert chosen.architecture is None and not chosen.of_kind(LEFT_TO_DRAFT)
    assert set(got.expected) == set(target) | set(own)


MIMO_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight", "self_attn.q_proj.weight")


def _mimo(tmp_path) -> str:
    names = [f"model.mtp.layers.{k}.{p}" for k in range(3) for p in MIMO_OWN]
    names += ["model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"]
    return write_names(str(tmp_path / "mimo"), names,
                       {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
                        "num_hidden_layers": 1, "num_nextn_predict_layers": 3})


@pytest.mark.parametrize("index", [0, 1, 2])
def test_mimo_v2_runner_streams_the_one_mtp_layer_it_serves(tmp_path, index):
    """SGLang's iterator keeps draft_model_idx's layer only (loader.py:739): the class maps every layer onto one
    set of parameters, so feeding them all would leave the last one's weights in every runner."""
    # The draft's own hf_config says 1 MTP layer (_config_draft_model sets it); the checkpoint's counts.
    engine = draft("MiMoV2MTP", draft_layer=index, hf_config={"num_nextn_predict_layers": 1})
    chosen, got = plan(_mimo(tmp_path), engine)
    assert chosen.architecture == "sglang_mimo_v2_mtp"
    assert set(got.expected) == {f"model.mtp.layers.{index}.{p}" for p in MIMO_OWN}


def test_mimo_v2_runner_past_the_checkpoints_mtp_layers_is_refused_by_name(tmp_path):
    with pytest.raises(DraftPlanError) as info:
        plan(_mimo(tmp_path), draft("MiMoV2MTP", draft_layer=3))
    assert "MTP layer 3 (SGLang's draft_model_idx)" in str(info.value)
    assert info.value.mutated is False


def test_glm_draft_whose_layer_is_in_an_unindexed_mtp_safetensors_is_refused_naming_the_file(tmp_path):
    """SGLang reads GLM's unindexed mtp.safetensors itself (weight_utils.py:811). Without a module, the nextn
    convention finds no draft tensor among the indexed shards: refused, before the model is touched."""
    target = ["model.embed_tokens.weight", "lm_head.weight", *layer("model.layers.0.", *DEEPSEEK_LAYER)]
    folder = write_names(str(tmp_path / "glm"), target,
                         {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                          "num_hidden_layers": 1, "num_nextn_predict_layers": 1},
                         unindexed={"mtp.safetensors": layer("model.layers.1.", *DEEPSEEK_LAYER, *NEXTN_OWN)})
    with pytest.raises(DraftPlanError) as info:
        plan(folder, draft("Glm4MoeForCausalLMNextN"))
    assert "no draft tensor found" in str(info.value) and info.value.mutated is False


def test_sglang_rows_are_matched_for_sglang_only():
    """vLLM's names for the same drafts are other classes: each engine gets its own rows."""
    assert mtp_table.match(("MiMoV2MTP",), "mimo_v2_flash", "eagle", engine=SGLANG).key == "sglang_mimo_v2_mtp"
    assert mtp_table.match(("MiMoV2MTP",), "mimo_v2_flash", "eagle") is None
    assert mtp_table.match_target({"architectures": ["MiMoV2FlashForCausalLM"]}, engine=SGLANG).key == (
        "sglang_mimo_v2_mtp"
    )
    assert mtp_table.match_target({"architectures": ["MiMoV2FlashForCausalLM"]}) is None  # vLLM's: its module
    # DeepSeek's NextN builds in SGLang: no row, and still an MTP draft (engine.sglang reads its class's name).
    assert mtp_table.match(("DeepseekV3ForCausalLMNextN",), "deepseek_v3", "eagle", engine=SGLANG) is None
    assert mtp_table.match_target({"architectures": ["DeepseekV3ForCausalLM"]}, engine=SGLANG) is None
    assert all(row.engine in ("vllm", SGLANG) for row in mtp_table.TABLE)
    sglang = [row.key for row in mtp_table.TABLE if row.engine == SGLANG]
    assert sglang == ["sglang_mimo_v2_mtp"]
    assert not set(sglang) & {row.key for row in mtp_table.TABLE if row.engine == "vllm"}


def _sglang_ctx(model_config, *, tp=1, load_config=None):
    identity = p2p_pb2.SourceIdentity(backend_framework=p2p_pb2.BACKEND_FRAMEWORK_SGLANG, tensor_parallel_size=tp)
    adapter = SimpleNamespace(load_config=load_config)
    return SimpleNamespace(model_config=model_config, adapter=adapter, identity=identity, load_config=load_config)


def test_the_sglang_reader_makes_a_nextn_draft_an_mtp_draft_from_its_architecture():
    """SGLang sends NEXTN as EAGLE: the draft class, not the method, says MTP."""
    hf = SimpleNamespace(architectures=["DeepseekV3ForCausalLMNextN"], model_type="deepseek_v3", num_hidden_layers=61)
    mc = SimpleNamespace(is_draft_model=True, speculative_algorithm="EAGLE", hf_config=hf, model_path="/m")
    load = SimpleNamespace(model_loader_extra_config='{"distributed": false}', draft_model_idx=None)
    view = engine_view(_sglang_ctx(mc, tp=4, load_config=load))
    assert (view.engine, view.is_draft, view.is_mtp, view.speculative_method) == (SGLANG, True, True, "eagle")
    assert view.tensor_parallel_size == 4  # the identity's, when SGLang's parallel state is not there
    assert view.loader_extra_config == {"distributed": False}
    assert view.architectures == ("DeepseekV3ForCausalLMNextN",)


def test_the_sglang_reader_does_not_take_an_eagle3_draft_for_mtp():
    hf = SimpleNamespace(architectures=["LlamaForCausalLMEagle3"], model_type="llama")
    mc = SimpleNamespace(is_draft_model=True, speculative_algorithm="EAGLE3", hf_config=hf, model_path="/eagle3")
    view = engine_view(_sglang_ctx(mc))
    assert view.is_draft and not view.is_mtp


def test_the_sglang_reader_reads_a_target_as_a_target():
    hf = SimpleNamespace(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next")
    mc = SimpleNamespace(is_draft_model=False, speculative_algorithm="EAGLE", hf_config=hf, model_path="/q")
    view = engine_view(_sglang_ctx(mc))
    assert (view.engine, view.is_draft, view.is_mtp, view.draft_layer) == (SGLANG, False, False, None)


# -- doctor, asked for SGLang ---------------------------------------------------------------


def _doctor_json(capsys, *args: str) -> tuple[int, dict]:
    from mx_strategies import cli

    code = cli.main(["doctor", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_doctor_plans_sglangs_draft_and_target_with_engine_sglang(tmp_path, capsys):
    own = layer("model.layers.2.", *DEEPSEEK_LAYER, *NEXTN_OWN)
    copies = ["model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"]
    target = ["model.embed_tokens.weight", "lm_head.weight", *layer("model.layers.1.", *DEEPSEEK_LAYER)]
    folder = write_names(str(tmp_path / "ds"), own + copies + target,
                         {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                          "num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    code, report = _doctor_json(capsys, folder, "--engine", "sglang")
    assert code == 0
    assert report["engine"]["name"] == "sglang"
    assert report["engine"]["strategies"]["robust_model_streamer"]["eligible"] is True
    # No module in doctor, and no row (the classes build): the generic nextn convention, for either engine.
    assert report["draft"]["architecture"] is None and report["draft"]["convention"] == "nextn_layers"
    assert set(report["draft"]["names"]) == set(own) | set(copies)
    assert report["target"]["left_to_draft"] == 0
    code, report = _doctor_json(capsys, folder)
    assert report["engine"]["name"] == "vllm" and report["draft"]["architecture"] is None


def test_doctor_says_robust_is_never_offered_in_tensorrt_llm(tmp_path, capsys):
    """ModelExpress 0.7.0's TrtllmAdapter overrides neither hook robust and model_streamer require."""
    folder = write_names(str(tmp_path / "t"), ["model.embed_tokens.weight", "lm_head.weight"],
                         {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1})
    code, report = _doctor_json(capsys, folder, "--engine", "trtllm")
    assert code == 1
    strategies = report["engine"]["strategies"]
    assert strategies["robust_model_streamer"] == {"eligible": False, "missing_hooks": ["apply_weight_iter"],
                                                   "adapter_importable": True}
    assert strategies["model_streamer"]["eligible"] is False
    (problem,) = [p for p in report["problems"] if p["kind"] == "strategy_not_offered"]
    assert problem["severity"] == "error"
    assert "does not override apply_weight_iter" in problem["message"]
    assert "never offers mx_strategies.robust nor upstream model_streamer in trtllm" in problem["message"]


def test_every_sglang_draft_class_the_table_knows_is_an_mtp_draft_by_its_class_name():
    """The engine view decides "MTP draft" by SGLang's class-name suffixes alone (it asks no table): every
    SGLang row's draft class must pass that rule, under every method SGLang runs it with, or its load would
    be planned as a draft with a checkpoint of its own."""
    rows = mtp_table._rows_for(engine=SGLANG)
    assert rows
    for row in rows:
        for architecture in row.draft_architectures:
            for method in set(row.methods) & set(SGLANG_MTP_METHODS):
                assert _is_mtp_draft(True, method, (architecture,)), (row.key, architecture, method)
    assert not _is_mtp_draft(True, "eagle", ("LlamaForCausalLMEagle3",))
